"""Timing the Spark jobs (reconcile, replay) on small and on large stores, with task counts.

Run: ``MQLOG_REQUIRE_EXTENSION=1 .venv/bin/python -m benchmarks.spark_jobs`` (``--big N``
sets the large stores' record count, default 1,000,000; ``--big 0`` skips them).

Everything runs in one Spark session built the way ``mqlog reconcile``/``mqlog replay``
build theirs (``cli.session``: ``local[*]``, here 2 cores), whose start is timed on its
own, and so is what the first job of a session pays once (``_warm``: the source's
registration, a first read, a first DataFrame from Arrow). Stores use the engine's
default configuration (segments allocated at their full size), except the large ones
(``BIG_SEGMENT_BYTES`` segments, to keep their copies cheap). Cases, each timed from the
call to the job's last answer, what the CLI prints included:

* reconcile of 3 replicas x 2,000 records (one replica 100 records short, one with 10
  records more), compared on the driver (the default for small replicas) and again by
  Spark shuffles (``driver_bytes_max=0``: the way large replicas take), for a same-run
  ratio;
* replay of 400 records to Parquet, and into a new store;
* reconcile of 2 replicas x ``--big`` records of 100-byte bodies (one 1,000 records
  short), replay of all of them to Parquet and into a new store.

For each case the Spark jobs it ran are counted (a job group per case, read back from
the status tracker): stages, the most tasks in one stage, and all tasks. Targets
(issue 15): reconcile small <= 10 s, replay small <= 5 s each, once the session is up;
no stage with more tasks than max(2 x cores, data / 64 MiB).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import mqlog

SMALL_RECORDS = 2_000
REPLAY_RECORDS = 400
BIG_SEGMENT_BYTES = 256 << 20
BODY_SIZE = 100


def _small_store(path: str, count: int, rng: random.Random) -> None:
    with mqlog.open(path) as store:
        for index in range(count):
            store.put(("orders", "payments")[index % 2], rng.randbytes(rng.randrange(20, 200)),
                      index % 2, key=f"k{index % 7}", tags="t",
                      properties={"n": str(index)} if index % 5 == 0 else None)


def big_store(path: str, count: int, rng: random.Random) -> None:
    """``count`` random 100-byte bodies in topic ``bench``, 4 queues, in batches
    (also benchmarks/test_spark.py's store)."""
    blob = rng.randbytes(count * BODY_SIZE)
    batch, queues = 10_000, 4
    with mqlog.open(path, segment_size_bytes=BIG_SEGMENT_BYTES) as store:
        for first in range(0, count, batch * queues):
            for queue_id in range(queues):
                low = first + queue_id * batch
                high = min(count, low + batch)
                if low < high:
                    store.put_batch("bench", [blob[i * BODY_SIZE:(i + 1) * BODY_SIZE]
                                              for i in range(low, high)], queue_id)


def _replicas(root: str, name: str, count: int, make: Callable[..., None], copies: int,
              rng: random.Random, **config: Any) -> list[str]:
    """A store and ``copies - 1`` copies of it: the second short of its last records,
    the third (if any) with 10 more."""
    first = os.path.join(root, f"{name}-0")
    make(first, count, rng)
    paths = [first]
    for index in range(1, copies):
        path = os.path.join(root, f"{name}-{index}")
        shutil.copytree(first, path)
        paths.append(path)
    with mqlog.open(paths[1], **config) as store:
        store.truncate(_position_of_last(store, max(1, count // 20)))
    if copies > 2:
        with mqlog.open(paths[2], **config) as store:
            for index in range(10):
                store.put("orders", b"extra-%d" % index, 0)
    return paths


def _position_of_last(store: Any, records: int) -> int:
    """The position of the ``records``-th last record of the store's first queue."""
    topic, queue_id = next(iter(store.queues()))
    end = store.max_offset(topic, queue_id)
    return store.get(topic, queue_id, max(0, end - records), 1)[0].position


class Tasks:
    """Spark jobs run under one job group, read back from the status tracker."""

    def __init__(self, spark: Any) -> None:
        self.context = spark.sparkContext
        self.count = 0

    def run(self, name: str, job: Callable[[], Any]) -> tuple[float, Any, dict]:
        group = f"bench-{self.count}-{name}"
        self.count += 1
        self.context.setJobGroup(group, name)
        started = time.perf_counter()
        answer = job()
        seconds = time.perf_counter() - started
        tracker = self.context.statusTracker()
        stages: list[int] = []
        for job_id in tracker.getJobIdsForGroup(group):
            info = tracker.getJobInfo(job_id)
            stages.extend(info.stageIds if info else [])
        tasks = [info.numTasks for stage in sorted(set(stages))
                 if (info := tracker.getStageInfo(stage)) is not None]
        counted = {"stages": len(tasks), "most": max(tasks, default=0), "tasks": sum(tasks)}
        return seconds, answer, counted


def _warm(spark: Any, path: str) -> None:
    """What every job pays once per session, paid before the cases are timed: the
    source's registration, a first read through it, a first DataFrame from Arrow."""
    import pyarrow as pa

    from mqlog.spark_connector import register

    register(spark)
    spark.read.format("mqlog").option("path", path).load().limit(1).count()
    spark.createDataFrame(pa.table({"x": [1]})).count()


def _reconcile(spark: Any, paths: list[str], **options: Any) -> Any:
    from mqlog.spark_connector.reconcile import format_summary, reconcile

    found = reconcile(spark, paths, **options)
    text = format_summary(found.summary_rows())
    return text.count("\n"), found.findings.count()


def _replay_parquet(spark: Any, source: str, out: str) -> Any:
    from mqlog.spark_connector import replay

    return replay.to_parquet(replay.select(spark, source), out)


def _replay_store(spark: Any, source: str, out: str) -> Any:
    from mqlog.spark_connector import replay

    shutil.rmtree(out, ignore_errors=True)
    result = replay.to_store(replay.select(spark, source), source, out)
    return result.written


def _held(path: str) -> int:
    """Bytes of records a store holds (where its last record ends)."""
    with mqlog.open(path, read_only=True) as store:
        ends = [0]
        for topic, queue_id in store.queues():
            end = store.max_offset(topic, queue_id)
            if end > store.min_offset(topic, queue_id):
                last = store.get(topic, queue_id, end - 1, 1)[0]
                ends.append(last.position + len(last.body) + 100)
        return max(ends)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big", type=int, default=1_000_000,
                        help="records in each large store (0: skip them)")
    parser.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    args = parser.parse_args(argv)
    root = args.dir or tempfile.mkdtemp(prefix="mqlog-spark-jobs-")
    rng = random.Random(20261123)
    started = time.perf_counter()
    small = _replicas(root, "small", SMALL_RECORDS, _small_store, 3, rng)
    replay_source = os.path.join(root, "replay-src")
    _small_store(replay_source, REPLAY_RECORDS, rng)
    big: list[str] = []
    if args.big:
        big = _replicas(root, "big", args.big, big_store, 2, rng,
                        segment_size_bytes=BIG_SEGMENT_BYTES)
    print(f"stores written in {time.perf_counter() - started:.1f} s under {root}")

    from mqlog.spark_connector.cli import session

    started = time.perf_counter()
    spark = session("mqlog spark_jobs benchmark", None, verbose=False)
    spark.sparkContext.parallelize([0], 1).count()  # a first job: workers up
    cores = spark.sparkContext.defaultParallelism
    print(f"session start: {time.perf_counter() - started:.1f} s ({cores} cores); "
          f"load average {os.getloadavg()[0]:.2f}")
    started = time.perf_counter()
    _warm(spark, replay_source)
    print(f"first use (the source registered, a first read and a first local relation): "
          f"{time.perf_counter() - started:.1f} s")
    tasks = Tasks(spark)
    cases: list[tuple[str, Callable[[], Any], int]] = [
        ("reconcile 3 x 2,000", lambda: _reconcile(spark, small), 0),
        ("  the same by shuffles", lambda: _reconcile(spark, small, driver_bytes_max=0), 0),
        ("replay 400 -> parquet",
         lambda: _replay_parquet(spark, replay_source, os.path.join(root, "r.parquet")), 0),
        ("replay 400 -> store",
         lambda: _replay_store(spark, replay_source, os.path.join(root, "r-store")), 0),
    ]
    if big:
        size = _held(big[0])
        cases += [
            (f"reconcile 2 x {args.big:,}", lambda: _reconcile(spark, big), size * 2),
            (f"replay {args.big:,} -> parquet",
             lambda: _replay_parquet(spark, big[0], os.path.join(root, "b.parquet")), size),
            (f"replay {args.big:,} -> store",
             lambda: _replay_store(spark, big[0], os.path.join(root, "b-store")), size),
        ]
    print(f"{'case':<28} {'seconds':>8} {'stages':>6} {'most tasks':>10} {'all tasks':>9}"
          f" {'cap':>4}  answer")
    for name, job, data in cases:
        seconds, answer, counted = tasks.run(name, job)
        cap = max(2 * cores, data // (64 << 20))
        print(f"{name:<28} {seconds:8.2f} {counted['stages']:6d} {counted['most']:10d} "
              f"{counted['tasks']:9d} {cap:4d}  {answer}", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")
    spark.stop()
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
