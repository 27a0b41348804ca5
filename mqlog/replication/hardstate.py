"""A Raft node's hard state — its term, its vote, and the group's membership changes that
are in its log — in one small file beside the store.

It must be durable before the node answers anyone (a vote given and forgotten in a crash
lets one term have two leaders), so each save writes a new file, syncs it, renames it over
the old one and syncs the directory. Membership changes live in the log as control
records; the file keeps where each one is, so a restart knows the group without scanning
the log, and a truncation knows which change to undo. One line, its CRC32C last, so a
damaged file is an error that names itself (docs/FORMAT.md)::

    mqlog-raft-state 2 <JSON: term, vote, memberships> <crc32c of the text before it, hex>
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crc32c import crc32c

from mqlog.errors import CorruptStore

FILE_NAME = "raft-state"
_MAGIC = "mqlog-raft-state 2"


@dataclass(frozen=True)
class Membership:
    """One configuration of the group; ``position`` is where its control record starts in
    the log (-1: the bootstrap configuration, from the node's own config)."""

    position: int
    voters: tuple[str, ...]
    learners: tuple[str, ...] = ()
    addresses: dict[str, str] = field(default_factory=dict)  # node id -> "host:port"

    def to_json(self) -> list[Any]:
        return [self.position, list(self.voters), list(self.learners), self.addresses]

    @classmethod
    def from_json(cls, value: Any) -> Membership:
        position, voters, learners, addresses = value
        return cls(int(position), tuple(voters), tuple(learners), dict(addresses))


@dataclass(frozen=True)
class HardState:
    term: int = 0
    vote: str = ""
    memberships: tuple[Membership, ...] = ()  # changes in the log, in log order


def load(directory: Path) -> HardState:
    """The hard state saved in ``directory``; an empty one if none was ever saved."""
    path = directory / FILE_NAME
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return HardState()
    body, _, crc = text.rpartition(" ")
    try:
        if not body.startswith(_MAGIC + " ") or crc != f"{crc32c(body.encode()):08x}":
            raise ValueError("bad magic or CRC")
        document = json.loads(body[len(_MAGIC) + 1:])
        return HardState(int(document["term"]), str(document["vote"]), tuple(
            Membership.from_json(item) for item in document["memberships"]))
    except (ValueError, KeyError, TypeError) as error:
        raise CorruptStore(f"{path} is damaged ({error}): this node's Raft term, vote and "
                           "membership are unknown; restore it from a backup, or wipe this "
                           "node's data and add it to the group again") from None


def save(directory: Path, state: HardState) -> None:
    """Write ``state`` durably (see the module docstring)."""
    document = {"term": state.term, "vote": state.vote,
                "memberships": [item.to_json() for item in state.memberships]}
    body = f"{_MAGIC} {json.dumps(document, separators=(',', ':'))}"
    temporary = directory / (FILE_NAME + ".tmp")
    with open(temporary, "w") as file:
        file.write(f"{body} {crc32c(body.encode()):08x}\n")
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, directory / FILE_NAME)
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
