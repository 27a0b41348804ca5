"""What the controller decides, as pure functions of ``ClusterMetadata`` (and a seeded
``random.Random``): where a new topic's replicas go, and what fencing a broker changes.

Replica assignment is Kafka's rack-unaware one (``assignReplicasToBrokers``): brokers
sorted; a random start index and a random shift, both drawn from the seeded RNG;
partition p's first replica (its preferred leader) is broker ``(p + start) % n`` — so
leaders go round-robin over the brokers — and its j-th follower is
``(first + 1 + (shift + j) % (n - 1)) % n``: the next brokers, the shift growing by one
after every n partitions so that followers do not always pair with the same leader.

Fencing a broker. Raft-layer partitions need nothing: the Raft group elects a new leader
on its own, and the controller's ``leader`` field for them is only what was last
reported. ISR-layer partitions follow isr/decisions.py (KIP-966): the broker leaves the
ISR (to the ELR when the ISR falls below min_insync_replicas), and if it led, the first
live ISR member in replica order leads, else the first live ELR member, else (only with
unclean_leader_election) any live replica, with the leader epoch bumped; none of them:
no leader (``""``) until an eligible broker is unfenced (``unfence_changes``).
Master-slave groups move only with ``auto_failover``, and only to a slave that is in
sync and holds at least what every other in-sync replica reported (epoch, then position):
never to one behind (RocketMQ 5's controller).
The slave promoted must have reported since the master was fenced (``fresh``: a slave's log
stops growing once its master is gone; a report sent before may be short of what it
acknowledged since), so a fence and its promotion are usually two steps. So must every
live replica that reports the group at all (a slave out of the sync set may have caught
up and acknowledged writes since the set was last changed), and every other replica's
newest report, fresh or not, is a floor of what it holds: one above the candidate's makes
the group wait.

The sync state set (RocketMQ 5's SyncStateSet, Kafka's ISR) of a master-slave group is the
master's to change: its broker reports the slaves its core counts in sync, and
``sync_state_change`` turns that into a PartitionChange when the broker leads the
partition in the metadata and names the partition epoch the metadata holds (a report from
a master that was replaced, or made from a view older than the last change, is stale and
changes nothing; RocketMQ's controller checks its syncStateSetEpoch the same way). The
master stays in its set; the set is ordered as the replicas are.

Leader balancing (Kafka's auto.leader.rebalance.enable). Leaders gather on the brokers
that stayed up: every failure moves leaderships away, nothing moves them back. Each
partition's first replica is its preferred leader, and the assignment spreads first
replicas evenly, so handing partitions back to their preferred leaders spreads the
leaders again. ``imbalanced`` is Kafka's per-broker check: for each live broker, the
share of the partitions it is preferred for that another broker leads; above
``leader_imbalance_per_broker_percentage`` percent, each of those partitions goes back —
an ISR partition only while its preferred replica is in the ISR (isr/decisions.py,
``elect_preferred``), a Raft partition by a transfer its current (reported) leader is
asked for in its next heartbeat answer (the Raft group moves its own leader; the
controller only asks). Master-slave groups are left alone: moving a master is a
promotion, the operator's or a failover's.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from mqlog.errors import MetadataChangeRefused
from mqlog.replication.controller.records import PartitionChange, PartitionInfo
from mqlog.replication.controller.state import ClusterMetadata
from mqlog.replication.isr import decisions as isr_decisions
from mqlog.replication.isr.core import PartitionState
from mqlog.replication.isr.decisions import fence_isr, unfence_isr

# A deliberately broken decision, so the tests show they notice it: "promote_behind"
# promotes the in-sync slave that reported the least; isr/decisions.py's breaks (an ISR
# election outside the ISR and ELR) are caught by the ISR simulator.
TEST_BREAKS = ("promote_behind", *isr_decisions.TEST_BREAKS)


def assign_replicas(brokers: list[str], partitions: int, replication_factor: int,
                    rng: random.Random) -> tuple[tuple[str, ...], ...]:
    """Kafka's assignment of ``partitions`` × ``replication_factor`` replicas to brokers."""
    names = sorted(brokers)
    count = len(names)
    if partitions < 1:
        raise MetadataChangeRefused(f"a topic needs at least one partition, not {partitions}")
    if not 1 <= replication_factor <= count:
        raise MetadataChangeRefused(
            f"replication factor {replication_factor} needs that many live brokers; "
            f"{count} are live ({', '.join(names) or 'none'}): start more brokers or "
            "ask for fewer replicas")
    start, shift = rng.randrange(count), rng.randrange(count)
    assignment = []
    for partition in range(partitions):
        if partition > 0 and partition % count == 0:
            shift += 1
        first = (partition + start) % count
        replicas = [names[first]]
        for j in range(replication_factor - 1):
            replicas.append(names[(first + 1 + (shift + j) % (count - 1)) % count])
        assignment.append(tuple(replicas))
    return tuple(assignment)


