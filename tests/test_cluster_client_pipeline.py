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
* Without a cluster (``FakeBrokers``: the client's connections, in-process): a metadata
  refresh no broker answers is one more failed attempt, and the request is stored once
  the brokers answer again, or fails at retry_timeout_s as outcome unknown; a request
  over the brokers' frame limit, a bytes key not UTF-8, a topic not a non-empty str and
  any call on a closed client are typed errors at once, nothing sent.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import pytest

from mqlog import errors
from mqlog.client import Client
from mqlog.cluster_client import FRAME_SIZE_BYTES_MAX, IN_FLIGHT_REQUESTS_MAX, ClusterClient
from mqlog.replication.controller.state import ClusterMetadata
from mqlog.replication.local import wait_until
from mqlog.replication.wire import Frame, encode_frame
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
    client._pipelines = {("t", 0): deque([on_x]), ("t", 1): deque([on_y])}
    client._take_answers(["x:1", "y:1"], wait=False)  # (a KeyError escaped here)
    assert not client._sent and not client._broken  # (y's request decided: broken)


# --- without a cluster: a fake of the brokers, in-process -----------------------------------


class FakeBrokers:
    """Three brokers b1..b3 (addresses "bN:1") holding topic "t" (one partition, led by
    b1) as ``ClusterClient``'s connections see them, without sockets: ``cluster_metadata``,
    produce (PUT_OK) and fetch (no records) are answered at once. While ``failures`` is
    above 0, each connection made or request sent fails (NodeUnavailable) and counts it
    down (``None``: all fail, for ever); a frame above the brokers' 16 MiB limit drops the
    connection, as a broker does. ``produced`` is every produce request that arrived,
    ``opened`` the connections made."""

    def __init__(self) -> None:
        from mqlog.replication.controller import records
        state = ClusterMetadata()
        for name in ("b1", "b2", "b3"):
            state = state.apply(records.RegisterBroker(name, 1, f"{name}:1"))
            state = state.apply(records.UnfenceBroker(name, 1))
        state = state.apply(records.CreateTopic("t", "isr", (("b1", "b2", "b3"),)))
        self.metadata = {"snapshot": records.encode(state.snapshot()), "position": 1}
        self._state = state
        self.failures: int | None = 0
        self.produced: list[tuple[dict, bytes]] = []
        self.opened = 0
        self.cut: int | None = None  # a sequence whose copy here holds its first record only
        self.deleted = False  # topic "t" was deleted (delete_topic)
        self.controllers = False  # they are controllers: no cluster_metadata (UnknownGroup)
        self.roles = ["controller"]  # their broker_metadata's process_roles
        self.metadata_asked = 0  # cluster_metadata requests
        self.hold = False  # answers are kept back (slow to come) while this is set
        self.held = threading.Event()  # set once a client asked for an answer held back
        self.sequences: set[int] = set()  # those stored (a cut one is not)
        self.answer: dict | None = None  # every produce's answer, nothing stored (a refusal)
        self.answered = 0  # produce requests answered with ``answer``

    def delete_topic(self) -> None:
        """Topic "t" deleted: the metadata says so, and each produce is UnknownGroup."""
        from mqlog.replication.controller import records
        self._state = self._state.apply(records.DeleteTopic("t"))
        self.metadata = {"snapshot": records.encode(self._state.snapshot()), "position": 2}
        self.deleted = True

    def fence(self, *names: str) -> None:
        """Brokers ``names`` fenced (down): the metadata says so."""
        from mqlog.replication.controller import records
        for name in names:
            self._state = self._state.apply(records.FenceBroker(name, 1))
        self.metadata = {"snapshot": records.encode(self._state.snapshot()),
                         "position": self.metadata["position"] + 1}

    def fail(self, address: str) -> None:
        if self.failures is None or self.failures > 0:
            self.failures = None if self.failures is None else self.failures - 1
            raise errors.NodeUnavailable(f"cannot reach the node at {address} (fake)")

    def connect(self, address: str, timeout_s: float) -> FakeConnection:
        self.fail(address)
        self.opened += 1
        return FakeConnection(self, address)


class FakeConnection:
    def __init__(self, brokers: FakeBrokers, address: str) -> None:
        self.brokers, self.address, self.group = brokers, address, None
        self.answers: list[Frame] = []
        self.next_id = 0

    def call(self, header: dict, payload: bytes = b"",
             timeout_s: float | None = None) -> tuple[dict, bytes]:
        self.brokers.fail(self.address)
        if header["kind"] == "broker_metadata":  # (every node answers it)
            return {"kind": "broker_metadata", "process_roles": list(self.brokers.roles)}, b""
        assert header["kind"] == "cluster_metadata", header
        self.brokers.metadata_asked += 1
        if self.brokers.controllers:
            raise errors.UnknownGroup("broker c1 hosts no group '' (it hosts __controller); "
                                      "name one in the request (fake)")
        return self.brokers.metadata, b""

    def send_request(self, header: dict, payload: bytes = b"") -> int:
        self.brokers.fail(self.address)
        self.next_id += 1
        header = {**header, "id": self.next_id, "group": self.group}
        if len(encode_frame(header, payload)) > FRAME_SIZE_BYTES_MAX:
            raise errors.NodeUnavailable("the node closed the connection (fake)")
        refusal = self._refusal(header)
        if refusal is None and self.brokers.answer is not None:
            self.brokers.answered += 1
            refusal = {**self.brokers.answer, "id": self.next_id}
        if refusal is not None:
            self.answers.append(Frame(refusal, b""))
            return self.next_id
        self.brokers.sequences.add(header.get("sequence"))
        self.brokers.produced.append((header, payload))
        offset = len(self.brokers.produced) - 1
        self.answers.append(Frame({"id": self.next_id, "status": PutStatus.PUT_OK.value,
                                   "position": offset * 100, "offset": offset}, b""))
        return self.next_id

    def _refusal(self, header: dict) -> dict | None:
        """node.py's: a retry of the ``cut`` sequence is refused PartiallyStored (its copy
        here holds one record), a request after one not stored (or after the cut one,
        which had more records) SequenceGap."""
        cut, previous = self.brokers.cut, header.get("previous")
        if self.brokers.deleted:
            return {"id": self.next_id, "kind": "error", "error": "UnknownGroup",
                    "message": "this broker hosts no group 't-0' (fake)"}
        if cut is not None and header.get("sequence") == cut:
            return {"id": self.next_id, "kind": "error", "error": "PartiallyStored",
                    "message": f"1 of its {len(header['sizes'])} records are stored (fake)",
                    "count": 1, "position": 100, "offset": 1}
        if previous is not None and (previous not in self.brokers.sequences or (
                previous == cut and header.get("previous_count", 1) > 1)):
            return {"id": self.next_id, "kind": "error", "error": "SequenceGap",
                    "message": f"{previous} is not stored here (fake)"}
        return None

    def take_answers(self, wait: bool) -> list[Frame]:
        if self.brokers.hold:
            self.brokers.held.set()
            return []
        answers, self.answers = self.answers, []
        return answers

    def fileno(self) -> int:  # (what the client waits on: never readable here)
        if not hasattr(self, "_quiet"):
            self._quiet = socket.socketpair()
        return self._quiet[0].fileno()

    def fetch(self, *args: Any, **kwargs: Any) -> list:
        self.brokers.fail(self.address)
        return []

    def close(self) -> None:
        for end in getattr(self, "_quiet", ()):
            end.close()


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeBrokers:
    brokers = FakeBrokers()
    monkeypatch.setattr("mqlog.cluster_client.Client", brokers.connect)
    return brokers


def _fake_client(**options: Any) -> ClusterClient:
    return ClusterClient(["b1:1", "b2:1", "b3:1"], retry_backoff_ms=5, **options)


def test_a_failed_metadata_refresh_is_one_more_attempt_not_the_outcome(
        fake: FakeBrokers) -> None:
    """Every broker unreachable for a while (the leader's connection and each refresh of
    the metadata fail): a refresh no broker answered was taken as the request's result —
    "no broker answered cluster_metadata", long before retry_timeout_s, not saying the
    outcome was unknown, though the leader may have stored it. The request goes on
    until the brokers answer again, and is stored once."""
    with _fake_client(retry_timeout_s=60) as client:
        assert client.produce("t", b"first").offset == 0
        fake.failures = 40  # (connections, requests and refreshes: a count, not a time)
        assert client.produce("t", b"second").status is PutStatus.PUT_OK
        assert fake.failures == 0 and client.retries > 0
        assert [payload for _, payload in fake.produced] == [b"first", b"second"]
        fake.failures = 40
        assert client.fetch("t", 0) == []  # (a read went the same way)
        assert fake.failures == 0


def test_a_request_no_broker_answers_ends_at_its_deadline_as_outcome_unknown(
        fake: FakeBrokers) -> None:
    """At retry_timeout_s, the error says the outcome is unknown (this client may send
    it again) — and comes then: a request decided while it was being sent (its
    connection refused) made ``result()`` wait timeout_s more for nothing."""
    with _fake_client(retry_timeout_s=0.3, timeout_s=20,
                      metadata_max_age_ms=600_000) as client:
        client.produce("t", b"first")
        fake.failures = None  # (for ever: so it is never sent, and stored nowhere)
        started = time.monotonic()
        pending = client.send("t", b"second")
        with pytest.raises(errors.NodeUnavailable,
                           match=r"within retry_timeout_s=0.3; nothing was stored \(every "
                                 r"attempt was refused before storing, or could not be sent") \
                as failed:
            pending.result()
        assert 0.3 <= time.monotonic() - started < 10  # (not timeout_s after it)
        assert "outcome is unknown" not in str(failed.value)
        with pytest.raises(errors.NodeUnavailable, match=r"request \(fetch\) within"):
            client.fetch("t", 0)
    with _fake_client(retry_timeout_s=0.1) as client:  # (no metadata ever: not sent)
        fake.failures = None
        with pytest.raises(errors.NodeUnavailable, match="the request was not sent"):
            client.produce("t", b"never")


@pytest.mark.parametrize("held", [False, True])
def test_the_rest_of_a_request_stored_in_part_goes_before_those_behind_it(
        fake: FakeBrokers, held: bool) -> None:
    """A leader holds the first record only of a request (a copy a failover cut inside
    it) and refuses its retry with PartiallyStored. That was raised to the caller, and
    the requests pipelined behind it went on and were stored after the cut, ahead of
    the rest the caller sent again: out of the order sent (helper-41). The client now
    sends the rest itself, first, then those behind it (each request names the one
    before with its record count, so a leader holding the cut copy refuses them:
    SequenceGap); the request is answered with its first record's place. With ``held``,
    the answers come once all four are sent (those behind it refused as well)."""
    with _fake_client(retry_timeout_s=30) as client:
        assert client.produce("t", b"first").offset == 0
        fake.cut, fake.hold = 2, held  # (2: the next request's sequence)
        cut = client.send_batch("t", [b"a", b"b", b"c"])
        behind = [client.send("t", b"x%d" % index) for index in range(3)]
        fake.hold = False
        result = cut.result()
        assert (result.status, result.position, result.offset) == (PutStatus.PUT_OK, 100, 1)
        assert [pending.result().status for pending in behind] == [PutStatus.PUT_OK] * 3
        assert [payload for _, payload in fake.produced] == \
            [b"first", b"bc", b"x0", b"x1", b"x2"]
        sequences = [header["sequence"] for header, _ in fake.produced]
        assert sequences == sorted(sequences) and 2 not in sequences


def test_brokers_that_never_answer_cost_a_request_one_timeout_past_its_deadline() -> None:
    """Three brokers that take the connection and never answer (stopped processes, say):
    each metadata refresh asked them one after the other, timeout_s each, so a request
    ended up to three timeouts past retry_timeout_s; the docs promise at most one
    (helper-41). A refresh is one attempt now: timeout_s in all."""
    import socket

    silent = [socket.create_server(("127.0.0.1", 0), backlog=64) for _ in range(3)]
    try:  # (never accepted: the kernel takes each connection, no one reads it)
        addresses = [f"127.0.0.1:{server.getsockname()[1]}" for server in silent]
        with ClusterClient(addresses, retry_timeout_s=2, timeout_s=4) as client:
            started = time.monotonic()
            with pytest.raises(errors.NodeUnavailable):
                client.produce("t", b"never")
            elapsed = time.monotonic() - started
        # (documented: retry_timeout_s plus one timeout_s, 6 s; it was 12 s or more, three
        # timeouts a refresh: the bound leaves 4 s to a loaded machine)
        assert elapsed < 10, elapsed
    finally:
        for server in silent:
            server.close()


def test_close_from_another_thread_ends_a_wait_for_an_answer(fake: FakeBrokers) -> None:
    """A thread waits in result() for an answer that does not come (a stopped leader):
    close() from another thread waited for the lock that wait holds, up to
    retry_timeout_s (helper-41). It ends the wait at once now, and the request with it,
    NodeUnavailable (outcome unknown)."""
    client = _fake_client(retry_timeout_s=30, timeout_s=30)
    client.produce("t", b"first")
    fake.hold = True
    pending = client.send("t", b"never answered")
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            pending.result()
        except errors.MqlogError as error:
            outcome.append(error)
    waiter = threading.Thread(target=wait)
    waiter.start()
    assert fake.held.wait(30)  # (the waiter asked for the answer: it holds the lock)
    started = time.monotonic()
    client.close()
    waiter.join(30)
    assert not waiter.is_alive() and time.monotonic() - started < 10
    assert len(outcome) == 1 and isinstance(outcome[0], errors.NodeUnavailable), outcome
    assert "the client was closed" in str(outcome[0])
    with pytest.raises(errors.ClientClosed):
        client.send("t", b"after")


def test_a_request_to_a_topic_deleted_meanwhile_is_unknown_topic_at_once(
        fake: FakeBrokers) -> None:
    """The topic is deleted after the client saw it: every broker refuses the request
    (UnknownGroup), and the refreshed metadata has no such topic. It was sent again
    until retry_timeout_s, then called "outcome unknown" (helper-41); now it fails at
    once with UnknownTopic, as a fetch does."""
    with _fake_client(retry_timeout_s=30) as client:
        client.produce("t", b"first")
        fake.delete_topic()
        started = time.monotonic()
        with pytest.raises(errors.UnknownTopic, match="deleted"):
            client.produce("t", b"second")
        assert time.monotonic() - started < 10  # (not retry_timeout_s)


def test_controllers_given_as_bootstrap_are_named_as_not_brokers(fake: FakeBrokers) -> None:
    """Controllers' addresses as bootstrap: each answered UnknownGroup, whose advice
    ("name a group in the request") is a broker's to a Client, and the error passed it on
    (helper-41); then the CLI told a controller by "__controller" in that text. The client
    asks such a node's process_roles (broker_metadata): all controllers is NotABroker, at
    once (a controller never turns into a broker: nothing to wait for), saying what
    bootstrap takes."""
    fake.controllers = True
    with _fake_client(retry_timeout_s=30) as client, \
            pytest.raises(errors.NotABroker,
                          match=r"bootstrap b1:1,b2:1,b3:1: controllers, not brokers .*takes "
                                r"brokers' addresses, not the \[controller\] voters") as failed:
        client.metadata()
    assert failed.value.addresses == ["b1:1", "b2:1", "b3:1"]
    assert fake.metadata_asked == 3  # (each once: not asked again until retry_timeout_s)
    assert "name one in the request" not in str(failed.value)


def test_nodes_that_are_not_a_clusters_brokers_nor_controllers_are_named(
        fake: FakeBrokers) -> None:
    """A node with the broker role that serves no cluster (a standalone master-slave or
    Raft node, no [controller] table: it answers cluster_metadata UnknownGroup, or
    "unknown request kind" from its default group) is no controller, and never becomes
    a cluster's broker either: it was asked until retry_timeout_s, then "no broker
    answered cluster_metadata: ...: unknown request kind 'cluster_metadata'" (new-user
    review: `mqlog produce -b NODE` waited its 10 s for that). NotABroker at once now,
    naming them as standalone nodes and what to use instead."""
    fake.controllers, fake.roles = True, ["broker"]
    started = time.monotonic()
    with _fake_client(retry_timeout_s=60) as client, \
            pytest.raises(errors.NotABroker,
                          match=r"b1:1 is not a cluster's broker \(a standalone node: no "
                                r"\[controller\] voters\).*mqlog.Client\(ADDRESS\) or "
                                r"mqlog.GroupClient.*`mqlog consume DATA_DIR`") as failed:
        client.metadata()
    assert time.monotonic() - started < 30  # (not retry_timeout_s)
    assert failed.value.addresses == failed.value.standalone == ["b1:1", "b2:1", "b3:1"]
    assert "name one in the request" not in str(failed.value)
    assert fake.metadata_asked == 3  # (each once)


def test_a_request_larger_than_a_frame_is_refused_before_it_is_sent(
        fake: FakeBrokers) -> None:
    """A broker drops the connection of a frame over its frame_size_bytes_max unread: such
    a request was sent again until retry_timeout_s, then "outcome unknown"."""
    with _fake_client(retry_timeout_s=1) as client:
        assert client.frame_size_bytes_max == FRAME_SIZE_BYTES_MAX == 16 << 20
        for bodies in ([b"b" * 3_500_000] * 5, [b"x" * (20 << 20)]):
            with pytest.raises(errors.MessageTooLarge,
                               match="frame_size_bytes_max=16777216.*nothing was sent; "
                                     "send its bodies in smaller batches"):
                client.produce_batch("t", bodies)
        assert fake.produced == [] and client.retries == 0
        client.produce_batch("t", [b"b" * 3_500_000] * 4)  # (under the limit: sent)
        assert client.send("t", b"next").result().offset == 1  # (no sequence was taken)
        assert [header["sequence"] for header, _ in fake.produced] == [1, 2]
    with _fake_client(frame_size_bytes_max=1024) as client:  # (a broker set lower)
        for size in range(700, 1100):  # the frames sent: never above the limit
            try:
                client.produce("t", b"y" * size, key="k", tags="x")
            except errors.MessageTooLarge:
                break
        header, payload = fake.produced[-1]
        # (within what the stamps a retry adds can take: id, previous, previous_count)
        assert 1024 - 64 < len(encode_frame(header, payload)) <= 1024
    for wrong in (0, 1023, 2.0e6, True, "16MiB"):
        with pytest.raises(errors.InvalidArgument, match="frame_size_bytes_max must be"):
            _fake_client(frame_size_bytes_max=wrong)


def test_a_closed_client_refuses_every_call_and_opens_no_connection(
        fake: FakeBrokers) -> None:
    with _fake_client() as client:
        client.produce("t", b"open")
    opened = fake.opened
    calls = {"send": lambda: client.send("t", b"x"), "produce": lambda: client.produce(
        "t", b"x"), "send_batch": lambda: client.send_batch("t", [b"x"]),
        "fetch": lambda: client.fetch("t", 0), "flush": client.flush,
        "metadata": lambda: client.metadata(refresh=True),
        "partitions_for": lambda: client.partitions_for("t")}
    for name, call in calls.items():
        with pytest.raises(errors.ClientClosed, match="was closed"):
            call()
            pytest.fail(f"{name} worked on a closed client")
    assert fake.opened == opened and client._connections == {}
    client.close()  # (again: nothing)
    assert [payload for _, payload in fake.produced] == [b"open"]


def test_bytes_keys_that_are_not_utf8_are_refused(fake: FakeBrokers) -> None:
    """Bytes keys were decoded with replacement: ff and fe stored as the same key."""
    with _fake_client() as client:
        for key in (b"\xff", b"\xfe", b"ok\xc3"):
            with pytest.raises(errors.InvalidArgument, match="a bytes key must be UTF-8"):
                client.produce("t", b"x", key=key)
        assert fake.opened == 0  # (refused before the metadata was asked for)
        client.produce("t", b"x", key="caf\u00e9".encode())
        client.produce("t", b"x", key="caf\u00e9")
        assert [header["key"] for header, _ in fake.produced] == ["caf\u00e9"] * 2


def test_a_topic_must_be_a_non_empty_string(fake: FakeBrokers) -> None:
    """A topic not a str, or empty, was looked for in the metadata until retry_timeout_s,
    then called unknown, with advice to create it."""
    with _fake_client(retry_timeout_s=0.2) as client:
        for topic in (123, None, b"t", ""):
            for name, *arguments in (("send", b"x"), ("send_batch", [b"x"]),
                                     ("produce", b"x"), ("fetch", 0), ("partitions_for",)):
                with pytest.raises(errors.InvalidArgument,
                                   match="topic must be a non-empty string"):
                    getattr(client, name)(topic, *arguments)
                    pytest.fail(f"{name}({topic!r}) did not raise")
        assert fake.opened == 0  # (refused before the metadata was asked for)


def test_a_client_in_a_process_holding_many_files_produces_and_fetches(tmp_path: Path
                                                                          ) -> None:
    """A process holding more than 1024 files gives a client's sockets numbers that
    select() refuses: every produce raised ValueError, after its request was sent (an
    untyped error for a write that was stored). The clients wait with poll. Skipped where
    this process may not open that many files."""
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"this process may open {hard} files at most")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 4096), hard))
    held: list[int] = []
    try:
        with isr_cluster(tmp_path, partitions=1) as running:
            held.extend(os.open(os.devnull, os.O_RDONLY) for _ in range(1100))
            with ClusterClient(_brokers(running), retry_timeout_s=30) as client:
                assert client.produce("orders", b"x", partition=0).status is PutStatus.PUT_OK
                assert [record.body for record in client.fetch("orders", 0, 0)] == [b"x"]
            with Client(_brokers(running)[0]) as single:
                single.produce("orders", b"y", queue_id=0, acks=0)
                single._take_waiting_answers()  # (acks=0 refusals: none here)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_request_sent_and_never_answered_ends_as_outcome_unknown(fake: FakeBrokers) -> None:
    """Sent, and its answer never came (within timeout_s: its connection is dropped, and
    it goes again, and again): the leader may have stored it, so at retry_timeout_s its
    outcome is unknown, and the error says so."""
    with _fake_client(retry_timeout_s=0.3, timeout_s=0.05) as client:
        client.produce("t", b"first")
        fake.hold = True  # (answers never come)
        with pytest.raises(errors.NodeUnavailable,
                           match=r"within retry_timeout_s=0.3; its outcome is unknown \(this "
                                 r"client retries it safely"):
            client.produce("t", b"second")


