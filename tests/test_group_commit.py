"""Group commit (engine/flush.py): a sync put is acknowledged only once its bytes are
synced, however the waiters are woken, and no waiter is left asleep.

The syncs are watched from the outside: every call of the store's log sync is wrapped,
and the end of each one that returned is noted. An acknowledged record whose end lies
past every sync that had returned when its put returned was acknowledged early. The
wrapper delays syncs at random (seeded; a slow disk), so that writers pile up behind
them and the hand-offs between threads are exercised, and can make one fail.
"""

from __future__ import annotations

import errno
import os
import queue
import random
import threading
import time

import pytest

import mqlog
from mqlog import errors, ext
from mqlog.results import PutStatus
from tests.conftest import IMPLEMENTATIONS, SMALL

# Writers must end within this (a loaded machine's generous bound); their deadlines are
# ten times as long, so a waiter nobody wakes shows as a hang, not as a late PUT_OK.
PATIENCE_S = 60
DEADLINE_MS = 600_000


class WatchedSyncs:
    """Wraps a flush service's log sync: notes how far the syncs that returned reached,
    delays some of them, and fails the one numbered ``fail_at`` (1-based)."""

    def __init__(self, flusher, rng: random.Random, delay_chance: float,
                 fail_at: int | None = None) -> None:
        self._flusher = flusher
        self._original = flusher._sync_log
        self._rng = rng
        self._rng_lock = threading.Lock()
        self._delay_chance = delay_chance
        self._fail_at = fail_at
        self.calls = 0
        self.durable = flusher.flushed_position  # the end of the furthest sync that returned
        self.failed = False
        self.published_early: list[tuple[int, int]] = []  # (flushed position, durable)
        flusher._sync_log = self

    def __call__(self, start: int, end: int) -> None:
        with self._rng_lock:
            if self._flusher.flushed_position > self.durable:
                self.published_early.append((self._flusher.flushed_position, self.durable))
            self.calls += 1
            number = self.calls
            delay = self._rng.random() < self._delay_chance
        if self._fail_at is not None and number >= self._fail_at:
            self.failed = True
            raise OSError(5, "Input/output error (injected)")
        if delay:
            time.sleep(0.002)  # a slow disk (an injected fault, not a synchronisation)
        self._original(start, end)
        with self._rng_lock:
            self.durable = max(self.durable, end)


def _produce(store, watched: WatchedSyncs, worker: int, count: int, early: list,
             answers: list) -> None:
    for index in range(count):
        try:
            result = store.put("t", f"{worker}-{index}".encode(), queue_id=worker % 8)
        except (errors.FlushFailed, errors.StoreFailed) as error:
            answers.append(type(error))
            return
        durable = watched.durable  # read after put returned: it only grows
        answers.append(result.status)
        if result.status is PutStatus.PUT_OK and result.end_position > durable:
            early.append((worker, index, result.end_position, durable))


def _run_writers(store, watched: WatchedSyncs, threads: int, count: int,
                 seed: int) -> tuple[list, list]:
    """Run the writers; each must end within PATIENCE_S, far below their deadlines."""
    early: list = []
    answers: list = []
    workers = [threading.Thread(target=_produce, args=(store, watched, w, count, early,
                                                       answers), daemon=True)
               for w in range(threads)]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + PATIENCE_S
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))
    assert not any(worker.is_alive() for worker in workers), f"a writer hangs (seed {seed})"
    return early, answers


def test_no_sync_put_is_acknowledged_before_its_sync_returned(open_store, seed):
    """64 threads of sync puts behind syncs that stall at random: every PUT_OK record
    lies below the end of a sync that had returned when its put returned, and the
    flushed position, seen at the start of every sync, never runs ahead of them."""
    store = open_store(flush_mode="sync", flush_sync_timeout_ms=DEADLINE_MS)
    watched = WatchedSyncs(store._flusher, random.Random(seed), delay_chance=0.2)
    early, answers = _run_writers(store, watched, threads=64, count=30, seed=seed)
    assert early == [], f"acknowledged before synced (seed {seed}): {early[:5]}"
    assert watched.published_early == [], f"flushed position published before its " \
        f"sync returned (seed {seed}): {watched.published_early[:5]}"
    assert answers == [PutStatus.PUT_OK] * (64 * 30), f"seed {seed}"
    assert 0 < store.flush_count < 64 * 30  # and the syncs were shared


