"""The simulator for the Raft layer: one seed, one run, one verdict — its workload and
checkers, run by the one harness (harness.py: the VOPR idea, the seed loop, the run's
phases) as the master-slave (swarm.py) and controller (controller.py) layers are.

A seed decides the options (3 or 5 voters, pre-vote and check-quorum on or off, the
follower ack rule, how lossy, slow and partitioned the network is, how often nodes
crash) and every choice at every tick. Nodes are real stores with Raft cores, run by
the one driver (mqlog/replication/driver.py) over a simulated network and disk
(sim/node.py): every message that arrived in a tick is stepped before the node's one
Ready of the tick; flushes complete some ticks later; the hard state is durable once
saved; a crash is a power loss (unflushed bytes lost, now and then a torn last write)
followed by the engine's real recovery. Written acks ("follower_ack = written") promise
nothing against a crash, so those seeds do not crash nodes; they pause them instead,
which loses nothing.

The client is one idempotent producer: each write gets the next sequence; it is sent,
at any moment of a tick, to a node that claims leadership (which refuses it until its
term has started) and retried, with the same sequence, whenever its outcome is unknown
(timeout, step-down, a crashed leader). The leader looks the sequence up in its
producer table (idempotence.py), rebuilt from its log when its term starts. On some
seeds the client restarts now and then (sim/lives.py): same producer id, a new epoch,
sequences from 1 again, the writes it waited on forgotten. On some seeds a write is a
request of several records, and the store cuts some batches short (sim/partial.py); a
request stored in part is proposed through the driver's ``propose_write``, which alone
decides its answer (PartiallyStored once the verdict committed its records), and the
client sends the rest as a new request. Entries end at a record, so a follower's copy may
be cut inside a request too, and a leader change makes it the copy a retry finds.

Checkers (a list of violations; empty is a pass):
* at most one leader per term;
* committed prefixes agree: every commit any node makes is byte-identical to the same
  range of every other commit (one global committed prefix, checked incrementally);
* leader completeness: a new leader's log holds the whole committed prefix;
* log matching: two logs with a record of the same epoch at the same position are
  identical up to there (checked between every pair of nodes every 50 ticks);
* no acknowledged write lost (a restarted client's write answered with an earlier
  life's place is one), no write stored twice by the client's retries, and the
  producer's epochs never go down in the log (sim/lives.py), read in the whole committed
  prefix (retention may have let a first copy go); a retry a leader refuses as too old
  to tell (OutOfOrderSequence) is given up, as a client does, and must be a retry;
* the PartiallyStored rule (sim/partial.py's invariant): such an answer comes only once
  the answering leader committed the records it names, and the committed log holds, under
  each answered request's tag, exactly the records the client was told are stored — never
  one the client was told is not (it sent that one again as a new request);
* a leader removed from the voters steps down once that commits (an operator changes
  the membership now and then: a spare learner is promoted, a voter demoted);
* liveness (VOPR's rule): with the network healed and all but a minority up (one node
  may stay down), a leader commits every write the client still waits on and the logs
  of the nodes up end up byte-identical.
"""

from __future__ import annotations

import hashlib
import random
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mqlog.config import ReplicationConfig
from mqlog.errors import MqlogError, OutOfOrderSequence, PartiallyStored
from mqlog.replication.driver import Answer, is_cut
from mqlog.replication.idempotence import Stored, producer_tags
from mqlog.replication.messages import Vote, VoteReply
from mqlog.replication.raft import RaftCore
from mqlog.replication.raft import core as raft_core
from mqlog.replication.raft.core import LEADER
from mqlog.results import PutStatus
from mqlog.sim import harness
from mqlog.sim.harness import SeedResult, Simulation
from mqlog.sim.lives import ProducerLives, tag_problems, tags_of
from mqlog.sim.network import NetworkOptions
from mqlog.sim.node import SimReplica
from mqlog.sim.partial import Batches, PartialChecker, bodies_of, describe
from mqlog.sim.swarm import STORE_SETTINGS

