"""The simulator for the ISR layer (``python -m mqlog.sim --layer isr``): Kafka's
per-partition replication with the controller in the loop, under one seed — its
workload and checkers, run by the one harness as every layer is.

What runs. The controller simulation (sim/controller.py: a Raft quorum of real
controllers, brokers running the real BrokerAgent over the simulated network) with
brokers that host real groups (sim/brokers.py: real stores, cores and the one Driver per
group, every group's messages between two brokers on one simulated connection). An
operator creates an ``isr`` topic (replication factor 3, a few partitions; the
controller's ``min_insync_replicas`` 2) and a ``raft`` topic of one partition, so Raft
and ISR groups share the brokers and their connections; the controller decides the ISR
partitions' leaders, ISR and ELR (KIP-966) from the leaders' AlterPartition requests and
from fenced brokers, and the agent hands each core the newest state.

Faults. Everything the controller simulation does (controllers crash and restart, the
network drops, delays, duplicates and cuts, brokers die and come back as new lives),
partitions between brokers, and brokers paused (SIGSTOP: its groups, agent and timers
stop, what is sent to it waits, and it resumes where it was — fenced meanwhile, maybe,
and still believing what it believed). A broker dies whole: a SIGKILL on most seeds (its written
bytes survive), a power loss on some (``power_loss``: what no flush made durable is lost,
each group's store with it; the async flusher is simulated by a flush every
``flush_every_ticks``). On some seeds the controller leader and the broker that leads the
Raft partition die in the same tick (``_combined_death``: Kafka's combined mode, where
one process is both). Five choices are drawn apart from the seed's generator (so a seed
where none applies runs as before they existed): those combined deaths; KIP-966's
unclean-shutdown mark (``marks_unclean``: a broker's new life that finds its stores left
open says so when it registers, as join_cluster does, and leaves every ELR); the
controller's automatic leader balancing (``balancing``: checked every
``BALANCE_TICKS``; ISR partitions moved by PartitionChange, Raft ones by transfers that
the agent hands to the core, attach_transfers); and retention (``_retention``: now and
then one replica lets go all the committed front it may, so a follower may ask for
what its leader no longer has; on SIGKILL seeds, with bodies padded to fill segments);
and followers' fetches held for ``FETCH_MIN_BYTES`` (``fetch_min_bytes``: Kafka's
replica.fetch.min.bytes, so acks=1's records reach followers in batches while an
acks=all write gets its fetches answered at once; ``--no-fetch-holds``: on no seed,
as before they existed).

The client. One idempotent producer per partition: each write gets the next sequence,
and goes, whenever it comes in a tick, to the replica that serves the partition now,
through the calls node.py's produce path makes (``check_writable``, ``may_accept``, the
write, and for acks=all the proposal whose verdict answers it). A write refused
(NotEnoughReplicas, NotLeader: nothing stored) or answered NOT_ENOUGH_REPLICAS_AFTER_APPEND
or REQUEST_TIMED_OUT (stored, may still commit) is sent again with the same sequence.
acks=1 is answered once the leader wrote it. The Raft partition's writes are acks=all
by Raft's rule (a majority flushed them). On some seeds the client restarts now and then
(sim/lives.py): the same producer ids, a new epoch, sequences from 1 again, the writes it
waited on forgotten. On some seeds a write is a request of several records and the
stores cut some batches short (sim/partial.py): a request stored in part waits for the
layer's verdict whatever its acks, and the driver (``propose_write``) answers it
PartiallyStored once that verdict committed its records; the client sends the rest as a
new request. A follower's fetch ends at a record, so its copy may be cut inside a
request too, and a leader change makes it the copy a retry finds.

Checkers (a list of violations; empty is a pass):
* at most one leader per (partition, leader epoch) — per (group, term) for Raft;
* leader completeness: a replica that begins to serve an epoch holds the partition's
  whole committed prefix;
* strict min ISR (KIP-966): a leader's high watermark moves to P only while at least
  ``min_insync_replicas`` replicas hold the log up to P, the record ending there in the
  leader's epoch (what the replicas hold, not what the leader believes);
* log matching: two replicas of a partition with a record of the same epoch at the same
  position agree up to there (every 50 ticks, sim/raft.py's check);
* committed prefixes agree: every replica's committed position (an ISR replica's high
  watermark, a Raft commit) shows bytes equal to the one committed prefix of its
  partition (checked incrementally, sim/raft.py's checker);
* no write acknowledged with acks=all (or by Raft) is lost: once healed, each is in the
  partition's log where it was acknowledged. Every broker comes back with its disk, and
  unclean election is off, so an ISR or ELR member always survives — except after a
  power loss: with ``replica_ack = "written"`` (what brokers run) an ISR member's
  unflushed copy counts, and a power loss of the members can lose an acknowledged write
  by design (docs/REPLICATION.md); on power-loss seeds a loss in an ISR partition one of
  whose replicas lost its power after the acknowledgement is counted, not failed (and
  so is a committed prefix that changed there);
* each partition's producer has its epochs in non-decreasing order in the log, and no
  (id, epoch, sequence) stored twice (sim/lives.py) — over the committed prefix too,
  on seeds with retention (a retry stored again after its first copy was let go);
* the PartiallyStored rule (sim/partial.py's invariant): such an answer comes only once
  the answering leader committed the records it names, and each partition's committed
  log holds, under each answered request's tag, exactly the records the client was told
  are stored — never one it was told is not (acks=1 answers may lose records, never gain
  them; a power loss of a replica waives the partition's check, as above);
* with acks=1, lost acknowledged writes are counted in the summary (the price of acks=1),
  never failed on;
* liveness: with faults off and every broker back, each ISR partition's ISR is all its
  replicas, every replica's high watermark equals its log end, and the logs of each
  partition are byte-identical (so are each Raft group's), and every write the client
  still waits on is acknowledged; with balancing on, every partition is led by its
  preferred replica; plus the controller simulation's own checks — among them the
  metadata readers' (sim/readers.py): every client's view names, for each partition, the
  broker whose replica serves it.

``--break`` switches: the ISR core's (hw_all_replicas, truncate_to_hw, hw_below_min_isr),
the controller's election_outside_isr (isr/decisions.py) and the driver's partial_early
(PartiallyStored before the verdict); tests/test_isr_sim.py names a seed that catches
each.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mqlog.errors import MqlogError, OutOfOrderSequence, PartiallyStored
from mqlog.replication.controller.host import (
    BrokerGroups,
    attach_isr,
    attach_transfers,
    unclean_stores,
)
from mqlog.replication.driver import Answer, is_cut
from mqlog.replication.idempotence import Stored
from mqlog.results import PutStatus
from mqlog.sim import harness
from mqlog.sim.brokers import SimBroker, SimGroup
from mqlog.sim.controller import (
    STORE_SETTINGS,
    TICK_MS,
    BrokerSlot,
    ControllerOptions,
    ControllerSimResult,
    ControllerSwarm,
)
from mqlog.sim.harness import HEAL_PROBABILITY
from mqlog.sim.lives import ProducerLives, tag_problems
from mqlog.sim.network import NetworkOptions, SimNetwork
from mqlog.sim.partial import Batches, PartialChecker, bodies_of, describe
from mqlog.sim.raft import (
    _committed_tags,
    _log_matching_problem,
    _read,
    _records,
    _tags,
    check_committed,
)

ISR_TOPIC, RAFT_TOPIC = "events", "ledger"
REPLICATION_FACTOR = 3
MIN_INSYNC_REPLICAS = 2
GROUP_STORE_SETTINGS: dict[str, Any] = dict(STORE_SETTINGS)
BODY_PADDING = b"." * 200
RETENTION_BODY_PADDING = b"." * 1500  # (segments of 64 KiB fill, for retention to let go)
CREATE_RETRY_TICKS = 20
BALANCE_TICKS = 200  # the leader imbalance check's interval, on seeds that balance
FETCH_MIN_BYTES = 4096  # replica_fetch_min_bytes on seeds that hold fetches (else 1)
FETCH_HOLD_SEED_SHARE = 0.5  # of the seeds (0 with --no-fetch-holds: found before them)


@contextlib.contextmanager
def without_fetch_holds() -> Iterator[None]:
    """Runs with no seed holding fetches (``--no-fetch-holds``): a seed found before they
    existed runs as it did."""
    global FETCH_HOLD_SEED_SHARE
    share, FETCH_HOLD_SEED_SHARE = FETCH_HOLD_SEED_SHARE, 0.0
    try:
        yield
    finally:
        FETCH_HOLD_SEED_SHARE = share


@dataclass
class IsrOptions(ControllerOptions):
    partitions: int = 3
    power_loss: bool = False  # brokers die by power loss (else by SIGKILL)
    acks_all_share: float = 1.0  # of the writes; the rest are acks=1
    put_probability: float = 0.2  # per tick, per partition
    replica_lag_time_ms: int = 1_000
    peer_partition_probability: float = 0.0  # per tick: two brokers cut from each other
    flush_every_ticks: int = 10  # the brokers' async flusher (power-loss seeds)
    pause_probability: float = 0.0  # per tick, per live broker: SIGSTOP
    resume_probability: float = 0.05  # per tick, per paused broker: SIGCONT
    safety_ticks: int = 600
    liveness_ticks: int = 3000

    @classmethod
    def from_rng(cls, rng: random.Random) -> IsrOptions:
        return cls(voters=3, brokers=rng.choice([3, 3, 4]),
                   network=NetworkOptions(rng.choice([0.0, 0.02, 0.05]),
                                          rng.choice([0.0, 0.02]), rng.choice([1, 2, 4])),
                   crash_probability=rng.choice([0.0, 0.002]), restart_probability=0.05,
                   partition_probability=rng.choice([0.0, 0.005, 0.01]),
                   flush_delay_ticks_max=rng.choice([0, 1, 3]),
                   death_probability=rng.choice([0.002, 0.004, 0.008]),
                   return_probability=rng.choice([0.01, 0.03, 0.1]),
                   operator_probability=0.0, snapshot_interval_bytes=4096,
                   partitions=rng.choice([2, 3]), power_loss=rng.random() < 0.3,
                   acks_all_share=rng.choice([0.5, 0.8, 1.0]),
                   put_probability=rng.choice([0.1, 0.3]),
                   replica_lag_time_ms=rng.choice([800, 1_500]),
                   peer_partition_probability=rng.choice([0.0, 0.005, 0.02]),
                   pause_probability=rng.choice([0.0, 0.002, 0.005]),
                   resume_probability=rng.choice([0.01, 0.05]))


@dataclass
class Write:
    group: str
    sequence: int
    bodies: list[bytes]  # its records (one on seeds without batches: sim/partial.py)
    acks: str  # "all" or "1"
    request: str = ""  # the request in flight for it ("" if none)
    broker: str = ""
    stored_tick: int = -1  # when a leader first stored it (-1: not yet)
    producer: tuple[str, int, int] = ("", 0, 0)  # (id, sequence, epoch) of its life


@dataclass
class Acked:
    stored: Stored
    bodies: list[bytes]  # the records the client was told are stored
    acks: str
    tick: int  # when it was acknowledged
    stored_tick: int  # when a leader first stored it (copies were made since)


@dataclass
class IsrSimResult(ControllerSimResult):
    acked_all: int = 0
    acked_one: int = 0
    lost_one: int = 0  # acks=1 writes acknowledged and lost (counted, never failed)
    lost_excused: int = 0  # acks=all writes lost after a power loss (replica_ack written)
    refused: int = 0  # writes refused before anything was stored (NotEnoughReplicas...)
    elections: int = 0  # (partition, leader epoch) pairs that had a leader
    misaddressed: int = 0
    shrinks: int = 0  # ISR shrinks a leader asked for
    expands: int = 0
    truncations: int = 0  # followers truncated by leader epoch (KIP-101/279/320)
    combined_deaths: int = 0  # the controller leader and the Raft leader's broker at once
    unclean_shutdowns: int = 0  # lives that registered with KIP-966's unclean mark
    balancing: bool = False  # the controller's automatic leader balancing runs
    fetch_min_bytes: int = 1  # [controller] replica_fetch_min_bytes
    balanced: int = 0  # leader imbalance checks that moved leaders
    client_lives: int = 1  # the client's lives (sim/lives.py: restarts on some seeds)
    log_starts: int = 0  # the furthest any replica's retention moved its log's start
    partial: int = 0  # PartiallyStored answers (sim/partial.py: batches on some seeds)

    def summary(self) -> str:
        options = self.options
        return (f"seed {self.seed}: {self.verdict} brokers={options.brokers} "
                f"partitions={options.partitions} power_loss={options.power_loss} "
                f"leaders={self.elections} fences={self.fences} acked_all={self.acked_all} "
                f"acked_one={self.acked_one} lost_one={self.lost_one} "
                f"lost_excused={self.lost_excused} refused={self.refused} "
                f"shrinks={self.shrinks} expands={self.expands} "
                f"truncations={self.truncations} combined_deaths={self.combined_deaths} "
                f"unclean_shutdowns={self.unclean_shutdowns} balancing={self.balancing} "
                f"balanced={self.balanced} fetch_min_bytes={self.fetch_min_bytes} "
                f"client_lives={self.client_lives} "
                f"log_start={self.log_starts} partial={self.partial} "
                f"reads={self.reads} trace={self.digest}")


class IsrSwarm(ControllerSwarm):
    """The controller simulation with brokers hosting real ISR and Raft partitions, and
    a client (see the module docstring)."""

    options: IsrOptions
    result: IsrSimResult
    prefix = "mqlog-isr-sim-"
    options_type = IsrOptions
    result_type = IsrSimResult

    # --- set up (ControllerSwarm's hooks) ------------------------------------------------

    def partition_rules(self) -> dict[str, Any]:
        # Leader balancing on half the seeds, checked every BALANCE_TICKS (its default of
        # 300 s is past any run); drawn from a generator of its own, not the seed's.
        self.balancing = random.Random(f"{self.result.seed}/balancing").random() < 0.5
        self.result.balancing = self.balancing
        balancing = {"leader_imbalance_check_interval_ms": BALANCE_TICKS * TICK_MS} \
            if self.balancing else {"auto_leader_rebalance_enable": False}
        holds = random.Random(f"{self.result.seed}/fetch_min_bytes").random() < \
            FETCH_HOLD_SEED_SHARE
        self.result.fetch_min_bytes = FETCH_MIN_BYTES if holds else 1
        return {"min_insync_replicas": MIN_INSYNC_REPLICAS,
                "replica_lag_time_ms": self.options.replica_lag_time_ms,
                "replica_fetch_min_bytes": self.result.fetch_min_bytes, **balancing}

    def prepare(self, root: Path, test_break: str) -> None:
        self.root, self.test_break = root, test_break
        self.peers = SimNetwork(random.Random(self.rng.random()), self.options.network)
        self.sim_brokers: dict[str, SimBroker] = {}
        self.disks: dict[str, dict[str, Any]] = {}  # broker -> its saved hard states
        self.power_lost: dict[str, list[int]] = {}  # broker -> ticks it lost its power
        self.topics = {ISR_TOPIC: ("isr", self.options.partitions), RAFT_TOPIC: ("raft", 1)}
        self.topic_asked: dict[str, int] = {}  # topic -> tick its create was last sent
        self.pending: dict[str, dict[int, Write]] = {}  # group -> sequence -> write
        self.sequences: dict[str, int] = {}  # group -> the client's write number, across lives
        self.lives = ProducerLives(self.result.seed)
        self.acked: dict[str, dict[int, Acked]] = {}
        self.requests: dict[str, tuple[str, int]] = {}  # request -> (group, sequence)
        self.answered_requests: set[str] = set()  # (each is answered once)
        self.proposals = 0
        self.committed: dict[str, bytearray] = {}  # group -> its committed prefix
        self.leaders_by_epoch: dict[tuple[str, int], set[str]] = {}
        self._written_when_down: dict[tuple[str, str], int] = {}  # (broker, group) -> end
        self.replicas_of: dict[str, tuple[str, ...]] = {}  # group -> its brokers
        self.paused: set[str] = set()  # brokers stopped (SIGSTOP)
        self.backlog: dict[str, list[tuple[Any, Any]]] = {}  # what reached a paused broker
        self.combined_rng = random.Random(f"{self.result.seed}/combined")  # (not self.rng)
        # KIP-966's unclean-shutdown mark (join_cluster's) on half the seeds; the others
        # run brokers without it. (Drawn apart from the seed's generator, like balancing
        # and combined deaths: a seed with none of the three runs as it did before them.)
        self.marks_unclean = random.Random(f"{self.result.seed}/unclean").random() < 0.5
        self.combined_probability = self.combined_rng.choice([0.0, 0.003, 0.01])
        # Retention on half the SIGKILL seeds. (A power loss may replace a partition's
        # committed prefix by a replica's log, read from its start: it must have one.)
        self.retention_rng = random.Random(f"{self.result.seed}/retention")
        self.retention_probability = 0.0 if self.options.power_loss else \
            self.retention_rng.choice([0.0, 0.0, 0.01, 0.03])
        self.padding = RETENTION_BODY_PADDING if self.retention_probability else BODY_PADDING
        self.batches = Batches(self.result.seed)  # requests of several records, cut short
        self.batch_limit = self.batches.batch_limit
        self.partials: dict[str, PartialChecker] = {}  # group -> its answers' checker

    def new_host(self, broker: BrokerSlot) -> Any:
        sim_broker = SimBroker(self, broker.name, self.root / "brokers" / broker.name,
                               self.disks.setdefault(broker.name, {}), GROUP_STORE_SETTINGS,
                               self.test_break)
        self.sim_brokers[broker.name] = sim_broker
        return BrokerGroups(sim_broker)

    def attach(self, broker: BrokerSlot) -> None:
        """join_cluster's joins (ISR state, balancing's transfers), and on the seeds that
        mark them (``marks_unclean``), KIP-966's mark: a life after a death finds its
        stores left open (their abort markers), and its first registration says so."""
        assert broker.agent is not None
        sim_broker = self.sim_brokers[broker.name]
        attach_isr(broker.agent, sim_broker)
        attach_transfers(broker.agent, sim_broker)
        left_open = unclean_stores(sim_broker.root, skip=set(sim_broker.groups)) \
            if self.marks_unclean else []
        broker.agent.unclean_shutdown = bool(left_open)
        if left_open:
            self.result.unclean_shutdowns += 1

    def host_dies(self, broker: BrokerSlot) -> None:
        sim_broker = self.sim_brokers.pop(broker.name)
        self.paused.discard(broker.name)
        self.backlog.pop(broker.name, None)  # (its connections died with it)
        self.result.misaddressed += sim_broker.misaddressed
        for name, group in sim_broker.groups.items():
            self._written_when_down[(broker.name, name)] = group.store.written_position
        sim_broker.die(self.options.power_loss)
        if self.options.power_loss:
            self.power_lost.setdefault(broker.name, []).append(self.clock[0])
        for writes in self.pending.values():  # its clients' connections broke
            for write in writes.values():
                if write.broker == broker.name:
                    write.request = ""

    def broker_paused(self, name: str) -> bool:
        return name in self.paused

    def hosted(self, broker: BrokerSlot) -> set[str]:
        sim_broker = self.sim_brokers[broker.name]
        return set(sim_broker.groups) | set(sim_broker.recorded)

    def leads(self, broker: str, group: str) -> bool | None:
        if group not in {f"{name}-{index}" for name, (_layer, count) in self.topics.items()
                         for index in range(count)}:
            return None  # (a group the simulator runs no cores for)
        sim_broker = self.sim_brokers.get(broker)
        node = sim_broker.groups.get(group) if sim_broker is not None else None
        return bool(node is not None and node.up and node.driver.serving)

    # --- the run -------------------------------------------------------------------------

    def safety_tick(self, tick: int) -> None:
        super().safety_tick(tick)
        if tick % 50 == 49:
            self._check_log_matching()

    def _step_all(self) -> None:
        super()._step_all()
        self._create_topics()
        self._step_groups()

    def _faults(self) -> None:
        super()._faults()
        rng = self.rng
        for name in sorted(self.sim_brokers):
            if name in self.paused and rng.random() < self.options.resume_probability:
                self._resume(name)
            elif name not in self.paused and rng.random() < self.options.pause_probability:
                self.paused.add(name)  # (its groups, agent and timers stop; what is sent
                self.trace(f"broker {name} paused")  # to it waits in its socket buffers)
        if rng.random() < self.options.peer_partition_probability:
            a, b = rng.sample(sorted(self.brokers), 2)
            self.peers.partition(a, b)
            self.trace(f"partition brokers {a} and {b}")
        elif self.peers.partitioned and rng.random() < HEAL_PROBABILITY:
            self.peers.heal()
        self._combined_death()
        self._retention()

    def _retention(self) -> None:
        """An operator's apply_retention on one replica (a broker up, not paused): it
        lets go every whole segment below what it committed and flushed. Drawn from a
        generator of its own, like the combined deaths."""
        if self.retention_rng.random() >= self.retention_probability:
            return
        groups = [(sim_broker, group) for sim_broker, group in self._groups() if group.up]
        if not groups:
            return
        sim_broker, group = self.retention_rng.choice(groups)
        start = group.store.apply_retention().log_start
        self.result.log_starts = max(self.result.log_starts, start)
        self.trace(f"{sim_broker.broker_id}/{group.name}: log starts at {start}")

    def _combined_death(self) -> None:
        """Kafka's combined mode, where a broker is also a controller: the controller
        leader and the broker that leads the Raft partition die in the same tick (the
        case of issue 16's process-test failure, where a client could not reach the
        partitions the killed combined process had led). Drawn from a generator of its
        own, so a seed where it never strikes runs as it did before there was one."""
        if self.combined_rng.random() >= self.combined_probability:
            return
        leaders = sorted(node.name for node in self.running() if node.controller.serving)
        brokers = sorted(name for name, sim_broker in self.sim_brokers.items()
                         if name not in self.paused and any(
                             group.up and group.driver.serving and
                             group.spec.replication.layer == "raft"
                             for group in sim_broker.groups.values()))
        if not leaders or not brokers:
            return
        node = self.nodes[leaders[0]]
        durable, kept = node.crash()
        node.controller.stop()
        self.readers.crashed(node.name, durable)
        self._end_life(self.brokers[brokers[0]])
        self.result.combined_deaths += 1
        self.trace(f"controller leader {node.name} (flushed {durable}, kept {kept}) and the "
                   f"Raft leader's broker {brokers[0]} die at once")

    def trace(self, text: str) -> None:
        super().trace(text)
        if "shrink the ISR" in text:  # (the cores' events, as notes)
            self.result.shrinks += 1
        elif "expand the ISR" in text:
            self.result.expands += 1
        elif " truncated [" in text:
            self.result.truncations += 1
        elif "leader balancing:" in text:
            self.result.balanced += 1

    def _resume(self, name: str) -> None:
        self.paused.discard(name)
        self.trace(f"broker {name} resumes")

    def _groups(self, running: bool = True) -> list[tuple[SimBroker, SimGroup]]:
        """Each hosted group (of brokers not paused, if ``running``)."""
        return [(sim_broker, sim_broker.groups[name])
                for broker_name, sim_broker in sorted(self.sim_brokers.items())
                if not (running and broker_name in self.paused)
                for name in sorted(sim_broker.groups)]

    def _step_groups(self) -> None:
        """Each hosted group ticks, steps what arrived for it, takes the client's writes
        (whenever they come in the tick), sees its due flushes, and runs its driver."""
        self.peers.now = self.clock[0]
        for _, group in self._groups():
            group.driver.tick()
        if self.faulty:
            self._new_writes()
        arrived = [item for name in sorted(self.backlog) if name not in self.paused
                   for item in self.backlog.pop(name)] + self.peers.due_frames()
        writes_at = self.rng.randrange(len(arrived) + 1)
        for index, (frame, message) in enumerate(arrived):
            if index == writes_at:
                self._send_writes()
            target = self.sim_brokers.get(message.dst)
            if target is None:
                continue  # (a dead broker: its connections are gone)
            if message.dst in self.paused:
                self.backlog.setdefault(message.dst, []).append((frame, message))
                continue
            target.deliver(frame, message.src)  # (one connection per broker pair)
        if writes_at == len(arrived):
            self._send_writes()
        chores = self.clock[0] % 20 == 0
        flush = self.options.power_loss and self.clock[0] % self.options.flush_every_ticks == 0
        for sim_broker, group in self._groups():
            if flush:
                group.flush_now()
            group.complete_flushes()
            group.driver.run()
            if group.driver.failure is not None:
                continue
            self._check_group(sim_broker, group)
            if chores:
                group.chores()

    # --- the operator and the client ---------------------------------------------------------

    def _create_topics(self) -> None:
        """Create each planned topic until a controller acknowledged it (or shows it)."""
        state = next((node.controller.committed for node in self.running()
                      if node.controller.serving), None)
        for name, (layer, partitions) in sorted(self.topics.items()):
            if name in self.created:
                continue
            if state is not None and name in state.topics:
                self.created.add(name)
                self.unsure.discard(name)
                continue
            if self.clock[0] - self.topic_asked.get(name, -CREATE_RETRY_TICKS) < \
                    CREATE_RETRY_TICKS:
                continue
            self.topic_asked[name] = self.clock[0]
            self.unsure.add(name)

            def created(ok: bool, _proposal: Any, name: str = name) -> None:
                if ok:
                    self.created.add(name)
                    self.unsure.discard(name)
                    self.result.topics_created += 1
            self._call(functools.partial(_create, name=name, partitions=partitions,
                                         layer=layer), created)

    def _partition_groups(self) -> list[tuple[str, str, int, str]]:
        """(group, topic, partition, layer) of each created topic's partitions."""
        return [(f"{name}-{index}", name, index, layer)
                for name, (layer, partitions) in sorted(self.topics.items())
                if name in self.created for index in range(partitions)]

    def _new_writes(self) -> None:
        if self.lives.maybe_restart(self.clock[0]):
            self.pending.clear()  # (a new process: what the old one waited on, forgotten)
            self.trace(f"the client restarts: life {self.lives.lives}, epoch "
                       f"{self.lives.epoch}")
        for group, _topic, _index, layer in self._partition_groups():
            if self.rng.random() >= self.options.put_probability:
                continue
            sequence = self.sequences.get(group, 0) + 1
            acks = "all" if layer == "raft" or \
                self.rng.random() < self.options.acks_all_share else "1"
            self._new_write(group, acks, bodies_of(f"{self.result.seed}/{group}/{sequence}",
                                                   self.batches.records(), self.padding))

    def _new_write(self, group: str, acks: str, bodies: list[bytes]) -> None:
        """The client's next write to ``group`` (the next sequence of its producer)."""
        sequence = self.sequences[group] = self.sequences.get(group, 0) + 1
        self.pending.setdefault(group, {})[sequence] = Write(
            group, sequence, bodies, acks, producer=self.lives.next(f"p-{group}"))

    def _serving(self, group: str) -> SimGroup | None:
        serving = [sim_broker.groups[group] for name, sim_broker in self.sim_brokers.items()
                   if name not in self.paused and group in sim_broker.groups
                   and sim_broker.groups[group].driver.serving]
        return self.rng.choice(serving) if serving else None

    def _send_writes(self) -> None:
        for group, topic, index, _layer in self._partition_groups():
            waiting = [write for write in self.pending.get(group, {}).values()
                       if not write.request][:4]
            node = self._serving(group) if waiting else None
            if node is None:
                continue
            for write in waiting:
                self._submit(node, topic, index, write)

    def _submit(self, node: SimGroup, topic: str, index: int, write: Write) -> None:
        """node.py's produce path: may this replica take it, store it, propose it."""
        isr = node.spec.replication.layer == "isr"
        try:
            node.driver.check_writable()
            if isr:
                node.core.may_accept("replicated" if write.acks == "all" else "master")
        except MqlogError as error:  # nothing stored: sent again later
            self.result.refused += 1
            self.trace(f"{node.broker_id}/{node.name}: refused s{write.sequence}: "
                       f"{type(error).__name__}")
            return
        try:
            stored = node.driver.write(topic, write.bodies, index, producer=write.producer)
        except OutOfOrderSequence:  # older than the leader's table: it may be stored (its
            return self._give_up(node, write)  # first copy let go by retention), unknown
        if write.stored_tick < 0:
            write.stored_tick = self.clock[0]
        cut = is_cut(stored, len(write.bodies))
        self.trace(f"{node.broker_id}/{node.name}: s{write.sequence} acks={write.acks} at "
                   f"{stored.position}" + (f", {stored.count} of {len(write.bodies)} records"
                                           if cut else ""))
        if write.acks == "1" and not cut:  # the leader's write is its answer
            self._acknowledge(node, write, stored, PutStatus.PUT_OK)
            return
        self.proposals += 1
        request = f"{write.group}/s{write.sequence}@{node.broker_id}.{self.clock[0]}" \
            f"#{self.proposals}"  # (unique: a retry in the same tick is another request)
        write.request, write.broker = request, node.broker_id
        self.requests[request] = (write.group, write.sequence)
        node.driver.propose_write(request, stored, len(write.bodies), write.producer)

    def _give_up(self, node: SimGroup, write: Write) -> None:
        """A leader refused a retry as too old to tell whether it is stored (the raft
        simulator's rule): the client raises that, its outcome unknown, and the write is
        not checked. Only a retry: a write no leader stored is not old."""
        del self.pending[write.group][write.sequence]
        self.trace(f"{node.broker_id}/{node.name}: s{write.sequence} refused as too old")
        if write.stored_tick < 0:
            self.result.violations.append(
                f"tick {self.clock[0]}: {node.broker_id}/{node.name} refused write "
                f"{write.sequence}, never stored, as too old")

    def answered(self, node: Any, request: Any, status: Answer) -> None:
        if not isinstance(node, SimGroup):
            return  # (a controller's own proposals)
        self.trace(f"{node.broker_id}/{node.name}: {request} {describe(status)}")
        assert request not in self.answered_requests, f"{request} answered twice"
        self.answered_requests.add(request)
        group, sequence = self.requests.pop(request, ("", 0))
        write = self.pending.get(group, {}).get(sequence)
        if write is None or write.request != request:
            return  # an answer to a request the client gave up on
        write.request = ""
        if status is PutStatus.PUT_OK or isinstance(status, PartiallyStored):
            stored = node.driver.producers.lookup(*write.producer)
            assert stored is not None, (group, sequence)
            self._acknowledge(node, write, stored, status)

    def _acknowledge(self, node: SimGroup, write: Write, stored: Stored,
                     answer: Answer) -> None:
        """The client was told ``answer`` (PUT_OK, or PartiallyStored: then it sends the
        other records again as a new request)."""
        checker = self.partials.setdefault(write.group, PartialChecker())
        problem = checker.answered(write.producer, write.bodies, answer, stored,
                                   node.store.committed_position,
                                   may_lose=write.acks == "1" and answer is PutStatus.PUT_OK)
        if problem:
            self.violation(f"{node.broker_id}/{node.name} {problem}")
        told = stored.count if isinstance(answer, PartiallyStored) else len(write.bodies)
        del self.pending[write.group][write.sequence]
        self.acked.setdefault(write.group, {})[write.sequence] = Acked(
            stored, write.bodies[:told], write.acks, self.clock[0], write.stored_tick)
        if write.acks == "all":
            self.result.acked_all += 1
        else:
            self.result.acked_one += 1
        if told < len(write.bodies):
            self._new_write(write.group, write.acks, write.bodies[told:])

    # --- checkers ----------------------------------------------------------------------------

    def _check_group(self, sim_broker: SimBroker, group: SimGroup) -> None:
        core = group.core
        core.invariants()
        self.replicas_of.setdefault(group.name, group.spec.members)
        if group.driver.serving:
            leaders = self.leaders_by_epoch.setdefault((group.name, core.epoch), set())
            if sim_broker.broker_id not in leaders:
                leaders.add(sim_broker.broker_id)
                self._check_complete(group)
            if len(leaders) > 1:
                self.violation(f"{group.name} had leaders {sorted(leaders)} in epoch "
                               f"{core.epoch}")
        commit = group.store.committed_position
        if commit <= group.commit_seen:
            return
        group.commit_seen = commit
        if core.is_master and group.spec.replication.layer == "isr" and \
                not self.options.power_loss:
            self._check_insync_holders(group, commit)
        prefix = self.committed.setdefault(group.name, bytearray())
        problem = check_committed(prefix, group, commit)
        if not problem:
            return
        if self._excused(group.name, -1):
            self.trace(f"{sim_broker.broker_id}/{group.name} {problem} (after a power loss)")
            prefix[:] = _read(group.store, 0, commit)
            return
        self.violation(f"{sim_broker.broker_id}/{group.name} {problem}")

    def _check_complete(self, leader: SimGroup) -> None:
        """Leader completeness: a replica that begins to serve a leader epoch (a Raft
        term) holds the partition's whole committed prefix (elected from the ISR or the
        ELR, which hold every committed record)."""
        prefix = self.committed.get(leader.name, bytearray())
        start = min(leader.store.first_segment_base(), len(prefix))  # (retention)
        try:
            complete = _read(leader.store, start, len(prefix)) == bytes(prefix[start:])
        except MqlogError:  # (no record starts where the prefix ends, in its log)
            complete = False
        if complete or self._excused(leader.name, -1):
            return
        self.violation(f"{leader.broker_id}/{leader.name} leads epoch {leader.core.epoch} "
                       f"without the whole committed prefix [0, {len(prefix)})")

    def _check_insync_holders(self, leader: SimGroup, commit: int) -> None:
        """A leader's high watermark moves to ``commit`` only while at least
        min_insync_replicas replicas hold the log up to there (written: the brokers run
        replica_ack = "written"), the record ending there in the same epoch as the
        leader's (KIP-966's strict min ISR; a broker down counts what it had written: a
        SIGKILL keeps it)."""
        epoch = leader.store.epoch_at(commit)
        holders = []
        for name in leader.spec.replication.replicas:
            sim_broker = self.sim_brokers.get(name)
            replica = sim_broker.groups.get(leader.name) if sim_broker is not None else None
            if replica is None or not replica.up:
                if self._written_when_down.get((name, leader.name), 0) >= commit:
                    holders.append(name)
            elif replica.store.written_position >= commit and \
                    replica.store.epoch_at(commit) == epoch:
                holders.append(name)
        if len(holders) < MIN_INSYNC_REPLICAS:
            self.violation(f"{leader.broker_id}/{leader.name} moved its high watermark to "
                           f"{commit} in leader epoch {leader.core.epoch} but only {holders} "
                           f"hold it (min_insync_replicas is {MIN_INSYNC_REPLICAS})")

    def _check_log_matching(self) -> None:
        """Two replicas of a partition with a record of the same epoch at the same position
        agree up to there (sim/raft.py's check, for every group on every broker up)."""
        by_group: dict[str, list[tuple[str, Any]]] = {}
        for sim_broker, group in self._groups(running=False):
            by_group.setdefault(group.name, []).append((sim_broker.broker_id, group.store))
        for name, replicas in sorted(by_group.items()):
            logs = [(broker, _records(store), store.first_segment_base())
                    for broker, store in replicas]
            for index, (a, records_a, start_a) in enumerate(logs):
                for b, records_b, start_b in logs[index + 1:]:
                    problem = _log_matching_problem(records_a, records_b, max(start_a, start_b))
                    if problem and not self._excused(name, -1):
                        self.violation(f"{name} on {a} and {b}: {problem}")

    def _excused(self, group: str, since: int) -> bool:
        """A power loss of one of ``group``'s replicas after tick ``since`` (an ISR
        partition; the brokers run replica_ack = "written")."""
        if not self.options.power_loss or not group.startswith(f"{ISR_TOPIC}-"):
            return False
        return any(tick > since for name in self.replicas_of.get(group, self.brokers)
                   for tick in self.power_lost.get(name, ()))

    # --- liveness and the end --------------------------------------------------------------

    def liveness(self) -> None:
        self.peers.options = NetworkOptions()
        self.peers.heal()
        for name in sorted(self.paused):
            self._resume(name)
        for broker in self.brokers.values():
            if not broker.alive:
                self._begin_life(broker)
                self.trace(f"broker {broker.name} comes back for the liveness phase")
        super().liveness()

    def _why_not_settled(self) -> str:
        why = super()._why_not_settled()
        if why:
            return why
        if set(self.topics) - self.created:
            return f"topics {sorted(set(self.topics) - self.created)} not created"
        waiting = sum(len(writes) for writes in self.pending.values())
        if waiting:
            return f"{waiting} writes waiting"
        state = self.running()[0].controller.committed
        for group, topic, index, layer in self._partition_groups():
            part = state.topics[topic].partitions[index]
            replicas = [self.sim_brokers[name].groups.get(group) for name in part.replicas]
            if any(replica is None or not replica.up for replica in replicas):
                return f"{group} is not hosted by all of {list(part.replicas)}"
            ends = {(replica.store.written_position, replica.store.committed_position)
                    for replica in replicas if replica is not None}
            if len(ends) != 1 or len({end for pair in ends for end in pair}) != 1:
                return f"{group}: (written, committed) ends {sorted(ends)}"
            serving = [replica for replica in replicas
                       if replica is not None and replica.driver.serving]
            if len(serving) != 1:
                return f"{group} has {len(serving)} serving leaders"
            if layer == "isr" and set(part.isr) != set(part.replicas):
                return f"{group}'s ISR is {list(part.isr)}"
            if self.balancing and serving[0].broker_id != part.replicas[0]:
                return (f"{group} is led by {serving[0].broker_id}, not its preferred "
                        f"replica {part.replicas[0]} (leader balancing is on)")
        return ""

    def check_end(self) -> None:
        if self.result.violations:
            return
        state = self.running()[0].controller.committed
        for group, topic, index, _layer in self._partition_groups():
            part = state.topics[topic].partitions[index]
            replicas = [self.sim_brokers[name].groups[group] for name in part.replicas]
            common = max(replica.store.first_segment_base() for replica in replicas)
            images = {hashlib.sha256(_read(replica.store, common,
                                           replica.store.written_position)).hexdigest()
                      for replica in replicas}
            if len(images) != 1:
                self.violation(f"{group}: the replicas' logs differ after healing (from "
                               f"{common})")
            self._check_acked(group, replicas[0])
            tags = _tags(replicas[0].store, topic, index)
            if self.retention_probability:  # (what the log let go was committed)
                tags = _committed_tags(bytes(self.committed.get(group, b"")))
            for problem in tag_problems(tags):
                self.violation(f"{group}: {problem}")
            self._check_partial(group)

    def _check_partial(self, group: str) -> None:
        """sim/partial.py's invariant over the partition's committed log (a power loss of
        one of its replicas, under replica_ack = "written", waives it: what was committed
        may be gone)."""
        checker = self.partials.get(group)
        if checker is None:
            return
        excused = self._excused(group, -1)
        log = bytes(self.committed.get(group, b""))
        for problem in checker.check(log, lambda _producer: excused):
            self.violation(f"{group}: {problem}")

    def _check_acked(self, group: str, replica: SimGroup) -> None:
        for sequence, acked in sorted(self.acked.get(group, {}).items()):
            if self._holds(group, replica, acked):
                continue
            if acked.acks == "1":
                self.result.lost_one += 1
            elif self._excused(group, acked.stored_tick - 1):  # (a copy counted by the
                # leader may have been lost to a power loss before the answer went out)
                self.result.lost_excused += 1
            else:
                self.violation(f"{group}: write {sequence} acknowledged with acks=all at "
                               f"{acked.stored.position} (tick {acked.tick}) was lost")

    def _holds(self, group: str, replica: SimGroup, acked: Acked) -> bool:
        """The healed log has the write where it was acknowledged (before the log's start,
        where retention let it go: the partition's committed prefix has it)."""
        stored = acked.stored
        if stored.position < replica.store.first_segment_base():
            committed = self.committed.get(group, bytearray())
            return bytes(committed[stored.position:stored.end]).endswith(acked.bodies[-1])
        try:
            record = replica.store.read_record(stored.position)
        except MqlogError:
            return False
        return record.body == acked.bodies[0]

    def finish(self) -> None:
        for _, group in self._groups(running=False):  # (harness.py closes the controllers')
            group.store.close()
        super().finish()
        self.result.elections = len(self.leaders_by_epoch)
        self.result.client_lives = self.lives.lives
        self.result.partial = sum(checker.partial for checker in self.partials.values())
        self.result.misaddressed += sum(broker.misaddressed
                                        for broker in self.sim_brokers.values())


def _create(controller: Any, name: str, partitions: int, layer: str) -> Any:
    return controller.create_topic(name, partitions, REPLICATION_FACTOR, layer)


def run_seed(seed: int, test_break: str = "") -> IsrSimResult:
    # In memory where the machine has it: the simulated disk decides what a crash keeps
    # (power_off), so a real fsync buys nothing, and costs most of a run on a busy disk.
    memory = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) \
        else None
    return harness.run_seed(IsrSwarm, seed, test_break, IsrSwarm.prefix, memory)
