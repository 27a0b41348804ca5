"""The ISR layer's must-show (issue 17) with real `mqlog node` processes on 127.0.0.1.

A topic of 6 partitions x RF 3 on three brokers, ``min_insync_replicas = 2``, and two
idempotent writers producing the whole time: each writer is one producer id with one
sender thread per partition, each with its own ``mqlog.ClusterClient`` keeping up to
five requests in flight (Kafka's max.in.flight), which finds the partition's leader,
retries a write with the same (producer id, sequence) while its outcome is unknown (the
connection broke, NotLeader, NOT_ENOUGH_REPLICAS_AFTER_APPEND, REQUEST_TIMED_OUT:
stored, may still commit), and raises NotEnoughReplicas (nothing stored) at once: the
sender counts that write refused and goes on. Every broker-to-broker connection runs
through a fault proxy (tests/faultproxy.py: one per direction, named in each broker's
``[node.peers]``); clients and the brokers' controller requests go direct. In an order
drawn from a printed seed (``MQLOG_TEST_SEED`` replays it) the test

* SIGKILLs a broker — each leads two partitions — and restarts it once the controller
  fenced it and its partitions have new leaders and take writes again; it rejoins every
  ISR;
* SIGSTOPs a broker past ``replica_lag_time_ms``: it leaves the ISR of each partition it
  follows (``mqlog topics describe`` shows it), writes to those go on with two in-sync
  replicas; SIGCONT: it returns to every ISR;
* partitions a broker from the other brokers while it leads partitions (its links are
  slowed by ``DELAY_MS``, then every proxy of its links is blackholed, so what was in
  flight is lost too): it shrinks their ISRs to itself (a new acks=all write would be
  refused there: NotEnoughReplicas; the senders keep retrying the write in flight with its
  sequence, so none is counted refused), the other partitions drop it from their ISRs and
  go on; with acks=1 the test waits until the cut-off leader knows it is alone and took
  new writes (never committed there); then,
  by the seed, either the links heal, or the cut-off leader is SIGKILLed first so the
  controller elects from the ELR (KIP-966), the links heal and it restarts.

Then the writers stop, every partition's replicas reach one log end, each partition is
read back from its leader (below the high watermark), and once the processes are stopped
each partition's three logs are compared byte for byte. Accounting: every body read was
sent, none twice (the idempotent producer), each sender's in the order sent (the
pipelined client's SequenceGap rule), and acknowledged = read back + lost.

acks=all loses nothing acknowledged: that is asserted. acks=1 pays for its speed: the
same faults, and the count of acknowledged writes lost is printed, with the fault that
lost them (in the test's output, and as the ``acks1_lost`` property of the JUnit report),
not asserted. The two runs are two shapes on two log cores: three
controllers beside three brokers on the C core for acks=all, combined mode (each broker
a controller voter) on the Python twin for acks=1.

A consumer's view is checked too: while a leader is cut off, what it shows below its high
watermark is read, and all of it must be in the final log (a committed record is never
taken back, whatever the acks).

Broken on purpose: ``MQLOG_ISR_TEST_BREAK=hw_below_min_isr`` (read by every ISR core of
the brokers, mqlog/replication/node.py) lets a leader's high watermark advance with only
itself in the ISR: the cut-off leader shows acks=1 writes its followers never got as
committed, and they are gone once it dies and an ELR member leads
(test_high_watermark_below_min_isr_is_caught). (acks=all writes cannot show it here: a
leader refuses them once its ISR is below the minimum, and answers the ones waiting
NOT_ENOUGH_REPLICAS_AFTER_APPEND before its high watermark moves.) A longer soak repeats
the faults (``-m slow``; ``MQLOG_ISR_SOAK_ROUNDS`` rounds, default 4).

A quick restart (test_a_leader_restarted_within_its_session_leads_no_old_epoch, acks=all,
its own run): a leader SIGKILLed and started again at once, well within its session, so
its registration finds its last life unfenced: its leaderships move to new leader
epochs, its new life leads none of its old ones (nor is it named leader of one: its
output says so per partition), and the same accounting and byte comparison follow."""

