"""The deterministic simulator (TigerBeetle's VOPR idea): one seed, one run, one verdict.

A seed decides everything: the options (master role, slaves needed, how lossy and slow
the network is, how often nodes crash, whether an operator promotes a slave when the
master is gone) and every choice at every tick. Nodes are real mqlog stores with
master-slave cores run by the one driver (mqlog/replication/driver.py) over a simulated
network and disk (sim/node.py, shared with the Raft simulator: several messages per
Ready, flushes that complete later, crashes that lose unflushed bytes and recover for
real). Time is a tick counter, the stores' clock is that counter, and the network is
``network.SimNetwork``. Each node's store flushes as production's async flusher does:
now and then, on its own schedule (``flush_probability`` per tick), and slaves also when
their core asks. The master runs ``flush_mode = "async"`` (the default) in most seeds: a
SYNC_MASTER acknowledges a write once enough slaves have it, not once its own disk has
it, so a power loss can take acknowledged records from the master that only slaves hold
now (issue 13's restarted-master hole). Some seeds run it with sync flush (each write
flushed before it is proposed).

Phases. In the safety phase faults happen; then the liveness phase heals the network,
restarts every node but maybe one slave (VOPR's rule: it may stay down), stops all
faults and must converge: every running node's log identical to the master's, nothing
in flight, no write waiting. A restarted SYNC_MASTER that must hear the slave left down
(it may hold acknowledged records no other node has) waits for it by design; the
simulator's operator then brings that slave back.

Checkers (a list of violations; empty is a pass):
* sync promise: when a SYNC_MASTER resolves PUT_OK, ``in_sync_slaves_min`` slaves hold
  the record byte for byte;
* no acknowledged write lost: at the end every PUT_OK record is in the master's log at
  its position, unchanged. Lost by design, counted and not failed: an ASYNC_MASTER's acks
  and a SYNC_MASTER's acks of written (not flushed) slave positions after a promotion,
  and any ack whose every holder at the time (the master and the slaves that had it)
  lost power before its copy was durable (an ASYNC_MASTER's ack sits in its memory only);
* positions monotonic: a log never ends sooner than before except by a truncation
  its core asked for (or a crash);
* one master per epoch; logs byte-identical after convergence; convergence itself.
The trace digest makes "the same seed gives the same run" checkable. The run's phases,
the seed loop and the trace are the one harness's (harness.py), as for every layer.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mqlog.config import ReplicationConfig
from mqlog.errors import MqlogError
from mqlog.replication.master_slave import MasterSlaveCore
from mqlog.replication.master_slave import core as ms_core
from mqlog.results import PutStatus
from mqlog.sim import harness
from mqlog.sim.harness import SeedResult, Simulation
from mqlog.sim.network import NetworkOptions
from mqlog.sim.node import SimReplica

STORE_SETTINGS: dict[str, Any] = dict(
    segment_size_bytes=64 * 1024, message_size_bytes_max=16 * 1024,
    consume_queue_entries_per_file=64, index_slots_per_file=64, index_entries_per_file=512,
    flush_interval_ms=3_600_000, retention_ms=-1, background_threads=False,
    segment_prepare_ahead=False, segment_preallocate=False)
MS_CORE_BREAKS = ms_core.TEST_BREAKS
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
    flush_delay_ticks_max: int
    stay_down: bool  # a slave stays down through the liveness phase
    master_flush: str = "async"  # the master's flush_mode: "sync" flushes every write
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
                   flush_probability=0.05, promote=rng.random() < 0.5,
                   flush_delay_ticks_max=rng.choice([0, 1, 3]),
                   stay_down=rng.random() < 0.3,
                   master_flush="sync" if rng.random() < 0.2 else "async")


@dataclass
class SimNode(SimReplica):
    config: ReplicationConfig = field(default_factory=ReplicationConfig)
    freshness_when_down: tuple[int, int] = (-1, 0)  # (last record's epoch, end) at the crash

    def new_core(self) -> Any:
        return MasterSlaveCore(self.config, self.store, test_break=self.test_break
                               if self.test_break in MS_CORE_BREAKS else "")

    def power_loss(self) -> tuple[int, int]:
        durable = self.store.flushed_position
        epoch = self.store.epoch_at(durable)
        self.freshness_when_down = (-1 if epoch is None else epoch, durable)
        return self.crash()

    def freshness(self) -> tuple[int, int]:
        """(epoch of the last record, end of the log): how up to date the log is."""
        if not self.up:
            return self.freshness_when_down
        end = self.store.written_position
        epoch = self.store.epoch_at(end)
        return (-1 if epoch is None else epoch, end)


@dataclass
class Acked:
    position: int
    end: int
    body: bytes
    epoch: int
    # The nodes that held it when it was acknowledged, less those that lost their copy
    # in a power loss since (it was not durable there): none left, its loss is by design.
    holders: set[str] = field(default_factory=set)


@dataclass
class SimResult(SeedResult):
    lost_by_design: int = 0

    def summary(self) -> str:
        verdict = self.verdict
        return (f"seed {self.seed}: {verdict} role={self.options.role} "
                f"min={self.options.in_sync_slaves_min} acked={self.acked} "
                f"lost_by_design={self.lost_by_design} trace={self.digest}")


class Swarm(Simulation):
    """One simulated master-slave group; see the module docstring."""

    options: Options
    result: SimResult
    nodes: dict[str, SimNode]
    fatal = ()  # (an error escaping the master-slave code ends the run as itself)

    def __init__(self, seed: int, root: Path, test_break: str = "") -> None:
        super().__init__(seed, Options, SimResult)
        self.master = "n0"
        self.masters_by_epoch: dict[int, set[str]] = {}
        self.acked: dict[str, Acked] = {}
        self.pending: dict[str, Acked] = {}
        self.down_since: dict[str, int] = {}
        self.promoted = False
        self.nodes = {name: SimNode(name, root / name, self, STORE_SETTINGS,
                                    random.Random(self.rng.random()),
                                    self.options.flush_delay_ticks_max, test_break,
                                    config=self._config(name)) for name in ("n0", "n1", "n2")}
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

    # --- the run (harness.py runs these) ------------------------------------------------

    def safety_tick(self, tick: int) -> None:
        self._faults()
        self._step_all()

    def finish(self) -> None:
        self.result.acked = len(self.acked)

    def _step_all(self) -> None:
        self.advance_clock()
        for node in self._up_nodes():
            node.driver.tick()
        arrived = self.network.due()
        put_at = self.rng.randrange(len(arrived) + 1)  # the client's moment
        for index, message in enumerate(arrived):
            if index == put_at:
                self._maybe_put()
            node = self.nodes[message.dst]
            if node.up:
                self.result.trace.append(f"{self.clock[0]} {message!r}")
                node.driver.step(message)
        if put_at == len(arrived):
            self._maybe_put()
        for node in self._up_nodes():
            node.complete_flushes()
            self._run_driver(node)
        self._check_masters()

    def _maybe_put(self) -> None:
        master = self.nodes[self.master]
        if master.up and master.core.status()["accepts_writes"] and \
                self.rng.random() < self.options.put_probability:
            self._put(master)

    def _put(self, master: SimNode) -> None:
        try:
            master.driver.check_writable()
        except MqlogError:
            return
        self.puts += 1
        request, body = f"w{self.puts}", f"{self.result.seed}/{self.puts}".encode() * 3
        try:
            stored = master.driver.write("t", [body])
        except AssertionError as error:  # (a write stored under an epoch older than the
            # log's last record: the store refuses it; a node's client gets no answer)
            self.violation(f"{master.name} could not store a write it took: {error!r}")
            raise _Crashed from error
        if self.options.master_flush == "sync":
            master.flush_now()
        self.pending[request] = Acked(stored.position, stored.end, body, master.core.epoch)
        master.driver.propose(request, stored.end)

    def _run_driver(self, node: SimNode) -> None:
        store, driver = node.store, node.driver
        before, truncations = store.written_position, driver.truncations
        try:
            driver.run()
        except (MqlogError, AssertionError) as error:
            # A core that raises while building its Ready (say a master asked to read a
            # slave's position that is inside one of its records: two histories under
            # one epoch) would raise on a node too: the run ends there, failed.
            self.violation(f"{node.name}'s core raised {error!r}")
            raise _Crashed from error
        if store.written_position < before and driver.truncations == truncations:
            self.result.violations.append(f"tick {self.clock[0]}: {node.name}'s log went back "
                                          f"from {before} to {store.written_position} "
                                          "without a truncation")

    def answered(self, node: SimNode, request: str, status: PutStatus) -> None:
        self.result.trace.append(f"{self.clock[0]} {node.name}: {request} {status.value}")
        acked = self.pending.pop(request, None)
        if acked is None or status is not PutStatus.PUT_OK:
            return
        self.acked[request] = acked
        acked.holders = {other.name for other in self._up_nodes() if _holds(other, acked)}
        if node.core.role == "SYNC_MASTER" and self.options.slave_ack == "flushed":
            # An ack of a written (not flushed) position is RocketMQ's promise: in a
            # slave's memory, which a power loss may take; only flushed acks are checked.
            holders = [other for other in self.nodes.values() if other is not node and (
                _holds(other, acked) and other.store.flushed_position >= acked.end
                if other.up else other.durable_when_down >= acked.end)]
            if len(holders) < self.options.in_sync_slaves_min:
                self.result.violations.append(
                    f"tick {self.clock[0]}: {request} acked PUT_OK by a SYNC_MASTER but only "
                    f"{len(holders)} slaves hold it (need {self.options.in_sync_slaves_min})")

    # --- faults -----------------------------------------------------------------------

    def _faults(self) -> None:
        rng, options = self.rng, self.options
        for node in self.nodes.values():
            if node.up and rng.random() < options.crash_probability:
                durable, kept = node.power_loss()
                self._lose_copies(node.name, durable)
                self.result.trace.append(f"{self.clock[0]} crash {node.name}: flushed "
                                         f"{durable}, kept {kept}")
                if node.name == self.master:
                    self.pending.clear()  # their clients saw the connection drop: no ack
                self.down_since[node.name] = self.clock[0]
            elif not node.up and rng.random() < options.restart_probability and \
                    not (options.promote and node.name == self.master):
                self._restart(node)  # (a dead master waits for the operator's promotion)
            elif node.up and rng.random() < options.flush_probability:
                node.flush_now()
        if rng.random() < options.partition_probability:
            a, b = rng.sample(sorted(self.nodes), 2)
            self.network.partition(a, b)
            self.result.trace.append(f"{self.clock[0]} partition {a} {b}")
        elif self.network.partitioned and rng.random() < 0.05:
            self.network.heal()
        self._maybe_promote()

    def _lose_copies(self, name: str, durable: int) -> None:
        for acked in self.acked.values():
            if acked.end > durable:
                acked.holders.discard(name)

    def _restart(self, node: SimNode) -> None:
        node.config = self._config(node.name)
        node.start()
        self.result.trace.append(f"{self.clock[0]} restart {node.name}: recovered to "
                                 f"{node.store.written_position}")
        self.down_since.pop(node.name, None)

    def _maybe_promote(self) -> None:
        """An operator promotes the most up-to-date slave when the master stays down: the
        highest (last record's epoch, durable end) among all the others, restarted first
        if it is down, into an epoch above every node's. If the master's own disk holds
        more than any of them (with async flush a master may be the only durable holder
        of records it acknowledged as a new master), it brings the master back instead:
        a restarted master catches up from its slaves before it serves."""
        down = self.down_since.get(self.master)
        if not self.options.promote or down is None or self.clock[0] - down < 50:
            return
        # By the log, not by the epoch a node has heard of: a slave told to truncate by a
        # newer master knows that master's epoch but may hold less than the others.
        chosen = max(self.nodes.values(), key=lambda node: (
            *node.freshness(), node.name != self.master, node.name))
        if chosen.name == self.master:
            self.result.trace.append(f"{self.clock[0]} the operator restarts {chosen.name}: "
                                     "it holds more than any slave")
            self._restart(chosen)
            return
        if not chosen.up:
            self._restart(chosen)
        epoch = max(node.core.epoch for node in self.nodes.values()) + 1
        self.result.trace.append(f"{self.clock[0]} promote {chosen.name} epoch {epoch}")
        self.master = chosen.name
        self.promoted = True
        chosen.core.promote(self.options.role,
                            tuple(name for name in sorted(self.nodes) if name != chosen.name),
                            epoch=epoch)
        chosen.config = self._config(chosen.name)  # (its driver runs in the next step:
        # client writes may come first, and must be refused until the epoch is stamped)
        for node in self._up_nodes():
            if node is not chosen:  # the operator points the other slaves at it
                node.config = self._config(node.name)
                node.core = node.new_core()
                node.driver.replace_core(node.core)

    # --- liveness and the checkers ------------------------------------------------------

    def liveness(self) -> None:
        self.network.options = NetworkOptions()
        self.network.heal()
        slaves = sorted(name for name in self.nodes if name != self.master)
        down = self.rng.choice(slaves) if self.options.stay_down else ""
        for node in self.nodes.values():
            if node.name == down:
                if node.up:
                    self._lose_copies(node.name, node.power_loss()[0])
                self.result.trace.append(f"{self.clock[0]} {node.name} stays down")
            elif not node.up:
                self._restart(node)
        waited = 0
        for _ in range(self.options.liveness_ticks):
            self._step_all()
            if self._converged():
                return
            master = self.nodes[self.master]
            if down and not self.nodes[down].up and master.up and \
                    down in getattr(master.core, "waiting_for", ()):
                waited += 1
            if waited > 2 * CORE_SETTINGS["slave_timeout_ticks"]:
                # A restarted master that must hear this slave (it may hold acknowledged
                # records nobody else has) waits for it, by design: the operator brings it
                # back (or would vouch for the master, losing what only it holds).
                self._restart(self.nodes[down])
                waited = 0
        self.result.violations.append(
            f"did not converge in {self.options.liveness_ticks} ticks: written positions "
            f"{ {n.name: n.store.written_position for n in self._up_nodes()} }, "
            f"{self.network.in_flight} messages in flight, {len(self.pending)} writes waiting")

    def _converged(self) -> bool:
        """Logs of one length are not enough: a slave back from a crash may hold as much
        as its new master, of another epoch, until its next Hello gets it truncated
        (seed 740000299 was judged converged in that gap). The bytes must agree."""
        up, master = self._up_nodes(), self.nodes[self.master]
        ends = {node.store.written_position for node in up}
        # The master must serve too: one still catching up after a restart may wait for
        # the slave left down, which alone holds records it acknowledged (seed 3048).
        return len(ends) == 1 and not self.pending and self.network.in_flight == 0 and \
            master.up and master.driver.serving and master.core.status()["accepts_writes"] \
            and len({_image(node.store) for node in up}) == 1

    def check_end(self) -> None:
        master = self.nodes[self.master]
        images = {node.name: _image(node.store) for node in self._up_nodes()}
        if len(set(images.values())) != 1:
            self.result.violations.append("logs differ after convergence")
        # What a promotion may lose by design: an ASYNC_MASTER's acks, and a SYNC_MASTER's
        # acks of written (not flushed) slave positions, which a slave's crash can take.
        promise_holds = not self.promoted or (self.options.role == "SYNC_MASTER"
                                              and self.options.slave_ack == "flushed")
        for request, acked in sorted(self.acked.items()):
            if not _holds(master, acked):
                if not promise_holds or not acked.holders:
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


class _Crashed(harness.RunEnded):
    """A node's core raised: the run stops (the violation is recorded)."""


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
    return harness.run_seed(Swarm, seed, test_break)