# Retention lets a segment go only when the operator runs it (then all it may).
RAFT_STORE_SETTINGS: dict[str, Any] = dict(
    STORE_SETTINGS, retention_bytes=0, retention_check_interval_ms=3_600_000,
    committed_follows="external")
BODY_PADDING = b"." * 1500  # writes fill several segments, for retention to let go
CORE_SETTINGS: dict[str, Any] = dict(
    heartbeat_ticks=3, election_timeout_ticks=15, sync_timeout_ticks=80, retransmit_ticks=10,
    append_bytes_max=4096, inflight_bytes_max=16384, frame_size_bytes_max=64 * 1024)
PRODUCER = "sim-producer"
RAFT_CORE_BREAKS = raft_core.TEST_BREAKS
_RECORD = struct.Struct("<III4xIIQQQ")  # size magic crc (attrs topic) queue body epoch offset pos
_RECORD_MAGIC = int.from_bytes(b"MQR\x01", "little")


@dataclass
class RaftOptions:
    voters: int
    follower_ack: str
    pre_vote: bool
    check_quorum: bool
    network: NetworkOptions
    put_probability: float
    crash_probability: float
    pause_probability: float
    partition_probability: float
    membership_probability: float  # an operator changes the voters (a spare learner joins)
    retention_probability: float  # a node's retention lets its committed front go
    restart_probability: float  # per tick, of a crashed node (low: long outages)
    flush_delay_ticks_max: int  # a flush completes 0..this many ticks after it began
    stay_down: int  # nodes left down through the liveness phase (a minority)
    outage_probability: float  # per tick: a power loss takes every node at once
    vote_crash_probability: float  # a node crashes right after it saved a hard state
    safety_ticks: int = 500
    liveness_ticks: int = 2000

    @classmethod
    def from_rng(cls, rng: random.Random) -> RaftOptions:
        follower_ack = rng.choice(["flushed", "flushed", "written"])
        faults = rng.choice([0.0, 0.003, 0.01])
        return cls(voters=rng.choice([3, 3, 5]), follower_ack=follower_ack,
                   pre_vote=rng.random() < 0.7, check_quorum=rng.random() < 0.7,
                   network=NetworkOptions(rng.choice([0.0, 0.02, 0.15]),
                                          rng.choice([0.0, 0.05]), rng.choice([1, 3, 8, 20])),
                   put_probability=rng.choice([0.2, 0.6]),
                   crash_probability=faults if follower_ack == "flushed" else 0.0,
                   pause_probability=faults if follower_ack == "written" else faults / 2,
                   partition_probability=rng.choice([0.0, 0.01, 0.03, 0.08]),
                   membership_probability=rng.choice([0.0, 0.0, 0.02]),
                   retention_probability=rng.choice([0.0, 0.01, 0.05]),
                   restart_probability=rng.choice([0.05, 0.05, 0.01]),
                   flush_delay_ticks_max=rng.choice([0, 1, 3]),
                   stay_down=rng.choice([0, 0, 1]),
                   outage_probability=rng.choice([0.0, 0.002, 0.005])
                   if follower_ack == "flushed" else 0.0,
                   vote_crash_probability=rng.choice([0.0, 0.0, 0.3])
                   if follower_ack == "flushed" else 0.0)


@dataclass
class RaftSimNode(SimReplica):
    config: ReplicationConfig = field(default_factory=ReplicationConfig)
    core_rng: random.Random = field(default_factory=random.Random)
    checked: int = 0  # its log agrees with the committed prefix up to here
    led_term: int = -1  # the term whose leader completeness was checked
    commit_seen: int = 0

    def new_core(self) -> Any:
        self.led_term = -1
        self.checked = min(self.checked, self.store.written_position)
        self.commit_seen = 0
        return RaftCore(self.config, self.store, rng=random.Random(
            self.core_rng.randrange(1 << 62)), hard_state=self.hard_state,
            test_break=self.test_break if self.test_break in RAFT_CORE_BREAKS else "")