from __future__ import annotations

import os
import random
import re
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from mqlog import cli_topics, errors
from mqlog.client import Client
from mqlog.cluster_client import ClusterClient, PendingProduce
from mqlog.replication.controller.records import PartitionInfo
from mqlog.replication.controller.state import ClusterMetadata
from mqlog.replication.local import wait_until
from mqlog.replication.node import ISR_TEST_BREAK_VARIABLE
from mqlog.results import PutStatus
from tests.conftest import IMPLEMENTATIONS
from tests.faultproxy import FaultProxy
from tests.processes import (
    BROKERS,
    DEADLINE_S,
    Processes,
    change_metadata,
    cluster_state,
    store_image,
    use_core,
    wait_live_brokers,
)

TOPIC = "orders"
PARTITIONS = 6
SESSION_MS = 3_000  # broker_session_timeout_ms: a paused broker leaves ISRs (LAG_MS) first
HEARTBEAT_MS = 300
LAG_MS = 1_000  # replica_lag_time_ms
REQUEST_TIMEOUT_S = 5.0  # one request to a broker (a paused one answers never)
BACKOFF_S = 0.05  # between a sender's attempts at a write that found no leader
IN_FLIGHT = 5  # requests in flight per sender (Kafka's max.in.flight default)
DELAY_MS = 50  # on a leader's links just before they are cut


@dataclass
class IsrProcesses(Processes):
    """The processes of tests/processes.py's shapes, set up for ISR partitions, with a
    fault proxy on each direction between two brokers."""

    acks: str = "all"  # what the writers ask for: "all" or "1"
    proxies: dict[tuple[str, str], FaultProxy] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)
    # partition -> bodies a leader showed below its high watermark during the run (each
    # must be in the final log: a consumer saw it committed)
    seen: dict[int, set[bytes]] = field(default_factory=dict)

    def write_configs(self) -> None:
        self.assign_ports()
        for source in BROKERS:
            for target in BROKERS:
                if source != target and (source, target) not in self.proxies:
                    self.proxies[source, target] = FaultProxy(self.address(target))
        super().write_configs()

    def config_text(self, name: str) -> str:
        return super().config_text(name) + \
            f"min_insync_replicas = 2\nreplica_lag_time_ms = {LAG_MS}\n"

    def peer_address(self, name: str, other: str) -> str:
        proxy = self.proxies.get((name, other))
        return proxy.address if proxy is not None else self.address(other)

    def pause(self, name: str) -> None:
        super().pause(name)
        self.paused.add(name)

    def resume(self, name: str) -> None:
        super().resume(name)
        self.paused.discard(name)

    def slow(self, name: str, delay_ms: int) -> None:
        """Delay every byte between ``name`` and the other brokers by ``delay_ms``."""
        for (source, target), proxy in self.proxies.items():
            if name in (source, target):
                proxy.delay(delay_ms)

    def isolate(self, name: str) -> None:
        """Cut ``name`` off from the other brokers (TCP does not notice: blackholed)."""
        for (source, target), proxy in self.proxies.items():
            if name in (source, target):
                proxy.blackhole()

    def heal(self) -> None:
        for proxy in self.proxies.values():
            proxy.heal()

    def close(self) -> None:
        try:
            self.stop_all()
        finally:
            for proxy in self.proxies.values():
                proxy.close()

    def answering(self) -> list[str]:
        """Controller addresses that may answer (neither killed nor paused)."""
        return self.addresses([name for name in self.controllers
                               if name in self.processes and name not in self.paused])

    def state(self) -> ClusterMetadata:
        return cluster_state(self.answering())

    def group(self, name: str, partition: int) -> dict[str, Any] | None:
        """Broker ``name``'s status of a partition (None: it does not answer)."""
        try:
            with Client(self.address(name), timeout_s=REQUEST_TIMEOUT_S) as client:
                groups = client.call({"kind": "broker_metadata"})[0]["groups"]
        except errors.MqlogError:
            return None
        return groups.get(f"{TOPIC}-{partition}")


