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

Acknowledged records are never cut. The flushed-position file (checkpoint.py) says how
far the log was durable, saved after log syncs, far more often than checkpoints: bytes
before it were on disk, so a crash cannot have torn them. A log that ends before it —
a bad record, zeros, a segment file lost or cut, with or without intact records after
— is damaged where records were acknowledged: the store refuses to open with a
CorruptStore naming [end, flushed) and changes nothing; ``mqlog repair`` copies the
range from a replica or cuts it, saving its bytes and reporting the loss. Without the
file (a store written before it, or ``flushed_position_save_interval_ms = -1``) the
rules below apply from the checkpoint's position alone.

Damage is told apart from a torn tail (DESIGN §4). Only a tail may be cut: when the scan
meets a bad record, the rest of that segment and every later one are searched for an
intact record (magic, sizes, position and CRC32C all right). If one is found and the bad
record lies before the last checkpoint's position (``RecoveryReport.tail_from``), the log
is damaged in the middle, and the store refuses to open with a CorruptStore that names
the damaged range and says to run ``mqlog repair`` (engine/repair.py). At or past that
position nothing was known to be on disk: a power loss in async mode may leave a page
that was never written in the middle of unflushed data, with pages the kernel did write
after it. That is a torn tail, however intact what follows looks: the log is cut at the
bad record, and the report says so and where the intact records it cut began. Without a
trusted checkpoint (``tail_from`` None) any bad record with intact ones after it is
damage. Zeros where a record should start are the end of the data, as ever (a crash part
way through a truncation leaves exactly that). The segment files are checked the same
way before anything is
mapped: a missing, short, long or tiny segment with data after it is a hole in the log
(CorruptStore); at the end of the log it is a lost tail, cut and reported. A checkpoint
that lies past the segment files is not trusted: the log is scanned from the start.

Derived files are never a reason not to open: a consume-queue file that is empty or of
the wrong size, a stray file among them, a lost or damaged manifest, checkpoint or
epochs file each lead to a rebuild (or a full scan), which the report names.

The result is a RecoveryReport: what was scanned, what was dropped and where, what was
rebuilt, and how long it took.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mqlog import format as fmt
from mqlog.config import PAGE_SIZE
from mqlog.engine.checkpoint import read_checkpoint, read_epochs, read_flushed, read_queues
from mqlog.engine.files import MappedFile, file_name, numbered_files
from mqlog.engine.queuecheck import find_lost_entry
from mqlog.errors import ConsumeQueueMismatch, CorruptStore

if TYPE_CHECKING:
    from mqlog.engine.fileset import FileSet


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
    # The last checkpoint's position, or the saved flushed position if that is further:
    # a bad record at or past it is a torn tail (cut even with intact records after
    # it), before it damage (CorruptStore). None: no checkpoint.
    tail_from: int | None = None
    # The saved flushed position: the log may not end before it (None: no such file).
    acknowledged_to: int | None = None
    segments_dropped: list[int] = field(default_factory=list)  # bases of deleted segments
    queues_rebuilt: bool = False
    rebuilt: list[str] = field(default_factory=list)  # derived files rebuilt, and why
    duration_ms: float = 0.0

    @property
    def lost_anything(self) -> bool:
        return self.truncated_at is not None or bool(self.segments_dropped)

    def note_index(self, files_before: int, files_kept: int) -> None:
        """Report key-index files that opening could not trust (a crash always costs the
        last one, which was never sealed: that is no news)."""
        lost = files_before - files_kept - (0 if self.clean else 1)
        if lost > 0:
            self.rebuilt.append(f"key index: {lost} damaged file(s) dropped, re-indexed "
                                "from the log")

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
        for what in self.rebuilt:
            text += f"; {what}"
        return text


