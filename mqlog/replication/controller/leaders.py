"""The leaders of Raft-layer partitions, as the brokers that lead them report them.

Why not records. A Raft partition elects its own leaders: its term is the authority on
who leads, and the controller decides nothing about it (DESIGN §5.2; Kafka's KRaft does
the same for its own metadata partition, whose leader is never a record). So a Raft
partition's leader is a report, not a metadata change: a broker that leads a Raft
partition group says so, with the group's term, in every heartbeat; the controller
leader keeps what it was told here, in memory, and writes no record — a log of metadata
records would otherwise grow by one record per election of any partition. The
``leader``/``leader_epoch`` of a Raft partition in ``ClusterMetadata`` stay what the
CreateTopic record gave (the first replica, epoch 0: "the preferred leader, not yet
heard from"); what clients and ``mqlog topics describe`` see is that state with these
reports laid over it (``overlay``).

The rule. For a partition, the report with the higher term wins; a report of an equal
term names the same broker (Raft has at most one leader per term), and one that does not
is ignored and counted. So merging reports is commutative and idempotent: the order in
which heartbeats (or pulls, below) arrive changes nothing, and a report can be merged
twice. A report is taken only from a broker that is a replica of a Raft partition that
exists; a leader whose broker is fenced (or unregistered) is shown as no leader (``""``)
with its term, until a newer term is reported: a dead broker's old leadership is not a
place to send writes.

What is lost, and why that is fine. A new controller leader starts with no reports and
has every leader within one ``broker_heartbeat_interval_ms``; until then the overlay
shows what the records say. A leader that steps down without a successor keeps its entry
until a newer term is reported. Both are hints, never promises: a client that reaches a
broker that does not lead is answered NotLeader (naming the leader when it knows it), and
follows.

Brokers learn them too. The heartbeat's answer carries the entries changed since what
the broker last saw (``changes_since(token, seq)``: ``token`` names this controller's
table, ``seq`` counts its changes; another table, or a seq it never reached, gets every
entry); the broker's agent merges them into its own ``LeaderTable`` by the same rule, so
a ``cluster_metadata`` answer from any broker carries them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from mqlog.errors import InvalidArgument
from mqlog.replication.controller.state import ClusterMetadata

Key = tuple[str, int]  # (topic, partition)


class LeaderTable:
    """(topic, partition) -> (leader broker, Raft term), merged by the rule above."""

    def __init__(self, token: str = "") -> None:
        self.token = token  # names this table's changes (a controller leader's: id:term)
        self.seq = 0  # changes made, the last one's number
        self.conflicts = 0  # equal terms naming two brokers (ignored; Raft forbids them)
        self._entries: dict[Key, tuple[str, int, int]] = {}  # -> (leader, term, seq)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, topic: str, partition: int) -> tuple[str, int] | None:
        found = self._entries.get((topic, partition))
        return None if found is None else (found[0], found[1])

    def merge(self, topic: str, partition: int, leader: str, term: int) -> bool:
        """Take one report; return whether it changed the table."""
        known = self._entries.get((topic, partition))
        if known is not None:
            if term < known[1] or (term == known[1] and leader == known[0]):
                return False
            if term == known[1]:
                self.conflicts += 1
                return False
        self.seq += 1
        self._entries[(topic, partition)] = (leader, term, self.seq)
        return True

    def report(self, state: ClusterMetadata, broker_id: str,
               leads: dict[Key, int]) -> int:
        """``broker_id`` leads the Raft partitions ``leads`` (-> its term); the reports of a
        partition it does not replicate (or that is not Raft, or gone) are ignored.
        Return how many changed the table."""
        changed = 0
        for (topic, partition), term in leads.items():
            info = state.topics.get(topic)
            if info is None or info.layer != "raft" or \
                    not 0 <= partition < len(info.partitions) or \
                    broker_id not in info.partitions[partition].replicas:
                continue
            changed += self.merge(topic, partition, broker_id, term)
        return changed

    def changes_since(self, token: Any, seq: Any) -> dict[str, Any]:
        """The entries a broker that saw (token, seq) lacks: {token, seq, leaders}."""
        fresh = token == self.token and isinstance(seq, int) and 0 <= seq <= self.seq
        since = seq if fresh else 0
        leaders = [[topic, partition, leader, term]
                   for (topic, partition), (leader, term, at) in sorted(self._entries.items())
                   if at > since]
        return {"token": self.token, "seq": self.seq, "leaders": leaders}

    def merge_all(self, leaders: Iterable[Any]) -> None:
        for topic, partition, leader, term in leaders:
            self.merge(topic, partition, leader, term)

    def prune(self, state: ClusterMetadata) -> None:
        """Forget the partitions that are no longer Raft partitions of ``state``."""
        for key in list(self._entries):
            info = state.topics.get(key[0])
            if info is None or info.layer != "raft" or key[1] >= len(info.partitions):
                del self._entries[key]

    def entries(self) -> list[list[Any]]:
        """[[topic, partition, leader, term], ...], sorted (an answer's ``leaders``)."""
        return [[topic, partition, leader, term]
                for (topic, partition), (leader, term, _) in sorted(self._entries.items())]

    def overlay(self, state: ClusterMetadata) -> ClusterMetadata:
        """``state`` with each reported Raft partition's leader and leader epoch (the
        term) laid over its recorded ones; a fenced leader shows as none."""
        topics = dict(state.topics)
        for (topic, partition), (leader, term, _) in self._entries.items():
            info = topics.get(topic)
            if info is None or info.layer != "raft" or partition >= len(info.partitions):
                continue
            broker = state.brokers.get(leader)
            shown = leader if broker is not None and not broker.fenced else ""
            parts = list(info.partitions)
            parts[partition] = replace(parts[partition], leader=shown, leader_epoch=term)
            topics[topic] = replace(info, partitions=tuple(parts))
        return replace(state, topics=MappingProxyType(topics))


def leads_from(value: Any, state: ClusterMetadata | None = None) -> dict[Key, int]:
    """A heartbeat's ``leads``: [[topic, partition, term(, topic id)], ...] ->
    {(topic, partition): term} (garbage from a peer is InvalidArgument). A lead whose
    topic id is not that of ``state``'s topic of the name is left out: the broker still
    leads the partition of a topic deleted since (its term must not stand for the
    partition of the topic created again under the name)."""
    if value is None:
        return {}
    if not isinstance(value, list):
        raise InvalidArgument(f"leads must be a list of [topic, partition, term], got "
                              f"{type(value).__name__}")
    found: dict[Key, int] = {}
    for item in value:
        if not (isinstance(item, list | tuple) and len(item) in (3, 4) and
                isinstance(item[0], str) and all(_count(part) for part in item[1:])):
            raise InvalidArgument(f"a lead is [topic, partition, term] and maybe a topic id "
                                  f"(a name and non-negative ints), got {item!r}")
        if state is not None and len(item) == 4 and state.other_topic(item[0], item[3]):
            continue
        found[(item[0], item[1])] = item[2]
    return found


def leaders_from(value: Any) -> list[tuple[str, int, str, int]]:
    """An answer's ``leaders``: [[topic, partition, leader, term], ...], checked."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidArgument(f"leaders must be a list, got {type(value).__name__}")
    found = []
    for item in value:
        if not (isinstance(item, list | tuple) and len(item) == 4 and isinstance(item[0], str)
                and isinstance(item[2], str) and _count(item[1]) and _count(item[3])):
            raise InvalidArgument(f"a leader is [topic, partition, broker, term], got {item!r}")
        found.append((item[0], item[1], item[2], item[3]))
    return found


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63