class Sender(threading.Thread):
    """One producer's writes to one partition through its own ClusterClient, up to
    ``IN_FLIGHT`` requests in flight (its ``max_in_flight_requests``), each decided in
    the order sent: acknowledged (PUT_OK), refused (NotEnoughReplicas: nothing stored)
    or unknown (the client retried it with its sequence for ``DEADLINE_S``:
    NodeUnavailable, REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS_AFTER_APPEND; it may be
    stored)."""

    def __init__(self, cluster: IsrProcesses, label: str, partition: int, acks: str,
                 producer_id: str, done: threading.Event) -> None:
        super().__init__(name=f"writer-{label}-{partition}", daemon=True)
        self.cluster, self.label, self.partition = cluster, label, partition
        self.acks, self.producer_id, self.done = acks, producer_id, done
        self.sent: list[bytes] = []
        self.acked: list[bytes] = []
        self.acked_at: dict[bytes, float] = {}  # body -> time.monotonic() of its ack
        self.refused = self.unknown = 0
        self.unexpected: list[str] = []

    def run(self) -> None:
        # (one producer id for the writer's clients: each writes one partition, whose
        # leader keeps the producer's sequences, so theirs never meet)
        with ClusterClient(self.cluster.addresses(), producer_id=self.producer_id,
                           acks=self.acks, retry_timeout_s=DEADLINE_S,
                           timeout_s=REQUEST_TIMEOUT_S,
                           max_in_flight_requests=IN_FLIGHT) as client:
            pending: deque[tuple[bytes, PendingProduce]] = deque()
            while not self.done.is_set() or pending:
                if not self.done.is_set():
                    body = f"{self.label}-{self.partition}-{len(self.sent) + 1}".encode()
                    self.sent.append(body)
                    pending.append((body, client.send(TOPIC, body, partition=self.partition)))
                while pending and (pending[0][1].done() or len(pending) >= IN_FLIGHT or
                                   self.done.is_set()):
                    body, sent = pending.popleft()
                    self._count(body, self._decide(sent, body))

    def _count(self, body: bytes, outcome: str) -> None:
        if outcome == "acked":
            self.acked_at[body] = time.monotonic()
            self.acked.append(body)
        elif outcome == "refused":
            self.refused += 1
            time.sleep(BACKOFF_S)  # a back-off while the ISR is short
        else:
            self.unknown += 1

    def _decide(self, sent: PendingProduce, body: bytes) -> str:
        try:
            result = sent.result()
        except errors.NotEnoughReplicas:
            return "refused"
        except (errors.NodeUnavailable, errors.RequestTimedOut,
                errors.NotEnoughReplicasAfterAppend):
            return "unknown"
        except errors.MqlogError as error:
            self.unexpected.append(f"{body!r}: {error!r}")
            return "unknown"
        if result.status is not PutStatus.PUT_OK:  # (FLUSH_DISK_TIMEOUT: stored)
            return "unknown"
        return "acked"


class Writer:
    """One idempotent producer (one producer id) writing to every partition at once."""

    def __init__(self, cluster: IsrProcesses, label: str, acks: str) -> None:
        self.done = threading.Event()
        producer_id = f"{label}-{uuid.uuid4().hex[:12]}"
        self.senders = [Sender(cluster, label, partition, acks, producer_id, self.done)
                        for partition in range(PARTITIONS)]

    def start(self) -> None:
        for sender in self.senders:
            sender.start()

    def finish(self) -> None:
        self.done.set()
        for sender in self.senders:
            sender.join(timeout=DEADLINE_S * 2)
            assert not sender.is_alive(), f"{sender.name} did not finish its last write"


def _acked_counts(writers: list[Writer]) -> list[int]:
    return [sum(len(writer.senders[p].acked) for writer in writers) for p in range(PARTITIONS)]


