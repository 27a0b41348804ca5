"""``mqlog.ClusterClient`` on ISR topics, in-process on 127.0.0.1 (three controllers and
three brokers, each on its own loop and thread: test_isr_cluster.py's cluster, with each
broker in its own rack), min_insync_replicas = 2.

* acks in Kafka's words (and ints, and mqlog's older ones): all, 1 and 0 are taken and
  read back in order; acks=0 returns at once with position -1; a word it does not know
  is an InvalidArgument before anything is sent.
* Consumers see only what is committed: with the ISR down to the leader an acks=1
  write is stored but not shown by any fetch (the high watermark does not move below
  min.insync), acks=all is refused at once with NotEnoughReplicas (nothing stored); once
  the followers rejoin, the acks=1 record shows.
* Follower reads (KIP-392): ``replica=`` a broker or "nearest" (the client's rack) read
  the same records from a follower; a follower that was down and is catching up answers
  a prefix of the leader's committed records, never more than its own high watermark.
* Stored-but-undecided writes: an acks=all write whose followers are stopped is stored
  and answered REQUEST_TIMED_OUT or NOT_ENOUGH_REPLICAS_AFTER_APPEND; the client sends it
  again with the same producer sequence until the followers are back, and the record is
  in the log once; with a short retry_timeout_s the typed error says it is stored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mqlog import errors
from mqlog.client import Client
from mqlog.cluster_client import ClusterClient
from mqlog.replication.local import wait_until
from mqlog.results import PutStatus
from tests.inprocess import BROKERS, CONTROLLERS, Cluster
from tests.processes import change_metadata, wait_live_brokers
from tests.test_isr_cluster import _configs

RACKS = {"b1": "r1", "b2": "r2", "b3": "r3"}


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    with isr_cluster(tmp_path, partitions=2) as running:
        yield running


@contextlib.contextmanager
def isr_cluster(tmp_path: Path, partitions: int) -> Iterator[Cluster]:
    """The racked ISR cluster with topic "orders" of ``partitions`` × RF 3."""
    configs = {name: dataclasses.replace(config, rack=RACKS.get(name, ""))
               for name, config in _configs(tmp_path).items()}
    with Cluster(configs) as running:
        controllers = running.addresses(CONTROLLERS)
        wait_live_brokers(controllers)
        change_metadata(controllers, {"kind": "create_topic", "name": "orders",
                                      "partitions": partitions, "replication_factor": 3,
                                      "layer": "isr"})
        yield running


def _brokers(cluster: Any) -> list[str]:
    return [cluster.configs[name].listen for name in BROKERS]


def _node(cluster: Any, broker: str, partition: int = 0) -> Any:
    return cluster.threads[broker].broker.groups[f"orders-{partition}"]


def _bodies(client: ClusterClient, partition: int = 0, **where: Any) -> list[bytes]:
    return [record.body for record in client.fetch("orders", partition, 0, 1000, **where)]


def _first_write(client: ClusterClient) -> None:
    """The leader takes acks=all writes once its partition is hosted and handed its state
    (the client moves on through NotLeader/UnknownGroup meanwhile)."""
    assert client.produce("orders", b"first", partition=0).status is PutStatus.PUT_OK


def _stop(cluster: Any, client: ClusterClient, *names: str) -> None:
    """Stop brokers, the client's connections closed first (it reconnects; the client is
    not closed: a closed one refuses every call). (Once the only guard against a
    connection left to the garbage collector with a stopped broker's loop, which made
    CPython 3.11 fail pytest's summary, gh-106905; tests/inprocess.py's BrokerThread now
    cancels and awaits such tasks itself.)"""
    _disconnect(client)
    cluster.stop(*names)


def _disconnect(client: ClusterClient) -> None:
    """Close the client's connections as if they broke (it reconnects on its next call)."""
    for address in list(client._connections):
        client._drop(address)


def _leader(cluster: Any, client: ClusterClient) -> tuple[str, list[str]]:
    info = client.metadata(refresh=True).partition("orders", 0)
    return info.leader, [name for name in info.replicas if name != info.leader]


