"""The idempotent producer (Kafka's, on every replicated group: Raft, ISR, master-slave):
a retry after a failover does not store a write twice, and a producer id's new life
(a restarted client) is not taken for its old one.

A producer tags every request with its ``producer_id`` (a string it picks, unique), its
``producer_epoch`` (the life of that id: see below) and a ``sequence`` (an int it never
reuses for another request of that life). The records of that request carry all three
in their properties (``producer_id``, ``producer_epoch``, ``sequence``; an epoch of 0 is
left out, and a record without one, written before epochs existed, reads as epoch 0), so
the log itself is the state: a node that becomes leader rebuilds its table from the last
``idempotence_window_bytes`` of its log (scanning from a segment start, where a record
always begins), and adds each write it stores after that.

Epochs (Kafka's producer epoch). The table keeps one epoch per producer: the highest of
its records here. A request with a higher epoch starts a new life: nothing of that life
is stored yet (its sequences start over; the old life's are forgotten). A request with
a lower one is refused with ProducerFenced, nothing stored: a client with the same id
started later, and the older one (a zombie, or the earlier life of a restarted process)
must stop. With the same epoch, the rules below.

How a client picks its epoch (``new_producer_epoch``): the wall clock in microseconds,
above every epoch the same process chose before. No storage on the client side: a
client restarted with the same producer id starts after its earlier life did, so its
epoch is higher, and its sequences may start over at 1 without being taken for the old
life's. If the clock went back across the restart, the new life's epoch is lower and it
is fenced — refused, loudly, never answered as a duplicate of the old life. Why it
holds everywhere:

* Retries. Every attempt of a request (the first request of a life included) carries
  the life's one epoch, chosen once when the client was made; a retry is looked up as
  before.
* Failover. The epoch is in every stored record, and the table is a function of the
  log: the newest epoch per producer among its records in the window, and that life's
  sequences. A new leader rebuilds it from its log and decides as the old one would
  have on the same log. A new life's first records that were lost with an old leader
  (never acknowledged) are simply not there: the zombie is fenced again once the new
  life's first write is stored on the new leader. Records of one producer are in
  non-decreasing epoch order in every log (a leader refuses a lower epoch than any it
  holds), which the simulators check.
* Limits. A producer none of whose records is in the window is unknown: any epoch is
  taken (as Kafka forgets producer state after its expiration). A producer whose life
  may have begun before the window (or before retention let the log's front go: no
  record of an earlier life of it comes first in the window) has its older sequences
  forgotten on a new leader: refused with OutOfOrderSequence (may be stored),
  like the ones a table drops past ``idempotence_sequences_max`` — and so is the request
  whose record the scan starts at (its first records may lie before it). Taken as new,
  a retry of one was stored twice. Epochs are compared, never matched with the client's
  clock.

A request whose (producer id, epoch, sequence) is in the table was stored already — by
this leader or by an earlier one, committed or not yet: the leader answers with where it
went, once it is committed (a Raft leader never drops its own records, so it will be;
a master answers by its role's rule, as for a new write).
Each producer's table keeps its newest ``idempotence_sequences_max`` sequences; an older
sequence is refused with OutOfOrderSequence rather than risk storing it twice. It also
keeps each producer's newest sequence.

A request's records are one run in the log, but a replica may hold the first few only
(a fetch or an Entries is cut at a record, not at a request): a retry whose copy here has
fewer records than it sends is never answered as stored. It is refused with
PartiallyStored ("these are stored, send the rest"), and only once the copy is committed
(driver.py's ``propose_write``, for every layer): a leader's uncommitted records may
still be lost with it, and a client told they were stored would never send them again.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeGuard

import msgpack

from mqlog import format as fmt
from mqlog.errors import OutOfOrderSequence, PartiallyStored, ProducerFenced

# (producer id, sequence, epoch): one request's tag, as the driver and node pass it
ProducerTag = tuple[str, int, int]


@dataclass(slots=True)
class Stored:
    """Where one request's records went."""

    position: int
    end: int
    offset: int
    count: int
    store_timestamp: int = -1  # their store time (ms); -1: not known (found in the log)