def _writes_go_on(writers: list[Writer], partitions: list[int] | range, why: str) -> None:
    """Wait until each of ``partitions`` took a new acknowledged write (from now)."""
    before = _acked_counts(writers)

    def grew() -> bool:
        assert all(s.is_alive() for w in writers for s in w.senders), "a sender died"
        now = _acked_counts(writers)
        return all(now[p] > before[p] for p in partitions)
    wait_until(grew, f"a new acknowledged write on partitions {list(partitions)} {why}",
               DEADLINE_S)


def _described(cluster: IsrProcesses) -> dict[int, dict[str, str]]:
    """Partition -> its fields as `mqlog topics describe` prints them ({} if no answer)."""
    bootstrap = ",".join(cluster.answering())
    result = CliRunner().invoke(cli_topics.topics, ["describe", TOPIC, "-b", bootstrap])
    if result.exit_code != 0:
        return {}
    return {int(found[1]): dict(re.findall(r"(\w+)=(\S+)", found[2])) for found in
            re.finditer(r"^\s*(\d+) (leader=.*)$", result.output, re.MULTILINE)}


def _parts(cluster: IsrProcesses) -> list[PartitionInfo]:
    """The partitions as a controller has them ([]: it has not folded the topic yet;
    controllers fold at their own pace)."""
    topic = cluster.state().topics.get(TOPIC)
    return list(topic.partitions) if topic is not None else []


def _isr_whole(cluster: IsrProcesses, why: str) -> None:
    """Every partition led, all three replicas in its ISR, every leader told so."""
    def whole() -> bool:
        parts = _parts(cluster)
        if not parts or not all(part.leader and len(part.isr) == 3 for part in parts):
            return False
        return all((cluster.group(part.leader, p) or {}).get("isr") == list(part.isr)
                   for p, part in enumerate(parts))
    wait_until(whole, f"every partition's ISR whole {why}", DEADLINE_S)


def _led_by(cluster: IsrProcesses, name: str) -> list[int]:
    return [p for p, part in enumerate(_parts(cluster)) if part.leader == name]


def _a_leader(cluster: IsrProcesses, rng: random.Random) -> str:
    """A broker that leads partitions, drawn by ``rng`` — once the controller asked has
    folded the topic (one that has not yet shows no leader at all)."""
    leaders: list[str] = []

    def found() -> bool:
        leaders[:] = [name for name in BROKERS if _led_by(cluster, name)]
        return bool(leaders)

    wait_until(found, "a broker leading partitions (topics describe)", DEADLINE_S)
    return rng.choice(leaders)


def _all_led_without(cluster: IsrProcesses, name: str) -> bool:
    parts = _parts(cluster)
    return bool(parts) and all(part.leader and part.leader != name for part in parts)


def _sigkill(cluster: IsrProcesses, writers: list[Writer], rng: random.Random) -> None:
    """SIGKILL a broker (it leads partitions), restart it once its partitions moved."""
    victim = _a_leader(cluster, rng)
    led = _led_by(cluster, victim)
    print(f"SIGKILL {victim}, leader of partitions {led}")
    cluster.kill(victim)
    wait_until(lambda: cluster.state().brokers[victim].fenced, f"{victim} fenced", DEADLINE_S)
    wait_until(lambda: _all_led_without(cluster, victim),
               f"partitions {led} led without {victim}", DEADLINE_S)
    _writes_go_on(writers, range(PARTITIONS), f"without {victim}")
    cluster.start(victim)
    _isr_whole(cluster, f"after {victim} restarted")


