"""Opening a store read-only: a consistent snapshot, beside a writer or after a crash.

``mqlog.open(path, read_only=True)`` is what a Spark task, ``mqlog dump`` or any second
process uses: it takes no lock, writes no byte and starts no thread, so it works while
another process has the store open for writing, and on a copy of one that crashed.

1. Map every segment and consume-queue file read-only (PROT_READ).
2. Find the end: after a clean close the checkpoint says where the log ends; otherwise
   the log core scans (without indexing) from the checkpoint to the first record whose
   size, magic, position or CRC is wrong — the end of what a writer had finished, or of
   what a crash left intact. Nothing past it is visible; nothing is cut.
3. Each queue's entries are taken up to that end; entries a live writer added since
   are ignored. Entries of records that retention deleted are skipped. A writer stores
   an entry's size last and the snapshot reads it first (consumequeue.entry), so an
   entry being written is either whole or not yet there; the last entry taken must name
   its record in the log (consumequeue.entries_held: a crash can tear one).
4. The queues are checked against the queue manifest and the log (queuecheck.py): a
   queue that lacks records of the log — a consume-queue file lost — is refused.

The snapshot does not move: reopen to see newer records. A store whose consume-queue
files were lost or damaged (a gap, a file of the wrong size, entries missing) cannot be
rebuilt without writing: the open raises ConsumeQueueMismatch (a CorruptStore) saying
to open the store for writing once, which rebuilds them.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from mqlog.config import PAGE_SIZE
from mqlog.engine import checkpoint as cp
from mqlog.engine import consumequeue as cq
from mqlog.engine.files import MappedFile, numbered_files
from mqlog.engine.queuecheck import check_queues, rebuild_advice
from mqlog.engine.recovery import RecoveryReport
from mqlog.errors import ConsumeQueueMismatch, CorruptStore

if TYPE_CHECKING:
    from mqlog.engine.fileset import FileSet


def open_snapshot(files: FileSet) -> RecoveryReport:
    """Map the store's files read-only and find its end; see the module docstring."""
    started = time.perf_counter()
    paths, core = files.paths, files.core
    checkpoint = cp.read_checkpoint(paths.checkpoint)
    manifest = cp.read_queues(paths.queues)  # before any file: see queuecheck.py
    _map_segments(files)
    first = files.first_segment_base()
    clean = checkpoint is not None and not paths.abort.exists() and \
        _in_last_segment(files, checkpoint.log_end)
    if clean:
        assert checkpoint is not None
        report = RecoveryReport(clean=True, scanned_from=checkpoint.log_end,
                                end_position=checkpoint.log_end)
    else:
        scan_from = first
        if checkpoint is not None and first <= checkpoint.log_position:
            scan_from = checkpoint.log_position
        report = RecoveryReport(clean=False, scanned_from=scan_from)
        _find_end(files, report, scan_from)
    end = report.end_position
    files.close_segments_from(end + 1)  # (segments past the end: a live writer's)
    if not _in_last_segment(files, end):
        raise CorruptStore(_cut_short(files, end))
    _map_queues(files, end)
    epochs = cp.read_epochs(paths.epochs) or []
    core.epoch_starts = [(epoch, start) for epoch, start in epochs if start < end]
    core.epoch = core.epoch_starts[-1][0] if core.epoch_starts else 0
    core.restore(end)
    core.committed_position = end
    # Entries of records past the checkpoint may still be on their way (a live
    # writer's puts in flight): only those before it must be in the files.
    check_queues(files, manifest, min(end, checkpoint.log_position) if checkpoint else 0)
    report.duration_ms = (time.perf_counter() - started) * 1000
    return report


# How often a listing of segments or of a queue's files is taken again when a file in it
# vanished before it was mapped (retention deleting the oldest ones meanwhile).
LISTING_ATTEMPTS_MAX = 16


def _map_segments(files: FileSet) -> None:
    """Map the segment files, all or none of one listing: if one vanishes before it is
    mapped (retention deleted it, and every older one), the directory is listed again."""
    for _attempt in range(LISTING_ATTEMPTS_MAX):
        mapped = _map_listed_segments(files)
        if mapped is not None:
            for base, file in mapped:
                files.attach_segment(base, file)
            return
    raise CorruptStore(f"the segments of {files.paths.root} kept vanishing while it was "
                       f"opened ({LISTING_ATTEMPTS_MAX} listings); try again")