@dataclass
class Write:
    sequence: int  # the client's write number, across its lives
    bodies: list[bytes]  # its records (one on seeds without batches: partial.py)
    request: str = ""  # the request now in flight for it ("" if none)
    node: str = ""
    producer: tuple[str, int, int] = (PRODUCER, 0, 0)  # (id, sequence, epoch) of its life


@dataclass
class RaftSimResult(SeedResult):
    retried: int = 0
    deduplicated: int = 0
    leaders: int = 0
    membership_changes: int = 0
    log_starts: int = 0  # the furthest any node's retention moved its log's start
    resets: int = 0  # followers started over at their leader's log start
    client_lives: int = 1  # the client's lives (sim/lives.py: restarts on some seeds)
    partial: int = 0  # PartiallyStored answers (sim/partial.py: batches on some seeds)
    cut_retries: int = 0  # retries that found their request's copy cut (stored in part)

    def summary(self) -> str:
        options = self.options
        return (f"seed {self.seed}: {self.verdict} voters={options.voters} "
                f"ack={options.follower_ack} pre_vote={options.pre_vote} "
                f"check_quorum={options.check_quorum} leaders={self.leaders} "
                f"acked={self.acked} retried={self.retried} "
                f"deduplicated={self.deduplicated} "
                f"membership_changes={self.membership_changes} "
                f"log_start={self.log_starts} resets={self.resets} "
                f"client_lives={self.client_lives} partial={self.partial} "
                f"cut_retries={self.cut_retries} "
                f"trace={self.digest}")


