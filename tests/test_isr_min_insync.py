"""An ISR topic with fewer replicas than min_insync_replicas, in-process on 127.0.0.1 (one
controller, two brokers: tests/inprocess.py). Kafka allows
min.insync.replicas above a topic's replication factor, and so does mqlog: a topic of
RF 1 under the cluster's min_insync_replicas = 2 is created and hosted (before, the
broker refused the group's config and the partition was assigned but never hosted),
acks=all is refused NotEnoughReplicas (nothing stored, the message says why and what to
do), acks=1 is taken. Readers do not see the acks=1 records: the high watermark stays
below min.insync (KIP-966's strict min ISR) — a topic created with
``min_insync_replicas = 1`` beside it takes and shows both."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from mqlog import errors
from mqlog.client import Client
from mqlog.replication import hardstate
from mqlog.replication.local import wait_until
from mqlog.replication.node import Node
from mqlog.results import PutStatus
from tests import inprocess
from tests.inprocess import Cluster
from tests.processes import change_metadata, cluster_state, wait_live_brokers

BROKERS = ("b1", "b2")


def _leader(cluster: Any, addresses: list[str], topic: str) -> str:
    found: list[str] = []

    def led() -> bool:
        info = cluster_state(addresses).topics.get(topic)
        found[:] = [info.partitions[0].leader] if info is not None else []
        return bool(found and found[0])
    wait_until(led, f"topic {topic} led", 30)
    leader = found[0]
    wait_until(lambda: f"{topic}-0" in cluster.threads[leader].broker.groups,
               f"{topic}-0 hosted by {leader}", 60)
    return leader


def _produce(address: str, topic: str, body: bytes, acks: str) -> Any:
    with Client(address, timeout_s=10) as client:
        return client.produce(topic, body, 0, acks=acks)


def _taken(address: str, topic: str, body: bytes, acks: str) -> bool:
    try:
        return _produce(address, topic, body, acks).status is PutStatus.PUT_OK
    except (errors.NotLeader, errors.UnknownGroup, errors.NodeUnavailable):
        return False  # (hosted and handed its state within a round or two)


def test_a_topic_of_fewer_replicas_than_min_insync_is_hosted(tmp_path: Path) -> None:
    with Cluster(inprocess.configs(tmp_path, brokers=BROKERS, controllers=("c1",),
                                   min_insync_replicas=2,
                                   replica_lag_time_ms=1_000)) as cluster:
        addresses = [cluster.configs["c1"].listen]
        wait_live_brokers(addresses, len(BROKERS))
        for name, config in (("one", None), ("own", {"min_insync_replicas": 1})):
            change_metadata(addresses, {"kind": "create_topic", "name": name, "partitions": 1,
                                        "replication_factor": 1, "layer": "isr",
                                        **({"config": config} if config else {})})
        leader = _leader(cluster, addresses, "one")
        where = cluster.configs[leader].listen
        node = cluster.threads[leader].broker.groups["one-0"]
        assert node.spec.replication.min_insync_replicas == 2  # (the cluster's, kept)
        wait_until(lambda: _taken(where, "one", b"acks=1", "master"), "acks=1 taken", 60)
        end = node.store.written_position
        with pytest.raises(errors.NotEnoughReplicas, match="fewer than min_insync_replicas"
                           "=2: acks=all can never succeed") as refused:
            _produce(where, "one", b"refused", "replicated")
        assert "--min-insync-replicas 1" in str(refused.value)
        assert node.store.written_position == end  # (nothing stored)
        assert node.store.committed_position == 0  # (KIP-966: no high watermark below 2)

        own = _leader(cluster, addresses, "own")  # the topic's own min.insync of 1
        other = cluster.threads[own].broker.groups["own-0"]
        address = cluster.configs[own].listen
        wait_until(lambda: _taken(address, "own", b"all", "replicated"), "acks=all taken",
                   60)
        assert _produce(address, "own", b"one", "master").status is PutStatus.PUT_OK
        wait_until(lambda: other.store.committed_position == other.store.written_position,
                   "own-0's records committed", 30)


def test_a_restarted_last_isr_member_still_shows_what_was_committed(tmp_path: Path) -> None:
    """KIP-966 holds the high watermark still while the ISR is below min.insync; a restart
    of the last ISR member must not send it back to 0. The replica saves its high
    watermark (Kafka's replication-offset-checkpoint), so readers still see every
    committed record. Before, they saw none until a follower rejoined (a hostile review)."""
    with Cluster(inprocess.configs(tmp_path, brokers=BROKERS, controllers=("c1",),
                                   min_insync_replicas=2,
                                   replica_lag_time_ms=1_000)) as cluster:
        addresses = [cluster.configs["c1"].listen]
        wait_live_brokers(addresses, len(BROKERS))
        change_metadata(addresses, {"kind": "create_topic", "name": "kept", "partitions": 1,
                                    "replication_factor": 2, "layer": "isr"})
        leader = _leader(cluster, addresses, "kept")
        follower = next(name for name in BROKERS if name != leader)
        where = cluster.configs[leader].listen
        wait_until(lambda: _taken(where, "kept", b"r0", "replicated"), "acks=all taken", 60)
        for body in (b"r1", b"r2", b"r3"):
            assert _produce(where, "kept", body, "replicated").status is PutStatus.PUT_OK
        committed = cluster.threads[leader].broker.groups["kept-0"].store.committed_position
        assert committed > 0
        cluster.stop(follower)
        wait_until(lambda: cluster_state(addresses).topics["kept"].partitions[0].isr ==
                   (leader,), "the ISR down to its leader", 60)
        # (the follower left as an eligible leader replica, KIP-966: fenced first, or the
        # leader's stop would elect it, stopped as it is)
        wait_until(lambda: cluster_state(addresses).brokers[follower].fenced,
                   f"{follower} fenced", 60)
        cluster.stop(leader)
        cluster.start(leader)
        assert _leader(cluster, addresses, "kept") == leader  # (the last ISR member)
        node = cluster.threads[leader].broker.groups["kept-0"]
        wait_until(lambda: node.core.is_master, f"{leader} leading kept-0 again", 60)
        # (the driver run after the core took leadership commits the saved high
        # watermark: the loop's next callback, which this thread may look before)
        wait_until(lambda: node.store.committed_position >= committed,
                   f"the saved high watermark {committed} committed again", 30)
        assert node.store.committed_position == committed
        with Client(where, timeout_s=10) as client:
            bodies = [record.body for record in client.fetch("kept", 0, 0, 10)]
        assert bodies == [b"r0", b"r1", b"r2", b"r3"], bodies


def test_a_lowered_high_watermark_is_saved_at_once_and_synced(tmp_path: Path,
                                                              monkeypatch: Any) -> None:
    """A run that lowers an ISR replica's high watermark (a truncation below it, after an
    unclean election) saves it at once, synced: the older file would show the records
    written after the cut as committed after a crash. A run that raises it does not (the
    interval's save, not synced, does). The node's own _run_driver, over stand-ins."""
    saved: list[tuple[int, bool]] = []
    monkeypatch.setattr(hardstate, "save_high_watermark",
                        lambda directory, value, sync=False: saved.append((value, sync)))
    node = object.__new__(Node)  # (only what _run_driver touches)
    core = SimpleNamespace(high_watermark_to_save=300)
    node.driver = SimpleNamespace(run=lambda: None, core=core)
    node.store = SimpleNamespace(committed_position=300)
    node.closed, node.isr, node.store_dir, node._scheduled = False, True, tmp_path, True
    node._saved_high_watermark, node._committed = 500, 300
    node._commit_callbacks, node._run_callbacks = [], []
    node._refusals_in_a_row = 0
    node._run_driver()
    assert saved == [(300, True)] and node._saved_high_watermark == 300
    core.high_watermark_to_save = 400
    node._run_driver()
    assert saved == [(300, True)]  # (a rise waits for the interval)
