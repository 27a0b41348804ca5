"""The simulator for the controller: its Raft group, broker sessions and fencing, and the
metadata brokers pull, under one seed (the VOPR idea of swarm.py and raft.py).

Controllers are real stores with Raft cores run by the one driver (sim/raft.py's nodes:
simulated network and disk, power-loss crashes, the engine's real recovery), each with a
``Controller`` service (replication/controller/service.py) that folds its committed
records, and is rebuilt from its log on every restart. Snapshots are written every few
KiB and the logs trimmed behind them, so restarts begin at a snapshot and a follower
left behind gets a LogReset.

Brokers are clients: each registers with whichever controller claims to lead, heartbeats
every ``heartbeat_ticks``, and pulls ``metadata_since`` its position from a random
controller, folding what comes back (records or a snapshot) into its own view. A broker
may die (it goes silent) and come back (it registers again, with a new broker epoch). An
operator creates and deletes topics now and then.

Checkers (a list of violations; empty is a pass):
* agreement: every controller that folded its log to position P holds the same state
  there (digests by position, across all controllers and restarts), and none skipped a
  committed record (the leader proposes only records that apply);
* no acknowledged create or delete is lost: the final state has every topic whose create
  was acknowledged (and not deleted since) and none whose delete was;
* fencing: no ISR-layer partition is led by a fenced broker once the cluster settled;
* liveness: with faults off and a majority of controllers up, a leader serves; every live
  broker ends registered and unfenced, every dead one fenced; every broker's pulled view
  equals the controllers' state, and every controller up holds that same state.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mqlog.config import ReplicationConfig
from mqlog.errors import MqlogError
from mqlog.replication.controller import records
from mqlog.replication.controller.config import ControllerConfig
from mqlog.replication.controller.service import Controller, Proposal
from mqlog.replication.controller.state import ClusterMetadata
from mqlog.sim.network import NetworkOptions, SimNetwork
from mqlog.sim.raft import CORE_SETTINGS, RAFT_STORE_SETTINGS, RaftSimNode
from mqlog.sim.swarm import SeedResult

TICK_MS = 10
STORE_SETTINGS: dict[str, Any] = dict(RAFT_STORE_SETTINGS, segment_size_bytes=64 * 1024,
                                      message_size_bytes_max=8 * 1024)


@dataclass
class ControllerOptions:
    voters: int
    brokers: int
    network: NetworkOptions
    crash_probability: float  # per tick, per controller
    restart_probability: float
    partition_probability: float
    flush_delay_ticks_max: int
    death_probability: float  # per tick, per broker: it goes silent
    return_probability: float  # per tick, per dead broker
    operator_probability: float  # per tick: a topic is created or deleted
    snapshot_interval_bytes: int
    heartbeat_ticks: int = 8
    session_ticks: int = 40
    safety_ticks: int = 400
    liveness_ticks: int = 1500

    @classmethod
    def from_rng(cls, rng: random.Random) -> ControllerOptions:
        return cls(voters=rng.choice([3, 3, 5]), brokers=rng.choice([3, 4, 5]),
                   network=NetworkOptions(rng.choice([0.0, 0.02, 0.1]),
                                          rng.choice([0.0, 0.05]), rng.choice([1, 3, 8])),
                   crash_probability=rng.choice([0.0, 0.003, 0.01]),
                   restart_probability=rng.choice([0.05, 0.01]),
                   partition_probability=rng.choice([0.0, 0.01, 0.03]),
                   flush_delay_ticks_max=rng.choice([0, 1, 3]),
                   death_probability=rng.choice([0.002, 0.01]),
                   return_probability=rng.choice([0.01, 0.05]),
                   operator_probability=rng.choice([0.05, 0.15, 0.5]),
                   snapshot_interval_bytes=rng.choice([512, 4096]))


@dataclass
class ControllerSimNode(RaftSimNode):
    controller_config: ControllerConfig = field(default_factory=ControllerConfig)
    controller: Any = None

    def start(self) -> None:
        super().start()
        self.controller = Controller(self.controller_config, self.store, self.driver,
                                     tick_ms=TICK_MS, rng=random.Random(self.rng.random()),
                                     note=lambda text: self.sim.trace(f"{self.name}: {text}"),
                                     test_break=self.test_break)


@dataclass
class SimBroker:
    """A broker as the controllers see it (a client of theirs)."""

    name: str
    alive: bool = True
    epoch: int | None = None  # its registration, once acknowledged
    busy: bool = False  # a registration in flight
    life: int = 0  # bumped when it dies: an answer to an earlier life never reaches it
    next_heartbeat: int = 0
    view: ClusterMetadata = field(default_factory=ClusterMetadata)
    position: int = 0  # how far its view has folded the controllers' log
    died_at: int = -1


@dataclass
class ControllerSimResult(SeedResult):
    registrations: int = 0
    fences: int = 0  # FenceBroker records the controllers folded (a leader's)
    leaders: int = 0
    trims: int = 0  # the furthest log start any controller reached
    snapshots_pulled: int = 0
    topics_created: int = 0

    def summary(self) -> str:
        options = self.options
        return (f"seed {self.seed}: {self.verdict} voters={options.voters} "
                f"brokers={options.brokers} leaders={self.leaders} "
                f"registrations={self.registrations} fences={self.fences} "
                f"topics={self.topics_created} log_start={self.trims} "
                f"snapshots_pulled={self.snapshots_pulled} trace={self.digest}")


class ControllerSwarm:
    """One simulated controller quorum, its brokers and an operator."""

    def __init__(self, seed: int, root: Path, test_break: str = "") -> None:
        self.rng = random.Random(seed)
        self.options = ControllerOptions.from_rng(self.rng)
        self.result = ControllerSimResult(seed, self.options)
        self.network = SimNetwork(self.rng, self.options.network)
        self.clock = [1]
        names = tuple(f"c{index}" for index in range(self.options.voters))
        config = ControllerConfig(
            voters={name: f"sim:{name}" for name in names},
            broker_session_timeout_ms=self.options.session_ticks * TICK_MS,
            broker_heartbeat_interval_ms=self.options.heartbeat_ticks * TICK_MS,
            snapshot_interval_bytes=self.options.snapshot_interval_bytes)
        self.nodes = {name: ControllerSimNode(
            name, root / name, self, STORE_SETTINGS, random.Random(self.rng.random()),
            self.options.flush_delay_ticks_max, test_break,
            config=ReplicationConfig(layer="raft", node_id=name, voters=names,
                                     cluster_id="controller", **CORE_SETTINGS),
            core_rng=self.rng, controller_config=config) for name in names}
        self.brokers = {f"b{index}": SimBroker(f"b{index}")
                        for index in range(self.options.brokers)}
        self.digests: dict[int, str] = {}  # position -> state digest (agreement)
        self.created: set[str] = set()  # acknowledged creates
        self.deleted: set[str] = set()  # acknowledged deletes (or tried: outcome unknown)
        self.unsure: set[str] = set()  # creates or deletes whose outcome is unknown
        self.topic_count = 0
        self.faulty = True
        self.terms: set[int] = set()
        for node in self.nodes.values():
            node.start()

    # --- the run ---------------------------------------------------------------------

    def run(self) -> ControllerSimResult:
        try:
            for _ in range(self.options.safety_ticks):
                self._faults()
                self._step_all()
            self._liveness()
        except (AssertionError, MqlogError) as error:
            self.result.violations.append(f"tick {self.clock[0]}: {error!r}")
        finally:
            for node in self.nodes.values():
                if node.up:
                    node.store.close()
        self.result.leaders = len(self.terms)
        return self.result

    def _step_all(self) -> None:
        self.clock[0] += 1
        self.network.now = self.clock[0]
        running = self._running()
        for node in running:
            node.driver.tick()
            node.controller.tick()
        for message in self.network.due():
            node = self.nodes[message.dst]
            if node.up and not node.paused:
                node.driver.step(message)
        for node in running:
            node.complete_flushes()
            self._run(node)
        for broker in self.brokers.values():
            if broker.alive:
                self._broker_step(broker)
        if self.faulty and self.rng.random() < self.options.operator_probability:
            self._operator()
        for node in self._running():  # (what the brokers and the operator proposed)
            self._run(node)

    def _run(self, node: ControllerSimNode) -> None:
        if not node.up:
            return
        node.driver.run()
        if node.driver.failure is not None:
            return
        node.core.invariants()
        node.controller.after_run()
        self._check_agreement(node)

    # --- brokers and the operator --------------------------------------------------------

    def _leader(self) -> ControllerSimNode | None:
        leaders = [node for node in self._running() if node.controller.serving]
        return self.rng.choice(leaders) if leaders else None

    def _call(self, request: Callable[[Controller], Proposal],
              done: Callable[[bool, Proposal | None], None]) -> None:
        """Send a request to a controller that claims to lead; ``done(ok, proposal)``."""
        leader = self._leader()
        if leader is None:
            done(False, None)
            return
        try:
            proposal = request(leader.controller)
        except MqlogError as error:
            self.trace(f"{leader.name} refused: {error}")
            done(False, None)
            return
        leader.controller.wait(proposal, lambda ok: done(ok, proposal))

    def _broker_step(self, broker: SimBroker) -> None:
        now = self.clock[0]
        if broker.epoch is None and not broker.busy:
            broker.busy = True
            life = broker.life

            def registered(ok: bool, proposal: Proposal | None) -> None:
                if broker.life != life:  # (its process is gone: so is the connection)
                    return
                broker.busy = False
                if ok and proposal is not None and broker.alive:
                    broker.epoch = proposal.answer["broker_epoch"]
                    broker.next_heartbeat = now
                    self.result.registrations += 1
            self._call(lambda c: c.register_broker(broker.name, f"sim:{broker.name}"),
                       registered)
        elif broker.epoch is not None and now >= broker.next_heartbeat:
            broker.next_heartbeat = now + self.options.heartbeat_ticks
            leader = self._leader()
            if leader is not None:
                try:
                    leader.controller.heartbeat(broker.name, broker.epoch)
                except MqlogError as error:
                    self.trace(f"{broker.name} heartbeat: {error}")
                    if "register again" in str(error):
                        broker.epoch = None
        if now % 3 == 0:
            self._pull(broker)

    def _pull(self, broker: SimBroker) -> None:
        running = self._running()
        if not running:
            return
        answer = self.rng.choice(running).controller.metadata_since(broker.position)
        if "snapshot" in answer:
            snapshot = records.decode(answer["snapshot"])
            broker.view = ClusterMetadata().apply(snapshot, answer["position"])
            self.result.snapshots_pulled += 1
        for end, body in answer["records"]:
            broker.view = broker.view.apply(records.decode(body), end)
        broker.position = answer["position"]

    def _operator(self) -> None:
        live = sorted(self.created - self.deleted - self.unsure)
        if live and self.rng.random() < 0.3:
            name = self.rng.choice(live)
            self.unsure.add(name)

            def deleted(ok: bool, _proposal: Proposal | None) -> None:
                if ok:
                    self.deleted.add(name)
                    self.unsure.discard(name)
            self._call(lambda c: c.delete_topic(name), deleted)
            return
        self.topic_count += 1
        name = f"t{self.topic_count}"
        partitions, factor = self.rng.randint(1, 4), self.rng.randint(1, 3)
        layer = self.rng.choice(["isr", "raft", "master_slave"])
        self.unsure.add(name)

        def created(ok: bool, _proposal: Proposal | None) -> None:
            if ok:
                self.created.add(name)
                self.unsure.discard(name)
                self.result.topics_created += 1
        self._call(lambda c: c.create_topic(name, partitions, factor, layer), created)

    # --- faults ------------------------------------------------------------------------

    def _faults(self) -> None:
        rng, options = self.rng, self.options
        for node in self.nodes.values():
            if node.up and rng.random() < options.crash_probability:
                durable, kept = node.crash()
                node.controller.stop()  # (its waiters: outcome unknown)
                self.trace(f"crash {node.name}: flushed {durable}, kept {kept}")
            elif not node.up and rng.random() < options.restart_probability:
                node.start()
                self.trace(f"restart {node.name}: log [{node.store.first_segment_base()}, "
                           f"{node.store.written_position})")
        for broker in self.brokers.values():
            if broker.alive and rng.random() < options.death_probability:
                broker.alive, broker.epoch, broker.busy = False, None, False
                broker.life += 1
                broker.died_at = self.clock[0]
                self.trace(f"broker {broker.name} dies")
            elif not broker.alive and rng.random() < options.return_probability:
                broker.alive = True
                self.trace(f"broker {broker.name} comes back")
        if rng.random() < options.partition_probability:
            names = sorted(self.nodes)
            rng.shuffle(names)
            cut = names[:rng.randint(1, len(names) // 2)]
            for a in cut:
                for b in names[len(cut):]:
                    self.network.partition(a, b)
            self.trace(f"partition {cut}")
        elif self.network.partitioned and rng.random() < 0.05:
            self.network.heal()

    def _running(self) -> list[ControllerSimNode]:
        return [node for node in self.nodes.values() if node.up and not node.paused]

    # --- checkers ------------------------------------------------------------------------

    def _check_agreement(self, node: ControllerSimNode) -> None:
        controller = node.controller
        if controller.driver.serving:
            self.terms.add(node.core.term)
        digest = hashlib.sha256(controller.committed.describe().encode()).hexdigest()
        if controller.rebuilding:
            return
        seen = self.digests.setdefault(controller.applied_to, digest)
        if seen != digest:
            self.violation(f"{node.name} folded its log to {controller.applied_to} into a "
                           f"state unlike another controller's there")
        if controller.skipped:
            self.violation(f"{node.name} skipped {controller.skipped} committed records")
        self.result.trims = max(self.result.trims, node.store.first_segment_base())

    def _liveness(self) -> None:
        self.faulty = False
        self.network.options = NetworkOptions()
        self.network.heal()
        for node in self.nodes.values():
            if not node.up:
                node.start()
        for _ in range(self.options.liveness_ticks):
            self._step_all()
            if self._settled():
                break
        else:
            self.violation(f"did not settle in {self.options.liveness_ticks} ticks: "
                           + self._why_not_settled())
            return
        self._check_final()

    def _settled(self) -> bool:
        return not self._why_not_settled()

    def _why_not_settled(self) -> str:
        leaders = [node for node in self._running() if node.controller.serving]
        if len(leaders) != 1:
            return f"{len(leaders)} serving leaders"
        state = leaders[0].controller.committed
        for node in self._running():
            if node.controller.applied_to != leaders[0].controller.applied_to or \
                    node.controller.committed != state:
                return f"{node.name} folded to {node.controller.applied_to}"
        for broker in self.brokers.values():
            info = state.brokers.get(broker.name)
            if broker.alive and (broker.epoch is None or info is None or info.fenced
                                 or info.broker_epoch != broker.epoch):
                return f"live broker {broker.name} is not registered and unfenced"
            if not broker.alive and info is not None and not info.fenced:
                return f"dead broker {broker.name} is not fenced"
            # (by content: a view begun from a snapshot is positioned where the answer's
            # fold ended, which may be past the last record, at a leader's no-op)
            if broker.alive and (broker.view.brokers, broker.view.topics) != \
                    (state.brokers, state.topics):
                return f"broker {broker.name}'s view is at {broker.position}"
        return ""

    def _check_final(self) -> None:
        state = self._running()[0].controller.committed
        for name in sorted(self.created - self.deleted - self.unsure):
            if name not in state.topics:
                self.violation(f"acknowledged topic {name} is gone")
        for name in sorted(self.deleted):
            if name in state.topics:
                self.violation(f"topic {name}, deleted with an acknowledgement, is back")
        for topic in state.topics.values():
            for index, part in enumerate(topic.partitions):
                leader = state.brokers.get(part.leader)
                if topic.layer == "isr" and leader is not None and leader.fenced:
                    self.violation(f"{topic.name}/{index} is led by fenced {part.leader}")
        self.result.fences = sum(1 for line in self.result.trace if "missed its session" in line)

    def trace(self, text: str) -> None:
        self.result.trace.append(f"{self.clock[0]} {text}")

    def violation(self, text: str) -> None:
        self.result.violations.append(f"tick {self.clock[0]}: {text}")

    # --- what SimReplica asks of its simulator --------------------------------------------

    def observe(self, message: Any) -> None:
        pass

    def answered(self, node: Any, request: Any, status: Any) -> None:
        pass  # (the controller answers from its fold, not from the core's verdicts)


def run_seed(seed: int, test_break: str = "") -> ControllerSimResult:
    root = Path(tempfile.mkdtemp(prefix=f"mqlog-controller-sim-{seed}-"))
    try:
        return ControllerSwarm(seed, root, test_break).run()
    finally:
        shutil.rmtree(root, ignore_errors=True)

