"""``mqlog.ClusterClient`` against an in-process cluster (three combined-mode brokers,
each on its own loop and thread): records produced by key land on the partition Kafka's
partitioner names and read back from the leaders; a partition's leadership moved (a
Raft transfer) is reported back — ``cluster_metadata`` and ``mqlog topics describe`` show
the new leader with its term — while the client, holding the old metadata, follows the
NotLeader and keeps writing; a topic that does not exist and a partition it does not
have are typed errors. The SIGKILL scenarios are tests/test_controller_processes.py's."""

from __future__ import annotations

import re
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from mqlog import cli_topics, errors
from mqlog.client import Client
from mqlog.cluster_client import ClusterClient, metadata_from
from mqlog.partitioner import partition_for_key
from mqlog.replication.controller import records
from mqlog.replication.controller.records import RegisterBroker
from mqlog.replication.controller.state import fold
from mqlog.replication.local import wait_until
from mqlog.replication.wire import Frame, FrameDecoder, encode_frame
from mqlog.results import PutStatus
from tests import inprocess
from tests.inprocess import BROKERS, Cluster
from tests.processes import change_metadata, cluster_state, wait_live_brokers

PARTITIONS = 6


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    with Cluster(inprocess.configs(tmp_path, combined=True)) as running:
        yield running


def _create(addresses: list[str], name: str, partitions: int, factor: int) -> None:
    wait_live_brokers(addresses)
    change_metadata(addresses, {"kind": "create_topic", "name": name, "partitions": partitions,
                                "replication_factor": factor, "layer": "raft"})


def _leaders(cluster: Cluster) -> dict[int, tuple[str, int]]:
    """Partition -> (the broker leading it, its term), from the brokers' own cores."""
    found: dict[int, tuple[str, int]] = {}
    for name, thread in cluster.threads.items():
        for partition in range(PARTITIONS):
            node = thread.broker.groups.get(f"orders-{partition}")
            status = node.core.status() if node is not None else {}
            if status.get("role") == "LEADER" and \
                    status["term"] > found.get(partition, ("", -1))[1]:
                found[partition] = (name, status["term"])
    return found


def _described(bootstrap: str) -> dict[int, tuple[str, int]]:
    """Partition -> (leader, leader_epoch) as `mqlog topics describe orders` prints them."""
    result = CliRunner().invoke(cli_topics.topics, ["describe", "orders", "-b", bootstrap])
    assert result.exit_code == 0, result.output
    return _partition_lines(result.output)


def _partition_lines(output: str) -> dict[int, tuple[str, int]]:
    """The "P leader=B leader_epoch=E ..." lines of describe's output (the brokers of this
    process print to the same stdout)."""
    return {int(found[1]): (found[2], int(found[3])) for found in
            re.finditer(r"^\s*(\d+) leader=(\S+) leader_epoch=(\d+) ", output, re.MULTILINE)}


def test_produce_by_key_read_back_and_a_moved_leader_is_reported(cluster: Cluster) -> None:
    addresses = [config.listen for config in cluster.configs.values()]
    bootstrap = ",".join(addresses)
    _create(addresses, "orders", PARTITIONS, 3)
    # (metadata kept for the whole test: under load the default 5 s could age out between
    # the leader's move and the produce, and the client would not meet the old leader)
    with ClusterClient(addresses[:1], retry_timeout_s=60,
                       metadata_max_age_ms=3_600_000) as client:
        keys = [f"key-{index}" for index in range(30)]
        for key in keys:
            sent = client.produce("orders", key.encode(), key=key)
            assert sent.status is PutStatus.PUT_OK
            assert sent.partition == partition_for_key(key, PARTITIONS)
        for partition in range(PARTITIONS):
            bodies = [record.body for record in client.fetch("orders", partition, 0, 100)]
            assert bodies == [key.encode() for key in keys
                              if partition_for_key(key, PARTITIONS) == partition]
        # every leader reported back, with its term, on brokers and controllers alike
        wait_until(lambda: _described(bootstrap) == _leaders(cluster) and
                   len(_leaders(cluster)) == PARTITIONS, "describe showing the leaders", 60)
        with Client(addresses[1], timeout_s=10) as broker:
            answer = broker.call({"kind": "cluster_metadata"})[0]
        state, leaders = metadata_from(answer)
        assert len(leaders) <= PARTITIONS and state.topics["orders"]
        leader, term = _leaders(cluster)[0]
        # (the view must show that leader: one taken before the leaders were reported
        # shows the preferred replica, which may be the target below)
        wait_until(lambda: client.metadata(refresh=True).partition("orders", 0).leader ==
                   leader, f"the client's view showing {leader} leading partition 0", 60)
        before = client.metadata()
        target = next(name for name in BROKERS if name != leader)
        with Client(cluster.configs[leader].listen, timeout_s=10, group="orders-0") as one:
            one.transfer(target)
        wait_until(lambda: _leaders(cluster).get(0, ("", 0))[0] == target,
                   f"{target} leading partition 0", 60)
        assert client.metadata() is before  # (cached: the client still sends to the old)
        retries = client.retries
        sent = client.produce("orders", b"after the move", partition=0)
        assert sent.status is PutStatus.PUT_OK and client.retries > retries
        wait_until(lambda: _described(bootstrap)[0] == _leaders(cluster)[0], "describe "
                   f"showing {target} leading partition 0", 60)
        assert _described(bootstrap)[0][1] > term
        with Client(addresses[2], timeout_s=10) as broker:  # a broker's answer, too
            wait_until(lambda: metadata_from(broker.call({"kind": "cluster_metadata"})[0])[1]
                       and target == _broker_view(broker), "cluster_metadata showing "
                       f"{target}", 60)


