"""Control records: records the replication layers write for themselves (a new Raft
leader's no-op), marked by attribute bit 0. They belong to no queue, so no consume
queue, index or reader of a queue ever sees them; they travel and are checked like any
record (docs/FORMAT.md).

A control record is encoded here, in Python, because it is rare (one per election), and
appended with the same checks as replicated bytes. If it does not fit in the active
segment, a blank record fills the segment's tail first, as the write path does.
"""

from __future__ import annotations

from mqlog.format import (
    ATTR_CONTROL,
    BLANK,
    BLANK_MAGIC,
    BLANK_SIZE_MIN,
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    RECORD_MAGIC,
    seal_record,
)


def encode_control(position: int, epoch: int, timestamp_ms: int, body: bytes) -> bytes:
    """One control record at ``position``: no topic, key, tags or properties."""
    size = RECORD_HEADER_SIZE + len(body)
    record = bytearray(size)
    RECORD_HEADER.pack_into(record, 0, size, RECORD_MAGIC, 0, ATTR_CONTROL, 0, 0, len(body),
                            epoch, 0, position, timestamp_ms, timestamp_ms, 0, 0, 0)
    record[RECORD_HEADER_SIZE:] = body
    seal_record(record)
    return bytes(record)


def control_bytes(written: int, segment_end: int | None, epoch: int, timestamp_ms: int,
                  body: bytes) -> tuple[int, bytes]:
    """What to append at ``written`` to add one control record: (its position, the bytes,
    a blank first if the record does not fit before ``segment_end``, the end of the
    active segment; None when the next record opens a new segment)."""
    size = RECORD_HEADER_SIZE + len(body)
    if segment_end is None or written + size + BLANK_SIZE_MIN <= segment_end:
        return written, encode_control(written, epoch, timestamp_ms, body)
    blank_size = segment_end - written
    blank = BLANK.pack(blank_size, BLANK_MAGIC) + bytes(blank_size - BLANK.size)
    return segment_end, blank + encode_control(segment_end, epoch, timestamp_ms, body)
