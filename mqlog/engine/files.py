"""Where a store's files live, and how they are created, mapped, backed and removed.

Layout of a store directory (docs/FORMAT.md has the bytes)::

    lock                      flock'd by the process that has the store open
    abort                     exists while the store is open; left behind by a crash
    checkpoint                where recovery may start scanning (CRC32C-protected)
    epochs                    first position of each epoch (Kafka's leader-epoch file)
    meta.json                 the store's format version
    commitlog/<20 digits>     segments, named by their start position
    consumequeue/<topic>/<queue id>/<20 digits>
                              consume-queue files, named by their first offset

A store costs what it holds (DESIGN §4, "Footprint"). Every mapped file is created
sparse at its full size, so the formats and recovery see the sizes they always did
(``ls`` shows a segment's 1 GiB, ``du`` what it holds), and is backed with blocks in
steps, ahead of whatever writes through its mapping:

* Nothing writes through a shared mapping into a hole. A write fault that needs a block
  on a full disk is a SIGBUS that kills the process; ``pwrite`` and ``fallocate``
  report ENOSPC instead, which becomes DiskFull (errors.py) and changes nothing. So the
  log core asks the engine (``prepare_segment``) before it writes past the backed part
  of a segment, and the consume-queue and key-index writers back their pages first too.
* Nothing reads a hole through a mapping either: on tmpfs a read fault allocates a page
  too (its page cache is its storage), so on a full tmpfs that read is a SIGBUS. The
  consume-queue searches of an open stop at the file's first hole (``data_end``): a
  hole reads as zeros, and an all-zero entry ends a queue's entries anyway.
* The unit is the page, not the byte: a write fault backs the whole page it lands in,
  so on a file system whose blocks are smaller than a page (ext4 makes 1 KiB blocks on
  a small disk) a write into the backed first block of a page whose other blocks are
  holes is a SIGBUS on a full disk too. So backing ends on a page boundary (or the
  file's end), and a writer that starts inside a page someone else backed part of (a
  consume queue's first page after tombstones or a cut) holds that page first. Records
  written with ``pwrite`` past what is backed (``write_records``: a replica's, which
  need no zeros ahead of them) are followed by zeros to the end of their last page in
  the same step, so ``prepared`` stays on a page boundary.
* A backing step that meets a full disk gives back what it took before it raises
  (DiskFull changes nothing, not even the free space), and the background backs ahead
  only while at least ``headroom`` bytes would stay free: the room a full disk gives
  back goes to writers and to ``close()``'s files, not to blocks ahead of anyone.
* A step is backed by writing zeros with ``pwrite``: that allocates the blocks and
  brings the pages into the page cache in one pass (~1-1.5 GB/s here), after which
  MADV_POPULATE_WRITE maps them (~5 GB/s) and the writer takes no page fault at all.
  A sync-flush store maps them with MADV_POPULATE_READ instead (write-protected): a sync
  write-protects every page mapped writable again, a TLB flush per page, and its
  batches are written with ``pwrite`` anyway (``write_records``, into backed blocks).
  ``posix_fallocate`` leaves unwritten extents whose first touch runs at ~0.5 GB/s, so
  it only backs what may already hold data (``mark_held``: it never changes a byte).
* A sync-flush store's segments get their zeros in 16 KiB writes, not 1 MiB ones: the
  page cache makes a folio as large as the write that creates it (ext4 since Linux
  6.16: 1 MiB for a 1 MiB write), and a folio is dirtied and written back whole. After
  an msync writes a folio back, the writer's next store into it faults (page_mkwrite)
  and dirties all of it again, so with 1 MiB folios every sync wrote the whole folio
  the log's end lies in: 1.3-1.5 MiB a durable batch of 173 KiB, ~1.2 MiB a sync of 10
  KiB (counted from the block device's sectors written). 16 KiB folios keep that to at
  most 16 KiB a sync. Not for async flush: each write is a Python call that needs the
  GIL back, and the background thread, waiting for it behind a writer's put loop, fell
  behind a fast writer (1.4x the put loop's wall time with 16 KiB writes); an interval
  flush rewriting one large folio costs nobody a wait.
* The SegmentAllocator (RocketMQ's AllocateMappedFileService, bounded): the writer
  backs what its write needs itself, under the core's write lock, if it is not backed
  yet: 64 KiB at a time (only the pages it needs when that would eat into the headroom),
  never the whole step. A step's fresh pages cost the first toucher ~3 ms of CPU per
  MiB on this VM, and a store's first durable put used to pay a whole step before its
  sync could start: the slowest acks of a new store's first group commit (issue 14,
  tenth session). The rest of the step is the background thread's, which keeps backing
  and warming ahead of the writer, as far as the writer goes
  in 100 ms at its current rate, at most twice what it wrote since the store opened and
  at most ``segment_prepare_ahead_bytes_max``. A store that holds four records costs one
  step, a durable writer (tens of MB/s) a step or two, and a fast sustained writer finds
  its pages ready.
  When the window passes a segment's end the next segment is created and its first
  step backed, in the background; a segment is created under a temporary name and
  renamed into place, so a crash never leaves a half-made one.
* Descriptors: a mapping keeps the one ``mmap`` duplicates; the file's own descriptor
  is closed right after mapping. Backing a step opens the file for that moment only,
  so a store holds one descriptor per mapped file (and a sync-flush store one more, on
  the segment its batches are written to with pwrite: ``write_records``), and running
  out of descriptors (EMFILE) is a TooManyOpenFiles that changes nothing, never a fenced
  store.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from mqlog import ext
from mqlog.config import BLANK_SIZE_MIN, PAGE_SIZE
from mqlog.errors import CorruptStore, DiskFull, MqlogError, TooManyOpenFiles
from mqlog.ext import libc

NAME_DIGITS = 20
_NAME = re.compile(r"\d{20}")  # (fullmatch: "$" would let a final newline in)
ZERO_WRITE_BYTES = 1 << 20  # zeros per pwrite, backing a file (the docstring says why)
SYNC_ZERO_WRITE_BYTES = 16 << 10  # the same for a sync-flush log's segments
# A read to be sent this large goes from its file (Store.read_for_send: sendfile)
FILE_EXTENT_BYTES_MIN = 64 << 10
_CHUNK_BYTES = 1 << 20  # the background thread backs this much per hold of a file's lock
# The writer backs itself only the pages its write needs, in pieces of this much; the
# rest of the step is the background thread's (a step's fresh pages cost ms of CPU here,
# and a durable first put waits for them)
_WRITER_BYTES = 64 << 10
_AHEAD_SECONDS = 0.1  # back what the writer would write in this long, up to the maximum
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT)
_NO_DESCRIPTOR = (errno.EMFILE, errno.ENFILE)


def file_name(number: int) -> str:
    return f"{number:0{NAME_DIGITS}d}"


def numbered_files(directory: Path) -> list[tuple[int, Path]]:
    """Files named by a 20-digit number, ascending; anything else is ignored."""
    if not directory.is_dir():
        return []
    found = [(int(entry.name), entry) for entry in directory.iterdir()
             if _NAME.fullmatch(entry.name) and entry.is_file()]
    return sorted(found)


class FileExtent:
    """Bytes of a file, held open to be sent from it (``os.sendfile``: a fetch answer's
    records go from the page cache to the socket, never copied through Python), then
    ``zeros`` zero bytes (a segment's closing blank: the rest of the segment may be a
    hole), with the CRC32C they had when the log checked them. The descriptor keeps the
    file readable if it is deleted meanwhile (retention); bytes changed in place since
    (a truncation's zeros) no longer match ``crc``, which the frame's CRC carries: the
    receiver refuses the frame. Closed by ``close()`` or when let go."""

    __slots__ = ("_fd", "offset", "file_size", "zeros", "crc")

    def __init__(self, path: Path, offset: int, file_size: int, zeros: int,
                 crc: int) -> None:
        self._fd = -1
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.offset, self.file_size, self.zeros, self.crc = offset, file_size, zeros, crc

    @property
    def size(self) -> int:
        return self.file_size + self.zeros

    def __len__(self) -> int:
        return self.size

    def fileno(self) -> int:
        return self._fd

    def read(self, start: int = 0) -> bytes:
        """The bytes from ``start`` (within the extent) on; zeros past the file's end (a
        frame keeps its size whatever the file did: its CRC tells the receiver)."""
        size = max(0, self.file_size - start)
        data = os.pread(self._fd, size, self.offset + start) if size else b""
        return data + bytes(self.size - start - len(data))

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __del__(self) -> None:
        self.close()


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def delete_store(directory: Path) -> None:
    """Delete a store directory so that no crash part way leaves a part of it under its
    name, where the next store of that name would open it: renamed aside (synced) first,
    then removed; what a crash left aside goes at the next delete of that name."""
    aside = directory.with_name(directory.name + ".deleting")
    shutil.rmtree(aside, ignore_errors=True)
    if not directory.exists():
        return
    os.replace(directory, aside)
    fsync_directory(directory.parent)
    shutil.rmtree(aside, ignore_errors=True)


def set_aside(directory: Path, aside: Path, name: str) -> Path:
    """Move ``directory`` into ``aside`` (made if missing) as ``name`` (NAME.1, NAME.2,
    ... if taken), synced; where it went."""
    aside.mkdir(exist_ok=True)
    target, number = aside / name, 0
    while target.exists():
        number += 1
        target = aside / f"{name}.{number}"
    os.replace(directory, target)
    fsync_directory(aside)
    fsync_directory(directory.parent)
    return target


def make_directory(path: Path, parents: bool = False) -> None:
    """``path`` as a directory of a store (made if missing; a full disk is DiskFull).
    A file where it or a parent should be is CorruptStore, naming it: not an OSError."""
    try:
        with typed_errors(f"cannot create {path}"):
            path.mkdir(parents=parents, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise CorruptStore(f"{path} must be a directory of the store, but it (or a "
                           "directory above it) is a file: move that file away and open "
                           "the store again") from None


def typed_os_error(error: OSError, what: str) -> Exception:
    """DiskFull or TooManyOpenFiles for the errors a full machine gives, else ``error``."""
    if error.errno in _NO_ROOM:
        typed: MqlogError = DiskFull(
            f"{what}: the file system is full ({error.strerror}). Nothing stored was lost "
            "and reads still work; free space (or let retention delete old segments) and "
            "retry the write")
    elif error.errno in _NO_DESCRIPTOR or (error.errno == errno.ENOMEM
                                          and "mmap" in str(error).lower()):
        typed = TooManyOpenFiles(
            f"{what}: {error.strerror}. The store stays usable; raise the limit on open "
            "files (ulimit -n) or on mappings (vm.max_map_count), or use fewer queues")
    else:
        return error
    typed.__cause__ = error
    return typed


@contextmanager
def typed_errors(what: str) -> Iterator[None]:
    """Turn ENOSPC/EDQUOT into DiskFull and EMFILE/ENFILE into TooManyOpenFiles."""
    try:
        yield
    except OSError as error:
        typed = typed_os_error(error, what)
        if typed is error:
            raise
        raise typed from error


def room_bytes(directory: Path) -> int:
    """Bytes still free for an unprivileged writer on ``directory``'s file system."""
    info = os.statvfs(directory)
    return info.f_bavail * info.f_frsize


