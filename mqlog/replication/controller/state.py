"""``ClusterMetadata``: the cluster's metadata as a pure fold of committed metadata records.

``state.apply(record)`` checks the record against the state and returns a new state; the
old one is unchanged (every ClusterMetadata is immutable: frozen dataclasses, tuples, and
read-only mappings, rebuilt on apply, never edited). So ``fold(records)`` is a function of
the records alone: every controller that folds the same committed log holds the same
state, folding a prefix and then the rest gives what folding everything gives, and a
state written as a ``Snapshot`` record and folded back is the same state (tests check
all three with Hypothesis).

Validation is the fold's own: a record that does not follow from the state (a broker
epoch that is not newer, a decision about an older registration, a topic that exists or
does not, a replica that is not a registered broker, a partition change made from a stale
partition epoch, a leader outside the ISR) raises ``MetadataChangeRefused`` and changes
nothing. The controller's leader runs the same check before it proposes a record, against
its committed state plus its own proposals still in flight, so a record that reaches the
log always applies; a controller that replays one that does not (a bug) skips it on every
replica alike, and says so.

``position`` is where the last folded record ends in the controller's log (the commit-log
position: the same on every replica, unlike queue offsets, which a replica that started
its log over at the leader's log start would number afresh). Brokers pull "records since
position P".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from mqlog.errors import MetadataChangeRefused
from mqlog.replication.controller.records import (
    LAYERS,
    BrokerInfo,
    CreateTopic,
    DeleteTopic,
    FenceBroker,
    PartitionChange,
    PartitionInfo,
    Record,
    RegisterBroker,
    Snapshot,
    TopicInfo,
    UnfenceBroker,
)

NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,127}")  # a topic or broker id: a safe file name
# ... except these, which the pattern lets through but which name directories: a
# partition's store directory is named after its topic, and the store refuses them
# (engine/store.py _validate_queue), so a topic of such a name could never take a record
DIRECTORY_NAMES = (".", "..")


def _frozen(mapping: dict) -> Mapping:
    return MappingProxyType(mapping)


@dataclass(frozen=True)
class ClusterMetadata:
    brokers: Mapping[str, BrokerInfo] = field(default_factory=lambda: _frozen({}))
    topics: Mapping[str, TopicInfo] = field(default_factory=lambda: _frozen({}))
    position: int = 0  # the end of the last record folded, in the controller's log

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClusterMetadata) and self.position == other.position \
            and dict(self.brokers) == dict(other.brokers) \
            and dict(self.topics) == dict(other.topics)

    def __hash__(self) -> int:
        return hash(self.position)

    @property
    def empty(self) -> bool:
        return not self.brokers and not self.topics

    # --- the fold ----------------------------------------------------------------------

    def apply(self, record: Record, position: int | None = None) -> ClusterMetadata:
        """The state after ``record`` (which ends at ``position`` in the log, if given)."""
        after = _APPLY[type(record)](self, record)
        return after if position is None else replace(after, position=position)

    def check(self, record: Record) -> None:
        """Raise MetadataChangeRefused unless ``record`` applies to this state."""
        self.apply(record)

    def snapshot(self) -> Snapshot:
        """This state as one record (brokers and topics sorted by name)."""
        return Snapshot(tuple(self.brokers[name] for name in sorted(self.brokers)),
                        tuple(self.topics[name] for name in sorted(self.topics)))

    # --- reading -----------------------------------------------------------------------

    def other_topic(self, name: Any, topic_id: Any) -> bool:
        """Whether ``topic_id`` (a broker's word about a partition of topic ``name``) is
        another topic's than the one of that name here: a deleted topic's, whose
        partitions a broker hosts until it folds the deletion (KIP-516). A topic from
        before ids, or one not here, says nothing: False."""
        info = self.topics.get(name) if isinstance(name, str) else None
        return info is not None and info.topic_id != 0 and topic_id != info.topic_id

    def partition(self, topic: str, index: int) -> PartitionInfo:
        info = self.topics.get(topic)
        if info is None:
            raise MetadataChangeRefused(f"no topic {topic!r}: `mqlog topics list` shows "
                                        "the topics there are")
        if not 0 <= index < len(info.partitions):
            raise MetadataChangeRefused(f"topic {topic!r} has partitions 0.."
                                        f"{len(info.partitions) - 1}, not {index}")
        return info.partitions[index]

    def live_brokers(self) -> list[str]:
        """Registered brokers that are not fenced, sorted."""
        return sorted(name for name, info in self.brokers.items() if not info.fenced)

    def describe(self) -> str:
        """The state as text: the datadriven tests and ``mqlog topics describe`` print it."""
        lines = [f"position={self.position}", "brokers:" if self.brokers else "brokers: -"]
        for name in sorted(self.brokers):
            info = self.brokers[name]
            lines.append(f"  {name} epoch={info.broker_epoch} address={info.address}"
                         + (f" rack={info.rack}" if info.rack else "")
                         + (" unclean_shutdown" if info.unclean_shutdown else "")
                         + (" data_lost" if info.data_lost else "")
                         + (" fenced" if info.fenced else " live"))
        lines.append("topics:" if self.topics else "topics: -")
        for name in sorted(self.topics):
            lines += describe_topic(self.topics[name])
        return "\n".join(lines)


def describe_topic(topic: TopicInfo) -> list[str]:
    lines = [f"  {topic.name} layer={topic.layer} partitions={len(topic.partitions)}"
             + (f" min_insync_replicas={topic.min_insync_replicas}"
                if topic.min_insync_replicas else "")]
    for index, part in enumerate(topic.partitions):
        # (a Raft partition has no ISR: a majority of its replicas, its voters, commits;
        # its metadata's isr is the replicas, whatever brokers are fenced)
        sets = "" if topic.layer == "raft" else f" isr={_names(part.isr)} elr={_names(part.elr)}"
        lines.append(f"    {index} leader={part.leader or '-'} leader_epoch={part.leader_epoch}"
                     f" partition_epoch={part.partition_epoch} replicas={_names(part.replicas)}"
                     + sets
                     + (f" unclean=epoch:{part.unclean[0]},lost:[{part.unclean[1]},"
                        f"{part.unclean[2]})" if part.unclean else ""))
    return lines


def _names(names: tuple[str, ...]) -> str:
    return ",".join(names) or "-"


def fold(records: Iterable[Record | tuple[Record, int]],
         state: ClusterMetadata | None = None) -> ClusterMetadata:
    """Fold ``records`` (each alone, or with the position where it ends) into ``state``."""
    state = state or ClusterMetadata()
    for item in records:
        state = state.apply(*item) if isinstance(item, tuple) else state.apply(item)
    return state


# --- one function per record type: check, then build the new state ---------------------


def _refuse(text: str) -> MetadataChangeRefused:
    return MetadataChangeRefused(text)


def _check_name(kind: str, name: str) -> None:
    if not NAME_PATTERN.fullmatch(name):
        raise _refuse(f"{kind} {name!r} is not a valid name: 1 to 127 of A-Z a-z 0-9 . _ -")
    if name in DIRECTORY_NAMES:
        raise _refuse(f"{kind} {name!r} is not a valid name: '.' and '..' name directories, "
                      "not files (a store refuses them)")


def _register(state: ClusterMetadata, record: RegisterBroker) -> ClusterMetadata:
    _check_name("broker id", record.broker_id)
    if not record.address:
        raise _refuse(f"broker {record.broker_id} registers without an address")
    if record.groups_max < 0:
        raise _refuse(f"broker {record.broker_id} registers with groups_max "
                      f"{record.groups_max}: not a count")
    known = state.brokers.get(record.broker_id)
    if record.broker_epoch < 0 or (known is not None
                                   and record.broker_epoch <= known.broker_epoch):
        raise _refuse(f"broker {record.broker_id} registers with broker epoch "
                      f"{record.broker_epoch}, not newer than its last "
                      f"{known.broker_epoch if known else -1}: a stale registration")
    info = BrokerInfo(record.broker_id, record.broker_epoch, record.address, record.rack,
                      fenced=True,  # fenced until it heartbeats (Kafka's rule)
                      incarnation=record.incarnation,
                      unclean_shutdown=record.unclean_shutdown,
                      groups_max=record.groups_max, data_lost=record.data_lost)
    return replace(state, brokers=_frozen({**state.brokers, record.broker_id: info}))


def _fencing(fenced: bool) -> Callable[[ClusterMetadata, Any], ClusterMetadata]:
    def apply(state: ClusterMetadata, record: FenceBroker | UnfenceBroker) -> ClusterMetadata:
        verb = "fence" if fenced else "unfence"
        known = state.brokers.get(record.broker_id)
        if known is None:
            raise _refuse(f"cannot {verb} broker {record.broker_id}: it never registered")
        if known.broker_epoch != record.broker_epoch:
            raise _refuse(f"cannot {verb} broker {record.broker_id} at broker epoch "
                          f"{record.broker_epoch}: it registered again (epoch "
                          f"{known.broker_epoch}); the decision is stale")
        if known.fenced == fenced:
            raise _refuse(f"broker {record.broker_id} is already {verb}d")
        # (unfenced, it is a replica like any other again: its log is what it reports)
        info = replace(known, fenced=fenced,
                       unclean_shutdown=known.unclean_shutdown and fenced,
                       data_lost=known.data_lost and fenced)
        return replace(state, brokers=_frozen({**state.brokers, record.broker_id: info}))
    return apply


def _check_replicas(state: ClusterMetadata, where: str, replicas: tuple[str, ...]) -> None:
    if not replicas:
        raise _refuse(f"{where} has no replicas")
    if len(set(replicas)) != len(replicas):
        raise _refuse(f"{where} names a broker twice: {_names(replicas)}")
    unknown = [name for name in replicas if name not in state.brokers]
    if unknown:
        raise _refuse(f"{where} names brokers that never registered: {_names(tuple(unknown))}")


def _create(state: ClusterMetadata, record: CreateTopic) -> ClusterMetadata:
    _check_name("topic", record.name)
    if record.name in state.topics:
        raise _refuse(f"topic {record.name!r} exists already (delete it first)")
    if record.layer not in LAYERS:
        raise _refuse(f"layer {record.layer!r} is not one of {', '.join(LAYERS)}")
    if not record.assignment:
        raise _refuse(f"topic {record.name!r} needs at least one partition")
    factors = {len(replicas) for replicas in record.assignment}
    if len(factors) != 1:
        raise _refuse(f"topic {record.name!r}: partitions of different replication factors")
    factor = factors.pop()
    if record.min_insync_replicas and (record.layer != "isr" or
                                       not 1 <= record.min_insync_replicas <= factor):
        raise _refuse(f"topic {record.name!r}: min_insync_replicas "
                      f"{record.min_insync_replicas} must be 1..{factor} (its replication "
                      "factor), and only an isr topic has one")
    partitions = []
    for index, replicas in enumerate(record.assignment):
        _check_replicas(state, f"partition {index} of {record.name!r}", replicas)
        partitions.append(PartitionInfo(replicas, replicas[0], 0, 0, replicas, ()))
    topic = TopicInfo(record.name, record.layer, tuple(partitions),
                      record.min_insync_replicas, record.topic_id)
    return replace(state, topics=_frozen({**state.topics, record.name: topic}))


def _delete(state: ClusterMetadata, record: DeleteTopic) -> ClusterMetadata:
    if record.name not in state.topics:
        raise _refuse(f"no topic {record.name!r} to delete")
    return replace(state, topics=_frozen({name: info for name, info in state.topics.items()
                                          if name != record.name}))


def _change(state: ClusterMetadata, record: PartitionChange) -> ClusterMetadata:
    current, topic = state.partition(record.topic, record.partition), \
        state.topics[record.topic]
    where = f"partition {record.partition} of {record.topic!r}"
    if record.layer != topic.layer:
        raise _refuse(f"{where} is of layer {topic.layer}, not {record.layer}")
    if record.partition_epoch != current.partition_epoch + 1:
        raise _refuse(f"{where} is at partition epoch {current.partition_epoch}: a change to "
                      f"epoch {record.partition_epoch} was made from a stale view")
    _check_replicas(state, where, record.replicas)
    if not set(record.isr) <= set(record.replicas) or \
            not set(record.elr) <= set(record.replicas) or set(record.isr) & set(record.elr):
        raise _refuse(f"{where}: ISR {_names(record.isr)} and ELR {_names(record.elr)} must "
                      f"be disjoint sets of its replicas {_names(record.replicas)}")
    if record.leader and record.leader not in record.isr:
        raise _refuse(f"{where}: leader {record.leader} is not in the ISR {_names(record.isr)}")
    moved = record.leader != current.leader
    if record.leader_epoch < current.leader_epoch + (1 if moved else 0):
        raise _refuse(f"{where}: leader epoch {record.leader_epoch} after "
                      f"{current.leader_epoch}" + (" with a new leader" if moved else ""))
    if record.unclean and (len(record.unclean) != 3 or record.unclean[0] !=
                           record.leader_epoch or not 0 <= record.unclean[1] <=
                           record.unclean[2]):
        raise _refuse(f"{where}: an unclean election's range {list(record.unclean)} is not "
                      f"[leader epoch {record.leader_epoch}, from, to] with from <= to")
    new = PartitionInfo(record.replicas, record.leader, record.leader_epoch,
                        record.partition_epoch, record.isr, record.elr,
                        record.unclean or current.unclean)
    partitions = tuple(new if index == record.partition else part
                       for index, part in enumerate(topic.partitions))
    topics = {**state.topics, record.topic: replace(topic, partitions=partitions)}
    return replace(state, topics=_frozen(topics))


def _restore(state: ClusterMetadata, record: Snapshot) -> ClusterMetadata:
    brokers = {info.broker_id: info for info in record.brokers}
    topics = {info.name: info for info in record.topics}
    if len(brokers) != len(record.brokers) or len(topics) != len(record.topics):
        raise _refuse("a snapshot names a broker or a topic twice")
    restored = ClusterMetadata(_frozen(brokers), _frozen(topics), state.position)
    if not state.empty and restored != state:
        raise _refuse("a snapshot that disagrees with the records before it")
    return restored


_APPLY: dict[type, Callable[[ClusterMetadata, Any], ClusterMetadata]] = {
    RegisterBroker: _register, FenceBroker: _fencing(True), UnfenceBroker: _fencing(False),
    CreateTopic: _create, DeleteTopic: _delete, PartitionChange: _change, Snapshot: _restore}
