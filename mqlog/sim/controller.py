"""The simulator for the controller: its Raft group, broker sessions and fencing, and the
metadata brokers pull, under one seed: its workload and checkers, run by the one harness
(harness.py) as the Raft and master-slave layers are.

Controllers are real stores with Raft cores run by the one driver (sim/raft.py's nodes:
simulated network and disk, power-loss crashes, the engine's real recovery), each with a
``Controller`` service (replication/controller/service.py) that folds its committed
records, and is rebuilt from its log on every restart. Snapshots are written every few
KiB and the logs trimmed behind them, so restarts begin at a snapshot and a follower
left behind gets a LogReset.

Brokers run the real agent (replication/controller/host.py ``BrokerAgent``, the code
``join_cluster`` runs in a broker process), each life over its own ``SimAgentIo``: its
requests travel the simulated network (delayed, lost, cut off by partitions; the client
times out) to the controllers' ``dispatch`` (the broker service's own code), answers
come back in a later broker phase of a tick, its timers run on the ticks, and its
hosting goes to a ``SimGroupHost`` that records what it was asked to host. So the agent
registers, heartbeats every ``heartbeat_ticks``, pulls ``metadata_since`` and folds
exactly as a broker process does. A broker may die (its life's IO closes: no answer or
timer of that life reaches it again, though requests already sent still arrive) and
come back (a new life: a new agent, which registers again, with a new broker epoch).
An operator creates and deletes topics now and then.

Checkers (a list of violations; empty is a pass):
* agreement: every controller that folded its log to position P holds the same state
  there (digests by position, across all controllers and restarts), and none skipped a
  committed record (the leader proposes only records that apply);
* no acknowledged create or delete is lost: the final state has every topic whose create
  was acknowledged (and not deleted since) and none whose delete was;
* fencing: no ISR-layer partition is led by a fenced broker once the cluster settled;
* liveness: with faults off (the network healed, for the brokers' requests too) and a
  majority of controllers up, a leader serves; every live broker ends registered and
  unfenced, every dead one fenced; every broker's pulled view equals the controllers'
  state and it hosts exactly the Raft partitions that state assigns it; every controller
  up holds that same state;
* an agent's note of a malformed answer (the controllers are real: never garbage);
* the metadata readers' (sim/readers.py): producers' ClusterClients and operators'
  describes read through the real handlers and the real client; no node answers an
  older state than it answered before, nor an empty one once the cluster has brokers
  (a controller caught up only once it folded a commit its leader made in its own
  term); once settled, every reader's view is the controller leader's
  state, with each ISR partition led by a live broker that hosts it.

``--break caught_up_on_leader_known`` (SIM_BREAKS: the simulator's own) gives the
controllers the caught-up rule of issue 16's CI failure; the readers catch it.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mqlog.config import ReplicationConfig
from mqlog.errors import InvalidArgument, MqlogError, NodeUnavailable
from mqlog.replication.controller.config import ControllerConfig
from mqlog.replication.controller.host import HOST_FAULT, Answer, BrokerAgent, dispatch
from mqlog.replication.controller.service import Controller, Proposal
from mqlog.replication.controller.state import ClusterMetadata
from mqlog.sim import harness
from mqlog.sim.harness import SIM_CLUSTER_ID, SeedResult, Simulation
from mqlog.sim.network import NetworkOptions
from mqlog.sim.raft import CORE_SETTINGS, RAFT_STORE_SETTINGS, RaftSimNode
from mqlog.sim.readers import Readers

TICK_MS = 10
# Breaks of the simulator's own making (the real code's are its modules' TEST_BREAKS):
# "caught_up_on_leader_known": controllers take the caught-up rule that answered a
# restarted controller's empty state (the first liveness bug the readers were built for):
# knowing a leader is enough, whether or not it folded the commit that leader announced.
SIM_BREAKS = ("caught_up_on_leader_known",)
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
        kind = _EagerController if self.test_break == "caught_up_on_leader_known" else \
            Controller
        self.controller = kind(self.controller_config, self.store, self.driver,
                                     tick_ms=TICK_MS, rng=random.Random(self.rng.random()),
                                     note=lambda text: self.sim.trace(f"{self.name}: {text}"),
                                     test_break=self.test_break)


class _EagerController(Controller):
    """A controller with the caught-up rule of SIM_BREAKS' caught_up_on_leader_known."""

    @property
    def caught_up(self) -> bool:
        core = self.driver.core
        return not self.rebuilding and (self.serving or bool(core.leader)
                                        and core.leader != core.node_id)