def recover(files: FileSet) -> RecoveryReport:
    """Bring the store's core to the state on disk; see the module docstring."""
    started = time.perf_counter()
    paths = files.paths
    checkpoint = read_checkpoint(paths.checkpoint)
    acknowledged = read_flushed(paths.flushed)
    dropped = map_segments(files, acknowledged)
    files_end = files.files_end()
    claimed_end = None
    if checkpoint is not None and checkpoint.log_end > files_end:
        claimed_end, checkpoint = checkpoint.log_end, None  # segment files were lost
    clean = checkpoint is not None and not paths.abort.exists() and not dropped and \
        (acknowledged is None or acknowledged <= checkpoint.log_end)
    tail_from = None if checkpoint is None else \
        max(checkpoint.log_position, acknowledged or 0)
    first_base = files.first_segment_base()
    epochs = read_epochs(paths.epochs)
    # A clean close of a log that holds records always leaves an epochs file; without a
    # readable one the epochs must be re-learned by scanning every record.
    epochs_known = epochs is not None or (checkpoint is not None
                                          and checkpoint.log_end <= first_base)
    manifest = read_queues(paths.queues)
    if manifest is None and files.segment_bases():
        report = RecoveryReport(clean=False, scanned_from=first_base, tail_from=tail_from,
                                acknowledged_to=acknowledged)
        # Without a manifest lost queues would go unnoticed.
        _rebuild(files, report, "the queue manifest is missing or damaged")
    elif checkpoint is not None and clean and epochs_known and \
            _clean_end_plausible(files, checkpoint.log_end):
        end = checkpoint.log_end
        report = RecoveryReport(clean=True, scanned_from=end, end_position=end,
                                tail_from=tail_from, acknowledged_to=acknowledged)
        try:
            files.open_queues(scan_from=end, manifest=manifest or {}, exact=True)
            files.restore_epochs(epochs or [], end)
        except ConsumeQueueMismatch as mismatch:
            report.clean = False
            _rebuild(files, report, str(mismatch))
    else:
        scan_from = first_base
        if checkpoint is not None and first_base <= checkpoint.log_position:
            scan_from = checkpoint.log_position
        if epochs is None and scan_from != first_base:
            scan_from = first_base  # epochs must be re-learned from every record
        report = RecoveryReport(clean=False, scanned_from=scan_from, tail_from=tail_from,
                                acknowledged_to=acknowledged)
        _scan(files, report, scan_from, epochs or [], manifest or {})
    report.segments_dropped = sorted(set(report.segments_dropped) | set(dropped))
    if files.segment_bases():
        if checkpoint is None:
            report.rebuilt.append("checkpoint missing, damaged or past the segment files: "
                                  f"scanned from {report.scanned_from}")
        if epochs is None and (paths.epochs.exists() or not paths.abort.exists()):
            report.rebuilt.append("epochs file missing or damaged: epochs re-learned")
        if acknowledged is None and paths.flushed.exists():
            report.rebuilt.append("flushed-position file damaged: a damaged tail past the "
                                  "checkpoint could not be told from a torn one")
    if claimed_end is not None and report.end_position < claimed_end:
        report.truncated_at = report.end_position
        report.truncation_reason = (
            f"the segment files end at {files_end} but the checkpoint says the log reached "
            f"{claimed_end}: [{report.end_position}, {claimed_end}) is lost")
    starts = files.core.epoch_starts
    if starts:  # a scan may have met records of a newer epoch than the file knew
        files.core.epoch = max(files.core.epoch, starts[-1][0])
    files.core.restore(report.end_position)
    if checkpoint is not None:  # (a scan met the records after it, not those before)
        files.core.last_store_timestamp = max(files.core.last_store_timestamp,
                                              checkpoint.timestamp_ms)
    report.duration_ms = (time.perf_counter() - started) * 1000
    return report


