"""Retention: delete whole segments that are too old or too far behind the log's end.

Kafka's log.retention.ms and log.retention.bytes, on RocketMQ's layout. A segment is
deleted, oldest first, when every byte of it lies more than ``retention_bytes`` before
the end of the log, or when every record in it is older than ``retention_ms``. The age
test needs no time index: store timestamps never decrease, so the first record of the
next segment is at least as new as every record of this one (a segment may outlive its
deadline by the time its successor took to start, never the other way round).

Never deleted: the active (last) segment, and anything not yet both committed and
flushed. The log core then raises every queue's minimum offset past the deleted
records and drops consume-queue files that hold only older entries; the key index
drops files whose records are all gone. A reader below a queue's new minimum gets
OffsetOutOfRange, as in Kafka. Deleted files are unlinked at once; their mappings
are closed at the next pass, so a reader that was mid-copy never loses its pages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mqlog.engine.fileset import FileSet


@dataclass(frozen=True)
class RetentionReport:
    """What one retention pass deleted."""

    log_start: int  # the first position still in the log
    segments_deleted: list[int] = field(default_factory=list)  # bases, ascending
    bytes_deleted: int = 0


def plan_log_start(files: FileSet, now_ms: int, limit: int) -> int:
    """Where the log may start after this pass: a segment base (see the docstring), at
    most ``limit`` (what is both committed and flushed)."""
    bases = files.segment_bases()
    if not bases:
        return 0
    start = bases[0]
    for end in bases[1:]:
        if end > limit or not _expired(files, end, now_ms):
            break
        start = end
    return start


def _expired(files: FileSet, end: int, now_ms: int) -> bool:
    """Whether the segment that ends at ``end`` may go."""
    config, core = files.config, files.core
    if 0 <= config.retention_bytes <= core.written_position - end:
        return True
    if config.retention_ms >= 0 and end < core.committed_position:
        newest_possible = core.read_record(end).store_timestamp
        return newest_possible < now_ms - config.retention_ms
    return False
