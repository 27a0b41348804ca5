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
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from mqlog import cli_topics, errors
from mqlog.client import Client
from mqlog.cluster_client import ClusterClient
from mqlog.group_client import GroupClient
from mqlog.partitioner import partition_for_key
from mqlog.replication.controller.state import ClusterMetadata
from mqlog.replication.local import wait_until
from mqlog.results import PutStatus
from tests import processes
from tests.conftest import IMPLEMENTATIONS
from tests.processes import (
    BROKERS,
    DEADLINE_S,
    Processes,
    change_metadata,
    cluster_state,
    use_core,
    wait_controller_leader,
    wait_live_brokers,
    writing,
)

PARTITIONS = 6


class RaftProcesses(Processes):
    """The shapes of tests/processes.py, asked about the Raft partitions of "orders"."""

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


class Writer(processes.Writer):
    """Produces key-<n>-<i> through one ClusterClient (Kafka's partitioner picks the
    partition; the client finds its leader), until told to finish; keeps what was
    acknowledged."""

    def __init__(self, cluster: RaftProcesses, label: str) -> None:
        super().__init__(label)
        self.cluster = cluster

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
                        self.acknowledged((sent.partition, key.encode()))
                index += 1

    def per_partition(self) -> list[int]:
        with self.progress:
            return [sum(1 for p, _ in self.acked if p == partition)
                    for partition in range(PARTITIONS)]


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


def _read_partition(reader: ClusterClient, partition: int,
                    unavailable: dict[int, str] | None = None) -> list[bytes] | None:
    """Every body of a partition, from its leader (None: no leader answers yet; why, into
    ``unavailable``)."""
    bodies: list[bytes] = []
    try:
        while batch := reader.fetch("orders", partition, len(bodies), 256):
            bodies.extend(record.body for record in batch)
    except errors.NodeUnavailable as error:
        if unavailable is not None:
            unavailable[partition] = str(error)
        return None
    return bodies


def _assert_acked_present(cluster: RaftProcesses, acked: list[tuple[int, bytes]]) -> None:
    missing: dict[int, set[bytes]] = {}
    unavailable: dict[int, str] = {}
    with ClusterClient(cluster.addresses(), retry_timeout_s=5) as reader:
        def every_ack_read() -> bool:
            missing.clear()
            unavailable.clear()
            for partition in range(PARTITIONS):
                wanted = {body for p, body in acked if p == partition}
                bodies = _read_partition(reader, partition, unavailable)
                if bodies is None:
                    missing[partition] = wanted
                elif wanted - set(bodies):
                    missing[partition] = wanted - set(bodies)
            return not missing
        try:
            wait_until(every_ack_read, f"{len(acked)} acknowledged writes read back",
                       DEADLINE_S)
        except TimeoutError:
            view = reader.metadata(refresh=True).topics["orders"].partitions
            pytest.fail(f"acknowledged writes not read back: "
                        f"{ {p: sorted(b)[:5] for p, b in missing.items()} }; no leader "
                        f"answered: {unavailable}; the reader's view: {view}")


def _described(cluster: RaftProcesses, without: str = "") -> dict[int, tuple[str, int]]:
    """Partition -> (leader, leader epoch) of orders, as `mqlog topics describe` shows."""
    bootstrap = ",".join(cluster.controller_addresses(without))
    result = CliRunner().invoke(cli_topics.topics, ["describe", "orders", "-b", bootstrap])
    if result.exit_code != 0:
        return {}
    return {int(found[1]): (found[2], int(found[3])) for found in
            re.finditer(r"^\s*(\d+) leader=(\S+) leader_epoch=(\d+) ", result.output,
                        re.MULTILINE)}


def _hosts_only_what_is_assigned(cluster: RaftProcesses, state: ClusterMetadata) -> None:
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
            monkeypatch: pytest.MonkeyPatch, seed: int) -> Any:
    """The processes of a shape, on a log core (MQLOG_PUREPYTHON is inherited), started
    in a seeded random order."""
    shape, impl = request.param
    use_core(monkeypatch, impl)
    print(f"{shape} shape on the {impl} core; start-order seed {seed}")
    with RaftProcesses(tmp_path, combined=shape == "combined",
                       rng=random.Random(seed)) as running:
        running.write_configs()
        running.start_all()
        yield running


def test_sigkilled_broker_and_controller_leader_lose_no_acked_write(
        cluster: RaftProcesses) -> None:
    controllers = cluster.controller_addresses()
    wait_live_brokers(controllers)
    answer = change_metadata(controllers, {"kind": "create_topic", "name": "orders",
                                   "partitions": PARTITIONS, "replication_factor": 3,
                                   "layer": "raft"})
    assert len(answer["assignment"]) == PARTITIONS
    wait_until(lambda: len(cluster.partition_leaders()) == PARTITIONS, "6 partition leaders",
               DEADLINE_S)
    created = cluster_state(controllers)
    _hosts_only_what_is_assigned(cluster, created)
    with writing([Writer(cluster, label) for label in ("a", "b")], 30) as writers:
        _kill_a_partition_leader(cluster, writers)
        _kill_the_controller_leader(cluster, writers, created)
    acked = [item for writer in writers for item in writer.acked]
    failures = [f for writer in writers for f in writer.failures]
    assert not failures, f"writes failed: {failures[:3]}"
    _assert_acked_present(cluster, acked)

    before = cluster_state(controllers)
    cluster.kill_all()  # everything at once, then everything again
    cluster.start_all()
    wait_until(lambda: (cluster_state(controllers).position >= before.position),
               "the metadata folded again", DEADLINE_S)
    again = cluster_state(controllers)
    assert again.topics == before.topics
    assert sorted(again.brokers) == sorted(before.brokers) == list(BROKERS)
    assert again.topics["orders"] == created.topics["orders"]
    _assert_acked_present(cluster, acked)
    _hosts_only_what_is_assigned(cluster, again)
    _group_on_one_broker(cluster, again)


def _group_on_one_broker(cluster: RaftProcesses, state: ClusterMetadata) -> None:
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


def _kill_a_partition_leader(cluster: RaftProcesses, writers: list[Writer]) -> None:
    """SIGKILL a broker leading partitions (not the controller leader), then restart it;
    the partitions' new leaders are reported back."""
    chief = wait_controller_leader(cluster.controller_addresses())
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
    wait_until(lambda: cluster_state(alive).brokers[victim].fenced, f"{victim} fenced", DEADLINE_S)
    cluster.start(victim)  # back: a new broker epoch, unfenced
    wait_until(lambda: not cluster_state(alive).brokers[victim].fenced, f"{victim} back",
               DEADLINE_S)


def _kill_the_controller_leader(cluster: RaftProcesses, writers: list[Writer],
                                created: ClusterMetadata) -> None:
    """SIGKILL the controller leader: another takes over with the metadata intact."""
    chief = wait_controller_leader(cluster.controller_addresses())
    print(f"SIGKILL the controller leader {chief}")
    cluster.kill(chief)
    alive = cluster.controller_addresses(chief)
    change_metadata(alive, {"kind": "create_topic", "name": "later", "partitions": 1,
                    "replication_factor": 1, "layer": "raft"})
    assert wait_controller_leader(alive) != chief
    assert cluster_state(alive).topics["orders"] == created.topics["orders"]
    _every_partition_writes(writers)
    cluster.start(chief)
