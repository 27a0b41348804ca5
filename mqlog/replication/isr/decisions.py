"""What the controller decides for an ISR partition, as pure functions of its state.

AlterPartition (Kafka's KIP-497 handling). A leader asks for a new ISR computed from the
partition epoch it knows. The request is refused (MetadataChangeRefused, nothing
changes) unless it comes from the current leader in the current leader epoch and names
the current partition epoch — a request computed from a stale view would undo a newer
decision (a fenced broker already removed, a newer leader) — and unless the new ISR holds
the leader, lies within the replicas, and adds only live brokers. Accepted, it creates
the next partition epoch.

ELR (KIP-966). The high watermark advances only while the ISR has at least
``min_insync_replicas`` members, so the members that leave an ISR smaller than that hold
every committed record: they become eligible leader replicas (ELR) beside the ISR. A
member that rejoins the ISR leaves the ELR, and once the ISR is back at the minimum the
ELR empties (the high watermark moves again, past what they hold).

Leader election, when the leader's broker is fenced: the first live ISR member in
replica order (the preferred leader first); else the first live ELR member, which becomes
the ISR alone; else, only with ``unclean``, the first live replica — records committed
before may be lost, and the decision says so; else no leader (``""``) until an ISR or
ELR member comes back. The fenced leader leaves the ISR (to the ELR when the ISR falls
below the minimum). Every election bumps the leader epoch.

Preferred-leader election (Kafka's, by ``mqlog topics rebalance`` or the controller's
automatic leader balancing): the first replica leads again when it is live and in the
ISR (so it holds every committed record); the ISR and ELR are unchanged, the leader
epoch bumps. A preferred replica outside the ISR is refused: it would lose what it lacks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from mqlog.errors import MetadataChangeRefused, StaleAlterPartition
from mqlog.replication.isr.core import AlterPartition, PartitionState

# A deliberately broken election, so the simulator shows its checkers notice it
# (``python -m mqlog.sim --layer isr --break election_outside_isr``): a live replica
# outside the ISR and the ELR is elected first, without unclean_leader_election.
TEST_BREAKS = ("election_outside_isr",)


def decide_alter_partition(current: PartitionState, request: AlterPartition,
                           min_insync_replicas: int,
                           live: set[str] | None = None) -> PartitionState:
    """The partition's next state after ``request``, or MetadataChangeRefused."""
    if request.src != current.leader or request.epoch != current.leader_epoch:
        raise StaleAlterPartition(
            f"AlterPartition from {request.src} in leader epoch {request.epoch}: the leader "
            f"is {current.leader or 'nobody'} in leader epoch {current.leader_epoch}")
    if request.partition_epoch != current.partition_epoch:
        raise StaleAlterPartition(
            f"AlterPartition computed from partition epoch {request.partition_epoch}, not "
            f"the current {current.partition_epoch}: the leader must apply the newer "
            "metadata and ask again")
    isr = request.isr
    if current.leader not in isr or not set(isr) <= set(current.replicas) or \
            len(set(isr)) != len(isr):
        raise MetadataChangeRefused(f"ISR {list(isr)} must hold the leader {current.leader} "
                                    f"and only replicas {list(current.replicas)}, once each")
    added = set(isr) - set(current.isr)
    if live is not None and added - live:
        raise MetadataChangeRefused(f"{sorted(added - live)} cannot join the ISR: fenced "
                                    "or not registered")
    return _with_isr(current, isr, min_insync_replicas)


