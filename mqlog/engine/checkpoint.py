"""The checkpoint, the epoch file and the store's small metadata files.

The checkpoint names a position from which crash recovery may scan: every record
before it was flushed, and so were the consume-queue entries of those records. It is
written only after both flushes, atomically (temporary file, fsync, rename, fsync of the
directory), and carries a CRC32C; a damaged or missing checkpoint means "scan from the
first segment". At a clean close it also records where the log ends.

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
