"""Engine micro-benchmarks: put, put_batch, get, sync flush under concurrency, recovery.

Each benchmark stores records/s (or GB/s) in ``extra_info`` beside the time pytest-benchmark
reports, and its baseline runs in the same session (``test_baseline_*``), so compare the
two from one run only. The ratio table with targets is ``python -m benchmarks.compare``.
Message sizes run from 16 B to 64 KiB for put_batch, on both cores.
"""

from __future__ import annotations

import time

import pytest

import mqlog
from benchmarks import compare, conftest

SIZES = compare.Sizes(records=200_000, producers=256, per_producer=40, scan_bytes=128 << 20,
                      rounds=1, segment_size_bytes=256 << 20)
if conftest.SMOKE:  # --benchmark-disable: each benchmark runs once, as a test
    SIZES = compare.QUICK
SEGMENT = SIZES.segment_size_bytes
PEDANTIC = dict(rounds=3, iterations=1, warmup_rounds=0)


def _record(benchmark, count: float, unit: str = "records_per_second") -> None:
    """Store ``count`` per second of the median round (nothing when disabled)."""
    median = conftest.median_seconds(benchmark)
    if median is not None:
        benchmark.extra_info[unit] = round(count / median)


def test_put(benchmark, impl, tmp_path):
    sizes = compare.Sizes(**{**SIZES.__dict__, "records": SIZES.records // 4})
    store_root = tmp_path / "s"

    def run() -> None:
        with mqlog.open(store_root, implementation=impl, segment_size_bytes=SEGMENT) as s:
            for _ in range(sizes.records):
                s.put("bench", compare.BODY)
    benchmark.pedantic(run, setup=lambda: _wipe(store_root), **PEDANTIC)
    _record(benchmark, sizes.records)


@pytest.mark.parametrize("body_size", [16, 100, 1024, 16 * 1024, 64 * 1024])
def test_put_batch(benchmark, impl, tmp_path, body_size):
    store_root = tmp_path / "s"
    count = max(200, min(100_000, (64 << 20) // body_size))
    bodies = [b"b" * body_size] * 100

    def run() -> None:
        with mqlog.open(store_root, implementation=impl, segment_size_bytes=SEGMENT) as s:
            for _ in range(count // 100):
                s.put_batch("bench", bodies)
    benchmark.pedantic(run, setup=lambda: _wipe(store_root), **PEDANTIC)
    _record(benchmark, count // 100 * 100)


def test_get(benchmark, impl, tmp_path):
    with mqlog.open(tmp_path / "s", implementation=impl, segment_size_bytes=SEGMENT) as s:
        for _ in range(SIZES.records // 1000):
            s.put_batch("bench", [compare.BODY] * 1000)

        def run() -> int:
            offset = 0
            while batch := s.get("bench", 0, offset, 1000, 1 << 24):
                offset += sum(len(record.body) > 0 for record in batch)
            return offset
        assert benchmark.pedantic(run, **PEDANTIC) == SIZES.records
    _record(benchmark, SIZES.records)


def test_read_raw(benchmark, impl, tmp_path):
    """What a leader does for a follower's fetch: whole records by position, 1 MiB at a
    time, CRCs checked, over a log larger than the CPU's caches (the walk over record
    headers prefetches ahead of itself; docs/BENCHMARKS.md, sixteenth session)."""
    with mqlog.open(tmp_path / "s", implementation=impl, segment_size_bytes=SEGMENT) as s:
        for _ in range(SIZES.records // 1000):
            s.put_batch("bench", [compare.BODY] * 1000)
        end = s.written_position

        def run() -> int:
            position = 0
            while position < end:
                position += len(s.read_raw(position, 1 << 20))
            return position
        assert benchmark.pedantic(run, **PEDANTIC) == end
    median = conftest.median_seconds(benchmark)
    if median is not None:
        benchmark.extra_info["gb_per_second"] = round(end / median / 1e9, 2)


def test_append_raw(benchmark, impl, tmp_path):
    """What a follower does with a fetch answer: a leader's log, in pieces of 96 KiB (an
    ISR follower's answers under acks=1), appended to a new store, every record checked
    and indexed; written with pwrite, no zeros ahead (docs/BENCHMARKS.md, seventeenth
    session). Also stored: the process's CPU time per record, the background threads'
    included (zeros written ahead on another core cost no wall time here, but do on a
    box whose cores are all busy, as a replicated cluster's are)."""
    with mqlog.open(tmp_path / "l", implementation=impl, segment_size_bytes=SEGMENT) as s:
        for _ in range(SIZES.records // 1000):
            s.put_batch("bench", [compare.BODY] * 1000)
        pieces, position = [], 0
        while position < s.written_position:
            pieces.append(s.read_raw(position, 96 << 10))
            position += len(pieces[-1])
    store_root, cpu = tmp_path / "f", []

    def run() -> None:
        started = time.process_time()
        with mqlog.open(store_root, implementation=impl, segment_size_bytes=SEGMENT) as f:
            at = 0
            for piece in pieces:
                at = f.append_raw(at, piece)
            assert at == position
        cpu.append(time.process_time() - started)
    benchmark.pedantic(run, setup=lambda: _wipe(store_root), **PEDANTIC)
    _record(benchmark, SIZES.records)
    benchmark.extra_info["cpu_us_per_record"] = round(_middle(cpu) / SIZES.records * 1e6, 3)


@pytest.mark.parametrize("flavour", ["threads", "asyncio"])
def test_sync_flush_256_producers(benchmark, tmp_path, flavour):
    measure = compare.mqlog_sync_threads if flavour == "threads" else compare.mqlog_sync_asyncio
    results = []
    benchmark.pedantic(lambda: results.append(measure(tmp_path / "s", SIZES)), **PEDANTIC)
    rates, per_fsync = zip(*results, strict=True)
    benchmark.extra_info["acked_records_per_second"] = round(_middle(rates))
    benchmark.extra_info["records_per_fsync"] = round(_middle(per_fsync))


def test_recovery_scan(benchmark, tmp_path):
    results = []
    benchmark.pedantic(lambda: results.append(compare.mqlog_recovery(tmp_path / "s", SIZES)),
                       **PEDANTIC)
    benchmark.extra_info["scan_gb_per_second"] = round(_middle([r[0] for r in results]), 2)
    benchmark.extra_info["read_gb_per_second"] = round(_middle([r[1] for r in results]), 2)


@pytest.mark.parametrize("baseline", ["file_append", "lmdb_putmulti", "lmdb_cursor",
                                      "fdatasync_each"])
def test_baseline(benchmark, tmp_path, baseline):
    measure = getattr(compare, baseline)
    rates = []
    benchmark.pedantic(lambda: rates.append(measure(tmp_path / "b", SIZES)), **PEDANTIC)
    benchmark.extra_info["records_per_second"] = round(_middle(rates))


def _middle(values) -> float:  # noqa: ANN001
    """The median of the rounds measured (one when benchmarking is disabled)."""
    return sorted(values)[len(values) // 2]


def _wipe(path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
