"""An idle partition costs nothing (issue 17): a broker ticks all its groups of one
``tick_ms`` in one pass on one loop timer (broker.py's ``Ticker``), and a tick runs a
group's driver only if its core has something to carry out (``has_ready``).

In-process: one Broker on this test's own loop, hosting single-voter Raft groups (each
its own leader at once) on 127.0.0.1. Time is counted in the cores' ticks, and a test
waits for a tick by a tick callback, not by sleeping. The simulator part checks the
promise ``has_ready`` makes (False only when ``ready()`` would be empty) on seeds of all
three layers, with every fault they inject; the simulator's stores have no flush thread,
so two cases with a real store check it where the simulator cannot: a flush published
while a leader's ready() runs, and metadata that settles a pending ISR change.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import mqlog
from mqlog.config import BrokerConfig, GroupSpec, ReplicationConfig, StoreConfig
from mqlog.replication import core_for
from mqlog.replication.broker import Broker
from mqlog.replication.driver import Driver
from mqlog.replication.isr.core import PartitionState
from mqlog.replication.local import free_ports
from mqlog.replication.messages import Fetch
from mqlog.sim import isr, raft, swarm
from tests.test_driver import HeldIo

GROUPS = 6
TICK_MS = 10  # (ReplicationConfig's default: every group here ticks on one ticker)
WINDOW_TICKS = 20
WAIT_S = 30.0


def _spec(name: str, address: str) -> GroupSpec:
    store = StoreConfig(segment_size_bytes=16 << 20, flush_mode="async")
    return GroupSpec.raft(name, {"b1": address}, store=store, election_timeout_ticks=3,
                          heartbeat_ticks=1)


def _isr_spec(name: str, address: str) -> GroupSpec:
    """An ISR replica with no controller: no leader is ever named, so it idles."""
    store = StoreConfig(segment_size_bytes=16 << 20, flush_mode="async")
    return GroupSpec.isr(name, {"b1": address}, store=store)


def _run(tmp_path: Path, body: Callable[[Broker], Any]) -> None:
    """Serve a broker on a new loop, run ``await body(broker)``, stop the broker."""
    address = f"127.0.0.1:{free_ports(1)[0]}"

    async def main() -> None:
        broker = Broker(BrokerConfig("b1", address, tmp_path / "b1").validate())
        ready = asyncio.Event()
        serving = asyncio.create_task(broker.serve(ready))
        await asyncio.wait_for(ready.wait(), WAIT_S)
        try:
            await body(broker)
        finally:
            broker.stop()
            await serving

    asyncio.run(main())


def _address(broker: Broker) -> str:
    return broker.config.listen


async def _ticks(node: Any, count: int) -> None:
    """Return once ``node``'s core ticked ``count`` more times: after that whole pass (the
    pass's other groups ticked too) and before the next one."""
    done = asyncio.get_running_loop().create_future()
    target = node.core.tick_count + count

    def check() -> None:
        if node.core.tick_count >= target and not done.done():
            done.set_result(None)

    node.on_tick(check)
    await asyncio.wait_for(done, WAIT_S)


async def _ticks_until(node: Any, holds: Callable[[], bool], limit: int = 500) -> None:
    """Tick by tick until ``holds()`` after a tick; fail after ``limit`` ticks."""
    for _ in range(limit):
        await _ticks(node, 1)
        if holds():
            return
    pytest.fail(f"not reached in {limit} ticks")


def _count_short_timers(loop: asyncio.AbstractEventLoop) -> list[int]:
    """Count the loop's timers due within a second from now on (a tick's are; the test's
    own timeouts are not): ``[count]``, updated as they are made."""
    counted = [0]
    call_at = loop.call_at

    def counting(when: float, *args: Any, **kwargs: Any) -> Any:
        if when - loop.time() < 1.0:
            counted[0] += 1
        return call_at(when, *args, **kwargs)

    loop.call_at = counting  # type: ignore[method-assign]
    return counted