def write_zeros(fd: int, start: int, end: int, piece: int = ZERO_WRITE_BYTES) -> None:
    """Write zeros over [start, end) with pwrite: allocates the blocks, or ENOSPC. At
    most ``piece`` bytes a write: the page cache's folios are that large (docstring)."""
    ext.core.write_zeros(fd, start, end, piece)  # (the C core's lets the GIL go once)


def _pwrite_all(fd: int, data: Any, offset: int) -> None:
    """pwrite all of ``data`` at ``offset`` (a write of nothing is a full disk). Every
    view of ``data`` taken here is released before it returns or raises: ``data`` may be
    a buffer the caller frees right after (the log core's), and a raised error's
    traceback keeps this frame's locals alive."""
    with memoryview(data) as whole:
        done = 0
        while done < len(whole):
            with whole[done:] as rest:
                written = os.pwrite(fd, rest, offset + done)
            if written <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            done += written


def _data_ranges(fd: int, start: int, end: int) -> Iterator[tuple[int, int]]:
    """The ranges of [start, end) that hold blocks (SEEK_DATA/SEEK_HOLE); all of it where
    the file system cannot tell."""
    while start < end:
        try:
            data = os.lseek(fd, start, os.SEEK_DATA)
        except OSError as error:
            if error.errno == errno.ENXIO:
                return  # no data past start
            if error.errno != errno.EINVAL:
                raise
            yield start, end  # no SEEK_DATA here: treat it all as data
            return
        if data >= end:
            return
        hole = min(os.lseek(fd, data, os.SEEK_HOLE), end)
        yield data, hole
        start = hole


