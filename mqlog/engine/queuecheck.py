"""A read-only open's check that its consume queues hold every record of the log.

A writable open notices a consume-queue file that was lost (deleted, or never copied)
and rebuilds every queue from the commit log (recovery.py). A read-only open writes
nothing, so it cannot rebuild; without this check it served such a queue short — a
lost first file raised its minimum, a lost last one lowered its end, a lost queue
vanished — with no error. It refuses instead, as a read-only open of an embedded
database that needs recovery does (RocksDB's read-only mode reports a lost file as
Corruption, SQLite's READONLY_RECOVERY): ``ConsumeQueueMismatch`` (a ``CorruptStore``)
names the queue and the record it lacks, and says to open the store for writing once,
which rebuilds the queues and names the rebuild in its recovery report. Serving the
queue from the log instead would mean walking the whole log on every read-only open
(each Spark task's) for as long as nobody opens the store for writing.

The queue manifest (checkpoint.py) says which queues exist, from which offset and up to
which; the store rewrites it whenever a queue appears, its minimum moves or it begins a
new file (at a checkpoint), so its next offsets reach into every queue's last file but
the newest ones. It is read before anything else is mapped. A queue whose files hold
less than the manifest says, or that has no files, is a suspect, not a finding: the
manifest is stale legitimately. It is high after a truncation (rewritten at the next
checkpoint, never if the writer crashed first; a crash also loses records past the
checkpoint whose offsets it counted), and its minimum is low while retention deletes old
queue files (rewritten right after, never if the writer crashed between). A suspect is
a finding only when the log holds the proof: a record of that queue, in the snapshot's
log, whose offset the queue's files do not hold. The log is walked for such records
(headers only) from where a lost entry's record could be:

* below the files' first offset: from the log's first segment as listed *now*, after the
  queue files were. Retention deletes the segments of a queue file's records before the
  file, so a file it deleted before they were listed has no record left after that;
* past the files' last offset: from the end of the last record they hold.

The walk ends at the checkpoint's position (read before the manifest): a live writer
in another process writes a record before its entry, so the snapshot's end may take in
records whose entries come a moment later, but every record before the checkpoint had
its entry written and synced before the checkpoint was. Only these rare states pay for
a walk. A live writer does not cause one: the manifest, read first, holds no offsets of
records written after it, nor a minimum above the files' (retention moves it up, never
down). A truncation racing with the open (it lowers the checkpoint, then writes again
below where it was) can make the walk meet a record whose entry is on its way; its
entry, read again from the file itself, clears it if it has come.

Not noticed: entries of records past the last checkpoint (a file lost since, or one
newer than the manifest's last rewrite), and anything when the manifest or the
checkpoint is lost (a writable open rebuilds every queue, or scans every record, then).

A writable open after a crash runs the same check (recovery.py): its scan restores the
entries of records past the checkpoint, and a queue that then still ends short of the
manifest is rebuilt only if the log holds the proof.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from mqlog import format as fmt
from mqlog.engine import consumequeue as cq
from mqlog.engine.files import numbered_files
from mqlog.errors import ConsumeQueueMismatch, CorruptStore

if TYPE_CHECKING:
    from mqlog.engine.fileset import FileSet

Queue = tuple[str, int]


def rebuild_advice(root: object) -> str:
    """What to do about a consume queue a read-only open cannot trust."""
    return (f"a read-only open cannot rebuild it: open {root} for writing once (without "
            "read_only=True, with no writer running), which rebuilds every consume queue "
            "from the commit log and names the rebuild in its recovery_report, then "
            "read-only again")


def check_queues(files: FileSet, manifest: dict[Queue, tuple[int, int]] | None,
                 end: int) -> None:
    """Raise ConsumeQueueMismatch if a mapped queue lacks a record of the log before
    ``end`` (the checkpoint's position: see the module docstring); ``manifest`` as read
    before the files were mapped (None: none to go by)."""
    lost = find_lost_entry(files, manifest, end)
    if lost is not None:
        raise ConsumeQueueMismatch(f"{lost}; {rebuild_advice(files.paths.root)}")


def find_lost_entry(files: FileSet, manifest: dict[Queue, tuple[int, int]] | None,
                    end: int) -> str | None:
    """What a mapped queue lacks (a record of the log before ``end`` that its files hold
    no entry of), or None if none lacks anything the manifest leads to."""
    manifest = manifest or {}
    suspects = _suspects(files, manifest)
    if not suspects:
        return None
    start = min(_walk_start(files, queue, manifest[queue][0], held)
                for queue, held in suspects.items())
    wanted = {queue_id for _topic, queue_id in suspects}
    for position, queue, offset in _queue_records(files, start, end, wanted):
        held = suspects.get(queue)
        if held is None or held[0] <= offset < held[1]:
            continue
        if _entry_on_disk(files, queue, offset) == position:
            continue  # a live writer's, written after the queue files were read
        return _lost_entry(files, queue, offset, position, held, manifest[queue])
    return None


def _suspects(files: FileSet, manifest: dict[Queue, tuple[int, int]]
              ) -> dict[Queue, tuple[int, int]]:
    """{queue: the offsets its files hold} of every queue holding less than the
    manifest says ((0, 0) for one without files)."""
    found = {}
    for queue, (low, high) in manifest.items():
        held = files.core.queue_offsets(*queue)
        if held is None:
            found[queue] = (0, 0)
        elif low < held[0] or high > held[1]:
            found[queue] = (held[0], held[1])
    return found


def _walk_start(files: FileSet, queue: Queue, listed_low: int,
                held: tuple[int, int]) -> int:
    """Where a record whose entry ``queue``'s files lack could first be: anywhere in the
    log if they lack some at the front (the manifest's minimum is lower) or hold none,
    else past the last record they hold."""
    low, high = held
    if listed_low < low or low == high:
        return _log_start_now(files)
    return _record_end(files, queue, high - 1)


def _log_start_now(files: FileSet) -> int:
    """The log's first position as its segment files say now (at least the snapshot's):
    listed after the queue files, see the module docstring."""
    listed = numbered_files(files.paths.commitlog)
    now = listed[0][0] if listed else 0
    return max(now, files.first_segment_base())


def _record_end(files: FileSet, queue: Queue, offset: int) -> int:
    position, size = files.queue_entry(queue, offset)
    return position + size


def _queue_records(files: FileSet, start: int, end: int, queue_ids: set[int]
                   ) -> Iterator[tuple[int, Queue, int]]:
    """(position, queue, offset) of each record in [start, end) of a queue whose id is
    in ``queue_ids``. Headers only: the snapshot's end was found by a scan that checked
    every record past the checkpoint; ``start`` is a record's start."""
    for base in files.segment_bases():
        buffer = files.segment_file(base).buffer
        if base + len(buffer) <= start or base >= end:
            continue
        at, stop = max(start, base) - base, min(end - base, len(buffer))
        while at + fmt.RECORD_HEADER_SIZE <= stop:
            header = fmt.RecordHeader._make(fmt.RECORD_HEADER.unpack_from(buffer, at))
            if header.magic != fmt.RECORD_MAGIC or header.size < fmt.RECORD_HEADER_SIZE:
                break  # the blank that fills the segment's tail (or the end)
            if header.queue_id in queue_ids and not header.control:
                name_at = at + fmt.RECORD_HEADER_SIZE
                try:
                    topic = bytes(buffer[name_at:name_at + header.topic_size]).decode()
                except UnicodeDecodeError:  # (a writer in another process changing the
                    # log under a read-only open; else damage): typed, so a reader tells
                    raise CorruptStore(f"the record at {base + at} names a topic that is not "
                                       "UTF-8: the log is damaged there, or was changed while "
                                       "it was read") from None
                yield base + at, (topic, header.queue_id), header.queue_offset
            at += header.size


def _entry_on_disk(files: FileSet, queue: Queue, offset: int) -> int | None:
    """The position the entry of ``offset`` holds in its queue file now, read from the
    file itself (None: no such file, or no entry there yet)."""
    listed = [(base, path) for base, path in numbered_files(files.paths.queue_dir(*queue))
              if base <= offset]
    if not listed:
        return None
    base, path = listed[-1]
    at = (offset - base) * cq.ENTRY_SIZE
    try:
        with open(path, "rb") as file:  # the size first: see consumequeue.entry
            size = os.pread(file.fileno(), fmt.CQ_SIZE.size, at + fmt.CQ_AT_SIZE)
            position = os.pread(file.fileno(), fmt.CQ_POSITION.size, at + fmt.CQ_AT_POSITION)
    except OSError:  # deleted since it was listed
        return None
    if len(size) < fmt.CQ_SIZE.size or len(position) < fmt.CQ_POSITION.size or \
            fmt.CQ_SIZE.unpack(size)[0] in (0, cq.TOMBSTONE_SIZE):
        return None
    return int(fmt.CQ_POSITION.unpack(position)[0])


def _lost_entry(files: FileSet, queue: Queue, offset: int, position: int,
                held: tuple[int, int], listed: tuple[int, int]) -> str:
    holds = "no files" if held == (0, 0) and files.core.queue_offsets(*queue) is None \
        else f"files that hold offsets [{held[0]}, {held[1]})"
    return (f"consume queue {queue} of {files.paths.root} lacks entries: the commit log "
            f"holds its record of offset {offset} at position {position}, but the queue has "
            f"{holds} (the queue manifest says [{listed[0]}, {listed[1]})): a consume-queue "
            "file was deleted or lost")