class ProducerTable:
    """(producer id, epoch, sequence) -> Stored, for the newest sequences of each
    producer's newest epoch."""

    def __init__(self, sequences_max: int) -> None:
        assert sequences_max > 0
        self.sequences_max = sequences_max
        self._producers: dict[str, OrderedDict[int, Stored]] = {}
        self._epochs: dict[str, int] = {}  # the newest epoch stored, per producer
        self._forgotten: dict[str, int] = {}  # the newest sequence dropped, per producer
        self._newest: dict[str, int] = {}  # the newest sequence stored, per producer

    def epoch(self, producer_id: str) -> int | None:
        """The newest epoch of ``producer_id`` stored here (None: none known)."""
        return self._epochs.get(producer_id)

    def lookup(self, producer_id: str, sequence: int, epoch: int) -> Stored | None:
        """The earlier outcome of this request, None if it is new; ProducerFenced if
        ``epoch`` is older than the producer's newest here; OutOfOrderSequence if it is
        too old to tell. The copy found may hold fewer records than the request (a
        replica's copy cut inside it): the caller compares ``count`` and never answers
        such a copy as stored (``partially_stored``)."""
        sequences = self._producers.get(producer_id)
        if sequences is None or epoch > self._epochs[producer_id]:
            return None  # (a producer not known here, or its new life)
        if epoch < self._epochs[producer_id]:
            raise ProducerFenced(
                f"producer {producer_id!r} sent sequence {sequence} in epoch {epoch}, but "
                f"this leader has records of its epoch {self._epochs[producer_id]}: another "
                "client with this producer id started later (or this client's clock went "
                "back): this attempt stored nothing (an earlier attempt of the same "
                "request may have). Stop this client: one producer id is one live client "
                "at a time (a client created anew gets a newer epoch)")
        found = sequences.get(sequence)
        if found is None and sequence <= self._forgotten.get(producer_id, -1):
            raise OutOfOrderSequence(
                f"producer {producer_id!r} sent sequence {sequence}, as old as ones this "
                f"node no longer remembers (it keeps {self.sequences_max} per producer); it "
                "may be stored already: start a new client (a new producer epoch) or use a "
                "new producer id")
        return found

    def newest(self, producer_id: str, epoch: int) -> int | None:
        """The newest sequence of ``producer_id``'s life ``epoch`` stored here (None: none
        known)."""
        if self._epochs.get(producer_id) != epoch:
            return None
        return self._newest.get(producer_id)

    def note(self, producer_id: str, sequence: int, epoch: int, stored: Stored) -> None:
        """A request's records were stored (or read from the log, in log order). A newer
        epoch starts the producer over; an older one (only a log written past a window
        that forgot the newer) changes nothing."""
        known = self._epochs.get(producer_id)
        if known is not None and epoch < known:
            return
        if known is None or epoch > known:
            self._forget(producer_id)
            self._epochs[producer_id] = epoch
        self._newest[producer_id] = max(sequence, self._newest.get(producer_id, sequence))
        sequences = self._producers.get(producer_id)
        if sequences is None:
            sequences = self._producers[producer_id] = OrderedDict()
        earlier = sequences.get(sequence)
        # One request, more records: the next queue offsets (a blank may lie between, where
        # the request's records went on in the next segment).
        if earlier is not None and earlier.offset + earlier.count == stored.offset:
            stored = Stored(earlier.position, stored.end, earlier.offset,
                            earlier.count + stored.count, earlier.store_timestamp)
        sequences[sequence] = stored
        if len(sequences) <= self.sequences_max:
            return
        while len(sequences) > self.sequences_max:
            dropped, _ = sequences.popitem(last=False)
            self._forgotten[producer_id] = max(dropped, self._forgotten.get(producer_id, -1))

    def _forget(self, producer_id: str) -> None:
        for table in (self._producers, self._epochs, self._forgotten, self._newest):
            table.pop(producer_id, None)

    def clear(self) -> None:
        for table in (self._producers, self._epochs, self._forgotten, self._newest):
            table.clear()

    def rebuild(self, store: Any, window_bytes: int) -> int:
        """Read producer tags from the last ``window_bytes`` of ``store``'s log; return
        how many tagged records were found."""
        self.clear()
        end = store.written_position
        bases = [base for base, _size in store.segments() if base <= max(0, end - window_bytes)]
        start = position = bases[-1] if bases else store.first_segment_base()
        found, first = 0, None
        first_epochs: dict[str, int] = {}  # each producer's first epoch in the scan
        while position < end:
            data = store.read_raw(position, 1 << 20)
            for tag, stored in producer_tags(position, data):
                self.note(*tag, stored)
                found += 1
                first = tag if stored.position == start else first
                first_epochs.setdefault(tag[0], tag[2])
            position += len(data)
        if start > 0:
            self._forget_before_window(first, {
                producer_id for producer_id, epoch in first_epochs.items()
                if self._epochs.get(producer_id, epoch) > epoch})
        return found

    def _forget_before_window(self, first: ProducerTag | None, begun_here: set[str]) -> None:
        """The log goes on before the scan (past the window, or let go): the lives found
        may have older sequences there, stored, which the old leader's table still had —
        taken as new here, a retry of one would be stored twice. So each is forgotten, as
        if this table had dropped it (sequences rise within a life, as every client of
        mqlog sends them): below the lowest found, and the request of the record the scan
        starts at, whose first records may lie before it (found cut, its retry would be
        refused as PartiallyStored: "send the rest again", twice). Not for a life
        ``begun_here``: the scan met a record of an earlier life of that producer first,
        and a producer's epochs never go down in a log, so the whole life is in the scan
        (a never-stored first request of it, forgotten, was refused as too old to tell:
        ISR seed 8200000978). Only a leader that had forgotten the producer (the Limits
        above: none of its records in that leader's window) takes an older epoch after
        a newer one; a retry of the newer life's forgotten sequences is then new to that
        leader, and to this rule after it."""
        for producer_id, sequences in self._producers.items():
            if producer_id in begun_here:
                continue
            self._forgotten[producer_id] = max(self._forgotten.get(producer_id, -1),
                                               min(sequences) - 1)
        if first is not None and self._epochs.get(first[0]) == first[2]:
            producer_id, sequence, _epoch = first
            self._producers[producer_id].pop(sequence, None)
            self._forgotten[producer_id] = max(self._forgotten[producer_id], sequence)