def _sigstop(cluster: IsrProcesses, writers: list[Writer], rng: random.Random) -> None:
    """SIGSTOP a broker past replica_lag_time_ms: out of the ISRs of what it follows,
    whose writes go on; SIGCONT: back in every ISR."""
    victim = rng.choice([name for name in BROKERS if len(_led_by(cluster, name)) < PARTITIONS])
    followed = [p for p in range(PARTITIONS) if p not in _led_by(cluster, victim)]
    print(f"SIGSTOP {victim}, a follower of partitions {followed}")
    cluster.pause(victim)
    try:
        def left() -> bool:
            described = _described(cluster)
            return bool(described) and all(
                victim not in described[p]["isr"].split(",") for p in followed)
        wait_until(left, f"{victim} out of the ISR of {followed} (topics describe)",
                   DEADLINE_S)
        _writes_go_on(writers, followed, f"while {victim} is stopped")
        fenced = cluster.state().brokers[victim].fenced
        print(f"{victim} left the ISRs of {followed}; fenced meanwhile: {fenced}")
    finally:
        cluster.resume(victim)
    _isr_whole(cluster, f"after {victim} resumed")


def _partition(cluster: IsrProcesses, writers: list[Writer], rng: random.Random,
               kill: bool | None = None) -> None:
    """Cut a leader off from the other brokers: its ISRs shrink to itself, the others
    drop it; heal (or SIGKILL it first: the controller elects from the ELR)."""
    victim = _a_leader(cluster, rng)
    led = _led_by(cluster, victim)
    others = [p for p in range(PARTITIONS) if p not in led]
    kill = rng.random() < 0.5 if kill is None else kill
    print(f"partition {victim}, leader of {led}, from the other brokers; then "
          + ("SIGKILL it" if kill else "heal"))
    cluster.slow(victim, DELAY_MS)  # first slow: what is in flight is lost with the links
    _writes_go_on(writers, led, f"with {victim}'s links slow")
    cluster.isolate(victim)
    try:
        def shrunk() -> bool:
            parts = _parts(cluster)
            return bool(parts) and all(parts[p].isr == (victim,) for p in led) and \
                all(victim not in parts[p].isr for p in others)
        wait_until(shrunk, f"{victim} alone in the ISRs of {led}, out of the others",
                   DEADLINE_S)

        def knows_alone() -> bool:  # (the controller decided; the victim pulls it later)
            found = [cluster.group(victim, p) for p in led]
            return all(status and status.get("isr") == [victim] for status in found)
        wait_until(knows_alone, f"{victim} knowing it is alone in the ISRs of {led}",
                   DEADLINE_S)
        _writes_go_on(writers, others, f"while {victim} is cut off")
        if cluster.acks == "1":  # taken by the cut-off leader alone, never committed there
            _writes_go_on(writers, led, f"at {victim}, alone in their ISRs")
        for p in led:  # what a consumer of the cut-off leader sees now
            cluster.seen.setdefault(p, set()).update(_read_from(cluster, victim, p))
        if kill:
            cluster.kill(victim)
            wait_until(lambda: _all_led_without(cluster, victim),
                       f"partitions {led} led again (from the ELR)", DEADLINE_S)
            _writes_go_on(writers, range(PARTITIONS), f"without {victim}")
    finally:
        cluster.heal()
    if kill:
        cluster.start(victim)
    _isr_whole(cluster, f"after {victim}'s links healed")


