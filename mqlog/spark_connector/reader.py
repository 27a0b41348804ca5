"""Reading one queue partition: consume-queue entries, raw records, Arrow batches.

Theory of operation. ``read_queue`` is what a Spark task runs for a ``QueueRange``. It
opens the store read-only (a snapshot: no lock, beside a live writer, on a crashed copy)
and never trusts more than the snapshot shows: the range is clamped to the queue's
``min_offset``/``max_offset``.

1. Entries. The consume-queue entries of the range (docs/FORMAT.md: position, size,
   tag hash) are read with numpy straight from the queue's files, 20 bytes an entry.
   Only offsets the snapshot vouches for are read, so entries a live writer is adding
   are never looked at.
2. Bytes. Entries are cut into chunks (``CHUNK_RECORDS`` records, ``CHUNK_BYTES``
   bytes). For each chunk the records are fetched with ``Store.read_raw`` — one C call
   per run of adjacent records, which checks every record's CRC32C and raises
   ``CorruptRecord`` on damage — so a gap left by other queues' records costs a new call
   only when it is large (``GAP_BYTES``); smaller gaps are read through.
3. Check and convert. ``layout.build_batch`` turns the chunk into an Arrow batch in bulk;
   before it is yielded, every header is checked against its entry (magic, position,
   size, queue, offset, topic), so an entry that points at the wrong record is an error
   (``ConsumeQueueMismatch``), never a silently wrong row.

Counters (records and bytes read, batches, calls) are kept per partition and, when the
``metricsDir`` option is set, written there as one JSON file per partition read.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import mqlog
from mqlog.engine.store import Store
from mqlog.errors import ConsumeQueueMismatch
from mqlog.spark_connector import layout
from mqlog.spark_connector.options import QueueRange
from mqlog.spark_connector.schema import ARROW_SCHEMA

CHUNK_RECORDS = 65_536
CHUNK_BYTES = 16 << 20
GAP_BYTES = 256 << 10
READ_BYTES_MAX = 32 << 20  # below the default read_size_bytes_max (64 MiB)
_TOMBSTONE = (1 << 64) - 1


@dataclass
class Counters:
    """What one partition read did."""

    partition: str = ""
    records: int = 0
    bytes: int = 0
    batches: int = 0
    read_calls: int = 0

    def save(self, directory: str | None) -> None:
        if directory is None:
            return
        os.makedirs(directory, exist_ok=True)
        name = os.path.join(directory, f"{uuid.uuid4().hex}.json")
        with open(name + ".tmp", "w") as out:
            json.dump(asdict(self), out)
        os.replace(name + ".tmp", name)


def load_counters(directory: str) -> list[dict]:
    """Every partition's counters left in ``directory``."""
    found = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json"):
            with open(os.path.join(directory, name)) as source:
                found.append(json.load(source))
    return found


def read_queue(part: QueueRange, counters: Counters,
               arrow: pa.Schema = ARROW_SCHEMA) -> Iterator[pa.RecordBatch]:
    """The records of ``part`` as Arrow batches, in offset order."""
    with mqlog.open(part.path, read_only=True) as store:
        low = max(part.start, store.min_offset(part.topic, part.queue_id))
        high = min(part.end, store.max_offset(part.topic, part.queue_id))
        for start in range(low, high, CHUNK_RECORDS):
            entries = queue_entries(store, part.topic, part.queue_id, start,
                                    min(high, start + CHUNK_RECORDS))
            for chunk_start, chunk in _chunks(entries, start):
                buffer, starts = fetch(store, chunk, counters)
                head = layout.headers(pa.py_buffer(buffer), starts)
                _check(head, chunk, part, chunk_start)
                _check_topic(buffer, starts, head, part, chunk_start, chunk)
                batch = layout.build_batch(buffer, starts, part.replica, head=head,
                                           schema=arrow)
                counters.records += len(chunk)
                counters.batches += 1
                yield batch


def queue_entries(store: Store, topic: str, queue_id: int, low: int, high: int) -> np.ndarray:
    """Consume-queue entries of offsets [low, high), read from the queue's files."""
    directory = store.paths.queue_dir(topic, queue_id)
    parts = []
    for name in sorted(os.listdir(directory)):
        if not name.isdigit():
            continue
        base, path = int(name), directory / name
        count = os.path.getsize(path) // layout.CQ_ENTRY.itemsize
        first, last = max(low, base), min(high, base + count)
        if first < last:
            parts.append(np.fromfile(path, layout.CQ_ENTRY, count=last - first,
                                     offset=(first - base) * layout.CQ_ENTRY.itemsize))
    entries = np.concatenate(parts) if parts else np.empty(0, layout.CQ_ENTRY)
    if len(entries) != high - low or (entries["size"] == 0).any() or \
            (entries["position"] == _TOMBSTONE).any():
        raise ConsumeQueueMismatch(f"consume queue {topic}/{queue_id} of {store.paths.root} "
                                   f"lacks entries in [{low}, {high}); open the store "
                                   "read-write once to rebuild it")
    return entries


