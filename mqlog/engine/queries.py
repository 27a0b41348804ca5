"""Finding records: by tag (subscription filters), by time, and by key.

* Tags. A subscription expression is RocketMQ's: ``*`` (or nothing) takes every record,
  ``TagA || TagB`` takes records whose tags equal one of the names. The log core skips
  entries whose consume-queue tag hash is not wanted without reading the commit log;
  the engine then compares the tags exactly, so a hash collision never leaks through.
* Time. Store timestamps never decrease within a store, so within a queue they are
  sorted by offset: ``offset_for_timestamp`` is a binary search over the consume queue
  that reads one record per step (RocketMQ's getOffsetInQueueByTime, Kafka's
  offsetsForTimes). ``query_by_time`` runs it on each queue of a topic and merges.
* Keys. The key index (index.py) yields candidate positions newest first; each record
  is read and its topic and key compared before it is returned. A read-only store
  cannot bring the index up to date, so it reads the topic's records instead, and so
  does a store whose index cannot grow now (a nearly full disk, no free descriptor): the
  index is derived data, and reads must work while writes cannot.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from mqlog.engine.index import IndexDamaged
from mqlog.errors import (
    CorruptStore,
    DiskFull,
    InvalidArgument,
    InvalidPosition,
    TooManyOpenFiles,
)

if TYPE_CHECKING:
    from mqlog.engine.fileset import FileSet
    from mqlog.engine.index import KeyIndex

_log = logging.getLogger("mqlog")
TIME_MIN, TIME_MAX = -(1 << 63), (1 << 63) - 1
QUERY_REBUILDS_MAX = 2  # damaged index files rebuilt in one query before giving up


def parse_subscription(expression: str | None, tags_max: int) -> frozenset[str] | None:
    """The tag names an expression accepts, or None for every record."""
    if expression is None:
        return None
    if not isinstance(expression, str):
        raise InvalidArgument(f"tags must be a str such as 'TagA || TagB', got "
                              f"{type(expression).__name__}")
    if expression.strip() in ("", "*"):
        return None
    names = frozenset(name.strip() for name in expression.split("||"))
    if "" in names or "*" in names:
        raise InvalidArgument(f"tag filter {expression!r} has an empty name or a '*' among "
                              "others; write '*' alone, or names joined by '||'")
    if len(names) > tags_max:
        raise InvalidArgument(f"tag filter names {len(names)} tags; at most "
                              f"subscription_tags_max={tags_max}")
    return names


def check_timestamp(name: str, value: Any, default: int) -> int:
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or \
            not TIME_MIN <= value <= TIME_MAX:
        raise InvalidArgument(f"{name} must be milliseconds since the epoch (an int), "
                              f"got {value!r}")
    return value


def _queue_ids(files: FileSet, topic: str) -> list[int]:
    """The ids of the topic's queues, ascending."""
    return sorted(queue_id for name, queue_id in files.core.queue_ids() if name == topic)


def _offsets(files: FileSet, topic: str, queue_id: int) -> tuple[int, int]:
    """(min offset, max committed offset) of a queue ((0, 0) for one never written)."""
    offsets = files.core.queue_offsets(topic, queue_id)
    return (0 if offsets is None else offsets[0],
            files.core.committed_end_offset(topic, queue_id))


def offset_for_timestamp(files: FileSet, topic: str, queue_id: int, timestamp_ms: int) -> int:
    """The first offset whose store timestamp is at least ``timestamp_ms``; the queue's
    max offset if there is none."""
    timestamp_ms = check_timestamp("timestamp_ms", timestamp_ms, 0)
    core = files.core
    low, high = _offsets(files, topic, queue_id)
    while low < high:
        middle = (low + high) // 2
        if core.get(topic, queue_id, middle, 1, 1)[0].store_timestamp < timestamp_ms:
            low = middle + 1
        else:
            high = middle
    return low


