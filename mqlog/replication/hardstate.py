"""A Raft node's hard state — its term, its vote, and the group's membership changes that
are in its log — in one small file beside the store; and a master-slave node's role
state — the role and epoch it last took by an operator's promotion or ``follow``, its
master or slaves — in another, which wins over the node's TOML on a restart (an old
master restarted with its own file must not come back as a master after a failover); and
the topic id of a controller-assigned partition's store (KIP-516's partition.metadata), so
that a broker that was away while the topic was deleted and created again does not take
the old store for the new partition's; and an ISR replica's high watermark (Kafka's
replication-offset-checkpoint), so that a restart does not hide committed records until
the ISR is large enough to move it again.

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
ROLE_FILE_NAME = "master-slave-state"
_ROLE_MAGIC = "mqlog-master-slave-state 1"
TOPIC_ID_FILE_NAME = "topic-id"
_TOPIC_ID_MAGIC = "mqlog-topic-id 1"
HIGH_WATERMARK_FILE_NAME = "high-watermark"
_HIGH_WATERMARK_MAGIC = "mqlog-high-watermark 1"


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


@dataclass(frozen=True)
class RoleState:
    """What a master-slave node last became: ``role`` in ``epoch``, a slave of ``master``
    or a master of ``slaves``."""

    role: str
    epoch: int
    master: str = ""
    slaves: tuple[str, ...] = ()


def load_role(directory: Path) -> RoleState | None:
    """The role state saved in ``directory``; None if no promotion or follow ever ran."""
    path = directory / ROLE_FILE_NAME
    try:
        document = _read(path, _ROLE_MAGIC)
    except FileNotFoundError:
        return None
    try:
        role, epoch, master = document["role"], document["epoch"], document["master"]
        slaves = tuple(document["slaves"])
        if role not in ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE") or not isinstance(epoch, int) \
                or not isinstance(master, str) or not all(isinstance(s, str) for s in slaves):
            raise ValueError(f"bad fields {document}")
        return RoleState(role, epoch, master, slaves)
    except (ValueError, KeyError, TypeError) as error:
        raise CorruptStore(f"{path} is damaged ({error}): the role this node last took is "
                           "unknown; ask `mqlog cluster status` which node is master, delete "
                           "the file and start the node as a SLAVE of it") from None


# How a node whose state is lost comes back. Not a wiped voter started as it was: it
# would vote with no memory of what it acknowledged, and a candidate lacking committed
# records could win with it (docs/REPLICATION.md, "A voter's data is its vote").
REJOIN = ("remove this node from the group's voters first (`mqlog cluster membership`, "
          "on the leader), then wipe its data, start it as a learner, and promote it once "
          "it has caught up")


def _read(path: Path, magic: str) -> Any:
    """The JSON document of a state file; CorruptStore if it is damaged."""
    raw = path.read_bytes()
    try:
        body, _, crc = raw.decode().strip().rpartition(" ")  # (not UTF-8: a ValueError)
        if not body.startswith(magic + " ") or crc != f"{crc32c(body.encode()):08x}":
            raise ValueError("bad magic or CRC")
        return json.loads(body[len(magic) + 1:])
    except ValueError as error:
        raise CorruptStore(f"{path} is damaged ({error}): restore it from a backup, or "
                           f"{REJOIN}") from None


def load(directory: Path) -> HardState:
    """The hard state saved in ``directory``; an empty one if none was ever saved."""
    path = directory / FILE_NAME
    try:
        document = _read(path, _MAGIC)
    except FileNotFoundError:
        return HardState()
    try:
        return HardState(int(document["term"]), str(document["vote"]), tuple(
            Membership.from_json(item) for item in document["memberships"]))
    except (ValueError, KeyError, TypeError) as error:
        raise CorruptStore(f"{path} is damaged ({error}): this node's Raft term, vote and "
                           f"membership are unknown; restore it from a backup, or {REJOIN}"
                           ) from None


def load_topic_id(directory: Path) -> int | None:
    """The topic id of the partition whose store ``directory`` is (KIP-516's
    partition.metadata); None if none was saved (a store from before ids, or no store)."""
    path = directory / TOPIC_ID_FILE_NAME
    try:
        document = _read(path, _TOPIC_ID_MAGIC)
    except FileNotFoundError:
        return None
    value = document.get("topic_id") if isinstance(document, dict) else None
    if type(value) is not int or value <= 0:
        raise CorruptStore(f"{path} is damaged (topic_id {value!r}): which topic this store "
                           "belongs to is unknown; delete the file if the topic was never "
                           "deleted and created again, else the store")
    return value


def save_topic_id(directory: Path, topic_id: int) -> None:
    _write(directory, TOPIC_ID_FILE_NAME, _TOPIC_ID_MAGIC, {"topic_id": topic_id})


def load_high_watermark(directory: Path) -> tuple[int, str]:
    """The high watermark an ISR replica saved in ``directory``, and what to tell the
    operator if the file could not be used ("" if it could, or there is none: 0). A
    damaged file is 0, not an error: a high watermark only lets readers see committed
    records sooner after a restart, and the ISR moves it again."""
    path = directory / HIGH_WATERMARK_FILE_NAME
    try:
        document = _read(path, _HIGH_WATERMARK_MAGIC)
    except FileNotFoundError:
        return 0, ""
    except (CorruptStore, OSError) as error:
        return 0, f"ignored its saved high watermark: {error}"
    value = document.get("high_watermark") if isinstance(document, dict) else None
    if type(value) is not int or value < 0:
        return 0, f"ignored its saved high watermark: {path} holds {value!r}"
    return value, ""


def save_high_watermark(directory: Path, high_watermark: int, sync: bool = False) -> None:
    """Replace the saved high watermark; not synced unless ``sync``: a crash may leave an
    older one (or none), still a committed position while the high watermark only
    grows; the CRC tells a torn one. (One that went down is saved with ``sync``.)"""
    _write(directory, HIGH_WATERMARK_FILE_NAME, _HIGH_WATERMARK_MAGIC,
           {"high_watermark": high_watermark}, sync=sync)


def save(directory: Path, state: HardState | RoleState) -> None:
    """Write ``state`` durably (see the module docstring): a Raft HardState, or a
    master-slave RoleState, each to its own file."""
    if isinstance(state, RoleState):
        _write(directory, ROLE_FILE_NAME, _ROLE_MAGIC,
               {"role": state.role, "epoch": state.epoch, "master": state.master,
                "slaves": list(state.slaves)})
    else:
        _write(directory, FILE_NAME, _MAGIC,
               {"term": state.term, "vote": state.vote,
                "memberships": [item.to_json() for item in state.memberships]})


def _write(directory: Path, name: str, magic: str, document: dict[str, Any],
           sync: bool = True) -> None:
    body = f"{magic} {json.dumps(document, separators=(',', ':'))}"
    temporary = directory / (name + ".tmp")
    with open(temporary, "w") as file:
        file.write(f"{body} {crc32c(body.encode()):08x}\n")
        file.flush()
        if sync:
            os.fsync(file.fileno())
    os.replace(temporary, directory / name)
    if not sync:
        return
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
