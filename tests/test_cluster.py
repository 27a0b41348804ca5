"""A real master-slave cluster: three `mqlog node` processes on 127.0.0.1.

Under continuous load the master is killed with SIGKILL and restarted. With a
SYNC_MASTER every record acknowledged PUT_OK is, at the end, on the master and both
slaves, at the same position, byte for byte. With an ASYNC_MASTER the test counts the
acknowledged records that were on no slave when the master died (read from the slaves'
live stores through read-only snapshots) and shows they are back once the master
restarted with its disk.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import mqlog
from mqlog import errors
from mqlog.replication.local import LocalCluster, wait_until
from mqlog.results import PutStatus
from tests.processes import store_image

MQLOG = Path(sys.executable).parent / "mqlog"
NODES = ("m", "s1", "s2")
TIMEOUT_S = 60


def _metadata(address: str) -> dict:
    with mqlog.Client(address, timeout_s=10) as client:
        return client.metadata()


class Producer(threading.Thread):
    """Produces unique records to the master until stopped; remembers every PUT_OK."""

    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.acked: list[tuple[int, bytes]] = []  # (position, body)
        self.stopping = threading.Event()
        self.errors = 0
        self.count = 0

    def run(self) -> None:
        client = None
        while not self.stopping.is_set():
            try:
                client = client or mqlog.Client(self.cluster.address("m"), timeout_s=10)
                self.count += 1
                body = f"record-{self.count}".encode() * 4
                result = client.produce("orders", body, queue_id=self.count % 4)
                if result.status is PutStatus.PUT_OK:
                    self.acked.append((result.position, body))
            except errors.MqlogError:
                self.errors += 1  # the master is down: outcome unknown, not acked
                if client is not None:
                    client.close()
                client = None
                self.stopping.wait(0.02)
        if client is not None:
            client.close()

    def wait_for(self, count: int) -> None:
        wait_until(lambda: len(self.acked) >= count or not self.is_alive(),
                   f"{count} acknowledged records", TIMEOUT_S)
        assert self.is_alive()


def _present(store_path: Path, acked: list[tuple[int, bytes]]) -> set[int]:
    """Positions of acked records present in a store, read through a snapshot."""
    found = set()
    with mqlog.open(store_path, read_only=True, segment_size_bytes=16 << 20) as store:
        for position, body in acked:
            try:
                if store.read_record(position).body == body:
                    found.add(position)
            except errors.MqlogError:
                pass
    return found


def _run_kill_restart(tmp_path: Path, role: str) -> tuple[list, int, int]:
    cluster = LocalCluster(tmp_path, role, store_settings="segment_size_bytes = 16777216")
    cluster.write_configs()
    producer = Producer(cluster)
    try:
        for name in NODES:
            cluster.start(name)
        producer.start()
        producer.wait_for(200)
        wait_until(lambda: cluster.metadata("s1")["written"] > 0, "s1 to receive records")
        producer.wait_for(len(producer.acked) + 200)
        cluster.kill("m")
        acked_at_kill = list(producer.acked)
        on_no_slave = [item for item in acked_at_kill if item[0] not in
                       _present(tmp_path / "s1", acked_at_kill) |
                       _present(tmp_path / "s2", acked_at_kill)]
        cluster.start("m")
        producer.wait_for(len(acked_at_kill) + 200)
        producer.stopping.set()
        producer.join(timeout=60)
        cluster.wait_converged()
        status = subprocess.run([str(MQLOG), "cluster", "status", "--json",
                                 *(cluster.address(name) for name in NODES)],
                                capture_output=True, text=True, timeout=60, check=True)
        roles = [row["role"] for row in json.loads(status.stdout)]
        assert roles == [role, "SLAVE", "SLAVE"], roles
    finally:
        producer.stopping.set()
        cluster.stop_all()
    return producer.acked, len(on_no_slave), len(acked_at_kill)


@pytest.mark.skipif(not MQLOG.exists(), reason="the mqlog console script is not installed")
def test_sync_master_killed_loses_no_acknowledged_record(tmp_path):
    acked, _, _ = _run_kill_restart(tmp_path, "SYNC_MASTER")
    for name in NODES:
        present = _present(tmp_path / name, acked)
        missing = [position for position, _ in acked if position not in present]
        assert not missing, f"{name} lacks acknowledged records at {missing[:10]}"
    images = {name: _image(tmp_path / name) for name in NODES}
    assert len(set(images.values())) == 1, "the replicas' logs differ"


@pytest.mark.skipif(not MQLOG.exists(), reason="the mqlog console script is not installed")
def test_async_master_killed_its_unreplicated_acks_return_with_it(tmp_path):
    acked, on_no_slave, at_kill = _run_kill_restart(tmp_path, "ASYNC_MASTER")
    print(f"ASYNC_MASTER: {on_no_slave} of the {at_kill} records acknowledged before the "
          "master died were on no slave then")
    for name in NODES:
        present = _present(tmp_path / name, acked)
        assert len(present) == len(acked), f"{name} lacks acknowledged records"


def _image(path: Path) -> bytes:
    return store_image(path, segment_size_bytes=16 << 20)


def test_node_config_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[node]\nid = "x"\nlisten = "127.0.0.1:1"\ndata_dir = "d"\nrole = "BOSS"\n')
    result = subprocess.run([str(MQLOG), "node", "--config", str(bad)], capture_output=True,
                            text=True, timeout=60, env={**os.environ})
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "role must be" in result.stderr


def test_operator_promotes_the_slave_ahead_and_the_old_master_rejoins_truncated(tmp_path):
    """With in_sync_slaves_min = 1 a SYNC_MASTER acks a record once one slave has it. s1
    goes down and the master acks 20 writes that only s2 has; s2 goes down and the
    master takes 20 writes with acks="master" (Kafka's acks=1: on the master only), then
    dies. The slaves restart. `mqlog cluster promote` refuses s1, which is behind s2,
    naming both positions; the operator promotes s2 and points s1 at it (mqlog cluster
    follow); later the old master restarts and is pointed at s2 too. It diverged — its
    20 extra records are in an epoch s2 never saw — so it is truncated to the common
    prefix. At the end every write acknowledged by a replica-waiting produce is on all
    three replicas, the 20 master-only writes are on none (that is what acks="master"
    risks), and the three logs are identical."""
    cluster = LocalCluster(tmp_path, "SYNC_MASTER", store_settings="segment_size_bytes = "
                                                                   "16777216")
    with cluster:
        wait_until(lambda: len(cluster.metadata("m")["slaves"]) == 2, "both slaves of m")
        acked = _produce(cluster.address("m"), "before", 100)
        cluster.kill("s1")
        acked += _produce(cluster.address("m"), "s2-only", 20)
        cluster.kill("s2")
        master_only = _produce(cluster.address("m"), "master-only", 20, acks="master")
        cluster.kill("m")
        cluster.start("s1")
        cluster.start("s2")
        behind, ahead = cluster.metadata("s1")["written"], cluster.metadata("s2")["written"]
        assert behind < ahead
        refusal = _cli_fails("cluster", "promote", cluster.address("s1"), "--slaves", "s2,m")
        assert f"s1's log ends at {behind}" in refusal, refusal
        assert f"s2's at {ahead}" in refusal and "--force would lose" in refusal, refusal
        assert "m: unreachable" in refusal, refusal
        assert cluster.metadata("s1")["role"] == "SLAVE"
        _cli("cluster", "promote", cluster.address("s2"), "--slaves", "s1,m")
        _cli("cluster", "follow", cluster.address("s1"), "--master", "s2")
        wait_until(lambda: cluster.metadata("s2")["slaves"], "s1 to follow s2")
        acked += _produce(cluster.address("s2"), "after", 100)
        cluster.start("m")
        _cli("cluster", "follow", cluster.address("m"), "--master", "s2")
        cluster.wait_converged()
        assert cluster.metadata("s2")["epoch"] == 2  # (m began epoch 1 when it started)
    for name in NODES:
        assert _present(tmp_path / name, acked) == {position for position, _ in acked}, name
        assert not _present(tmp_path / name, master_only), name
    assert len({_image(tmp_path / name) for name in NODES}) == 1


def _produce(address: str, label: str, count: int,
             acks: str = "replicated") -> list[tuple[int, bytes]]:
    acked = []
    with mqlog.Client(address, timeout_s=10) as client:
        for index in range(count):
            body = f"{label}-{index}".encode()
            result = client.produce("orders", body, queue_id=index % 3, acks=acks)
            assert result.status is PutStatus.PUT_OK, result.status
            acked.append((result.position, body))
    return acked


def _cli_fails(*args: str) -> str:
    """Run an mqlog command that must fail; its stderr."""
    result = subprocess.run([str(MQLOG), *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, (result.stdout, result.stderr)
    return result.stderr


def _cli(*args: str) -> str:
    result = subprocess.run([str(MQLOG), *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _facts(name: str, role: str, written: int, last_epoch: int = 0) -> dict:
    return {"node_id": name, "role": role, "epoch": last_epoch, "written": written,
            "last_epoch": last_epoch}


def test_promotion_risks_name_the_node_ahead_and_a_live_master():
    from mqlog.replication.master_slave.core import promotion_risks

    candidate = _facts("s1", "SLAVE", 1000)
    assert promotion_risks(candidate, [_facts("s2", "SLAVE", 1000)]) == []
    assert promotion_risks(candidate, [_facts("s2", "SLAVE", 4000, last_epoch=-1)]) == []
    [behind] = promotion_risks(candidate, [_facts("s2", "SLAVE", 1500)])
    assert "s1's log ends at 1000" in behind and "s2's at 1500" in behind
    assert "[1000, 1500) (500 bytes)" in behind and "--force would lose" in behind
    [newer] = promotion_risks(candidate, [_facts("s2", "FENCED", 800, last_epoch=2)])
    assert "records of epoch 2" in newer
    assert promotion_risks(_facts("m", "SYNC_MASTER", 900), [_facts("m", "SYNC_MASTER", 900)]
                           ) == []  # a waiting master vouched for: itself is no risk
    [master] = promotion_risks(candidate, [_facts("m", "SYNC_MASTER", 900)])
    assert "live SYNC_MASTER" in master and "two masters" in master


class GroupProducer(threading.Thread):
    """Writes unique records through a GroupClient (idempotent: producer id and
    sequence) to whichever node is master, until stopped; remembers every PUT_OK."""

    def __init__(self, addresses: list[str]) -> None:
        super().__init__(daemon=True)
        self.addresses = addresses
        self.acked: list[tuple[int, bytes]] = []
        self.stopping = threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        from mqlog.group_client import GroupClient

        count = 0
        try:
            with GroupClient(self.addresses, producer_id="failover", retry_timeout_s=120,
                             retry_backoff_ms=20, timeout_s=10) as client:
                while not self.stopping.is_set():
                    count += 1
                    body = f"failover-{count}".encode() * 3
                    result = client.produce("orders", body, queue_id=count % 4)
                    assert result.status is PutStatus.PUT_OK, result
                    self.acked.append((result.position, body))
        except BaseException as error:  # noqa: BLE001 - reported by the test
            self.failure = error

    def wait_for(self, count: int) -> None:
        wait_until(lambda: len(self.acked) >= count or not self.is_alive(),
                   f"{count} acknowledged records", TIMEOUT_S)
        assert self.is_alive(), self.failure


def _bodies(path: Path) -> list[bytes]:
    """Every record body of topic orders in a store (duplicates included)."""
    bodies = []
    with mqlog.open(path, read_only=True, segment_size_bytes=16 << 20) as store:
        for queue_id in range(4):
            offset = 0
            while records := store.get("orders", queue_id, offset, 4096, 1 << 24):
                bodies += [record.body for record in records]
                offset = records[-1].offset + 1
    return bodies


def test_sync_master_failover_and_return_lose_and_duplicate_nothing(tmp_path):
    """A SYNC_MASTER and two slaves under continuous idempotent writes (GroupClient over
    all three addresses). The master is SIGKILLed; the operator reads `mqlog cluster
    status`, promotes the slave furthest ahead and points the other at it, as
    docs/REPLICATION.md says; writes resume there. The old master restarts with its own
    TOML: it refuses writes (it has not heard from its slaves) until the operator
    makes it follow; it is truncated to the new master's log and catches up. No
    acknowledged write is missing anywhere, none is stored twice, and the three logs
    are byte-identical."""
    cluster = LocalCluster(tmp_path, "SYNC_MASTER", store_settings="segment_size_bytes = "
                                                                   "16777216")
    with cluster:
        addresses = [cluster.address(name) for name in NODES]
        producer = GroupProducer(addresses)
        wait_until(lambda: len(cluster.metadata("m")["slaves"]) == 2, "both slaves of m")
        producer.start()
        producer.wait_for(300)
        cluster.kill("m")
        rows = json.loads(_cli("cluster", "status", "--json", *addresses))
        slaves = sorted((row for row in rows if row["node"] in ("s1", "s2")),
                        key=lambda row: row["written"])
        behind, ahead = slaves[0]["node"], slaves[1]["node"]
        _cli("cluster", "promote", cluster.address(ahead), "--slaves", f"{behind},m")
        _cli("cluster", "follow", cluster.address(behind), "--master", ahead)
        producer.wait_for(len(producer.acked) + 300)
        cluster.start("m")
        [row] = json.loads(_cli("cluster", "status", "--json", cluster.address("m")))
        # Waiting for its slaves, or fenced already: they answered with the new epoch.
        assert row["role"] in ("SYNC_MASTER", "FENCED") and not row["accepts_writes"], row
        with mqlog.Client(cluster.address("m"), timeout_s=10) as client, \
                pytest.raises(errors.NotMaster, match="heard from its slaves|fenced"):
            client.produce("orders", b"to the old master", acks="master")
        _cli("cluster", "follow", cluster.address("m"), "--master", ahead)
        producer.wait_for(len(producer.acked) + 300)
        producer.stopping.set()
        producer.join(timeout=120)
        assert producer.failure is None, producer.failure
        cluster.wait_converged()
        roles = {row["node"]: row["role"] for row in json.loads(
            _cli("cluster", "status", "--json", *addresses))}
        assert roles == {ahead: "SYNC_MASTER", behind: "SLAVE", "m": "SLAVE"}, roles
    acked = producer.acked
    for name in NODES:
        bodies = _bodies(tmp_path / name)
        assert len(bodies) == len(set(bodies)), f"{name} holds a record twice"
        missing = {body for _, body in acked} - set(bodies)
        assert not missing, f"{name} lacks {len(missing)} acknowledged records"
        assert _present(tmp_path / name, acked) == {position for position, _ in acked}
    assert len({_image(tmp_path / name) for name in NODES}) == 1, "the logs differ"


def test_a_sync_master_without_slaves_stores_nothing_and_producers_are_idempotent(tmp_path):
    """SYNC_MASTER with no slave in sync: SLAVE_NOT_AVAILABLE, position -1, and its log
    does not grow (a retry is safe). Once a slave is in sync, a write retried with the
    same producer id and sequence is answered with the first write's place and stored
    once."""
    cluster = LocalCluster(tmp_path, "SYNC_MASTER", slave_count=1,
                           store_settings="segment_size_bytes = 16777216")
    cluster.write_configs()
    try:
        cluster.start("m")
        with mqlog.Client(cluster.address("m"), timeout_s=10) as client:
            refused = client.produce("orders", b"no slave yet", producer=("p", 1))
            assert (refused.status, refused.position) == (PutStatus.SLAVE_NOT_AVAILABLE, -1)
            assert cluster.metadata("m")["written"] == 0
            cluster.start("s1")
            wait_until(lambda: cluster.metadata("m")["slaves"], "s1 to follow m")
            first = client.produce("orders", b"once", producer=("p", 1))
            written = cluster.metadata("m")["written"]
            again = client.produce("orders", b"once", producer=("p", 1))
            assert first.status is again.status is PutStatus.PUT_OK
            assert again.position == first.position == 0
            assert cluster.metadata("m")["written"] == written
    finally:
        cluster.stop_all()


def test_role_commands_with_bad_arguments_get_typed_errors_and_change_nothing(tmp_path):
    """promote with an epoch no u64 can add one to (the node served, then failed at every
    start), follow naming an unhashable master (a TypeError answer): typed refusals, and
    the node keeps its role and epoch."""
    cluster = LocalCluster(tmp_path, "SYNC_MASTER", slave_count=1,
                           store_settings="segment_size_bytes = 16777216")
    cluster.write_configs()
    try:
        cluster.start("s1")
        before = cluster.metadata("s1")
        with mqlog.Client(cluster.address("s1"), timeout_s=10) as client:
            for header in ({"kind": "promote", "slaves": [], "epoch": (1 << 64) - 1},
                           {"kind": "promote", "slaves": [], "epoch": 1 << 62},
                           {"kind": "follow", "master": ["m"]},
                           {"kind": "follow", "master": {"m": 1}}):
                with pytest.raises(errors.InvalidArgument):
                    client.call(header)
        after = cluster.metadata("s1")
        assert (after["role"], after["epoch"]) == (before["role"], before["epoch"])
    finally:
        cluster.stop_all()


def test_a_request_after_one_stored_in_part_is_refused_and_stores_nothing(tmp_path):
    """A pipelined request names the one before it (``previous``) and its record count
    (``previous_count``): a leader holding a copy of that one cut inside it (a new
    leader's, PartiallyStored to its retry) refuses the next with SequenceGap, nothing
    stored. It was stored after the cut, so the records the client then sent again came
    after it, out of the order they were sent in (helper-41). The cut copy is made as in
    the test below: the request's first record alone, with its producer tag."""
    from mqlog.client import produce_request

    cluster = LocalCluster(tmp_path, "SYNC_MASTER", slave_count=1,
                           store_settings="segment_size_bytes = 16777216")
    cluster.write_configs()
    try:
        cluster.start("m")  # (alone: acks=1 writes only)
        with mqlog.Client(cluster.address("m"), timeout_s=30) as client:
            assert client.produce("orders", b"first", acks="1",
                                  producer=("p", 7)).status is PutStatus.PUT_OK
            written = cluster.metadata("m")["written"]
            header, payload = produce_request("orders", [b"next"], acks="1",
                                              producer=("p", 8))
            with pytest.raises(errors.SequenceGap, match="holds 1 of 3 records"):
                client.call({**header, "previous": 7, "previous_count": 3}, payload)
            assert cluster.metadata("m")["written"] == written  # (nothing stored)
            for bad in (0, "3", True):
                with pytest.raises(errors.InvalidArgument, match="previous_count"):
                    client.call({**header, "previous": 7, "previous_count": bad}, payload)
            # (the copy is whole to a sender whose request had one record)
            whole = client.call({**header, "previous": 7, "previous_count": 1}, payload)
            assert PutStatus(whole[0]["status"]) is PutStatus.PUT_OK
    finally:
        cluster.stop_all()


def test_records_a_peer_sends_that_the_store_refuses_stop_no_broker(tmp_path):
    """A peer (said to be the master: its broker id, the cluster's id) sends a slave one
    well-formed Append at its log's end whose payload is no record. The store refused it
    (nothing stored) inside the slave's Ready, and the driver stopped the whole broker,
    every group with it (helper-42). The group's core starts over from its store
    instead: the broker lives, and the real master's next records reach it."""
    import socket

    from mqlog.replication import messages
    from mqlog.replication.wire import encode_frame

    cluster = LocalCluster(tmp_path, "ASYNC_MASTER", slave_count=1,
                           store_settings="segment_size_bytes = 16777216")
    try:
        cluster.start_all()
        with mqlog.Client(cluster.address("m"), timeout_s=30) as client:
            client.produce("orders", b"before")
            cluster.wait_converged()
            facts = cluster.metadata("s1")
            host, port = cluster.address("s1").rsplit(":", 1)
            with socket.create_connection((host, int(port))) as peer:
                peer.sendall(encode_frame({"kind": "peer_hello", "broker_id": "m",
                                           "cluster_id": ""}))
                garbage = messages.Append("m", "s1", facts["epoch"], facts["written"],
                                          payload=bytes(64))
                peer.sendall(messages.encode(garbage))
                wait_until(lambda: cluster.metadata("s1")["peer_records_refused"] == 1,
                           "s1 to refuse the records", 30)
            client.produce("orders", b"after")
            cluster.wait_converged()  # (s1 took the master's records after it)
        assert cluster.processes["s1"].poll() is None
    finally:
        cluster.stop_all()


def test_records_a_store_keeps_refusing_restart_its_core_ever_more_slowly(tmp_path):
    """A slave whose segments are too small for a record its master stored (a lasting
    mismatch: here 64 KiB segments, a 100 KB record) refuses that record at every
    Append. Its core started over at once each time, so the group spun: a fetch, a
    refusal and a new core, as fast as the loopback went. Now the new core waits 2, 4,
    8... ticks while the refusals go on with nothing stored between them: the 6th and
    7th refusals (160 + 320 ms of waits at 10 ms ticks) take 0.4 s at least, where the
    spin took milliseconds. (A loaded machine only makes the wait longer.)"""
    cluster = LocalCluster(tmp_path, "ASYNC_MASTER", slave_count=1,
                           store_settings="segment_size_bytes = 16777216")
    try:
        cluster.write_configs()
        slave_config = cluster.root / "s1.toml"
        slave_config.write_text(slave_config.read_text().replace(
            "segment_size_bytes = 16777216",
            "segment_size_bytes = 65536\nmessage_size_bytes_max = 1024"))
        for name in cluster.names:
            cluster.start(name)
        with mqlog.Client(cluster.address("m"), timeout_s=30) as client:
            client.produce("orders", b"small")
            cluster.wait_converged()
            client.produce("orders", b"x" * 100_000)

        def refusals() -> int:
            return int(cluster.metadata("s1")["peer_records_refused"])

        wait_until(lambda: refusals() >= 5, "s1 to refuse the record 5 times", 60)
        started = time.monotonic()
        wait_until(lambda: refusals() >= 7, "s1 to refuse it twice more", 60)
        assert time.monotonic() - started >= 0.4, "the refusals did not wait"
        assert cluster.metadata("s1")["peer_records_refused_in_a_row"] >= 7
        assert cluster.processes["s1"].poll() is None
    finally:
        cluster.stop_all()


def test_a_replica_held_after_refusals_answers_an_election_at_once():
    """A replica held after refusals (the test above) took a vote or pre-vote request in
    and sent its answer only when the hold ended: a Raft failover that needed its vote
    took 7.9 s instead of 0.4 (helper-57). An election's message ends the hold at once,
    and so does a new role seen at a tick; a peer's other messages wait. (The
    node's own took and tick, over stand-ins.)"""
    from types import SimpleNamespace

    from mqlog.replication import messages
    from mqlog.replication.node import Node

    class Hold:
        cancelled = False

        def cancel(self) -> None:
            self.cancelled = True

    node = object.__new__(Node)  # (only what took and tick touch)
    scheduled: list[bool] = []
    node._schedule = lambda: scheduled.append(node._hold is None)
    core = SimpleNamespace(epoch=3, role="FOLLOWER", tick_count=0, has_ready=lambda: False)
    node.driver = SimpleNamespace(core=core, tick=lambda: None, failure=None)
    node.isr, node._tick_callbacks, node._held_as = False, [], "FOLLOWER"
    for message, ends in ((messages.Append("m", "s1", 3, 0, payload=b""), False),
                          (messages.Vote("b1", "b3", 4, 100, 3, True, False), True),
                          (messages.TimeoutNow("b1", "b3", 3), True)):
        hold = node._hold = Hold()
        node.took(message)
        assert hold.cancelled == ends and (node._hold is None) == ends, message
        assert scheduled[-1] == ends  # (a run asked for; it goes only once unheld)
        scheduled.clear()
    hold = node._hold = Hold()
    node.tick()
    core.epoch = 4  # (a new leader's term: its records are refused again, so it waits)
    node.tick()
    assert not hold.cancelled
    core.role = "CANDIDATE"  # (its own election timer: its vote requests go now)
    node.tick()
    assert hold.cancelled and node._hold is None and scheduled == [True]  # (_release's)


def test_a_retry_cut_on_the_master_is_refused_only_once_its_copy_is_committed(tmp_path):
    """A master whose log holds the first record only of a three-record request (its copy
    as a replica was cut inside the request, and the node that had it all failed before
    answering; here that copy is made by sending the first record alone, acks=1, with
    the request's producer id and sequence, while the slave is stopped). The retry was
    refused at once with PartiallyStored ("one stored, send the other two"), though that
    record was on no slave: had this master failed then, it was lost, and the client
    never sent it again. Now the retry waits for the layer's verdict like a new write;
    only once the slave has the record is it refused, naming the count, and nothing is
    stored twice."""
    bodies = [b"first" * 20, b"second" * 20, b"third" * 20]
    cluster = LocalCluster(tmp_path, "SYNC_MASTER", slave_count=1,
                           store_settings="segment_size_bytes = 16777216")
    try:
        cluster.start_all()
        wait_until(lambda: cluster.metadata("m")["slaves"], "s1 to follow m")
        cluster.pause("s1")
        with mqlog.Client(cluster.address("m"), timeout_s=30) as client:
            cut = client.produce("orders", bodies[0], acks="1", producer=("p", 7))
            assert cut.status is PutStatus.PUT_OK
            written = cluster.metadata("m")["written"]
            waited = client.produce_batch("orders", bodies, producer=("p", 7))
            assert waited.status is not PutStatus.PUT_OK  # (no slave has it: not committed)
            cluster.resume("s1")
            wait_until(lambda: cluster.metadata("s1")["written"] == written,
                       "s1 to catch up")
            with pytest.raises(errors.PartiallyStored, match="1 of its 3 records") as refused:
                client.produce_batch("orders", bodies, producer=("p", 7))
            assert refused.value.count == 1
            assert cluster.metadata("m")["written"] == written  # (stored once)
    finally:
        cluster.stop_all()


def _master_alone(tmp_path: Path) -> LocalCluster:
    """A SYNC_MASTER m of one slave s1, m started alone (a standalone group: no
    [controller] table)."""
    cluster = LocalCluster(tmp_path, "SYNC_MASTER", slave_count=1,
                           store_settings="segment_size_bytes = 16777216")
    cluster.write_configs()
    cluster.start("m")
    return cluster


def test_a_standalone_node_is_named_as_no_clusters_broker_at_once(tmp_path):
    """New-user review: `mqlog produce|consume -b NODE` of a standalone node (a
    ClusterClient) waited its retry timeout, then said "no broker answered
    cluster_metadata: ...: unknown request kind 'cluster_metadata'". Now NotABroker at
    once, naming it a standalone node and what to use instead."""
    cluster = _master_alone(tmp_path)
    try:
        address = cluster.address("m")
        started = time.monotonic()
        with mqlog.ClusterClient([address], retry_timeout_s=30) as client, \
                pytest.raises(errors.NotABroker, match="a standalone node") as failed:
            client.produce("orders", b"x")
        assert time.monotonic() - started < 20  # (not retry_timeout_s: at once)
        assert failed.value.addresses == failed.value.standalone == [address]
        assert "unknown request kind" not in str(failed.value)
        for command in ("produce", "consume"):
            result = subprocess.run([MQLOG, command, "-b", address, "-t", "orders",
                                     "--timeout-s", "30"], input="x\n", capture_output=True,
                                    text=True, timeout=120)
            lines = result.stderr.strip().splitlines()
            assert result.returncode == 1 and len(lines) == 1, result.stderr
            for said in (f"{address} is not a cluster's broker but a standalone node",
                         "mqlog.Client(ADDRESS) or mqlog.GroupClient",
                         "`mqlog consume DATA_DIR`"):
                assert said in lines[0], lines[0]
        assert cluster.metadata("m")["written"] == 0
    finally:
        cluster.stop_all()


def test_a_group_client_write_no_slave_took_says_nothing_was_stored(tmp_path):
    """New-user review: a GroupClient write to a SYNC_MASTER with no slave in sync
    (SLAVE_NOT_AVAILABLE, nothing stored) was sent again until retry_timeout_s and then
    raised as "outcome unknown". Now SlaveNotAvailable (a NotEnoughReplicas), saying
    nothing was stored."""
    cluster = _master_alone(tmp_path)
    try:
        with mqlog.GroupClient([cluster.address("m")], retry_timeout_s=0.5) as group, \
                pytest.raises(errors.SlaveNotAvailable, match="nothing was stored") as refused:
            group.produce("orders", b"no slave in sync")
        assert isinstance(refused.value, errors.NotEnoughReplicas)
        assert "outcome is unknown" not in str(refused.value)
        assert cluster.metadata("m")["written"] == 0
    finally:
        cluster.stop_all()


def test_produce_answers_carry_the_store_time_and_size(tmp_path):
    """New-user review: Client and GroupClient answered PutResult(..., store_timestamp=0,
    size=0), though the README documents both. Now the node's, as the store's records
    have them (a batch: its records' bytes, one store time); a retry answered from the
    stored copy, the same; acks=0: -1 (nothing known); a node that does not send them:
    -1."""
    cluster = LocalCluster(tmp_path, "SYNC_MASTER", slave_count=1,
                           store_settings="segment_size_bytes = 16777216")
    cluster.write_configs()
    try:
        cluster.start_all()
        address = cluster.address("m")
        wait_until(lambda: cluster.metadata("m")["slaves"], "s1 to follow m")
        with mqlog.GroupClient([address], retry_timeout_s=60) as group, \
                mqlog.Client(address, timeout_s=10) as client:
            one = group.produce("orders", b"one")
            batch = client.produce_batch("orders", [b"two", b"three"])
            tag = ("p", 1, mqlog.new_producer_epoch())
            first = client.produce("orders", b"four", producer=tag)
            again = client.produce("orders", b"four", producer=tag)  # (the stored copy's)
            assert again == first
            records = client.fetch("orders", 0, 0, 100)
            assert [record.body for record in records[:4]] == [b"one", b"two", b"three",
                                                               b"four"]
            for result, whole in ((one, records[:1]), (batch, records[1:3]),
                                  (first, records[3:4])):
                assert result.status is PutStatus.PUT_OK
                assert result.store_timestamp == whole[0].store_timestamp > 0
                assert {record.store_timestamp for record in whole} == \
                    {result.store_timestamp}  # (one store time per request)
                assert result.size == sum(record.size for record in whole) > 0
                assert result.end_position == whole[-1].end_position
            assert client.produce("orders", b"five", acks=0)[3:] == (-1, -1)
    finally:
        cluster.stop_all()
    from mqlog.client import put_result

    older = put_result({"status": "PUT_OK", "position": 5, "offset": 1, "count": 1})
    assert older == (PutStatus.PUT_OK, 5, 1, -1, -1)
