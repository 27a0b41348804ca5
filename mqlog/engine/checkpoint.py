"""The checkpoint, the epoch file and the store's small metadata files.

The checkpoint names a position from which crash recovery may scan: every record
before it was flushed, and so were the consume-queue entries of those records. It is
written only after both flushes, atomically (temporary file, fsync, rename, fsync of the
directory), and carries a CRC32C; a damaged or missing checkpoint means "scan from the
first segment". At a clean close it also records where the log ends.

The flushed-position file says how far the log was last known to be durable, saved far
more often than checkpoints: after log syncs (at most every
``flushed_position_save_interval_ms``, on a thread of its own, off the sync waiters'
path), with a write of its own in place. A position is
saved only after the sync that made it durable, so it never claims bytes a crash could
tear; recovery refuses to cut records before it (they were acknowledged as flushed:
damage there is the medium's, not a crash's), where without it a damaged acknowledged
tail past the last checkpoint was cut as a torn one. Each save is a device flush of
its own, so saves are spaced (50 ms by default: saving after every group commit cost a
durable writer a second flush per sync, 0.89x its rate); what was acknowledged since the
last save is treated as the tail it would have been without the file. Two slots, written
alternately: a write torn by a crash leaves the other, older and still true.

The change count tells a reader in another process a change of the store under it
from damage (``changes``): a truncation, a reset or retention makes it odd before its
first step and even again after its last. A read that meets missing or unreadable data
compares the count with the one it noted before it looked: the same and even, nothing
was cut meanwhile, so the data is damaged; else the store changed under it. Written in
place without a sync: only live readers look, and the count survives a crash anyway
(or is lost with the page cache, where no reader survives either).

The epoch file lists the first position of each epoch, like Kafka's
leader-epoch-checkpoint; the queue manifest lists every queue with its minimum and next
offset, so recovery notices lost consume-queue files; the consumer-offsets file holds
each consumer group's committed offsets. All three are text with a CRC32C trailer,
rewritten the same atomic way whenever they change.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from mqlog import format as fmt
from mqlog.engine.files import fsync_directory, typed_errors
from mqlog.errors import CorruptStore

FORMAT_VERSION = 1
_CHECKPOINT = fmt.CHECKPOINT  # magic, version, log_position, log_end, time, crc
_CHECKPOINT_MAGIC = fmt.CHECKPOINT_MAGIC


@dataclass(frozen=True)
class Checkpoint:
    log_position: int  # recovery may start scanning here
    log_end: int  # where the log ended at a clean close (else equal to log_position)
    timestamp_ms: int


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` by ``data``, durably; a full disk is DiskFull and the old file
    stays whole (the half-written temporary goes)."""
    temporary = path.with_name(path.name + ".tmp")
    try:
        with typed_errors(f"cannot write {path}"), open(temporary, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    os.replace(temporary, path)
    fsync_directory(path.parent)


def write_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    body = _CHECKPOINT.pack(_CHECKPOINT_MAGIC, FORMAT_VERSION, checkpoint.log_position,
                            checkpoint.log_end, checkpoint.timestamp_ms, 0)[:-4]
    write_atomically(path, body + struct.pack("<I", crc32c(body)))


def read_checkpoint(path: Path) -> Checkpoint | None:
    """The checkpoint, or None if it is missing or fails its checks."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(data) != _CHECKPOINT.size:
        return None
    magic, version, log_position, log_end, timestamp_ms, crc = _CHECKPOINT.unpack(data)
    if magic != _CHECKPOINT_MAGIC or version != FORMAT_VERSION or crc != crc32c(data[:-4]):
        return None
    if log_end < log_position:
        return None
    return Checkpoint(log_position, log_end, timestamp_ms)


def _flushed_slot(sequence: int, position: int) -> bytes:
    body = fmt.FLUSHED_SLOT.pack(fmt.FLUSHED_MAGIC, FORMAT_VERSION, sequence, position, 0,
                                 0)[:-4]
    return body + struct.pack("<I", crc32c(body))


def read_flushed(path: Path) -> int | None:
    """The saved flushed position (the newest valid slot's), or None if the file is
    missing or no slot passes its checks."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    best: tuple[int, int] | None = None
    size = fmt.FLUSHED_SLOT.size
    for at in range(0, min(len(data), size * fmt.FLUSHED_SLOTS) - size + 1, size):
        magic, version, sequence, position, _reserved, crc = \
            fmt.FLUSHED_SLOT.unpack_from(data, at)
        if magic == fmt.FLUSHED_MAGIC and version == FORMAT_VERSION and \
                crc == crc32c(data[at:at + size - 4]) and (best is None or sequence > best[0]):
            best = (sequence, position)
    return None if best is None else best[1]


class FlushedPosition:
    """The open flushed-position file (see the module docstring): created whole at
    ``position``, then each save overwrites the older slot in place and fdatasyncs it.

    Saves run on a thread of their own (``threaded``): ``note`` only hands over the
    position a log sync made durable, so no sync waiter ever waits for a save; positions
    noted while one is saved are coalesced into the next. ``lower`` saves at once (a
    truncation waits for it). The descriptor stays open, so running out of descriptors
    never stops a save; a failed save is raised by the next ``note``."""

    def __init__(self, path: Path, position: int, interval_ms: int, threaded: bool) -> None:
        self._interval = interval_ms / 1000
        self._sequence = 2  # slots 0 and 1 hold sequences 0 and 1 at first
        write_atomically(path, _flushed_slot(0, position) + _flushed_slot(1, position))
        with typed_errors(f"cannot open {path}"):
            self._fd = os.open(path, os.O_RDWR)
        self.position = position  # the last one saved
        self._pending = position  # the newest one noted
        self._saved_at = time.monotonic()
        self.save_count = 0
        self.error: OSError | None = None
        self._save_lock = threading.Lock()  # one write at a time, never a stale one last
        self._noted = threading.Condition()  # guards _pending, _idle and _stopping
        self._idle = False  # the thread waits for a note (else it is saving or pausing)
        self._stopping = False
        self._thread: threading.Thread | None = None
        if threaded:
            self._thread = threading.Thread(target=self._run, name="mqlog-flushed",
                                            daemon=True)
            self._thread.start()

    def note(self, position: int) -> None:
        """The log is durable up to ``position`` (a sync just returned): save it soon."""
        if self.error is not None:
            raise self.error
        if self._thread is None:
            if position > self.position and \
                    time.monotonic() - self._saved_at >= self._interval:
                with self._save_lock:
                    self._save(position)
            return
        with self._noted:
            if position > self._pending:
                self._pending = position
                if self._idle:  # (waiting out the interval, it saves the newest anyway)
                    self._noted.notify()

    def lower(self, position: int) -> None:
        """Before a truncation cuts the log to ``position``: saved now if lower."""
        with self._save_lock:
            with self._noted:
                self._pending = min(self._pending, position)
            if self.position > position:
                self._save(position)

    def save_now(self, position: int) -> None:
        """Save ``position`` now (a clean close, a reset's new start)."""
        with self._save_lock:
            with self._noted:
                self._pending = position
            self._save(position)

    def _run(self) -> None:
        while True:
            with self._noted:
                self._idle = True
                while not self._stopping and self._pending <= self.position:
                    self._noted.wait()
                self._idle = False
                # At most one save an interval: notes meanwhile only raise _pending
                deadline = self._saved_at + self._interval
                while not self._stopping and (wait := deadline - time.monotonic()) > 0:
                    self._noted.wait(wait)
                if self._stopping:
                    return
            with self._save_lock:
                with self._noted:
                    target = self._pending  # (after any lower: never a stale one)
                try:
                    if target > self.position:
                        self._save(target)
                except OSError as error:
                    self.error = error  # the next note raises it: the store is fenced
                    return

    def _save(self, position: int) -> None:
        slot = _flushed_slot(self._sequence, position)
        os.pwrite(self._fd, slot, (self._sequence % fmt.FLUSHED_SLOTS) * len(slot))
        os.fdatasync(self._fd)
        self._sequence += 1
        self.position = position
        self._saved_at = time.monotonic()
        self.save_count += 1

    def stop(self) -> None:
        """End the thread (a save under way finishes first); nothing more is saved."""
        with self._noted:
            self._stopping = True
            self._noted.notify()
        if self._thread is not None:
            self._thread.join()

    def close(self) -> None:
        self.stop()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_changes(path: Path) -> int | None:
    """The change count of the store whose ``changes`` file is ``path``; None if there is
    none (a store not opened writable since the file came in)."""
    try:
        with open(path, "rb") as file:
            data = file.read(fmt.CHANGES.size)
    except FileNotFoundError:
        return None
    if len(data) != fmt.CHANGES.size:
        return None
    magic, version, count = fmt.CHANGES.unpack(data)
    return count if magic == fmt.CHANGES_MAGIC and version == FORMAT_VERSION else None


class ChangeCount:
    """The open ``changes`` file of a writable store (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        count = read_changes(path)
        with typed_errors(f"cannot open {path}"):
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self.count = 0 if count is None else count + count % 2  # (odd: a crash cut one)
        try:
            if count != self.count:
                self._write(self.count)
        except BaseException:
            os.close(self._fd)
            raise

    @contextmanager
    def changing(self) -> Iterator[None]:
        """Around a change that cuts what readers may have planned to read."""
        self._write(self.count + 1)
        try:
            yield
        finally:
            self._write(self.count + 1)

    def _write(self, count: int) -> None:
        with typed_errors(f"cannot write {self._path}"):
            os.pwrite(self._fd, fmt.CHANGES.pack(fmt.CHANGES_MAGIC, FORMAT_VERSION, count), 0)
        self.count = count

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _write_crc_text(path: Path, kind: str, lines: list[str]) -> None:
    """Atomically write ``mqlog-<kind> 1``, a count, the lines, and a CRC32C trailer."""
    text = "\n".join([f"mqlog-{kind} {FORMAT_VERSION}", str(len(lines)), *lines]) + "\n"
    write_atomically(path, (text + f"crc32c {crc32c(text.encode()):08x}\n").encode())


def _read_crc_text(path: Path, kind: str) -> list[str] | None:
    """The lines written by ``_write_crc_text``, or None if missing or damaged."""
    try:
        lines = path.read_text().splitlines()
        text = "\n".join(lines[:-1]) + "\n"
        if lines[0] != f"mqlog-{kind} {FORMAT_VERSION}" or len(lines) != int(lines[1]) + 3:
            return None
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        return None
    return lines[2:-1] if lines[-1] == f"crc32c {crc32c(text.encode()):08x}" else None


def write_epochs(path: Path, epoch_starts: list[tuple[int, int]]) -> None:
    _write_crc_text(path, "epochs", [f"{epoch} {position}" for epoch, position in epoch_starts])


def read_epochs(path: Path) -> list[tuple[int, int]] | None:
    """The epoch starts, or None if the file is missing or damaged."""
    lines = _read_crc_text(path, "epochs")
    try:
        return None if lines is None else [
            (int(epoch), int(position)) for epoch, position in map(str.split, lines)]
    except ValueError:
        return None


def write_queues(path: Path, queues: list[tuple[str, int, int, int]]) -> None:
    """The queue manifest: (topic, queue id, min offset, next offset) of every queue."""
    _write_crc_text(path, "queues", [f"{topic} {queue_id} {low} {high}"
                                     for topic, queue_id, low, high in queues])


def read_queues(path: Path) -> dict[tuple[str, int], tuple[int, int]] | None:
    """The queue manifest as {(topic, queue id): (min, next)}, or None if missing/damaged."""
    lines = _read_crc_text(path, "queues")
    try:
        return None if lines is None else {
            (topic, int(queue_id)): (int(low), int(high))
            for topic, queue_id, low, high in map(str.split, lines)}
    except ValueError:
        return None


def write_offsets(path: Path, offsets: dict[tuple[str, str, int], int]) -> None:
    """Consumer offsets: (group, topic, queue id) -> the next offset the group reads."""
    _write_crc_text(path, "offsets", [f"{group} {topic} {queue_id} {offset}" for
                                      (group, topic, queue_id), offset in sorted(offsets.items())])


def read_offsets(path: Path) -> dict[tuple[str, str, int], int] | None:
    """The consumer offsets ({} if the file is missing), or None if it is damaged."""
    if not path.exists():
        return {}
    lines = _read_crc_text(path, "offsets")
    try:
        return None if lines is None else {
            (group, topic, int(queue_id)): int(offset)
            for group, topic, queue_id, offset in map(str.split, lines)}
    except ValueError:
        return None


def check_meta(path: Path) -> None:
    """Create meta.json in a new store; refuse a store written by a newer format."""
    if not path.exists():
        write_atomically(path, json.dumps({"format": FORMAT_VERSION}).encode())
        return
    try:
        version = json.loads(path.read_text())["format"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CorruptStore(f"{path} is unreadable ({error}); is this an mqlog store?") from None
    if version != FORMAT_VERSION:
        raise CorruptStore(f"{path.parent} has format {version}; this mqlog reads format "
                           f"{FORMAT_VERSION}: upgrade mqlog")
