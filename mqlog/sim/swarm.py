"""The deterministic simulator (TigerBeetle's VOPR idea): one seed, one run, one verdict.

A seed decides everything: the options (master role, slaves needed, how lossy and slow
the network is, how often nodes crash, whether an operator promotes a slave when the
master is gone) and every choice at every tick. Nodes are real mqlog stores with
master-slave cores; the simulator is their driver. Time is a tick counter, the stores'
clock is that counter, and the network is ``network.SimNetwork``.

Disk. A node's store is durable up to the last time the simulator flushed it (the
master is flushed before each write is proposed, as with sync flush; slaves now and
then). A crash cuts the store back to that point — the bytes a power loss would take —
then closes it; a restart opens it again with a fresh core.

Phases. In the safety phase faults happen; then the liveness phase heals the network,
restarts every node, stops all faults and must converge: every node's log identical
to the master's, nothing in flight, no write waiting.

Checkers (a list of violations; empty is a pass):
* sync promise: when a SYNC_MASTER resolves PUT_OK, ``in_sync_slaves_min`` slaves hold
  the record byte for byte;
* no acknowledged write lost: at the end every PUT_OK record is in the master's log at
  its position, unchanged (an ASYNC_MASTER's may be lost by a promotion — its promise —
  and are counted, not failed);
* positions monotonic: a log never ends sooner than before except by a truncation
  its core asked for (or a crash);
* one master per epoch; logs byte-identical after convergence; convergence itself.
The trace digest makes "the same seed gives the same run" checkable.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mqlog
from mqlog.config import ReplicationConfig
from mqlog.errors import MqlogError
from mqlog.replication.core import apply_to_log
from mqlog.replication.master_slave import MasterSlaveCore
from mqlog.results import PutStatus
from mqlog.sim.network import NetworkOptions, SimNetwork

STORE_SETTINGS: dict[str, Any] = dict(
    segment_size_bytes=64 * 1024, message_size_bytes_max=16 * 1024,
    consume_queue_entries_per_file=64, index_slots_per_file=64, index_entries_per_file=512,
    flush_interval_ms=3_600_000, retention_ms=-1)
CORE_SETTINGS: dict[str, Any] = dict(
    heartbeat_ticks=5, slave_timeout_ticks=30, sync_timeout_ticks=60, retransmit_ticks=10,
    append_bytes_max=4096, inflight_bytes_max=16384, frame_size_bytes_max=64 * 1024)


@dataclass
class Options:
    role: str
    in_sync_slaves_min: int
    slave_ack: str
    network: NetworkOptions
    put_probability: float
    crash_probability: float
    restart_probability: float
    partition_probability: float
    flush_probability: float
    promote: bool
    safety_ticks: int = 400
    liveness_ticks: int = 800

    @classmethod
    def from_rng(cls, rng: random.Random) -> Options:
        role = rng.choice(["SYNC_MASTER", "ASYNC_MASTER"])
        return cls(role=role, in_sync_slaves_min=rng.choice([1, 2]),
                   slave_ack=rng.choice(["written", "flushed"]),
                   network=NetworkOptions(rng.choice([0.0, 0.02, 0.15]),
                                          rng.choice([0.0, 0.05]), rng.choice([1, 3, 12])),
                   put_probability=rng.choice([0.2, 0.6]),
                   crash_probability=rng.choice([0.0, 0.003, 0.01]),
                   restart_probability=0.05, partition_probability=rng.choice([0.0, 0.01]),
                   flush_probability=0.05, promote=rng.random() < 0.5)


@dataclass
class SimNode:
    name: str
    path: Path
    config: ReplicationConfig
    clock: list[int]
    test_break: str = ""
    store: Any = None
    core: Any = None
    durable: int = 0  # the store is durable up to here (the simulator flushed it)
    freshness_when_down: tuple[int, int] = (-1, 0)  # (last record's epoch, end) at the crash
    up: bool = False

    def start(self) -> None:
        self.store = mqlog.open(self.path, clock_ms=lambda: self.clock[0], **STORE_SETTINGS)
        self.durable = self.store.written_position
        self.core = MasterSlaveCore(self.config, DurableView(self), test_break=self.test_break)
        self.up = True

    def crash(self) -> None:
        self.store.truncate(self.durable)  # what a power loss takes
        self.freshness_when_down = self.freshness()
        self.store.close()
        self.up = False

    def freshness(self) -> tuple[int, int]:
        """(epoch of the last record, end of the log): how up to date the log is."""
        if not self.up:
            return self.freshness_when_down
        end = self.store.written_position
        epoch = self.store.epoch_at(end)
        return (-1 if epoch is None else epoch, end)

    def flush(self) -> None:
        self.store.flush()
        self.durable = self.store.written_position


class DurableView:
    """A node's store as its core sees it, with the simulator's notion of flushed (the
    node has ``store`` and ``durable``; the Raft simulator's nodes use it too)."""

    def __init__(self, node: Any) -> None:
        self._node = node

    def __getattr__(self, name: str) -> Any:
        return getattr(self._node.store, name)

    @property
    def flushed_position(self) -> int:
        return self._node.durable


@dataclass
class Acked:
    position: int
    end: int
    body: bytes
    epoch: int


@dataclass
class SeedResult:
    """What one seed's run found (both simulators): violations, and a trace whose digest
    shows that the same seed gives the same run."""

    seed: int
    options: Any
    violations: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)
    acked: int = 0

    @property
    def digest(self) -> str:
        return hashlib.sha256("\n".join(self.trace).encode()).hexdigest()[:16]

    @property
    def verdict(self) -> str:
        return "PASS" if not self.violations else f"FAIL ({len(self.violations)})"


