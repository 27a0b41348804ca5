"""The store's file set: which segment and consume-queue files are mapped, and the log
core that holds their buffers (pebble's ``commitEnv``: what the helpers may touch).

A ``Store`` owns one ``FileSet``; the helper modules (recovery, snapshot, retention,
queries, maintenance) are handed the file set, or less, never the whole store. The file
set keeps three things in step, always together:

* the mapped segments (``MappedFile`` by base position), attached to the core in
  ascending, contiguous order, and detached from the core *before* they are unmapped
  (the core holds an export of each buffer: unmapping first would fail);
* each queue's mapped consume-queue files (ascending by base offset), likewise attached
  to the core, and how far each queue's entries were last synced (``queue_flushed``);
* the epochs last saved (so a checkpoint rewrites the epochs file only on change).

It creates segment files only through the store's allocator and queue files only when
the core asks (the store's callbacks call ``add_queue_file``); it deletes what recovery,
retention or a truncation dropped. Every method that changes the set runs where the
store says (open, under the core's write lock, or with the flusher paused); the file
set itself takes no lock.

Nothing outside ``engine/store.py`` and this module touches the store's segments or
its core (tests/test_fileset.py greps for it).
"""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mqlog import format as fmt
from mqlog.config import StoreConfig
from mqlog.engine import consumequeue as cq
from mqlog.engine.files import MappedFile, file_name
from mqlog.errors import ConsumeQueueMismatch, MqlogError

if TYPE_CHECKING:
    from mqlog.engine.store import StorePaths

_DROP_GRANULE_BYTES = 1 << 20  # pages leave memory a MiB at a time