def test_a_failed_sync_acknowledges_nothing_it_did_not_cover(open_store, seed):
    """The 5th sync fails under 32 writers: every PUT_OK lies below a sync that
    returned, the others get FlushFailed or StoreFailed, and nobody is left waiting."""
    store = open_store(flush_mode="sync", flush_sync_timeout_ms=DEADLINE_MS)
    watched = WatchedSyncs(store._flusher, random.Random(seed), delay_chance=0.3,
                           fail_at=5)
    early, answers = _run_writers(store, watched, threads=32, count=20, seed=seed)
    assert watched.failed and early == [], f"seed {seed}: {early[:5]}"
    assert set(answers) <= {PutStatus.PUT_OK, errors.FlushFailed, errors.StoreFailed}
    assert errors.FlushFailed in answers
    with pytest.raises(errors.FlushFailed):
        store.close()


def test_covered_writers_that_stop_writing_never_strand_the_others(open_store, seed):
    """Covered waiters are woken by threads going back to sleep. Here each thread
    writes once and leaves: nobody goes back to sleep, and the flush thread must wake
    the ones left (a stranded one would wait for its deadline)."""
    store = open_store(flush_mode="sync", flush_sync_timeout_ms=DEADLINE_MS)
    watched = WatchedSyncs(store._flusher, random.Random(seed), delay_chance=0.5)
    for _ in range(5):
        early, answers = _run_writers(store, watched, threads=24, count=1, seed=seed)
        assert early == [] and answers == [PutStatus.PUT_OK] * 24, f"seed {seed}"


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_waiter_wakes_once_and_times_out(implementation):
    """The core's Waiter (C: lets the GIL go before it wakes another) and its twin
    behave alike: woken before or during the wait, once only, or timed out."""
    waiter_class = ext.load(implementation).Waiter
    early = waiter_class()
    early.wake()
    assert early.wait(5) is True  # woken before it slept
    assert waiter_class().wait(0) is False and waiter_class().wait(0.001) is False
    with pytest.raises(RuntimeError, match="woken once"):
        early.wake()
    first, second = waiter_class(), waiter_class()
    woken = []
    thread = threading.Thread(target=lambda: woken.append(second.wait(60)))
    thread.start()
    assert first.wait(0.01, second) is False  # woke ``second``, then slept, alone
    thread.join(60)
    assert woken == [True]
    with pytest.raises(RuntimeError, match="woken once"):
        first.wait(0, second)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_a_waiter_is_interrupted_by_a_raising_signal_handler_only(implementation):
    """Ctrl-C reaches a thread asleep in a Waiter (the C one lets the GIL go and sleeps
    in C: it must still run the handlers), and a handler that does not raise lets the
    sleep go on: both cores alike, as threading.Lock.acquire does."""
    import signal

    waiter_class = ext.load(implementation).Waiter
    main = threading.get_ident()
    sender = threading.Timer(0.05, signal.pthread_kill, (main, signal.SIGINT))
    # Python's own Ctrl-C handler, whatever an earlier test left (in a full run this
    # failed on both cores: SIGINT's handler then was not one that raises).
    found = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):  # (early or late, it lands in here)
            sender.start()
            assert waiter_class().wait(60) is None, f"SIGINT's handler was {found!r}"
    finally:
        sender.join()
        signal.signal(signal.SIGINT, found)
    previous = signal.signal(signal.SIGUSR1, lambda *_: None)
    try:
        sender = threading.Timer(0.05, signal.pthread_kill, (main, signal.SIGUSR1))
        sender.start()
        assert waiter_class().wait(0.5) is False  # interrupted, handled, slept on
        sender.join()
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_writers_waiting_when_the_store_closes_are_all_answered(open_store, seed):
    """close() while 32 threads wait for their syncs: its last flush covers them all,
    and nobody is left to wake them the usual way (every later put is refused, and the
    flush thread ends): each gets its answer at once, not at its deadline."""
    store = open_store(flush_mode="sync", flush_sync_timeout_ms=DEADLINE_MS)
    watched = WatchedSyncs(store._flusher, random.Random(seed), delay_chance=0.5)
    some_answered = threading.Event()

    class Answers(list):
        def append(self, item: object) -> None:
            super().append(item)
            if len(self) >= 64:  # a few syncs done: writers are queued behind the next
                some_answered.set()

    answers: list = Answers()
    early: list = []

    def produce(worker: int) -> None:
        try:
            _produce(store, watched, worker, 1000, early, answers)
        except errors.StoreClosed:
            answers.append(errors.StoreClosed)

    workers = [threading.Thread(target=produce, args=(w,), daemon=True) for w in range(32)]
    for worker in workers:
        worker.start()
    assert some_answered.wait(PATIENCE_S), f"no progress (seed {seed})"
    store.close()
    deadline = time.monotonic() + PATIENCE_S
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))
    assert not any(worker.is_alive() for worker in workers), f"stranded (seed {seed})"
    assert early == [] and errors.StoreClosed in answers, f"seed {seed}"


