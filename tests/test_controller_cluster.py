"""Clusters on 127.0.0.1, in-process (each broker on its own loop and thread): three
controllers and three brokers, and the combined mode (Kafka's: three processes each a
broker and a controller). Brokers register and heartbeat; a topic of 6 partitions x RF 3
becomes 6 Raft groups across them; records produced by key land on the partition Kafka's
partitioner names and read back; a broker stopped is fenced by the controller and its
partitions keep taking writes; the controller leader stopped, another takes over with
the metadata intact; everything restarted, the same metadata."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from mqlog import errors
from mqlog.client import Client
from mqlog.config import BrokerConfig
from mqlog.partitioner import partition_for_key
from mqlog.replication.broker import Broker
from mqlog.replication.controller import records
from mqlog.replication.controller.state import ClusterMetadata
from mqlog.replication.local import free_ports, wait_until

BROKERS = ("b1", "b2", "b3")


class BrokerThread:
    """A Broker serving on its own loop in a thread."""

    def __init__(self, config: BrokerConfig) -> None:
        self.broker = Broker(config)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name=config.broker_id, daemon=True)
        self.ready = threading.Event()

    def _run(self) -> None:
        async def main() -> None:
            ready = asyncio.Event()
            serving = asyncio.create_task(self.broker.serve(ready))
            await ready.wait()
            self.ready.set()
            await serving

        self.loop.run_until_complete(main())

    def start(self) -> BrokerThread:
        self.thread.start()
        assert self.ready.wait(timeout=30)
        return self

    def stop(self) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.broker.stop)
            self.thread.join(timeout=30)
            assert not self.thread.is_alive()
            # (the agent's calls to controllers run on the default executor's threads)
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()


def _configs(root: Path, combined: bool) -> dict[str, BrokerConfig]:
    """b1..b3 (brokers, and controllers if ``combined``), else c1..c3 too (controllers)."""
    names = BROKERS if combined else ("c1", "c2", "c3", *BROKERS)
    ports = free_ports(len(names))
    addresses = {name: f"127.0.0.1:{port}" for name, port in zip(names, ports, strict=True)}
    voters = {name: addresses[name] for name in names[:3]}
    controller = {"voters": voters, "broker_session_timeout_ms": 1_500,
                  "broker_heartbeat_interval_ms": 200}
    roles = {name: ("broker", "controller") if combined else
             ("controller",) if name.startswith("c") else ("broker",) for name in names}
    return {name: BrokerConfig(broker_id=name, listen=addresses[name], data_dir=root / name,
                               peers=addresses, process_roles=roles[name],
                               controller=controller).validate() for name in names}


def _ask(addresses: list[str], header: dict[str, Any]) -> dict[str, Any]:
    """To any controller; a change follows NotLeader to the leader (an election may be
    under way: it waits for one, up to a deadline)."""
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
    wait_until(attempt, f"a controller answering {header['kind']}", 60)
    return answers[0]


def _state(addresses: list[str]) -> ClusterMetadata:
    answer = _ask(addresses, {"kind": "describe_cluster"})
    return ClusterMetadata().apply(records.decode(answer["snapshot"]), answer["position"])


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


class Cluster:
    def __init__(self, configs: dict[str, BrokerConfig]) -> None:
        self.configs = configs
        self.threads: dict[str, BrokerThread] = {}

    def start(self, *names: str) -> None:
        for name in names or self.configs:
            self.threads[name] = BrokerThread(self.configs[name]).start()

    def stop(self, *names: str) -> None:
        for name in names or list(self.threads):
            self.threads.pop(name).stop()

    def leader(self) -> str:
        """The controller that leads now."""
        return next(name for name, thread in self.threads.items()
                    if "__controller" in thread.broker.groups
                    and thread.broker.groups["__controller"].driver.serving)


@pytest.fixture(params=["combined", "separate"])
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    running = Cluster(_configs(tmp_path, request.param == "combined"))
    try:
        running.start()
        yield running
    finally:
        running.stop()


def test_raft_topics_over_three_brokers(cluster: Cluster) -> None:
    configs, threads = cluster.configs, cluster.threads
    addresses = [config.listen for config in configs.values()]
    controllers = [config.listen for config in configs.values()
                   if "controller" in config.process_roles]
    wait_until(lambda: len(_state(controllers).live_brokers()) == 3, "three live brokers", 60)
    answer = _ask(controllers, {"kind": "create_topic", "name": "orders", "partitions": 6,
                              "replication_factor": 3, "layer": "raft"})
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
    wait_until(lambda: _state(alive).brokers["b3"].fenced, "b3 fenced", 60)
    for key in keys[:6]:
        _produce([configs[name].listen for name in ("b1", "b2")], partition_for_key(key, 6),
                 key, b"again")
    before = _state(alive)
    assert sorted(before.topics) == ["orders"]

    cluster.start("b3")  # back: it registers again (a new broker epoch) and is unfenced
    wait_until(lambda: not _state(alive).brokers["b3"].fenced, "b3 back", 60)
    alive = controllers
    leader = cluster.leader()
    cluster.stop(leader)  # the controller leader: another takes over
    alive = [address for address in alive if address != configs[leader].listen]
    _ask(alive, {"kind": "create_topic", "name": "later", "partitions": 1,
                 "replication_factor": 1, "layer": "raft"})
    assert _state(alive).topics["orders"] == before.topics["orders"]

    cluster.stop()  # everything, then everything again: the same metadata
    cluster.start()
    seen: list[ClusterMetadata] = []  # one answer, checked and kept: controllers fold at
    # their own pace, so two asks may reach two controllers at different positions

    def folded_again() -> bool:
        seen[:] = [_state(controllers)]
        return "later" in seen[0].topics
    wait_until(folded_again, "the metadata, folded again", 60)
    again = seen[0]
    assert again.topics == {**before.topics, "later": again.topics["later"]}
    assert set(again.brokers) == set(BROKERS)
