"""Consume-queue files on disk: finding the live entries of a mapped file.

A consume-queue file holds fixed 20-byte entries (docs/FORMAT.md). The entries in use
form one contiguous run from the file's start, possibly led by tombstones (a queue that
starts inside the file); an all-zero entry ends the run. These helpers binary-search
that run; the Store uses them when it opens queues, and a read-only open uses them to
ignore entries past the snapshot's end without changing a byte.

The files are derived data. Anything in ``consumequeue/`` that is not a queue
(``<topic>/<queue id>/<20 digits>``) is left alone and ignored; a queue file that is
empty, not a whole number of entries, or of another size than its queue's other files
raises ConsumeQueueMismatch, and recovery rebuilds every queue from the log.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from mqlog import format as fmt
from mqlog.engine.files import MappedFile, numbered_files
from mqlog.errors import ConsumeQueueMismatch

ENTRY_SIZE = fmt.CQ_ENTRY_SIZE
# Fills the entries before a queue's first offset when it starts inside a file (a
# follower that joins late, a rebuild after retention), so that the entries in use are
# always one contiguous run from the start of a file and binary searches stay valid.
TOMBSTONE = fmt.CQ_TOMBSTONE
TOMBSTONE_SIZE = fmt.CQ_TOMBSTONE_SIZE


def queue_directories(root: Path) -> Iterator[tuple[tuple[str, int], Path]]:
    """((topic, queue id), directory) of every queue under ``root``, sorted; stray files
    and directories that name no queue are skipped."""
    if not root.is_dir():
        return
    for topic_dir in sorted(root.iterdir()):
        if not topic_dir.is_dir():
            continue
        for queue_dir in sorted(topic_dir.iterdir()):
            if queue_dir.name.isdigit() and queue_dir.is_dir():
                yield (topic_dir.name, int(queue_dir.name)), queue_dir


def checked_files(key: tuple[str, int], directory: Path) -> list[tuple[int, Path]]:
    """A queue's files, once their sizes are checked (see the module docstring)."""
    found = numbered_files(directory)
    sizes = [(path.stat().st_size, path) for _, path in found]
    whole = max((size for size, _ in sizes), default=0)  # (each file is made whole)
    for size, path in sizes:
        if size == 0 or size % ENTRY_SIZE or size != whole:
            raise ConsumeQueueMismatch(
                f"consume queue {key} has a file of {size} bytes ({path.name}; its files "
                f"hold {sorted({size for size, _ in sizes})} bytes; each must be the same "
                f"whole number of {ENTRY_SIZE}-byte entries)")
    return found


def remove_all(root: Path) -> None:
    """Delete every queue's files and directories (a rebuild); leave strays alone."""
    for _key, queue_dir in list(queue_directories(root)):
        for _, path in numbered_files(queue_dir):
            path.unlink()
        for leftover in queue_dir.glob("*.tmp"):
            leftover.unlink()
        if not any(queue_dir.iterdir()):
            queue_dir.rmdir()
    for topic_dir in root.iterdir() if root.is_dir() else ():
        if topic_dir.is_dir() and not any(topic_dir.iterdir()):
            topic_dir.rmdir()


def entry(mapped: MappedFile, index: int) -> tuple[int, int]:
    """(position, size) of a file's entry ``index``."""
    position, size, _tag_hash = fmt.CQ_ENTRY.unpack_from(mapped.buffer, index * ENTRY_SIZE)
    return position, size


def entries_before(mapped: MappedFile, scan_from: int) -> int:
    """How many leading entries are tombstones or point before ``scan_from``. The search
    stays below the file's first hole (it would read as zeros: the end of the run), which
    on a full tmpfs cannot be read through the mapping (files.py)."""
    low, high = 0, mapped.data_end() // ENTRY_SIZE
    while low < high:
        middle = (low + high) // 2
        position, size = entry(mapped, middle)
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
        position, size = entry(mapped, middle)
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
        # Its blocks stay: the scan that follows writes most of it again.
        last = files[-1]
        live = entries_before(last, scan_from)
        if live * ENTRY_SIZE < last.size:
            last.clear_from(live * ENTRY_SIZE)
    return files
