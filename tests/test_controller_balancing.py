"""Automatic leader balancing in-process on 127.0.0.1 (three controllers, three brokers,
each on its own loop and thread: tests/inprocess.py).

An ISR topic and a Raft topic, 3 partitions x RF 3 each, start led by their preferred
(first) replicas. Two brokers stopped: every ISR partition is led by the one left (the
leaders gathered; the Raft groups have no majority). Both restarted: nothing but the
controller's leader imbalance check (every ``leader_imbalance_check_interval_ms``, on by
default) moves the leaders back — ISR partitions by a PartitionChange once their preferred
replica is back in the ISR, Raft partitions by transfers asked of their leaders in
heartbeat answers — so each partition is led by its preferred replica again, in the
metadata and in the replicas' cores; and a record written to each ISR partition before
the stops is still there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mqlog import errors
from mqlog.client import Client
from mqlog.replication.local import wait_until
from mqlog.results import PutStatus
from tests import inprocess
from tests.inprocess import BROKERS, CONTROLLERS, Cluster
from tests.processes import change_metadata, cluster_state, wait_live_brokers

PARTITIONS = 3


def _leaders(cluster: Cluster, topic: str) -> dict[int, str]:
    """partition -> the broker whose core leads it now (one that leads, if two think so
    for a moment)."""
    found = {}
    for name in BROKERS:
        thread = cluster.threads.get(name)
        for index in range(PARTITIONS):
            node = thread.broker.groups.get(f"{topic}-{index}") if thread else None
            if node is not None and node.core.status().get("role") == "LEADER":
                found[index] = name
    return found


def _produce(address: str, index: int, body: bytes) -> bool:
    try:
        with Client(address, timeout_s=10) as client:
            return client.produce("i", body, index).status is PutStatus.PUT_OK
    except (errors.NotLeader, errors.UnknownGroup, errors.NodeUnavailable,
            errors.NotEnoughReplicas):
        return False


def test_leaders_gathered_by_failures_are_spread_again(tmp_path: Path) -> None:
    with Cluster(inprocess.configs(tmp_path, replica_lag_time_ms=1_000,
                                   leader_imbalance_check_interval_ms=1_000)) as cluster:
        configs = cluster.configs
        addresses = cluster.addresses(CONTROLLERS)
        wait_live_brokers(addresses)
        for topic, layer in (("i", "isr"), ("r", "raft")):
            change_metadata(addresses, {"kind": "create_topic", "name": topic,
                                        "partitions": PARTITIONS, "replication_factor": 3,
                                        "layer": layer})
        found: list[Any] = []

        def folded() -> bool:  # (controllers fold at their own pace)
            found[:] = [cluster_state(addresses)]
            return {"i", "r"} <= set(found[0].topics)
        wait_until(folded, "both topics folded", 30)
        state = found[0]
        preferred = {topic: {index: part.replicas[0] for index, part in
                             enumerate(state.topics[topic].partitions)} for topic in "ir"}
        assert sorted(preferred["i"].values()) == list(BROKERS)  # (spread by assignment)
        wait_until(lambda: _leaders(cluster, "i") == preferred["i"],
                   "topic i led by its preferred replicas (as created)", 60)
        wait_until(lambda: len(_leaders(cluster, "r")) == PARTITIONS,
                   "topic r's groups electing leaders (any: Raft elects on its own)", 60)
        for index, leader in preferred["i"].items():
            wait_until(lambda i=index, a=configs[leader].listen: _produce(a, i, b"kept"),
                       f"i/{index} taking a write", 60)

        stay = preferred["i"][0]
        cluster.stop(*(name for name in BROKERS if name != stay))
        wait_until(lambda: all(part.leader == stay for part in
                               cluster_state(addresses).topics["i"].partitions),
                   f"every ISR partition led by {stay} (gathered)", 60)

        cluster.start(*(name for name in BROKERS if name != stay))
        for topic in "ir":
            wait_until(lambda topic=topic: _leaders(cluster, topic) == preferred[topic],
                       f"topic {topic} led by its preferred replicas again", 90)
        wait_until(lambda: {index: part.leader for index, part in enumerate(
            cluster_state(addresses).topics["i"].partitions)} == preferred["i"],
                   "the metadata naming the preferred leaders", 30)
        for index, leader in preferred["i"].items():  # (a leader just back serves up to
            # its high watermark, which moves once its followers fetched: wait for that)
            wait_until(lambda i=index, a=configs[leader].listen: b"kept" in _bodies(a, i),
                       f"i/{index}'s record read back from {leader}", 60)


def _bodies(address: str, index: int) -> list[bytes]:
    """Partition i/``index``'s bodies as the broker at ``address`` serves them ([]: it
    refuses now, a leadership moving)."""
    try:
        with Client(address, timeout_s=10) as client:
            return [record.body for record in client.fetch("i", index, 0, 10)]
    except (errors.NotMaster, errors.UnknownGroup, errors.NodeUnavailable):
        return []
