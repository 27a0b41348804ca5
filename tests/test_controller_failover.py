"""Master-slave auto_failover (RocketMQ 5's controller mode) with real `mqlog node`
processes on 127.0.0.1: three in Kafka's combined mode (each a broker and a controller
voter), `[controller] auto_failover = true`, a master-slave topic of one partition x RF 3
(a SYNC_MASTER and two slaves, as the controller assigned them), and two writers
producing through GroupClient the whole time.

* one slave is paused (SIGSTOP) while the master acknowledges writes with the other, so
  one is behind; the master is SIGKILLed and the paused slave resumed: the controller
  fences the master and promotes the in-sync slave that is furthest ahead, in a new
  master epoch; the other slave follows it; writes continue;
* "never one behind": each slave's log end in the old epoch is sampled until the
  promotion; where the promoted slave's new epoch begins in the final log is at least
  every sample (a slave that held more and were made to follow would lose it);
* the old master restarted comes back as a slave of the new master (its unacknowledged
  tail, if any, truncated by epoch) and rejoins the sync state set;
* every acknowledged write is read back, no write fails, and the three logs are
  byte-identical once the writers stop.

Broken on purpose: MQLOG_CONTROLLER_TEST_BREAK=promote_behind makes the controller
promote the slave behind (test_promoting_the_slave_behind_is_caught)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import mqlog
from mqlog import errors
from mqlog.client import Client
from mqlog.group_client import GroupClient
from mqlog.replication.controller.records import PartitionInfo
from mqlog.replication.local import wait_until
from mqlog.results import PutStatus
from tests import processes
from tests.processes import (
    BROKERS,
    DEADLINE_S,
    Processes,
    change_metadata,
    cluster_state,
    store_image,
    use_core,
    wait_live_brokers,
    writing,
)

NAMES = BROKERS
TOPIC, GROUP = "pay", "pay-0"


class FailoverCluster(Processes):
    """The combined-mode processes of tests/processes.py, with auto_failover."""

    def write_configs(self) -> None:
        super().write_configs()
        for name in NAMES:
            path = self.root / f"{name}.toml"
            path.write_text(path.read_text() + "auto_failover = true\n")

    def group(self, name: str) -> dict[str, Any] | None:
        """broker ``name``'s status of the topic's group (None: it does not answer)."""
        try:
            return self.groups(name).get(GROUP)
        except errors.MqlogError:
            return None


class Writer(processes.Writer):
    """Produces to the topic through one GroupClient until told to finish; keeps what was
    acknowledged (PUT_OK: a slave has it) and every failure."""

    def __init__(self, cluster: FailoverCluster, label: str) -> None:
        super().__init__(label)
        self.cluster = cluster

    def run(self) -> None:
        with GroupClient(self.cluster.addresses(), group=GROUP,
                         retry_timeout_s=DEADLINE_S) as client:
            index = 0
            while not self.done.is_set():
                body = f"{self.label}-{index}".encode()
                try:
                    result = client.produce(TOPIC, body, 0)
                except errors.MqlogError as error:
                    self.failures.append(f"{body!r}: {error}")
                else:
                    if result.status is PutStatus.PUT_OK:
                        self.acknowledged(body)
                    else:
                        self.failures.append(f"{body!r}: {result.status}")
                index += 1


@pytest.fixture
def cluster(tmp_path: Path, impl: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The three processes, on the log core ``impl`` (MQLOG_PUREPYTHON is inherited)."""
    use_core(monkeypatch, impl)
    with FailoverCluster(tmp_path) as running:
        running.write_configs()
        for name in NAMES:
            running.start(name)
        yield running


def _partition(cluster: FailoverCluster) -> PartitionInfo:
    """The partition as described by a controller that has folded the topic's creation:
    the first to answer may be a follower not there yet ("no topic 'pay'")."""
    found: list[PartitionInfo] = []

    def known() -> bool:
        state = cluster_state(cluster.addresses())
        if TOPIC in state.topics:
            found.append(state.partition(TOPIC, 0))
        return bool(found)
    wait_until(known, f"a controller that knows topic {TOPIC!r}", DEADLINE_S)
    return found[-1]


