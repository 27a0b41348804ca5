"""Consumer groups' committed offsets, kept in the store (RocketMQ's consumerOffset.json,
Kafka's __consumer_offsets, for one embedded store).

A committed offset is the next offset the group will read from a queue (Kafka's
convention), so lag is ``max offset - committed offset``. Every commit rewrites the
``consumer_offsets`` file atomically (temporary file, fsync, rename, fsync of the
directory) with a CRC32C trailer before it returns: a commit that returned survives a
crash, and a torn file is never read. A damaged file is an error (CorruptStore), not an
empty one: silently resetting every group would re-deliver or skip messages. But it is
the error of the calls that need offsets (commit, committed offset, lag, groups) only:
the store still opens, read-only too, and everything else works (issue 14: a bad name
committed by an older version made every later open fail). The engine validates topic
and queue id as ``put`` does before a commit, so no such name gets in any more: a queue
that exists is accepted (as put writes it, whatever limits the store was reopened with),
a new one must fit ``topic_length_max`` and ``queue_id_max``.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

from mqlog.engine import checkpoint as cp
from mqlog.engine.files import typed_errors
from mqlog.errors import CorruptStore, InvalidArgument

_GROUP_CHARS = re.compile(r"[A-Za-z0-9._%|-]+")  # (fullmatch: "$" let a final newline in)


class ConsumerOffsets:
    """The committed offsets of every consumer group of one store."""

    def __init__(self, path: Path, group_name_length_max: int) -> None:
        self._path = path
        self._group_name_length_max = group_name_length_max
        self._lock = threading.Lock()
        offsets = cp.read_offsets(path)
        self._damage: CorruptStore | None = None
        if offsets is None:
            self._damage = CorruptStore(
                f"{path} is damaged, so consumer groups' committed offsets are unknown "
                "(the rest of the store works): restore it from a backup, or move it away "
                "to forget every group's offsets, then reopen the store")
        self._offsets = offsets or {}

    def _check_intact(self) -> None:
        if self._damage is not None:
            raise self._damage

    def commit(self, group: str, entries: dict[tuple[str, int], int]) -> None:
        """Record ``{(topic, queue id): next offset}`` for ``group``, durably."""
        self.check_group(group)
        self._check_intact()  # (a commit would overwrite what the damaged file holds)
        with self._lock:
            updated = dict(self._offsets)
            for (topic, queue_id), offset in entries.items():
                updated[(group, topic, queue_id)] = offset
            # DiskFull or TooManyOpenFiles (not a raw OSError) from any step of the write,
            # the rename and the directory's fsync included; the old file stays whole.
            with typed_errors(f"cannot commit {group}'s offsets"):
                cp.write_offsets(self._path, updated)
            self._offsets = updated

    def get(self, group: str, topic: str, queue_id: int) -> int | None:
        self._check_intact()
        return self._offsets.get((group, topic, queue_id))

    def of_group(self, group: str) -> dict[tuple[str, int], int]:
        self._check_intact()
        return {(topic, queue_id): offset for (name, topic, queue_id), offset
                in self._offsets.items() if name == group}

    def groups(self) -> list[str]:
        self._check_intact()
        return sorted({group for group, _, _ in self._offsets})

    def check_group(self, group: object) -> None:
        if not isinstance(group, str) or not 1 <= len(group) <= self._group_name_length_max:
            raise InvalidArgument(f"a consumer group name must be a str of 1.."
                                  f"{self._group_name_length_max} characters, got {group!r}")
        if not _GROUP_CHARS.fullmatch(group):
            raise InvalidArgument(f"consumer group {group!r} may use only letters, digits "
                                  "and . _ - % |")
