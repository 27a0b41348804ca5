"""The idempotent producer (Kafka's, on a Raft group and a master-slave one): a retry
after a failover does not store a write twice.

A producer tags every request with its ``producer_id`` (a string it picks, unique) and a
``sequence`` (an int it never reuses for another request). The records of that request
carry both in their properties (``producer_id``, ``sequence``), so the log itself is the
state: a node that becomes leader rebuilds its table from the last
``idempotence_window_bytes`` of its log (scanning from a segment start, where a record
always begins), and adds each write it stores after that.

A request whose (producer id, sequence) is in the table was stored already — by this
leader or by an earlier one, committed or not yet: the leader answers with where it
went, once it is committed (a Raft leader never drops its own records, so it will be;
a master answers by its role's rule, as for a new write).
Each producer's table keeps its newest ``idempotence_sequences_max`` sequences; an older
sequence is refused with OutOfOrderSequence rather than risk storing it twice. It also
keeps each producer's newest sequence.

A request's records are one run in the log, but a replica may hold the first few only
(a fetch or an Entries is cut at a record, not at a request): a retry whose copy here has
fewer records than it sends is refused (PartiallyStored), never answered as stored.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import msgpack

from mqlog import format as fmt
from mqlog.errors import OutOfOrderSequence, PartiallyStored


@dataclass(slots=True)
class Stored:
    """Where one request's records went."""

    position: int
    end: int
    offset: int
    count: int


class ProducerTable:
    """(producer id, sequence) -> Stored, for the newest sequences of each producer."""

    def __init__(self, sequences_max: int) -> None:
        assert sequences_max > 0
        self.sequences_max = sequences_max
        self._producers: dict[str, OrderedDict[int, Stored]] = {}
        self._forgotten: dict[str, int] = {}  # the newest sequence dropped, per producer
        self._newest: dict[str, int] = {}  # the newest sequence stored, per producer

    def lookup(self, producer_id: str, sequence: int, count: int = 0) -> Stored | None:
        """The earlier outcome of this request, None if it is new; OutOfOrderSequence if
        it is too old to tell; PartiallyStored if the request has ``count`` records and
        the copy here fewer (a replica's copy cut inside it: never answered as stored)."""
        sequences = self._producers.get(producer_id)
        if sequences is None:
            return None
        found = sequences.get(sequence)
        if found is None and sequence <= self._forgotten.get(producer_id, -1):
            raise OutOfOrderSequence(
                f"producer {producer_id!r} sent sequence {sequence}, as old as ones this "
                f"node no longer remembers (it keeps {self.sequences_max} per producer); it "
                "may be stored already: start a new producer id")
        if found is not None and found.count < count:
            raise PartiallyStored(
                f"producer {producer_id!r} sequence {sequence}: {found.count} of its {count} "
                f"records are stored (offsets {found.offset}..), the rest are not (the "
                "copy this leader has was cut inside the request, which was never "
                "acknowledged): send the others again as a new request", found.count)
        return found

    def newest(self, producer_id: str) -> int | None:
        """The newest sequence of ``producer_id`` stored here (None: none known)."""
        return self._newest.get(producer_id)

    def note(self, producer_id: str, sequence: int, stored: Stored) -> None:
        self._newest[producer_id] = max(sequence, self._newest.get(producer_id, sequence))
        sequences = self._producers.get(producer_id)
        if sequences is None:
            sequences = self._producers[producer_id] = OrderedDict()
        earlier = sequences.get(sequence)
        # One request, more records: the next queue offsets (a blank may lie between, where
        # the request's records went on in the next segment).
        if earlier is not None and earlier.offset + earlier.count == stored.offset:
            stored = Stored(earlier.position, stored.end, earlier.offset,
                            earlier.count + stored.count)
        sequences[sequence] = stored
        if len(sequences) <= self.sequences_max:
            return
        while len(sequences) > self.sequences_max:
            dropped, _ = sequences.popitem(last=False)
            self._forgotten[producer_id] = max(dropped, self._forgotten.get(producer_id, -1))

    def clear(self) -> None:
        self._producers.clear()
        self._forgotten.clear()
        self._newest.clear()

    def rebuild(self, store: Any, window_bytes: int) -> int:
        """Read producer tags from the last ``window_bytes`` of ``store``'s log; return
        how many tagged records were found."""
        self.clear()
        end = store.written_position
        bases = [base for base, _size in store.segments() if base <= max(0, end - window_bytes)]
        position = bases[-1] if bases else store.first_segment_base()
        found = 0
        while position < end:
            data = store.read_raw(position, 1 << 20)
            found += self._scan(position, data)
            position += len(data)
        return found

    def _scan(self, position: int, data: bytes) -> int:
        found, at, view = 0, 0, memoryview(data)
        while at + fmt.RECORD_HEADER_SIZE <= len(data):
            header = fmt.RecordHeader._make(fmt.RECORD_HEADER.unpack_from(view, at))
            if header.magic != fmt.RECORD_MAGIC:  # a blank record: the segment ends here
                break
            if header.properties_size and not header.control:
                start = at + fmt.RECORD_HEADER_SIZE + header.topic_size + header.key_size + \
                    header.tags_size
                tag = _producer_tag(view[start:start + header.properties_size])
                if tag is not None:
                    self.note(tag[0], tag[1], Stored(position + at, position + at + header.size,
                                                     header.queue_offset, 1))
                    found += 1
            at += header.size
        return found


def producer_properties(producer_id: str, sequence: int) -> dict[str, Any]:
    return {"producer_id": producer_id, "sequence": sequence}


def _producer_tag(packed: memoryview) -> tuple[str, int] | None:
    try:
        properties = msgpack.unpackb(packed, raw=False)
    except (ValueError, msgpack.UnpackException):
        return None
    if not isinstance(properties, dict):
        return None
    producer_id, sequence = properties.get("producer_id"), properties.get("sequence")
    if isinstance(producer_id, str) and isinstance(sequence, int):
        return producer_id, sequence
    return None
