"""Opening a store: find where the log really ends and make the queues agree with it.

1. Map every segment. A checkpoint says where scanning may start: every record before
   its position was flushed, and so were those records' consume-queue entries.
2. Clean close (no abort marker, a valid checkpoint): the checkpoint also says where
   the log ends, so nothing is scanned.
3. Crash: scan from the checkpoint with the core's recovery scan, which checks each
   record's size, magic, position and CRC32C and re-indexes it. The scan stops at the
   first record that fails; the log is cut there, the dead tail of that segment is
   zeroed (stale bytes are never left behind, unlike RocketMQ) and later segments are
   deleted.
4. Consume queues: entries that point at or past the scan's start are dropped before
   the scan (it re-creates the ones whose records survived), so no queue can point
   into the dead tail. The queue manifest says which queues exist and where each
   starts (and, after a clean close, ends); if the files disagree with it (a queue or
   a file lost, a gap), if it is missing, or if a queue cannot take a scanned record,
   every queue is rebuilt from the first segment.

The result is a RecoveryReport: what was scanned, what was dropped and where, and how
long it took.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mqlog.engine.checkpoint import read_checkpoint, read_epochs, read_queues
from mqlog.errors import ConsumeQueueMismatch

if TYPE_CHECKING:
    from mqlog.engine.store import Store


@dataclass
class RecoveryReport:
    """What opening the store found and did."""

    clean: bool  # the last close was clean: nothing needed scanning
    scanned_from: int = 0  # position the scan started at
    scanned_bytes: int = 0
    records_scanned: int = 0
    end_position: int = 0  # where the log ends now
    truncated_at: int | None = None  # where a bad record was cut off, if one was
    truncation_reason: str = ""
    segments_dropped: list[int] = field(default_factory=list)  # bases of deleted segments
    queues_rebuilt: bool = False
    duration_ms: float = 0.0

    @property
    def lost_anything(self) -> bool:
        return self.truncated_at is not None or bool(self.segments_dropped)

    def summary(self) -> str:
        if self.clean:
            return f"clean open, log ends at {self.end_position} ({self.duration_ms:.1f} ms)"
        text = (f"recovered {self.records_scanned} records ({self.scanned_bytes} bytes) from "
                f"position {self.scanned_from} in {self.duration_ms:.1f} ms; log ends at "
                f"{self.end_position}")
        if self.truncated_at is not None:
            text += f"; cut a bad record at {self.truncated_at} ({self.truncation_reason})"
        if self.segments_dropped:
            text += f"; deleted {len(self.segments_dropped)} later segment(s)"
        if self.queues_rebuilt:
            text += "; consume queues rebuilt"
        return text


def recover(store: Store) -> RecoveryReport:
    """Bring the store's core to the state on disk; see the module docstring."""
    started = time.perf_counter()
    paths = store.paths
    checkpoint = read_checkpoint(paths.checkpoint)
    clean = checkpoint is not None and not paths.abort.exists()
    store.map_segments()
    first_base = store.first_segment_base()
    epochs = read_epochs(paths.epochs)
    # A clean close of a log that holds records always leaves an epochs file; without a
    # readable one the epochs must be re-learned by scanning every record.
    epochs_known = epochs is not None or (checkpoint is not None
                                          and checkpoint.log_end <= first_base)
    manifest = read_queues(paths.queues)
    if manifest is None and store.core.segment_bases():
        report = RecoveryReport(clean=False, scanned_from=first_base)
        _rebuild(store, report)  # without a manifest lost queues would go unnoticed
    elif checkpoint is not None and clean and epochs_known and \
            _clean_end_plausible(store, checkpoint.log_end):
        end = checkpoint.log_end
        report = RecoveryReport(clean=True, scanned_from=end, end_position=end)
        try:
            store.open_queues(scan_from=end, manifest=manifest or {}, exact=True)
            store.restore_epochs(epochs or [], end)
        except ConsumeQueueMismatch:
            report.clean = False
            _rebuild(store, report)
    else:
        scan_from = first_base
        if checkpoint is not None and first_base <= checkpoint.log_position:
            scan_from = checkpoint.log_position
        if epochs is None and scan_from != first_base:
            scan_from = first_base  # epochs must be re-learned from every record
        report = RecoveryReport(clean=False, scanned_from=scan_from)
        _scan(store, report, scan_from, epochs or [], manifest or {})
    starts = store.core.epoch_starts
    if starts:  # a scan may have met records of a newer epoch than the file knew
        store.core.epoch = max(store.core.epoch, starts[-1][0])
    store.core.restore(report.end_position)
    report.duration_ms = (time.perf_counter() - started) * 1000
    return report


def _clean_end_plausible(store: Store, log_end: int) -> bool:
    """A clean checkpoint's end must lie in the last segment (or be 0 with none)."""
    bases = store.core.segment_bases()
    if not bases:
        return log_end == 0
    last = store.segment_file(bases[-1])
    return bases[-1] <= log_end <= bases[-1] + last.size


def _scan(store: Store, report: RecoveryReport, scan_from: int,
          epochs: list[tuple[int, int]], manifest: dict) -> None:
    try:
        store.open_queues(scan_from=scan_from, manifest=manifest, exact=False)
        store.restore_epochs(epochs, scan_from)
        _scan_segments(store, report, scan_from)
    except ConsumeQueueMismatch:
        _rebuild(store, report)


def _rebuild(store: Store, report: RecoveryReport) -> None:
    """Drop every consume queue and re-index every record from the first segment."""
    first = store.first_segment_base()
    store.drop_all_queues()
    store.restore_epochs([], first)
    report.scanned_from = first
    report.records_scanned = report.scanned_bytes = 0
    report.truncated_at, report.truncation_reason = None, ""
    report.queues_rebuilt = True
    _scan_segments(store, report, first)


def _scan_segments(store: Store, report: RecoveryReport, scan_from: int) -> None:
    core = store.core
    bases = core.segment_bases()
    end = scan_from
    for index, base in enumerate(bases):
        segment = store.segment_file(base)
        if base + segment.size <= scan_from:
            continue
        start = max(scan_from, base) - base
        result = core.scan_segment(base, start)
        report.records_scanned += result.record_count
        end = base + result.end_offset
        if result.stop_reason == "blank":
            end = base + segment.size  # the blank is part of the log
        report.scanned_bytes += end - base - start
        if result.stop_reason == "blank" and index + 1 < len(bases):
            continue
        if result.stop_reason not in ("blank", "end"):
            report.truncated_at = end
            report.truncation_reason = result.stop_reason
        if end < base + segment.size:
            segment.zero_from(end - base, store.config.segment_preallocate)
        # Later segments go; only those that held bytes are news (the allocator's
        # prepared-ahead segment is empty).
        later = [b for b in bases[index + 1:] if store.segment_file(b).buffer[:8] != bytes(8)]
        store.drop_segments_from(end + 1)
        report.segments_dropped = later
        break
    if not bases:
        end = 0
    report.end_position = end