def _map_listed_segments(files: FileSet) -> list[tuple[int, MappedFile]] | None:
    """The segments of one listing, mapped; None if one vanished first."""
    mapped: list[tuple[int, MappedFile]] = []
    try:
        for base, path in numbered_files(files.paths.commitlog):
            size = os.stat(path).st_size
            if size < PAGE_SIZE:  # (an empty file cannot even be mapped)
                raise CorruptStore(f"segment {path} is only {size} bytes; open the store "
                                   "read-write once to recover it")
            if mapped and base != mapped[-1][0] + mapped[-1][1].size:
                raise CorruptStore(
                    f"the segments of {files.paths.root} are not contiguous at {base} (the "
                    "store changed while it was opened, or a segment is missing, short or "
                    "long); try again, or open the store read-write once to see what is "
                    "wrong")
            mapped.append((base, MappedFile.open_read_only(path)))
    except FileNotFoundError:
        for _base, file in mapped:
            file.close()
        return None
    except BaseException:
        for _base, file in mapped:
            file.close()
        raise
    return mapped


def _in_last_segment(files: FileSet, position: int) -> bool:
    bases = files.segment_bases()
    if not bases:
        return position == 0
    return bases[-1] <= position <= bases[-1] + files.segment_file(bases[-1]).size


def _cut_short(files: FileSet, end: int) -> str:
    """Why a log whose checkpoint says it reaches ``end`` cannot be opened: its segment
    files end before that (the last one was cut short, or is missing)."""
    bases = files.segment_bases()
    log_end = bases[-1] + files.segment_file(bases[-1]).size if bases else 0
    return (f"the commit log of {files.paths.root} ends at position {log_end}, but its "
            f"checkpoint says records were written up to {end}: the last segment file was "
            "cut short or is missing (an incomplete copy?). Open the store read-write once: "
            "recovery says what is lost and how to repair it")


def _find_end(files: FileSet, report: RecoveryReport, scan_from: int) -> None:
    """Scan (without indexing) from ``scan_from`` to the first record that fails."""
    end = scan_from
    for base in files.segment_bases():
        size = files.segment_file(base).size
        if base + size <= scan_from:
            continue
        start = max(scan_from, base) - base
        result = files.core.scan_segment(base, start, dispatch=False)
        report.records_scanned += result.record_count
        end = base + (size if result.stop_reason == "blank" else result.end_offset)
        report.scanned_bytes += end - base - start
        if result.stop_reason != "blank":
            if result.stop_reason != "end":
                report.truncated_at, report.truncation_reason = end, result.stop_reason
            break
    report.end_position = end


def _map_queues(files: FileSet, end: int) -> None:
    log_start = files.first_segment_base()
    for key, queue_dir in cq.queue_directories(files.paths.consumequeue):
        _map_queue(files, key, queue_dir, log_start, end)


def _map_queue(file_set: FileSet, key: tuple[str, int], directory: Path, log_start: int,
               end: int) -> None:
    files = _map_queue_files(key, directory, file_set.paths.root)
    check = file_set.entry_check(key)
    while len(files) > 1 and cq.entries_held(files[-1], end, check) == 0:
        files.pop().close()  # entries a live writer added past the snapshot
    while len(files) > 1 and cq.first_live_entry(files[1], log_start) > 0:
        files.pop(0).close()  # retention deleted every record of this one
    if not files:
        return
    per_file = files[0].size // cq.ENTRY_SIZE
    bases = [int(mapped.path.name) for mapped in files]
    if bases != list(range(bases[0], bases[0] + per_file * len(bases), per_file)):
        for mapped in files:
            mapped.close()
        raise ConsumeQueueMismatch(f"consume queue {key} has a gap between its files: "
                                   "one was deleted or lost; "
                                   + rebuild_advice(file_set.paths.root))
    next_offset = bases[-1] + cq.entries_held(files[-1], end, check)
    min_offset = min(next_offset, bases[0] + cq.first_live_entry(files[0], log_start))
    file_set.attach_queue(key, files, min_offset, next_offset, per_file)


def _map_queue_files(key: tuple[str, int], directory: Path, root: Path) -> list[MappedFile]:
    """A queue's files, all of one listing, mapped; listed again when one vanishes before
    it is mapped (retention drops the oldest files of a queue)."""
    for _attempt in range(LISTING_ATTEMPTS_MAX):
        files: list[MappedFile] = []
        try:
            for _base, path in cq.checked_files(key, directory):
                files.append(MappedFile.open_read_only(path))
            return files
        except FileNotFoundError:
            for file in files:
                file.close()
        except ConsumeQueueMismatch as mismatch:
            for file in files:
                file.close()
            raise ConsumeQueueMismatch(f"{mismatch}; {rebuild_advice(root)}") from None
        except BaseException:
            for file in files:
                file.close()
            raise
    raise CorruptStore(f"the files of consume queue {key} kept vanishing while the store "
                       f"was opened ({LISTING_ATTEMPTS_MAX} listings); try again")
