"""The issue-16 cluster as real `mqlog node` processes on 127.0.0.1, killed with SIGKILL
rather than stopped, in both of Kafka's shapes: three processes in combined mode (each a
broker and a controller voter), and three controllers beside three brokers
(``process_roles = "controller"`` and ``"broker"``). A topic of 6 partitions x RF 3 as
Raft groups, and writers producing by key through ``mqlog.ClusterClient`` the whole time:

* a broker that leads some partitions but not the controller is SIGKILLed: its
  leaderships move to the two left, every partition takes writes again, the moved
  leaders are reported back (``mqlog topics describe`` shows them, none the dead broker),
  the controller fences it; restarted, it registers again and is unfenced;
* the controller leader — whichever process leads; the processes start in a seeded
  random order, so it is not always the first — is SIGKILLed: another takes over (a topic
  is created through it) with the metadata of before;
* every process is SIGKILLed at once and restarted: the same metadata;

and every acknowledged write is read back from its partition's leader, after the kills
and again after the restart (a Raft ack means a majority stored it: no kill loses it).
Brokers host nothing but the controller's group and what the metadata assigns them.
The client retries a write whose outcome is unknown with the same producer sequence, so
a write never acknowledged may still be stored: only acked writes are required. Each
shape runs on one log core (combined: C, separate: the Python twin), both to keep the
default run's time bounded."""

from __future__ import annotations

import random
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import Popen
from typing import Any

import pytest
from click.testing import CliRunner

from mqlog import cli_topics, errors
from mqlog.client import Client
from mqlog.cluster_client import ClusterClient
from mqlog.group_client import GroupClient
from mqlog.partitioner import partition_for_key
from mqlog.replication.controller import records
from mqlog.replication.controller.state import ClusterMetadata
from mqlog.replication.local import NodeProcesses, free_ports, wait_until
from mqlog.results import PutStatus
from tests.conftest import IMPLEMENTATIONS

BROKERS = ("b1", "b2", "b3")
PARTITIONS = 6
SESSION_MS = 1_500  # broker_session_timeout_ms: short, so fencing is seen soon
DEADLINE_S = 60.0  # for any one condition (a loaded machine is slow, not wrong)


