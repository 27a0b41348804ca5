"""Commit-log mode: every record in a store's segment files, each with its CRC verdict.

Theory of operation. Queue mode sees what the consume queues point to, up to a
snapshot's end, and fails on damage. Commit-log mode is for forensics and reconciling:
it walks segment files as docs/FORMAT.md lays them out, with no snapshot and no
consume queue, so it also reports records no queue points to (control records, a tail
past the last checkpointed entry, records a crash left unindexed) and damaged records.

A walk of one segment reads the file in windows of ``WINDOW_BYTES`` and steps from record
to record by ``total_size``:

* a blank record ("MQB\\x01") fills the segment's tail; zeros (size 0) at or past where
  the log ended when the read was planned (``SegmentRange.written``) are its unwritten
  tail: both end the segment's records;
* a record ("MQR\\x01", size within the segment) is reported; ``crc_ok`` is true when its
  CRC32C over bytes [12, total_size) matches and its stored position is where it lies
  (the two checks a reader applies besides sizes and magic);
* anything else (a damaged size or magic, zeros before the log's end: a lost page)
  cannot be stepped over, so the walk searches on for the next record magic whose
  stored position equals its place, as a forensic tool should; the damaged bytes in
  between are not a row. The search starts just past the record the walk stepped from
  (its size led nowhere: it is what was damaged), and past a record that failed its
  CRC (the CRC does not cover the size; a matching one vouches for it, a failing one
  not). Before, one damaged size hid the intact records it stepped over, and which ones
  depended on where the partitions were cut.

Records are reported when they start inside the partition's [start, end) positions. The
walk starts where a record boundary is known: the segment's first byte, or the
partition's ``walk_from``, a record start the planner verified (a consume-queue
entry's position whose record reads back with its CRC and position: planner.py), so a
large segment is read as several partitions that each walk only their own part. Up to
the partition's start it only steps (no CRC, no row; counted as ``stepped``), over
records that claim their place (stored position), and lands where that partition did.
Batches are built in bulk by ``layout.build_batch``; only the stepping and the CRC call
are per record.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from mqlog import ext
from mqlog.errors import StoreChanged
from mqlog.spark_connector import layout
from mqlog.spark_connector.options import SegmentRange
from mqlog.spark_connector.reader import Counters
from mqlog.spark_connector.schema import ARROW_SCHEMA

WINDOW_BYTES = 16 << 20
BATCH_RECORDS = 65_536
_RECORD = int.from_bytes(layout.RECORD_MAGIC, "little")
_BLANK = int.from_bytes(layout.BLANK_MAGIC, "little")


def read_segment(part: SegmentRange, counters: Counters,
                 arrow: pa.Schema = ARROW_SCHEMA) -> Iterator[pa.RecordBatch]:
    """The records starting in ``part``'s position range, as Arrow batches."""
    name = os.path.join(part.path, "commitlog", f"{part.base:020d}")
    try:
        segment = open(name, "rb")  # noqa: SIM115 - closed by the with below
    except FileNotFoundError:
        raise StoreChanged(f"mqlog source: the segment file {name} was deleted after this "
                           "read was planned (retention, a truncation or a replica's "
                           "reset); load the DataFrame again to read what the store holds "
                           "now") from None
    with segment:
        size = os.fstat(segment.fileno()).st_size
        walk = _Walk(segment, part.base, size, arrow, part.written)
        yield from walk.batches(part, counters)