def test_acks_words_high_watermark_and_follower_reads(cluster: Any) -> None:
    with ClusterClient(_brokers(cluster), retry_timeout_s=60) as client:
        _first_write(client)
        leader, followers = _leader(cluster, client)
        sent, places = [b"first"], {}
        for acks in ("all", -1, "replicated", "1", 1, "master", "0", 0):
            body = f"acks={acks!r}".encode()
            produced = client.produce("orders", body, partition=0, acks=acks)
            assert produced.status is PutStatus.PUT_OK
            assert (produced.position == -1) == (acks in ("0", 0)), (acks, produced)
            if acks in ("0", 0):  # (nothing known: as its position)
                assert (produced.store_timestamp, produced.size) == (-1, -1), produced
            else:
                places[produced.position] = produced
            sent.append(body)
        assert client.produce("orders", b"last", partition=0).status is PutStatus.PUT_OK
        sent.append(b"last")  # (committed: everything before it is, too)
        assert _bodies(client) == sent
        # The leader's store time and size of each record (they were 0 and 0, or absent)
        for record in client.fetch("orders", 0, 0, 1000):
            if record.position in places:
                produced = places.pop(record.position)
                assert (produced.store_timestamp, produced.size) == \
                    (record.store_timestamp, record.size) != (0, 0), (produced, record)
        assert not places
        wrong: list[Any] = ["2", 2, True, "ALL", 1.0, [1]]
        for word in wrong:
            with pytest.raises(errors.InvalidArgument, match="acks must be"):
                client.produce("orders", b"never", partition=0, acks=word)
        with pytest.raises(errors.InvalidArgument, match="acks must be"):
            ClusterClient(_brokers(cluster), acks="some")

        # Follower reads: a named follower, and "nearest" by the client's rack.
        follower = followers[0]
        wait_until(lambda: _node(cluster, follower).store.committed_position ==
                   _node(cluster, leader).store.committed_position, "the follower's HW", 30)
        retries = client.retries
        assert _bodies(client, replica=follower) == sent
        assert client.retries == retries  # (served there: not passed over for the leader)
        with pytest.raises(errors.InvalidArgument, match="replica must be"):
            client.fetch("orders", 0, replica="c1")
        with Client(cluster.configs[follower].listen, group="orders-0") as raw:
            assert raw.produce("orders", b"lost", 0, acks=0).position == -1  # (not waited)
            # (answers come in any order: the refusal is read by a later call's wait)
            wait_until(lambda: raw.metadata() and raw.refused == 1, "the refusal read", 30)
            assert isinstance(raw.refusals[0], errors.NotLeader)
        with ClusterClient(_brokers(cluster), client_rack=RACKS[follower]) as near:
            assert _bodies(near, replica="nearest") == sent and near.retries == 0
            assert cluster.configs[follower].listen in near._connections  # read there
            assert cluster.configs[leader].listen not in near._connections or \
                near.refreshes  # (only metadata went elsewhere)
        with ClusterClient(_brokers(cluster), client_rack="elsewhere") as far:
            assert _bodies(far, replica="nearest") == sent  # no replica near: the leader

        # The ISR down to the leader: acks=1 stored but not shown; acks=all refused.
        _stop(cluster, client, *followers)
        node = _node(cluster, leader)
        wait_until(lambda: node.core.isr == (leader,), "the ISR down to the leader", 60)
        end = node.store.written_position
        started = time.monotonic()
        with pytest.raises(errors.NotEnoughReplicas, match="nothing was stored"):
            client.produce("orders", b"refused", partition=0)
        assert time.monotonic() - started < client.retry_timeout_s / 2  # not retried
        assert node.store.written_position == end
        hidden = client.produce("orders", b"acks=1 alone", partition=0, acks=1)
        assert hidden.status is PutStatus.PUT_OK and hidden.position == end
        assert node.store.written_position > end
        assert _bodies(client) == sent  # beyond the high watermark: not shown
        cluster.start(*followers)
        wait_until(lambda: _bodies(client) == [*sent, b"acks=1 alone"],
                   "the acks=1 record shown once the followers rejoined", 60)


