"""pytest-benchmark suite: `make bench` (pytest benchmarks --benchmark-only).

``pytest benchmarks --benchmark-disable`` runs every benchmark once as a plain test, so
the suite cannot rot unnoticed: then ``SMOKE`` is true (set before the test modules are
imported), the modules pick small sizes, and nothing reads the timing statistics, which
pytest-benchmark does not collect when disabled (``benchmark.stats`` is None).
"""

from __future__ import annotations

import os

import pytest

from mqlog import ext

IMPLEMENTATIONS = ["python"]
try:
    ext.load("cython")
    IMPLEMENTATIONS.insert(0, "cython")
except ImportError:
    pass

SMOKE = False  # --benchmark-disable: run each benchmark once, on small sizes


def pytest_configure(config: pytest.Config) -> None:
    global SMOKE
    SMOKE = bool(config.getoption("benchmark_disable", default=False))
    if SMOKE:  # the modules that size themselves from the environment
        os.environ.setdefault("MQLOG_BENCH_QUERY_RECORDS", "20000")
        os.environ.setdefault("MQLOG_SPARK_BENCH_RECORDS", "20000")


def median_seconds(benchmark) -> float | None:  # noqa: ANN001  (pytest-benchmark's fixture)
    """The median time of a round, or None when benchmarking is disabled."""
    return None if benchmark.stats is None else benchmark.stats.stats.median


@pytest.fixture(params=IMPLEMENTATIONS)
def impl(request: pytest.FixtureRequest) -> str:
    return request.param