def place_replicas(state: ClusterMetadata, partitions: int, replication_factor: int,
                   rng: random.Random, hosted_besides: dict[str, int] | None = None,
                   ) -> tuple[tuple[str, ...], ...]:
    """``assign_replicas`` over the live brokers with room for another group: a broker
    that registered its ``groups_max`` (its room beside its config file's groups) hosts
    at most that many (its partitions' replicas, and ``hosted_besides``: the controller's
    group on a combined broker). A topic whose share of a broker would pass it is
    refused, naming the broker — hosted, it would have failed there, and its partitions
    there would never have had a replica."""
    hosted = dict(hosted_besides or {})
    for topic in state.topics.values():
        for part in topic.partitions:
            for name in part.replicas:
                hosted[name] = hosted.get(name, 0) + 1
    live = state.live_brokers()
    room = {name: state.brokers[name].groups_max - hosted.get(name, 0)
            for name in live if state.brokers[name].groups_max}
    eligible = [name for name in live if room.get(name, 1) > 0]
    full = sorted(set(live) - set(eligible))
    if full and replication_factor > len(eligible):
        raise MetadataChangeRefused(
            f"replication factor {replication_factor} needs that many brokers with room for "
            f"another group; {len(eligible)} have it, and {', '.join(full)} host their "
            "groups_max already: raise their groups_max, start more brokers, or delete "
            "topics")
    assignment = assign_replicas(eligible, partitions, replication_factor, rng)
    placed: dict[str, int] = {}
    for replicas in assignment:
        for name in replicas:
            placed[name] = placed.get(name, 0) + 1
    for name, count in sorted(placed.items()):
        if name in room and count > room[name]:
            raise MetadataChangeRefused(
                f"{partitions} partitions of {replication_factor} replicas would place "
                f"{count} groups on broker {name}, which has room for {room[name]} more "
                f"(groups_max={state.brokers[name].groups_max}, hosting "
                f"{hosted.get(name, 0)}): raise its groups_max, start more brokers, or "
                "create fewer partitions")
    return assignment