class _Walk:
    """A window over one segment file and the records found in it so far."""

    def __init__(self, segment: object, base: int, size: int, arrow: pa.Schema,
                 written: int | None = None) -> None:
        self.arrow = arrow
        self.segment = segment
        self.base = base
        self.size = size
        self.written = written  # (SegmentRange.written)
        self.window = b""
        self.window_at = 0  # segment offset of window[0]
        self.crc32c = ext.load().crc32c

    def view(self, at: int, length: int) -> memoryview | None:
        """Bytes [at, at + length) of the segment; refills the window if needed."""
        if at + length > self.size:
            return None
        if not (self.window_at <= at and at + length <= self.window_at + len(self.window)):
            self.segment.seek(at)  # type: ignore[attr-defined]
            self.window = self.segment.read(max(WINDOW_BYTES, length))  # type: ignore
            self.window_at = at
        start = at - self.window_at
        return memoryview(self.window)[start:start + length]

    def batches(self, part: SegmentRange, counters: Counters) -> Iterator[pa.RecordBatch]:
        starts: list[int] = []
        verdicts: list[bool] = []
        at = (self.base if part.walk_from is None else part.walk_from) - self.base
        stop = part.end - self.base
        previous = None  # the record the walk stepped here from
        while at < stop:
            reported = at + self.base >= part.start
            found = self.record_at(at, verify=reported)
            if found is None:  # (a size that led nowhere: search on from its record)
                at = self.size if self.ends_at(at) else \
                    self.search((at if previous is None else previous) + 1)
                previous = None
                continue
            total, ok = found
            if reported:
                starts.append(at)
                verdicts.append(ok)
            else:
                counters.stepped += 1
            # (a CRC that matches vouches for the size too; one that fails, not)
            previous, at = at, at + total if ok else self.search(at + 1)
            # emit before the window slides past what was collected
            window_full = at + layout.HEADER_SIZE > self.window_at + len(self.window)
            if starts and (len(starts) >= BATCH_RECORDS or window_full):
                yield self.emit(starts, verdicts, part, counters)
        if starts:
            yield self.emit(starts, verdicts, part, counters)

    def record_at(self, at: int, verify: bool = True) -> tuple[int, bool] | None:
        """(total size, CRC and position valid) of a record at ``at``; None if none is.
        A walk towards the partition's start skips the CRC (``verify=False``): it takes
        a record that claims its place (stored position) to be whole, and lands where the
        partition before it, which reports those records, did (a record that does not
        claim its place is searched past by both: reported, it is a crc_ok false row)."""
        head = self.view(at, 48)
        if head is None:
            return None
        total, magic = int.from_bytes(head[:4], "little"), int.from_bytes(head[4:8], "little")
        if magic != _RECORD or total < layout.HEADER_SIZE or at + total > self.size:
            return None
        claims = int.from_bytes(head[40:48], "little") == self.base + at
        if not verify:
            return (total, True) if claims else None
        record = self.view(at, total)
        assert record is not None
        stored_crc = int.from_bytes(record[8:12], "little")
        return total, claims and stored_crc == self.crc32c(record[12:])

    def ends_at(self, at: int) -> bool:
        """Whether the segment's records end at ``at``: its end, a blank record, or zeros
        in the log's unwritten tail (past where it ended when planned; unknown: zeros are
        searched past, which costs a read of the rest)."""
        head = self.view(at, 8)
        return head is None or int.from_bytes(head[4:], "little") == _BLANK or \
            (bytes(head) == bytes(8) and self.written is not None
             and self.base + at >= self.written)

    def search(self, probe: int) -> int:
        """The first place from ``probe`` on whose record magic claims its place (stored
        position), or the segment's end."""
        while True:
            window = self.view(probe, min(WINDOW_BYTES, self.size - probe))
            if window is None or len(window) < 48:
                return self.size
            index = bytes(window).find(layout.RECORD_MAGIC)
            if index < 0:
                probe += len(window) - 3
                continue
            candidate = probe + index - 4
            if candidate >= probe and self._claims(candidate):
                return candidate
            probe += index + 1

    def _claims(self, at: int) -> bool:
        head = self.view(at, 48)
        return head is not None and int.from_bytes(head[40:48], "little") == self.base + at

    def emit(self, starts: list[int], verdicts: list[bool], part: SegmentRange,
             counters: Counters) -> pa.RecordBatch:
        first = starts[0]
        last_total = int.from_bytes(self.view(starts[-1], 4) or b"\0" * 4, "little")
        blob = bytes(self.view(first, starts[-1] + last_total - first) or b"")
        offsets = np.asarray(starts, np.int64) - first
        batch = layout.build_batch(blob, offsets, part.replica,
                                   crc_ok=np.asarray(verdicts, bool), schema=self.arrow)
        counters.records += len(starts)
        counters.bytes += len(blob)
        counters.batches += 1
        starts.clear()
        verdicts.clear()
        return batch