def elect_leader(current: PartitionState, live: set[str], min_insync_replicas: int,
                 unclean: bool = False, test_break: str = "",
                 ends: Mapping[str, tuple[int, int]] | None = None,
                 ) -> tuple[PartitionState, str]:
    """A new leader for a partition whose leader is not live: the next state and how it
    was chosen ("isr", "elr", "unclean", or "none"). An unclean election takes the live
    replica whose log ``ends`` says is the longest ((epoch, position) as its broker last
    reported it; the replicas' order breaks ties): the least is lost, and never a
    replica that holds nothing (a wiped one) while another holds the records."""
    order = [name for name in current.replicas if name in live]
    isr = tuple(name for name in current.isr if name in live)
    elr = [name for name in current.elr if name in live]
    outside = [name for name in order if name not in isr and name not in elr]
    if test_break == "election_outside_isr" and outside:
        leader, how, isr = outside[0], "isr", (outside[0],)  # (the break: never do this)
    elif isr:
        leader, how = next(name for name in order if name in isr), "isr"
    elif elr:
        leader, how = next(name for name in order if name in elr), "elr"
        isr = (leader,)
    elif unclean and order:
        known = ends or {}
        leader, how = max(order, key=lambda name: known.get(name, (-1, -1))), "unclean"
        isr = (leader,)
    else:
        leader, how = "", "none"
    state = _with_isr(current, isr, min_insync_replicas)
    if how == "unclean":
        state = dataclasses.replace(state, elr=())
    return dataclasses.replace(state, leader=leader,
                               leader_epoch=current.leader_epoch + 1), how


def _with_isr(current: PartitionState, isr: tuple[str, ...],
              min_insync_replicas: int) -> PartitionState:
    """The next partition epoch with ``isr``, the ELR following KIP-966's rule."""
    if len(isr) >= min_insync_replicas:
        elr: tuple[str, ...] = ()
    else:
        leaving = set(current.isr) - set(isr)
        kept = (set(current.elr) | leaving) - set(isr)
        elr = tuple(name for name in current.replicas if name in kept)
    return dataclasses.replace(current, isr=tuple(isr), elr=elr,
                               partition_epoch=current.partition_epoch + 1)


def fence_isr(current: PartitionState, broker_id: str, fenced: set[str],
              min_insync_replicas: int, unclean: bool = False,
              test_break: str = "", ends: Mapping[str, tuple[int, int]] | None = None,
              ) -> tuple[PartitionState, str] | None:
    """The change fencing ``broker_id`` calls for (None: none): it leaves the ISR (to the
    ELR below the minimum), and if it led, another leader is elected (``elect_leader``)."""
    live = set(current.replicas) - fenced - {broker_id}
    if current.leader and current.leader in live:
        if broker_id not in current.isr:
            return None
        return _with_isr(current, tuple(name for name in current.isr if name != broker_id),
                         min_insync_replicas), "leader stays"
    if not current.leader and broker_id not in current.isr:
        return None
    return elect_leader(current, live, min_insync_replicas, unclean, test_break, ends)


def unfence_isr(current: PartitionState, broker_id: str, fenced: set[str],
                min_insync_replicas: int, unclean: bool = False,
                ends: Mapping[str, tuple[int, int]] | None = None,
                ) -> tuple[PartitionState, str] | None:
    """A leaderless partition elects once ``broker_id`` is back, if it may lead."""
    if current.leader or broker_id not in current.replicas:
        return None
    state, how = elect_leader(current, set(current.replicas) - (fenced - {broker_id}),
                              min_insync_replicas, unclean, ends=ends)
    return (state, how) if state.leader else None


def elect_preferred(current: PartitionState, live: set[str]) -> PartitionState:
    """The partition led by its preferred (first) replica, or MetadataChangeRefused."""
    preferred = current.replicas[0] if current.replicas else ""
    where = f"the preferred leader {preferred or '(none)'}"
    if current.leader == preferred:
        raise MetadataChangeRefused(f"{where} leads already")
    if preferred not in live:
        raise MetadataChangeRefused(f"{where} is not live (fenced or not registered)")
    if preferred not in current.isr:
        raise MetadataChangeRefused(f"{where} is not in the ISR {list(current.isr)}: it "
                                    "may lack committed records; it leads once it rejoins")
    return dataclasses.replace(current, leader=preferred,
                               leader_epoch=current.leader_epoch + 1,
                               partition_epoch=current.partition_epoch + 1)