def fence_changes(state: ClusterMetadata, broker_id: str, auto_failover: bool,
                  reported: dict[tuple[str, int], dict[str, tuple[int, int]]] | None = None,
                  *, min_insync_replicas: int = 1, unclean: bool = False,
                  test_break: str = "",
                  fresh: dict[tuple[str, int], set[str]] | None = None,
                  ) -> list[PartitionChange]:
    """The partition changes that fencing ``broker_id`` calls for (see the docstring).

    ``reported[(topic, partition)][broker]`` is (epoch, position) of that replica's log
    as its broker last reported it (master-slave failover needs it); ``fresh`` names the
    brokers whose report came after the fence (None: every report did). ISR partitions
    follow isr/decisions.py (``min_insync_replicas`` for the ELR, unless the topic has its
    own; ``unclean``)."""
    changes = []
    fenced = {name for name, info in state.brokers.items() if info.fenced} | {broker_id}
    for name in sorted(state.topics):
        topic = state.topics[name]
        for index, part in enumerate(topic.partitions):
            if broker_id not in part.replicas or topic.layer == "raft":
                continue
            if topic.layer == "isr":
                ends = (reported or {}).get((name, index), {})
                decided = fence_isr(PartitionState.of(part), broker_id, fenced,
                                    topic.min_insync_replicas or min_insync_replicas,
                                    unclean, test_break, ends)
                info = state.brokers.get(broker_id)
                if info is not None and info.unclean_shutdown:
                    decided = leave_elr(PartitionState.of(part), broker_id, decided,
                                        last_too=info.data_lost)
                if decided is not None:
                    changes.append(isr_change(name, index, decided[0],
                                              lost_range(decided, ends)))
                continue
            change = None
            if auto_failover and part.leader == broker_id:
                where = (name, index)
                found = (reported or {}).get(where, {})
                change = _promotion(part, broker_id, fenced, found, test_break,
                                    set(found) if fresh is None else fresh.get(where, set()))
            if change is not None:
                replicas, leader, leader_epoch, isr = change
                changes.append(PartitionChange(name, index, part.partition_epoch + 1,
                                               replicas, leader, leader_epoch, isr, part.elr,
                                               topic.layer))
    return changes


def unfence_changes(state: ClusterMetadata, broker_id: str, *, min_insync_replicas: int = 1,
                    unclean: bool = False,
                    reported: dict[tuple[str, int], dict[str, tuple[int, int]]] | None = None,
                    ) -> list[PartitionChange]:
    """The leaderless ISR partitions that ``broker_id``, back, may lead (isr/decisions.py;
    ``reported`` as fence_changes' says what an unclean election may lose)."""
    fenced = {name for name, info in state.brokers.items() if info.fenced}
    changes = []
    for name in sorted(state.topics):
        topic = state.topics[name]
        if topic.layer != "isr":
            continue
        for index, part in enumerate(topic.partitions):
            ends = (reported or {}).get((name, index), {})
            decided = unfence_isr(PartitionState.of(part), broker_id, fenced,
                                  topic.min_insync_replicas or min_insync_replicas, unclean,
                                  ends)
            if decided is not None:
                changes.append(isr_change(name, index, decided[0],
                                          lost_range(decided, ends)))
    return changes



def leave_elr(current: PartitionState, broker_id: str,
              decided: tuple[PartitionState, str] | None,
              last_too: bool = False) -> tuple[PartitionState, str] | None:
    """``decided`` (fence_isr's, or None: no change) with ``broker_id`` out of the ELR: it
    registered after an unclean shutdown (KIP-966), so its log may lack records it had
    acknowledged, and it must not be elected before a replica that holds every committed
    record. Unless no other is eligible (the ISR empty, the ELR only it): then it stays,
    the last copy there is (KIP-966's unclean recovery elects the last known ELR member
    too), rather than leave the partition without a leader for good. ``last_too``: it
    goes even then — its data_dir was wiped, so it holds no copy at all, and electing it
    would lose every record as if cleanly (only an unclean election may, and says so)."""
    base = current if decided is None else decided[0]
    rest = tuple(name for name in base.elr if name != broker_id)
    if broker_id not in base.elr or not (rest or base.isr or last_too):
        return decided
    if decided is None:
        return dataclasses.replace(current, elr=rest,
                                   partition_epoch=current.partition_epoch + 1), ""
    return dataclasses.replace(decided[0], elr=rest), decided[1]


def isr_change(topic: str, index: int, state: PartitionState,
               unclean: tuple[int, ...] = ()) -> PartitionChange:
    """The record of an ISR partition's new state."""
    return PartitionChange(topic, index, state.partition_epoch, state.replicas, state.leader,
                           state.leader_epoch, state.isr, state.elr, "isr", unclean)


def lost_range(decided: tuple[PartitionState, str],
               reported: dict[str, tuple[int, int]]) -> tuple[int, ...]:
    """What an unclean election may lose (() for any other): (its leader epoch, the new
    leader's log end, the largest log end another replica reported). The reports are a
    heartbeat old at most, so the range is what the controller knew, not a bound: the
    old ISR may have written more since (``topics describe`` says "possibly lost")."""
    state, how = decided
    if how != "unclean":
        return ()
    have = reported.get(state.leader, (0, 0))[1]
    knew = max((position for name, (_, position) in reported.items()
                if name != state.leader), default=have)
    return (state.leader_epoch, have, max(have, knew))


