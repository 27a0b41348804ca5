"""The put path's shortcuts (ext/_core.pyx) change nothing a caller can see.

The C core refills a PutResult its caller dropped instead of making a new one (the
way zip() reuses its tuple), and takes its write lock without a clock read. A result a
caller still holds must never change, in any pattern of holding and dropping them, and
every answer must be the one the twin gives.
"""

from __future__ import annotations

import gc
import threading

from mqlog.results import PutResult, PutStatus


def _expected(results: list[PutResult]) -> None:
    for offset, result in enumerate(results):
        assert type(result) is PutResult and result.status is PutStatus.PUT_OK
        assert result.offset == offset
        if offset:
            assert result.position == results[offset - 1].end_position


def test_results_held_by_the_caller_never_change(open_store):
    store = open_store()
    held = []
    for round_ in range(50):
        store.put("t", b"dropped")  # a result nobody holds: refilled next time
        last = store.put("t", b"rebound")  # held until rebound below
        snapshot = tuple(last)
        if round_ % 3 == 0:
            held.append((last, snapshot))
        store.put("t", b"dropped again")
        assert tuple(last) == snapshot
        del last
    gc.collect()
    for result, snapshot in held:
        assert tuple(result) == snapshot
    results = [record for record in store.get("t", 0, 0, 1000)]
    assert len(results) == 150
    offsets = [snapshot[2] for _, snapshot in held]
    assert offsets == list(range(1, 150, 9))


def test_every_result_pattern_gives_the_twins_answers(tmp_path):
    """The same puts on both cores, results kept, dropped and rebound in turn (the
    clock fixed, so store timestamps agree): equal answers."""
    import mqlog

    answers = {}
    for implementation in ("python", "cython"):
        try:
            store = mqlog.open(tmp_path / implementation, implementation=implementation,
                               clock_ms=lambda: 1_000)
        except ImportError:
            continue
        seen, kept = [], []
        with store:
            for index in range(300):
                result = store.put("t", b"b" * (index % 7), queue_id=index % 3)
                seen.append(tuple(result))
                if index % 5 == 0:
                    kept.append(result)
        assert [tuple(result) for result in kept] == seen[::5]
        answers[implementation] = seen
    assert len(set(map(tuple, answers.values()))) == 1


def test_results_stay_right_under_threads(open_store):
    """Writers on several threads, each holding some results and dropping others."""
    store = open_store()
    held: list[list[tuple[PutResult, tuple]]] = [[] for _ in range(4)]

    def write(worker: int) -> None:
        for index in range(500):
            result = store.put("t", b"x", queue_id=worker)
            if index % 7 == 0:
                held[worker].append((result, tuple(result)))

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for worker in range(4):
        assert all(tuple(result) == snapshot for result, snapshot in held[worker])
        assert [snapshot[2] for _, snapshot in held[worker]] == list(range(0, 500, 7))
    _expected([store.put("u", b"y") for _ in range(10)])


def test_put_cost_benchmark_runs(tmp_path, monkeypatch, capsys):
    """benchmarks/put_cost.py, tiny, against this tree itself: every row is reported."""
    from pathlib import Path

    from benchmarks import put_cost

    monkeypatch.setenv("MQLOG_BENCH_DIR", str(tmp_path))
    root = Path(put_cost.__file__).resolve().parent.parent
    assert put_cost.main(["--baseline", str(root), "--rounds", "1", "--records", "3000",
                          "--threads", "4", "--per-thread", "3", "--batches", "3"]) == 0
    report = capsys.readouterr().out
    for row in ("put, this tree", "sync, baseline", "put, ceiling", "sync, ceiling",
                "durable, this tree", "durable, baseline", "durable, file + fdatasync"):
        assert f"| {row}" in report, report
