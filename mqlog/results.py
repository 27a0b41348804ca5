"""Values returned by the write path, shared by the C core, its Python twin and the engine."""

from __future__ import annotations

import enum
from typing import NamedTuple


class PutStatus(enum.Enum):
    """How far a write got, in RocketMQ's words."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"  # stored, but not flushed within the deadline
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"  # stored, replicas did not ack in time
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"  # stored, too few replicas connected
    # The ISR layer's (Kafka's) answers to acks=all; both: stored, and it may still commit.
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = "NOT_ENOUGH_REPLICAS_AFTER_APPEND"  # ISR shrank
    REQUEST_TIMED_OUT = "REQUEST_TIMED_OUT"  # not committed within the deadline


class PutResult(NamedTuple):
    """One stored record: where it went and when."""

    status: PutStatus
    position: int  # commit-log position of the record
    offset: int  # offset of the record in its queue
    store_timestamp: int  # milliseconds since the epoch, never decreasing in a store
    size: int  # bytes the record takes in the commit log

    @property
    def end_position(self) -> int:
        return self.position + self.size


class BatchPutResult(NamedTuple):
    """A batch stored in one call: consecutive offsets in one queue."""

    status: PutStatus
    position: int  # position of the first record
    offset: int  # offset of the first record
    count: int  # type: ignore[assignment]  # shadows tuple.count, on purpose
    store_timestamp: int
    end_position: int  # position just past the last record


PUT_OK = PutStatus.PUT_OK


class PullResult(NamedTuple):
    """What a (possibly filtered) pull found, and where the consumer goes next."""

    records: list  # the matching records, in offset order
    next_offset: int  # pull from here next time: every offset before it was examined
    min_offset: int  # the queue's lowest stored offset
    max_offset: int  # one past the queue's last committed offset
