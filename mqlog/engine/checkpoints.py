"""One checkpoint thread per process, for every store open in it.

A store checkpoints every ``checkpoint_interval_ms`` while its log grows (flush.py says
what a checkpoint is and what it syncs). With a thread per store, a process hosting N
stores — a broker with a replica of N partitions — ran N checkpoint threads, each waking
on its own clock and syncing at once: N streams of fsyncs competing with the writers for
the cores and the disk (a profile of the ISR benchmark's brokers found a quarter of their
busy time there). Here one thread serves them all. It keeps a heap of (due time, store),
runs the due checkpoints one after another, and makes a store's next one due an interval
after its last one *ended*. So however many stores a process holds and however slow the
disk, it runs one checkpoint at a time, and no store checkpoints more often than its
interval: what checkpoints cost a process is bounded by one thread's syncs. A store whose
log did not move costs a comparison (flush.py skips it); one whose checkpoint fails for
good (its store is fenced) leaves the heap.

``add`` when a store's flush service starts, ``remove`` before it stops: ``remove``
waits for a checkpoint of that store under way, so a store's final checkpoint and its
close never overlap a scheduled one. The thread starts with the first store and ends
with the last (``remove`` joins it: no thread outlives the stores, as Store.abandon
promises); a child process after fork starts with an empty scheduler (a store's threads
do not survive a fork either).
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
from collections.abc import Callable, Hashable


class CheckpointScheduler:
    """The process's checkpoint thread and its timetable; see the module docstring."""

    def __init__(self) -> None:
        self._changed = threading.Condition()  # guards everything below
        self._heap: list[tuple[float, int, Hashable]] = []  # (due, token, store)
        # store -> (token of its heap entry, interval in seconds, its checkpoint call)
        self._stores: dict[Hashable, tuple[int, float, Callable[[], bool]]] = {}
        self._tokens = itertools.count()
        self._running: Hashable | None = None  # the store whose checkpoint runs now
        self._thread: threading.Thread | None = None
        self.checkpoints = 0  # checkpoint calls made (figures, tests)

    def add(self, store: Hashable, interval_s: float, checkpoint: Callable[[], bool]) -> None:
        """Call ``checkpoint()`` every ``interval_s`` from now on (at most that often)
        until ``remove(store)`` or until it returns False."""
        assert interval_s > 0
        with self._changed:
            assert store not in self._stores, "a store is added once"
            self._schedule(store, time.monotonic() + interval_s, interval_s, checkpoint)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="mqlog-checkpoint",
                                                daemon=True)
                self._thread.start()
            self._changed.notify()

    def remove(self, store: Hashable) -> None:
        """No more checkpoints of ``store``; returns once one under way has ended (and
        the thread itself, if this was the last store)."""
        with self._changed:
            self._stores.pop(store, None)
            while self._running is store:
                self._changed.wait()
            thread = None
            if not self._stores:  # the thread ends (an add from now on starts another)
                thread, self._thread = self._thread, None
                self._heap.clear()
            self._changed.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    @property
    def stores(self) -> int:
        with self._changed:
            return len(self._stores)

    def _schedule(self, store: Hashable, due: float, interval_s: float,
                  checkpoint: Callable[[], bool]) -> None:
        token = next(self._tokens)
        self._stores[store] = (token, interval_s, checkpoint)
        heapq.heappush(self._heap, (due, token, store))

    def _run(self) -> None:
        while (turn := self._next()) is not None:
            store, checkpoint = turn
            again = False
            try:
                again = checkpoint()
            finally:
                with self._changed:
                    self._running = None
                    self.checkpoints += 1
                    entry = self._stores.get(store)
                    if entry is not None and again:
                        self._schedule(store, time.monotonic() + entry[1], entry[1],
                                       entry[2])
                    elif entry is not None:
                        del self._stores[store]  # (fenced: nothing more to checkpoint)
                        if not self._stores:
                            self._thread = None  # (no store left: this thread ends)
                    self._changed.notify_all()

    def _next(self) -> tuple[Hashable, Callable[[], bool]] | None:
        """The next due store (marked running) and its call, waiting until it is due;
        None once this thread is let go (the last store left)."""
        with self._changed:
            while True:
                if self._thread is not threading.current_thread():
                    return None  # (the last store left: ``remove`` let this thread go)
                while self._heap and self._stores.get(self._heap[0][2], (None,))[0] != \
                        self._heap[0][1]:
                    heapq.heappop(self._heap)  # (a removed store's, or one re-added since)
                if not self._heap:
                    self._changed.wait()
                    continue
                due, _, store = self._heap[0]
                wait = due - time.monotonic()
                if wait <= 0:
                    heapq.heappop(self._heap)
                    self._running = store
                    return store, self._stores[store][2]
                self._changed.wait(wait)


SCHEDULER = CheckpointScheduler()


def _after_fork() -> None:
    global SCHEDULER
    SCHEDULER = CheckpointScheduler()


os.register_at_fork(after_in_child=_after_fork)