def query_by_time(files: FileSet, topic: str, begin_ms: int, end_ms: int,
                  max_count: int) -> list:
    """Records of ``topic`` stored in [begin_ms, end_ms], oldest first, at most
    ``max_count`` (the earliest ones)."""
    found = []
    for queue_id in _queue_ids(files, topic):
        offset = offset_for_timestamp(files, topic, queue_id, begin_ms)
        stop = offset_for_timestamp(files, topic, queue_id, end_ms + 1) \
            if end_ms < TIME_MAX else _offsets(files, topic, queue_id)[1]
        stop = min(stop, offset + max_count)
        while offset < stop:
            batch = files.core.get(topic, queue_id, offset, stop - offset,
                                   files.config.read_size_bytes_max)
            found.extend(batch)
            offset += len(batch)
    found.sort(key=lambda record: record.position)
    return found[:max_count]


def query_by_key(files: FileSet, index: KeyIndex, topic: str, key: str, begin_ms: int,
                 end_ms: int, max_count: int) -> list:
    """Records of ``topic`` whose key is ``key``, newest first (see the module docstring).

    A damaged index file (a chain that does not hold together, an entry that names no
    record) is rebuilt from the log and the lookup runs again: a flipped bit never makes
    a query hang or silently miss a record."""
    with index.lock:
        try:
            index.catch_up()
            return _lookup_rebuilding(files, index, topic, key, begin_ms, end_ms, max_count)
        except (DiskFull, TooManyOpenFiles) as error:  # (the module docstring says why)
            _log.warning("mqlog: the key index cannot grow (%s); reading the records of "
                         "%r instead", error, topic)
    return query_by_scan(files, topic, key, begin_ms, end_ms, max_count)


def _lookup_rebuilding(files: FileSet, index: KeyIndex, topic: str, key: str,
                       begin_ms: int, end_ms: int, max_count: int) -> list:
    for _attempt in range(QUERY_REBUILDS_MAX):
        try:
            return _lookup(files, index, topic, key, begin_ms, end_ms, max_count)
        except IndexDamaged as damage:  # reported: counted, and logged
            _log.warning("mqlog: %s; rebuilding it from the commit log", damage)
            index.rebuild_from(damage.first_position)
    try:
        return _lookup(files, index, topic, key, begin_ms, end_ms, max_count)
    except IndexDamaged as damage:
        raise CorruptStore(f"{damage} (still, after rebuilding it from the log): the "
                           "disk or memory may be failing") from None


def _lookup(files: FileSet, index: KeyIndex, topic: str, key: str, begin_ms: int,
            end_ms: int, max_count: int) -> list:
    found: list = []
    log_start = files.first_segment_base()
    for position in index.positions(topic, key, begin_ms, end_ms):
        if position < log_start:
            break  # newest first: every later candidate was deleted too
        try:
            record = files.core.read_record(position)
        except InvalidPosition as error:  # (a damaged record there is a CorruptRecord)
            raise index.damaged_at(position, str(error)) from None
        if record.topic == topic and record.key == key:
            found.append(record)
            if len(found) == max_count:
                break
    return found


def query_by_scan(files: FileSet, topic: str, key: str, begin_ms: int, end_ms: int,
                  max_count: int) -> list:
    """``query_by_key`` without the index (a read-only store may not bring it up to
    date): reads every record of the topic's queues stored in [begin_ms, end_ms]."""
    found: list = []
    for queue_id in _queue_ids(files, topic):
        offset = offset_for_timestamp(files, topic, queue_id, begin_ms)
        while offset < _offsets(files, topic, queue_id)[1]:
            batch = files.core.get(topic, queue_id, offset, 4096, 1 << 24)
            found.extend(record for record in batch if record.key == key
                         and record.store_timestamp <= end_ms)
            offset += len(batch)
            if batch[-1].store_timestamp > end_ms:
                break
    found.sort(key=lambda record: record.position, reverse=True)
    return found[:max_count]