def test_a_broker_ticks_all_its_groups_in_one_pass_on_one_timer(tmp_path):
    async def body(broker: Broker) -> None:
        nodes = [broker.ensure_group(_spec(f"g{index}", _address(broker)))
                 for index in range(GROUPS)]
        await _ticks(nodes[0], 1)  # (every group has joined the ticker's passes)
        ticker = broker.tickers[TICK_MS]
        assert list(ticker.nodes) == nodes  # (in the order they started)
        before = [node.core.tick_count for node in nodes]
        passes = ticker.passes
        timers = _count_short_timers(asyncio.get_running_loop())
        await _ticks(nodes[0], WINDOW_TICKS)
        ticked = [node.core.tick_count - start for node, start in zip(nodes, before,
                                                                      strict=True)]
        assert ticked == [WINDOW_TICKS] * GROUPS  # one tick per pass for every group
        assert ticker.passes - passes == WINDOW_TICKS
        # One timer per pass (a few more may come from elsewhere: a flush, a connection)
        # and not one per group per tick, as a task per group made them
        assert WINDOW_TICKS <= timers[0] <= WINDOW_TICKS + 3, timers[0]

    _run(tmp_path, body)


def test_a_dropped_group_stops_ticking_and_the_others_go_on(tmp_path):
    async def body(broker: Broker) -> None:
        nodes = [broker.ensure_group(_spec(f"g{index}", _address(broker)))
                 for index in range(3)]
        await _ticks(nodes[0], 1)
        broker.drop_group("g1")
        dropped = nodes[1].core.tick_count
        await _ticks(nodes[0], 5)
        assert nodes[1].core.tick_count == dropped
        assert list(broker.tickers[TICK_MS].nodes) == [nodes[0], nodes[2]]
        for name in ("g0", "g2"):
            broker.drop_group(name)
        ticker = broker.tickers[TICK_MS]
        assert not ticker.nodes and ticker._timer is None  # (no group: no wake-ups)
        again = broker.ensure_group(_spec("g0", _address(broker)))  # (its store recovers)
        await _ticks(again, 3)

    _run(tmp_path, body)


def test_groups_dropped_or_opened_during_a_pass_are_safe(tmp_path):
    """A tick callback (the controller's, say) that drops a later group or opens a new one
    in the middle of a pass: the dropped one is not ticked in that pass nor after; the new
    one is ticked from the next pass, once per pass, with one timer for all."""

    async def body(broker: Broker) -> None:
        address = _address(broker)
        first, doomed, last = (broker.ensure_group(_spec(f"g{index}", address))
                               for index in range(3))
        await _ticks(first, 1)
        seen: dict[str, int] = {}
        added: list[Any] = []

        def in_the_middle() -> None:
            if not seen:
                seen.update(doomed=doomed.core.tick_count, last=last.core.tick_count)
                broker.drop_group("g1")
                added.append(broker.ensure_group(_spec("g9", address)))

        first.on_tick(in_the_middle)
        await _ticks(first, 1)  # (the pass in which the callback ran is over)
        assert doomed.core.tick_count == seen["doomed"]  # dropped before its turn
        assert last.core.tick_count == seen["last"] + 1
        (new,) = added
        assert new.core.tick_count == 0
        timers = _count_short_timers(asyncio.get_running_loop())
        start = first.core.tick_count
        await _ticks(first, WINDOW_TICKS)
        assert new.core.tick_count == WINDOW_TICKS == first.core.tick_count - start
        assert doomed.core.tick_count == seen["doomed"]
        assert WINDOW_TICKS <= timers[0] <= WINDOW_TICKS + 3, timers[0]

    _run(tmp_path, body)


