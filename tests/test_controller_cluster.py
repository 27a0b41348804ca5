"""Clusters on 127.0.0.1, in-process (each broker on its own loop and thread): three
controllers and three brokers, and the combined mode (Kafka's: three processes each a
broker and a controller). Brokers register and heartbeat; a topic of 6 partitions x RF 3
becomes 6 Raft groups across them; records produced by key land on the partition Kafka's
partitioner names and read back; a broker stopped is fenced by the controller and its
partitions keep taking writes; the controller leader stopped, another takes over with
the metadata intact; everything restarted, the same metadata."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from mqlog import errors
from mqlog.client import Client
from mqlog.config import StoreConfig
from mqlog.partitioner import partition_for_key
from mqlog.replication.controller.state import ClusterMetadata
from mqlog.replication.local import wait_until
from tests import inprocess
from tests.inprocess import BROKERS, Cluster
from tests.processes import change_metadata, cluster_state, wait_live_brokers


def _produce(addresses: list[str], partition: int, key: str, body: bytes) -> None:
    """To the partition's Raft leader (any broker hosting it says who that is), waiting
    for its election."""
    queue = list(addresses)

    def attempt() -> bool:
        address = queue.pop(0)
        queue.append(address)
        try:
            with Client(address, timeout_s=10) as client:
                client.produce("orders", body, partition, key)
                return True
        except errors.NotLeader as error:
            if error.leader_address:
                queue.insert(0, error.leader_address)
        except (errors.NodeUnavailable, errors.UnknownGroup):
            pass
        return False
    wait_until(attempt, f"partition {partition} taking a write", 60)


def _fetch(addresses: list[str], partition: int) -> list:
    """The partition's records, from its leader (the others refuse reads)."""
    for address in addresses:
        try:
            with Client(address, timeout_s=10) as client:
                return client.fetch("orders", partition, 0, 100)
        except (errors.NotMaster, errors.NodeUnavailable, errors.UnknownGroup):
            continue
    return []


@pytest.fixture(params=["combined", "separate"])
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    with Cluster(inprocess.configs(tmp_path, request.param == "combined")) as running:
        yield running


def test_raft_topics_over_three_brokers(cluster: Cluster) -> None:
    configs, threads = cluster.configs, cluster.threads
    addresses, controllers = [config.listen for config in configs.values()], cluster.controllers
    wait_live_brokers(controllers)
    answer = change_metadata(controllers, {"kind": "create_topic", "name": "orders",
                                           "partitions": 6, "replication_factor": 3,
                                           "layer": "raft"})
    assert len(answer["assignment"]) == 6
    wait_until(lambda: all(f"orders-{p}" in threads[name].broker.groups for name in BROKERS
                           for p in range(6)), "every broker hosting its partitions", 60)
    keys = [f"key-{index}" for index in range(24)]
    for key in keys:
        _produce(addresses, partition_for_key(key, 6), key, key.encode())
    for partition in range(6):
        expected = [key for key in keys if partition_for_key(key, 6) == partition]
        count = len(expected)
        wait_until(lambda p=partition, n=count: len(_fetch(addresses, p)) == n,
                   f"partition {partition} committed", 30)
        assert [record.key for record in _fetch(addresses, partition)] == expected

    cluster.stop("b3")  # its Raft groups elect without it; the controller fences it
    alive = [address for address in controllers if address != configs["b3"].listen]
    wait_until(lambda: cluster_state(alive).brokers["b3"].fenced, "b3 fenced", 60)
    for key in keys[:6]:
        _produce([configs[name].listen for name in ("b1", "b2")], partition_for_key(key, 6),
                 key, b"again")
    before = cluster_state(alive)
    assert sorted(before.topics) == ["orders"]

    cluster.start("b3")  # back: it registers again (a new broker epoch) and is unfenced
    wait_until(lambda: not cluster_state(alive).brokers["b3"].fenced, "b3 back", 60)
    alive = controllers
    leader = cluster.leader()
    cluster.stop(leader)  # the controller leader: another takes over
    alive = [address for address in alive if address != configs[leader].listen]
    change_metadata(alive, {"kind": "create_topic", "name": "later", "partitions": 1,
                            "replication_factor": 1, "layer": "raft"})
    assert cluster_state(alive).topics["orders"] == before.topics["orders"]

    cluster.stop()  # everything, then everything again: the same metadata
    cluster.start()
    seen: list[ClusterMetadata] = []  # one answer, checked and kept: controllers fold at
    # their own pace, so two asks may reach two controllers at different positions

    def folded_again() -> bool:
        seen[:] = [cluster_state(controllers)]
        return "later" in seen[0].topics
    wait_until(folded_again, "the metadata, folded again", 60)
    again = seen[0]
    assert again.topics == {**before.topics, "later": again.topics["later"]}
    assert set(again.brokers) == set(BROKERS)