def map_segments(files: FileSet, acknowledged: int | None = None) -> list[int]:
    """Map the segment files that form the log; return the bases of those that were cut
    off as a lost tail (a hole after which no segment holds data). A hole with data after
    it raises CorruptStore (see the module docstring), and so does a lost tail that
    holds bytes before the saved flushed position ``acknowledged``."""
    directory = files.paths.commitlog
    for leftover in directory.glob("*.tmp"):
        leftover.unlink()  # a segment a crash interrupted in the making
    found = [(base, path, path.stat().st_size) for base, path in numbered_files(directory)]
    keep = len(found)
    for index, (base, path, size) in enumerate(found):
        following = found[index + 1] if index + 1 < len(found) else None
        problem = _segment_problem(base, path, size, following)
        if problem is None:
            continue
        if size < PAGE_SIZE:
            keep = index  # too small to map: itself part of the hole, or of the lost tail
        else:
            keep = index + 1
        if any(_holds_data(later_path) for _, later_path, _ in found[index + 1:]):
            raise CorruptStore(
                f"the commit log of {files.paths.root} has a hole: {problem}, and the "
                f"segments after it hold records; recovery cuts only a damaged tail. "
                + repair_advice(files.paths.root))
        files_end = base if size < PAGE_SIZE else base + size
        if acknowledged is not None and files_end < acknowledged:
            raise CorruptStore(acknowledged_damage(files.paths.root, files_end, acknowledged,
                                                   problem))
        break
    dropped = []
    for base, path, _size in found[keep:]:
        if _holds_data(path):
            dropped.append(base)
        path.unlink()
    for base, path, _size in found[:keep]:
        files.attach_segment(base, MappedFile.open(path))
    return dropped


def acknowledged_damage(root: object, end: int, acknowledged: int, why: str) -> str:
    """The CorruptStore message for a log that ends before its saved flushed position."""
    return (f"the commit log of {root} ends at position {end} ({why}), but it was flushed "
            f"up to {acknowledged} (the flushed-position file says so): records in [{end}, "
            f"{acknowledged}) were acknowledged as durable and are damaged or missing; "
            "recovery cuts only a torn tail, past what was flushed, and changed nothing. "
            f"Run `mqlog repair {root} --from REPLICA_DIR` to copy them from a replica "
            f"whose records there are intact, or `mqlog repair {root}` to cut them (their "
            "bytes are saved and the loss is reported)")


def repair_advice(root: object) -> str:
    """What to tell a user whose log is damaged in the middle."""
    return (f"Run `mqlog repair {root}` (with the store closed) to replace the damaged "
            "bytes with blank records (it reports what was lost and keeps a copy of the "
            f"bytes it replaces), or `mqlog repair {root} --from REPLICA_DIR` to copy them "
            "from a replica whose records there are intact")


def _segment_problem(base: int, path: object, size: int,
                     following: tuple[int, object, int] | None) -> str | None:
    """What is wrong with one segment file, given the next one (None: nothing)."""
    if size < PAGE_SIZE:
        return f"segment {file_name(base)} is only {size} bytes"
    if following is None or base + size == following[0]:
        return None
    if base + size < following[0]:
        return (f"positions [{base + size}, {following[0]}) are in no segment file (segment "
                f"{file_name(base)} is {size} bytes, the next one starts at {following[0]})")
    return (f"segment {file_name(base)} is {size} bytes, {base + size - following[0]} more "
            f"than the space before the next one ({file_name(following[0])})")


def _holds_data(path: object) -> bool:
    """Whether a segment file holds anything: records start at its first byte, and a
    segment made ahead of time is all zeros."""
    with open(path, "rb") as file:  # type: ignore[call-overload]
        return any(file.read(fmt.BLANK_SIZE_MIN))


def _clean_end_plausible(files: FileSet, log_end: int) -> bool:
    """A clean checkpoint's end must lie in the last segment (or be 0 with none)."""
    bases = files.segment_bases()
    if not bases:
        return log_end == 0
    last = files.segment_file(bases[-1])
    return bases[-1] <= log_end <= bases[-1] + last.size


