"""Query micro-benchmarks on a large store: key query and offset_for_timestamp.

One store of ``MQLOG_BENCH_QUERY_RECORDS`` records (default 10 M, 100-byte bodies, a
million distinct keys over three queues: ten records a key) is built once per session
on the C core, and one of a fiftieth of that on the pure-Python twin. Each benchmark
reports p50 and p99 latency over a seeded sample of lookups in ``extra_info``, and
``test_query_baseline_get_one`` measures the floor in the same run: reading one record
by offset, what any lookup costs at least. Compare a query's figures with that
baseline's from the same run only.

    pytest benchmarks/test_queries.py --benchmark-only
    MQLOG_BENCH_QUERY_RECORDS=200000 pytest benchmarks/test_queries.py --benchmark-only
"""

from __future__ import annotations

import os
import random
import time

import pytest

import mqlog
from benchmarks import compare
from benchmarks.conftest import IMPLEMENTATIONS

RECORDS = int(os.environ.get("MQLOG_BENCH_QUERY_RECORDS", 10_000_000))
KEYS = max(1, RECORDS // 10)
SAMPLES = 2_000
PEDANTIC = dict(rounds=5, iterations=1, warmup_rounds=1)


@pytest.fixture(scope="module", params=IMPLEMENTATIONS)
def big_store(request, tmp_path_factory):
    """The C core's store has RECORDS records; the pure-Python twin's a fiftieth."""
    path = tmp_path_factory.mktemp("query-store")
    store = mqlog.open(path, implementation=request.param, segment_size_bytes=1 << 30)
    put, body = store.put, compare.BODY
    count = RECORDS if request.param == "cython" else RECORDS // 50
    for index in range(count):
        put("orders", body, index % 3, key=f"order-{index % KEYS}")
    started = time.perf_counter()
    store.query("orders", "order-0")  # index everything committed
    print(f"\n{request.param}: built {count:,} records; indexing took "
          f"{time.perf_counter() - started:.1f} s")
    yield store
    store.close()


def _latencies(action, arguments: list) -> dict[str, float]:
    samples = []
    for argument in arguments:
        started = time.perf_counter_ns()
        action(argument)
        samples.append(time.perf_counter_ns() - started)
    samples.sort()
    return {"p50_us": round(samples[len(samples) // 2] / 1000, 1),
            "p99_us": round(samples[len(samples) * 99 // 100] / 1000, 1)}


def test_query_by_key(benchmark, big_store):
    rng = random.Random(2026)
    stored_keys = min(KEYS, big_store.max_offset("orders", 0) * 3)
    keys = [f"order-{rng.randrange(stored_keys)}" for _ in range(SAMPLES)]
    hits = big_store.query("orders", keys[0])
    assert hits and all(record.key == keys[0] for record in hits)
    benchmark.pedantic(lambda: [big_store.query("orders", key) for key in keys[:200]],
                       **PEDANTIC)
    benchmark.extra_info.update(_latencies(lambda key: big_store.query("orders", key), keys))


def test_offset_for_timestamp(benchmark, big_store):
    first = big_store.get("orders", 0, 0, 1)[0].store_timestamp
    last = big_store.get("orders", 0, big_store.max_offset("orders", 0) - 1, 1)[0]
    rng = random.Random(2026)
    moments = [rng.randint(first, last.store_timestamp) for _ in range(SAMPLES)]

    def lookup(moment: int) -> int:
        return big_store.offset_for_timestamp("orders", 0, moment)

    benchmark.pedantic(lambda: [lookup(moment) for moment in moments[:200]], **PEDANTIC)
    benchmark.extra_info.update(_latencies(lookup, moments))


def test_query_baseline_get_one(benchmark, big_store):
    rng = random.Random(2026)
    end = big_store.max_offset("orders", 1)
    offsets = [rng.randrange(end) for _ in range(SAMPLES)]

    def get_one(offset: int) -> object:
        return big_store.get("orders", 1, offset, 1)

    benchmark.pedantic(lambda: [get_one(offset) for offset in offsets[:200]], **PEDANTIC)
    benchmark.extra_info.update(_latencies(get_one, offsets))
