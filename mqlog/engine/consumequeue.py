"""Consume-queue files on disk: finding the live entries of a mapped file.

A consume-queue file holds fixed 20-byte entries (docs/FORMAT.md). The entries in use
form one contiguous run from the file's start, possibly led by tombstones (a queue that
starts inside the file); an all-zero entry ends the run. These helpers binary-search
that run; the Store uses them when it opens queues, and a read-only open uses them to
ignore entries past the snapshot's end without changing a byte.
"""

from __future__ import annotations

from mqlog.engine.files import MappedFile

ENTRY_SIZE = 20
# Fills the entries before a queue's first offset when it starts inside a file (a
# follower that joins late, a rebuild after retention), so that the entries in use are
# always one contiguous run from the start of a file and binary searches stay valid.
TOMBSTONE = (0xFFFF_FFFF_FFFF_FFFF).to_bytes(8, "little") + b"\xff" * 4 + bytes(8)
TOMBSTONE_SIZE = 0xFFFF_FFFF


def _entry(mapped: MappedFile, index: int) -> tuple[int, int]:
    position, size = int.from_bytes(mapped.buffer[index * 20:index * 20 + 8], "little"), \
        int.from_bytes(mapped.buffer[index * 20 + 8:index * 20 + 12], "little")
    return position, size


def entries_before(mapped: MappedFile, scan_from: int) -> int:
    """How many leading entries are tombstones or point before ``scan_from``."""
    low, high = 0, mapped.size // ENTRY_SIZE
    while low < high:
        middle = (low + high) // 2
        position, size = _entry(mapped, middle)
        if size == TOMBSTONE_SIZE or (size != 0 and position < scan_from):
            low = middle + 1
        else:
            high = middle
    return low


def first_live_entry(mapped: MappedFile, log_start: int) -> int:
    """Index of the first entry of a record still in the log (one past the prefix if none)."""
    low, high = 0, entries_before(mapped, 1 << 64)
    while low < high:
        middle = (low + high) // 2
        position, size = _entry(mapped, middle)
        if size == TOMBSTONE_SIZE or position < log_start:
            low = middle + 1
        else:
            high = middle
    return low


def trim_files(files: list[MappedFile], scan_from: int) -> list[MappedFile]:
    """Drop entries at or past ``scan_from``: later files go, the last one kept is zeroed
    past its live prefix. Returns the files kept (the first one always, if any)."""
    while len(files) > 1 and entries_before(files[-1], scan_from) == 0:
        files.pop().remove()
    if files:
        # After a crash the tail may hold entries of lost records, with holes between
        # them; zero it whole so the live prefix stays contiguous for the next search.
        last = files[-1]
        live = entries_before(last, scan_from)
        if live * ENTRY_SIZE < last.size:
            last.zero_from(live * ENTRY_SIZE, preallocate=False)
    return files