def test_a_follower_catching_up_answers_a_prefix(cluster: Any) -> None:
    with ClusterClient(_brokers(cluster), retry_timeout_s=60) as client:
        _first_write(client)
        leader, followers = _leader(cluster, client)
        behind = followers[0]
        _stop(cluster, client, behind)
        sent = [b"first"] + [b"r%d" % number for number in range(200)]
        for body in sent[1:]:
            assert client.produce("orders", body, partition=0).status is PutStatus.PUT_OK
        cluster.start(behind)
        seen: list[int] = []

        def caught_up() -> bool:
            node = cluster.threads[behind].broker.groups.get("orders-0")
            if node is None:
                return False  # (not hosted again yet)
            records = client.fetch("orders", 0, 0, 1000, replica=behind)
            committed = node.store.committed_position  # (read after the answer: no lower)
            assert all(record.position < committed for record in records)
            found = [record.body for record in records]
            assert found == sent[:len(found)], "a follower answered what is not committed"
            seen.append(len(found))
            return found == sent
        wait_until(caught_up, f"{behind} serving every record", 60)
        print(f"records {behind} answered while catching up: {seen}")


def test_stored_undecided_writes_are_retried_once(cluster: Any) -> None:
    with ClusterClient(_brokers(cluster), retry_timeout_s=60) as client:
        _first_write(client)
        leader, followers = _leader(cluster, client)
        node = _node(cluster, leader)
        _stop(cluster, client, *followers)  # the write is stored, then the ISR shrinks
        outcome: list[Any] = []
        writer = threading.Thread(target=lambda: outcome.append(
            client.produce("orders", b"undecided", partition=0)))
        writer.start()
        wait_until(lambda: node.core.isr == (leader,), "the ISR down to the leader", 60)
        wait_until(lambda: client.retries > 0, "the write sent again", 60)
        cluster.start(*followers)
        writer.join(90)
        assert not writer.is_alive()
        assert outcome and outcome[0].status is PutStatus.PUT_OK, outcome
        assert _bodies(client).count(b"undecided") == 1  # idempotence: stored once

        # A short retry_timeout_s: the typed error says it is stored, and it commits later.
        wait_until(lambda: len(node.core.isr) == 3, "the ISR whole again", 60)
        _stop(cluster, client, *followers)
        client.retry_timeout_s = 2.0
        end = node.store.written_position
        try:
            client.produce("orders", b"stored, undecided", partition=0)
            raise AssertionError("an acks=all write with every follower stopped committed")
        except (errors.NotEnoughReplicasAfterAppend, errors.RequestTimedOut) as error:
            assert "is stored" in str(error) and "idempotent producer" in str(error)
            assert node.store.written_position > end
            stored = True
        except errors.NotEnoughReplicas:  # (the ISR shrank before the write came)
            assert node.store.written_position == end
            stored = False
        print(f"stored before the ISR shrank: {stored}")
        if stored:  # a retry of it is answered by its fate, not refused as new
            wait_until(lambda: node.core.isr == (leader,), "the ISR down to the leader", 60)
            sequence = client._sequences[("orders", 0)]
            with Client(cluster.configs[leader].listen, group="orders-0") as raw:
                again = raw.produce("orders", b"stored, undecided", 0,
                                    producer=(client.producer_id, sequence,
                                              client.producer_epoch))
            assert again.status is PutStatus.NOT_ENOUGH_REPLICAS_AFTER_APPEND, again
        cluster.start(*followers)
        wait_until(lambda: _bodies(client).count(b"stored, undecided") == int(stored),
                   "the stored write committed once the followers rejoined", 60)
        assert _bodies(client).count(b"undecided") == 1