class RaftSwarm(Simulation):
    """One simulated Raft group and its client; see the module docstring."""

    options: RaftOptions
    result: RaftSimResult
    nodes: dict[str, RaftSimNode]
    prefix = "mqlog-raft-sim-"

    def __init__(self, seed: int, root: Path, test_break: str = "") -> None:
        super().__init__(seed, RaftOptions, RaftSimResult)
        spares = 1 if self.options.membership_probability else 0
        names = tuple(f"n{index}" for index in range(self.options.voters + spares))
        voters, learners = names[:self.options.voters], names[self.options.voters:]
        self.nodes = {name: RaftSimNode(
            name, root / name, self, RAFT_STORE_SETTINGS, random.Random(self.rng.random()),
            self.options.flush_delay_ticks_max, test_break,
            config=self._config(name, voters, learners), core_rng=self.rng)
            for name in names}
        self.leaders_by_term: dict[int, set[str]] = {}
        self.committed = bytearray()  # the longest committed prefix any node showed
        self.writes: dict[int, Write] = {}  # sequence -> a write not yet acknowledged
        self.acked: dict[int, Stored] = {}
        self.acked_bodies: dict[int, list[bytes]] = {}  # the records acknowledged stored
        self.batches = Batches(seed)  # requests of several records, cut by the store
        self.batch_limit = self.batches.batch_limit
        self.partial = PartialChecker()
        self.requests: dict[str, int] = {}  # request id -> sequence
        self.sequence = 0
        self.lives = ProducerLives(seed)
        self.back_soon: set[str] = set()  # crashed just after saving a hard state
        self.faulty = True  # the safety phase (faults on)
        self.votes: dict[tuple[str, int], str] = {}  # (voter, term) -> its candidate
        for node in self.nodes.values():
            node.start()

    def _config(self, name: str, voters: tuple[str, ...],
                learners: tuple[str, ...]) -> ReplicationConfig:
        options = self.options
        return ReplicationConfig(layer="raft", node_id=name, voters=voters, learners=learners,
                                 pre_vote=options.pre_vote, check_quorum=options.check_quorum,
                                 follower_ack=options.follower_ack,  # type: ignore[arg-type]
                                 **CORE_SETTINGS)

    # --- the run (harness.py runs these) ------------------------------------------------

    def safety_tick(self, tick: int) -> None:
        self._faults()
        self._step_all(new_writes=True)
        if tick % 50 == 49:
            self._check_log_matching()

    def finish(self) -> None:
        self.result.acked = len(self.acked)
        self.result.partial = self.partial.partial
        self.result.client_lives = self.lives.lives
        self.result.leaders = sum(len(names) for names in self.leaders_by_term.values())

    def _step_all(self, new_writes: bool) -> None:
        """One tick: each running node ticks, steps every message that arrived, takes
        the client's writes (whenever they come), sees its due flushes complete, and
        then its driver carries out one Ready."""
        self.advance_clock()
        if new_writes and self.lives.maybe_restart(self.clock[0]):
            self.writes.clear()  # (a new process: what the old one waited on, forgotten)
            self.result.trace.append(f"{self.clock[0]} the client restarts: life "
                                     f"{self.lives.lives}, epoch {self.lives.epoch}")
        if new_writes and self.rng.random() < self.options.put_probability:
            self.sequence += 1
            self._new_write(bodies_of(f"{self.result.seed}/{self.sequence}",
                                      self.batches.records(), BODY_PADDING))
        for node in self.running():
            node.driver.tick()
        arrived = self.network.due()
        writes_at = self.rng.randrange(len(arrived) + 1)  # the client's moment
        for index, message in enumerate(arrived):
            if index == writes_at:
                self._send_writes()
            node = self.nodes[message.dst]
            if node.up and not node.paused:
                self.result.trace.append(f"{self.clock[0]} {message!r}")
                node.driver.step(message)
        if writes_at == len(arrived):
            self._send_writes()
        for node in self.running():
            node.complete_flushes()
            self._run_driver(node)
        if self.clock[0] % 20 == 0:
            for node in self.running():
                node.chores()

    # --- the client --------------------------------------------------------------------

    def _send_writes(self) -> None:
        leaders = [node for node in self.running() if node.core.role == LEADER]
        if not leaders:
            return
        for write in list(self.writes.values())[:8]:
            if not write.request:
                self._submit(self.rng.choice(leaders), write)

    def _submit(self, node: RaftSimNode, write: Write) -> None:
        try:
            node.driver.check_writable()  # a leader whose term has not started refuses
        except MqlogError:
            return
        request = f"s{write.sequence}@{node.name}.{self.clock[0]}"
        try:
            if node.driver.producers.lookup(*write.producer) is not None:
                self.result.deduplicated += 1
            found = node.driver.write("t", write.bodies, producer=write.producer)
        except OutOfOrderSequence:  # older than the leader's table: it may be stored (its
            return self._give_up(node, write)  # first copy let go by retention), unknown
        except AssertionError as error:  # what a client would never hear about
            raise AssertionError(f"{node.name} failed a write it accepted: {error!r}") from None
        if write.node:
            self.result.retried += 1
            self.result.cut_retries += is_cut(found, len(write.bodies))
        write.request, write.node = request, node.name
        self.requests[request] = write.sequence
        self.result.trace.append(f"{self.clock[0]} {node.name}: {request} at {found.position}"
                                 + (f", {found.count} of {len(write.bodies)} records"
                                    if is_cut(found, len(write.bodies)) else ""))
        node.driver.propose_write(request, found, len(write.bodies), write.producer)

    def _new_write(self, bodies: list[bytes]) -> None:
        """The client's next write (the next sequence of its producer's life)."""
        self.writes[self.sequence] = Write(self.sequence, bodies,
                                           producer=self.lives.next(PRODUCER))

    def _give_up(self, node: RaftSimNode, write: Write) -> None:
        """A leader refused a retry as too old to tell whether it is stored: the client
        raises that (its outcome unknown) and the write is not checked. Only a retry: a
        write never sent is not old."""
        del self.writes[write.sequence]
        self.result.trace.append(f"{self.clock[0]} {node.name}: s{write.sequence} refused "
                                 "as too old")
        if not write.node:
            self.result.violations.append(f"tick {self.clock[0]}: {node.name} refused "
                                          f"write {write.sequence}, never sent, as too old")

    def answered(self, node: RaftSimNode, request: str, status: Answer) -> None:
        self.result.trace.append(f"{self.clock[0]} {node.name}: {request} {describe(status)}")
        if request not in self.requests:
            return  # an operator's membership change
        sequence = self.requests.pop(request)
        write = self.writes.get(sequence)
        if write is None or write.request != request:
            return  # an answer to a request the client gave up on
        write.request = ""
        if status is not PutStatus.PUT_OK and not isinstance(status, PartiallyStored):
            return  # (its outcome unknown: sent again, whole)
        stored = node.driver.producers.lookup(*write.producer)
        problem = self.partial.answered(write.producer, write.bodies, status, stored,
                                        node.store.committed_position)
        if problem:
            self.result.violations.append(f"tick {self.clock[0]}: {node.name} {problem}")
        assert stored is not None
        told = len(write.bodies) if status is PutStatus.PUT_OK else stored.count
        self.acked[sequence], self.acked_bodies[sequence] = stored, write.bodies[:told]
        del self.writes[sequence]
        if told < len(write.bodies):  # "send the others again as a new request"
            self.sequence += 1
            self._new_write(write.bodies[told:])

    def trace(self, text: str) -> None:
        self.result.trace.append(f"{self.clock[0]} {text}")
        if "started its log over" in text:  # (the core's event for a LogReset done)
            self.result.resets += 1

    def observe(self, message: Any) -> None:
        """Every message a node sends: a node votes once per term, whatever crashes in
        between (a candidate's Vote is its vote for itself; a granted VoteReply, for
        the node it answers)."""
        if isinstance(message, Vote) and not message.pre_vote:
            voter, candidate, term = message.src, message.src, message.epoch
        elif isinstance(message, VoteReply) and message.granted and not message.pre_vote:
            voter, candidate, term = message.src, message.dst, message.epoch
        else:
            return
        earlier = self.votes.setdefault((voter, term), candidate)
        if earlier != candidate:
            self.result.violations.append(f"tick {self.clock[0]}: {voter} voted for both "
                                          f"{earlier} and {candidate} in term {term}")

    def _forget_requests_on(self, node: RaftSimNode) -> None:
        """The node crashed: its clients' connections dropped, outcomes unknown."""
        for write in self.writes.values():
            if write.node == node.name:
                write.request = ""

    # --- after each Ready: the checkers that look at one node ------------------------

    def _run_driver(self, node: RaftSimNode) -> None:
        node.saved_hard_state = False
        node.driver.run()
        if node.driver.failure is not None:
            return
        if node.saved_hard_state and self.faulty and \
                self.rng.random() < self.options.vote_crash_probability:
            durable, kept = node.crash()  # just after a vote or a new term: back at once
            self.result.trace.append(f"{self.clock[0]} crash {node.name} after saving "
                                     f"{node.hard_state}: flushed {durable}, kept {kept}")
            self._forget_requests_on(node)
            self.back_soon.add(node.name)
            return
        node.core.invariants()
        commit = node.store.committed_position
        if commit > node.commit_seen:
            if node.core.role == LEADER:
                self._check_quorum_holds(node, commit)
            node.commit_seen = commit
            self._check_commit(node, commit)
        if node.driver.serving and node.led_term != node.core.term:
            self._new_leader(node)
        if node.core.role == LEADER and node.name not in node.core.voters and \
                node.core.membership.position < node.core.commit:
            self.result.violations.append(f"tick {self.clock[0]}: {node.name} still leads "
                                          "after its removal from the voters committed")

    def _new_leader(self, node: RaftSimNode) -> None:
        node.led_term = node.core.term
        self.leaders_by_term.setdefault(node.core.term, set()).add(node.name)
        if len(self.leaders_by_term[node.core.term]) > 1:
            self.result.violations.append(f"term {node.core.term} had leaders "
                                          f"{sorted(self.leaders_by_term[node.core.term])}")
        start = node.store.first_segment_base()  # (retention let the rest go)
        if _read(node.store, start, len(self.committed)) != bytes(self.committed[start:]):
            self.result.violations.append(
                f"tick {self.clock[0]}: {node.name} leads term {node.core.term} without the "
                f"whole committed prefix [{start}, {len(self.committed)})")

    # --- faults -----------------------------------------------------------------------

    def _faults(self) -> None:
        rng, options = self.rng, self.options
        for name in sorted(self.back_soon):
            if not self.nodes[name].up:
                self._restart(self.nodes[name])
        self.back_soon.clear()
        if rng.random() < options.outage_probability:
            self.result.trace.append(f"{self.clock[0]} outage: every node loses its power")
            for node in self.nodes.values():
                if node.up:
                    node.crash()
                    self._forget_requests_on(node)
        for node in self.nodes.values():
            if node.up and rng.random() < options.crash_probability:
                durable, kept = node.crash()
                self.result.trace.append(f"{self.clock[0]} crash {node.name}: flushed "
                                         f"{durable}, kept {kept}")
                self._forget_requests_on(node)
            elif node.up and rng.random() < options.pause_probability:
                node.paused = not node.paused  # SIGSTOP, SIGCONT: nothing is lost
                self.result.trace.append(f"{self.clock[0]} pause {node.name} {node.paused}")
            elif not node.up and rng.random() < options.restart_probability:
                self._restart(node)
        if rng.random() < options.membership_probability:
            self._change_membership()
        running = self.running()
        if running and rng.random() < options.retention_probability:
            node = rng.choice(running)  # what it may let go: committed and flushed
            start = node.store.apply_retention().log_start
            self.result.trace.append(f"{self.clock[0]} {node.name}: log starts at {start}")
            self.result.log_starts = max(self.result.log_starts, start)
        self.partition_minority(options.partition_probability)

    def _change_membership(self) -> None:
        """An operator promotes a learner to voter, or demotes a voter to learner (never
        below three voters), through whichever node leads now."""
        leaders = [node for node in self.running() if node.driver.serving]
        if not leaders:
            return
        leader = self.rng.choice(leaders)
        current = leader.core.membership
        voters, learners = list(current.voters), list(current.learners)
        if learners and (len(voters) < 4 or self.rng.random() < 0.5):
            voters.append(learners.pop(self.rng.randrange(len(learners))))
        elif len(voters) > 3:
            learners.append(voters.pop(self.rng.randrange(len(voters))))
        else:
            return
        try:
            leader.driver.change_membership(f"membership{self.result.membership_changes + 1}",
                                            tuple(voters), tuple(learners), {})
        except MqlogError as error:
            self.result.trace.append(f"{self.clock[0]} {leader.name}: change refused: {error}")
            return
        self.result.membership_changes += 1

    def _restart(self, node: RaftSimNode) -> None:
        node.start()
        self.result.trace.append(f"{self.clock[0]} restart {node.name}: recovered to "
                                 f"{node.store.written_position}")
        if node.store.recovery_report.clean:
            self.result.violations.append(f"tick {self.clock[0]}: {node.name} came back "
                                          "from a crash through a clean open")

    # --- liveness and the checkers ------------------------------------------------------

    def liveness(self) -> None:
        """Heal the network, stop the faults, restart every node but ``stay_down`` of them
        (VOPR's rule: a minority may stay away); the rest must converge."""
        self.calm()
        self.faulty = False
        down = self.rng.sample(sorted(self.nodes), self.options.stay_down)
        for node in self.nodes.values():
            node.paused = False
            if node.name in down:
                if node.up:
                    node.crash()
                    self._forget_requests_on(node)
                self.result.trace.append(f"{self.clock[0]} {node.name} stays down")
            elif not node.up:
                self._restart(node)
        if self.run_until(lambda: self._step_all(new_writes=False), self._converged):
            return
        self.result.violations.append(
            f"did not converge in {self.options.liveness_ticks} ticks: "
            f"{ {n.name: (n.core.role, n.core.term, n.store.written_position, n.core.commit) for n in self.running()} }, "  # noqa: E501
            f"{len(self.writes)} writes waiting")

    def _converged(self) -> bool:
        up = self.running()
        ends = {(node.store.written_position, node.core.commit) for node in up}
        leaders = [node for node in up if node.core.role == LEADER]
        return (len(ends) == 1 and not self.writes and len(leaders) == 1
                and leaders[0].core.commit == leaders[0].store.written_position)

    def _check_quorum_holds(self, leader: RaftSimNode, commit: int) -> None:
        """A leader commits ``commit`` only while a majority of its voters hold the log up
        to there as its follower_ack promises: flushed (or, for written acks, written),
        with the record ending there in the same epoch as the leader's."""
        flushed = self.options.follower_ack == "flushed"
        epoch = leader.store.epoch_at(commit)
        holders = []
        for name in leader.core.voters:
            node = self.nodes[name]
            if not node.up:  # what it held when it went down (written acks promise
                # nothing against a crash: what it had written then counts)
                if (node.durable_when_down if flushed else node.written_when_down) >= commit:
                    holders.append(name)
                continue
            end = node.store.flushed_position if flushed else node.store.written_position
            if end >= commit and node.store.epoch_at(commit) == epoch:
                holders.append(name)
        if len(holders) < leader.core.quorum:
            self.result.violations.append(
                f"tick {self.clock[0]}: {leader.name} committed {commit} in term "
                f"{leader.core.term} but only {holders} hold it "
                f"({'flushed' if flushed else 'written'}; a majority is {leader.core.quorum})")

    def _check_commit(self, node: RaftSimNode, commit: int) -> None:
        problem = check_committed(self.committed, node, commit)
        if problem:
            self.result.violations.append(f"tick {self.clock[0]}: {node.name} {problem}")

    def _check_log_matching(self) -> None:
        up = {node.name: node for node in self.nodes.values() if node.up}
        logs = {name: _records(node.store) for name, node in up.items()}
        names = sorted(logs)
        for index, a in enumerate(names):
            for b in names[index + 1:]:
                start = max(up[a].store.first_segment_base(), up[b].store.first_segment_base())
                problem = _log_matching_problem(logs[a], logs[b], start)
                if problem:
                    self.result.violations.append(f"tick {self.clock[0]}: {a} and {b}: "
                                                  f"{problem}")

    def check_end(self) -> None:
        up = self.running()
        common = max(node.store.first_segment_base() for node in up)
        images = {node.name: hashlib.sha256(_read(node.store, common,
                                                  node.store.written_position)).digest()
                  for node in up}
        if len(set(images.values())) != 1:
            self.result.violations.append(f"logs differ after convergence (from {common})")
        leader = next((node for node in up if node.core.role == LEADER), up[0])
        log_start = leader.store.first_segment_base()
        for sequence, stored in sorted(self.acked.items()):
            bodies = self.acked_bodies[sequence]
            if stored.position < log_start:  # retention let it go: it was committed, though
                if not bytes(self.committed[stored.position:stored.end]).endswith(bodies[-1]):
                    self.result.violations.append(f"acknowledged write {sequence} at "
                                                  f"{stored.position} was never committed")
                continue
            try:
                record = leader.store.read_record(stored.position)
            except MqlogError:
                record = None
            if record is None or record.body != bodies[0]:
                self.result.violations.append(f"acknowledged write {sequence} at "
                                              f"{stored.position} was lost")
        self.result.violations += tag_problems(_committed_tags(bytes(self.committed)))
        self.result.violations += self.partial.check(bytes(self.committed))