@dataclass
class Processes(NodeProcesses):
    """The cluster's `mqlog node` processes: b1..b3, each also a controller if
    ``combined``, else beside c1..c3 (controllers only)."""

    root: Path
    combined: bool = True
    rng: random.Random = field(default_factory=random.Random)  # the start order
    ports: dict[str, int] = field(default_factory=dict)
    processes: dict[str, Popen] = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        return BROKERS if self.combined else ("c1", "c2", "c3", *BROKERS)

    @property
    def controllers(self) -> tuple[str, ...]:
        return self.names[:3]

    def roles(self, name: str) -> str:
        return "broker,controller" if self.combined else \
            "controller" if name.startswith("c") else "broker"

    def address(self, name: str) -> str:
        return f"127.0.0.1:{self.ports[name]}"

    def addresses(self, names: tuple[str, ...] | list[str] = BROKERS) -> list[str]:
        return [self.address(name) for name in names]

    def controller_addresses(self, without: str = "") -> list[str]:
        return self.addresses([name for name in self.controllers if name != without])

    def write_configs(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.ports = dict(zip(self.names, free_ports(len(self.names)), strict=True))
        peers = "\n".join(f'{name} = "{self.address(name)}"' for name in self.names)
        voters = ", ".join(f'{name} = "{self.address(name)}"' for name in self.controllers)
        for name in self.names:
            (self.root / f"{name}.toml").write_text(
                f'[node]\nid = "{name}"\nlisten = "{self.address(name)}"\n'
                f'data_dir = "{self.root / name}"\nprocess_roles = "{self.roles(name)}"\n'
                f"[node.peers]\n{peers}\n[controller]\nvoters = {{{voters}}}\n"
                f"broker_session_timeout_ms = {SESSION_MS}\n"
                f"broker_heartbeat_interval_ms = {SESSION_MS // 5}\n")

    def start_all(self) -> None:
        for name in self.rng.sample(self.names, len(self.names)):
            self.start(name)

    def kill_all(self) -> None:
        for name in list(self.processes):
            self.kill(name)

    def groups(self, name: str) -> dict[str, Any]:
        with Client(self.address(name), timeout_s=5) as client:
            return client.call({"kind": "broker_metadata"})[0]["groups"]

    def partition_leaders(self) -> dict[int, str]:
        """Partition -> the broker leading its newest term, among those that answer."""
        return {partition: name for partition, (name, _) in self.partition_terms().items()}

    def partition_terms(self) -> dict[int, tuple[str, int]]:
        found: dict[int, tuple[str, int]] = {}
        for name in self.processes:
            if name not in BROKERS:
                continue
            try:
                groups = self.groups(name)
            except errors.MqlogError:
                continue
            for partition in range(PARTITIONS):
                status = groups.get(f"orders-{partition}")
                if status and status["role"] == "LEADER" and \
                        status["term"] > found.get(partition, ("", -1))[1]:
                    found[partition] = (name, status["term"])
        return found


def _describe(addresses: list[str]) -> dict[str, Any] | None:
    """describe_cluster from the first controller that can answer it (None: none can)."""
    for address in addresses:
        try:
            with Client(address, timeout_s=5) as client:
                return client.call({"kind": "describe_cluster"})[0]
        except (errors.NodeUnavailable, errors.NotMaster):
            continue
    return None


def _state(addresses: list[str]) -> ClusterMetadata:
    answers: list[dict[str, Any]] = []

    def answered() -> bool:
        found = _describe(addresses)
        if found is not None:
            answers.append(found)
        return found is not None
    wait_until(answered, "a controller describing the cluster", DEADLINE_S)
    return ClusterMetadata().apply(records.decode(answers[0]["snapshot"]),
                                   answers[0]["position"])


def _controller_leader(addresses: list[str]) -> str | None:
    answer = _describe(addresses)
    return answer.get("leader") if answer else None


def _wait_controller_leader(addresses: list[str]) -> str:
    chief: list[str] = []

    def led() -> bool:
        found = _controller_leader(addresses)
        if found:
            chief.append(found)
        return bool(found)
    wait_until(led, "a controller leader", DEADLINE_S)
    return chief[-1]


def _change(addresses: list[str], header: dict[str, Any]) -> dict[str, Any]:
    """A metadata change, sent on to the leader (waiting out an election)."""
    queue, answers = list(addresses), []

    def attempt() -> bool:
        address = queue.pop(0)
        queue.append(address)
        try:
            with Client(address, timeout_s=10) as client:
                answers.append(client.call(dict(header))[0])
                return True
        except errors.NotLeader as error:
            if error.leader_address:
                queue.insert(0, error.leader_address)
        except errors.NodeUnavailable:
            pass
        return False
    wait_until(attempt, f"the controller leader answering {header['kind']}", DEADLINE_S)
    return answers[0]


class Writer(threading.Thread):
    """Produces key-<n>-<i> through one ClusterClient (Kafka's partitioner picks the
    partition; the client finds its leader), until told to finish; keeps what was
    acknowledged."""

    def __init__(self, cluster: Processes, label: str) -> None:
        super().__init__(name=f"writer-{label}", daemon=True)
        self.cluster, self.label = cluster, label
        self.acked: list[tuple[int, bytes]] = []
        self.failures: list[str] = []
        self.done = threading.Event()
        self.progress = threading.Condition()

    def run(self) -> None:
        with ClusterClient(self.cluster.addresses(), retry_timeout_s=DEADLINE_S) as client:
            index = 0
            while not self.done.is_set():
                key = f"key-{self.label}-{index}"
                try:
                    sent = client.produce("orders", key.encode(), key=key)
                except errors.MqlogError as error:
                    self.failures.append(f"{key}: {error!r}")
                else:
                    if sent.status is not PutStatus.PUT_OK:
                        self.failures.append(f"{key}: {sent.status}")
                    elif sent.partition != partition_for_key(key, PARTITIONS):
                        self.failures.append(f"{key}: went to partition {sent.partition}")
                    else:
                        with self.progress:
                            self.acked.append((sent.partition, key.encode()))
                            self.progress.notify_all()
                index += 1

    def wait_for_more(self, count: int) -> None:
        with self.progress:
            target = len(self.acked) + count
            if not self.progress.wait_for(lambda: len(self.acked) >= target or
                                          not self.is_alive(), DEADLINE_S):
                raise TimeoutError(f"{self.name}: {count} more acks not within "
                                   f"{DEADLINE_S} s; failures: {self.failures[-3:]}")
        assert len(self.acked) >= target, f"{self.name} died: {self.failures[-3:]}"

    def per_partition(self) -> list[int]:
        with self.progress:
            return [sum(1 for p, _ in self.acked if p == partition)
                    for partition in range(PARTITIONS)]

    def finish(self) -> None:
        self.done.set()
        self.join(timeout=DEADLINE_S * 2)
        assert not self.is_alive()


def _every_partition_writes(writers: list[Writer]) -> None:
    """Wait until every partition took a new acknowledged write (from now)."""
    def counts() -> list[int]:
        tallies = [writer.per_partition() for writer in writers]
        return [sum(tally[p] for tally in tallies) for p in range(PARTITIONS)]
    start = counts()

    def grew() -> bool:
        assert all(writer.is_alive() for writer in writers), "a writer died"
        return all(now > then for now, then in zip(counts(), start, strict=True))
    wait_until(grew, "a new acknowledged write on every partition", DEADLINE_S)


def _read_partition(reader: ClusterClient, partition: int) -> list[bytes] | None:
    """Every body of a partition, from its leader (None: no leader answers yet)."""
    bodies: list[bytes] = []
    try:
        while batch := reader.fetch("orders", partition, len(bodies), 256):
            bodies.extend(record.body for record in batch)
    except errors.NodeUnavailable:
        return None
    return bodies


def _assert_acked_present(cluster: Processes, acked: list[tuple[int, bytes]]) -> None:
    missing: dict[int, set[bytes]] = {}
    with ClusterClient(cluster.addresses(), retry_timeout_s=5) as reader:
        def every_ack_read() -> bool:
            missing.clear()
            for partition in range(PARTITIONS):
                wanted = {body for p, body in acked if p == partition}
                bodies = _read_partition(reader, partition)
                if bodies is None:
                    missing[partition] = wanted
                elif wanted - set(bodies):
                    missing[partition] = wanted - set(bodies)
            return not missing
        try:
            wait_until(every_ack_read, f"{len(acked)} acknowledged writes read back",
                       DEADLINE_S)
        except TimeoutError:
            pytest.fail(f"acknowledged writes not read back: "
                        f"{ {p: sorted(b)[:5] for p, b in missing.items()} }")


def _described(cluster: Processes, without: str = "") -> dict[int, tuple[str, int]]:
    """Partition -> (leader, leader epoch) of orders, as `mqlog topics describe` shows."""
    bootstrap = ",".join(cluster.controller_addresses(without))
    result = CliRunner().invoke(cli_topics.topics, ["describe", "orders", "-b", bootstrap])
    if result.exit_code != 0:
        return {}
    return {int(found[1]): (found[2], int(found[3])) for found in
            re.finditer(r"^\s*(\d+) leader=(\S+) leader_epoch=(\d+) ", result.output,
                        re.MULTILINE)}


def _hosts_only_what_is_assigned(cluster: Processes, state: ClusterMetadata) -> None:
    """No broker hosts a stray group: the controller's, and its assigned partitions."""
    for name in cluster.processes:
        expected = {"__controller"} if name in cluster.controllers else set()
        if name in BROKERS:
            expected |= {f"{topic.name}-{index}" for topic in state.topics.values()
                         for index, part in enumerate(topic.partitions)
                         if name in part.replicas}
        wait_until(lambda n=name, e=expected: set(cluster.groups(n)) == e,
                   f"{name} hosting exactly {sorted(expected)}", DEADLINE_S)


SHAPES = [("combined", IMPLEMENTATIONS[0]), ("separate", "python")]


@pytest.fixture(params=SHAPES, ids=[f"{shape}-{impl}" for shape, impl in SHAPES])
def cluster(tmp_path: Path, request: pytest.FixtureRequest,
            monkeypatch: pytest.MonkeyPatch) -> Any:
    """The processes of a shape, on a log core (MQLOG_PUREPYTHON is inherited), started
    in a seeded random order."""
    shape, impl = request.param
    if impl == "python":
        monkeypatch.setenv("MQLOG_PUREPYTHON", "1")
    else:
        monkeypatch.delenv("MQLOG_PUREPYTHON", raising=False)
    seed = random.randrange(1 << 30)
    print(f"{shape} shape on the {impl} core; start-order seed {seed}")
    running = Processes(tmp_path, combined=shape == "combined", rng=random.Random(seed))
    running.write_configs()
    try:
        running.start_all()
        yield running
    finally:
        running.stop_all()


def test_sigkilled_broker_and_controller_leader_lose_no_acked_write(cluster: Processes) -> None:
    controllers = cluster.controller_addresses()
    wait_until(lambda: len(_state(controllers).live_brokers()) == 3, "three live brokers",
               DEADLINE_S)
    answer = _change(controllers, {"kind": "create_topic", "name": "orders",
                                   "partitions": PARTITIONS, "replication_factor": 3,
                                   "layer": "raft"})
    assert len(answer["assignment"]) == PARTITIONS
    wait_until(lambda: len(cluster.partition_leaders()) == PARTITIONS, "6 partition leaders",
               DEADLINE_S)
    created = _state(controllers)
    _hosts_only_what_is_assigned(cluster, created)
    writers = [Writer(cluster, label) for label in ("a", "b")]
    for writer in writers:
        writer.start()
    try:
        for writer in writers:
            writer.wait_for_more(30)
        _kill_a_partition_leader(cluster, writers)
        _kill_the_controller_leader(cluster, writers, created)
    finally:
        for writer in writers:
            writer.finish()
    acked = [item for writer in writers for item in writer.acked]
    failures = [f for writer in writers for f in writer.failures]
    assert not failures, f"writes failed: {failures[:3]}"
    _assert_acked_present(cluster, acked)

    before = _state(controllers)
    cluster.kill_all()  # everything at once, then everything again
    cluster.start_all()
    wait_until(lambda: (_state(controllers).position >= before.position),
               "the metadata folded again", DEADLINE_S)
    again = _state(controllers)
    assert again.topics == before.topics
    assert sorted(again.brokers) == sorted(before.brokers) == list(BROKERS)
    assert again.topics["orders"] == created.topics["orders"]
    _assert_acked_present(cluster, acked)
    _hosts_only_what_is_assigned(cluster, again)
    _group_on_one_broker(cluster, again)


def _group_on_one_broker(cluster: Processes, state: ClusterMetadata) -> None:
    """A GroupClient passes over brokers that host no such group (a restarted one has not
    pulled it yet; here: "later" has one replica); one no broker hosts is a typed error."""
    (host,) = state.partition("later", 0).replicas
    wait_until(lambda: "later-0" in cluster.groups(host), f"{host} hosting later-0",
               DEADLINE_S)
    others = [name for name in BROKERS if name != host]
    with GroupClient(cluster.addresses([*others, host]), group="later-0") as client:
        assert client.produce("later", b"x", 0).status is PutStatus.PUT_OK
    with GroupClient(cluster.addresses(), group="later-9") as client, \
            pytest.raises(errors.UnknownGroup, match="hosts no group 'later-9'"):
        client.produce("later", b"x", 9)


def _kill_a_partition_leader(cluster: Processes, writers: list[Writer]) -> None:
    """SIGKILL a broker leading partitions (not the controller leader), then restart it;
    the partitions' new leaders are reported back."""
    chief = _wait_controller_leader(cluster.controller_addresses())
    leaders = cluster.partition_leaders()
    victim = max((name for name in BROKERS if name != chief),
                 key=lambda name: list(leaders.values()).count(name))
    if victim not in leaders.values():  # it must lead something for leaderships to move
        with Client(cluster.address(leaders[0]), timeout_s=10, group="orders-0") as client:
            client.transfer(victim)
        wait_until(lambda: cluster.partition_leaders().get(0) == victim,
                   f"{victim} leading partition 0", DEADLINE_S)
        leaders = cluster.partition_leaders()
    led = sorted(p for p, name in leaders.items() if name == victim)
    wait_until(lambda: _described(cluster) == cluster.partition_terms(),
               "describe showing every partition's leader", DEADLINE_S)
    print(f"SIGKILL {victim}, leader of partitions {led} (controller leader: {chief})")
    cluster.kill(victim)
    alive = cluster.controller_addresses(victim)
    wait_until(lambda: len(cluster.partition_leaders()) == PARTITIONS,
               f"partitions {led} led again without {victim}", DEADLINE_S)
    _every_partition_writes(writers)  # writes continue, to every partition
    wait_until(lambda: _described(cluster, victim) == cluster.partition_terms(),
               f"describe showing the leaders of {led} after {victim}", DEADLINE_S)
    assert victim not in {leader for leader, _ in _described(cluster, victim).values()}
    wait_until(lambda: _state(alive).brokers[victim].fenced, f"{victim} fenced", DEADLINE_S)
    cluster.start(victim)  # back: a new broker epoch, unfenced
    wait_until(lambda: not _state(alive).brokers[victim].fenced, f"{victim} back",
               DEADLINE_S)


def _kill_the_controller_leader(cluster: Processes, writers: list[Writer],
                                created: ClusterMetadata) -> None:
    """SIGKILL the controller leader: another takes over with the metadata intact."""
    chief = _wait_controller_leader(cluster.controller_addresses())
    print(f"SIGKILL the controller leader {chief}")
    cluster.kill(chief)
    alive = cluster.controller_addresses(chief)
    _change(alive, {"kind": "create_topic", "name": "later", "partitions": 1,
                    "replication_factor": 1, "layer": "raft"})
    assert _wait_controller_leader(alive) != chief
    assert _state(alive).topics["orders"] == created.topics["orders"]
    _every_partition_writes(writers)
    cluster.start(chief)