@dataclass
class SimResult(SeedResult):
    lost_by_design: int = 0

    def summary(self) -> str:
        verdict = self.verdict
        return (f"seed {self.seed}: {verdict} role={self.options.role} "
                f"min={self.options.in_sync_slaves_min} acked={self.acked} "
                f"lost_by_design={self.lost_by_design} trace={self.digest}")


class Swarm:
    """One simulated master-slave group; see the module docstring."""

    def __init__(self, seed: int, root: Path, test_break: str = "") -> None:
        self.rng = random.Random(seed)
        self.options = Options.from_rng(self.rng)
        self.result = SimResult(seed, self.options)
        self.network = SimNetwork(self.rng, self.options.network)
        self.clock = [1]
        self.master = "n0"
        self.masters_by_epoch: dict[int, set[str]] = {}
        self.acked: dict[str, Acked] = {}
        self.pending: dict[str, Acked] = {}
        self.down_since: dict[str, int] = {}
        self.promoted = False
        self.nodes = {name: SimNode(name, root / name, self._config(name), self.clock,
                                    test_break) for name in ("n0", "n1", "n2")}
        for node in self.nodes.values():
            node.start()
        self.puts = 0

    def _config(self, name: str) -> ReplicationConfig:
        slaves = tuple(other for other in ("n0", "n1", "n2") if other != self.master)
        role = self.options.role if name == self.master else "SLAVE"
        return ReplicationConfig(node_id=name, role=role,  # type: ignore[arg-type]
                                 master=self.master if role == "SLAVE" else "",
                                 slaves=slaves if role != "SLAVE" else (),
                                 in_sync_slaves_min=self.options.in_sync_slaves_min,
                                 slave_ack=self.options.slave_ack,  # type: ignore[arg-type]
                                 **CORE_SETTINGS)

    # --- the run --------------------------------------------------------------------

    def run(self) -> SimResult:
        try:
            for _ in range(self.options.safety_ticks):
                self._faults()
                self._step_all()
            self._liveness()
            self._check_end()
        finally:
            for node in self.nodes.values():
                if node.up:
                    node.store.close()
        self.result.acked = len(self.acked)
        return self.result

    def _step_all(self) -> None:
        self.clock[0] += 1
        self.network.now = self.clock[0]
        master = self.nodes[self.master]
        if master.up and master.core.status()["accepts_writes"] and \
                self.rng.random() < self.options.put_probability:
            self._put(master)
        for node in self._up_nodes():
            node.core.tick()
            self._carry_out(node)
        for message in self.network.due():
            node = self.nodes[message.dst]
            if node.up:
                self.result.trace.append(f"{self.clock[0]} {message!r}")
                node.core.step(message)
                self._carry_out(node)
        self._check_masters()

    def _put(self, master: SimNode) -> None:
        self.puts += 1
        request, body = f"w{self.puts}", f"{self.result.seed}/{self.puts}".encode() * 3
        result = master.store.put("t", body)
        master.flush()
        self.pending[request] = Acked(result.position, result.end_position, body,
                                      master.core.epoch)
        master.core.propose(request, result.end_position)
        self._carry_out(master)

    def _carry_out(self, node: SimNode) -> None:
        ready = node.core.ready()
        store = node.store
        before = store.written_position
        try:
            apply_to_log(ready, store)  # (reset, truncate, append, set the epoch)
            if ready.reset_log is not None:  # (a reset is synced when it is done)
                node.durable = ready.reset_log[0]
            if ready.truncate_to is not None:
                node.durable = min(node.durable, ready.truncate_to)
        except MqlogError as error:
            self.result.violations.append(f"tick {self.clock[0]}: {node.name} could not "
                                          f"carry out its Ready: {error}")
        floor = before if ready.truncate_to is None else min(before, ready.truncate_to)
        if store.written_position < floor:
            self.result.violations.append(f"tick {self.clock[0]}: {node.name}'s log went back "
                                          f"from {before} to {store.written_position} "
                                          "without a truncation")
        if ready.must_sync:
            node.flush()
        for message in ready.messages + ready.messages_after_persist:
            self.network.send(message)
        for request, status in ready.resolved:
            self._resolved(node, request, status)
        self.result.trace += [f"{self.clock[0]} {node.name}: {event}" for event in ready.events]
        node.core.advance(ready)

    def _resolved(self, node: SimNode, request: str, status: PutStatus) -> None:
        self.result.trace.append(f"{self.clock[0]} {node.name}: {request} {status.value}")
        acked = self.pending.pop(request)
        if status is not PutStatus.PUT_OK:
            return
        self.acked[request] = acked
        if node.core.role == "SYNC_MASTER" and self.options.slave_ack == "flushed":
            # An ack of a written (not flushed) position is RocketMQ's promise: in a
            # slave's memory, which a power loss may take; only flushed acks are checked.
            holders = [other for other in self.nodes.values() if other is not node and (
                _holds(other, acked) if other.up else other.durable >= acked.end)]
            if len(holders) < self.options.in_sync_slaves_min:
                self.result.violations.append(
                    f"tick {self.clock[0]}: {request} acked PUT_OK by a SYNC_MASTER but only "
                    f"{len(holders)} slaves hold it (need {self.options.in_sync_slaves_min})")

    # --- faults -----------------------------------------------------------------------

    def _faults(self) -> None:
        rng, options = self.rng, self.options
        for node in self.nodes.values():
            if node.up and rng.random() < options.crash_probability:
                self.result.trace.append(f"{self.clock[0]} crash {node.name}")
                node.crash()
                if node.name == self.master:
                    self.pending.clear()  # their clients saw the connection drop: no ack
                self.down_since[node.name] = self.clock[0]
            elif not node.up and rng.random() < options.restart_probability and \
                    not (options.promote and node.name == self.master):
                self._restart(node)  # (a dead master waits for the operator's promotion)
            elif node.up and rng.random() < options.flush_probability:
                node.flush()
        if rng.random() < options.partition_probability:
            a, b = rng.sample(sorted(self.nodes), 2)
            self.network.partition(a, b)
            self.result.trace.append(f"{self.clock[0]} partition {a} {b}")
        elif self.network.partitioned and rng.random() < 0.05:
            self.network.heal()
        self._maybe_promote()

    def _restart(self, node: SimNode) -> None:
        self.result.trace.append(f"{self.clock[0]} restart {node.name}")
        node.config = self._config(node.name)
        node.start()
        self.down_since.pop(node.name, None)

    def _maybe_promote(self) -> None:
        """An operator promotes the most up-to-date slave when the master stays down: the
        highest (last record's epoch, durable end) among all the others, restarted first
        if it is down, into an epoch above every node's."""
        down = self.down_since.get(self.master)
        if not self.options.promote or down is None or self.clock[0] - down < 50:
            return
        candidates = [node for node in self.nodes.values() if node.name != self.master]
        # By the log, not by the epoch a node has heard of: a slave told to truncate by a
        # newer master knows that master's epoch but may hold less than the others.
        chosen = max(candidates, key=lambda node: (*node.freshness(), node.name))
        if not chosen.up:
            self._restart(chosen)
        epoch = max(node.core.epoch for node in self.nodes.values()) + 1
        self.result.trace.append(f"{self.clock[0]} promote {chosen.name} epoch {epoch}")
        self.master = chosen.name
        self.promoted = True
        chosen.core.promote(self.options.role,
                            tuple(name for name in sorted(self.nodes) if name != chosen.name),
                            epoch=epoch)
        chosen.config = self._config(chosen.name)
        self._carry_out(chosen)
        for node in self._up_nodes():
            if node is not chosen:  # the operator points the other slaves at it
                node.config = self._config(node.name)
                node.core = MasterSlaveCore(node.config, DurableView(node),
                                            test_break=node.test_break)

    # --- liveness and the checkers ------------------------------------------------------

    def _liveness(self) -> None:
        self.network.options = NetworkOptions()
        self.network.heal()
        for node in self.nodes.values():
            if not node.up:
                self._restart(node)
        for _ in range(self.options.liveness_ticks):
            self._step_all()
            if self._converged():
                return
        self.result.violations.append(
            f"did not converge in {self.options.liveness_ticks} ticks: written positions "
            f"{ {n.name: n.store.written_position for n in self.nodes.values()} }, "
            f"{self.network.in_flight} messages in flight, {len(self.pending)} writes waiting")

    def _converged(self) -> bool:
        ends = {node.store.written_position for node in self.nodes.values()}
        return len(ends) == 1 and not self.pending and self.network.in_flight == 0

    def _check_end(self) -> None:
        master = self.nodes[self.master]
        images = {name: _image(node.store) for name, node in self.nodes.items()}
        if len(set(images.values())) != 1:
            self.result.violations.append("logs differ after convergence")
        # What a promotion may lose by design: an ASYNC_MASTER's acks, and a SYNC_MASTER's
        # acks of written (not flushed) slave positions, which a slave's crash can take.
        promise_holds = not self.promoted or (self.options.role == "SYNC_MASTER"
                                              and self.options.slave_ack == "flushed")
        for request, acked in sorted(self.acked.items()):
            if not _holds(master, acked):
                if not promise_holds:
                    self.result.lost_by_design += 1
                else:
                    self.result.violations.append(f"acknowledged write {request} at "
                                                  f"{acked.position} was lost")

    def _check_masters(self) -> None:
        for node in self._up_nodes():
            if node.core.is_master:
                self.masters_by_epoch.setdefault(node.core.epoch, set()).add(node.name)
        for epoch, names in self.masters_by_epoch.items():
            if len(names) > 1:
                self.result.violations.append(f"epoch {epoch} had masters {sorted(names)}")
                self.masters_by_epoch[epoch] = {min(names)}  # report it once

    def _up_nodes(self) -> list[SimNode]:
        return [node for node in self.nodes.values() if node.up]


def _holds(node: SimNode, acked: Acked) -> bool:
    """Whether the node's log has the acknowledged record, intact, where it was put."""
    try:
        record = node.store.read_record(acked.position)
    except MqlogError:
        return False
    return record.body == acked.body and record.end_position == acked.end


def _image(store: Any) -> bytes:
    chunks, position, end = [], store.first_segment_base(), store.written_position
    while position < end:
        data = store.read_raw(position, 1 << 20)
        chunks.append(data)
        position += len(data)
    return hashlib.sha256(b"".join(chunks)).digest()


def run_seed(seed: int, test_break: str = "") -> SimResult:
    root = Path(tempfile.mkdtemp(prefix=f"mqlog-sim-{seed}-"))
    try:
        return Swarm(seed, root, test_break).run()
    finally:
        shutil.rmtree(root, ignore_errors=True)