SLAVE_NOT_AVAILABLE = {"kind": "produced", "status": PutStatus.SLAVE_NOT_AVAILABLE.value,
                       "position": -1, "offset": -1, "count": 0}


def test_slave_not_available_until_the_deadline_says_nothing_was_stored(
        fake: FakeBrokers) -> None:
    """A master-slave partition's master without a slave in sync refuses every write
    SLAVE_NOT_AVAILABLE, position -1: nothing stored (docs/REPLICATION.md). The client
    sends it again while slaves may join, and at retry_timeout_s it said "no leader ...
    its outcome is unknown: SLAVE_NOT_AVAILABLE; SLAVE_NOT_AVAILABLE; ...", though every
    answer said nothing was stored (new-user review). Now SlaveNotAvailable, a
    NotEnoughReplicas as on an ISR partition, saying nothing was stored. The same status
    with a position is a write stored whose slaves then left the sync state: that one's
    outcome is unknown (it may commit), and still said so."""
    with _fake_client(retry_timeout_s=0.3) as client:
        client.produce("t", b"first")
        fake.answer = SLAVE_NOT_AVAILABLE
        with pytest.raises(errors.SlaveNotAvailable,
                           match=r"SLAVE_NOT_AVAILABLE\): nothing was stored \(every attempt "
                                 r"was refused before storing\), so a retry is safe") as failed:
            client.produce("t", b"second")
        assert isinstance(failed.value, errors.NotEnoughReplicas)
        assert "outcome is unknown" not in str(failed.value)
        assert fake.answered > 1  # (sent again while slaves might join: none fenced)
        fake.answer = {**SLAVE_NOT_AVAILABLE, "position": 100, "offset": 1, "count": 1}
        with pytest.raises(errors.NodeUnavailable, match="its outcome is unknown") as failed:
            client.produce("t", b"third")
        assert not isinstance(failed.value, errors.NotEnoughReplicas)
        fake.answer = None
        assert client.produce("t", b"fourth").status is PutStatus.PUT_OK