def check_committed(committed: bytearray, node: Any, commit: int) -> str:
    """The committed-prefix checker (every layer's: a Raft commit, an ISR high watermark):
    ``node``'s log from what was checked (``node.checked``) to ``commit`` must equal the
    one ``committed`` prefix where they overlap, and extends it past its end. Returns the
    problem ('' if none)."""
    start = max(min(node.checked, len(committed)), node.store.first_segment_base())
    try:
        data = _read(node.store, start, commit)
    except MqlogError as error:  # (no record starts there in this log: it differs)
        node.checked = max(node.checked, commit)
        return f"committed [{start}, {commit}) unlike another node ({error})"
    overlap = min(commit, len(committed)) - start
    problem = ""
    if data[:overlap] != bytes(committed[start:start + overlap]):
        problem = f"committed [{start}, {commit}) unlike another node"
    elif commit > len(committed):
        committed += data[overlap:]
    node.checked = max(node.checked, commit)
    return problem


def _read(store: Any, start: int, end: int) -> bytes:
    chunks, position = [], start
    while position < end:
        data = store.read_raw(position, end - position)
        if not data:
            break
        chunks.append(data)
        position += len(data)
    return b"".join(chunks)[:end - start]


def _tags(store: Any, topic: str = "t", queue_id: int = 0) -> list[tuple[str, int, int]]:
    """The producer tag of every committed record of a queue, in log order."""
    queue = (topic, queue_id)
    tags, offset = [], store.min_offset(*queue) if queue in store.queues() else 0
    while records := store.get(topic, queue_id, offset, 1000, 1 << 24):
        tags += tags_of(records)
        offset = records[-1].offset + 1
    return tags


