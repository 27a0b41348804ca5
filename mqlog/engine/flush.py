"""The flush service: one thread that makes the commit log durable, and checkpoints.

Two modes, as in RocketMQ:

* ``sync`` is group commit. A writer that must wait calls ``wait_flushed(end)`` (a
  thread) or awaits ``wait_flushed_async(end)`` (an asyncio task); either way it joins a
  heap of waiters ordered by end position. The thread takes the whole written range at
  that moment, syncs it with one msync per segment it touches, publishes the new
  flushed position and releases exactly the waiters it covers: each thread's own lock,
  and one ``call_soon_threadsafe`` per event loop for all of that loop's futures.
  Writers that arrive during a sync are covered by the next one, so one fsync
  acknowledges everything queued since the previous one. A waiter whose deadline
  passes gets False (the store reports FLUSH_DISK_TIMEOUT, never a silent success).
* ``async`` flushes every ``flush_interval_ms``, early once ``flush_pages_min`` pages
  are dirty, and whatever is dirty every ``flush_thorough_interval_ms``.

Either way, every ``checkpoint_interval_ms`` the thread snapshots the written position,
flushes the log and the consume queues up to it, and then writes the checkpoint. Each
flush-and-checkpoint cycle holds the I/O lock; ``paused()`` takes it, so a truncation
never lands between a checkpoint's snapshot and its write.

A failed sync is never swallowed: the error is kept, every waiter raises FlushFailed,
and the store is fenced (StoreFailed) until it is reopened and recovery finds out what
really reached the disk — after a failed fsync the kernel may have dropped the pages.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from mqlog.config import PAGE_SIZE, StoreConfig
from mqlog.errors import FlushFailed


class FlushService:
    """Owns the flushed position; ``sync_log`` and ``checkpoint`` do the I/O."""

    def __init__(self, config: StoreConfig, *, written: Callable[[], int],
                 sync_log: Callable[[int, int], None], checkpoint: Callable[[int], None],
                 on_flushed: Callable[[int], None], on_failure: Callable[[FlushFailed], None],
                 flushed_position: int) -> None:
        self._config = config
        self._written = written
        self._sync_log = sync_log
        self._checkpoint = checkpoint
        self._on_flushed = on_flushed
        self._on_failure = on_failure
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # the thread waits here
        self._io_lock = threading.Lock()  # held by the thread while it syncs or checkpoints
        self._requested = flushed_position
        self._waiters: list[tuple[int, int, Any]] = []  # (end, tie-break, lock or future)
        self._tie = itertools.count()
        self._deadlines: dict[Any, _DeadlineWatch] = {}  # per event loop
        self.flushed_position = flushed_position
        self.flush_count = 0  # syncs done, for "records per fsync" figures
        self.error: FlushFailed | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="mqlog-flush", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Flush what is written, checkpoint, and end the thread."""
        with self._lock:
            self._stopping = True
            self._work.notify_all()
        self._thread.join()

    # --- writers -----------------------------------------------------------------------

    def wait_flushed(self, end_position: int, timeout_ms: int | None = None) -> bool:
        """Block until the log is durable up to ``end_position``; False at the deadline."""
        timeout = self._config.flush_sync_timeout_ms if timeout_ms is None else timeout_ms
        waiter = threading.Lock()
        waiter.acquire()
        with self._lock:
            if self._settled(end_position):
                return True
            self._enqueue(end_position, waiter)
        if not waiter.acquire(timeout=timeout / 1000):
            with self._lock:
                if self.flushed_position < end_position:
                    return self._raise_error_or(False)
        return self._raise_error_or(True)

    async def wait_flushed_async(self, end_position: int) -> bool:
        """``wait_flushed`` for an asyncio task: the flush thread resolves its future with
        True; the loop's deadline watch resolves it with False once the deadline passes."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        with self._lock:
            if self._settled(end_position):
                return True
            self._enqueue(end_position, future)
        watch = self._deadlines.get(loop)
        if watch is None or watch.loop.is_closed():
            watch = self._deadlines[loop] = _DeadlineWatch(loop)
        watch.add(future, self._config.flush_sync_timeout_ms / 1000)
        return self._raise_error_or(await future)

    def _settled(self, end_position: int) -> bool:
        """True if no wait is needed; raises the flush error if there was one."""
        if self.error is not None:
            raise self.error
        return self.flushed_position >= end_position

    def _enqueue(self, end_position: int, waiter: Any) -> None:
        heapq.heappush(self._waiters, (end_position, next(self._tie), waiter))
        if end_position > self._requested:
            self._requested = end_position
            self._work.notify()

    def _raise_error_or(self, value: bool) -> bool:
        if self.error is not None:
            raise self.error
        return value

    def request(self) -> None:
        """Ask for a flush of everything written, without waiting."""
        with self._lock:
            self._requested = max(self._requested, self._written())
            self._work.notify()

    def flush_now(self) -> None:
        """Flush everything written so far from the caller's thread."""
        target = self._written()
        self.request()
        if not self.wait_flushed(target, timeout_ms=max(self._config.flush_sync_timeout_ms,
                                                        60_000)):
            raise FlushFailed(f"flush to {target} did not finish in time")

    def paused(self) -> threading.Lock:
        """``with flusher.paused():`` — no flush or checkpoint runs inside the block."""
        return self._io_lock

    def reset(self, position: int) -> None:
        """After a truncation: nothing beyond ``position`` exists, flushed or not."""
        with self._lock:
            self.flushed_position = min(self.flushed_position, position)
            self._requested = min(self._requested, position)

    # --- the thread --------------------------------------------------------------------

    def _run(self) -> None:
        config = self._config
        sync_mode = config.flush_mode == "sync"
        now = time.monotonic()
        next_checkpoint = now + config.checkpoint_interval_ms / 1000
        next_thorough = now + config.flush_thorough_interval_ms / 1000
        while True:
            with self._lock:
                if not self._stopping and self._requested <= self.flushed_position:
                    timeout = (next_checkpoint - time.monotonic() if sync_mode
                               else config.flush_interval_ms / 1000)
                    self._work.wait(max(0.0, timeout))
                stopping = self._stopping
            now = time.monotonic()
            try:
                with self._io_lock:
                    if self._due(sync_mode, now >= next_thorough) or stopping:
                        self._flush_log()
                        if now >= next_thorough:
                            next_thorough = now + config.flush_thorough_interval_ms / 1000
                    if now >= next_checkpoint or stopping:
                        self._checkpoint(self._flush_log())
                        next_checkpoint = (time.monotonic()
                                           + config.checkpoint_interval_ms / 1000)
            except OSError as error:
                self._fail(error)
                return
            if stopping:
                return

    def _due(self, sync_mode: bool, thorough: bool) -> bool:
        dirty = self._written() - self.flushed_position
        if dirty <= 0:
            return False
        if sync_mode or thorough or self._requested > self.flushed_position:
            return True
        return dirty >= self._config.flush_pages_min * PAGE_SIZE

    def _flush_log(self) -> int:
        """Sync [flushed, written) and publish it; return the new flushed position."""
        start, target = self.flushed_position, self._written()
        if target > start:
            self._sync_log(start, target)
            with self._lock:
                if target > self.flushed_position:
                    self.flushed_position = target
                    self.flush_count += 1
                    self._on_flushed(target)
                self._release_waiters(lambda end: end <= target)
        return max(target, start)

    def _release_waiters(self, covered: Callable[[int], bool]) -> None:
        """Wake the waiters ``covered`` says are done (called with the lock held)."""
        by_loop: dict[Any, list[asyncio.Future]] = {}
        while self._waiters and covered(self._waiters[0][0]):
            waiter = heapq.heappop(self._waiters)[2]
            if isinstance(waiter, asyncio.Future):
                by_loop.setdefault(waiter.get_loop(), []).append(waiter)
            else:
                waiter.release()
        for loop, futures in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve_all, futures)
            except RuntimeError:
                pass  # that event loop is closed; nobody is waiting any more

    def _fail(self, error: OSError) -> None:
        failure = FlushFailed(
            f"flushing the commit log failed ({error}); writes after position "
            f"{self.flushed_position} may not be durable. Reopen the store to recover.")
        failure.__cause__ = error
        with self._lock:
            self.error = failure
            self._on_failure(failure)
            self._release_waiters(lambda end: True)


def _resolve_all(futures: list[asyncio.Future]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(True)


class _DeadlineWatch:
    """One timer per event loop that resolves overdue flush futures with False.

    Every future waits the same timeout, so deadlines arrive in order and a deque
    suffices; it runs in the loop's own thread, so it needs no lock, and it works even
    when the flush thread is stuck in a sync that never returns.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._pending: deque[tuple[float, asyncio.Future]] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, future: asyncio.Future, timeout: float) -> None:
        self._pending.append((self.loop.time() + timeout, future))
        if self._timer is None:
            self._timer = self.loop.call_at(self._pending[0][0], self._expire)

    def _expire(self) -> None:
        now = self.loop.time()
        while self._pending and (self._pending[0][0] <= now or self._pending[0][1].done()):
            future = self._pending.popleft()[1]
            if not future.done():
                future.set_result(False)
        self._timer = self.loop.call_at(self._pending[0][0], self._expire) \
            if self._pending else None