def _chunks(entries: np.ndarray, start: int) -> Iterator[tuple[int, np.ndarray]]:
    """Cut entries into chunks of at most CHUNK_BYTES of records (at least one each)."""
    ends = np.cumsum(entries["size"], dtype=np.int64)
    index = 0
    while index < len(entries):
        before = ends[index - 1] if index else 0
        stop = int(np.searchsorted(ends, before + CHUNK_BYTES, side="right"))
        stop = max(stop, index + 1)
        yield start + index, entries[index:stop]
        index = stop


def fetch(store: Store, entries: np.ndarray, counters: Counters) -> tuple[bytes, np.ndarray]:
    """The bytes holding the records of ``entries`` and each record's start in them."""
    positions = entries["position"].astype(np.int64)
    ends = positions + entries["size"].astype(np.int64)
    breaks = np.flatnonzero(positions[1:] - ends[:-1] > GAP_BYTES) + 1
    run_starts = np.concatenate(([0], breaks))
    run_stops = np.concatenate((breaks, [len(entries)]))
    pieces: list[bytes] = []
    piece_bases: list[int] = []  # log position where each piece starts
    for first, last in zip(run_starts.tolist(), run_stops.tolist(), strict=True):
        _read_run(store, positions[first:last], int(ends[last - 1]), pieces, piece_bases,
                  counters)
    buffer = pieces[0] if len(pieces) == 1 else b"".join(pieces)
    lengths = np.fromiter((len(piece) for piece in pieces), np.int64, len(pieces))
    joined_at = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    bases = np.asarray(piece_bases, np.int64)
    which = np.searchsorted(bases, positions, side="right") - 1
    counters.bytes += len(buffer)
    return buffer, positions - bases[which] + joined_at[which]


def _read_run(store: Store, positions: np.ndarray, end: int, pieces: list[bytes],
              piece_bases: list[int], counters: Counters) -> None:
    """read_raw from the run's first record to ``end``; read_raw stops at a segment's end
    (and at READ_BYTES_MAX), so go on from the next record not yet covered."""
    at = int(positions[0])
    while at < end:
        raw = store.read_raw(at, min(end - at, READ_BYTES_MAX))
        counters.read_calls += 1
        assert raw, f"read_raw returned nothing at {at}"
        pieces.append(raw)
        piece_bases.append(at)
        covered = at + len(raw)
        following = int(np.searchsorted(positions, covered))
        if following >= len(positions):
            break
        at = int(positions[following])


def _check(head: np.ndarray, entries: np.ndarray, part: QueueRange, first_offset: int) -> None:
    expected = np.arange(first_offset, first_offset + len(entries), dtype=np.uint64)
    good = layout.magic_ok(head) & (head["position"] == entries["position"]) & \
        (head["total_size"] == entries["size"]) & (head["offset"] == expected) & \
        (head["queue_id"] == part.queue_id)
    if not good.all():
        _mismatch(part, first_offset, entries, int(np.argmin(good)))


def _mismatch(part: QueueRange, first_offset: int, entries: np.ndarray, bad: int) -> None:
    raise ConsumeQueueMismatch(
        f"consume queue {part.topic}/{part.queue_id} of {part.path}: the entry of offset "
        f"{first_offset + bad} points at position {int(entries['position'][bad])}, which "
        "holds another record; open the store read-write once to rebuild its queues")


def _check_topic(buffer: bytes, starts: np.ndarray, head: np.ndarray, part: QueueRange,
                 first_offset: int, entries: np.ndarray) -> None:
    """Every record's topic is the queue's (compared as bytes, in bulk)."""
    name = part.topic.encode()
    at = starts + layout.HEADER_SIZE
    topics = layout.slice_binary(pa.py_buffer(buffer), at, at + head["topic_size"])
    same = (head["topic_size"] == len(name))
    if same.all() and pc.all(pc.equal(topics, pa.scalar(name, pa.binary()))).as_py():
        return
    _mismatch(part, first_offset, entries, int(np.argmin(same)) if not same.all() else 0)
