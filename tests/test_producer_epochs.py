"""Producer epochs (idempotence.py): a client restarted with the same explicit producer id
is a new life of it, not a retry of the old one; the older life is fenced.

* The table alone (both cores: it is rebuilt from a store's log): a higher epoch starts a
  new life with no sequence stored; a lower one is ProducerFenced; a rebuild keeps the
  newest epoch of the log, and a lower epoch written after it (a log no leader of this
  code writes) changes nothing; records without an epoch read as epoch 0.
* A real in-process cluster (three controllers, three brokers), an ISR topic and a Raft
  topic: the reviewer's case (a second ClusterClient with the same producer id after the
  first wrote sequences 1..N: its writes, pipelined, are all stored and read back, none
  answered as a duplicate — before epochs they were PUT_OK with the old records' places);
  two live clients sharing an id (the newer fences the older: its send, result and flush
  raise ProducerFenced and nothing of it is stored after); the same across a leader
  failover (the new leader's table, rebuilt from its log, keeps the epoch); the raw
  Client's (id, sequence, epoch) and the GroupClient on the Raft group.
"""

from __future__ import annotations

import contextlib
import random
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import mqlog
from mqlog import errors
from mqlog.client import Client
from mqlog.cluster_client import ClusterClient
from mqlog.config import ReplicationConfig
from mqlog.group_client import GroupClient
from mqlog.replication.driver import Driver
from mqlog.replication.idempotence import (
    ProducerTable,
    new_producer_epoch,
    producer_epoch,
    producer_properties,
)
from mqlog.replication.raft import RaftCore
from mqlog.results import PutStatus
from tests.inprocess import BROKERS, CONTROLLERS, Cluster
from tests.processes import change_metadata, wait_live_brokers
from tests.test_driver import RAFT, STORE, HeldIo, _elect
from tests.test_format import SMALL
from tests.test_isr_client import _disconnect
from tests.test_isr_cluster import _configs

LEADER_WAIT_S = 60.0  # for a partition's leader to be found (an election may be on)

# --- the table ---------------------------------------------------------------------------


def test_a_new_epoch_starts_a_new_life_and_an_old_one_is_fenced(tmp_path: Path,
                                                                impl: str) -> None:
    with mqlog.open(tmp_path / "s", implementation=impl, **SMALL) as store:
        store.put("t", b"old", properties={"producer_id": "p", "sequence": 1})  # (epoch 0)
        for sequence in (1, 2):
            store.put("t", b"a", properties=producer_properties("p", sequence, 5))
        for epoch in ("9", -1, True):  # (no tag: a user's properties, not the producer's)
            store.put("t", b"u", properties={"producer_id": "p", "sequence": 3,
                                             "producer_epoch": epoch})
        table = ProducerTable(1000)
        assert table.rebuild(store, 1 << 30) == 3
        assert table.epoch("p") == 5 and table.newest("p", 5) == 2
        assert table.lookup("p", 1, 5) is not None  # (a retry of this life)
        assert table.lookup("p", 1, 9) is None  # a new life: nothing of it stored
        with pytest.raises(errors.ProducerFenced, match="epoch 0.*its epoch 5"):
            table.lookup("p", 3, 0)
        # a lower epoch after a higher one in the log (no leader of this code writes
        # that) changes nothing; a higher one starts the producer over
        store.put("t", b"z", properties=producer_properties("p", 7, 4))
        table.rebuild(store, 1 << 30)
        assert table.epoch("p") == 5 and table.newest("p", 5) == 2
        store.put("t", b"b", properties=producer_properties("p", 1, 9))
        table.rebuild(store, 1 << 30)
        assert table.epoch("p") == 9 and table.newest("p", 9) == 1
        assert table.newest("p", 5) is None
        with pytest.raises(errors.ProducerFenced):
            table.lookup("p", 1, 5)


def _fill(store: Any, producer_id: str, sequences: range, epoch: int) -> None:
    for sequence in sequences:  # (~1 KB a record: 64 a 64 KiB segment)
        store.put("t", b"x" * 900, properties=producer_properties(producer_id, sequence,
                                                                  epoch))


