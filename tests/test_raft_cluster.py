"""A real Raft group: three `mqlog node` processes on 127.0.0.1, every link between them
through a fault-injecting proxy, under continuous idempotent writes while the leader is
SIGKILLed, SIGSTOPped, and cut off from its peers. Nothing acknowledged may be lost,
nothing stored twice, and the logs must be byte-identical once healed. The time from
each leader loss to the next successful write (the unavailability window) is printed."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import mqlog
from mqlog.replication.local import LocalRaftCluster, wait_until
from mqlog.results import PutStatus
from tests.faultproxy import FaultProxy


@dataclass
class Writer:
    """Writes records "w<i>" one after another through a GroupClient, noting each ack."""

    addresses: list[str]
    acked: dict[bytes, int] = field(default_factory=dict)  # body -> position
    acks: list[tuple[float, float]] = field(default_factory=list)  # (sent, acknowledged)
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    retries: int = 0

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="raft-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with mqlog.GroupClient(self.addresses, retry_timeout_s=30, timeout_s=2) as client:
            index = 0
            while not self.stop.is_set():
                body = f"w{index}".encode()
                sent = time.monotonic()
                try:
                    result = client.produce("orders", body)
                except mqlog.errors.MqlogError as error:
                    self.failures.append(f"{body!r}: {error}")
                    return
                if result.status is PutStatus.PUT_OK:
                    self.acked[body] = result.position
                    self.acks.append((sent, time.monotonic()))
                index += 1
            self.retries = client.retries

    def finish(self) -> None:
        self.stop.set()
        assert self.thread is not None
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "the writer did not stop"

    def wait_for_more(self, count: int, what: str) -> None:
        """Wait until ``count`` more writes are acknowledged than now (or one failed)."""
        target = len(self.acked) + count
        wait_until(lambda: len(self.acked) >= target or bool(self.failures), what)
        assert not self.failures, self.failures

    def acked_after(self, moment: float) -> float:
        """Seconds from ``moment`` to the ack of the first write sent after it: a write
        caught in flight by the fault is acknowledged only once a leader is back."""
        wait_until(lambda: any(sent > moment for sent, _ in self.acks[-50:]) or
                   bool(self.failures), "a write sent and acknowledged after the fault", 60)
        assert not self.failures, self.failures
        return min(acked for sent, acked in self.acks if sent > moment) - moment


@pytest.fixture
def proxied_cluster(tmp_path: Path):
    cluster = LocalRaftCluster(tmp_path / "raft")
    cluster.assign_ports()
    proxies = {}
    try:
        for source in cluster.names:
            for target in cluster.names:
                if source != target:
                    proxies[source, target] = FaultProxy(cluster.address(target))
                    cluster.links[source, target] = proxies[source, target].address
        cluster.start_all()
        yield cluster, proxies
    finally:
        cluster.stop_all()
        for proxy in proxies.values():
            proxy.close()


def _links_of(name: str, proxies: dict) -> list[FaultProxy]:
    return [proxy for (source, target), proxy in proxies.items() if name in (source, target)]


def test_a_raft_group_survives_kill_pause_and_partition(proxied_cluster):
    cluster, proxies = proxied_cluster
    cluster.wait_leader()
    writer = Writer(cluster.addresses)
    writer.start()
    windows = {}
    try:
        writer.wait_for_more(50, "first writes")

        leader = cluster.wait_leader()  # 1. SIGKILL: the process and its page cache state
        lost_at = time.monotonic()
        cluster.kill(leader)
        windows["SIGKILL"] = writer.acked_after(lost_at)
        cluster.start(leader)

        leader = cluster.wait_leader()  # 2. SIGSTOP: alive but silent, then back
        others = [name for name in cluster.names if name != leader]
        lost_at = time.monotonic()
        cluster.pause(leader)
        windows["SIGSTOP"] = writer.acked_after(lost_at)
        cluster.resume(leader)

        leader = cluster.wait_leader(others)  # 3. cut off from its peers by the proxies
        lost_at = time.monotonic()
        for proxy in _links_of(leader, proxies):
            proxy.blackhole()
        windows["partition"] = writer.acked_after(lost_at)
        for proxy in _links_of(leader, proxies):
            proxy.heal()
        writer.wait_for_more(50, "writes after healing")
    finally:
        writer.finish()
    assert not writer.failures, writer.failures
    print("\nunavailability windows (leader loss to next acknowledged write): "
          + ", ".join(f"{fault} {seconds * 1000:.0f} ms" for fault, seconds in windows.items())
          + f"; {len(writer.acked)} writes acknowledged, {writer.retries} retries")
    cluster.wait_converged()
    cluster.stop_all()
    _check_logs(cluster, writer.acked)


def _promoted(client: mqlog.Client, voters: list[str]) -> bool:
    """Promote the learner once the leader sees it caught up."""
    try:
        return client.change_membership(voters)["status"] == "PUT_OK"
    except mqlog.errors.MembershipChangeRefused:
        return False


def _check_logs(cluster: LocalRaftCluster, acked: dict[bytes, int]) -> None:
    images, bodies = [], []
    for name in cluster.names:
        with mqlog.open(cluster.root / name, read_only=True) as store:
            images.append(_image(store))
            bodies.append([record.body for record in _records(store)])
    assert images[0] == images[1] == images[2], "the healed logs differ"
    stored = bodies[0]
    duplicates = {body for body in stored if stored.count(body) > 1}
    assert not duplicates, f"stored twice: {sorted(duplicates)[:5]}"
    with mqlog.open(cluster.root / cluster.names[0], read_only=True) as store:
        for body, position in acked.items():
            assert store.read_record(position).body == body, f"acknowledged {body!r} lost"


def _records(store) -> list:
    records, offset = [], 0
    while batch := store.get("orders", 0, offset, 1000):
        records += batch
        offset = batch[-1].offset + 1
    return records


def _image(store) -> bytes:
    chunks, position = [], store.first_segment_base()
    while position < store.written_position:
        chunks.append(store.read_raw(position, 1 << 20))
        position += len(chunks[-1])
    return b"".join(chunks)


def test_membership_changes_one_voter_at_a_time(tmp_path: Path):
    """A fourth node joins as a learner, catches up, is promoted to voter; then the
    leader is removed from the voters and steps down; writes go on throughout."""
    with LocalRaftCluster(tmp_path / "raft") as cluster:
        leader = cluster.wait_leader()
        writer = Writer(cluster.addresses)
        writer.start()
        try:
            writer.wait_for_more(20, "writes")
            cluster.add_learner_process("n4")
            with mqlog.Client(cluster.address(leader)) as client:
                with pytest.raises(mqlog.errors.MembershipChangeRefused):
                    client.change_membership(cluster.names + ["n4"])  # not a learner yet
                client.change_membership(cluster.names, ["n4"],
                                         {"n4": cluster.address("n4")})
                wait_until(lambda: _promoted(client, cluster.names + ["n4"]),
                           "n4 to catch up and be promoted")
                remaining = [name for name in cluster.names + ["n4"] if name != leader]
                client.change_membership(remaining)
            new_leader = cluster.wait_leader(remaining)
            assert cluster.metadata(new_leader)["voters"] == remaining
            assert cluster.metadata(leader)["role"] != "LEADER"
            writer.wait_for_more(20, "writes after the changes")
        finally:
            writer.finish()
        assert not writer.failures, writer.failures
        wait_until(lambda: len({cluster.metadata(name)["written"]
                                for name in remaining}) == 1, "the voters to converge")
        cluster.stop_all()
    with mqlog.open(cluster.root / "n4", read_only=True) as store:
        for body, position in writer.acked.items():
            assert store.read_record(position).body == body, f"n4 lacks {body!r}"


def test_the_cluster_commands_drive_a_raft_group(tmp_path: Path):
    """`mqlog cluster status | transfer | membership` against three node processes."""
    from tests.test_cli import run

    with LocalRaftCluster(tmp_path / "raft") as cluster:
        leader = cluster.wait_leader()
        status = run("cluster", "status", *cluster.addresses, "--json")
        rows = {row["node"]: row for row in json.loads(status.stdout)}
        assert rows[leader]["role"] == "LEADER" and rows[leader]["leader"] == leader
        assert {row["epoch"] for row in rows.values()} == {rows[leader]["epoch"]}
        assert {row["log_start"] for row in rows.values()} == {0}  # nothing retained yet
        target = next(name for name in cluster.names if name != leader)
        run("cluster", "transfer", cluster.address(leader), "--to", target)
        wait_until(lambda: cluster.leader() == target, f"{target} to lead")
        refused = run("cluster", "membership", cluster.address(target),
                      "--voters", target, check=False)
        assert refused.returncode != 0
        assert "one voter per change" in refused.stderr


def _log_start(cluster: LocalRaftCluster, name: str) -> int:
    segments = sorted((cluster.root / name / "commitlog").glob("[0-9]*"))
    return int(segments[0].name) if segments else 0


def test_a_follower_behind_the_leaders_retention_starts_over(tmp_path: Path):
    """A follower down while its peers' retention let the log's front go is reset to the
    leader's log start when it returns (LogReset) and catches up from there: its log is
    then byte-identical to the leader's from that start."""
    settings = ("segment_size_bytes = 65536\nflush_mode = \"sync\"\nretention_ms = -1\n"
                "retention_bytes = 131072\nretention_check_interval_ms = 100\n"
                "message_size_bytes_max = 16384")
    with LocalRaftCluster(tmp_path / "raft", store_settings=settings) as cluster:
        leader = cluster.wait_leader()
        away = next(name for name in cluster.names if name != leader)
        cluster.kill(away)
        away_end = _log_start(cluster, away) + 65536  # its log ends within its first segment
        with mqlog.GroupClient([cluster.address(leader)]) as client:
            for index in range(120):
                assert client.produce_batch("orders", [bytes([index]) * 4000] * 2).status \
                    is PutStatus.PUT_OK
        wait_until(lambda: _log_start(cluster, leader) > away_end, "the leader's retention")
        start = _log_start(cluster, leader)
        cluster.start(away)
        end = cluster.metadata(leader)["written"]
        wait_until(lambda: cluster.metadata(away)["written"] == end, f"{away} to catch up")
        assert _log_start(cluster, away) >= start
        assert cluster.metadata(away)["log_start"] == _log_start(cluster, away)
        cluster.stop_all()
    with mqlog.open(cluster.root / leader, read_only=True) as ours, \
            mqlog.open(cluster.root / away, read_only=True) as theirs:
        common = max(ours.first_segment_base(), theirs.first_segment_base())
        assert theirs.written_position == ours.written_position == end
        position = common
        while position < end:
            data = ours.read_raw(position, 1 << 20)
            assert theirs.read_raw(position, 1 << 20) == data, f"they differ at {position}"
            position += len(data)