def _broker_view(broker: Client) -> str:
    state, leaders = metadata_from(broker.call({"kind": "cluster_metadata"})[0])
    return next((leader for topic, partition, leader, _ in leaders
                 if (topic, partition) == ("orders", 0)), "")


def test_unknown_topics_and_partitions_are_typed(cluster: Cluster) -> None:
    addresses = [config.listen for config in cluster.configs.values()]
    _create(addresses, "small", 2, 1)
    with ClusterClient(addresses, retry_timeout_s=60) as client:
        wait_until(lambda: "small" in client.metadata(refresh=True).topics, "small", 60)
        for partition in (2, -1, "0", True):
            with pytest.raises(errors.InvalidArgument, match="partitions 0..1"):
                client.produce("small", b"x", partition=partition)
    with ClusterClient(addresses, retry_timeout_s=0.5) as client, \
            pytest.raises(errors.UnknownTopic, match="no topic 'nothing'"):
        client.produce("nothing", b"x")
    for bad in ([], "", ","):
        with pytest.raises(errors.InvalidArgument, match="bootstrap"):
            ClusterClient(bad)
    with pytest.raises(errors.InvalidArgument, match="retry_timeout_s"):
        ClusterClient("h:1", retry_timeout_s=0)
    with ClusterClient(["127.0.0.1:1"], retry_timeout_s=0.3) as client, \
            pytest.raises(errors.NodeUnavailable, match="no broker answered"):
        client.produce("small", b"x")


def test_rebalance_moves_raft_leaders_to_their_preferred_replicas(cluster: Cluster) -> None:
    addresses = [config.listen for config in cluster.configs.values()]
    bootstrap = ",".join(addresses)
    _create(addresses, "orders", PARTITIONS, 3)
    wait_until(lambda: len(_leaders(cluster)) == PARTITIONS and
               _described(bootstrap) == _leaders(cluster), "the leaders reported", 60)
    preferred = {index: part.replicas[0] for index, part in
                 enumerate(cluster_state(addresses).topics["orders"].partitions)}
    if all(_leaders(cluster)[p][0] == preferred[p] for p in preferred):  # (rare: move one)
        with Client(cluster.configs[preferred[0]].listen, timeout_s=10,
                    group="orders-0") as one:
            one.transfer(next(name for name in BROKERS if name != preferred[0]))
        wait_until(lambda: _described(bootstrap)[0][0] not in ("", preferred[0]),
                   "partition 0 led elsewhere", 60)
    off = sorted(p for p in preferred if _described(bootstrap)[p][0] != preferred[p])
    result = CliRunner().invoke(cli_topics.topics, ["rebalance", "-b", bootstrap])
    assert result.exit_code == 0, result.output
    assert f"{len(off)} transfers asked, 0 failed" in result.output
    for p in off:
        assert f"orders {p}: " in result.output and f"-> {preferred[p]}: transferring" in \
            result.output
    wait_until(lambda: {p: name for p, (name, _) in _leaders(cluster).items()} == preferred,
               "every partition led by its preferred replica", 60)
    wait_until(lambda: {p: name for p, (name, _) in _described(bootstrap).items()} ==
               preferred, "describe showing the preferred leaders", 60)
    again = CliRunner().invoke(cli_topics.topics, ["rebalance", "orders", "-b", bootstrap])
    assert again.exit_code == 0 and "0 transfers asked" in again.output
    assert again.output.count("led by its preferred leader") == PARTITIONS
    missing = CliRunner().invoke(cli_topics.topics, ["rebalance", "nothing", "-b", bootstrap])
    assert missing.exit_code != 0 and "no topic nothing" in str(missing.exception)