def test_a_life_longer_than_the_window_is_not_stored_twice(tmp_path: Path,
                                                           impl: str) -> None:
    """Finding 1 of the review of 86f9688 (the window): a producer whose life began before
    the window a new leader scans had only the sequences in the window in its rebuilt
    table, and a retry of an older one (stored, answered by the old leader from its own
    table) was taken as new: stored twice. Such a sequence is now forgotten, as one the
    table dropped: OutOfOrderSequence, nothing stored."""
    with mqlog.open(tmp_path / "s", implementation=impl, **SMALL) as store:
        _fill(store, "p", range(1, 301), 7)
        _fill(store, "other", range(1, 3), 1)
        table = ProducerTable(1000)
        assert table.rebuild(store, 100_000) < 300  # (the window holds the newest only)
        for retry in (1, 50, table.newest("p", 7) - 120):
            with pytest.raises(errors.OutOfOrderSequence, match="no longer remembers"):
                table.lookup("p", retry, 7)
        assert table.lookup("p", 300, 7) is not None  # (in the window: found)
        assert table.lookup("p", 301, 7) is None  # (the next one: new)
        assert table.lookup("p", 1, 8) is None  # (a new life: nothing of it stored)
        assert table.lookup("other", 1, 1) is not None
        whole = ProducerTable(1000)  # a window that reaches the log's start forgets nothing
        whole.rebuild(store, 1 << 30)
        assert whole.lookup("p", 1, 7) is not None


def test_a_life_begun_inside_the_window_forgets_nothing(tmp_path: Path, impl: str) -> None:
    """ISR seed 8200000978: a restarted client's first request (its sequence 1) was
    refused for want of replicas while its next ones were stored; a new leader, its scan
    starting past the log's front (retention), forgot every sequence below the lowest it
    found, and refused the first request's retry as too old to tell, though it was never
    stored. A life whose scan met an earlier life of the producer first began inside the
    window (epochs never go down in a log): nothing of it is forgotten."""
    with mqlog.open(tmp_path / "s", implementation=impl, **SMALL) as store:
        _fill(store, "p", range(1, 130), 7)
        _fill(store, "p", range(2, 6), 8)  # (the new life's sequence 1 was never stored)
        _fill(store, "q", range(3, 6), 1)  # (a life the scan meets whole, or maybe not)
        table = ProducerTable(1000)
        table.rebuild(store, 50_000)
        assert table.epoch("p") == 8 and table.lookup("p", 1, 8) is None  # (new: stored)
        assert table.lookup("p", 2, 8) is not None
        with pytest.raises(errors.OutOfOrderSequence, match="no longer remembers"):
            table.lookup("q", 2, 1)  # (sequences 1 and 2 may lie before the scan)


def test_a_request_cut_by_the_window_is_not_said_to_be_partly_stored(
        tmp_path: Path, impl: str) -> None:
    """Finding 2 of the review of 86f9688: a request whose records went on in the next
    segment, where the rebuild's scan starts, was found with the records after the cut
    only, and its retry was refused with PartiallyStored ("the rest are not stored: send
    them again as a new request": twice) though all were stored. It is forgotten now."""
    with mqlog.open(tmp_path / "s", implementation=impl, **SMALL) as store:
        _fill(store, "p", range(1, 63), 3)  # (the first segment, nearly full)
        # (larger than a segment: one that fits is placed whole in the next, FORMAT.md)
        count = SMALL["segment_size_bytes"] // 900 + 1
        batch = store.put_batch("t", [b"y" * 900] * count,
                                properties=producer_properties("p", 63, 3))
        second = store.segments()[1][0]
        assert batch.position < second < batch.end_position  # (the request spans both)
        _fill(store, "p", range(64, 70), 3)
        table = ProducerTable(1000)
        table.rebuild(store, store.written_position - second)  # (the scan starts there)
        with pytest.raises(errors.OutOfOrderSequence, match="no longer remembers"):
            table.lookup("p", 63, 3)  # (not found with its last record only)
        assert table.lookup("p", 64, 3) is not None


