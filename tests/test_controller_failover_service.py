"""Master-slave failover in the controller service (a one-voter controller over a real
store, tests/test_controller_service.py's OneNode): a master's sync state set reported in
heartbeats becomes the partition's ISR under partition-epoch checks; with auto_failover
a fenced master's group gets its in-sync slave furthest ahead, judged only by reports
sent after the fence (or after the master registered again); garbage is typed. The
decision rules one by one: tests/data/controller/failover.txt; real processes:
tests/test_controller_failover.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mqlog.errors import InvalidArgument
from tests.test_controller_service import OneNode, _cluster


@pytest.fixture
def make(tmp_path: Path) -> Any:
    """make(**controller_config) -> OneNode (closed at the end)."""
    opened: list[OneNode] = []

    def _make(**config: Any) -> OneNode:
        one = OneNode(tmp_path / "c0", **config)
        opened.append(one)
        return one
    yield _make
    for one in opened:
        if not one.store.closed:
            one.store.close()


def _topic(one: Any) -> tuple[str, str, str]:
    """A master-slave topic of one partition over b0..b2: (master, slave, slave)."""
    one.call(one.controller.create_topic("ms", 1, 3, "master_slave"))
    part = one.controller.committed.partition("ms", 0)
    master, first, second = part.replicas
    return master, first, second


def test_sync_state_reports_change_the_isr_and_stale_ones_nothing(make: Any) -> None:
    one = make()
    epochs = _cluster(one)
    controller = one.controller
    master, first, second = _topic(one)
    one.call(controller.heartbeat(master, epochs[master],
                                  sync_states={("ms", 0): (0, (second,))}))
    part = controller.committed.partition("ms", 0)
    assert (part.isr, part.partition_epoch, part.leader) == ((master, second), 1, master)
    for broker, epoch in ((master, 0), (first, 1)):  # stale view; not the master
        proposal = controller.heartbeat(broker, epochs[broker],
                                        sync_states={("ms", 0): (epoch, (first, second))})
        assert proposal.end is None
    assert controller.sync_states_stale == 2
    for garbage in ({("ms", 0): (1, "b1")}, {("ms", 0): (-1, ())}, {("ms",): (1, ())},
                    [("ms", 0, 1, ())], {("ms", 0): (1, (3,))}):
        with pytest.raises(InvalidArgument, match="sync state|partition epoch|map"):
            controller.heartbeat(master, epochs[master], sync_states=garbage)
    one.step(2)
    assert controller.committed.partition("ms", 0) == part


def _silence(one: Any, epochs: dict[str, int], master: str,
             reports: dict[str, tuple[int, int]], ticks: int) -> None:
    """``ticks`` ticks in which every broker but ``master`` heartbeats its report."""
    for _ in range(ticks):
        for name, report in reports.items():
            one.controller.heartbeat(name, epochs[name], {("ms", 0): report})
        one.step()


def test_the_in_sync_slave_furthest_ahead_is_promoted_from_fresh_reports(make: Any) -> None:
    one = make(auto_failover=True)
    epochs = _cluster(one)
    controller = one.controller
    master, first, second = _topic(one)
    # Before the fence `first` said less than `second` does after it: only fresh counts.
    _silence(one, epochs, master, {first: (0, 500), second: (0, 400)}, 3)
    reports = {first: (0, 500), second: (0, 900)}
    fenced = False
    for _ in range(controller.session_ticks + 10):
        _silence(one, epochs, master, reports, 1)
        part = controller.committed.partition("ms", 0)
        if controller.committed.brokers[master].fenced and not fenced:
            fenced = True
            assert part.leader == master, "promoted in the fence's own tick: no fresh report"
        if part.leader != master:
            break
    assert fenced and part.leader == second and part.leader_epoch == 1, part
    assert master not in part.isr


def test_a_master_registering_again_waits_for_fresh_reports(make: Any) -> None:
    one = make(auto_failover=True)
    epochs = _cluster(one)
    controller = one.controller
    master, first, second = _topic(one)
    _silence(one, epochs, master, {first: (0, 500), second: (0, 400)}, 1)
    # The master's process died and came back: it registers (fenced until it heartbeats)
    epochs[master] = one.call(controller.register_broker(master, "h:9999"))["broker_epoch"]
    one.step(3)
    assert controller.committed.partition("ms", 0).leader == master  # no report since
    _silence(one, epochs, master, {first: (0, 500), second: (0, 900)}, 2)
    assert controller.committed.partition("ms", 0).leader == second