def _quick_restart(cluster: IsrProcesses, writers: list[Writer],
                   rng: random.Random) -> None:
    """SIGKILL a leader and restart it at once, within its session: its registration
    (its last life still unfenced; its stores left open: an unclean shutdown) moves each
    leadership it had to another ISR member in a new leader epoch; its new life never
    leads an old one again (its output says each leadership it takes, by partition) and
    it rejoins every ISR."""
    victim = _a_leader(cluster, rng)
    before = cluster.state()
    led = {p: part.leader_epoch for p, part in enumerate(before.topics[TOPIC].partitions)
           if part.leader == victim}
    print(f"SIGKILL {victim}, leader of partitions {led} (-> leader epoch), and restart it")
    cluster.output[victim] = deque()  # (its whole new life's output, not the last lines)
    killed = time.monotonic()
    cluster.kill(victim)
    cluster.start(victim)
    restarted_in = time.monotonic() - killed
    assert restarted_in < cluster.session_ms / 1000, \
        f"{victim} took {restarted_in:.1f} s to restart: past its session, it was fenced " \
        "first (raise QUICK_RESTART_SESSION_MS)"

    def moved() -> bool:
        state = cluster.state()
        parts = state.topics[TOPIC].partitions
        return state.brokers[victim].broker_epoch > before.brokers[victim].broker_epoch \
            and all(parts[p].leader_epoch > epoch and parts[p].leader for p, epoch
                    in led.items())
    wait_until(moved, f"{victim} registered again, partitions {sorted(led)} in new leader "
               "epochs", DEADLINE_S)
    _isr_whole(cluster, f"after {victim} restarted")
    lines = list(cluster.output[victim])
    for p, epoch in led.items():
        again = f"[{victim}/{TOPIC}-{p}] {victim} leads leader epoch {epoch} "
        assert not any(line.startswith(again) for line in lines), \
            f"{victim}'s new life led partition {p}'s old leader epoch {epoch} again"
    # (its core refuses to: the metadata it pulls after its registration never asks it)
    ignored = [line for line in lines if "ignores metadata naming it leader" in line]
    assert not ignored, f"{victim}'s new life was named leader of an old epoch: {ignored}"
    print("\n".join(line for line in lines if "leader epoch" in line))


FAULTS = {"sigkill": _sigkill, "sigstop": _sigstop, "partition": _partition}
ALONE = {"quick_restart": _quick_restart}  # (faults a test names; _faults never draws them)


def _converged(cluster: IsrProcesses) -> None:
    """Every partition's replicas at one log end, its leader's high watermark there."""
    def same_end() -> bool:
        for p in range(PARTITIONS):
            found = [cluster.group(name, p) for name in BROKERS]
            if not all(found) or len({status["written"] for status in found if status}) != 1:
                return False
            leader = next((status for status in found
                           if status and status["role"] == "LEADER"), None)
            if leader is None or leader["high_watermark"] != leader["written"]:
                return False
        return True
    wait_until(same_end, "every partition's replicas at one end", DEADLINE_S)


def _read_from(cluster: IsrProcesses, name: str, p: int) -> list[bytes]:
    """Partition ``p``'s bodies as broker ``name`` shows them (below its high watermark)."""
    bodies: list[bytes] = []
    with Client(cluster.address(name), timeout_s=REQUEST_TIMEOUT_S,
                group=f"{TOPIC}-{p}") as client:
        while batch := client.fetch(TOPIC, p, len(bodies), 256):
            bodies.extend(record.body for record in batch)
    return bodies


def _read_back(cluster: IsrProcesses) -> dict[int, list[bytes]]:
    """Every partition's bodies, from its leader (below the high watermark)."""
    parts = _parts(cluster)
    return {p: _read_from(cluster, parts[p].leader, p) for p in range(PARTITIONS)}


def _images_agree(cluster: IsrProcesses) -> None:
    """Once stopped: each partition's three logs byte for byte the same."""
    for p in range(PARTITIONS):
        images = {name: store_image(cluster.root / name / f"{TOPIC}-{p}")
                  for name in BROKERS}
        assert len(set(images.values())) == 1, \
            f"partition {p}'s logs differ: {({name: len(i) for name, i in images.items()})}"


@dataclass
class Outcome:
    acked: int = 0
    read_back: int = 0
    lost: list[bytes] = field(default_factory=list)
    refused: int = 0
    unknown: int = 0
    lost_in: dict[str, int] = field(default_factory=dict)  # by the fault that lost them


Window = tuple[str, float, float]  # a fault's name, when it began and ended


def _blame(acked_at: float, windows: list[Window]) -> str:
    """The fault that lost a write acknowledged at ``acked_at``: the one under way then,
    else the next to begin."""
    for name, _, ended in windows:
        if acked_at <= ended:
            return name
    return "none"


