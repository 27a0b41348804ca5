"""ISR partitions hosted by brokers, in-process on 127.0.0.1 (three controllers and three
brokers, each on its own loop and thread; tests/inprocess.py).

A topic of 2 partitions x RF 3 with min_insync_replicas = 2: the controller names each
partition's leader and ISR, the brokers' agents hand that to the ISR cores, followers
fetch, acks=all writes are answered PUT_OK once every ISR member has them. A follower's
broker stopped: it is fenced and leaves the ISR (2 left: writes go on). A second one
stopped: NotEnoughReplicas, nothing stored, while acks=1 is still taken. Both back:
they catch up, the leader asks the controller to expand the ISR, acks=all works again,
and the replicas' logs are byte-identical."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mqlog import errors
from mqlog.client import Client
from mqlog.config import BrokerConfig
from mqlog.replication.local import wait_until
from mqlog.results import PutStatus
from tests import inprocess
from tests.inprocess import BROKERS, CONTROLLERS, Cluster
from tests.processes import change_metadata, folded_partition, wait_live_brokers
from tests.test_raft import _image


def _configs(root: Path) -> dict[str, BrokerConfig]:
    """Three controllers (c1..c3) and three brokers: stopping two brokers leaves the
    controller quorum whole."""
    return inprocess.configs(root, min_insync_replicas=2, replica_lag_time_ms=1_000)


def _partition(addresses: list[str], index: int) -> Any:
    return folded_partition(addresses, "orders", index)


def _produce(address: str, index: int, body: bytes, acks: str = "replicated") -> Any:
    with Client(address, timeout_s=10) as client:
        return client.produce("orders", body, index, acks=acks)


def test_isr_partitions_over_three_brokers(tmp_path: Path) -> None:
    with Cluster(_configs(tmp_path)) as cluster:
        configs, threads = cluster.configs, cluster.threads
        addresses = cluster.addresses(CONTROLLERS)
        wait_live_brokers(addresses)
        change_metadata(addresses, {"kind": "create_topic", "name": "orders", "partitions": 2,
                                    "replication_factor": 3, "layer": "isr"})
        part = _partition(addresses, 0)
        leader, followers = part.leader, [name for name in part.replicas
                                          if name != part.leader]
        where = configs[leader].listen

        def taken(body: bytes, acks: str = "replicated") -> bool:
            try:
                return _produce(where, 0, body, acks).status is PutStatus.PUT_OK
            except (errors.NotLeader, errors.UnknownGroup, errors.NodeUnavailable):
                return False  # (hosted and handed its state within a round or two)
        wait_until(lambda: taken(b"first"), "the leader taking an acks=all write", 60)
        for number in range(20):
            assert _produce(where, 0, b"r%d" % number).status is PutStatus.PUT_OK

        cluster.stop(followers[0])  # fenced, out of the ISR: two left, writes go on
        wait_until(lambda: followers[0] not in _partition(addresses, 0).isr,
                   f"{followers[0]} out of the ISR", 60)
        assert _produce(where, 0, b"two").status is PutStatus.PUT_OK

        cluster.stop(followers[1])  # one left: acks=all refused, acks=1 taken
        wait_until(lambda: followers[1] not in _partition(addresses, 0).isr,
                   f"{followers[1]} out of the ISR", 60)
        node = threads[leader].broker.groups["orders-0"]
        wait_until(lambda: node.core.isr == (leader,), "the leader told of its ISR", 30)
        end = node.store.written_position
        with pytest.raises(errors.NotEnoughReplicas, match="nothing was stored"):
            _produce(where, 0, b"refused")
        assert node.store.written_position == end
        assert _produce(where, 0, b"acks=1", acks="master").status is PutStatus.PUT_OK
        wait_until(lambda: _partition(addresses, 0).elr == (followers[1],),  # KIP-966
                   f"{followers[1]} an eligible leader replica", 30)

        cluster.start(*followers)  # back: they catch up and rejoin
        wait_until(lambda: len(_partition(addresses, 0).isr) == 3, "the ISR whole again", 60)
        assert _produce(where, 0, b"again").status is PutStatus.PUT_OK
        stores = [threads[name].broker.groups["orders-0"].store for name in BROKERS]
        wait_until(lambda: len({store.written_position for store in stores}) == 1,
                   "every replica at the same end", 30)
        images = {name: _image(store) for name, store in zip(BROKERS, stores, strict=True)}
        assert len(set(images.values())) == 1, {name: len(data)
                                                for name, data in images.items()}


def test_large_replication_answers_leave_by_sendfile_in_every_layer(tmp_path: Path) -> None:
    """A leader's large answers (ISR fetch answers, Raft Entries, master-slave Appends of
    64 KiB or more) go from its segment files to the socket by sendfile, counted in
    ``broker_metadata`` (bytes_sent_from_file), and acks=all writes of 800 KiB commit."""
    from mqlog.cluster_client import ClusterClient
    from mqlog.replication.local_controller import BROKERS, CONTROLLERS, ask, started

    body = bytes(range(256)) * 400  # (100 KiB: a batch of 8 is one large answer)
    with started(tmp_path, 3_000) as (addresses, _):
        controllers = [addresses[name] for name in CONTROLLERS]
        brokers = [addresses[name] for name in BROKERS]

        def from_file() -> int:
            total = 0
            for address in brokers:
                answer = ask([address], {"kind": "broker_metadata"}) or {}
                total += sum(counters["bytes_sent_from_file"]
                             for counters in answer.get("counters", {}).values())
            return total

        for layer in ("isr", "raft", "master_slave"):
            ask(controllers, {"kind": "create_topic", "name": layer, "partitions": 1,
                              "replication_factor": 3, "layer": layer})
            before = from_file()
            with ClusterClient(brokers, acks="all", retry_timeout_s=60) as client:
                for _ in range(4):
                    sent = client.produce_batch(layer, [body] * 8, partition=0)
                    assert sent.status is PutStatus.PUT_OK, (layer, sent)
            wait_until(lambda before=before: from_file() > before,
                       f"{layer}: answers sent from files", 30)