def test_an_attempt_refused_its_connection_stored_nothing(cluster: Any) -> None:
    """New-user review: two of three brokers down. A write whose first attempt found the
    dead leader's port closed (connection refused: nothing sent; the client's view still
    named that leader) took it for an attempt that may have stored the write, so the
    NotEnoughReplicas of the broker elected next (its ISR below min.insync) was sent again
    for retry_timeout_s, then reported "outcome unknown" quoting answers that each said
    nothing was stored. An attempt never sent stored nothing: NotEnoughReplicas at once."""
    # (a view kept: still naming the leaders of before, as a client's just after a death)
    with ClusterClient(_brokers(cluster), retry_timeout_s=30,
                       metadata_max_age_ms=600_000) as client:
        _first_write(client)
        view = client.metadata(refresh=True)
        gone = view.partition("orders", 0).leader
        keep = view.partition("orders", 1).leader  # (another: consecutive partitions)
        _stop(cluster, client, *(name for name in BROKERS if name != keep))
        left, isr = cluster.threads[keep], _node(cluster, keep, 0)
        wait_until(lambda: left.call(lambda: isr.core.is_master and isr.core.isr == (keep,)),
                   f"{keep} leading orders-0 alone, {gone} gone", 60)
        started, retries = time.monotonic(), client.retries
        with pytest.raises(errors.NotEnoughReplicas, match="nothing was stored") as refused:
            client.produce("orders", b"after", partition=0)
        assert not isinstance(refused.value, errors.SlaveNotAvailable), refused.value
        assert time.monotonic() - started < 25  # (not retry_timeout_s: at once)
        assert client.retries == retries + 1  # (the refused connection's attempt, then)


def test_master_slave_writes_with_two_brokers_down_say_nothing_was_stored(
        cluster: Any) -> None:
    """New-user review: `mqlog topics create mst --partitions 2 --replication-factor 3
    --layer master_slave`, two brokers killed, `mqlog produce -b BROKER -t mst`: the write
    to the master left without a slave in sync was sent again for the retry timeout and
    ended "no leader ... its outcome is unknown ...: SLAVE_NOT_AVAILABLE;
    SLAVE_NOT_AVAILABLE; ...", though each answer said nothing was stored. Now
    SlaveNotAvailable (a NotEnoughReplicas) at once, its slaves' brokers being fenced; and
    the partition whose master is gone (no auto_failover: no new master) says at its
    deadline that nothing was stored."""
    controllers = cluster.addresses(CONTROLLERS)
    change_metadata(controllers, {"kind": "create_topic", "name": "mst", "partitions": 2,
                                  "replication_factor": 3, "layer": "master_slave"})
    with ClusterClient(_brokers(cluster), retry_timeout_s=60) as client:
        for partition in (0, 1):
            assert client.produce("mst", b"before", partition=partition).status \
                is PutStatus.PUT_OK
        view = client.metadata(refresh=True)
        kept, keep = 0, view.partition("mst", 0).leader
        gone = [name for name in BROKERS if name != keep]
        _stop(cluster, client, *gone)
        # the master holding its slaves out of sync (until then it stores a write and
        # waits for them: that one's outcome is unknown), their brokers fenced
        left, master = cluster.threads[keep], cluster.threads[keep].broker.groups["mst-0"]
        wait_until(lambda: not left.call(master.core.in_sync_slaves),
                   "the master holding its slaves out of sync", 60)
        wait_until(lambda: all(client.metadata(refresh=True).brokers[name].fenced
                               for name in gone), f"{', '.join(gone)} fenced", 60)
    end = left.call(lambda: master.store.written_position)
    address = cluster.configs[keep].listen
    with ClusterClient([address], retry_timeout_s=30, retry_backoff_ms=20) as client:
        started = time.monotonic()
        with pytest.raises(errors.SlaveNotAvailable,
                           match=r"fenced \(down.*nothing was stored") as refused:
            client.produce("mst", b"after", partition=kept)
        assert time.monotonic() - started < 25, refused.value  # (at once)
        assert "outcome is unknown" not in str(refused.value)
    with ClusterClient([address], retry_timeout_s=1, retry_backoff_ms=20) as client:
        with pytest.raises(errors.NodeUnavailable, match="nothing was stored") as failed:
            client.produce("mst", b"after", partition=1)  # (its master gone: NotMaster)
        assert "outcome is unknown" not in str(failed.value)
    # `mqlog produce -b` as the review ran it: one line, at once, nothing stored
    from tests.test_cli_cluster import mqlog
    result = mqlog("produce", "-b", address, "-t", "mst", "--queue", kept, "--timeout-s", 30,
                   stdin="line\n")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "SLAVE_NOT_AVAILABLE" in result.stderr and "nothing was stored" in result.stderr
    assert "outcome is unknown" not in result.stderr, result.stderr
    assert left.call(lambda: master.store.written_position) == end  # (nothing stored)


