"""Where a store's files live, and how they are created, mapped and removed.

Layout of a store directory (docs/FORMAT.md has the bytes)::

    lock                      flock'd by the process that has the store open
    abort                     exists while the store is open; left behind by a crash
    checkpoint                where recovery may start scanning (CRC32C-protected)
    epochs                    first position of each epoch (Kafka's leader-epoch file)
    meta.json                 the store's format version
    commitlog/<20 digits>     segments, named by their start position
    consumequeue/<topic>/<queue id>/<20 digits>
                              consume-queue files, named by their first offset

Segments are preallocated (``posix_fallocate``, instant) and mapped. Bringing fresh pages
into the page cache costs ~0.35 GB/s here however it is done (write faults, populate, or
write()), so populating a 1 GiB segment up front would stall a put for seconds. Instead
the SegmentAllocator (RocketMQ's AllocateMappedFileService) creates the next segment on
a background thread and then warms it, 8 MiB at a time, with MADV_POPULATE_WRITE — on
the other core, while the writer fills pages the warmer already reached. A segment is
made under a temporary name and renamed into place, so a crash never leaves a half-made
segment. Consume-queue files are sparse: a store may have thousands of them.
"""

from __future__ import annotations

import mmap
import os
import re
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from mqlog.ext import libc

NAME_DIGITS = 20
_NAME = re.compile(r"^\d{20}$")


def file_name(number: int) -> str:
    return f"{number:0{NAME_DIGITS}d}"


def numbered_files(directory: Path) -> list[tuple[int, Path]]:
    """Files named by a 20-digit number, ascending; anything else is ignored."""
    if not directory.is_dir():
        return []
    found = [(int(entry.name), entry) for entry in directory.iterdir()
             if _NAME.match(entry.name) and entry.is_file()]
    return sorted(found)


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class MappedFile:
    """One file mapped shared and writable, with the libc handle used to sync it."""

    __slots__ = ("path", "fd", "buffer", "mapping", "size", "_closing", "_warming")

    WARM_CHUNK_BYTES = 8 << 20

    def __init__(self, path: Path, fd: int, size: int, writable: bool = True) -> None:
        self.path = path
        self.fd = fd
        self.size = size
        self.buffer = mmap.mmap(fd, size, flags=mmap.MAP_SHARED,
                                prot=mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0))
        self.mapping = libc.Mapping(self.buffer)
        self._closing = False
        self._warming = threading.Lock()  # close() must not release the pointer mid-warm

    @classmethod
    def create(cls, path: Path, size: int, preallocate: bool) -> MappedFile:
        """Create a zero-filled file of ``size`` bytes; an existing one is an error.

        It is built under ``<name>.tmp`` and renamed, so it appears whole or not at all.
        """
        temporary = path.with_name(path.name + ".tmp")
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if preallocate:
                os.posix_fallocate(fd, 0, size)
            else:
                os.ftruncate(fd, size)
            mapped = cls(path, fd, size)
            if path.exists():
                raise FileExistsError(f"{path} already exists")
            os.rename(temporary, path)
            return mapped
        except BaseException:
            os.close(fd)
            temporary.unlink(missing_ok=True)
            raise

    @classmethod
    def open(cls, path: Path) -> MappedFile:
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            return cls(path, fd, size)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def open_read_only(cls, path: Path) -> MappedFile:
        """Map an existing file for reading only (a read-only store, another process's)."""
        fd = os.open(path, os.O_RDONLY)
        try:
            return cls(path, fd, os.fstat(fd).st_size, writable=False)
        except BaseException:
            os.close(fd)
            raise

    def sync(self, start: int, end: int) -> None:
        self.mapping.msync(start, end)

    def warm(self, start: int = 0) -> None:
        """Fault pages in writable from ``start`` on, a chunk at a time, until closed."""
        for offset in range(start - start % libc.PAGE_SIZE, self.size, self.WARM_CHUNK_BYTES):
            with self._warming:
                if self._closing:
                    return
                try:
                    self.mapping.madvise(offset, offset + self.WARM_CHUNK_BYTES,
                                         libc.MADV_POPULATE_WRITE)
                except OSError:
                    return  # an older kernel: writes fault pages in instead

    def zero_from(self, offset: int, preallocate: bool) -> None:
        """Zero [offset, size): punch a hole (no page is touched), or write zeros."""
        if libc.punch_hole(self.fd, offset, self.size - offset):
            if preallocate:
                os.posix_fallocate(self.fd, offset, self.size - offset)
            return
        chunk = bytes(1 << 20)
        for start in range(offset, self.size, len(chunk)):
            end = min(self.size, start + len(chunk))
            self.buffer[start:end] = chunk[:end - start]

    def close(self) -> None:
        with self._warming:  # waits for at most one warm chunk (~3 ms)
            self._closing = True
        self.mapping.release()
        self.buffer.close()
        os.close(self.fd)

    def remove(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


class SegmentAllocator:
    """Creates the next segment on a background thread before the writer needs it."""

    def __init__(self, directory: Path, size: int, preallocate: bool, ahead: bool) -> None:
        self._directory = directory
        self._size = size
        self._preallocate = preallocate
        self._ahead = ahead
        self._lock = threading.Lock()
        self._pending: dict[int, Future[MappedFile]] = {}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mqlog-alloc")

    def take(self, base: int) -> MappedFile:
        """The segment starting at ``base`` (prepared, or made now); prepare the next one."""
        with self._lock:
            pending = self._pending.pop(base, None)
        mapped = pending.result() if pending is not None else self._create(base)
        self.prepare(base + mapped.size)
        return mapped

    def warm(self, mapped: MappedFile, start: int) -> None:
        """Warm an existing segment from ``start`` on, in the background."""
        if self._preallocate:
            self._executor.submit(mapped.warm, start)

    def prepare(self, base: int) -> None:
        if not self._ahead:
            return
        with self._lock:
            if base not in self._pending:
                self._pending[base] = self._executor.submit(self._create, base)

    def discard(self) -> None:
        """Remove every prepared segment not taken (truncation, close)."""
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
        for future in pending:
            try:
                future.result().remove()
            except OSError:
                pass  # it failed to be made; nothing to remove

    def close(self) -> None:
        self.discard()
        self._executor.shutdown(wait=True)

    def _create(self, base: int) -> MappedFile:
        """Make the file (fast), then queue its warming behind this task."""
        mapped = MappedFile.create(self._directory / file_name(base), self._size,
                                   self._preallocate)
        self.warm(mapped, 0)
        return mapped