def test_a_new_raft_leader_refuses_a_retry_from_before_its_window(tmp_path: Path,
                                                                    impl: str) -> None:
    """Finding 1 through a Raft replica's driver: elected over a log an earlier leader
    wrote (one life, sequences 1..300), with a window that holds the newest only. A retry
    of sequence 50 was stored a second time; now it is refused and nothing is stored."""
    store = mqlog.open(tmp_path / "n1", implementation=impl, clock_ms=lambda: 1_000,
                       **STORE)
    try:
        _fill(store, "p", range(1, 301), 7)
        core = RaftCore(ReplicationConfig(node_id="n1", **RAFT),  # type: ignore[arg-type]
                        store, rng=random.Random(1))
        io = HeldIo(store)
        driver = Driver(store, core, io, window_bytes=100_000)
        _elect(driver, io)
        driver.run()  # (the term starts: the table is rebuilt from the log)
        driver.check_writable()
        end = store.written_position
        with pytest.raises(errors.OutOfOrderSequence, match="no longer remembers"):
            driver.write("t", [b"x" * 900], producer=("p", 50, 7))
        assert store.written_position == end  # (nothing stored)
        assert driver.write("t", [b"x" * 900], producer=("p", 300, 7)).end < end  # found
        assert driver.write("t", [b"next"], producer=("p", 301, 7)).position == end
    finally:
        store.close()


def test_epoch_zero_is_left_out_and_epochs_rise_within_a_process() -> None:
    assert producer_properties("p", 3, 0) == {"producer_id": "p", "sequence": 3}
    assert producer_properties("p", 3, 7)["producer_epoch"] == 7
    assert producer_epoch(5_000_000, 0) == 5_000  # microseconds of the wall clock
    assert producer_epoch(5_000_000, 9_000) == 9_001  # the clock went back: still above
    epochs = [new_producer_epoch() for _ in range(1000)]
    assert epochs == sorted(set(epochs))


# Producer tags out of range or malformed: each client refuses them (InvalidArgument,
# naming the range) before it sends anything. An epoch or a sequence of 2**64 and more
# was msgpack's untyped OverflowError; one in [2**63, 2**64) went out for the node to
# refuse (_GARBAGE_TAGS below).
_BAD_PRODUCERS = (("q", 1, 1 << 64), ("q", 1 << 64, 1), ("q", 1 << 64), ("q", 1, 1 << 63),
                  ("q", 1 << 63, 1), ("q", -1), ("q", 1, -1), ("q", 1, None), ("q", True),
                  ("", 1), ("a b", 1), (7, 1), ("q",), ("q", 1, 2, 3), "q1")


def test_clients_refuse_a_producer_tag_out_of_range_before_sending() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:  # (a node that never answers)
        address = f"127.0.0.1:{server.getsockname()[1]}"
        with Client(address, timeout_s=5) as raw:
            connection, _ = server.accept()
            for producer in _BAD_PRODUCERS:
                with pytest.raises(errors.InvalidArgument,
                                   match=r"\[0, 2\*\*63\)|producer must be"):
                    raw.produce("orders", b"x", producer=producer)
            connection.setblocking(False)
            with connection, pytest.raises(BlockingIOError):
                connection.recv(1)  # (nothing was sent)
        cluster = ClusterClient(address)
        cluster._partition_count = lambda topic, deadline: 1  # type: ignore[method-assign]
        group = GroupClient([address])
        for client in (cluster, group):
            client.producer_epoch = 1 << 64
            with pytest.raises(errors.InvalidArgument, match=r"producer_epoch=18446744073"):
                client.produce("orders", b"x")
        cluster.producer_epoch = new_producer_epoch()
        cluster._sequences[("orders", 0)] = (1 << 63) - 1
        with pytest.raises(errors.InvalidArgument, match=r"sequence=9223372036854775808"):
            cluster.produce("orders", b"x")
        assert cluster._sequences == {("orders", 0): (1 << 63) - 1}  # (none taken)
        assert group.sequence == 0
        for make in (ClusterClient, GroupClient):
            with pytest.raises(errors.InvalidArgument, match="without spaces"):
                make([address], producer_id="a b")


# --- a cluster ---------------------------------------------------------------------------