class MappedFile:
    """One file mapped shared (writable unless read-only), and how much of it is backed.

    ``prepared``: bytes below it have blocks behind them and may be written through the
    mapping. A file created here starts at 0; an opened file's is None (unknown) until
    ``mark_held`` says how much of it holds data.
    """

    __slots__ = ("path", "buffer", "mapping", "size", "prepared", "_closing", "_lock",
                 "_write_fd")

    def __init__(self, path: Path, fd: int, size: int, writable: bool = True,
                 prepared: int | None = None) -> None:
        self.path = path
        self.size = size
        with typed_errors(f"cannot map {path}"):
            self.buffer = mmap.mmap(fd, size, flags=mmap.MAP_SHARED,
                                    prot=mmap.PROT_READ | (mmap.PROT_WRITE if writable
                                                           else 0))
        self.mapping = libc.Mapping(self.buffer)
        self.prepared = prepared
        self._closing = False
        self._lock = threading.Lock()  # close() must not unmap mid-warm; backs in order
        self._write_fd = -1  # write_records' descriptor, opened at its first call

    @classmethod
    def create(cls, path: Path, size: int) -> MappedFile:
        """Create a sparse, zero-filled file of ``size`` bytes; an existing one is an error.

        It is built under ``<name>.tmp`` and renamed, so it appears whole or not at all.
        Nothing is backed yet: see ``prepare_to`` and ``write_at``.
        """
        temporary = path.with_name(path.name + ".tmp")
        with typed_errors(f"cannot create {path}"):
            fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.ftruncate(fd, size)
                mapped = cls(path, fd, size, prepared=0)
            except BaseException:
                temporary.unlink(missing_ok=True)
                raise
            finally:
                os.close(fd)  # the mapping holds its own duplicate
            try:
                if path.exists():
                    raise FileExistsError(f"{path} already exists")
                os.rename(temporary, path)
            except BaseException:
                mapped.close()
                temporary.unlink(missing_ok=True)
                raise
        return mapped

    @classmethod
    def open(cls, path: Path) -> MappedFile:
        with typed_errors(f"cannot open {path}"):
            fd = os.open(path, os.O_RDWR)
            try:
                return cls(path, fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)

    @classmethod
    def open_read_only(cls, path: Path) -> MappedFile:
        """Map an existing file for reading only (a read-only store, another process's)."""
        with typed_errors(f"cannot open {path}"):
            fd = os.open(path, os.O_RDONLY)
            try:
                return cls(path, fd, os.fstat(fd).st_size, writable=False)
            finally:
                os.close(fd)

    def sync(self, start: int, end: int) -> None:
        self.mapping.msync(start, end)

    def mark_held(self, end: int) -> None:
        """Say that the first ``end`` bytes may hold data, and make sure no hole remains
        below it (fallocate, which never changes a byte); the rest is backed on demand."""
        end = min(_round_up(end, PAGE_SIZE), self.size)  # whole pages: see the docstring
        with self._lock:
            self._hold(0, end)
            self.prepared = end

    def hold(self, start: int, end: int) -> None:
        """Make sure no hole remains in [start, end) (fallocate: never changes a byte)."""
        with self._lock:
            self._hold(start, min(end, self.size))

    def _hold(self, start: int, end: int) -> None:
        if end <= start:
            return
        with typed_errors(f"cannot allocate [{start}, {end}) of {self.path}"):
            fd = os.open(self.path, os.O_RDWR)
            try:
                os.posix_fallocate(fd, start, end - start)
            finally:
                os.close(fd)

    def prepare_to(self, end: int, warm: int = 0, piece: int = ZERO_WRITE_BYTES) -> int:
        """Back [prepared, end) with blocks by writing zeros over it (nothing below
        ``prepared`` is touched; ``end`` goes up to a page boundary), ``piece`` bytes a
        write, then map its pages in with the madvise advice ``warm`` (MADV_POPULATE_WRITE
        or _READ; 0: not); return how far the file is backed. DiskFull or
        TooManyOpenFiles if it cannot be, with the room it took given back."""
        end = min(_round_up(end, PAGE_SIZE), self.size)
        with self._lock:
            start = self.prepared
            assert start is not None, f"{self.path}: mark_held first (an opened file)"
            if self._closing or end <= start:
                return start
            self._back(start, end, piece)
            self.prepared = end
            if warm:
                try:
                    self.mapping.madvise(start, end, warm)
                except OSError:
                    pass  # an older kernel: the writer faults the cached pages in
            return end

    def back(self, start: int, end: int) -> None:
        """Write zeros over [start, end), which nobody uses yet (a consume queue's next
        entries): blocks behind them, or DiskFull with the room it took given back."""
        with self._lock:
            self._back(start, min(end, self.size))

    def _back(self, start: int, end: int, piece: int = ZERO_WRITE_BYTES) -> None:
        with typed_errors(f"cannot allocate [{start}, {end}) of {self.path}"):
            fd = os.open(self.path, os.O_RDWR)
            try:
                try:
                    write_zeros(fd, start, end, piece)
                except OSError as error:
                    if error.errno in _NO_ROOM:  # a part may be backed: give it back
                        with suppress(OSError):
                            libc.punch_hole(fd, start, end - start)
                    raise
            finally:
                os.close(fd)

    def drop_cached(self, start: int, end: int) -> None:
        """Drop [start, end)'s pages from this mapping and from the page cache: the
        file keeps them, the next read faults them in again. Only clean pages leave the
        cache (a dirty one stays until it is written back), so call it on synced bytes."""
        with self._lock:  # (close() waits: never madvise a released mapping)
            if self._closing or end <= start:
                return
            self.mapping.madvise(start, end, libc.MADV_DONTNEED)
            with typed_errors(f"cannot open {self.path}"):
                fd = os.open(self.path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)

    def write_at(self, offset: int, data: bytes) -> None:
        """Write ``data`` at ``offset`` with pwrite (allocating its blocks, or DiskFull)."""
        with typed_errors(f"cannot write to {self.path}"):
            fd = os.open(self.path, os.O_WRONLY)
            try:
                _pwrite_all(fd, data, offset)
            finally:
                os.close(fd)

    def write_records(self, offset: int, data: Any) -> None:
        """Write ``data`` at ``offset`` with pwrite, through a descriptor kept for it until
        ``end_writes`` or ``close`` (the log core's ``write_segment``: only the last
        segment is written to, so a store holds one more descriptor). Past ``prepared``
        the write allocates the blocks itself (a replica's records: no zeros are written
        ahead of them), then zeros to the end of the page it ends in (the page is the
        unit: the core zeroes a cut tail, and writes its next records, through the
        mapping), and ``prepared`` moves to that page's end. A write that fails leaves
        nothing: the backed part of its range zeroed, the rest a hole again (DiskFull
        gives back what it took); the caller is told nothing was stored, and a recovery
        must not find whole records there."""
        end = offset + len(data)
        page_end = min(_round_up(end, PAGE_SIZE), self.size)
        with self._lock, typed_errors(f"cannot write to {self.path}"):
            if self._write_fd < 0:
                self._write_fd = os.open(self.path, os.O_WRONLY)
            backed = min(max(self.prepared or 0, offset), page_end)
            try:
                _pwrite_all(self._write_fd, data, offset)
                if page_end > max(backed, end):  # the rest of the page it ends in
                    write_zeros(self._write_fd, end, page_end)
            except OSError:
                with suppress(OSError):  # first, the write's first record header: a walk
                    # stops there whatever the rest keeps. Its block is allocated (the
                    # write put bytes there, or none), so this takes no room; the zeroing
                    # below may (a punched hole that splits an extent needs a block),
                    # and on a full disk it failed, leaving whole records a recovery
                    # found: a refused write, stored after a crash.
                    os.pwrite(self._write_fd, bytes(BLANK_SIZE_MIN), offset)
                with suppress(OSError):
                    write_zeros(self._write_fd, offset, backed)
                    if page_end > backed and not libc.punch_hole(self._write_fd, backed,
                                                                 page_end - backed):
                        write_zeros(self._write_fd, backed, page_end)
                raise
            if self.prepared is not None and page_end > self.prepared:
                self.prepared = page_end

    def zero_from(self, offset: int, preallocate: bool = False) -> None:
        """Zero [offset, size): punch a hole (no page is touched), or write zeros.
        What is past ``offset`` is backed again when a writer comes near it."""
        del preallocate  # (blocks are backed in steps ahead of the writer now)
        with self._lock, typed_errors(f"cannot zero the tail of {self.path}"):
            fd = os.open(self.path, os.O_RDWR)
            try:
                if not libc.punch_hole(fd, offset, self.size - offset):
                    write_zeros(fd, offset, self.size)
            finally:
                os.close(fd)
            if self.prepared is not None:
                self.prepared = min(self.prepared, offset)

    def data_end(self) -> int:
        """Where the data from the file's start ends: its first hole (its size where the
        file system cannot tell). Searches through the mapping stop there (see the module
        docstring: a read of a hole of a full tmpfs is a SIGBUS)."""
        with typed_errors(f"cannot open {self.path}"):
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:  # gone since it was mapped (retention beside a
                return self.size       # read-only snapshot): its mapping still reads
            try:
                start, end = next(_data_ranges(fd, 0, self.size), (0, 0))
            finally:
                os.close(fd)
        return end if start == 0 else 0

    def clear_from(self, offset: int) -> None:
        """Zero [offset, size) keeping its blocks: zeros are written over the ranges that
        hold blocks (holes read as zeros already). Much cheaper than ``zero_from``'s hole
        for a file about to be written again (recovery's consume queues): a punched hole
        frees blocks (and, on a file system mounted with discard, trims them) only for the
        rewrite to allocate them anew."""
        with self._lock, typed_errors(f"cannot zero the tail of {self.path}"):
            fd = os.open(self.path, os.O_RDWR)
            try:
                for start, end in _data_ranges(fd, offset, self.size):
                    write_zeros(fd, start, end)
            finally:
                os.close(fd)

    def end_writes(self) -> None:
        """Close write_records' descriptor (the log moved on to the next segment)."""
        if self._write_fd >= 0:  # (writes end first: they run under the core's lock)
            os.close(self._write_fd)
            self._write_fd = -1

    def close(self) -> None:
        with self._lock:  # waits for at most one backing step
            self._closing = True
        self.end_writes()
        self.mapping.release()
        self.buffer.close()

    def remove(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


class SegmentAllocator:
    """Creates segments and backs them ahead of the writer; see the module docstring."""

    def __init__(self, directory: Path, size: int, *, step_bytes: int,
                 ahead_bytes_max: int, warm: int, next_ahead: bool,
                 headroom_bytes: int = 0, zero_write_bytes: int = ZERO_WRITE_BYTES) -> None:
        self._directory = directory
        self._piece = zero_write_bytes  # SYNC_ZERO_WRITE_BYTES for a sync-flush log
        self._headroom = headroom_bytes
        self._size = size
        self._step = step_bytes
        self._ahead_max = ahead_bytes_max
        self._warm = warm  # the madvise advice that maps backed pages in (0: none)
        self._next_ahead = next_ahead
        self._lock = threading.Lock()
        self._pending: dict[int, Future[MappedFile]] = {}
        self._job: tuple[MappedFile, int] | None = None  # the background thread's target
        self._generation = 0  # moved by discard(): the job in hand is dropped
        self._running = False
        self._closed = False
        self._start = 0  # the written position at open: how far the writer went since
        self._last = (0, 0.0)  # (end, time) of the last ensure: the writer's rate
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mqlog-alloc")
        # The executor starts its thread at the first submit, and Thread.start waits until
        # the new thread runs (ms on a busy machine): here, not in the first put's ensure.
        self._executor.submit(int)

    def start(self, position: int) -> None:
        """The writer resumes at ``position`` (open, reset)."""
        self._start = position

    def take(self, base: int) -> MappedFile:
        """The segment starting at ``base``: made ahead if it was, else made now."""
        with self._lock:
            pending = self._pending.pop(base, None)
        if pending is not None:
            try:
                return pending.result()
            except (MqlogError, OSError):
                pass  # made ahead and failed: try again now, and raise what happens
        return MappedFile.create(self._directory / file_name(base), self._size)

    def ensure(self, mapped: MappedFile, base: int, end: int) -> int:
        """Back the segment at ``base`` up to at least ``end`` (a position) now, ask the
        background thread to go further, and return the position it is backed to."""
        needed = end - base
        want = _round_up(needed, min(self._step, _WRITER_BYTES))  # (the step: below)
        if want > (mapped.prepared or 0) and not self._has_room(want - (mapped.prepared or 0)):
            want = needed  # a nearly full disk: the pages this write needs, no more
        ready = mapped.prepare_to(want, self._warm, self._piece)
        if ready < needed:
            raise AssertionError(f"segment {mapped.path} is closed")
        target = _round_up(needed + self._ahead(end), self._step)
        if target > ready:
            with self._lock:
                if not self._closed:
                    self._job = (mapped, min(target, mapped.size))
                    if not self._running:
                        self._running = self._submit(self._back_ahead) is not None
        if target > mapped.size and self._next_ahead:
            self._prepare_next(base + mapped.size)
        return base + ready

    def _has_room(self, amount: int) -> bool:
        """Whether backing ``amount`` more bytes leaves the headroom free."""
        try:
            return room_bytes(self._directory) - amount >= self._headroom
        except OSError:
            return True  # cannot tell: backing says DiskFull itself if it must

    def _ahead(self, end: int) -> int:
        """How far ahead of ``end`` to back: what the writer wrote in the last
        ``_AHEAD_SECONDS`` (a slow or durable writer needs little, a fast one up to the
        maximum), and never more than twice what it wrote since open (a small store
        stays small)."""
        now = time.monotonic()
        last_end, last_time = self._last
        self._last = (end, now)
        if last_time <= 0 or end <= last_end:
            return 0
        rate = (end - last_end) / max(now - last_time, 1e-6)
        return int(min(self._ahead_max, 2 * (end - self._start), rate * _AHEAD_SECONDS))

    def _back_ahead(self) -> None:
        """The background thread: back the latest target, a chunk per lock hold."""
        while True:
            with self._lock:
                job, self._job = self._job, None
                if job is None or self._closed:
                    self._running = False
                    return
            mapped, target = job
            generation = self._generation
            try:
                while not self._closed and generation == self._generation:
                    before = mapped.prepared or 0
                    chunk_end = min(target, before + _CHUNK_BYTES)
                    if before >= target or not self._has_room(chunk_end - before) or \
                            mapped.prepare_to(chunk_end, self._warm, self._piece) <= before:
                        break
            except (MqlogError, OSError):
                pass  # the writer meets the same error, typed, when it needs the room

    def _prepare_next(self, base: int) -> None:
        with self._lock:
            if base not in self._pending and not self._closed:
                pending = self._submit(self._create_ahead, base)
                if pending is not None:
                    self._pending[base] = pending

    def _submit(self, job: Any, *arguments: Any) -> Future | None:
        """``job`` on the background thread; None if the interpreter is shutting down
        (its executors take no new work: a put from a thread still running then raised
        a raw RuntimeError). Work ahead only: the writer backs what it needs itself."""
        try:
            return self._executor.submit(job, *arguments)
        except RuntimeError:
            return None

    def _create_ahead(self, base: int) -> MappedFile:
        mapped = MappedFile.create(self._directory / file_name(base), self._size)
        try:
            if self._has_room(self._step):  # else the writer backs it when it gets there
                mapped.prepare_to(self._step, self._warm, self._piece)
        except (MqlogError, OSError):
            pass  # backed when the writer gets there, or DiskFull then
        return mapped

    def discard(self) -> None:
        """Remove every segment made ahead and not taken (truncation, close)."""
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
            self._job = None
            self._generation += 1
        for future in pending:
            try:
                future.result().remove()
            except (MqlogError, OSError):
                pass  # it failed to be made; nothing to remove

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.discard()
        self._executor.shutdown(wait=True)


# --- lock files: a store's ``lock``, a broker's ``broker.lock``, repair's hold ------------


class LockHeld(Exception):
    """``LockFile.take`` found the lock held (by another process, or another holder in
    this one): ``holder`` is what the holder wrote in it (its pid, then what it said)."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


class LockFile:
    """An exclusive flock on ``path`` (made if missing) for as long as its owner lives:
    ``release`` lets go (again: nothing); the kernel does when the process dies, however
    it dies. The holder writes its pid and ``says`` in it, for the message of the next
    one refused (``LockHeld``); written over the old text before the cut, so a store on
    a full disk still opens (the file keeps its block). A child forked while it is held
    closes its copy of the descriptor (flock belongs to the open file, which both share:
    the child's copy would hold it past the parent's release), never unlocking it."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    @classmethod
    def take(cls, path: Path, says: str | None = "") -> LockFile:
        """The lock, or LockHeld; ``says`` None: write nothing (a dry run's hold)."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        lock = cls(fd)
        _HELD_LOCKS.add(lock)  # (at once: a fork from here on closes the child's copy)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, _LOCK_HOLDER_BYTES_MAX, 0).decode(errors="replace")
            lock.release()
            raise LockHeld(holder.strip() or "unknown") from None
        except BaseException:
            lock.release()
            raise
        if says is None:
            return lock
        text = f"{os.getpid()} {says}".strip().encode() + b"\n"
        with suppress(OSError):
            os.pwrite(fd, text, 0)
        with suppress(OSError):
            os.ftruncate(fd, len(text))
        return lock

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        fd, self._fd = self._fd, -1  # (-1 first: a fork must not close it twice)
        _HELD_LOCKS.discard(self)
        if fd >= 0:
            os.close(fd)

    def _forked(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            with suppress(OSError):
                os.close(fd)


_LOCK_HOLDER_BYTES_MAX = 512  # what a refused taker reads of the holder's text
_HELD_LOCKS: set[LockFile] = set()


def _forget_locks_in_child() -> None:
    for lock in list(_HELD_LOCKS):
        lock._forked()
    _HELD_LOCKS.clear()


os.register_at_fork(after_in_child=_forget_locks_in_child)
