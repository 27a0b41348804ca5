"""Planning a batch read on the driver: options and pushed filters to partitions.

Queue mode: each store is opened read-only once; every queue the options and filters
allow gets the offset range [start, end) that the starting/ending offsets, the
starting/ending timestamps (through ``Store.offset_for_timestamp``, exact because store
timestamps never decrease) and the pushed offset and timestamp bounds leave; empty
ranges are dropped, the rest cut by ``options.split`` and, when there are more pieces
than the session has task slots, packed into fewer partitions by ``options.pack``
(several small queues read by one task).

Commit-log mode: each segment file of each store is one range of positions (narrowed by
pushed position bounds). When ranges are fewer than the task slots or ``minPartitions``,
or larger than ``SEGMENT_PARTITION_BYTES``, each is cut into pieces of about an equal
share of the indexed records' bytes (at most ``SEGMENT_PARTITION_BYTES``; the indexed
records end at the last consume-queue entry in the range), at record starts the
planner has verified, so that each piece's walk starts at its own first record
(commitlog.py): the candidates are consume-queue entries' positions (the first entry of
any queue at or after each wanted cut), and one is used only if the record there reads
back (``read_record``: magic, size, CRC32C) with that position in its header. Where no
candidate is verified the range stays whole; ``options.split`` then halves pieces
further if ``minPartitions`` asks for more (those walks step from the piece's known
start).
"""

from __future__ import annotations

import itertools
import os

import numpy as np

import mqlog
from mqlog.engine.store import Store
from mqlog.errors import MqlogError, StoreNotFound
from mqlog.spark_connector.options import (
    QueueRange,
    QueueRanges,
    ReadOptions,
    SegmentRange,
    pack,
    resolve,
    split,
)


def plan(options: ReadOptions) -> list[QueueRange | QueueRanges] | list[SegmentRange]:
    """The partitions of a batch read; see the module docstring."""
    if options.mode == "commitlog":
        return plan_segments(options)
    ranges: list[QueueRange] = []
    for path, replica in _wanted_paths(options):
        with open_store(path) as store:
            ranges.extend(queue_ranges(store, options, path, replica))
    return pack_queue_ranges(ranges, options)


def pack_queue_ranges(ranges: list[QueueRange],
                      options: ReadOptions) -> list[QueueRange | QueueRanges]:
    """``ranges`` cut by ``split`` and packed by ``pack`` (options.py)."""
    pieces = split(ranges, options.records_per_partition, options.min_partitions)
    return pack(pieces, options.slots, options.records_per_partition,
                options.min_partitions)


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


def plan_segments(options: ReadOptions) -> list[SegmentRange]:
    """One position range per segment file (narrowed by pushed position bounds)."""
    low, high = options.bounds.position
    ranges = []
    for path, replica in _wanted_paths(options):
        directory = os.path.join(path, "commitlog")
        if not os.path.isfile(os.path.join(path, "meta.json")):
            raise StoreNotFound(f"mqlog source: {path} is not an mqlog store (it has no "
                                "meta.json); check the path")
        for name in sorted(os.listdir(directory)):
            if len(name) != 20 or not name.isdigit():
                continue
            base = int(name)
            end = base + os.path.getsize(os.path.join(directory, name))
            start, stop = max(base, low or 0), min(end, end if high is None else high)
            if start < stop:
                ranges.append(SegmentRange(path, replica, base, start, stop))
    return split(_cut_segments(ranges, options), None, options.min_partitions)


SEGMENT_PARTITION_BYTES = 128 << 20


def _cut_segments(ranges: list[SegmentRange], options: ReadOptions) -> list[SegmentRange]:
    """Ranges cut at verified record starts into pieces of about an equal share of the
    indexed records' bytes (see the module docstring)."""
    wanted = max(options.min_partitions, options.slots or 1)
    if len(ranges) >= wanted and all(p.count <= SEGMENT_PARTITION_BYTES for p in ranges):
        return ranges
    pieces: list[SegmentRange] = []
    for path, group in itertools.groupby(ranges, key=lambda part: part.path):
        with open_store(path) as store:
            entries = _queue_positions(store)
            spans = [(part, _last_entry(entries, part) - part.start) for part in group]
            total = sum(max(span, 0) for _part, span in spans)
            step = max(1, min(SEGMENT_PARTITION_BYTES, -(-total // wanted)))
            for part, span in spans:
                count = -(-span // step) if span > 0 else 1
                cuts = sorted({found for k in range(1, count)
                               if (found := _record_start(store, entries,
                                                          part.start + k * span // count,
                                                          part.end)) is not None
                               and found > part.start})
                bounds = [part.start, *cuts, part.end]
                pieces.append(SegmentRange(part.path, part.replica, part.base, bounds[0],
                                           bounds[1], part.walk_from))
                pieces.extend(SegmentRange(part.path, part.replica, part.base, low, high, low)
                              for low, high in zip(bounds[1:-1], bounds[2:], strict=True))
    return pieces


def _last_entry(entries: list[np.ndarray], part: SegmentRange) -> int:
    """The last entry position in ``part`` over all queues (its start if none): where
    the indexed records end, near enough (records past it, unindexed, are few)."""
    last = part.start
    for positions in entries:
        index = int(np.searchsorted(positions, part.end)) - 1
        if index >= 0 and positions[index] >= part.start:
            last = max(last, int(positions[index]))
    return last


def _queue_positions(store: Store) -> list[np.ndarray]:
    """The positions of every queue's entries that the snapshot vouches for, one array
    per consume-queue file (memory-mapped: only what a search touches is read)."""
    from mqlog.spark_connector.layout import CQ_ENTRY

    found = []
    for topic, queue_id in store.queues():
        low, high = store.min_offset(topic, queue_id), store.max_offset(topic, queue_id)
        directory = store.paths.queue_dir(topic, queue_id)
        for name in os.listdir(directory):
            if not name.isdigit():
                continue
            base = int(name)
            count = os.path.getsize(directory / name) // CQ_ENTRY.itemsize
            first, last = max(low, base), min(high, base + count)
            if first < last:
                entries = np.memmap(directory / name, CQ_ENTRY, "r", shape=(count,))
                found.append(entries["position"][first - base:last - base])
    return found


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
