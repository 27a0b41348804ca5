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
   are ignored. Entries of records that retention deleted are skipped.

The snapshot does not move: reopen to see newer records. A store whose consume-queue
files disagree with each other (a gap) needs a read-write open to recover first.
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
from mqlog.engine.recovery import RecoveryReport
from mqlog.errors import ConsumeQueueMismatch, CorruptStore

if TYPE_CHECKING:
    from mqlog.engine.store import Store


def open_snapshot(store: Store) -> RecoveryReport:
    """Map ``store``'s files read-only and find its end; see the module docstring."""
    started = time.perf_counter()
    paths, core = store.paths, store.core
    checkpoint = cp.read_checkpoint(paths.checkpoint)
    _map_segments(store)
    first = store.first_segment_base()
    clean = checkpoint is not None and not paths.abort.exists() and \
        _in_last_segment(store, checkpoint.log_end)
    if clean:
        assert checkpoint is not None
        report = RecoveryReport(clean=True, scanned_from=checkpoint.log_end,
                                end_position=checkpoint.log_end)
    else:
        scan_from = first
        if checkpoint is not None and first <= checkpoint.log_position:
            scan_from = checkpoint.log_position
        report = RecoveryReport(clean=False, scanned_from=scan_from)
        _find_end(store, report, scan_from)
    end = report.end_position
    for base in core.detach_segments_from(end + 1):
        store.segment_file(base).close()
        del store._segments[base]
    _map_queues(store, end)
    epochs = cp.read_epochs(paths.epochs) or []
    core.epoch_starts = [(epoch, start) for epoch, start in epochs if start < end]
    core.epoch = core.epoch_starts[-1][0] if core.epoch_starts else 0
    core.restore(end)
    core.committed_position = end
    report.duration_ms = (time.perf_counter() - started) * 1000
    return report


# How often a listing of segments or of a queue's files is taken again when a file in it
# vanished before it was mapped (retention deleting the oldest ones meanwhile).
LISTING_ATTEMPTS_MAX = 16


def _map_segments(store: Store) -> None:
    """Map the segment files, all or none of one listing: if one vanishes before it is
    mapped (retention deleted it, and every older one), the directory is listed again."""
    for _attempt in range(LISTING_ATTEMPTS_MAX):
        mapped = _map_listed_segments(store)
        if mapped is not None:
            for base, file in mapped:
                store._segments[base] = file
                store.core.attach_segment(base, file.buffer)
            return
    raise CorruptStore(f"the segments of {store.paths.root} kept vanishing while it was "
                       f"opened ({LISTING_ATTEMPTS_MAX} listings); try again")


def _map_listed_segments(store: Store) -> list[tuple[int, MappedFile]] | None:
    """The segments of one listing, mapped; None if one vanished first."""
    mapped: list[tuple[int, MappedFile]] = []
    try:
        for base, path in numbered_files(store.paths.commitlog):
            size = os.stat(path).st_size
            if size < PAGE_SIZE:  # (an empty file cannot even be mapped)
                raise CorruptStore(f"segment {path} is only {size} bytes; open the store "
                                   "read-write once to recover it")
            if mapped and base != mapped[-1][0] + mapped[-1][1].size:
                raise CorruptStore(
                    f"the segments of {store.paths.root} are not contiguous at {base} (the "
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


def _in_last_segment(store: Store, position: int) -> bool:
    bases = store.core.segment_bases()
    if not bases:
        return position == 0
    return bases[-1] <= position <= bases[-1] + store.segment_file(bases[-1]).size


def _find_end(store: Store, report: RecoveryReport, scan_from: int) -> None:
    """Scan (without indexing) from ``scan_from`` to the first record that fails."""
    end = scan_from
    for base in store.core.segment_bases():
        size = store.segment_file(base).size
        if base + size <= scan_from:
            continue
        start = max(scan_from, base) - base
        result = store.core.scan_segment(base, start, dispatch=False)
        report.records_scanned += result.record_count
        end = base + (size if result.stop_reason == "blank" else result.end_offset)
        report.scanned_bytes += end - base - start
        if result.stop_reason != "blank":
            if result.stop_reason != "end":
                report.truncated_at, report.truncation_reason = end, result.stop_reason
            break
    report.end_position = end


def _map_queues(store: Store, end: int) -> None:
    log_start = store.first_segment_base()
    for key, queue_dir in cq.queue_directories(store.paths.consumequeue):
        _map_queue(store, key, queue_dir, log_start, end)


def _map_queue(store: Store, key: tuple[str, int], directory: Path, log_start: int,
               end: int) -> None:
    files = _map_queue_files(key, directory)
    while len(files) > 1 and cq.entries_before(files[-1], end) == 0:
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
        raise CorruptStore(f"consume queue {key} has a gap between its files; open the "
                           "store read-write once to rebuild it")
    next_offset = bases[-1] + cq.entries_before(files[-1], end)
    min_offset = min(next_offset, bases[0] + cq.first_live_entry(files[0], log_start))
    store.core.add_queue(key[0], key[1], min_offset, next_offset, per_file)
    for base, mapped in zip(bases, files, strict=True):
        store.core.attach_queue_file(key[0], key[1], base, mapped.buffer)
    store._queue_files[key] = files


def _map_queue_files(key: tuple[str, int], directory: Path) -> list[MappedFile]:
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
            raise CorruptStore(f"{mismatch}; open the store read-write once to rebuild "
                               "it") from None
        except BaseException:
            for file in files:
                file.close()
            raise
    raise CorruptStore(f"the files of consume queue {key} kept vanishing while the store "
                       f"was opened ({LISTING_ATTEMPTS_MAX} listings); try again")
