"""pytest-benchmark suite: `make bench` (pytest benchmarks --benchmark-only)."""

from __future__ import annotations

import pytest

from mqlog import ext

IMPLEMENTATIONS = ["python"]
try:
    ext.load("cython")
    IMPLEMENTATIONS.insert(0, "cython")
except ImportError:
    pass


@pytest.fixture(params=IMPLEMENTATIONS)
def impl(request: pytest.FixtureRequest) -> str:
    return request.param