def test_a_follower_that_stops_reading_costs_the_leader_bounded_memory(tmp_path):
    """Issue 13, finding 5: a follower that stops reading (SIGSTOP) made its leader resend
    its whole in-flight window every retransmit, into an unbounded send buffer. Now at
    most ``peer_send_bytes_max`` is queued toward it (plus the one batch that found it
    empty); the rest is dropped and counted, and the follower catches up once resumed."""
    limit, window = 1 << 20, 512 * 1024
    settings = (f"election_timeout_ticks = 30\nheartbeat_ticks = 5\nretransmit_ticks = 3\n"
                f"peer_send_bytes_max = {limit}\ninflight_bytes_max = {window}\n"
                f"append_bytes_max = {64 * 1024}")
    with LocalRaftCluster(tmp_path / "raft", node_settings=settings) as cluster:
        leader = cluster.wait_leader()
        stopped = next(name for name in cluster.names if name != leader)
        cluster.pause(stopped)
        try:
            with mqlog.Client(cluster.address(leader), timeout_s=30) as client:
                for _ in range(40):
                    status = client.produce_batch("t", [b"x" * 10_000] * 10).status
                    assert status is PutStatus.PUT_OK
            wait_until(lambda: cluster.metadata(leader)["send_dropped"].get(stopped, 0) > 0,
                       "the leader to drop messages toward the stopped follower", 60)
            queued = cluster.metadata(leader)["send_queued"].get(stopped, 0)
            assert queued <= limit + window + 64 * 1024, queued
        finally:
            cluster.resume(stopped)
        cluster.wait_converged()