def _committed_tags(committed: bytes) -> list[tuple[str, int, int]]:
    """The producer tag of every record of a committed prefix (from position 0), in log
    order: a write stored again after retention let its first copy go is stored twice."""
    tags: list[tuple[str, int, int]] = []
    at = 0
    while at + _RECORD.size <= len(committed):
        size, magic = _RECORD.unpack_from(committed, at)[:2]
        if size < 8:  # (no record is this short: not a record boundary)
            return tags
        if magic == _RECORD_MAGIC:
            tags += [tag for tag, _ in producer_tags(at, committed[at:at + size])]
        at += size
    return tags


def _records(store: Any) -> dict[int, tuple[int, int]]:
    """position -> (epoch, crc) of every record in the store's log."""
    records: dict[int, tuple[int, int]] = {}
    data = _read(store, store.first_segment_base(), store.written_position)
    at = 0
    while at + _RECORD.size <= len(data):
        size, magic, crc, _queue, _body, epoch, _offset, position = _RECORD.unpack_from(data, at)
        if magic == _RECORD_MAGIC:
            records[position] = (epoch, crc)
        at += size
    return records


def _log_matching_problem(a: dict[int, tuple[int, int]], b: dict[int, tuple[int, int]],
                          start: int) -> str:
    """'' if the logs agree before the last position where both have a same-epoch record
    (from ``start``, the later of their log starts)."""
    shared = [position for position in a if position in b and a[position][0] == b[position][0]]
    if not shared:
        return ""
    last = max(shared)
    for position in sorted(position for position in set(a) | set(b) if position >= start):
        if position > last:
            break
        if a.get(position) != b.get(position):
            return (f"both have epoch {a[last][0]} at {last} but differ at {position}: "
                    f"{a.get(position)} vs {b.get(position)}")
    return ""


def run_seed(seed: int, test_break: str = "") -> RaftSimResult:
    return harness.run_seed(RaftSwarm, seed, test_break, RaftSwarm.prefix)