class FailingSaves:
    """Makes ``os.fdatasync`` of the store's ``flushed`` file (the saved flushed
    position, engine/checkpoint.py) fail with EIO once armed; a save that starts while
    ``hold`` is set waits for ``release`` first, so writers queue up behind it."""

    def __init__(self, monkeypatch) -> None:
        self._real = os.fdatasync
        self.armed = False
        self.failures = 0
        self.entered = threading.Event()
        self.hold = False
        self.release = threading.Event()
        monkeypatch.setattr(os, "fdatasync", self)

    def __call__(self, fd: int) -> None:
        if self.armed and os.readlink(f"/proc/self/fd/{fd}").endswith(f"{os.sep}flushed"):
            self.entered.set()
            if self.hold:
                self.release.wait(PATIENCE_S)
            self.failures += 1
            raise OSError(errno.EIO, "Input/output error (injected into the flushed save)")
        self._real(fd)


def _stored(path, impl, acked: list) -> None:
    """Reopen: every acknowledged record is there (their log syncs returned)."""
    with mqlog.open(path, implementation=impl, **SMALL) as store:
        for (queue_id, offset), body in acked:
            assert [r.body for r in store.get("t", queue_id, offset, 1)] == [body]


def test_a_failed_flushed_save_reaches_the_sync_writers_typed(tmp_path, impl, monkeypatch,
                                                               seed):
    """Saving the flushed position (its own thread, d5ba503) fails with EIO while 16
    threads make sync puts: every writer ends with FlushFailed or StoreFailed (none
    waits for its deadline or writes on with PUT_OK forever), close() says FlushFailed
    and lets the store go, and every record acknowledged before is found on reopen."""
    faults = FailingSaves(monkeypatch)
    store = mqlog.open(tmp_path / "s", implementation=impl, flush_mode="sync",
                       flush_sync_timeout_ms=DEADLINE_MS, **SMALL)
    faults.armed = faults.hold = True
    first = store.put("t", b"first")  # its sync returns; its save waits in the shim
    assert faults.entered.wait(PATIENCE_S), "the flushed position was never saved"
    acked: list = [((0, first.offset), b"first")]
    answers: list = []
    rng = random.Random(seed)
    lengths = [rng.randrange(1, 64) for _ in range(16)]

    def write(worker: int) -> None:
        index = 0
        while True:
            body = f"{worker}-{index}".encode() * lengths[worker]
            try:
                result = store.put("t", body, queue_id=worker % 4)
            except (errors.FlushFailed, errors.StoreFailed) as error:
                answers.append(type(error))
                return
            assert result.status is PutStatus.PUT_OK, f"seed {seed}"
            acked.append(((worker % 4, result.offset), body))
            if index == 0 and worker == 15:
                faults.release.set()  # every writer had a go: fail the save now
            index += 1

    workers = [threading.Thread(target=write, args=(w,), daemon=True) for w in range(16)]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + PATIENCE_S
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))
    faults.release.set()
    assert not any(w.is_alive() for w in workers), f"the save's error never came (seed {seed})"
    assert faults.failures >= 1 and len(answers) == 16, f"seed {seed}: {answers}"
    with pytest.raises(errors.FlushFailed, match="Input/output error"):
        store.close()
    faults.armed = False
    _stored(tmp_path / "s", impl, acked)