def test_slave_not_available_with_every_slave_fenced_is_raised_at_once(
        fake: FakeBrokers) -> None:
    """The master's slaves are on brokers the controller fenced (down): no slave can come
    in sync, so waiting retry_timeout_s for one only delayed the error (`mqlog produce`
    took its 10 s). SlaveNotAvailable at once, as an ISR partition's NotEnoughReplicas
    is (the controller shrinks an ISR as brokers are fenced)."""
    fake.fence("b2", "b3")
    with _fake_client(retry_timeout_s=60) as client:
        client.produce("t", b"first")
        fake.answer = SLAVE_NOT_AVAILABLE
        started = time.monotonic()
        with pytest.raises(errors.SlaveNotAvailable,
                           match=r"brokers of its other replicas \(b2, b3\) are fenced.*"
                                 "nothing was stored"):
            client.produce("t", b"second")
        assert time.monotonic() - started < 30  # (not retry_timeout_s)
        assert fake.answered == 1


def test_an_attempt_whose_connection_was_refused_stored_nothing(fake: FakeBrokers) -> None:
    """Right after a broker died, the first attempt found its port closed (connection
    refused: nothing sent), and the leader elected then refused the write
    NotEnoughReplicas (nothing stored): the client took the refused connection for a
    request that may have been stored, sent it again for retry_timeout_s, and said
    "outcome unknown" quoting answers that each said nothing was stored (new-user
    review). An attempt never sent leaves "nothing stored" true: NotEnoughReplicas at
    once."""
    with _fake_client(retry_timeout_s=60) as client:
        client.metadata()
        for address in list(client._connections):
            client._drop(address)  # (the leader died: its port refuses connections)
        fake.failures = 1
        fake.answer = {"kind": "error", "error": "NotEnoughReplicas",
                       "message": "the ISR is below min_insync_replicas: nothing was stored "
                                  "(fake)"}
        started = time.monotonic()
        with pytest.raises(errors.NotEnoughReplicas, match="nothing was stored"):
            client.produce("t", b"refused")
        assert time.monotonic() - started < 30  # (not retry_timeout_s)
        assert fake.failures == 0 and fake.answered == 1
