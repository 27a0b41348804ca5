"""``ClusterClient`` with several produce requests in flight per partition (Kafka's
max.in.flight.requests.per.connection with idempotence), in-process on 127.0.0.1: the
ISR cluster of test_isr_client.py (three controllers, three brokers, min.insync 2).

* The leader's in-order check (node.py's ``previous``): a request naming a predecessor
  the leader has not stored is refused with SequenceGap and nothing is stored — whether
  the producer is new there or the predecessor was skipped; once the predecessor is
  stored, the same request is taken. A malformed ``previous`` is an InvalidArgument.
* Order and exactly-once through a failure with requests in flight: a producer keeps up
  to five requests in flight, its connection to the leader breaks with requests in
  flight there, and the leader is stopped; every request is answered PUT_OK (acks=all)
  and the partition holds every body once, in the order sent.
* Many requests, few in flight: ``send`` blocks at ``max_in_flight_requests``; the
  answers come back with increasing positions; a bad window size is refused.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest

from mqlog import errors
from mqlog.client import Client
from mqlog.cluster_client import IN_FLIGHT_REQUESTS_MAX, ClusterClient
from mqlog.replication.local import wait_until
from mqlog.results import PutStatus
from tests.test_isr_client import _bodies, _brokers, _first_write, _leader, _node, isr_cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    with isr_cluster(tmp_path, partitions=1) as running:
        yield running


def _produce(raw: Client, body: bytes, producer: str, sequence: int,
             previous: int | None = None) -> Any:
    header = {"kind": "produce", "topic": "orders", "queue_id": 0, "sizes": [len(body)],
              "producer_id": producer, "sequence": sequence}
    if previous is not None:
        header["previous"] = previous
    return raw.call(header, body)[0]


def test_a_request_after_one_not_stored_is_refused(cluster: Any) -> None:
    with ClusterClient(_brokers(cluster), retry_timeout_s=60) as client:
        _first_write(client)
        leader, _ = _leader(cluster, client)
        store = _node(cluster, leader).store
        with Client(cluster.configs[leader].listen, group="orders-0") as raw:
            end = store.written_position
            with pytest.raises(errors.SequenceGap, match="nothing was stored"):
                _produce(raw, b"two", "p", 2, previous=1)  # (a producer new there)
            assert store.written_position == end
            assert _produce(raw, b"one", "p", 1)["status"] == PutStatus.PUT_OK.value
            with pytest.raises(errors.SequenceGap, match="after 2"):
                _produce(raw, b"three", "p", 3, previous=2)  # (2 was never stored)
            assert _produce(raw, b"two", "p", 2, previous=1)["status"] == \
                PutStatus.PUT_OK.value
            assert _produce(raw, b"three", "p", 3, previous=2)["status"] == \
                PutStatus.PUT_OK.value
            again = _produce(raw, b"three", "p", 3, previous=2)  # a retry: its first place
            assert again["status"] == PutStatus.PUT_OK.value
            for previous in (4, 5, -1, "2", True):
                with pytest.raises(errors.InvalidArgument, match="previous must be"):
                    _produce(raw, b"bad", "p", 4, previous=previous)
            # An acks=0 send takes a sequence too: its 5 must not let 6 pass 4, never
            # stored (the newest stored was all the check once looked at).
            raw.send_only({"kind": "produce", "topic": "orders", "queue_id": 0,
                           "sizes": [4], "producer_id": "p", "sequence": 5, "acks": "0"},
                          b"five")
            producers = _node(cluster, leader).driver.producers
            wait_until(lambda: producers.newest("p", 0) == 5, "the acks=0 send stored", 60)
            with pytest.raises(errors.SequenceGap, match="after 4"):
                _produce(raw, b"six", "p", 6, previous=4)
        # Consumers read up to the high watermark: the acks=0 five once followers have it.
        wait_until(lambda: len(_bodies(client)) >= 5, "the five committed", 60)
        assert _bodies(client) == [b"first", b"one", b"two", b"three", b"five"]


def test_order_and_once_through_a_broken_connection_and_a_stopped_leader(
        cluster: Any, rng: random.Random) -> None:
    count, breaks_at = 60, rng.randrange(10, 30)
    print(f"the leader's connection breaks after request {breaks_at} of {count}")
    with ClusterClient(_brokers(cluster), retry_timeout_s=90,
                       max_in_flight_requests=5) as client:
        _first_write(client)
        leader, _ = _leader(cluster, client)
        sent, pending = [], []
        for index in range(count):
            body = f"record-{index}".encode()
            sent.append(body)
            pending.append(client.send("orders", body, partition=0))
            assert sum(not one.done() for one in pending) <= 5
            if index == breaks_at:  # requests in flight there: their outcome is unknown
                in_flight = sum(not one.done() for one in pending)
                client._drop(cluster.configs[leader].listen)  # as a broken connection
                cluster.stop(leader)
                print(f"{in_flight} request(s) in flight when {leader} stopped")
        results = [one.result() for one in pending]
        assert all(result.status is PutStatus.PUT_OK for result in results), results
        positions = [result.position for result in results]
        assert positions == sorted(positions) and len(set(positions)) == count
        assert client.retries > 0
        wait_until(lambda: len(_bodies(client)) >= count + 1, "everything committed", 60)
        assert _bodies(client) == [b"first", *sent]  # once each, in the order sent


def test_the_window_of_requests_in_flight(cluster: Any) -> None:
    for wrong in (0, -1, IN_FLIGHT_REQUESTS_MAX + 1, 2.0, True, "5"):
        with pytest.raises(errors.InvalidArgument, match="max_in_flight_requests"):
            ClusterClient(_brokers(cluster), max_in_flight_requests=wrong)
    with ClusterClient(_brokers(cluster), retry_timeout_s=60, acks=1,
                       max_in_flight_requests=3) as client:
        _first_write(client)
        pending = [client.send_batch("orders", [b"%d" % index] * 3, partition=0)
                   for index in range(30)]
        client.flush()
        assert all(one.done() for one in pending)
        positions = [one.result().position for one in pending]
        assert positions == sorted(positions)
        assert client.send("orders", b"zero", partition=0, acks=0).result().position == -1
        client.produce("orders", b"last", partition=0, acks="all")  # (commits all before)
        expected = [b"first", *[b"%d" % index for index in range(30) for _ in range(3)],
                    b"zero", b"last"]
        assert _bodies(client) == expected


def test_a_connection_dropped_while_answers_are_read_is_passed_over() -> None:
    """Deciding one connection's answer may refresh the metadata, which drops another
    connection whose call fails; reading answers then looked the dropped one up and a
    KeyError escaped send()/result()/flush() (a request already queued, so a caller's
    retry stored it twice). Its requests are decided as broken instead."""
    from mqlog.cluster_client import _Produce
    from mqlog.replication.controller.state import ClusterMetadata
    from mqlog.replication.wire import Frame

    class Answering:
        def __init__(self, frames: list[Frame]) -> None:
            self.frames = frames

        def take_answers(self, wait: bool) -> list[Frame]:
            frames, self.frames = self.frames, []
            return frames

        def close(self) -> None:
            pass

    client = ClusterClient("127.0.0.1:1", retry_timeout_s=30)
    refused = Frame({"kind": "error", "error": "UnknownGroup", "message": "not here",
                     "id": 1}, b"")
    client._connections = {"x:1": Answering([refused]), "y:1": Answering([])}

    def metadata(refresh: bool = False) -> ClusterMetadata:  # (y's call fails, as real)
        if refresh and "y:1" in client._connections:
            client._drop("y:1")
        return ClusterMetadata()
    client.metadata = metadata  # type: ignore[method-assign]
    deadline = time.monotonic() + 30
    on_x = _Produce("t", 0, {}, b"", 1, deadline, address="x:1")
    on_y = _Produce("t", 1, {}, b"", 1, deadline, address="y:1")
    client._sent = {("x:1", 1): on_x, ("y:1", 1): on_y}
    client._take_answers(["x:1", "y:1"], wait=False)  # (a KeyError escaped here)
    assert not client._sent and not client._broken  # (y's request decided: broken)
