"""A simulated replica, for every layer's simulator: a real store and core, run by the
one driver (mqlog/replication/driver.py) over a simulated network and a simulated disk.

The Io. ``send`` puts messages on the SimNetwork; ``save_hard_state`` makes the hard
state durable at once (its file is synced before the call returns on a real node);
``start_flush`` is a flush that completes ``0..flush_delay_ticks_max`` ticks later, in
order: until then the bytes are written but not durable, and the messages the driver
holds for it wait. ``answer`` and ``note`` go to the simulator (an answer is the layer's
verdict, or the driver's PartiallyStored for a request stored in part: partial.py). The
driver writes through the simulation's batch limit, if it has one (``driver_store``).

The disk. The store runs without background threads (``background_threads = False``):
it is flushed only when a completion above comes due, and its indexer runs when the
simulator says (``chores``), so one seed gives one run. A crash is a power loss: the
store is abandoned without a clean close, every byte of the commit log past its flushed
position is lost — except, now and then, a torn prefix of what followed, as a disk that
wrote some sectors of the last write — and the node comes back through the engine's
real recovery (the abort marker is there, the checkpoint is old).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mqlog
from mqlog.engine.files import file_name
from mqlog.replication.driver import Answer, Driver
from mqlog.replication.messages import Message
from mqlog.sim.partial import BatchLimitedStore


@dataclass
class SimReplica:
    """One node of a simulated group; the simulator (``sim``) supplies the network, the
    clock, and what to do with answers (``sim.answered(node, request, status)``)."""

    name: str
    path: Path
    sim: Any
    store_settings: dict[str, Any]
    rng: random.Random
    flush_delay_ticks_max: int = 0
    test_break: str = ""
    store: Any = None
    core: Any = None
    driver: Any = None
    hard_state: Any = None  # durable once the driver saved it
    up: bool = False
    paused: bool = False
    incarnation: int = 0  # a flush completion of an earlier life is void
    durable_when_down: int = 0  # its log's flushed end when it crashed
    written_when_down: int = 0  # and its written end
    saved_hard_state: bool = False  # the driver saved one since the simulator last looked
    flushes: list[tuple[int, int, Callable[[bool], None]]] = field(default_factory=list)

    def start(self) -> None:
        self.store = mqlog.open(self.path, clock_ms=lambda: self.sim.clock[0],
                                **self.store_settings)
        self.incarnation += 1
        self.flushes = []
        self.core = self.new_core()
        self.driver = Driver(self.driver_store(), self.core, self, test_break=self.test_break)
        self.up, self.paused = True, False

    def driver_store(self) -> Any:
        """The store as the driver writes through it: cut by the simulation's batch
        limit, if it has one (partial.py)."""
        limit = self.sim.batch_limit
        return self.store if limit is None else BatchLimitedStore(self.store, limit)

    def new_core(self) -> Any:
        """A fresh core over ``store`` (each layer's simulator says which)."""
        raise NotImplementedError

    # --- the driver's Io ---------------------------------------------------------------

    def send(self, messages: list[Message]) -> None:
        for message in messages:
            self.sim.observe(message)
            self.sim.network.send(message)

    def save_hard_state(self, state: Any) -> None:
        self.hard_state = state
        self.saved_hard_state = True

    def start_flush(self, done: Callable[[bool], None]) -> None:
        due = self.sim.clock[0] + self.rng.randint(0, self.flush_delay_ticks_max)
        if self.flushes:
            due = max(due, self.flushes[-1][0])  # flushes complete in order
        self.flushes.append((due, self.incarnation, done))

    def answer(self, request: Any, status: Answer) -> None:
        self.sim.answered(self, request, status)

    def note(self, event: str) -> None:
        self.sim.trace(f"{self.name}: {event}")

    def failed(self, error: BaseException) -> None:
        self.sim.violation(f"{self.name} could not carry out its Ready: {error!r}")

    def refused(self, error: BaseException) -> None:  # (no simulated peer sends garbage)
        self.failed(error)

    # --- the simulator's side ------------------------------------------------------------

    def complete_flushes(self) -> bool:
        """Complete the flushes due by now; True if any did (the driver may have news)."""
        now, done_any = self.sim.clock[0], False
        while self.flushes and self.flushes[0][0] <= now:
            _due, incarnation, done = self.flushes.pop(0)
            if incarnation == self.incarnation and self.up:
                self.store.flush()
                done(True)
                done_any = True
        return done_any

    def flush_now(self) -> None:
        """Everything written is durable now (a sync flush a client waited for)."""
        self.store.flush()

    def chores(self) -> None:
        self.store.run_chores()

    def crash(self, tear: bool = True) -> tuple[int, int]:
        """A power loss; returns (flushed end, end kept on disk)."""
        self.written_when_down = self.store.written_position
        lost = power_off(self.store, self.rng if tear else None)
        self.durable_when_down = lost[0]
        self.up = self.paused = False
        self.flushes = []
        return lost


def power_off(store: Any, tear_rng: random.Random | None) -> tuple[int, int]:
    """Abandon ``store`` as a power loss would: no flush, no checkpoint, no clean close.
    The commit log keeps its flushed bytes; of the rest, nothing — or, with ``tear_rng``,
    now and then a prefix of any length (a torn write). Returns (flushed, kept end)."""
    durable, written = store.flushed_position, store.written_position
    kept = durable
    if tear_rng is not None and written > durable and tear_rng.random() < 0.5:
        kept = durable + tear_rng.randrange(written - durable + 1)
    segments = store.segments()
    store.abandon(f"store {store.paths.root} lost its power")  # (the page cache stays)
    for base, size in segments:
        start, end = max(kept, base), min(written, base + size)
        if start < end:
            with open(store.paths.commitlog / file_name(base), "r+b") as file:
                file.seek(start - base)
                file.write(bytes(end - start))  # the page cache is gone
    return durable, kept
