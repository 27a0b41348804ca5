"""Planning a batch read on the driver: options and pushed filters to partitions.

Queue mode: each store is opened read-only once; every queue the options and filters
allow gets the offset range [start, end) that the starting/ending offsets, the
starting/ending timestamps (through ``Store.offset_for_timestamp``, exact because store
timestamps never decrease) and the pushed offset and timestamp bounds leave; empty
ranges are dropped, the rest cut by ``options.split``.

Commit-log mode: each segment file of each store is one range of positions (narrowed by
pushed position bounds), cut by ``options.split`` when ``minPartitions`` asks for more.
"""

from __future__ import annotations

import os

import mqlog
from mqlog.engine.store import Store
from mqlog.errors import StoreNotFound
from mqlog.spark_connector.options import (
    QueueRange,
    ReadOptions,
    SegmentRange,
    resolve,
    split,
)


def plan(options: ReadOptions) -> list[QueueRange] | list[SegmentRange]:
    """The partitions of a batch read; see the module docstring."""
    if options.mode == "commitlog":
        return plan_segments(options)
    ranges: list[QueueRange] = []
    for path, replica in _wanted_paths(options):
        with open_store(path) as store:
            ranges.extend(queue_ranges(store, options, path, replica))
    return split(ranges, options.records_per_partition, options.min_partitions)


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
    return split(ranges, None, options.min_partitions)
