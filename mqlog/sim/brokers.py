"""Simulated brokers that host real replica groups, as a broker process does (DESIGN §5.2):
the IO is simulated, the program is the one that runs.

A ``SimBroker`` is one process life of a broker, seen from the code that runs in a real
broker: it has what ``BrokerGroups`` (replication/controller/host.py, the GroupHost of a
real broker) reads — ``broker_id``, ``config.listen``, ``groups``, ``ensure_group``,
``drop_group`` — and what ``attach_isr`` (the same file: ISR metadata to the cores,
AlterPartition to the agent) sets — ``alter_partition``. So the simulator's brokers run
the real BrokerAgent over the real BrokerGroups, and the agent's hosting lands here.

Each hosted Raft or ISR group is a ``SimGroup``: a real store in its own directory under
the broker's simulated data dir (``brokers/BROKER/GROUP``), the core the spec names
(``core_for``, as node.py builds it: an ISR core gets its leader and ISR from the
controller, through attach_isr), and the one Driver (replication/driver.py) with the
spec's idempotence limits. Only its IO is simulated (sim/node.py's SimReplica: flushes
that complete later, the hard state durable once saved — kept per broker on its
simulated disk, so a new life finds it). A master-slave group is recorded, not hosted:
its roles are not simulated (the agent asks its core for none).

One connection per peer pair. Every group's messages between two brokers travel the one
simulated network of the brokers, tagged with their group and topic id (sim/network.py,
as broker.py tags frames), and the receiving broker routes each frame with broker.py's
own ``route_peer_frame``: a message for a group it does not host (not yet, or no
longer), or for another topic under the same group name, is dropped and counted; a
partition between two brokers cuts every group's messages at once.

Death. A broker dies whole: every group on it at once, as its process does. A SIGKILL
(``power=False``) leaves what the store had written (the page cache survives: the next
life recovers it through the engine's real recovery, without a clean close); a power
loss (``power=True``) also loses what was not flushed — of each group's store — now and
then with a torn last write (sim/node.py's power_off).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import mqlog
from mqlog.config import GroupSpec
from mqlog.errors import InvalidArgument, UnknownGroup
from mqlog.replication import core_for
from mqlog.replication.broker import route_peer_frame
from mqlog.replication.driver import Answer, Driver
from mqlog.replication.isr import core as isr_core
from mqlog.replication.isr.core import CONTROLLER
from mqlog.replication.messages import Message
from mqlog.replication.raft import core as raft_core
from mqlog.replication.wire import Frame
from mqlog.sim.harness import SIM_CLUSTER_ID
from mqlog.sim.node import SimReplica


@dataclass
class SimGroup(SimReplica):
    """One hosted replica group of a SimBroker (see the module docstring). ``name`` is the
    group's name (what attach_isr and the agent call it)."""

    spec: Any = None
    broker: Any = None  # the SimBroker hosting it
    disk: dict[str, Any] = field(default_factory=dict)  # the broker's saved hard states
    checked: int = 0  # its log agrees with the committed prefix up to here
    commit_seen: int = 0

    def start(self) -> None:
        self.hard_state = self.disk.get(self.name)
        self.store = mqlog.open(self.path, clock_ms=lambda: self.sim.clock[0],
                                **self.store_settings)
        self.incarnation += 1
        self.flushes = []
        self.checked = self.commit_seen = 0
        self.core = self.new_core()
        replication = self.spec.replication
        self.driver = Driver(self.driver_store(), self.core, self,
                             window_bytes=replication.idempotence_window_bytes,
                             sequences_max=replication.idempotence_sequences_max,
                             test_break=self.test_break)
        self.up, self.paused = True, False

    def new_core(self) -> Any:
        """The core node.py builds for this spec (seeded here where it draws randomness)."""
        replication = self.spec.replication
        if replication.layer == "isr":
            brk = self.test_break if self.test_break in isr_core.TEST_BREAKS else ""
            return core_for(replication, self.store, test_break=brk)
        brk = self.test_break if self.test_break in raft_core.TEST_BREAKS else ""
        return core_for(replication, self.store, rng=random.Random(self.rng.randrange(1 << 62)),
                        hard_state=self.hard_state, test_break=brk)

    @property
    def broker_id(self) -> str:
        return str(self.broker.broker_id)

    # --- the driver's Io (node.py's, over the simulated network) -------------------------

    def send(self, messages: list[Message]) -> None:
        for message in messages:
            if message.dst == CONTROLLER:  # an ISR leader's AlterPartition: to the agent
                if self.broker.alter_partition is not None:
                    self.broker.alter_partition(self, message)
                continue
            self.sim.observe(message)
            self.sim.peers.send(message, self.name, self.spec.topic_id)

    def save_hard_state(self, state: Any) -> None:
        self.hard_state = self.disk[self.name] = state
        self.saved_hard_state = True

    def note(self, event: str) -> None:
        self.sim.trace(f"{self.broker_id}/{self.name}: {event}")

    def failed(self, error: BaseException) -> None:
        self.sim.violation(f"{self.broker_id}/{self.name} could not carry out its Ready: "
                           f"{error!r}")

    def refused(self, error: BaseException) -> None:  # (no simulated peer sends garbage)
        self.failed(error)

    def answer(self, request: Any, status: Answer) -> None:
        self.sim.answered(self, request, status)

    def schedule(self) -> None:
        """(node.py's: run the driver soon. The simulator runs every driver every tick.)"""

    def kill(self) -> None:
        """The process is killed: what the store wrote stays (the page cache survives)."""
        self.written_when_down = self.durable_when_down = self.store.written_position
        self.store.abandon(f"broker {self.broker_id} was killed")
        self.up = self.paused = False
        self.flushes = []