def _scan(files: FileSet, report: RecoveryReport, scan_from: int,
          epochs: list[tuple[int, int]], manifest: dict) -> None:
    try:
        files.open_queues(scan_from=scan_from, manifest=manifest, exact=False)
        files.restore_epochs(epochs, scan_from)
        _scan_segments(files, report, scan_from)
        # A queue may end short of the manifest: records past the checkpoint lost in the
        # crash, or a lost queue file. Only the log tells them apart.
        lost = find_lost_entry(files, manifest, report.end_position)
        if lost is not None:
            raise ConsumeQueueMismatch(lost)
    except ConsumeQueueMismatch as mismatch:
        _rebuild(files, report, str(mismatch))


def _rebuild(files: FileSet, report: RecoveryReport, why: str) -> None:
    """Drop every consume queue and re-index every record from the first segment."""
    report.rebuilt.append(f"consume queues rebuilt ({why})")
    first = files.first_segment_base()
    files.drop_all_queues()
    files.restore_epochs([], first)
    report.scanned_from = first
    report.records_scanned = report.scanned_bytes = 0
    report.truncated_at, report.truncation_reason = None, ""
    report.queues_rebuilt = True
    _scan_segments(files, report, first)


def _scan_segments(files: FileSet, report: RecoveryReport, scan_from: int) -> None:
    core = files.core
    bases = core.segment_bases()
    end = scan_from
    for index, base in enumerate(bases):
        segment = files.segment_file(base)
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
            report.truncation_reason = _bad_record(files, report, bases[index:], end,
                                                   result.stop_reason)
        _check_acknowledged(files, report, end, result.stop_reason)
        if end < base + segment.size:
            segment.zero_from(end - base, files.config.segment_preallocate)
        # Later segments go; only those that held bytes are news (the allocator's
        # prepared-ahead segment is empty).
        later = [b for b in bases[index + 1:] if files.segment_file(b).buffer[:8] != bytes(8)]
        files.drop_segments_from(end + 1)
        report.segments_dropped = later
        break
    if not bases:
        end = 0
        _check_acknowledged(files, report, end, "no segment file")
    report.end_position = end


def _check_acknowledged(files: FileSet, report: RecoveryReport, end: int,
                        reason: str) -> None:
    """Refuse a log that ends before the saved flushed position (before anything is cut)."""
    acknowledged = report.acknowledged_to
    if acknowledged is not None and end < acknowledged:
        why = {"end": "zeros where a record should start",
               "blank": "the segment files end there"}.get(reason, f"a bad record: {reason}")
        raise CorruptStore(acknowledged_damage(files.paths.root, end, acknowledged, why))


def _bad_record(files: FileSet, report: RecoveryReport, bases: list[int], damaged: int,
                reason: str) -> str:
    """Why the log is cut at the bad record at ``damaged``: a torn tail. Raise
    CorruptStore if it is damage instead: an intact record follows it (in its segment,
    from ``bases[0]``, or a later one) and it lies before ``report.tail_from``."""
    intact = _intact_after(files, bases, damaged)
    if intact is None:
        return reason
    if report.tail_from is None or damaged < report.tail_from:
        raise CorruptStore(
            f"the commit log of {files.paths.root} is damaged: the record at position "
            f"{damaged} is bad ({reason}), and intact records follow it from position "
            f"{intact}, so the damaged range is [{damaged}, {intact}) at least; recovery "
            f"cuts only a damaged tail. " + repair_advice(files.paths.root))
    return (f"{reason}; a torn tail: it lies past the last checkpoint (position "
            f"{report.tail_from}), where a crash may leave unwritten pages, so the records "
            f"after it, intact ones from position {intact} included, were cut too")


def _intact_after(files: FileSet, bases: list[int], damaged: int) -> int | None:
    """The position of the first intact record after the bad one at ``damaged``."""
    for base in bases:
        buffer = files.segment_file(base).buffer
        start = damaged - base + 1 if base <= damaged else 0
        if start == 0 and not any(buffer[:fmt.BLANK_SIZE_MIN]):
            continue  # a segment made ahead of time, never written
        found = fmt.find_intact(buffer, base, start)
        if found is not None:
            return base + found
    return None