@pytest.mark.parametrize("threads", [True, False], ids=["threaded", "inline"])
def test_a_flushed_save_failing_at_close_is_typed_and_lets_the_store_go(
        tmp_path, impl, monkeypatch, threads):
    """Nothing written since the last save, then close() saves the flushed position
    once more and that save fails: close() raises FlushFailed (not a raw OSError), the
    store is closed and its lock released, and a reopen recovers every record. Without
    background threads (saves inline) a sync put whose save fails raises FlushFailed."""
    faults = FailingSaves(monkeypatch)
    store = mqlog.open(tmp_path / "s", implementation=impl, flush_mode="sync",
                       background_threads=threads, flushed_position_save_interval_ms=0,
                       **SMALL)  # (every sync saves: the inline put's save fails)
    written = [store.put("t", f"r{i}".encode()).offset for i in range(20)]
    faults.armed = True
    if not threads:
        with pytest.raises(errors.FlushFailed, match="injected into the flushed save"):
            store.put("t", b"r20")
        written.append(20)
    with pytest.raises(errors.FlushFailed, match="injected into the flushed save"):
        store.close()
    assert store.closed
    faults.armed = False
    _stored(tmp_path / "s", impl, [((0, offset), f"r{offset}".encode()) for offset in written])


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_group_commit_covers_and_hands_on_in_end_order(implementation, seed):
    """The core's GroupCommit (a heap and a ring in C, heapq and a deque in the twin):
    48 threads wait for seeded random ends behind a leader; a publish readies exactly
    the covered ones, woken in end order (arrival order among equal ends); the lead goes
    to the smallest end left; a waiter that times out leaves the heap from anywhere in
    it; the answers and the flush module's constants agree on both cores."""
    from mqlog.engine import flush

    core = ext.load(implementation)
    assert (core.WAIT_NOT_DURABLE, core.WAIT_DURABLE, core.WAIT_LEAD) == \
        (0, flush._WAIT_DURABLE, flush._WAIT_LEAD)
    rng = random.Random(seed)
    group = core.GroupCommit(100)
    assert group.wait(50, 60) == core.WAIT_DURABLE  # covered already: no wait at all
    assert group.wait(500, 60) == core.WAIT_LEAD  # nobody syncing: this one leads
    ends = [rng.randrange(101, 400) for _ in range(48)]
    answers: queue.Queue = queue.Queue()

    def wait(end: int) -> None:
        try:
            answers.put((end, group.wait(end, PATIENCE_S * 10)))
        except errors.FlushFailed:
            answers.put((end, "FlushFailed"))

    threads = [threading.Thread(target=wait, args=(end,), daemon=True) for end in ends]
    for count, thread in enumerate(threads, 1):  # one at a time: arrival order is known
        thread.start()
        _until(lambda count=count: group.waiting_count == count, seed)
    for _ in range(3):  # give-ups from anywhere in the heap leave it
        assert group.wait(rng.randrange(101, 400), 0) == core.WAIT_NOT_DURABLE
    assert group.waiting_count == 48 and group.ready_count == 0
    target = sorted(ends)[30]
    covered = sorted(end for end in ends if end <= target)
    assert group.publish(target) == len(covered) and group.flushed_position == target
    woken = []
    while (handoff := group.take_ready()) is not None:  # woken one by one, in order
        handoff.wake()
        woken.append(answers.get(timeout=PATIENCE_S))
    assert woken == [(end, core.WAIT_DURABLE) for end in covered], f"seed {seed}"
    group.lead_done()  # the leader's sync ended: the smallest uncovered end leads
    left = sorted(end for end in ends if end > target)
    assert answers.get(timeout=PATIENCE_S) == (left[0], core.WAIT_LEAD), f"seed {seed}"
    group.error = errors.FlushFailed("injected")
    group.release_all()
    failed = sorted(answers.get(timeout=PATIENCE_S) for _ in left[1:])
    assert failed == [(end, "FlushFailed") for end in left[1:]], f"seed {seed}"
    assert group.waiting_count == 0 and group.ready_count == 0
    for thread in threads:
        thread.join(PATIENCE_S)
    with pytest.raises(errors.FlushFailed, match="injected"):
        group.wait(10**9, 0)


def _until(condition, seed: int) -> None:
    """Wait for another thread to reach a state it shows (no timed sleep standing in)."""
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, f"never reached (seed {seed})"
        time.sleep(0.0005)