class SimAgentIo:
    """The simulator's AgentIo for one process life of one broker. A request travels the
    simulated network (1..``delay_ticks_max`` ticks each way; lost with the network's
    drop probability, or when a partition cuts the broker from that controller); at the
    controller it goes through ``dispatch`` (the broker service's own code), and a
    change is answered once its record is folded, or NodeUnavailable once the leader
    loses its lead or ``session_ticks`` pass (the service's own timeout). The client
    gives up after ``call_timeout_ticks`` (NodeUnavailable: the outcome unknown), as
    host.py's client does after CALL_TIMEOUT_S; a controller that is down refuses the
    connection at once. Timers run on the simulator's ticks. Once the life ends
    (``closed``) no answer or timer reaches it — but its requests already on the way
    still arrive (as bytes already sent do)."""

    def __init__(self, sim: ControllerSwarm, name: str) -> None:
        self.sim, self.name = sim, name
        self.closed = False

    def request(self, address: str, header: dict[str, Any], done: Answer) -> None:
        sim = self.sim
        settled = [False]

        def give(answer: dict[str, Any] | None, error: MqlogError | None) -> None:
            if settled[0]:  # (the first of an answer and the client's timeout wins)
                return
            settled[0] = True
            if answer is not None and header["kind"] == "register_broker":
                sim.result.registrations += 1
                sim.readers.registered()
            if answer is not None and "snapshot" in answer:
                sim.result.snapshots_pulled += 1
            done(answer, error)

        node = sim.by_address.get(address)
        if node is None or not node.up:
            sim.later(0, self, lambda: give(None, NodeUnavailable(f"cannot reach {address}")))
            return
        sim.later(sim.call_timeout_ticks, self, lambda: give(None, NodeUnavailable(
            f"{address} did not answer {header['kind']} in time: its outcome is unknown")))
        if not self._lost(node.name):
            sim.later(self._delay(), None, lambda: self._arrive(node, header, give))

    def _arrive(self, node: Any, header: dict[str, Any], give: Answer) -> None:
        """At the controller (if it is still up; a paused one answers when it resumes)."""
        if not node.up:
            return  # (its connection broke: the client's timeout answers)
        if node.paused:
            self.sim.later(1, None, lambda: self._arrive(node, header, give))
            return
        try:
            outcome = dispatch(node.controller, header, SIM_CLUSTER_ID)
        except MqlogError as error:
            self._reply(node, give, None, error)
            return
        if not isinstance(outcome, Proposal):
            self._reply(node, give, outcome, None)
            return
        proposal, settled = outcome, [False]

        def finish(ok: bool) -> None:
            if settled[0]:
                return
            settled[0] = True
            if ok:
                self._reply(node, give, proposal.answer, None)
            else:
                self._reply(node, give, None, NodeUnavailable(
                    "the controller lost its leadership (or took too long) before the change "
                    "committed: its outcome is unknown"))
        node.controller.wait(proposal, finish)
        self.sim.later(self.sim.options.session_ticks, None, lambda: finish(False))

    def _reply(self, node: Any, give: Answer, answer: dict[str, Any] | None,
               error: MqlogError | None) -> None:
        if not self._lost(node.name):
            self.sim.later(self._delay(), self, lambda: give(answer, error))

    def _lost(self, controller: str) -> bool:
        network = self.sim.network
        return frozenset((self.name, controller)) in network.partitioned or \
            self.sim.rng.random() < network.options.drop_probability

    def _delay(self) -> int:
        return self.sim.rng.randint(1, self.sim.network.options.delay_ticks_max)

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> None:
        self.sim.later(max(1, -(-delay_ms // TICK_MS)), self, callback)

    def note(self, text: str) -> None:
        self.sim.trace(f"{self.name}: {text}")
        if "malformed" in text or HOST_FAULT in text:  # (real controllers: never
            # garbage; the simulated host never fails: a fault there is the agent's bug)
            self.sim.violation(f"{self.name}: {text}")


class SimGroupHost:
    """The simulator's GroupHost: it records what the agent asked it to host (a spec
    unlike the one hosted under the same name is refused, as the broker refuses it)."""

    def __init__(self, name: str) -> None:
        self.broker_id, self.address = name, f"{name}.sim:9092"
        self.cluster_id = SIM_CLUSTER_ID
        self.groups: dict[str, Any] = {}

    def ensure_group(self, spec: Any) -> None:
        if self.groups.get(spec.name, spec) != spec:
            raise InvalidArgument(f"group {spec.name} is hosted with another spec")
        self.groups[spec.name] = spec

    def drop_group(self, name: str, delete_data: bool = False) -> None:
        del delete_data  # (no store to delete: the record of a spec goes)
        self.groups.pop(name, None)

    def reports(self) -> list[list[Any]]:
        return []

    def leads(self) -> list[list[Any]]:
        return []  # (the simulator runs no partition groups)

    def set_strays_aside(self, is_stray: Any) -> list[str]:
        return []  # (no stores on a disk: a spec dropped is gone)

    def follow_registrations(self, addresses: dict[str, str]) -> None:
        pass  # (no connections here: the simulator delivers by broker id)

    def role(self, name: str) -> dict[str, Any] | None:
        return None  # (no cores here: master-slave roles are not simulated)

    def change_role(self, name: str, header: dict[str, Any]) -> None:
        raise AssertionError("the agent changes no role where no core reports one")


@dataclass
class BrokerSlot:
    """A broker process: the real BrokerAgent of its current life (None while dead)."""

    name: str
    agent: BrokerAgent | None = None
    io: SimAgentIo | None = None
    host: Any = None  # its GroupHost (a SimGroupHost here; sim/brokers.py hosts real groups)
    died_at: int = -1
    lives: int = 0  # process lives begun (each names its registrations' incarnation)

    @property
    def alive(self) -> bool:
        return self.agent is not None


@dataclass
class ControllerSimResult(SeedResult):
    registrations: int = 0
    fences: int = 0  # FenceBroker records the controllers folded (a leader's)
    leaders: int = 0
    trims: int = 0  # the furthest log start any controller reached
    snapshots_pulled: int = 0
    topics_created: int = 0
    reads: int = 0  # metadata answers the readers checked

    def summary(self) -> str:
        options = self.options
        return (f"seed {self.seed}: {self.verdict} voters={options.voters} "
                f"brokers={options.brokers} leaders={self.leaders} "
                f"registrations={self.registrations} fences={self.fences} "
                f"topics={self.topics_created} log_start={self.trims} "
                f"snapshots_pulled={self.snapshots_pulled} reads={self.reads} "
                f"trace={self.digest}")


class ControllerSwarm(Simulation):
    """One simulated controller quorum, its brokers and an operator."""

    options: ControllerOptions
    result: ControllerSimResult
    nodes: dict[str, ControllerSimNode]
    prefix = "mqlog-controller-sim-"
    options_type: Any = ControllerOptions
    result_type: Any = ControllerSimResult

    def __init__(self, seed: int, root: Path, test_break: str = "") -> None:
        super().__init__(seed, self.options_type, self.result_type)
        names = tuple(f"c{index}" for index in range(self.options.voters))
        config = ControllerConfig(
            voters={name: f"sim:{name}" for name in names},
            broker_session_timeout_ms=self.options.session_ticks * TICK_MS,
            broker_heartbeat_interval_ms=self.options.heartbeat_ticks * TICK_MS,
            snapshot_interval_bytes=self.options.snapshot_interval_bytes,
            **self.partition_rules())
        self.nodes = {name: ControllerSimNode(
            name, root / name, self, STORE_SETTINGS, random.Random(self.rng.random()),
            self.options.flush_delay_ticks_max, test_break,
            config=ReplicationConfig(layer="raft", node_id=name, voters=names,
                                     cluster_id="controller", **CORE_SETTINGS),
            core_rng=self.rng, controller_config=config) for name in names}
        self.by_address = {f"sim:{name}": node for name, node in self.nodes.items()}
        self.timers: list[tuple[int, int, SimAgentIo | None, Callable[[], None]]] = []
        self.call_timeout_ticks = max(2, self.options.session_ticks // 2)
        self.timer_count = 0
        self.agent_config = config
        self.brokers = {f"b{index}": BrokerSlot(f"b{index}")
                        for index in range(self.options.brokers)}
        self.digests: dict[int, str] = {}  # position -> state digest (agreement)
        self.created: set[str] = set()  # acknowledged creates
        self.deleted: set[str] = set()  # acknowledged deletes (or tried: outcome unknown)
        self.unsure: set[str] = set()  # creates or deletes whose outcome is unknown
        self.topic_count = 0
        self.faulty = True
        self.terms: set[int] = set()
        self.readers = Readers(self, seed)
        self.prepare(root, test_break)
        for node in self.nodes.values():
            node.start()
        for broker in self.brokers.values():
            self._begin_life(broker)

    # --- what a simulation of brokers hosting real groups changes (sim/brokers.py) -----------

    def partition_rules(self) -> dict[str, Any]:
        """ControllerConfig fields beyond the sessions' (the ISR rules)."""
        return {}

    def prepare(self, root: Path, test_break: str) -> None:
        """Before the controllers and brokers start (after the options are drawn)."""

    def new_host(self, broker: BrokerSlot) -> Any:
        """The GroupHost of a broker's new life."""
        return SimGroupHost(broker.name)

    def attach(self, broker: BrokerSlot) -> None:
        """A broker's new agent exists (its host may join it)."""

    def host_dies(self, broker: BrokerSlot) -> None:
        """A broker's life ends: what its host holds dies with it."""

    def broker_paused(self, name: str) -> bool:
        """Whether broker ``name``'s process is stopped now (SIGSTOP)."""
        return False

    def hosted(self, broker: BrokerSlot) -> set[str]:
        """The groups a live broker hosts now."""
        return set(broker.host.groups)

    def leads(self, broker: str, group: str) -> bool | None:
        """Whether ``broker``'s replica of ``group`` serves it (None: no core runs it)."""
        return None

    # --- the run (harness.py runs these) ------------------------------------------------

    def safety_tick(self, tick: int) -> None:
        self._faults()
        self._step_all()

    def finish(self) -> None:
        self.result.leaders = len(self.terms)
        self.result.reads = self.readers.answers

    def _step_all(self) -> None:
        self.advance_clock()
        running = self.running()
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
        self._brokers_run()
        self.readers.tick()
        if self.faulty and self.rng.random() < self.options.operator_probability:
            self._operator()
        for node in self.running():  # (what the brokers and the operator proposed)
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
        leaders = [node for node in self.running() if node.controller.serving]
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

    def _begin_life(self, broker: BrokerSlot) -> None:
        """A broker process starts: a new agent, host and IO (nothing of its last life)."""
        broker.io, broker.host = SimAgentIo(self, broker.name), self.new_host(broker)
        broker.lives += 1  # a seeded incarnation, as long as a real one (a uuid's 32 hex
        # digits): the same seed writes the same records, byte for byte
        incarnation = hashlib.sha256(
            f"{self.result.seed}/{broker.name}/{broker.lives}".encode()).hexdigest()[:32]
        broker.agent = BrokerAgent(broker.host, self.agent_config, broker.io,
                                   rng=random.Random(self.rng.random()),
                                   incarnation=incarnation)
        self.attach(broker)
        broker.io.call_later(0, broker.agent.start)

    def _end_life(self, broker: BrokerSlot) -> None:
        assert broker.io is not None
        self.host_dies(broker)
        broker.io.closed = True  # (its connections and timers die with the process)
        broker.agent = broker.io = broker.host = None
        broker.died_at = self.clock[0]

    def later(self, ticks: int, io: SimAgentIo | None, callback: Callable[[], None]) -> None:
        """Call ``callback`` in the broker phase ``ticks`` from now (unless ``io`` closed
        by then: the end of a broker's life)."""
        self.timer_count += 1
        heapq.heappush(self.timers, (self.clock[0] + ticks, self.timer_count, io, callback))

    def _brokers_run(self) -> None:
        """The brokers' phase of a tick: answers and timers due by now, in order (those of
        a paused broker wait until it resumes)."""
        held = []
        while self.timers and self.timers[0][0] <= self.clock[0]:
            timer = heapq.heappop(self.timers)
            io, callback = timer[2], timer[3]
            if io is not None and self.broker_paused(io.name):
                held.append(timer)
            elif io is None or not io.closed:
                callback()
        for _due, count, io, callback in held:
            heapq.heappush(self.timers, (self.clock[0] + 1, count, io, callback))

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
                self.readers.crashed(node.name, durable)
                self.trace(f"crash {node.name}: flushed {durable}, kept {kept}")
            elif not node.up and rng.random() < options.restart_probability:
                node.start()
                self.trace(f"restart {node.name}: log [{node.store.first_segment_base()}, "
                           f"{node.store.written_position})")
        for broker in self.brokers.values():
            if broker.alive and rng.random() < options.death_probability:
                self._end_life(broker)
                self.trace(f"broker {broker.name} dies")
            elif not broker.alive and rng.random() < options.return_probability:
                self._begin_life(broker)
                self.trace(f"broker {broker.name} comes back")
        self.partition_minority(options.partition_probability)
        if rng.random() < options.partition_probability:  # a broker cut off from some
            alone = rng.choice(sorted(self.brokers))  # controllers (healed with the rest)
            cut = rng.sample(sorted(self.nodes), rng.randint(1, len(self.nodes)))
            for name in cut:
                self.network.partition(alone, name)
            self.trace(f"partition {alone} from {cut}")

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

    def liveness(self) -> None:
        self.faulty = False
        self.calm()
        for node in self.nodes.values():
            if not node.up:
                node.start()
        if not self.run_until(self._step_all, self._settled):
            self.violation(f"did not settle in {self.options.liveness_ticks} ticks: "
                           + self._why_not_settled())
            return
        self._check_final()

    def _settled(self) -> bool:
        return not self._why_not_settled()

    def _why_not_settled(self) -> str:
        leaders = [node for node in self.running() if node.controller.serving]
        if len(leaders) != 1:
            return f"{len(leaders)} serving leaders"
        state = leaders[0].controller.committed
        for node in self.running():
            if node.controller.applied_to != leaders[0].controller.applied_to or \
                    node.controller.committed != state:
                return f"{node.name} folded to {node.controller.applied_to}"
        for broker in self.brokers.values():
            info = state.brokers.get(broker.name)
            agent = broker.agent
            if agent is None:
                if info is not None and not info.fenced:
                    return f"dead broker {broker.name} is not fenced"
                continue
            if agent.epoch is None or info is None or info.fenced or \
                    info.broker_epoch != agent.epoch:
                return f"live broker {broker.name} is not registered and unfenced"
            # (by content: a view begun from a snapshot is positioned where the answer's
            # fold ended, which may be past the last record, at a leader's no-op)
            if (agent.view.brokers, agent.view.topics) != (state.brokers, state.topics):
                return f"broker {broker.name}'s view is at {agent.position}"
            assert broker.host is not None
            if self.hosted(broker) != _assigned(state, broker.name):
                return (f"broker {broker.name} hosts {sorted(self.hosted(broker))}, not what "
                        f"the state assigns it: {sorted(_assigned(state, broker.name))}")
        return self.readers.unsettled(state, self.leads)

    def _check_final(self) -> None:
        state = self.running()[0].controller.committed
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


def _assigned(state: ClusterMetadata, broker: str) -> set[str]:
    """The groups ``state`` has ``broker`` host: one per Raft, ISR or master-slave partition
    it replicates."""
    return {f"{topic.name}-{index}" for topic in state.topics.values()
            if topic.layer in ("raft", "isr", "master_slave")
            for index, part in enumerate(topic.partitions) if broker in part.replicas}


def run_seed(seed: int, test_break: str = "") -> ControllerSimResult:
    return harness.run_seed(ControllerSwarm, seed, test_break, ControllerSwarm.prefix)

