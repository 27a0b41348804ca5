"""mqlog/engine/checkpoints.py: one checkpoint thread per process, whatever the number
of stores open in it (a broker hosts one store per partition replica).

* Stores: twelve stores open at once share one ``mqlog-checkpoint`` thread; each one's
  log is checkpointed as it grows; once all are closed no checkpoint thread is left, and
  a store opened later starts one again.
* The scheduler alone, with calls that record themselves: one call at a time, each
  store's calls at least its interval apart, a call returning False ends that store's
  schedule, ``remove`` returns only once a call of that store under way has ended (a
  store's close never overlaps its scheduled checkpoint), and the thread ends with the
  last store.
"""

from __future__ import annotations

import itertools
import threading
import time

import mqlog
from mqlog.engine import checkpoints
from mqlog.engine.checkpoints import CheckpointScheduler
from mqlog.replication.local import wait_until


def _checkpoint_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "mqlog-checkpoint"]


def test_stores_in_one_process_share_one_checkpoint_thread(tmp_path, impl):
    stores = [mqlog.open(tmp_path / f"s{index}", implementation=impl,
                         checkpoint_interval_ms=20, flush_interval_ms=20)
              for index in range(12)]
    try:
        assert len(_checkpoint_threads()) == 1
        assert checkpoints.SCHEDULER.stores == 12
        for index, store in enumerate(stores):
            store.put("t", b"x" * (index + 1))
        wait_until(lambda: all(store.checkpointed_position == store.flushed_position > 0
                               for store in stores), "every store checkpointed", 30)
    finally:
        for store in stores:
            store.close()
    assert checkpoints.SCHEDULER.stores == 0 and _checkpoint_threads() == []
    with mqlog.open(tmp_path / "later", implementation=impl) as store:
        store.put("t", b"y")
        assert len(_checkpoint_threads()) == 1
    assert _checkpoint_threads() == []


def test_one_call_at_a_time_each_store_at_most_every_interval() -> None:
    scheduler = CheckpointScheduler()
    lock, running, calls = threading.Lock(), [0], {name: [] for name in "abcd"}
    overlapped: list[str] = []

    def call(name: str, stop_after: int) -> bool:
        with lock:
            running[0] += 1
            if running[0] > 1:
                overlapped.append(name)
        calls[name].append(time.monotonic())
        with lock:
            running[0] -= 1
        return len(calls[name]) < stop_after

    for name, stop_after in zip("abcd", (3, 3, 3, 1), strict=True):
        scheduler.add(name, 0.02, lambda name=name, stop_after=stop_after:
                      call(name, stop_after))
    wait_until(lambda: scheduler.stores == 0, "every store's schedule ended", 30)
    assert not overlapped
    assert [len(calls[name]) for name in "abcd"] == [3, 3, 3, 1]
    for times in calls.values():
        assert all(later - earlier >= 0.02 for earlier, later in itertools.pairwise(times))
    wait_until(lambda: scheduler._thread is None, "the thread let go", 30)


def test_remove_waits_for_a_call_under_way() -> None:
    scheduler = CheckpointScheduler()
    started, release = threading.Event(), threading.Event()

    def slow() -> bool:
        started.set()
        release.wait(30)
        return True

    scheduler.add("slow", 0.001, slow)
    scheduler.add("other", 60, lambda: True)
    assert started.wait(30)
    removed = threading.Thread(target=scheduler.remove, args=("slow",))
    removed.start()
    removed.join(0.2)
    assert removed.is_alive(), "remove returned while the store's checkpoint ran"
    release.set()
    removed.join(30)
    assert not removed.is_alive() and scheduler.stores == 1
    thread = scheduler._thread
    assert thread is not None and thread.is_alive()
    scheduler.remove("other")  # the last one: the thread ends, joined
    assert not thread.is_alive() and scheduler._thread is None