def _account(writers: list[Writer], bodies: dict[int, list[bytes]],
             seen: dict[int, set[bytes]], windows: list[Window]) -> Outcome:
    """What the writers were told, and what leaders showed, against what they hold."""
    unexpected = [u for w in writers for s in w.senders for u in s.unexpected]
    assert not unexpected, f"unexpected answers: {unexpected[:3]}"
    outcome = Outcome()
    for p in range(PARTITIONS):
        held = bodies[p]
        assert len(held) == len(set(held)), f"partition {p}: a write stored twice"
        for sender in (writer.senders[p] for writer in writers):  # (pipelined: in order)
            numbers = [int(body.rsplit(b"-", 1)[1]) for body in held
                       if body.startswith(f"{sender.label}-{p}-".encode())]
            assert numbers == sorted(numbers), f"partition {p}: {sender.label}'s writes " \
                f"stored out of the order sent: {numbers[:20]}"
        unread = seen.get(p, set()) - set(held)
        assert not unread, f"partition {p}: {len(unread)} records shown below the high " \
                           f"watermark are gone: {sorted(unread)[:5]}"
        senders = [writer.senders[p] for writer in writers]
        sent = {body for sender in senders for body in sender.sent}
        assert set(held) <= sent, f"partition {p} holds bodies never sent: " \
                                  f"{sorted(set(held) - sent)[:3]}"
        acked = [body for sender in senders for body in sender.acked]
        outcome.acked += len(acked)
        outcome.read_back += len(set(acked) & set(held))
        lost = sorted(set(acked) - set(held))
        outcome.lost += lost
        for body in lost:
            at = next(s.acked_at[body] for s in senders if body in s.acked_at)
            culprit = _blame(at, windows)
            outcome.lost_in[culprit] = outcome.lost_in.get(culprit, 0) + 1
        outcome.refused += sum(sender.refused for sender in senders)
        outcome.unknown += sum(sender.unknown for sender in senders)
    assert outcome.acked == outcome.read_back + len(outcome.lost)
    return outcome


def _run(cluster: IsrProcesses, rng: random.Random,
         faults: list[tuple[str, dict[str, Any]]]) -> Outcome:
    """The cluster started, the topic created, the writers on, ``faults`` in order;
    the writers stopped, the logs converged, read back and compared: the outcome."""
    cluster.start_all()
    wait_live_brokers(cluster.answering())
    change_metadata(cluster.answering(), {"kind": "create_topic", "name": TOPIC,
                                  "partitions": PARTITIONS, "replication_factor": 3,
                                  "layer": "isr"})
    _isr_whole(cluster, "once created")
    writers = [Writer(cluster, label, cluster.acks) for label in ("a", "b")]
    for writer in writers:
        writer.start()
    windows: list[Window] = []
    try:
        _writes_go_on(writers, range(PARTITIONS), "at first")
        for name, options in faults:
            began = time.monotonic()
            (FAULTS | ALONE)[name](cluster, writers, rng, **options)
            windows.append((name, began, time.monotonic()))
            _writes_go_on(writers, range(PARTITIONS), f"after {name}")
    finally:
        for writer in writers:
            writer.finish()
    _converged(cluster)
    outcome = _account(writers, _read_back(cluster), cluster.seen, windows)
    cluster.stop_all()
    _images_agree(cluster)
    return outcome


SHAPES = [("all", "separate", IMPLEMENTATIONS[0]), ("1", "combined", "python")]


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
            rng: random.Random) -> Any:
    """The processes of ``request.param`` = (acks, shape, log core); MQLOG_PUREPYTHON and
    MQLOG_ISR_TEST_BREAK are inherited by them."""
    acks, shape, impl = request.param
    use_core(monkeypatch, impl)
    monkeypatch.delenv(ISR_TEST_BREAK_VARIABLE, raising=False)
    print(f"acks={acks}, {shape} shape on the {impl} core")
    with IsrProcesses(tmp_path, combined=shape == "combined", rng=rng, acks=acks,
                      session_ms=SESSION_MS, heartbeat_ms=HEARTBEAT_MS) as running:
        running.write_configs()
        yield running


def _faults(rng: random.Random, rounds: int = 1) -> list[tuple[str, dict[str, Any]]]:
    return [(name, {}) for _ in range(rounds) for name in rng.sample(sorted(FAULTS), 3)]


