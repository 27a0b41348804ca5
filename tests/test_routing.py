"""Several master-slave groups behind a route registry: routes, producer failover for
unordered sends, ordered sends that stay put, and reads from slaves."""

from __future__ import annotations

import pytest

from mqlog import errors
from mqlog.replication.local import LocalCluster, LocalRegistry, wait_until
from mqlog.replication.registry import Routes
from mqlog.results import PutStatus
from mqlog.routing import Producer


def _register(routes: Routes, now: int, node: str, group: str, role: str, epoch: int = 0,
              topics: dict | None = None) -> None:
    routes.register({"group": group, "node_id": node, "role": role, "epoch": epoch,
                     "address": f"{node}:1", "topics": topics or {"orders": 4}}, now)


def test_routes_list_groups_masters_and_slaves_and_forget_silent_nodes():
    routes = Routes(node_timeout_ms=100)
    _register(routes, 0, "a-m", "a", "SYNC_MASTER")
    _register(routes, 0, "a-s1", "a", "SLAVE")
    _register(routes, 50, "b-m", "b", "ASYNC_MASTER", topics={"orders": 2, "audit": 1})
    assert routes.route("orders", 60) == [
        {"group": "a", "queues": 4, "master": "a-m:1", "epoch": 0, "slaves": ["a-s1:1"]},
        {"group": "b", "queues": 2, "master": "b-m:1", "epoch": 0, "slaves": []}]
    assert [group["group"] for group in routes.route("audit", 60)] == ["b"]
    assert routes.route("orders", 120) == [  # a's nodes went silent
        {"group": "b", "queues": 2, "master": "b-m:1", "epoch": 0, "slaves": []}]
    _register(routes, 130, "a-s1", "a", "SYNC_MASTER", epoch=1)  # promoted
    _register(routes, 130, "a-m", "a", "SYNC_MASTER", epoch=0)  # the old one, stale
    assert routes.route("orders", 140)[0]["master"] == "a-s1:1"
    with pytest.raises(errors.RemoteProtocolError):
        routes.register({"group": "x"}, 0)


def test_a_producer_goes_around_a_group_whose_master_is_down(tmp_path):
    with LocalRegistry(node_timeout_ms=1_000) as registry:
        settings = (f'registries = ["{registry.address}"]\nregister_interval_ms = 100\n'
                    'slave_read_enable = true\n[node.topics]\norders = 2')
        groups = [LocalCluster(tmp_path / name, "SYNC_MASTER", slave_count=1,
                               prefix=f"{name}-", node_settings=f'group = "{name}"\n{settings}',
                               store_settings="segment_size_bytes = 16777216")
                  for name in ("g1", "g2")]
        with groups[0], groups[1], Producer(registry.address, route_refresh_ms=100,
                                            failover_backoff_ms=60_000) as producer:
            wait_until(lambda: len(producer.route("orders")) == 2, "both groups' routes")
            for group in groups:  # a SYNC_MASTER acks once its slave has said Hello
                wait_until(lambda group=group: group.metadata(group.master)["slaves"],
                           f"{group.master}'s slave")
            before = [producer.send("orders", f"before-{i}".encode()) for i in range(40)]
            assert {sent.group for sent in before} == {"g1", "g2"}
            assert all(sent.result.status is PutStatus.PUT_OK for sent in before)
            groups[0].kill("g1-m")
            after = [producer.send("orders", f"after-{i}".encode()) for i in range(40)]
            assert {sent.group for sent in after} == {"g2"}  # every one went around g1
            assert all(sent.result.status is PutStatus.PUT_OK for sent in after)
            with pytest.raises(errors.NodeUnavailable):  # ordered: it may not move
                producer.send("orders", b"ordered", queue=("g1", 0))
            for queue_id in (0, 1):  # g1's records stay readable, from its slave
                stored = [sent for sent in before if sent.group == "g1"
                          and sent.queue_id == queue_id]
                fetched = producer.fetch("orders", "g1", queue_id, 0, 100)
                assert [record.offset for record in fetched] == \
                    [sent.result.offset for sent in stored]