def test_master_sigkilled_in_sync_slave_promoted_no_acked_write_lost(
        cluster: FailoverCluster) -> None:
    everyone = cluster.addresses()
    wait_live_brokers(everyone)
    change_metadata(everyone, {"kind": "create_topic", "name": TOPIC, "partitions": 1,
                       "replication_factor": 3, "layer": "master_slave"})
    created = _partition(cluster)
    master = created.leader
    slaves = [name for name in created.replicas if name != master]
    wait_until(lambda: set((cluster.group(master) or {}).get("slaves", ())) == set(slaves),
               f"{master} streaming to {slaves}", DEADLINE_S)
    with writing([Writer(cluster, label) for label in ("a", "b")], 30) as writers:
        wait_until(lambda: set(_partition(cluster).isr) == set(NAMES),
                   "every slave in the sync state set", DEADLINE_S)
        promoted, epoch, sampled = _kill_the_master(cluster, master, slaves, writers)
        cluster.start(master)  # back, as a slave of the new master
        wait_until(lambda: (cluster.group(master) or {}).get("leader") == promoted and
                   (cluster.group(master) or {}).get("role") == "SLAVE",
                   f"{master} back as a slave of {promoted}", DEADLINE_S)
        wait_until(lambda: master in _partition(cluster).isr,
                   f"{master} back in the sync state set", DEADLINE_S)
        for writer in writers:
            writer.wait_for_more(30)
    failures = [failure for writer in writers for failure in writer.failures]
    assert not failures, f"writes failed: {failures[:3]}"
    acked = [body for writer in writers for body in writer.acked]
    _assert_acked_present(cluster, promoted, acked)
    _assert_converged(cluster, promoted, epoch, sampled)


def _kill_the_master(cluster: FailoverCluster, master: str, slaves: list[str],
                     writers: list[Writer]) -> tuple[str, int, dict[str, int]]:
    """Pause one slave (SIGSTOP) while the master acknowledges writes with the other, so
    the two differ; SIGKILL the master; resume the paused one; sample the slaves' log
    ends in the old epoch until the controller promotes one; return it, its master epoch
    and the samples.
    (The pause is kept well inside the session timeout: a slave fenced for it would be no
    candidate, and promoting the one behind would go untested.)"""
    epoch = _partition(cluster).leader_epoch
    behind = slaves[0]
    cluster.pause(behind)
    try:
        for writer in writers:
            writer.wait_for_more(5)
        print(f"SIGKILL {master}, the master of {GROUP} in epoch {epoch}; {behind} paused")
        cluster.kill(master)
    finally:
        cluster.resume(behind)
    alive = cluster.addresses(slaves)
    sampled = dict.fromkeys(slaves, 0)
    moved: list[PartitionInfo] = []

    def promoted() -> bool:
        for name in slaves:
            status = cluster.group(name)
            if status and status["role"] == "SLAVE" and status["leader"] == master:
                sampled[name] = max(sampled[name], status["written"])
        part = cluster_state(alive).partition(TOPIC, 0)
        if part.leader != master:
            moved.append(part)
        return bool(moved)
    wait_until(promoted, f"a slave of {master} promoted", DEADLINE_S)
    part = moved[0]
    assert part.leader in slaves and part.leader_epoch == epoch + 1, part
    assert master not in part.isr, part
    print(f"promoted {part.leader} in epoch {part.leader_epoch}; sampled ends {sampled}")
    for writer in writers:  # writes continue, through the new master
        writer.wait_for_more(30)
    return part.leader, part.leader_epoch, sampled


def _read_all(address: str) -> list[bytes]:
    bodies: list[bytes] = []
    with Client(address, timeout_s=10, group=GROUP) as client:
        while batch := client.fetch(TOPIC, 0, len(bodies), 256):
            bodies.extend(record.body for record in batch)
    return bodies


def _assert_acked_present(cluster: FailoverCluster, leader: str, acked: list[bytes]) -> None:
    bodies = _read_all(cluster.address(leader))
    missing = set(acked) - set(bodies)
    assert not missing, f"{len(missing)} acknowledged writes lost: {sorted(missing)[:5]}"
    assert len(bodies) == len(set(bodies)), "a write stored twice"


def _assert_converged(cluster: FailoverCluster, leader: str, epoch: int,
                      sampled: dict[str, int]) -> None:
    """The three logs byte-identical once the slaves caught up; the promoted slave's log
    held at least what any slave was seen to hold in the old epoch."""
    def caught_up() -> bool:
        found = [cluster.group(name) for name in NAMES]
        return all(found) and len({status["written"] for status in found if status}) == 1
    wait_until(caught_up, "the three logs of one length", DEADLINE_S)
    cluster.stop_all()
    images = {name: store_image(cluster.root / name / GROUP) for name in NAMES}
    assert len(set(images.values())) == 1, {name: len(image) for name, image in images.items()}
    with mqlog.open(cluster.root / leader / GROUP, read_only=True) as store:
        starts = dict(store.epoch_starts())
    # (the log's epochs are the cores': a fresh master begins one of its own, so they
    # need not equal the metadata's leader epoch, only rise at each promotion)
    assert len(starts) >= 2, f"no new epoch began at the promotion: {starts}"
    new_epoch_start = starts[max(starts)]
    assert all(end <= new_epoch_start for end in sampled.values()), \
        f"a slave ahead of the promoted one was seen: {sampled}; the new epoch starts at " \
        f"{new_epoch_start}"