def test_brokers_open_the_partitions_they_are_assigned_with_their_store_settings(
        tmp_path: Path) -> None:
    """A broker's [store] table (BrokerConfig.store) is what its assigned partitions'
    stores open with, whatever their layer; the controller's own group keeps its own."""
    store = StoreConfig(flush_mode="sync", segment_size_bytes=8 << 20)
    configs = {name: dataclasses.replace(config, store=store)
               for name, config in inprocess.configs(tmp_path).items()}
    with Cluster(configs) as cluster:
        wait_live_brokers(cluster.controllers)
        for topic, layer in (("r", "raft"), ("i", "isr"), ("m", "master_slave")):
            change_metadata(cluster.controllers, {"kind": "create_topic", "name": topic,
                                                  "partitions": 1, "replication_factor": 3,
                                                  "layer": layer})
        groups = [cluster.threads[name].broker.groups for name in BROKERS]
        wait_until(lambda: all({"r-0", "i-0", "m-0"} <= set(hosted) for hosted in groups),
                   "every broker hosting the three partitions", 60)
        for hosted in groups:
            for name in ("r-0", "i-0", "m-0"):
                opened = hosted[name].store.config
                assert (opened.flush_mode, opened.segment_size_bytes) == ("sync", 8 << 20)
        controller = cluster.threads["c1"].broker.groups["__controller"].store.config
        assert controller.segment_size_bytes != 8 << 20


def _written(client: Any, body: bytes) -> bool:
    """Whether ``body`` was produced (acks=all) at offset 0: while the brokers drop and
    host the topic's partition anew, a write may fail (retried by the caller)."""
    try:
        return client.produce("t", body, partition=0, acks="all").offset == 0
    except errors.MqlogError:
        return False


@pytest.mark.parametrize("layer", ["raft", "isr"])
def test_a_topic_created_again_under_a_deleted_ones_name_starts_empty(
        tmp_path: Path, layer: str) -> None:
    """Its brokers delete the deleted topic's partition stores: before, they reopened
    them, so the deleted records came back (Raft) or the partition refused every write
    (ISR: its store's leader epochs were ahead of the new topic's)."""
    from mqlog.cluster_client import ClusterClient

    with Cluster(inprocess.configs(tmp_path)) as cluster:
        controllers, brokers = cluster.controllers, cluster.addresses()
        wait_live_brokers(controllers)
        create = {"kind": "create_topic", "name": "t", "partitions": 1,
                  "replication_factor": 3, "layer": layer}
        groups = [cluster.threads[name].broker.groups for name in BROKERS]
        for body in (b"old", b"new"):
            change_metadata(controllers, create)
            with ClusterClient(brokers, retry_timeout_s=60) as client:
                assert client.produce("t", body, partition=0, acks="all").offset == 0
                assert [record.body for record in client.fetch("t", 0)] == [body]
            change_metadata(controllers, {"kind": "delete_topic", "name": "t"})
            wait_until(lambda: all("t-0" not in hosted for hosted in groups) and not any(
                (tmp_path / name / "t-0").exists() for name in BROKERS),
                "every broker dropping t-0 and deleting its store", 60)
        change_metadata(controllers, create)  # deleted and created again at once: the
        with ClusterClient(brokers, retry_timeout_s=60) as client:  # brokers may fold both
            client.produce("t", b"kept?", partition=0, acks="all")  # in one pull
            change_metadata(controllers, {"kind": "delete_topic", "name": "t"})
            change_metadata(controllers, create)
            wait_until(lambda: _written(client, b"newest"), "t-0 taking a write", 60)
            assert [record.body for record in client.fetch("t", 0)] == [b"newest"]