@pytest.mark.parametrize("cluster", SHAPES, indirect=True,
                         ids=[f"acks{acks}-{shape}-{impl}" for acks, shape, impl in SHAPES])
def test_isr_cluster_under_faults(cluster: IsrProcesses, rng: random.Random,
                                  capsys: pytest.CaptureFixture[str],
                                  record_property: Any) -> None:
    outcome = _run(cluster, rng, _faults(rng))
    _report(cluster.acks, outcome, capsys, record_property)
    if cluster.acks == "all":
        assert not outcome.lost, f"{len(outcome.lost)} acks=all writes lost: " \
                                 f"{outcome.lost[:5]}"


def _report(acks: str, outcome: Outcome, capsys: pytest.CaptureFixture[str],
            record_property: Any) -> None:
    line = (f"acks={acks}: {outcome.acked} acknowledged, {outcome.read_back} read back, "
            f"{len(outcome.lost)} lost {outcome.lost_in} {outcome.lost[:3]}; "
            f"{outcome.refused} refused "
            f"(NotEnoughReplicas), {outcome.unknown} undecided")
    record_property(f"acks{acks}_acknowledged", outcome.acked)
    record_property(f"acks{acks}_lost", len(outcome.lost))
    with capsys.disabled():
        print(f"\n{line}")
    print(line)


QUICK_RESTART_SESSION_MS = 20_000  # so a restart under load still comes within it


@pytest.mark.parametrize("cluster", [("all", "separate", IMPLEMENTATIONS[0])], indirect=True,
                         ids=["acksall"])
def test_a_leader_restarted_within_its_session_leads_no_old_epoch(
        cluster: IsrProcesses, rng: random.Random, capsys: pytest.CaptureFixture[str],
        record_property: Any) -> None:
    """A leader SIGKILLed and restarted at once, under acks=all writes: its leaderships
    move to new leader epochs, its new life leads none of its old ones, nothing
    acknowledged is lost, and the logs agree byte for byte once it caught up (_run).
    It passes without c7a4dcb's fence too: a SIGKILLed broker's stores are left open, so
    it registers as an unclean shutdown, whose changes were made before that fix, and its
    core refuses an old epoch anyway. test_controller_service's direct test is the one
    that fails without the fence (ISR simulator seed 13300081: a power-lost leader led its
    old leader epoch again from a shorter log)."""
    cluster.session_ms = QUICK_RESTART_SESSION_MS
    cluster.write_configs()
    outcome = _run(cluster, rng, [("quick_restart", {})])
    _report(cluster.acks, outcome, capsys, record_property)
    assert not outcome.lost, f"{len(outcome.lost)} acks=all writes lost: {outcome.lost[:5]}"


@pytest.mark.parametrize("cluster", [("1", "separate", IMPLEMENTATIONS[0])], indirect=True,
                         ids=["acks1"])
def test_high_watermark_below_min_isr_is_caught(cluster: IsrProcesses, rng: random.Random,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ISR_TEST_BREAK_VARIABLE, "hw_below_min_isr")
    with pytest.raises(AssertionError, match="shown below the high watermark are gone"):
        _run(cluster, rng, [("partition", {"kill": True})])


@pytest.mark.slow
@pytest.mark.parametrize("cluster", SHAPES, indirect=True,
                         ids=[f"acks{acks}-{shape}-{impl}" for acks, shape, impl in SHAPES])
def test_isr_cluster_soak(cluster: IsrProcesses, rng: random.Random,
                          capsys: pytest.CaptureFixture[str], record_property: Any) -> None:
    rounds = int(os.environ.get("MQLOG_ISR_SOAK_ROUNDS", "4"))
    outcome = _run(cluster, rng, _faults(rng, rounds))
    _report(cluster.acks, outcome, capsys, record_property)
    if cluster.acks == "all":
        assert not outcome.lost, f"{len(outcome.lost)} acks=all writes lost"