class SimBroker:
    """One process life of a broker, as BrokerGroups and attach_isr see it (see the module
    docstring)."""

    def __init__(self, sim: Any, name: str, root: Path, disk: dict[str, Any],
                 store_settings: dict[str, Any], test_break: str) -> None:
        self.sim, self.broker_id, self.root, self.disk = sim, name, root, disk
        self.config = SimpleNamespace(listen=f"{name}.sim:9092", rack="", cluster_id=SIM_CLUSTER_ID,
                                      data_dir=root, groups_max=4096, groups=())
        self.store_settings, self.test_break = store_settings, test_break
        self.groups: dict[str, SimGroup] = {}
        self.recorded: dict[str, GroupSpec] = {}  # master-slave groups: not simulated
        self.alter_partition: Any = None  # set by attach_isr
        self.misaddressed = 0  # messages for a group not hosted here

    def ensure_group(self, spec: GroupSpec) -> SimGroup | None:
        """Host ``spec``'s group unless it is hosted with an equal spec (broker.py's rule:
        another spec under the same name is refused)."""
        spec = spec.for_broker(self.broker_id)
        existing = self.groups.get(spec.name)
        known = existing.spec if existing is not None else self.recorded.get(spec.name)
        if known is not None:
            if known != spec:
                raise InvalidArgument(f"group {spec.name!r} is hosted here with another spec")
            return existing
        if spec.replication.layer == "master_slave":
            self.recorded[spec.name] = spec
            return None
        group = SimGroup(spec.name, self.root / spec.name, self.sim, self.store_settings,
                         random.Random(self.sim.rng.random()),
                         self.sim.options.flush_delay_ticks_max, self.test_break,
                         spec=spec, broker=self, disk=self.disk)
        group.start()
        self.groups[spec.name] = group
        store = group.store
        self.sim.trace(f"{self.broker_id} hosts {spec.name}: log "
                       f"[{store.first_segment_base()}, {store.written_position})")
        return group

    def drop_group(self, name: str, delete_data: bool = False) -> None:
        del delete_data  # (no simulated topic is ever deleted)
        group = self.groups.pop(name, None)
        if group is None and self.recorded.pop(name, None) is None:
            raise UnknownGroup(f"broker {self.broker_id} hosts no group {name!r}")
        if group is not None:
            group.driver.abandon_waiting()
            group.store.close()
            group.up = False

    def follow_registrations(self, addresses: dict[str, str]) -> None:
        """(BrokerGroups tells the broker where to dial; the simulated network delivers
        by broker id, so there is nothing to dial.)"""

    def deliver(self, frame: Frame, peer: str) -> None:
        """A frame from broker ``peer`` for one of this broker's groups, routed as
        broker.py routes it (``route_peer_frame``)."""
        routed = route_peer_frame(self.groups, "", peer, frame)
        if routed is None or not routed[0].up:
            self.misaddressed += 1
            return
        group, message = routed
        group.driver.step(message)

    def die(self, power: bool) -> None:
        """Every group at once: a SIGKILL, or a power loss (see the module docstring)."""
        for name in sorted(self.groups):
            group = self.groups[name]
            if power:
                durable, kept = group.crash()
                self.sim.trace(f"{self.broker_id}/{name} lost its power: flushed {durable}, "
                               f"kept {kept}")
            else:
                group.kill()
        self.groups = {}
        self.recorded = {}