def test_master_slave_topics_go_to_their_master(cluster: Any) -> None:
    controllers = cluster.addresses(CONTROLLERS)
    change_metadata(controllers, {"kind": "create_topic", "name": "audit", "partitions": 1,
                                  "replication_factor": 3, "layer": "master_slave"})
    with ClusterClient(_brokers(cluster), retry_timeout_s=60) as client:
        sent = [b"all", b"one", b"none", b"last"]
        for body, acks in zip(sent, ("all", 1, 0, "all"), strict=True):
            assert client.produce("audit", body, partition=0, acks=acks).status \
                is PutStatus.PUT_OK
        assert [record.body for record in client.fetch("audit", 0, 0, 100)] == sent


def test_threads_sharing_a_client_take_turns_and_store_every_record_once(
        cluster: Any) -> None:
    """Four threads produce through one ClusterClient (Kafka's producer is shared so):
    each call holds the client's lock. Before, 2 calls in 1,200 failed with a raw
    ValueError from a pipeline another thread had changed under them; some runs hung)."""
    failures: list[BaseException] = []
    with ClusterClient(_brokers(cluster), retry_timeout_s=60) as client:
        _first_write(client)

        def produce(thread: int) -> None:
            try:
                for index in range(250):
                    body = f"{thread}:{index}".encode()
                    if index % 2:
                        assert client.produce("orders", body, partition=0).status is \
                            PutStatus.PUT_OK
                    else:
                        client.send("orders", body, partition=0).result()
            except BaseException as error:  # (reported below, with its thread)
                failures.append(error)
        threads = [threading.Thread(target=produce, args=(thread,)) for thread in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads), "a producer hangs"
        assert failures == []
        stored = [record.body for record in client.fetch("orders", 0, 0, 2000)]
    expected = {f"{thread}:{index}".encode() for thread in range(4) for index in range(250)}
    assert stored[0] == b"first" and sorted(stored[1:]) == sorted(expected)
    for thread in range(4):  # each thread's records in the order it sent them
        mine = [body for body in stored if body.startswith(f"{thread}:".encode())]
        assert mine == [f"{thread}:{index}".encode() for index in range(250)]


def test_a_fetch_meant_for_the_leader_is_not_served_by_a_follower(
        cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer's fetch goes to the leader its view shows; a view that still shows a
    follower (a NotLeader answer named the new leader, so produces went there, but the
    cached view kept the old one) sent it to that follower, which served what lay below
    its own high watermark: after an acks=all write, none of it (test_controller_cluster's
    topic created again, about one run in three). Now such a fetch says it is meant for
    the leader (as Kafka's consumer fetch without a preferred replica); a follower
    refuses it, naming the leader, and the client reads there."""
    with ClusterClient(_brokers(cluster), retry_timeout_s=60) as client:
        _first_write(client)
        leader, followers = _leader(cluster, client)
        with Client(cluster.configs[followers[0]].listen, group="orders-0") as raw:
            with pytest.raises(errors.NotLeader, match=f"the leader is {leader}") as refused:
                raw.fetch("orders", 0, leader_only=True)
            assert refused.value.leader_address == cluster.configs[leader].listen
            # Without leader_only a follower serves what lies below its high watermark:
            # the first write, once its fetches have learnt it is committed.
            wait_until(lambda: [r.body for r in raw.fetch("orders", 0)] == [b"first"],
                       "the follower serves the committed first write", 30)
        stale = cluster.configs[followers[0]].listen
        real = client._leader_address
        monkeypatch.setattr(client, "_leader_address", lambda topic, partition, failed,
                            tried=None: stale if failed is None else real(
                                topic, partition, failed, tried))
        retries = client.retries
        assert _bodies(client) == [b"first"]
        assert client.retries == retries + 1  # (refused there, read at the leader)
