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

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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
    """(position, size) of a file's entry ``index``. The size is read first: a writer in
    another process stores it last, so a non-zero size comes with its entry's position
    (format.py); read the other way round, a half-written entry could pair the new size
    with the zeros of a position not yet stored."""
    at = index * ENTRY_SIZE
    (size,) = fmt.CQ_SIZE.unpack_from(mapped.buffer, at + fmt.CQ_AT_SIZE)
    (position,) = fmt.CQ_POSITION.unpack_from(mapped.buffer, at + fmt.CQ_AT_POSITION)
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


# Whether the log holds, at ``position`` and ``size`` bytes long, the queue's record of
# ``offset``: (offset, position, size) -> True or False, or None when the log cannot
# tell (retention deleted that part of it, or the record there is damaged). See
# FileSet.entry_check.
EntryCheck = Callable[[int, int, int], "bool | None"]


def entries_held(mapped: MappedFile, scan_from: int, check: EntryCheck) -> int:
    """``entries_before``, less the entries at the end of that run that name no record of
    the log: two entries in 1,024 have part of their position on one page and their
    size on the next, and the entries of records past the last checkpoint are not
    synced, so a crash can leave one with its size and without its position (zeros, or
    an older file's bytes). The run is searched as usual, then walked back from its end
    while an entry fails ``check``: such entries come only after the entries the
    checkpoint synced, and every one of those names its record (or, where damage hit
    the record since, one the check cannot tell: it holds if it follows the entry
    before it)."""
    count = entries_before(mapped, scan_from)
    base = int(mapped.path.name)
    while count and not _holds(mapped, base, count - 1, scan_from, check):
        count -= 1
    return count


def _holds(mapped: MappedFile, base: int, index: int, scan_from: int,
           check: EntryCheck) -> bool:
    position, size = entry(mapped, index)
    if size == TOMBSTONE_SIZE:
        return True
    if size == 0 or position + size > scan_from:
        return False
    verdict = check(base + index, position, size)
    if verdict is not None:
        return verdict
    # Retention deleted its record, or damage hit it: it must at least come after the
    # entry before it.
    if index == 0:
        return True
    before, before_size = entry(mapped, index - 1)
    return before_size == TOMBSTONE_SIZE or \
        before_size != 0 and position >= before + before_size


def names_record(buffer: Any, at: int, position: int, size: int, queue: tuple[str, int],
                 offset: int) -> bool:
    """Whether the bytes at ``at`` of a segment's ``buffer`` (log position ``position``)
    start the record of ``queue`` and ``offset``, ``size`` bytes long: a record header
    there, then what a read checks of an entry's record (format.names_queue_record; not
    its CRC: the records an open counts entries for were checkpointed or scanned)."""
    topic = queue[0].encode()
    if at < 0 or at + fmt.RECORD_HEADER_SIZE + len(topic) > len(buffer):
        return False
    size_found, magic = fmt.BLANK.unpack_from(buffer, at)  # (size, magic: any header's)
    (position_found,) = fmt.CQ_POSITION.unpack_from(buffer, at + fmt.POSITION_AT)
    return magic == fmt.RECORD_MAGIC and size_found == size and position_found == position \
        and fmt.names_queue_record(buffer, at, queue[1], offset, topic)


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


def trim_files(files: list[MappedFile], scan_from: int, check: EntryCheck
               ) -> list[MappedFile]:
    """Drop entries at or past ``scan_from``, and torn ones (``entries_held``): later
    files go, the last one kept is zeroed past its live prefix. Returns the files kept
    (the first one always, if any)."""
    while len(files) > 1 and entries_held(files[-1], scan_from, check) == 0:
        files.pop().remove()
    if files:
        # After a crash the tail may hold entries of lost records, with holes between
        # them; zero it whole so the live prefix stays contiguous for the next search.
        # Its blocks stay: the scan that follows writes most of it again.
        last = files[-1]
        live = entries_held(last, scan_from, check)
        if live * ENTRY_SIZE < last.size:
            last.clear_from(live * ENTRY_SIZE)
    return files