class _Liar:
    """A "broker" on 127.0.0.1 that answers every request with ``answer`` (garbage)."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            with connection:
                decoder = FrameDecoder(1 << 20)
                while data := connection.recv(1 << 16):
                    decoder.feed(data)
                    while isinstance(frame := decoder.next_frame(), Frame):
                        connection.sendall(encode_frame(
                            {**self.answer, "id": frame.header.get("id")}, b""))

    def close(self) -> None:
        self.server.close()


@pytest.mark.parametrize("answer", [
    {"snapshot": b"\xc1garbage", "position": 1}, {"snapshot": 7}, {"position": 3},
    {"snapshot": b"", "position": 0, "leaders": [["t", 0, "b1"]]},
    {"kind": "error", "error": "UnknownGroup", "message": "no such"}])
def test_garbage_metadata_from_a_broker_is_passed_over_and_typed(answer: Any) -> None:
    liar = _Liar(answer)
    try:
        with ClusterClient([liar.address], retry_timeout_s=0.3) as client, \
                pytest.raises(errors.NodeUnavailable, match="no broker answered"):
            client.produce("t", b"x")
    finally:
        liar.close()


def test_a_liar_beside_a_real_broker_does_not_stop_the_client(cluster: Cluster) -> None:
    addresses = [config.listen for config in cluster.configs.values()]
    _create(addresses, "small", 1, 3)
    liar = _Liar({"snapshot": b"\xc1", "position": 10**9})
    try:
        with ClusterClient([liar.address, *addresses], retry_timeout_s=60) as client:
            assert client.produce("small", b"x").status is PutStatus.PUT_OK
            assert client.fetch("small", 0)[0].body == b"x"
    finally:
        liar.close()


def test_a_raft_follower_refusing_a_fetch_names_its_leader(cluster: Cluster) -> None:
    """A follower's refusal named no leader (NotMaster), so a client whose view still
    showed a leader that had moved had only its metadata to go by (the liveness failure
    of test_controller_processes after a controller leader's SIGKILL)."""
    addresses = [config.listen for config in cluster.configs.values()]
    _create(addresses, "orders", PARTITIONS, 3)
    wait_until(lambda: 0 in _leaders(cluster), "a leader of partition 0", 60)
    leader, _term = _leaders(cluster)[0]
    follower = next(name for name in BROKERS if name != leader)
    with Client(cluster.configs[follower].listen, timeout_s=10, group="orders-0") as one, \
            pytest.raises(errors.NotLeader) as refused:
        one.fetch("orders", 0, 0, 10)
    if refused.value.leader is not None:  # (it may not have heard from the leader yet)
        assert refused.value.leader == leader
        assert refused.value.leader_address == cluster.configs[leader].listen


def test_refusals_naming_no_leader_go_round_the_replicas() -> None:
    """A view that still shows a moved leader, replicas that refuse without naming the
    leader: the client tried the shown leader and the next replica in turn, forever (until
    its retry_timeout_s), and never the third, which led."""
    view = fold([RegisterBroker(name, 1, f"127.0.0.1:{port}") for name, port in
                 (("b1", 1), ("b2", 2), ("b3", 3))] +
                [records.UnfenceBroker(name, 1) for name in ("b1", "b2", "b3")] +
                [records.CreateTopic("orders", "raft", (("b1", "b2", "b3"),))])
    asked: list[str] = []

    class Replica:
        def __init__(self, address: str) -> None:
            self.address = address

        def fetch(self, *args: Any, leader_only: bool = False) -> list[str]:
            assert leader_only  # (a follower would serve it otherwise)
            asked.append(self.address)
            if self.address != "127.0.0.1:3":
                raise errors.NotMaster(f"{self.address} does not lead")
            return ["the record"]

    client = ClusterClient(["127.0.0.1:1"], retry_timeout_s=2, retry_backoff_ms=1)
    client.metadata = lambda refresh=False: view  # type: ignore[method-assign]
    client._connection = lambda address, group=None: Replica(address)  # type: ignore
    assert client.fetch("orders", 0) == ["the record"]
    assert asked == ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
