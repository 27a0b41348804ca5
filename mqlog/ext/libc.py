"""cffi (ABI mode) bindings for the libc memory calls Python's ``mmap`` lacks.

This is the role JNA's ``LibC`` plays in RocketMQ: range ``msync`` (Python's
``mmap.flush`` holds the GIL while it syncs; cffi calls release it), ``madvise``,
``mlock``/``munlock``, ``mincore`` and ``fallocate`` (hole punching to zero a dead tail
without touching its pages); and glibc's ``mallopt``, to keep freed buffers for reuse
(``keep_freed_buffers``). Nothing here is compiled: libc is opened at import.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

from cffi import FFI

ffi = FFI()
ffi.cdef("""
    int msync(void *addr, size_t length, int flags);
    int madvise(void *addr, size_t length, int advice);
    int mlock(const void *addr, size_t len);
    int munlock(const void *addr, size_t len);
    int mincore(void *addr, size_t length, unsigned char *vec);
    int fallocate(int fd, int mode, long offset, long len);
    int mallopt(int param, int value);
""")
_libc = ffi.dlopen(None)

PAGE_SIZE = mmap.PAGESIZE
MS_SYNC = 4  # <sys/mman.h> on Linux
MADV_WILLNEED = 3
MADV_DONTNEED = 4
MADV_POPULATE_READ = 22  # Linux 5.14+: fault pages in as a read would (write-protected)
MADV_POPULATE_WRITE = 23  # Linux 5.14+: fault pages in writable, as a write would
M_TRIM_THRESHOLD = -1  # <malloc.h> (glibc)
M_MMAP_THRESHOLD = -3
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02


def _check(result: int, what: str) -> None:
    if result != 0:
        error = ffi.errno
        raise OSError(error, f"{what}: {os.strerror(error)}")


class Mapping:
    """A pointer to a Python mmap, for libc calls on page-aligned ranges of it."""

    __slots__ = ("_pointer", "size")

    def __init__(self, buffer: Any) -> None:
        self._pointer = ffi.from_buffer(buffer)  # keeps the mmap's buffer exported
        self.size = len(buffer)

    def _range(self, start: int, end: int) -> tuple[Any, int]:
        start -= start % PAGE_SIZE
        end = min(self.size, end)
        return self._pointer + start, max(0, end - start)

    def msync(self, start: int, end: int) -> None:
        """Write back and wait for the pages covering [start, end) (GIL released)."""
        pointer, length = self._range(start, end)
        if length:
            _check(_libc.msync(pointer, length, MS_SYNC), "msync")

    def madvise(self, start: int, end: int, advice: int) -> None:
        pointer, length = self._range(start, end)
        if length:
            _check(_libc.madvise(pointer, length, advice), "madvise")

    def mlock(self) -> None:
        _check(_libc.mlock(self._pointer, self.size), "mlock")

    def munlock(self) -> None:
        _check(_libc.munlock(self._pointer, self.size), "munlock")

    def resident_pages(self) -> int:
        """How many pages of the mapping are in memory (mincore)."""
        pages = (self.size + PAGE_SIZE - 1) // PAGE_SIZE
        vector = ffi.new("unsigned char[]", pages)
        _check(_libc.mincore(self._pointer, self.size, vector), "mincore")
        return sum(1 for index in range(pages) if vector[index] & 1)

    def release(self) -> None:
        """Drop the pointer so the mmap can be closed."""
        ffi.release(self._pointer)


def punch_hole(fd: int, offset: int, length: int) -> bool:
    """Zero [offset, offset+length) of a file by deallocating it; False if unsupported."""
    if length <= 0:
        return True
    result = _libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length)
    if result == 0:
        return True
    if ffi.errno in (95, 38):  # EOPNOTSUPP, ENOSYS
        return False
    _check(result, "fallocate(PUNCH_HOLE)")
    return True


def keep_freed_buffers(mmap_threshold: int, trim_threshold: int) -> bool:
    """Have glibc's malloc serve blocks below ``mmap_threshold`` bytes from its heap and
    keep up to ``trim_threshold`` bytes of freed heap instead of returning them to the
    kernel; False where the C library has no ``mallopt`` (not glibc) or refused.

    Why: by default a block of a few hundred KB (a fetch answer read from the log, its
    frame, a socket read) may be mmap'd and unmapped, or the heap top it was on trimmed,
    each time; the next one faults fresh zeroed pages in again. A broker serving fetches
    took 250 minor page faults per 1,000 replicated records that way (docs/BENCHMARKS.md,
    tenth session), and a page fault is not cheap on a virtual machine."""
    try:
        mallopt = _libc.mallopt
    except AttributeError:  # (cffi finds a symbol when it is first used)
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and \
        bool(mallopt(M_TRIM_THRESHOLD, trim_threshold))