def test_a_group_whose_tick_raises_stops_ticking_and_the_others_go_on(tmp_path):
    """As when each group had its own task, which the error ended: that group alone stops
    ticking, and the error goes to the loop's exception handler, named."""

    async def body(broker: Broker) -> None:
        loop = asyncio.get_running_loop()
        reported: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _, context: reported.append(context))
        good, bad = (broker.ensure_group(_spec(f"g{index}", _address(broker)))
                     for index in range(2))

        def broken() -> None:
            raise RuntimeError("a bug in a tick callback")

        bad.on_tick(broken)
        await _ticks(good, 3)
        stopped = bad.core.tick_count
        await _ticks(good, 3)
        assert bad.core.tick_count == stopped and list(broker.tickers[TICK_MS].nodes) == [good]
        (context,) = reported
        assert context["message"] == "group g1 stopped ticking"
        assert isinstance(context["exception"], RuntimeError)

    _run(tmp_path, body)


def test_idle_replicas_tick_without_driver_runs_and_a_leader_runs_when_its_log_moves(
        tmp_path):
    """An ISR replica no controller named a role has nothing to carry out after a tick:
    its driver does not run. Nor does an idle Raft leader's (a single voter: no
    heartbeats to send) once its log stopped moving — until a write moves it: the next
    tick asks for a run, which commits the write."""

    async def body(broker: Broker) -> None:
        leader = broker.ensure_group(_spec("r0", _address(broker)))
        idle = broker.ensure_group(_isr_spec("i0", _address(broker)))
        # Elected, its no-op committed and flushed, and no run left to ask for: seen from
        # a tick callback, which runs before the tick's has_ready() (node.py), on a state
        # nothing else moves in between; so no run is pending once this holds.
        await _ticks_until(leader, lambda: leader.driver.serving and not leader.core.has_ready()
                           and leader.store.committed_position == leader.store.written_position
                           == leader.store.flushed_position)
        runs = {"r0": 0, "i0": 0}
        asked = {"r0": 0, "i0": 0}  # driver runs asked for (by a tick, or anything else)
        for name, node in (("r0", leader), ("i0", idle)):
            def counted(run: Any = node.driver.run, name: str = name) -> bool:
                runs[name] += 1
                return run()

            def scheduled(schedule: Any = node._schedule, name: str = name) -> None:
                asked[name] += 1
                schedule()
            node.driver.run = counted  # type: ignore[method-assign]
            node._schedule = scheduled  # type: ignore[method-assign]
        await _ticks(leader, WINDOW_TICKS)
        assert idle.core.role == "OFFLINE" and not idle.core.has_ready()
        assert leader.core.role == "LEADER" and not leader.core.has_ready()
        assert runs == asked == {"r0": 0, "i0": 0}
        stored = leader.store.put_nowait("t", b"moved")  # (as the driver's own writes do)
        assert leader.core.has_ready()
        await _ticks_until(leader, lambda: leader.store.committed_position >=
                           stored.position + stored.size)
        assert asked["r0"] >= 1 and runs["r0"] >= 1 and asked["i0"] == runs["i0"] == 0

    _run(tmp_path, body)


# --- has_ready's promise, on the simulator's seeds ------------------------------------------


@pytest.mark.parametrize("layer, run_seed, seeds", [
    ("raft", raft.run_seed, (1, 2, 9)),
    ("isr", isr.run_seed, (100, 101, 110)),
    ("master_slave", swarm.run_seed, (1, 2, 3)),
])
def test_has_ready_is_false_only_when_ready_would_be_empty(monkeypatch, layer, run_seed,
                                                           seeds):
    """After every tick of every core the simulator runs: when ``has_ready()`` says no,
    ``ready()`` is empty (a core that builds its Ready in ready() must say yes). The check
    itself changes nothing: a core that says no builds nothing in ready()."""
    tick = Driver.tick
    said_no = [0]

    def checked(driver: Driver) -> None:
        tick(driver)
        core = driver.core
        if driver.failure is None and not core.has_ready():
            said_no[0] += 1
            assert not core.ready(), (layer, core.node_id, core.role)

    monkeypatch.setattr(Driver, "tick", checked)
    for seed in seeds:
        result = run_seed(seed)
        assert not result.violations, (layer, seed, result.violations[:3])
    assert said_no[0] > 0  # (the seeds have followers whose ticks leave nothing to do)


# --- has_ready beside a flush thread, and after metadata -------------------------------


