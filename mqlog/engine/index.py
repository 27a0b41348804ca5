"""The key index: find a queue's records by key without scanning the log.

RocketMQ's IndexFile, improved. Each index file (``index/<20-digit first position>``)
is one hash table: a slot per hash bucket holds the number of the newest entry in that
bucket, and each entry (key hash, position, store timestamp, previous entry) links to
the one before it, so a lookup walks one chain, newest first. The bytes are in
docs/FORMAT.md ("Key index"). What RocketMQ does not do and this does:

* the hash is 64-bit (RocketMQ keeps 32 bits) of ``topic \\0 key``, and a lookup reads
  every candidate record and compares topic and key exactly: collisions never reach
  the caller (``index_key_hash_bits`` shrinks the hash to force them in tests);
* every entry carries the full store timestamp, and each file its time range, so a
  query bounded in time skips whole files and stops a chain early (store timestamps
  never decrease, so a chain's timestamps only fall);
* every entry carries a CRC32C, and a sealed file a CRC32C of its slots: a flipped bit
  anywhere in an entry (a hash's high bits included, which would keep it in its bucket)
  or a slot is seen, never a silently missed record;
* the index is derived data and is never trusted after a crash: the last file is
  rebuilt from the commit log, and a damaged file (or one of another format version)
  is rebuilt, not read.

Theory of operation. The write path does not touch the index: like RocketMQ's
ReputMessageService, an indexer follows the committed position behind the writers —
the maintenance thread every ``index_interval_ms``, and every query first, so a query
sees every record committed before it began. Indexing runs in the log core (C), a
bounded batch of records per call so the GIL is never held for long; the core also
notes where the last keyed record it wrote ends, and a stretch of log after that is
skipped unread (a store used without keys pays nothing for the index). Records that
recovery or ``append_raw`` index in the core count too; so does everything present at open
that the index files do not cover and the recovery scan did not read, and everything a
dropped index file covered (a truncation, a rebuild). A file that fills
up is sealed (msync'd, then its header gets its CRC and is msync'd) and the next one
starts where it stopped. On close the last file is sealed the same way; on open a file
is trusted only if its header's CRC holds and it agrees with its neighbours and the
log. Retention deletes files whose records are all gone; a truncation (replication)
rebuilds the file that held the cut.

Locking: ``lock`` serialises the indexer, lookups, retention and truncation; the
engine takes it inside the flusher's pause, never the other way round.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from crc32c import crc32c

from mqlog.config import RECORD_HEADER_SIZE, StoreConfig
from mqlog.engine.files import (
    MappedFile,
    file_name,
    make_directory,
    numbered_files,
    room_bytes,
)
from mqlog.errors import DiskFull
from mqlog.format import (
    INDEX_CRC_AT,
    INDEX_END_POSITION_AT,
    INDEX_ENTRY_SIZE,
    INDEX_HEADER,
    INDEX_HEADER_SIZE,
    INDEX_MAGIC,
    INDEX_SLOT,
    INDEX_SLOT_SIZE,
    INDEX_SLOTS_CRC_AT,
)

_END_POSITION = struct.Struct("<Q")
CHAIN_BATCH = 64  # positions one core call hands back (a query usually wants fewer)
_TIME_MIN, _TIME_MAX = -(1 << 63), (1 << 63) - 1


class IndexFile:
    """One mapped index file and its header fields."""

    def __init__(self, mapped: MappedFile) -> None:
        self.mapped = mapped
        (self.magic, self.hash_bits, self.slot_count, self.entry_count_max, self.entry_count,
         self.damaged_count, self.first_position, self.end_position, self.min_timestamp,
         self.max_timestamp, self.slots_crc, self.crc) = INDEX_HEADER.unpack_from(mapped.buffer)

    def reload(self) -> None:
        self.__init__(self.mapped)  # type: ignore[misc]

    @property
    def full(self) -> bool:
        return self.entry_count >= self.entry_count_max

    @property
    def entries_at(self) -> int:
        return INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * self.slot_count

    @property
    def sealed_crc(self) -> int:
        """The header's CRC as sealing writes it (over bytes [0, 60), the slots' CRC
        included)."""
        with memoryview(self.mapped.buffer) as view:
            return crc32c(view[:INDEX_CRC_AT])

    @property
    def computed_slots_crc(self) -> int:
        with memoryview(self.mapped.buffer) as view:
            return crc32c(view[INDEX_HEADER_SIZE:self.entries_at])

    def seal(self) -> None:
        """Make the slots and entries durable, then the header that vouches for them."""
        self.mapped.sync(INDEX_HEADER_SIZE, self.mapped.size)
        INDEX_SLOT.pack_into(self.mapped.buffer, INDEX_SLOTS_CRC_AT, self.computed_slots_crc)
        INDEX_SLOT.pack_into(self.mapped.buffer, INDEX_CRC_AT, self.sealed_crc)
        self.mapped.sync(0, INDEX_HEADER_SIZE)
        self.reload()

    def skip_to(self, position: int) -> None:
        """Move the end past records known to hold no key (the log core's hint)."""
        _END_POSITION.pack_into(self.mapped.buffer, INDEX_END_POSITION_AT, position)
        self.end_position = position

    def chain(self, module: ModuleType, value: int, begin: int,
              end: int) -> Iterator[int]:
        """Positions of the entries with hash ``value`` stored in [begin, end], newest
        first, walked by the log core (``index_chain``) ``CHAIN_BATCH`` at a time.

        A chain is trusted only as far as it holds together: every entry's CRC32C holds
        and every link points to an earlier entry (so a walk ends after at most
        ``entry_count`` steps, never spins), in the same bucket, at an earlier position
        inside this file's range, no newer than the entry before it. Anything else raises
        IndexDamaged (the file is rebuilt): flipped bits never make a lookup hang or
        silently miss a record. (No buffer is held across a yield: close() must unmap.)"""
        resume = None
        while True:
            found, resume, problem = module.index_chain(self.mapped.buffer, value, begin,
                                                        end, resume, CHAIN_BATCH)
            yield from found
            if problem:
                raise IndexDamaged(self, problem)
            if resume is None:
                return


class IndexDamaged(Exception):
    """An index file whose entries do not hold together (or name no record): the key
    index rebuilds it from the log (``KeyIndex.rebuild_from``); never seen by callers."""

    def __init__(self, index: IndexFile, reason: str) -> None:
        super().__init__(f"index file {index.mapped.path} is damaged: {reason}")
        self.first_position = index.first_position


class KeyIndex:
    """The index files of one store; see the module docstring."""

    def __init__(self, directory: Path, core: Any, core_module: ModuleType,
                 config: StoreConfig) -> None:
        self.directory = directory
        self.lock = threading.Lock()
        self._core = core
        self._module = core_module
        self._config = config
        self._files: list[IndexFile] = []
        self._rebuilt = 0

    # --- opening ---------------------------------------------------------------------

    def open(self, log_start: int, log_end: int, crashed: bool) -> None:
        """Map the files worth keeping; what is lost is re-indexed by ``catch_up``."""
        make_directory(self.directory)
        for leftover in self.directory.glob("*.tmp"):
            leftover.unlink()
        found = numbered_files(self.directory)
        for first, path in found:
            if path.stat().st_size < INDEX_HEADER_SIZE:
                break  # cut short (an empty file cannot even be mapped): rebuilt
            mapped = MappedFile.open(path)
            index = IndexFile(mapped)
            if not self._trustworthy(index, first, log_end):
                mapped.close()
                break  # this file and every later one go
            self._files.append(index)
        kept = {index.first_position for index in self._files}
        for first, path in found:
            if first not in kept:
                path.unlink()
        if crashed and self._files:
            self._files.pop().mapped.remove()  # its header was never vouched for
        self.trim_front(log_start)

    def _trustworthy(self, index: IndexFile, first: int, log_end: int) -> bool:
        """A sealed file of this version whose header and slots verify and that agrees
        with its neighbour and the log (another version, e.g. 1 without entry CRCs, is
        rebuilt, never misread)."""
        expected_size = index.entries_at + INDEX_ENTRY_SIZE * index.entry_count_max
        previous = self._files[-1] if self._files else None
        return (index.mapped.size >= INDEX_HEADER_SIZE and index.magic == INDEX_MAGIC
                and index.crc == index.sealed_crc and index.mapped.size == expected_size
                and index.hash_bits == self._config.index_key_hash_bits
                and index.first_position == first and first <= index.end_position <= log_end
                and index.entry_count <= index.entry_count_max
                and (previous is None or (previous.full and
                                          previous.end_position == first))
                and index.slots_crc == index.computed_slots_crc)

    # --- indexing --------------------------------------------------------------------

    def catch_up(self) -> None:
        """Index every record up to the committed position (call with ``lock`` held)."""
        target = self._core.committed_position
        batch = self._config.index_batch_count_max
        while True:
            current = self._current(target)
            if current is None or current.end_position >= target:
                return
            if current.end_position >= self._core.last_keyed_end:
                current.skip_to(target)  # no keyed record since: nothing to read
                return
            self._back_entries(current, target, batch)
            self._core.index_keys(current.mapped.buffer, target, batch)
            current.reload()
            if current.full:  # (filled at the target too: nothing more ever goes in)
                current.seal()  # the next call starts a new file where this one stopped

    def _back_entries(self, index: IndexFile, target: int, batch: int) -> None:
        """Back the entries the next ``index_keys`` call may write with blocks first (a
        write into a hole of a full disk is a SIGBUS): DiskFull if they cannot be."""
        entries_at = index.entries_at
        if index.mapped.prepared is None:  # opened: it holds data up to its last entry
            index.mapped.mark_held(entries_at + INDEX_ENTRY_SIZE * index.entry_count)
        records_max = (target - index.end_position) // (RECORD_HEADER_SIZE + 1) + 1
        count = min(batch, records_max, index.entry_count_max - index.entry_count)
        step = self._config.index_allocate_step_bytes
        end = entries_at + INDEX_ENTRY_SIZE * (index.entry_count + count)
        backed = index.mapped.prepared or 0
        if end > backed:
            want = -(-end // step) * step
            if not self._leaves_headroom(want - backed):
                want = end  # a nearly full disk: no step more than these entries need
            self._check_headroom(want - backed)
            index.mapped.prepare_to(want)

    def _leaves_headroom(self, amount: int) -> bool:
        try:
            return room_bytes(self.directory) - amount >= self._config.disk_headroom_bytes
        except OSError:
            return True  # cannot tell: backing says DiskFull itself if it must

    def _check_headroom(self, amount: int) -> None:
        """DiskFull rather than take the room a full disk keeps for writers and close():
        the index is derived data, rebuilt from the log once there is room again."""
        if not self._leaves_headroom(amount):
            raise DiskFull(
                f"the key index needs {amount} more bytes and the file system of "
                f"{self.directory} is nearly full (disk_headroom_bytes="
                f"{self._config.disk_headroom_bytes} stay free for writes); nothing stored "
                "was lost and reads still work; free space (or let retention delete old "
                "segments) and retry")

    def _current(self, target: int) -> IndexFile | None:
        """The file new entries go to, started if there is none or the last is full."""
        if self._files and not self._files[-1].full:
            return self._files[-1]
        if self._files:
            start = self._files[-1].end_position
        else:
            bases = self._core.segment_bases()
            start = bases[0] if bases else 0
        if start >= target:
            return None
        index = self._create(start)
        self._files.append(index)
        return index

    def _create(self, first_position: int) -> IndexFile:
        config = self._config
        slots, entries = config.index_slots_per_file, config.index_entries_per_file
        slots_end = INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * slots
        size = slots_end + INDEX_ENTRY_SIZE * entries
        self._check_headroom(slots_end)
        mapped = MappedFile.create(self.directory / file_name(first_position), size)
        try:  # the slots are written anywhere: back them all (entries: _back_entries)
            mapped.prepare_to(slots_end)
        except BaseException:
            mapped.remove()
            raise
        INDEX_HEADER.pack_into(mapped.buffer, 0, INDEX_MAGIC, config.index_key_hash_bits,
                               slots, entries, 0, 0, first_position, first_position,
                               _TIME_MAX, _TIME_MIN, 0, 0)
        return IndexFile(mapped)

    # --- lookups ---------------------------------------------------------------------

    def positions(self, topic: str, key: str, begin: int, end: int) -> Iterator[int]:
        """Positions of records that may have this key in [begin, end], newest first:
        the hash matches; the caller compares the records themselves. Raises
        IndexDamaged (see ``IndexFile.chain``): call ``rebuild_from`` and ask again."""
        value = self._module.key_hash(topic, key, self._config.index_key_hash_bits)
        for index in reversed(self._files):
            if index.entry_count == 0 or index.min_timestamp > end:
                continue
            if index.max_timestamp < begin:
                return  # older files hold only older records
            yield from index.chain(self._module, value, begin, end)

    # --- retention, truncation, closing ------------------------------------------------

    def trim_front(self, log_start: int) -> None:
        """Delete files whose every record lies before ``log_start`` (lock held)."""
        while self._files and self._files[0].end_position <= log_start:
            self._files.pop(0).mapped.remove()

    def truncate(self, position: int) -> None:
        """Forget every entry at or after ``position`` (lock held): files that start at
        or after it go, and the one that holds it is rebuilt by the next catch-up."""
        while self._files and self._files[-1].end_position > position:
            self._reread(self._files.pop())

    def _reread(self, dropped: IndexFile) -> None:
        """Remove a file whose records the indexer must read again: the core's keyed
        hint (where the last keyed record it noted ends) may know nothing of them."""
        self._core.last_keyed_end = max(self._core.last_keyed_end, dropped.end_position)
        dropped.mapped.remove()

    def damaged_at(self, position: int, reason: str) -> IndexDamaged:
        """IndexDamaged for the file whose entry names ``position``, which holds no
        record (``reason``)."""
        holder = next((index for index in reversed(self._files)
                       if index.first_position <= position), self._files[0])
        return IndexDamaged(holder, f"an entry names position {position}: {reason}")

    def rebuild_from(self, first_position: int) -> None:
        """Rebuild the file that starts at ``first_position`` and every later one from
        the log (lock held): a lookup found it damaged."""
        while self._files and self._files[-1].first_position >= first_position:
            self._reread(self._files.pop())
        self._rebuilt += 1
        self.catch_up()

    def close(self) -> None:
        """Seal the last file and unmap everything (lock held)."""
        if self._files and not self._files[-1].full:
            self._files[-1].seal()
        self.close_unsealed()

    def close_unsealed(self) -> None:
        """Unmap everything as it is (a failed open or flush: the next open rebuilds)."""
        for index in self._files:
            index.mapped.close()
        self._files.clear()

    @property
    def rebuilt_count(self) -> int:
        """Damaged index files rebuilt since open (IndexDamaged met by lookups)."""
        return self._rebuilt

    @property
    def file_count(self) -> int:
        return len(self._files)

    @property
    def end_position(self) -> int:
        return self._files[-1].end_position if self._files else 0

    @property
    def resumes_at(self) -> int:
        """Where indexing goes on from: every record before it is indexed."""
        if self._files:
            return self._files[-1].end_position
        bases = self._core.segment_bases()
        return bases[0] if bases else 0

    @property
    def damaged_count(self) -> int:
        """Damaged records the indexer met and skipped, in the files kept."""
        return sum(index.damaged_count for index in self._files)