class FileSet:
    """The mapped files of one store and the core that holds them; see the docstring."""

    def __init__(self, paths: StorePaths, config: StoreConfig, core: Any) -> None:
        self.paths = paths
        self.config = config
        self.core = core  # the log core (mqlog.ext): reads, scans, attaches
        self._segments: dict[int, MappedFile] = {}
        self._queue_files: dict[tuple[str, int], list[MappedFile]] = {}
        self.queue_flushed: dict[tuple[str, int], int] = {}
        self.epochs_saved: list[tuple[int, int]] = []
        self._dropped: dict[int, int] = {}  # segment base -> its bytes dropped from memory

    # --- segments ------------------------------------------------------------------------

    def segment_bases(self) -> list[int]:
        return list(self.core.segment_bases())

    def first_segment_base(self) -> int:
        bases = self.core.segment_bases()
        return bases[0] if bases else 0

    def segment_file(self, base: int) -> MappedFile:
        return self._segments[base]

    def last_segment_file(self) -> MappedFile | None:
        bases = self.core.segment_bases()
        return self._segments[bases[-1]] if bases else None

    def segments(self) -> list[tuple[int, int]]:
        """(base, size in bytes) of every segment, ascending."""
        return [(base, self._segments[base].size) for base in self.core.segment_bases()]

    def files_end(self) -> int:
        """Where the last segment file ends (0 without one)."""
        bases = self.core.segment_bases()
        return bases[-1] + self._segments[bases[-1]].size if bases else 0

    def attach_segment(self, base: int, mapped: MappedFile) -> None:
        """Add the next segment of the log (contiguous with the last one)."""
        self._segments[base] = mapped
        self.core.attach_segment(base, mapped.buffer)

    def drop_segments_from(self, position: int) -> list[int]:
        """Detach and delete every segment that starts at or after ``position``."""
        dropped = self.core.detach_segments_from(position)
        for base in dropped:
            self._segments.pop(base).remove()
        return dropped

    def close_segments_from(self, position: int) -> None:
        """Detach and unmap (not delete) the segments from ``position`` on (snapshots)."""
        for base in self.core.detach_segments_from(position):
            self._segments.pop(base).close()

    def forget_segment(self, base: int) -> MappedFile:
        """Take a segment the core already let go (retention, truncation) out of the set."""
        return self._segments.pop(base)

    def sync_segments(self, start: int, end: int) -> None:
        """msync the log's bytes in [start, end)."""
        for base, mapped in list(self._segments.items()):
            if base < end and start < base + mapped.size:
                mapped.sync(max(start, base) - base, min(end, base + mapped.size) - base)

    def drop_cached_below(self, position: int) -> None:
        """Drop the log's pages below ``position`` (synced) from memory, each once: whole
        segments, and whole MiB of the one ``position`` is in
        (StoreConfig.page_cache_window_bytes). Advisory: a failure (no free
        descriptor) leaves the pages cached and is tried again next time."""
        live = dict(self._segments)
        self._dropped = {base: done for base, done in self._dropped.items() if base in live}
        for base, mapped in live.items():
            end = position - base
            end = mapped.size if end >= mapped.size else end - end % _DROP_GRANULE_BYTES
            done = self._dropped.get(base, 0)
            if end > done:
                try:
                    mapped.drop_cached(done, end)
                except (MqlogError, OSError):
                    return
            self._dropped[base] = max(0, end)  # (moves back after a truncation)

    # --- consume queues --------------------------------------------------------------------

    def has_queue(self, key: tuple[str, int]) -> bool:
        return key in self._queue_files

    def last_queue_file(self, key: tuple[str, int]) -> MappedFile:
        return self._queue_files[key][-1]

    def queue_entry(self, key: tuple[str, int], offset: int) -> tuple[int, int]:
        """(position, size) of the entry of ``offset`` in a mapped queue's files."""
        for mapped in self._queue_files[key]:
            base = int(mapped.path.name)
            if base <= offset < base + mapped.size // cq.ENTRY_SIZE:
                return cq.entry(mapped, offset - base)
        raise KeyError(offset)

    def attach_queue(self, key: tuple[str, int], files: list[MappedFile], min_offset: int,
                     next_offset: int, per_file: int) -> None:
        """Add a queue whose files (contiguous, ascending) hold [min, next) offsets."""
        self.core.add_queue(key[0], key[1], min_offset, next_offset, per_file)
        for mapped in files:
            self.core.attach_queue_file(key[0], key[1], int(mapped.path.name), mapped.buffer)
        self._queue_files[key] = files
        self.queue_flushed[key] = next_offset

    def add_queue_file(self, key: tuple[str, int], base_offset: int, mapped: MappedFile,
                       first: int | None) -> None:
        """Attach a new last file of a queue (the core asked for it); ``first`` is a new
        queue's first offset (None: the queue exists)."""
        if first is not None:
            self.core.add_queue(key[0], key[1], first, first,
                                self.config.consume_queue_entries_per_file)
            self._queue_files[key] = []
            self.queue_flushed[key] = first
        self._queue_files[key].append(mapped)
        self.core.attach_queue_file(key[0], key[1], base_offset, mapped.buffer)

    def forget_queue_file(self, topic: str, queue_id: int, base_offset: int) -> MappedFile:
        """Take a queue file the core already let go out of the set."""
        files = self._queue_files[(topic, queue_id)]
        victim = next(f for f in files if f.path.name == file_name(base_offset))
        files.remove(victim)
        return victim

    def open_queues(self, scan_from: int, manifest: dict, exact: bool) -> None:
        """Map every consume queue, keeping only entries of records before ``scan_from``.

        Raises ConsumeQueueMismatch when the files disagree with the queue manifest (a
        queue or a file is missing; with ``exact``, after a clean close, a queue ends
        early): recovery then rebuilds every queue from the commit log.
        """
        found = set()
        for key, queue_dir in cq.queue_directories(self.paths.consumequeue):
            found.add(key)
            self._open_queue(key, queue_dir, scan_from, manifest.get(key), exact)
        missing = sorted(set(manifest) - found)
        if missing:
            raise ConsumeQueueMismatch(f"consume queue {missing[0]} is missing")

    def _open_queue(self, key: tuple[str, int], directory: Path, scan_from: int,
                    expected: tuple[int, int] | None, exact: bool) -> None:
        files: list[MappedFile] = []
        try:
            for _, path in cq.checked_files(key, directory):
                files.append(MappedFile.open(path))
            check = self.entry_check(key)
            kept = cq.trim_files(files, scan_from, check)
            log_start = self.first_segment_base()
            while len(kept) > 1 and cq.first_live_entry(kept[1], log_start) > 0:
                kept.pop(0).remove()  # retention was cut short: only older entries here
            if not kept:
                return
            per_file = kept[0].size // cq.ENTRY_SIZE or self.config.consume_queue_entries_per_file
            bases = [int(mapped.path.name) for mapped in kept]
            if bases != list(range(bases[0], bases[0] + per_file * len(bases), per_file)):
                raise ConsumeQueueMismatch(f"consume queue {key} has a gap between its files")
            next_offset = bases[-1] + cq.entries_held(kept[-1], scan_from, check)
            min_offset = bases[0] + cq.first_live_entry(kept[0], log_start)
            if expected is not None and (min_offset > expected[0] or
                                         exact and next_offset != expected[1]):
                raise ConsumeQueueMismatch(
                    f"consume queue {key} holds [{min_offset}, {next_offset}), the manifest "
                    f"says [{expected[0]}, {expected[1]})")
        except BaseException:
            for mapped in files:
                mapped.close()
            raise
        self.attach_queue(key, kept, min_offset, next_offset, per_file)

    def entry_check(self, queue: tuple[str, int]) -> cq.EntryCheck:
        """How an open checks that the log holds the record a queue's entry names (see
        cq.entries_held). False where it holds another intact record (a torn entry names
        an older record, or position 0) or where the entry's span does not end at a
        record's start. None where the log cannot tell: below its start (retention
        deleted the record), or a damaged record whose span ends where a record starts
        (a bit flip in a checkpointed record: the entry holds, and reads refuse the
        record; counted torn, it made the open refuse the store)."""
        bases = self.segment_bases()

        def check(offset: int, position: int, size: int) -> bool | None:
            if not bases or position < bases[0]:
                return None
            base = bases[bisect.bisect_right(bases, position) - 1]
            buffer = self._segments[base].buffer
            if cq.names_record(buffer, position - base, position, size, queue, offset):
                return True
            if fmt.intact_header(buffer, base, position - base) is not None:
                return False
            return None if self._record_starts(bases, position + size) else False
        return check

    def _record_starts(self, bases: list[int], position: int) -> bool:
        """Whether an intact record, a blank record, a segment or the log's unwritten end
        (zeros) starts at ``position``."""
        base = bases[bisect.bisect_right(bases, position) - 1]
        buffer = self._segments[base].buffer
        at = position - base
        return at == len(buffer) or position in self._segments or \
            fmt.step_at(buffer, base, at) is not None

    def drop_all_queues(self) -> None:
        """Delete every consume queue (recovery rebuilds them from the log)."""
        self.core.drop_queues()  # first: the core must let go of the mappings
        for files in self._queue_files.values():
            for mapped in files:
                mapped.remove()
        self._queue_files.clear()
        self.queue_flushed.clear()
        cq.remove_all(self.paths.consumequeue)

    def sync_all_queues(self) -> None:
        """msync every queue's entries added since its last sync."""
        per_file = self.config.consume_queue_entries_per_file
        for key, files in list(self._queue_files.items()):
            offsets = self.core.queue_offsets(*key)
            flushed = self.queue_flushed.get(key, 0)
            if offsets is None or offsets[1] <= flushed:
                continue
            for mapped in files:
                base = int(mapped.path.name)
                count = mapped.size // cq.ENTRY_SIZE or per_file
                low, high = max(flushed, base), min(offsets[1], base + count)
                if low < high:
                    mapped.sync((low - base) * cq.ENTRY_SIZE, (high - base) * cq.ENTRY_SIZE)
            self.queue_flushed[key] = offsets[1]

    def lower_queue_flushed(self) -> None:
        """After a truncation: no queue counts as synced past its new end."""
        for key, flushed in self.queue_flushed.items():
            offsets = self.core.queue_offsets(*key)
            self.queue_flushed[key] = min(flushed, offsets[1] if offsets else 0)

    # --- epochs ----------------------------------------------------------------------------

    def restore_epochs(self, epochs: list[tuple[int, int]], scan_from: int) -> None:
        kept = [(epoch, start) for epoch, start in epochs if start < scan_from]
        self.core.epoch_starts = kept
        # The newest epoch the file knows, even one with no record yet (set_epoch saved
        # it): a node never goes back to an older epoch across a restart.
        self.core.epoch = max((epoch for epoch, _ in epochs), default=0)
        self.epochs_saved = list(kept)

    # --- closing ---------------------------------------------------------------------------

    def release(self) -> None:
        """Let the core go of every buffer, then unmap every file."""
        self.core.release()
        for mapped in self._segments.values():
            mapped.close()
        for files in self._queue_files.values():
            for mapped in files:
                mapped.close()
        self._segments.clear()
        self._queue_files.clear()