class _FlushDuringReady:
    """The store, as its core reads it, except that once armed the store's flush thread
    publishes a flush right after the core read ``flushed_position`` (in ready())."""

    def __init__(self, store: Any) -> None:
        self.store, self.armed = store, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    @property
    def flushed_position(self) -> int:
        value = self.store.flushed_position
        if self.armed:
            self.armed = False
            self.store.flush()
        return value


def _single_leader(tmp_path: Path, layer: str) -> tuple[Any, Any, Driver, _FlushDuringReady]:
    """A one-replica leader whose commit follows its own flushed position, caught up."""
    store = mqlog.open(tmp_path / layer, background_threads=False, flush_mode="async",
                       committed_follows="external")
    log = _FlushDuringReady(store)
    if layer == "raft":
        config = ReplicationConfig(layer="raft", node_id="n1", voters=("n1",))
        core = core_for(config, log, rng=random.Random(1))
    else:
        config = ReplicationConfig(layer="isr", node_id="n1", replicas=("n1",),
                                   replica_ack="flushed")
        core = core_for(config, log, metadata=PartitionState("n1", 1, 1, ("n1",), (),
                                                             ("n1",)))
    io = HeldIo(store)
    driver = Driver(store, core, io)
    for _ in range(500):
        driver.tick()
        driver.run()
        io.complete_flushes()
        if driver.serving and store.committed_position == store.written_position == \
                store.flushed_position:
            return store, core, driver, log
    pytest.fail("the single replica did not start leading")


@pytest.mark.parametrize("layer", ["raft", "isr"])
def test_a_flush_that_lands_during_a_leaders_ready_is_not_missed(tmp_path, layer):
    """A leader whose commit follows its flushed position (Raft's follower_ack, ISR's
    replica_ack = "flushed"): the store's flush thread publishes while ready() runs,
    after the core read the flushed position. The next tick must still run the driver
    and commit — not say nothing moved because the flush was over before ready() ended
    (an acks=1 tail then stayed unreadable until the next write)."""
    store, core, driver, log = _single_leader(tmp_path, layer)
    driver.write("t", [b"acks=1"])
    log.armed = True
    driver.run()
    assert not log.armed and store.flushed_position == store.written_position
    for _ in range(3):  # (node.py's Node.tick)
        driver.tick()
        if core.has_ready():
            driver.run()
    assert store.committed_position == store.written_position
    store.close()


def test_metadata_that_settles_a_pending_isr_change_makes_the_leader_run(tmp_path):
    """An expand pending (n3 caught up) holds the high watermark at n3's end; metadata
    that keeps the ISR as it was settles it, and the high watermark may move: the next
    tick's has_ready() says so (the controller's host schedules a run too; a core must
    not rely on it)."""
    store = mqlog.open(tmp_path / "isr", background_threads=False, flush_mode="async",
                       committed_follows="external")
    replicas = ("n1", "n2", "n3")
    config = ReplicationConfig(layer="isr", node_id="n1", replicas=replicas)
    core = core_for(config, store, metadata=PartitionState("n1", 1, 1, ("n1", "n2"), (),
                                                           replicas))
    driver = Driver(store, core, HeldIo(store))
    driver.run()
    fetches = itertools.count(1)

    def fetch(follower: str, position: int) -> None:
        epoch = store.epoch_at(position)
        epoch = -1 if epoch is None else epoch
        driver.step(Fetch(follower, "n1", 1, next(fetches), position, epoch))
        driver.run()  # (the broker runs the driver after every step)

    first = driver.write("t", [b"one"])
    driver.run()
    for follower in ("n2", "n3"):
        fetch(follower, first.end)
    assert core.status()["pending_isr"] == list(replicas)
    second = driver.write("t", [b"two"])
    driver.run()
    fetch("n2", second.end)
    assert core.hw == first.end  # (n3, in the pending ISR, has not fetched it)
    core.apply_metadata(PartitionState("n1", 1, 2, ("n1", "n2"), (), replicas))
    driver.tick()
    assert core.has_ready()
    driver.run()
    assert core.hw == second.end
    store.close()
