"""Shared fixtures: every engine test runs on each log core that is available."""

from __future__ import annotations

import os
import random

import pytest

import mqlog
from mqlog import ext

IMPLEMENTATIONS = ["python"]
try:
    ext.load("cython")
    IMPLEMENTATIONS.insert(0, "cython")
except ImportError:
    if os.environ.get("MQLOG_REQUIRE_EXTENSION"):
        raise

# Small files so that rolls, blanks and multi-file queues happen in every test.
SMALL = dict(segment_size_bytes=64 * 1024, message_size_bytes_max=16 * 1024,
             consume_queue_entries_per_file=64, checkpoint_interval_ms=50,
             index_slots_per_file=64, index_entries_per_file=512)


@pytest.fixture(params=IMPLEMENTATIONS)
def impl(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def open_store(tmp_path, impl):
    """open_store(**overrides) opens (or reopens) a small-file store in tmp_path/store."""
    opened: list[mqlog.Store] = []

    def _open(path=None, **overrides):
        settings = {**SMALL, **overrides}
        store = mqlog.open(path or tmp_path / "store", implementation=impl, **settings)
        opened.append(store)
        return store

    yield _open
    for store in opened:
        store.close()


@pytest.fixture
def seed() -> int:
    """A fresh seed (MQLOG_TEST_SEED replays one); printed, so a failure shows it."""
    value = int(os.environ.get("MQLOG_TEST_SEED", random.randrange(1 << 32)))
    print(f"random seed: {value} (rerun with MQLOG_TEST_SEED={value})")
    return value


@pytest.fixture
def rng(seed: int) -> random.Random:
    """A Random drawn from the ``seed`` fixture."""
    return random.Random(seed)


def local_spark_session():
    """The tests' Spark session: local[2], no UI, UTC, the "mqlog" format registered
    (getOrCreate: one per process, whichever module asks first)."""
    import sys

    from pyspark.sql import SparkSession

    from mqlog.spark_connector import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    session = (SparkSession.builder.master("local[2]").appName("mqlog-tests")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session
