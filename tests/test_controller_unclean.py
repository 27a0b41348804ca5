"""KIP-966's unclean shutdown, in-process on 127.0.0.1 (three controllers, three brokers:
tests/inprocess.py), with a topic's own min_insync_replicas.

An ISR topic of 1 partition x RF 3 created with ``min_insync_replicas = 3``: a follower's
broker stopped leaves the ISR for the ELR (the ISR is below the topic's 3, not the
cluster's 1). Its store's abort marker put back (as a crash leaves it: an in-process stop
closes cleanly) and the broker started again: it registers saying its stores were not
closed cleanly, and the controller takes it out of the ELR with that registration, in
the metadata log, before anything else about it; it then catches up and rejoins the ISR.
The other follower, stopped and started cleanly, registers without the mark."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from mqlog.config import MEMBER_FILE
from mqlog.replication.controller import records
from mqlog.replication.local import wait_until
from tests import inprocess
from tests.inprocess import BROKERS, CONTROLLERS, Cluster
from tests.processes import change_metadata, folded_partition, wait_live_brokers


def _log(addresses: list[str]) -> list[Any]:
    """The controller's committed metadata records, in order."""
    answer = change_metadata(addresses, {"kind": "metadata_since", "position": 0})
    assert "snapshot" not in answer  # (1 MiB between snapshots: never trimmed here)
    return [records.decode(body) for _end, body in answer["records"]]


def _partition(addresses: list[str]) -> Any:
    return folded_partition(addresses, "i")


def _topic_hosted(cluster: Cluster, addresses: list[str]) -> Any:
    """Topic "i" (1 partition x RF 3, its own min_insync_replicas 3) created and hosted
    by every broker; its partition's state."""
    wait_live_brokers(addresses)
    change_metadata(addresses, {"kind": "create_topic", "name": "i", "partitions": 1,
                                "replication_factor": 3, "layer": "isr",
                                "config": {"min_insync_replicas": 3}})
    part = _partition(addresses)
    wait_until(lambda: all("i-0" in cluster.threads[name].broker.groups
                           for name in BROKERS), "every replica hosted", 60)
    return part


def _second_registration_left_the_elr(addresses: list[str], broker: str,
                                      data_lost: bool) -> None:
    """``broker`` registered twice, the second time as after an unclean shutdown (with
    ``data_lost`` or not), and the next partition change has it in neither the ELR nor
    the ISR."""
    def registrations(log: list[Any]) -> list[int]:
        return [index for index, record in enumerate(log)
                if isinstance(record, records.RegisterBroker) and record.broker_id == broker]

    # (any controller answers metadata_since: a follower may not have the second
    # registration, nor the changes of its batch, when the broker, answered by the
    # leader, has marked its data_dir: the clean-clone run read such a follower)
    log: list[Any] = []

    def second_and_its_changes() -> bool:
        log[:] = _log(addresses)
        found = registrations(log)
        return len(found) >= 2 and any(isinstance(record, records.PartitionChange)
                                       for record in log[found[1] + 1:])
    wait_until(second_and_its_changes, f"{broker}'s second registration in the log", 60)
    registered = registrations(log)
    assert len(registered) == 2 and log[registered[1]].unclean_shutdown
    assert log[registered[1]].data_lost == data_lost
    assert not log[registered[0]].unclean_shutdown  # (its first start)
    assert not log[registered[0]].data_lost
    after = next(record for record in log[registered[1] + 1:]
                 if isinstance(record, records.PartitionChange))
    assert broker not in after.elr and broker not in after.isr, after


def test_a_broker_back_from_an_unclean_shutdown_leaves_the_elr(tmp_path: Path) -> None:
    with Cluster(inprocess.configs(tmp_path, replica_lag_time_ms=1_000)) as cluster:
        configs = cluster.configs
        addresses = cluster.addresses(CONTROLLERS)
        part = _topic_hosted(cluster, addresses)
        crashed, clean = part.replicas[1], part.replicas[2]
        node = cluster.threads[part.leader].broker.groups["i-0"]
        assert node.core.status()["elr"] == [] and node.spec.replication \
            .min_insync_replicas == 3  # (the topic's own, handed to the brokers)

        cluster.stop(crashed)
        wait_until(lambda: _partition(addresses).elr == (crashed,),
                   f"{crashed} in the ELR (the ISR below the topic's 3)", 60)
        (configs[crashed].data_dir / "i-0" / "abort").touch()  # (as a crash leaves it)
        cluster.start(crashed)
        wait_until(lambda: len(_partition(addresses).isr) == 3,
                   f"{crashed} caught up and back in the ISR", 60)
        _second_registration_left_the_elr(addresses, crashed, data_lost=False)

        cluster.stop(clean)
        cluster.start(clean)
        wait_until(lambda: sum(isinstance(record, records.RegisterBroker) and
                               record.broker_id == clean for record in _log(addresses)) == 2,
                   f"{clean} registered again", 60)
        again = [record for record in _log(addresses)
                 if isinstance(record, records.RegisterBroker) and record.broker_id == clean]
        assert not again[1].unclean_shutdown
        assert (configs[clean].data_dir / MEMBER_FILE).exists()  # (since its first life)


def test_a_broker_back_with_a_wiped_data_dir_leaves_the_elr(tmp_path: Path) -> None:
    """A broker whose data_dir was wiped (or replaced) holds none of what the metadata
    says its replicas hold: it registered as a clean broker, stayed in the ELR and was
    elected from it with an empty log, and every acknowledged record went (helper-46).
    Without its MEMBER_FILE it registers as after an unclean shutdown, out of the ELR;
    a broker's first start (no MEMBER_FILE either) is not marked so."""
    with Cluster(inprocess.configs(tmp_path, replica_lag_time_ms=1_000)) as cluster:
        configs = cluster.configs
        addresses = cluster.addresses(CONTROLLERS)
        wiped = _topic_hosted(cluster, addresses).replicas[1]
        cluster.stop(wiped)
        wait_until(lambda: _partition(addresses).elr == (wiped,),
                   f"{wiped} in the ELR (the ISR below the topic's 3)", 60)
        shutil.rmtree(configs[wiped].data_dir)
        cluster.start(wiped)
        wait_until(lambda: (configs[wiped].data_dir / MEMBER_FILE).exists(),
                   f"{wiped} registered again", 60)
        _second_registration_left_the_elr(addresses, wiped, data_lost=True)