Change = tuple[tuple[str, ...], str, int, tuple[str, ...]]


def _promotion(part: PartitionInfo, broker_id: str, fenced: set[str],
               reported: dict[str, tuple[int, int]], test_break: str,
               fresh: set[str]) -> Change | None:
    """The in-sync slave to promote, or None when none may be (the group waits without a
    master rather than lose acknowledged writes)."""
    candidates = [name for name in part.isr if name != broker_id and name not in fenced
                  and name in fresh and name in reported]
    if not candidates or any(name in reported and name not in fresh for name in part.replicas
                             if name != broker_id and name not in fenced):
        return None  # (a live replica has not said how far it got since: wait for it)
    pick = min if test_break == "promote_behind" else max
    best = pick(candidates, key=lambda name: (reported[name], -part.replicas.index(name)))
    if test_break != "promote_behind" and any(
            reported[name] > reported[best] for name in part.replicas
            if name in reported and name != broker_id):
        return None  # another slave (fenced, or out of sync) holds more: wait for it
    isr = tuple(name for name in part.isr if name != broker_id)
    return part.replicas, best, part.leader_epoch + 1, isr


@dataclass(frozen=True)
class Move:
    """A partition to hand back to its preferred leader (``imbalanced``)."""

    topic: str
    partition: int
    layer: str  # "isr": a PartitionChange; "raft": a transfer asked of ``leader``'s broker
    leader: str
    preferred: str


def imbalanced(state: ClusterMetadata, percentage: int) -> list[Move]:
    """Kafka's automatic leader balancing, one check (see the module docstring): the
    partitions to hand back to their preferred leaders. ``state`` has the Raft partitions'
    reported leaders laid over it (LeaderTable.overlay)."""
    live = set(state.live_brokers())
    preferred_of: dict[str, list[tuple[str, int, PartitionInfo]]] = {}
    for name in sorted(state.topics):
        topic = state.topics[name]
        if topic.layer == "master_slave":
            continue  # (moving a master is a promotion: an operator's, or a failover's)
        for index, part in enumerate(topic.partitions):
            preferred_of.setdefault(part.replicas[0], []).append((name, index, part))
    moves = []
    for broker in sorted(preferred_of):
        owned = preferred_of[broker]
        astray = [(name, index, part) for name, index, part in owned if part.leader != broker]
        if broker not in live or len(astray) * 100 <= percentage * len(owned):
            continue
        for name, index, part in astray:
            layer = state.topics[name].layer
            if layer == "isr" and broker not in part.isr:
                continue  # (it may lack committed records: it waits to rejoin the ISR)
            if layer == "raft" and not part.leader:
                continue  # (no live leader reported to ask for a transfer)
            moves.append(Move(name, index, layer, part.leader, broker))
    return moves


def sync_state_change(state: ClusterMetadata, broker_id: str, topic: str, index: int,
                      partition_epoch: int, in_sync: tuple[str, ...]) -> PartitionChange | None:
    """The change a master-slave master's report of its sync state set calls for (see the
    module docstring); None when it changes nothing or is stale."""
    info = state.topics.get(topic)
    if info is None or info.layer != "master_slave" or not 0 <= index < len(info.partitions):
        return None  # (a topic deleted meanwhile, say: nothing to change)
    part = info.partitions[index]
    if part.leader != broker_id or part.partition_epoch != partition_epoch:
        return None  # not (or no longer) its master, or made from an older view
    members = set(in_sync) | {broker_id}
    isr = tuple(name for name in part.replicas if name in members)
    if isr == part.isr:
        return None
    return PartitionChange(topic, index, part.partition_epoch + 1, part.replicas, broker_id,
                           part.leader_epoch, isr, (), info.layer)