def partially_stored(producer_id: str, sequence: int, found: Stored,
                     count: int) -> PartiallyStored:
    """The refusal of a retry of ``count`` records whose committed copy holds fewer."""
    return PartiallyStored(
        f"producer {producer_id!r} sequence {sequence}: {found.count} of its {count} "
        f"records are stored (offsets {found.offset}..), the rest are not (the copy this "
        "leader has was cut inside the request, which was never acknowledged): send the "
        "others again as a new request", found.count, found.position, found.offset)


def producer_tags(position: int, data: bytes) -> Iterator[tuple[ProducerTag, Stored]]:
    """The producer tags of the records in ``data`` (read at ``position``), one a record."""
    at, view = 0, memoryview(data)
    while at + fmt.RECORD_HEADER_SIZE <= len(data):
        header = fmt.RecordHeader._make(fmt.RECORD_HEADER.unpack_from(view, at))
        if header.magic != fmt.RECORD_MAGIC:  # a blank record: the segment ends here
            break
        if header.properties_size and not header.control:
            start = at + fmt.RECORD_HEADER_SIZE + header.topic_size + header.key_size + \
                header.tags_size
            tag = _producer_tag(view[start:start + header.properties_size])
            if tag is not None:
                yield tag, Stored(position + at, position + at + header.size,
                                  header.queue_offset, 1)
        at += header.size


def producer_properties(producer_id: str, sequence: int, epoch: int) -> dict[str, Any]:
    """The properties that tag a request's records (an epoch of 0 is left out: the records
    of before epochs read as 0)."""
    if epoch:
        return {"producer_id": producer_id, "producer_epoch": epoch, "sequence": sequence}
    return {"producer_id": producer_id, "sequence": sequence}


def _producer_tag(packed: memoryview) -> ProducerTag | None:
    try:
        properties = msgpack.unpackb(packed, raw=False)
    except (ValueError, msgpack.UnpackException):
        return None
    return tag_of(properties) if isinstance(properties, dict) else None


def tag_of(properties: dict[Any, Any]) -> ProducerTag | None:
    """The producer's tag in decoded ``properties``, by their msgpack types: a str
    ``producer_id``, an int ``sequence`` >= 0 and an int ``producer_epoch`` >= 0 (0 when
    left out), bool not counting as an int; None when they are not one (a user's
    ``sequence: "42"`` is no tag). The Spark connector's replay strips the same."""
    producer_id, sequence = properties.get("producer_id"), properties.get("sequence")
    epoch = properties.get("producer_epoch", 0)
    if isinstance(producer_id, str) and _count(sequence) and _count(epoch):
        return producer_id, sequence, epoch
    return None


def _count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# --- the client's side: a life's epoch -------------------------------------------------

_last_epoch = 0
_epoch_lock = threading.Lock()


def producer_epoch(now_ns: int, after: int) -> int:
    """The epoch of a life starting at wall-clock time ``now_ns`` (nanoseconds) in a
    process whose last life had ``after``: microseconds, and above ``after``."""
    return max(now_ns // 1000, after + 1)


def new_producer_epoch() -> int:
    """A new producer life's epoch (see the module docstring): higher than any this
    process chose before, and than any an earlier process chose unless the clock went
    back."""
    global _last_epoch
    with _epoch_lock:
        _last_epoch = producer_epoch(time.time_ns(), _last_epoch)
        return _last_epoch