@contextlib.contextmanager
def _cluster(tmp_path: Path, layer: str) -> Iterator[Cluster]:
    with Cluster(_configs(tmp_path)) as running:
        controllers = running.addresses(CONTROLLERS)
        wait_live_brokers(controllers)
        change_metadata(controllers, {"kind": "create_topic", "name": "orders",
                                      "partitions": 1, "replication_factor": 3,
                                      "layer": layer})
        yield running


@pytest.fixture(params=["isr", "raft"])
def cluster(request: Any, tmp_path: Path) -> Iterator[Cluster]:
    with _cluster(tmp_path, request.param) as running:
        yield running


def _client(cluster: Cluster, **options: Any) -> ClusterClient:
    return ClusterClient(cluster.addresses(BROKERS), retry_timeout_s=60, **options)


def _bodies(client: ClusterClient) -> list[bytes]:
    return [record.body for record in client.fetch("orders", 0, 0, 1000)]


def _tags(client: ClusterClient) -> list[tuple[Any, ...]]:
    return [(record.properties.get("producer_epoch", 0), record.properties["sequence"])
            for record in client.fetch("orders", 0, 0, 1000)]


def _write(client: ClusterClient, *bodies: bytes) -> list[Any]:
    """Pipelined sends (five in flight), then every outcome."""
    sent = [client.send("orders", body, partition=0) for body in bodies]
    client.flush()
    return [pending.result() for pending in sent]


def test_a_restarted_client_with_the_same_producer_id_is_stored(cluster: Cluster) -> None:
    """The reviewer's case: before epochs, the second client's sequences 1..3 were
    answered PUT_OK with the places of the first client's records, and never stored."""
    first_bodies = [f"before-{index}".encode() for index in range(5)]
    after = [f"after-{index}".encode() for index in range(3)]
    with _client(cluster, producer_id="app") as first:
        _write(first, *first_bodies)
        places = {(record.position, record.offset) for record in _write(first, b"more")}
    with _client(cluster, producer_id="app") as second:  # (a new process, the same id)
        assert second.producer_epoch > first.producer_epoch
        results = _write(second, *after)
        assert all(result.status is PutStatus.PUT_OK for result in results)
        assert not places & {(result.position, result.offset) for result in results}
        assert _bodies(second) == [*first_bodies, b"more", *after]
        epochs = [epoch for epoch, _ in _tags(second)]
        assert epochs == [first.producer_epoch] * 6 + [second.producer_epoch] * 3
        assert [sequence for _, sequence in _tags(second)] == [1, 2, 3, 4, 5, 6, 1, 2, 3]


def test_the_newer_client_fences_the_older(cluster: Cluster) -> None:
    with _client(cluster, producer_id="shared") as older, \
            _client(cluster, producer_id="shared") as newer:
        _write(older, b"old-1", b"old-2")
        _write(newer, b"new-1")
        pending = [older.send("orders", b"old-%d" % index, partition=0) for index in (3, 4, 5)]
        with pytest.raises(errors.ProducerFenced):
            older.flush()  # (pipelined: each is refused, none retried)
        for sent in pending:
            with pytest.raises(errors.ProducerFenced, match="another client with this "
                                                            "producer id started later"):
                sent.result()
        with pytest.raises(errors.ProducerFenced):  # at once: a fenced client sends nothing
            older.send("orders", b"old-6", partition=0)
        with pytest.raises(errors.ProducerFenced):
            older.produce("orders", b"old-7", partition=0)
        _write(newer, b"new-2")
        assert _bodies(newer) == [b"old-1", b"old-2", b"new-1", b"new-2"]


def test_fencing_survives_a_leader_failover(cluster: Cluster) -> None:
    with _client(cluster, producer_id="shared") as older, \
            _client(cluster, producer_id="shared") as newer:
        _write(older, b"old-1", b"old-2")
        _write(newer, b"new-1", b"new-2")
        leader = _serving(cluster)  # (a Raft leader as reported may be stale)
        _disconnect(older)  # (both reconnect, to the new leader)
        _disconnect(newer)
        cluster.stop(leader)  # the new leader rebuilds its table from its log
        # before the newer writes there: the table rebuilt from the log fences the older
        with pytest.raises(errors.ProducerFenced):
            older.produce("orders", b"old-3", partition=0)
        # and the newer life's retries are still deduplicated there: its sequence 2 again
        again = _on_leader(cluster, lambda raw: raw.produce(
            "orders", b"new-2", producer=("shared", 2, newer.producer_epoch)))
        assert again.status is PutStatus.PUT_OK
        _write(newer, b"new-3")
        assert _bodies(newer) == [b"old-1", b"old-2", b"new-1", b"new-2", b"new-3"]


