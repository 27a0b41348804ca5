"""Planning a batch read on the driver: options and pushed filters to partitions.

Queue mode: each store is opened read-only once; every queue the options and filters
allow gets the offset range [start, end) that the starting/ending offsets, the
starting/ending timestamps (through ``Store.offset_for_timestamp``, exact because store
timestamps never decrease) and the pushed offset and timestamp bounds leave; empty
ranges are dropped, the rest cut by ``options.split`` and, when there are more pieces
than the session has task slots, packed into fewer partitions by ``options.pack``
(several small queues read by one task). Both cut by bytes, not record counts
(``QueueBytes``: the sizes the consume-queue entries carry, summed), so a queue of large
records and one of small ones give tasks of equal work; ``maxRecordsPerPartition``
still caps each partition's records.
Each range is then marked (``mark_ranges``) with the position and CRC32C of its first
and last records, so that the task reading it can tell the store changed under it
(reader.py).

Commit-log mode cuts by what the stores hold, never by the files' allocated size (an
engine may preallocate a 1 GiB segment for a few records). Each segment file of each
store is one range of positions (narrowed by pushed position bounds) holding the bytes
up to the store's written position (``segment_spans``); the range still runs to the
file's end, so a walk also sees records past the snapshot (it stops at the zeros after
the last one). ``task_count`` says how many tasks the held bytes need: one per task slot
at most while they are few (below ``TASK_BYTES_MIN`` a task), one per
``TASK_BYTES_MAX`` when they are many, so a stage has at most max(2 x slots, data /
``STAGE_BYTES``) tasks. The ranges of all stores, in order, are then dealt into that
many partitions of an equal share of held bytes (``_pack_segments``): small ranges (a
small store, several replicas) share a task (``SegmentRanges``), and a large one is cut
where a share ends, at a record start the planner has verified, so that each piece's
walk starts at its own first record (commitlog.py): the candidates are consume-queue
entries' positions (the first entry of any queue at or after the wanted cut), and one is
used only if the record there reads back (``read_record``: magic, size, CRC32C) with that
position in its header. Where no candidate is verified the range stays whole.

Beside a live writer. Planning reads files that a writer's retention (or a truncation)
may delete meanwhile, and a file listed a moment ago may be gone when it is opened.
Such a file is passed over, as the reader's ``queue_entries`` does, never a raw
``FileNotFoundError``; that keeps answers right because nothing taken from those files
decides what rows a read returns unchecked: a range's bounds come from the snapshot;
queue entries read for weights (``QueueBytes``) and cut candidates only balance the work
(a missing entry weighs as the mean; a candidate is verified with ``read_record``); a
range whose first or last record cannot be marked is planned without marks but with the
snapshot's change count, and its task fails with ``StoreChanged`` if the count moved
(reader.py ``_readable``). A segment file deleted while a commit-log read is planned is
left out, as if the plan were made just after (commit-log mode reads the files as they
are, not a snapshot).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import numpy as np

import mqlog
from mqlog.engine.files import numbered_files
from mqlog.engine.store import Store
from mqlog.errors import MqlogError, StoreNotFound
from mqlog.spark_connector import layout
from mqlog.spark_connector.options import (
    QueueRange,
    QueueRanges,
    ReadOptions,
    SegmentRange,
    SegmentRanges,
    pack,
    resolve,
    split,
)


def plan(options: ReadOptions) -> list[QueueRange | QueueRanges] | \
        list[SegmentRange | SegmentRanges]:
    """The partitions of a batch read; see the module docstring."""
    if options.mode == "commitlog":
        return plan_segments(options)
    ranges: list[QueueRange] = []
    weights = QueueBytes()
    with ExitStack() as opened:
        stores = {}
        for path, replica in _wanted_paths(options):
            store = stores[path] = opened.enter_context(open_store(path))
            found = queue_ranges(store, options, path, replica)
            for part in found:
                weights.add(store, part)
            ranges.extend(found)
        return mark_ranges(pack_queue_ranges(ranges, options, weights), stores)


def mark_ranges(parts: list[QueueRange | QueueRanges],
                stores: dict[str, Store]) -> list[QueueRange | QueueRanges]:
    """Each queue range with its ``marks``: where its first and last records are and
    their CRCs, as the open ``stores`` (the plan's snapshot) show them, so that the
    reader can tell that they are still the same records (reader.py)."""
    def marked(part: QueueRange) -> QueueRange:
        store = stores[part.path]
        marks = [_mark(store, part.topic, part.queue_id, offset)
                 for offset in sorted({part.start, part.end - 1})]
        if None in marks:  # damage: the read reports it (the range is planned all the same)
            return replace(part, changes=store.change_count)
        return replace(part, marks=tuple(mark for mark in marks if mark is not None),
                       changes=store.change_count)

    return [QueueRanges(tuple(marked(piece) for piece in part.ranges))
            if isinstance(part, QueueRanges) else marked(part) for part in parts]


def _mark(store: Store, topic: str, queue_id: int, offset: int) -> tuple[int, int] | None:
    """(position, CRC32C) of a queue's record at ``offset``; None if it cannot be read."""
    from mqlog.spark_connector.reader import queue_entries

    try:
        entry = queue_entries(store, topic, queue_id, offset, offset + 1)[0]
        raw = store.read_raw(int(entry["position"]), int(entry["size"]))
    except (MqlogError, OSError):
        return None
    if len(raw) < int(entry["size"]):  # (more: read_raw adds a segment's closing blank)
        return None
    return int(entry["position"]), int(np.frombuffer(raw, layout.HEADER, count=1)[0]["crc"])


def pack_queue_ranges(ranges: list[QueueRange], options: ReadOptions,
                      weights: QueueBytes | None = None) -> list[QueueRange | QueueRanges]:
    """``ranges`` cut by ``split`` and packed by ``pack`` (options.py), by the bytes
    ``weights`` knows (records, without it)."""
    pieces = split(ranges, options.records_per_partition, options.min_partitions, weights)
    return pack(pieces, options.slots, options.records_per_partition,
                options.min_partitions, weights)


class QueueBytes:
    """The bytes of queue ranges' records, from their consume-queue entries' sizes (a
    running sum per range, so any piece's bytes and any cut are a lookup)."""

    def __init__(self) -> None:
        self.sums: dict[tuple[str, str, int], tuple[int, np.ndarray]] = {}

    def add(self, store: Store, part: QueueRange) -> None:
        """Read the sizes of ``part``'s records (the store is open)."""
        sizes = _entry_sizes(store, part.topic, part.queue_id, part.start, part.end)
        sums = np.zeros(len(sizes) + 1, np.int64)
        np.cumsum(sizes, out=sums[1:])
        self.sums[(part.path, part.topic, part.queue_id)] = (part.start, sums)

    def size(self, piece: QueueRange) -> int:
        first, sums = self.sums[(piece.path, piece.topic, piece.queue_id)]
        return int(sums[piece.end - first] - sums[piece.start - first])

    def advance(self, piece: QueueRange, start: int, weight: int) -> int:
        first, sums = self.sums[(piece.path, piece.topic, piece.queue_id)]
        wanted = sums[start - first] + max(weight, 1)
        found = first + int(np.searchsorted(sums, wanted, "left"))
        return min(max(found, start + 1), piece.end)


def _entry_sizes(store: Store, topic: str, queue_id: int, start: int, end: int) -> np.ndarray:
    """The sizes of offsets [start, end) of a queue, from its consume-queue files; an
    offset no file holds (a damaged or missing file: the read will say so) counts as
    the mean of the others, so it still weighs like a record."""
    sizes = np.full(end - start, -1, np.int64)
    for first, entries in _queue_entries(store, topic, queue_id, start, end):
        sizes[first - start:first - start + len(entries)] = entries["size"]
    known = sizes[sizes >= 0]
    sizes[sizes < 0] = int(known.mean()) if len(known) else 1
    return np.maximum(sizes, 1)


def _wanted_paths(options: ReadOptions) -> list[tuple[str, str]]:
    allowed = options.bounds.replicas
    return [(path, replica) for path, replica in options.paths
            if allowed is None or replica in allowed]


def open_store(path: str) -> Store:
    try:
        return mqlog.open(path, read_only=True)
    except StoreNotFound as error:
        raise StoreNotFound(f"mqlog source: {error}") from None


def queue_ranges(store: Store, options: ReadOptions, path: str,
                 replica: str) -> list[QueueRange]:
    """One offset range per wanted queue of ``store`` (empty ones left out)."""
    found = []
    for topic, queue_id in store.queues():
        if not options.wants(topic, queue_id):
            continue
        start, end = queue_bounds(store, options, topic, queue_id)
        if start < end:
            found.append(QueueRange(path, replica, topic, queue_id, start, end))
    return found


def queue_bounds(store: Store, options: ReadOptions, topic: str,
                 queue_id: int) -> tuple[int, int]:
    low, high = store.min_offset(topic, queue_id), store.max_offset(topic, queue_id)
    start = resolve(options.starting, topic, queue_id, low, high, -2)
    end = resolve(options.ending, topic, queue_id, low, high, -1)
    first_ms = _max(options.starting_ms, options.bounds.timestamp_ms[0])
    end_ms = _min(options.ending_ms, options.bounds.timestamp_ms[1])
    if first_ms is not None:
        start = max(start, store.offset_for_timestamp(topic, queue_id, first_ms))
    if end_ms is not None:
        end = min(end, store.offset_for_timestamp(topic, queue_id, end_ms))
    offset_low, offset_high = options.bounds.offset
    if offset_low is not None:
        start = max(start, offset_low)
    if offset_high is not None:
        end = min(end, offset_high)
    return start, end


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _min(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


TASK_BYTES_MIN = 8 << 20  # commit-log work below this is not spread over more tasks
TASK_BYTES_MAX = 128 << 20  # a commit-log task reads about this much at most
STAGE_BYTES = 64 << 20  # a stage has at most max(2 x slots, data / STAGE_BYTES) tasks


def task_count(data_bytes: int, slots: int | None, min_partitions: int = 1) -> int:
    """How many tasks a read of ``data_bytes`` of records is cut into: one per task slot
    at most while there is little (below TASK_BYTES_MIN a task), more only as the data
    needs (TASK_BYTES_MAX a task): at most max(slots, data / TASK_BYTES_MAX), within the
    stage cap max(2 x slots, data / STAGE_BYTES). ``minPartitions`` may ask for more."""
    wanted = max(1, min(slots or 1, -(-data_bytes // TASK_BYTES_MIN)),
                 -(-data_bytes // TASK_BYTES_MAX))
    return max(wanted, min_partitions)


def stage_tasks(data_bytes: int, slots: int | None) -> int:
    """Partitions for a shuffle over ``data_bytes`` of records (reconcile's comparisons):
    the task slots, more only for data over STAGE_BYTES a slot."""
    return max(slots or 1, data_bytes // STAGE_BYTES)


def plan_segments(options: ReadOptions) -> list[SegmentRange | SegmentRanges]:
    """Commit-log mode: the segment ranges of every wanted store, cut and packed by the
    bytes of records they hold (see the module docstring)."""
    spans: list[tuple[SegmentRange, int]] = []
    for path, replica in _wanted_paths(options):
        spans.extend(segment_spans(path, replica, options.bounds.position))
    total = sum(held for _part, held in spans)
    count = task_count(total, options.slots, options.min_partitions)
    with _Cutter() as cutter:
        return _pack_segments(spans, -(-total // count) if total else 1, cutter)


def segment_spans(path: str, replica: str, bounds: tuple[int | None, int | None] = (None, None)
                  ) -> list[tuple[SegmentRange, int]]:
    """Each segment file of the store at ``path`` as a range of positions (narrowed by
    ``bounds``), with the bytes of records it holds: up to the store's written position
    (what a read-only snapshot shows), not the file's allocated size. The range itself
    runs to the file's end, so records past the snapshot are still walked (a walk stops
    at the zeros after the last record). A store that cannot be opened is taken as
    holding its files' sizes."""
    directory = os.path.join(path, "commitlog")
    if not os.path.isfile(os.path.join(path, "meta.json")):
        raise StoreNotFound(f"mqlog source: {path} is not an mqlog store (it has no "
                            "meta.json); check the path")
    written = _written_position(path)
    low, high = bounds
    spans = []
    for base, file in _listed(Path(directory)):  # (as the engine: no stray file)
        try:
            end = base + os.path.getsize(file)
        except FileNotFoundError:  # retention deleted it since it was listed: not planned
            continue
        start, stop = max(base, low or 0), min(end, end if high is None else high)
        if start < stop:
            held_end = stop if written is None else min(stop, max(written, start))
            spans.append((SegmentRange(path, replica, base, start, stop, written=written),
                          held_end - start))
    return spans


def held_bytes(paths: list[str]) -> int:
    """The bytes of records the stores at ``paths`` hold (see ``segment_spans``)."""
    return sum(held for path in paths for _part, held in segment_spans(path, path))


def _written_position(path: str) -> int | None:
    try:
        with mqlog.open(path, read_only=True) as store:
            return int(store.written_position)
    except (MqlogError, OSError):  # a damaged store: walk its files as they are
        return None


class _Cutter:
    """Verified record starts in the stores being planned, each store opened once."""

    def __init__(self) -> None:
        self.opened: dict[str, tuple[Store, list[np.ndarray]]] = {}

    def __enter__(self) -> _Cutter:
        return self

    def __exit__(self, *exc: object) -> None:
        for store, _entries in self.opened.values():
            store.close()

    def cut(self, path: str, want: int, end: int) -> int | None:
        """A verified record start in [want, end) of the store at ``path``, or None."""
        if path not in self.opened:
            try:
                store = open_store(path)
            except (MqlogError, OSError):
                return None
            self.opened[path] = (store, _queue_positions(store))
        store, entries = self.opened[path]
        return _record_start(store, entries, want, end)


def _pack_segments(spans: list[tuple[SegmentRange, int]], share: int,
                   cutter: _Cutter) -> list[SegmentRange | SegmentRanges]:
    """Ranges in order, each partition the next ``share`` bytes of held records: a range
    is cut where a share ends (at a verified record start; uncut where there is none),
    small ranges are packed together (``SegmentRanges``), and ranges that hold nothing
    join the partition before them. A partition is closed only when more held bytes
    follow, so there are at most ceil(total / share) of them."""
    packed: list[SegmentRange | SegmentRanges] = []
    current: list[SegmentRange] = []
    room = share
    for part, held in spans:
        piece, held_end = part, part.start + held
        while held_end > piece.start:
            if room <= 0:
                packed.append(_partition(current))
                current, room = [], share
            if piece.start + room >= held_end:
                break
            found = cutter.cut(part.path, piece.start + room, held_end)
            if found is None or found <= piece.start:
                break
            current.append(replace(piece, end=found))
            room -= found - piece.start
            piece = replace(piece, start=found, walk_from=found)
        current.append(piece)
        room -= held_end - piece.start
    if current:
        packed.append(_partition(current))
    return packed


def _partition(pieces: list[SegmentRange]) -> SegmentRange | SegmentRanges:
    return pieces[0] if len(pieces) == 1 else SegmentRanges(tuple(pieces))


def _queue_positions(store: Store) -> list[np.ndarray]:
    """The positions of every queue's entries that the snapshot vouches for, one array
    per consume-queue file (memory-mapped: only what a search touches is read)."""
    found: list[np.ndarray] = []
    for topic, queue_id in store.queues():
        low, high = store.min_offset(topic, queue_id), store.max_offset(topic, queue_id)
        found.extend(entries["position"]
                     for _first, entries in _queue_entries(store, topic, queue_id, low, high))
    return found


def _queue_entries(store: Store, topic: str, queue_id: int, start: int,
                   end: int) -> Iterator[tuple[int, np.ndarray]]:
    """(first offset, its entries) for each consume-queue file's share of offsets
    [start, end), memory-mapped."""
    from mqlog.spark_connector.layout import CQ_ENTRY

    for base, file in _listed(store.paths.queue_dir(topic, queue_id)):
        try:  # (retention or a truncation beside the plan may delete a file listed: see
            # the module docstring, "Beside a live writer")
            count = os.path.getsize(file) // CQ_ENTRY.itemsize
            first, last = max(start, base), min(end, base + count)
            if first >= last:
                continue
            entries = np.memmap(file, CQ_ENTRY, "r", shape=(count,))
        except FileNotFoundError:
            continue
        yield first, entries[first - base:last - base]


def _listed(directory: Path) -> list[tuple[int, Path]]:
    """``numbered_files``, empty when the directory went while it was listed."""
    try:
        return numbered_files(directory)
    except FileNotFoundError:
        return []


def _record_start(store: Store, entries: list[np.ndarray], want: int, end: int) -> int | None:
    """The first entry position at or after ``want`` (and before ``end``) over all
    queues, if the record there reads back with that position; else None."""
    candidates = [int(positions[index]) for positions in entries
                  if (index := int(np.searchsorted(positions, want))) < len(positions)]
    found = min((c for c in candidates if want <= c < end), default=None)
    if found is None:
        return None
    try:
        record = store.read_record(found)
    except MqlogError:  # not a record start, not committed, or its CRC fails
        return None
    return found if record.position == found else None
