"""The flush service: the log's syncs (group commit), interval flushes, and checkpoints.

Two modes, as in RocketMQ:

* ``sync`` is group commit. A writer thread that must wait calls ``wait_flushed(end)``.
  If nobody is syncing, it leads: it syncs everything written at that moment itself,
  with one msync per segment touched (GIL released), publishes the new flushed
  position, moves the waiters that sync covers to the ready queue and hands the lead
  to the first waiter it does not cover, whose own thread syncs next. If someone is
  syncing, it joins a heap of waiters ordered by end position. So a lone writer's
  durable put costs its own msync and no thread hand-off (as a buffered file's write
  + fdatasync does), and many writers share each sync: writers that arrive during one
  are covered by the next.
  Covered waiters are woken one at a time, each by a thread that is about to sleep
  (wake-on-block): a writer going to sleep in ``wait_flushed`` (or to sync as the
  leader) takes the first ready waiter and wakes it in the same call that lets the GIL
  go and sleeps (the core's ``Waiter.wait(timeout, wake=...)``). The woken thread then
  finds the GIL free: one thread switch per acknowledged record. Woken all at once,
  hundreds of threads would queue for the GIL, each sleeping twice; woken by a thread
  that keeps the GIL, the woken one often preempts it, finds the GIL taken and sleeps
  again (three switches a record). A leader that ends its sync with ready waiters and
  nobody to lead next wakes the first itself (so a sync always starts a chain), and a
  chain whose woken thread never waits again (it stopped writing) is restarted by the
  flush thread after ``flush_sync_handoff_stall_us`` without one. A waiter that
  gives up at its deadline leaves the heap or the ready queue; one woken right then
  leads if it was handed the lead. That bookkeeping (the flushed position, the error,
  the leader, the heap, the ready queue) is the core's ``GroupCommit``: in C each step
  is one call that runs no Python code, so the GIL makes it atomic and a sync put from
  a thread costs no Python-level lock, heap or deque (ext/_waiter.pxi); the twin takes
  the same steps under a lock. This module runs the leader's sync and the flush thread.
  An asyncio task awaits the future ``durable_future(end)`` gives it (Store.put_async
  awaits it directly, no coroutine between: ~1 us of a put's CPU), which
  joins its loop's deque (puts on one loop happen in order, so the deque is already
  sorted, and the loop asks the flush thread for a sync once per iteration, not once
  per put); the flush thread completes a prefix of each loop's deque with one
  ``call_soon_threadsafe``. A waiter whose deadline passes gets False (the store
  reports FLUSH_DISK_TIMEOUT, never a silent success).
* ``async`` looks every ``flush_interval_ms`` and syncs once ``flush_pages_min`` pages
  are dirty (RocketMQ's flushLeastPages); less than that waits for the next checkpoint
  (below: at most ``max(checkpoint_interval_ms, flush_interval_ms)``) or
  ``flush_thorough_interval_ms``, whichever comes first.

Either way, every ``checkpoint_interval_ms`` a checkpoint syncs the log, then the
consume queues up to where they are, and writes the checkpoint: on the process's
checkpoint thread (checkpoints.py: one for every store open in the process, one
checkpoint at a time), so that its fsyncs never stall a sync waiter. One log sync runs
at a time (``_sync_lock``) and one checkpoint (``_checkpoint_lock``); ``paused()`` takes
both, so a truncation never lands between a checkpoint's snapshot and its write. A
checkpoint that fails for want of disk space or descriptors is only postponed (the log
is durable; recovery would scan from the previous one): it never fences the store. A
checkpoint whose position is the last one's is not written again: an idle store does no
I/O, and its files hold still (a checkpoint replaces its file: on a full disk that gives
room back and takes it again).

A failed sync is never swallowed: the error is kept, every waiter raises FlushFailed,
and the store is fenced (StoreFailed) until it is reopened and recovery finds out what
really reached the disk — after a failed fsync the kernel may have dropped the pages.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from mqlog.config import PAGE_SIZE, StoreConfig
from mqlog.engine import checkpoints
from mqlog.engine.files import typed_os_error
from mqlog.errors import DiskFull, FlushFailed, TooManyOpenFiles

if TYPE_CHECKING:
    import asyncio


# GroupCommit.wait's answers (the core's WAIT_DURABLE and WAIT_LEAD; test_group_commit
# checks both cores agree): durable, or this thread syncs for all now.
_WAIT_DURABLE = 1
_WAIT_LEAD = 2


class FlushService:
    """Owns the flushed position; ``sync_log`` and ``checkpoint`` do the I/O."""

    def __init__(self, config: StoreConfig, *, written: Callable[[], int],
                 sync_log: Callable[[int, int], None], checkpoint: Callable[[int], None],
                 on_flushed: Callable[[int], None], on_failure: Callable[[FlushFailed], None],
                 flushed_position: int, group: Callable[[int], Any]) -> None:
        self._config = config
        self._threaded = config.background_threads  # False: flushes run in the caller
        self._written = written
        self._sync_log = sync_log
        self._checkpoint = checkpoint
        self._on_flushed = on_flushed
        self._on_failure = on_failure
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # the thread waits here
        self._sync_lock = threading.Lock()  # one log sync at a time: a leader's or the thread's
        self._checkpoint_lock = threading.Lock()  # held through a checkpoint
        # The core's GroupCommit (see _waiter.pxi): the flushed position, the error, the
        # leader, the waiting writers' heap and the ready queue of covered ones.
        self._group = group(flushed_position)
        self._requested = flushed_position
        self._idle = False  # the flush thread sleeps with no deadline: notify it
        self._loops: dict[Any, _LoopWaiters] = {}  # asyncio waiters, per event loop
        self._timeout_s = config.flush_sync_timeout_ms / 1000
        self.flush_count = 0  # syncs done, for "records per fsync" figures
        self.checkpoint_error: DiskFull | TooManyOpenFiles | None = None  # the last one
        # The log position the last checkpoint written covers (the one written at open).
        self.checkpointed_position = flushed_position
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="mqlog-flush", daemon=True)
        self._scheduled = False  # checkpoints by the process's scheduler (checkpoints.py)

    @property
    def flushed_position(self) -> int:
        return self._group.flushed_position  # type: ignore[no-any-return]

    @property
    def error(self) -> FlushFailed | None:
        return self._group.error  # type: ignore[no-any-return]

    def start(self) -> None:
        if self._threaded:
            self._thread.start()
            checkpoints.SCHEDULER.add(self, self._checkpoint_interval_s(),
                                      self._checkpoint_once)
            self._scheduled = True

    def stop(self) -> None:
        """Flush what is written, checkpoint, and end the threads."""
        if not self._threaded:
            self._flush_inline(checkpoint=True)
            return
        with self._lock:
            self._stopping = self._group.stopping = True
            self._work.notify_all()
        self._thread.join()
        self._unschedule()
        self._checkpoint_once()  # (the last one: where the log ends now)

    def _unschedule(self) -> None:
        """No more scheduled checkpoints (one under way ends first)."""
        if self._scheduled:
            self._scheduled = False
            checkpoints.SCHEDULER.remove(self)

    def abandon(self, reason: str) -> None:
        """End the threads with no flush and no checkpoint (Store.abandon: a crash).
        A sync or checkpoint under way finishes first (the files are unmapped next);
        every waiter, and every later one, raises FlushFailed."""
        failure = FlushFailed(f"the store was abandoned ({reason}) before its flush: writes "
                              f"after position {self.flushed_position} may not be durable")
        with self.paused(), self._lock:
            self._group.error = self.error or failure
            self._stopping = self._group.stopping = True
            self._work.notify_all()
            self._release_waiters(None)
        self._unschedule()
        if self._thread.ident is not None:
            self._thread.join()

    # --- writers -----------------------------------------------------------------------

    def wait_flushed(self, end_position: int, timeout_ms: int | None = None) -> bool:
        """Block until the log is durable up to ``end_position``; False at the deadline.
        The waiting (and the hand-offs) happen in the core's GroupCommit; this thread
        syncs for all when it answers WAIT_LEAD."""
        timeout = self._config.flush_sync_timeout_ms if timeout_ms is None else timeout_ms
        if not self._threaded and not self._settled(end_position):
            self._flush_inline(checkpoint=False)
        answer = self._group.wait(end_position, timeout / 1000)
        if answer != _WAIT_LEAD:
            return answer == _WAIT_DURABLE  # type: ignore[no-any-return]
        self._lead()  # first, or handed the lead by the one before
        return self._raise_error_or(self.flushed_position >= end_position)

    def _lead(self) -> None:
        """Sync everything written so far from this (a waiting writer's) thread, then
        hand the lead on (GroupCommit.lead_done: to the first waiter it does not cover,
        or, with nobody to lead, wake the first covered waiter, so the queue drains)."""
        try:
            with self._sync_lock:
                self._flush_log()
        except OSError as error:
            self._fail(error)
        finally:
            self._group.lead_done()

    async def wait_flushed_async(self, end_position: int) -> bool:
        """``wait_flushed`` for an asyncio task, resolved by the loop's _LoopWaiters."""
        future = self.durable_future(end_position)
        return True if future is None else self.outcome(await future)

    def durable_future(self, end_position: int) -> asyncio.Future | None:
        """What an asyncio task awaits until the log is durable up to ``end_position``:
        None if it is already, else a future of the running loop that becomes True once
        it is (False at the deadline; pass what it gives to ``outcome``). Raises the
        flush error. A plain call, so a sync put from a task awaits one future and no
        coroutine of ours (Store.put_async: ~1 us of a put's ~10 us of CPU here)."""
        group = self._group
        if group.error is not None:
            raise group.error
        if group.flushed_position >= end_position:
            return None
        if not self._threaded:
            self._flush_inline(checkpoint=False)
            if self._settled(end_position):
                return None
        loop = _running_loop()
        waiters = self._loops.get(loop)  # (a running loop is not closed)
        if waiters is None:
            with self._lock:
                waiters = self._loops[loop] = _LoopWaiters(loop, self)
                self._loops = {k: v for k, v in self._loops.items() if not k.is_closed()}
        future = waiters.add(end_position, self._timeout_s)
        # A flush published between the look above and add skipped this loop (its deque
        # was empty then): look again now that the future is queued, or it would wait
        # for its deadline although the record is durable.
        if group.flushed_position >= end_position:
            waiters.resolve(group.flushed_position)
        return future

    def outcome(self, durable: bool) -> bool:
        """A durable_future's result: raises the flush error if a flush failed."""
        if self._group.error is not None:
            raise self._group.error
        return durable

    def _request_from_loop(self, end_position: int) -> None:
        with self._lock:
            if end_position > self._requested:
                self._requested = end_position
                self._work.notify()

    def _settled(self, end_position: int) -> bool:
        """True if no wait is needed; raises the flush error if there was one."""
        if self.error is not None:
            raise self.error
        return self.flushed_position >= end_position

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
        if not self._threaded:
            return self._flush_inline(checkpoint=False)
        target = self._written()
        self.request()
        if not self.wait_flushed(target, timeout_ms=max(self._config.flush_sync_timeout_ms,
                                                        60_000)):
            raise FlushFailed(f"flush to {target} did not finish in time")

    @contextmanager
    def paused(self) -> Iterator[None]:
        """``with flusher.paused():`` — no flush or checkpoint runs inside the block."""
        with self._checkpoint_lock, self._sync_lock:
            yield

    def reset(self, position: int, checkpointed: int) -> None:
        """After a truncation: nothing beyond ``position`` exists, flushed or not; the
        checkpoint was lowered to ``checkpointed``."""
        with self._lock:
            self._group.flushed_position = min(self.flushed_position, position)
            self._requested = min(self._requested, position)
            self.checkpointed_position = checkpointed

    def start_over(self, position: int) -> None:
        """After a reset: the log begins, empty, at ``position`` (nothing to flush), and
        a checkpoint says so."""
        with self._lock:
            self._group.flushed_position = self._requested = position
            self.checkpointed_position = position

    # --- the thread --------------------------------------------------------------------

    def _run(self) -> None:
        """The flush thread: asyncio waiters' syncs (sync mode), interval flushes (async)."""
        config = self._config
        sync_mode = config.flush_mode == "sync"
        next_thorough = time.monotonic() + config.flush_thorough_interval_ms / 1000
        while True:
            handoff = None
            with self._lock:
                if not self._stopping and self._requested <= self.flushed_position:
                    if self._group.ready_count:
                        handoff = self._watch_handoffs()
                    else:
                        self._idle = True  # until a sync leaves ready waiters
                        self._work.wait(None if sync_mode else config.flush_interval_ms / 1000)
                        self._idle = False
                stopping = self._stopping
            if handoff is not None:
                handoff.wake()
            now = time.monotonic()
            try:
                if self._due(sync_mode, now >= next_thorough) or stopping:
                    with self._sync_lock:
                        self._flush_log()
                    if now >= next_thorough:
                        next_thorough = now + config.flush_thorough_interval_ms / 1000
            except OSError as error:
                self._fail(error)
                return
            if stopping:
                self._group.wake_all_ready()  # nobody writes any more: nobody would wake them
                return

    def _watch_handoffs(self) -> Any:
        """Wait up to the stall time (called with the lock held); if no ready waiter was
        woken meanwhile, take the first for the flush thread to wake: the threads that
        would have woken it stopped writing (see the module docstring)."""
        stall = self._config.flush_sync_handoff_stall_us / 1e6
        seen, since = self._group.handoffs, time.monotonic()
        self._work.wait(stall)
        if self._group.handoffs == seen and time.monotonic() - since >= stall:
            return self._group.take_ready()
        return None

    def _checkpoint_interval_s(self) -> float:
        config = self._config
        interval = config.checkpoint_interval_ms / 1000
        if config.flush_mode != "sync":  # a checkpoint flushes the log: no more often
            interval = max(interval, config.flush_interval_ms / 1000)
        return interval

    def _checkpoint_once(self) -> bool:
        """One checkpoint (the scheduler's thread calls it: off the syncs' path, so its
        fsyncs never stall a sync-flush waiter); False once the store is fenced."""
        try:
            with self._checkpoint_lock:
                if self.error is not None:
                    return False
                with self._sync_lock:
                    position = self._flush_log()
                # Nothing new since the last one: rewriting it would cost two fsyncs a
                # second on an idle store, and on a full disk each rewrite gives back the
                # block of the file it replaces (a writer may find room that comes and goes).
                if position != self.checkpointed_position or self.checkpoint_error:
                    self._write_checkpoint(position)
            return True
        except OSError as error:
            self._fail(error)
            return False

    def _write_checkpoint(self, position: int) -> None:
        """Checkpoint; a full disk or no free descriptor only postpones it (the log is
        durable, and recovery scans from the previous checkpoint), never fences."""
        try:
            self._checkpoint(position)
            self.checkpoint_error = None
            self.checkpointed_position = position
        except (DiskFull, TooManyOpenFiles) as error:
            self.checkpoint_error = error
        except OSError as error:
            typed = typed_os_error(error, "cannot write the checkpoint")
            if typed is error:
                raise
            self.checkpoint_error = typed  # type: ignore[assignment]

    def _flush_inline(self, checkpoint: bool) -> None:
        """Without a thread: flush (and checkpoint) now, from the caller."""
        if self.error is not None:
            raise self.error
        try:
            with self.paused():
                flushed = self._flush_log()
                if checkpoint:
                    self._write_checkpoint(flushed)
        except OSError as error:
            self._fail(error)
            raise self.error from None  # type: ignore[misc]

    def _due(self, sync_mode: bool, thorough: bool) -> bool:
        dirty = self._written() - self.flushed_position
        if dirty <= 0:
            return False
        if sync_mode or thorough or self._requested > self.flushed_position:
            return True
        return dirty >= self._config.flush_pages_min * PAGE_SIZE

    def _flush_log(self) -> int:
        """Sync [flushed, written) and publish it; return the new flushed position.
        Nothing after a failure (or an abandon): the store is fenced."""
        if self.error is not None:
            return self.flushed_position
        start, target = self.flushed_position, self._written()
        if target > start:
            self._sync_log(start, target)
            with self._lock:
                if target > self.flushed_position:
                    self.flush_count += 1
                    self._on_flushed(target)  # (committed first: an acked put reads back)
                self._release_waiters(target)
        return max(target, start)

    def _release_waiters(self, target: int | None) -> None:
        """Publish ``target`` as the flushed position: the waiters it covers go to the
        ready queue (called with the lock held; threads going to sleep wake them, see
        the module docstring), and every asyncio loop's are completed with one call.
        None: after a failure or an abandon, every waiter is woken now, each raises."""
        if target is None:
            self._group.release_all()
            ready = 0
        else:
            ready = self._group.publish(target)
        if ready and self._idle:
            self._work.notify()  # the flush thread watches that they are woken
        flushed = self.flushed_position if self.error is None else None
        for waiters in self._loops.values():
            if waiters.pending:
                try:
                    waiters.loop.call_soon_threadsafe(waiters.resolve, flushed)
                except RuntimeError:
                    pass  # that event loop is closed; nobody is waiting any more

    def _fail(self, error: OSError) -> None:
        failure = FlushFailed(
            f"flushing the commit log failed ({error}); writes after position "
            f"{self.flushed_position} may not be durable. Reopen the store to recover.")
        failure.__cause__ = error
        with self._lock:
            self._group.error = failure
            self._on_failure(failure)
            self._release_waiters(None)


def _running_loop() -> asyncio.AbstractEventLoop:
    """asyncio.get_running_loop, imported when first needed: an embedded store that
    never awaits does not load asyncio."""
    global _get_running_loop
    if _get_running_loop is None:
        from asyncio import get_running_loop

        _get_running_loop = get_running_loop
    return _get_running_loop()


_get_running_loop: Callable[[], asyncio.AbstractEventLoop] | None = None


class _LoopWaiters:
    """The futures of one event loop waiting for flushes, in end-position order.

    Only the loop's own thread touches the deque (the flush thread reaches it through
    ``call_soon_threadsafe``), so it needs no lock. Every future waits the same timeout,
    so the oldest is both the first to be flushed and the first to expire: one timer at
    the front's deadline serves them all, and works even when the flush thread is stuck.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, service: FlushService) -> None:
        self.loop = loop
        self._service = service
        self.pending: deque[tuple[int, float, asyncio.Future]] = deque()
        self._request_scheduled = False
        self._timer: asyncio.TimerHandle | None = None

    def add(self, end_position: int, timeout: float) -> asyncio.Future:
        future = self.loop.create_future()
        self.pending.append((end_position, self.loop.time() + timeout, future))
        if not self._request_scheduled:  # one flush request per loop iteration
            self._request_scheduled = True
            self.loop.call_soon(self._request)
        if self._timer is None:
            self._timer = self.loop.call_at(self.pending[0][1], self._expire)
        return future

    def _request(self) -> None:
        self._request_scheduled = False
        if self.pending:
            self._service._request_from_loop(self.pending[-1][0])

    def resolve(self, flushed: int | None) -> None:
        """Complete the futures up to ``flushed`` (None: the flush failed, complete all)."""
        pending = self.pending
        while pending and (flushed is None or pending[0][0] <= flushed):
            future = pending.popleft()[2]
            if not future.done():
                future.set_result(True)

    def _expire(self) -> None:
        now, pending = self.loop.time(), self.pending
        while pending and (pending[0][1] <= now or pending[0][2].done()):
            future = pending.popleft()[2]
            if not future.done():
                future.set_result(False)
        self._timer = self.loop.call_at(pending[0][1], self._expire) if pending else None