def _serving(cluster: Cluster) -> str:
    """The broker whose replica of "orders-0" serves writes now."""
    serving = [name for name in BROKERS if name in cluster.threads and
               cluster.threads[name].broker.groups["orders-0"].driver.serving]
    assert len(serving) == 1, serving
    return serving[0]


def _on_leader(cluster: Cluster, request: Callable[[Client], Any]) -> Any:
    """``request(raw)`` with a raw Client of whichever running broker leads "orders-0" (a
    Raft leader as reported may be stale), until one does (an election may be on)."""
    deadline = time.monotonic() + LEADER_WAIT_S
    while time.monotonic() < deadline:
        for name in list(cluster.threads):
            if name not in BROKERS:
                continue
            with Client(cluster.configs[name].listen, group="orders-0") as raw, \
                    contextlib.suppress(errors.NotMaster, errors.UnknownGroup):
                return request(raw)
        time.sleep(0.1)  # a back-off: an election is under way
    raise AssertionError(f"no broker led orders-0 within {LEADER_WAIT_S} s")


# Producer tags a node refuses (InvalidArgument, nothing stored). Finding 3 of the review
# of 86f9688: an epoch of 2**63 and more was taken, stored, and fenced every real client
# of that id (their epochs, the wall clock in microseconds, are lower) for as long as the
# record stays in the window; a sequence up there left its life no next one to send.
_GARBAGE_TAGS = (
    *({"producer_id": "q", "sequence": 3, "producer_epoch": epoch}
      for epoch in (-1, "1", True, 1.5, None, 1 << 63, (1 << 64) - 1)),
    {"producer_id": "q", "sequence": 1 << 63, "producer_epoch": 1},
    {"producer_id": "q"}, {"sequence": 3}, {"producer_epoch": 3},
    {"producer_id": "q", "producer_epoch": 3}, {"sequence": 3, "producer_epoch": 3},
)


def test_raw_client_triples_and_the_group_client(tmp_path: Path) -> None:
    with _cluster(tmp_path, "raft") as cluster, _client(cluster) as client:
        client.produce("orders", b"first", partition=0)  # (the group is hosted and led)
        old, new = new_producer_epoch(), new_producer_epoch()

        def produce(body: bytes, producer: tuple[Any, ...]) -> Any:
            return _on_leader(cluster, lambda raw: raw.produce("orders", body,
                                                               producer=producer))

        one = produce(b"q-old", ("q", 1, old))
        assert produce(b"q-new", ("q", 1, new)).position > one.position  # a new life:
        # stored, not taken for the old life's 1
        with pytest.raises(errors.ProducerFenced):
            produce(b"q-zombie", ("q", 2, old))
        with pytest.raises(errors.ProducerFenced):
            produce(b"q-pair", ("q", 2))  # (a pair: epoch 0)
        for tag in _GARBAGE_TAGS:  # (each refused before anything is stored)
            header = {"kind": "produce", "topic": "orders", "queue_id": 0, "sizes": [1],
                      **tag}
            with pytest.raises(errors.InvalidArgument, match="producer_epoch"):
                _on_leader(cluster, lambda raw, header=header: raw.call(header, b"x"))
        addresses = cluster.addresses(BROKERS)
        with GroupClient(addresses, producer_id="g", group="orders-0") as first:
            first.produce("orders", b"g-1")
            with GroupClient(addresses, producer_id="g", group="orders-0") as second:
                second.produce("orders", b"g-2")  # (its sequence 1 too)
                with pytest.raises(errors.ProducerFenced):
                    first.produce("orders", b"g-zombie")
                with pytest.raises(errors.ProducerFenced):  # (raised again, nothing sent)
                    first.produce("orders", b"g-zombie")
        assert _bodies(client) == [b"first", b"q-old", b"q-new", b"g-1", b"g-2"]
