"""Reconcile: compare replica copies of a store, record by record, with Spark.

Theory of operation. All replicas are read in one commit-log-mode scan (the ``paths``
option: every record in their segment files, each with its CRC verdict and the replica
it came from), so damage and records no queue points to are seen too. The planner cuts
that scan by the bytes the stores hold (planner.py: a few small replicas are one task),
and the hashed rows are cached, so each replica is read once whatever the comparisons
below ask of it. The first directory is the reference; every other replica is compared
with it twice:

* as logs, by position (``level = "log"``): a record is identified by its position and
  compared by a 64-bit hash of every decoded field the record's CRC32C covers (topic,
  queue, offset, epoch, timestamps, key, tags, properties, body) — what comparing
  (position, epoch, CRC) asks, computed in Spark. Control records (Raft's no-ops: an
  empty topic) are log records and are compared here;
* as queues, by (topic, queue_id, offset) (``level = "queue"``), compared by a hash of
  the body: this finds the same messages even where the logs' byte positions differ.
  Control records belong to no queue and are left out.

Each comparison is one shuffle: the rows are grouped by their key with one column per
replica (a pivot), ``stage_tasks`` partitions (the task slots, more only for large
data). A key only the reference has is ``missing`` from the replica, one only the
replica has is ``extra``, one both have with different hashes is ``divergent``. A
record whose CRC fails is ``corrupt`` (log level, left out of the comparisons). The
report is one DataFrame with a row per finding (``REPORT_COLUMNS``; cached), its counts
per level and kind (``counts``), and a summary per replica and queue, computed on the
driver from small aggregates: the count of each kind among that queue's queue-level
findings and corrupt records, and the common prefix — the first offset at which the
replica and the reference disagree (the queue's end when they never do).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from mqlog.errors import InvalidArgument

REPORT_COLUMNS = ("level", "kind", "replica", "reference", "topic", "queue_id", "offset",
                  "position", "epoch", "reference_epoch")
KINDS = ("missing", "extra", "divergent", "corrupt")


@dataclass
class Reconciliation:
    """What ``reconcile`` found: the findings (a cached DataFrame), their counts per
    (level, kind), and the per-queue summary (a DataFrame, and its rows)."""

    findings: Any
    counts: dict[tuple[str, str], int]
    summary: Any
    rows: list[dict]

    def summary_rows(self) -> list[dict]:
        return list(self.rows)

    def total(self, level: str | None = None) -> int:
        return sum(count for (at, _kind), count in self.counts.items()
                   if level is None or at == level)


def reconcile(spark: Any, paths: Sequence[str]) -> Reconciliation:
    """Compare the stores at ``paths`` (the first is the reference); see the docstring."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from mqlog.spark_connector import register
    from mqlog.spark_connector.planner import held_bytes, stage_tasks

    paths = list(paths)
    if len(paths) < 2 or len(set(paths)) != len(paths):
        raise InvalidArgument("reconcile needs at least two distinct store directories")
    register(spark)
    partitions = stage_tasks(held_bytes(paths), spark.sparkContext.defaultParallelism)
    hashed = _hashed(spark, paths).persist(StorageLevel.MEMORY_AND_DISK)
    good = hashed.filter("crc_ok")
    corrupt = hashed.filter(~F.col("crc_ok")).select(
        F.lit("log").alias("level"), F.lit("corrupt").alias("kind"), "replica",
        F.lit(paths[0]).alias("reference"), "topic", "queue_id", "offset", "position",
        "epoch", F.lit(None).cast("bigint").alias("reference_epoch"))
    logs = _compare(good, paths, ["position"], "content", "log")
    queues = _compare(good.filter(F.col("topic") != ""), paths,
                      ["topic", "queue_id", "offset"], "body_hash", "queue")
    with shuffle_partitions(spark, partitions):  # (a cache's plan is made at persist)
        findings = corrupt.unionByName(logs).unionByName(queues).coalesce(partitions) \
            .persist(StorageLevel.MEMORY_AND_DISK)
        groups = findings.groupBy("level", "kind", "replica", "topic", "queue_id").agg(
            F.count("*").alias("count"), F.min("offset").alias("first")).collect()
        counts: dict[tuple[str, str], int] = {}
        for group in groups:
            key = (group["level"], group["kind"])
            counts[key] = counts.get(key, 0) + int(group["count"])
        rows = _summary(good, groups, paths)
    hashed.unpersist()
    summary = spark.createDataFrame(rows, _SUMMARY_DDL)
    return Reconciliation(findings, counts, summary, rows)


@contextlib.contextmanager
def shuffle_partitions(spark: Any, count: int) -> Iterator[None]:
    """Spark's shuffle partitions set to ``count`` while the block plans and runs its
    queries (the job's stages then have at most that many tasks), restored after."""
    name = "spark.sql.shuffle.partitions"
    before = spark.conf.get(name)
    spark.conf.set(name, str(count))
    try:
        yield
    finally:
        spark.conf.set(name, before)


def _hashed(spark: Any, paths: list[str]) -> Any:
    """Every replica's records in commit-log mode (one scan), with their hashes."""
    from pyspark.sql import functions as F

    records = (spark.read.format("mqlog").option("paths", ",".join(paths))
               .option("mode", "commitlog").load())
    return records.select(
        "replica", "topic", "queue_id", "offset", "position", "epoch", "crc_ok",
        F.xxhash64("topic", "queue_id", "offset", "epoch", "timestamp", "born_timestamp",
                   "key", "tags", F.to_json("properties"), "body").alias("content"),
        F.xxhash64("body").alias("body_hash"))


def _compare(rows: Any, paths: list[str], keys: list[str], digest: str, level: str) -> Any:
    """Findings of one level: rows grouped by ``keys`` with a column per replica (its
    record's fields, by replica index), each other replica checked against the first."""
    from pyspark.sql import functions as F

    index = F.lit(None).cast("int")
    for number, path in enumerate(paths):
        index = F.when(F.col("replica") == path, number).otherwise(index)
    fields = F.struct(F.col(digest).alias("digest"), "epoch", "topic", "queue_id", "offset",
                      "position")
    grouped = (rows.select(*keys, index.alias("replica_index"), fields.alias("record"))
               .groupBy(*keys)
               .pivot("replica_index", list(range(len(paths))))
               .agg(F.first("record", ignorenulls=True)))
    reference = F.col("0")
    found = []
    for number in range(1, len(paths)):
        theirs = F.col(str(number))
        kind = (F.when(theirs.isNull() & reference.isNull(), F.lit(None))  # others' key
                .when(theirs.isNull(), "missing").when(reference.isNull(), "extra")
                .when(theirs["digest"] != reference["digest"], "divergent"))
        record = F.when(theirs.isNull(), reference).otherwise(theirs)
        found.append(F.struct(
            F.lit(level).alias("level"), kind.alias("kind"), F.lit(paths[number])
            .alias("replica"), F.lit(paths[0]).alias("reference"),
            record["topic"].alias("topic"), record["queue_id"].alias("queue_id"),
            record["offset"].alias("offset"), record["position"].alias("position"),
            record["epoch"].alias("epoch"), reference["epoch"].alias("reference_epoch")))
    return (grouped.select(F.explode(F.array(*found)).alias("finding"))
            .select("finding.*").filter(F.col("kind").isNotNull()))


_SUMMARY_DDL = ("replica STRING, topic STRING, queue_id INT, missing BIGINT, extra BIGINT, "
                "divergent BIGINT, corrupt BIGINT, common_prefix BIGINT, queue_end BIGINT")


def _summary(good: Any, groups: list[Any], paths: list[str]) -> list[dict]:
    """Per (replica, topic, queue_id) of the replicas compared: counts of each kind (queue
    level, and corrupt records), and the common prefix; see the module docstring.
    ``groups``: the findings counted per (level, kind, replica, topic, queue_id), with
    the first offset of each."""
    from pyspark.sql import functions as F

    ends = {(row["topic"], row["queue_id"]): int(row["queue_end"]) for row in
            good.filter(F.col("topic") != "").groupBy("topic", "queue_id")
            .agg((F.max("offset") + 1).alias("queue_end")).collect()}
    counted: dict[tuple[str, str, int], dict[str, Any]] = {}
    for group in groups:
        if group["level"] != "queue" and group["kind"] != "corrupt":
            continue
        row = counted.setdefault((group["replica"], group["topic"], group["queue_id"]),
                                 {kind: 0 for kind in KINDS} | {"first_difference": None})
        row[group["kind"]] += int(group["count"])
        if group["level"] == "queue" and group["first"] is not None:
            first = row["first_difference"]
            row["first_difference"] = group["first"] if first is None else \
                min(first, group["first"])
    rows = []
    for replica in paths[1:]:
        for (topic, queue_id), end in sorted(ends.items()):
            found = counted.get((replica, topic, queue_id), {})
            first = found.get("first_difference")
            rows.append({"replica": replica, "topic": topic, "queue_id": queue_id,
                         **{kind: int(found.get(kind, 0)) for kind in KINDS},
                         "common_prefix": end if first is None else int(first),
                         "queue_end": end})
    return rows


def format_counts(found: Reconciliation) -> str:
    """What the findings count, per level: the table's queue-level rows, and the log."""
    def kinds(level: str) -> str:
        return ", ".join(f"{found.counts.get((level, kind), 0)} {kind}" for kind in KINDS
                         if kind != "corrupt")

    return "\n".join([
        f"{found.total()} finding(s): {found.total('queue')} queue-level (records compared "
        f"by topic, queue_id and offset: {kinds('queue')}), "
        f"{found.total('log') - found.counts.get(('log', 'corrupt'), 0)} log-level "
        f"(records compared by position, control records included: {kinds('log')}), "
        f"{found.counts.get(('log', 'corrupt'), 0)} corrupt (CRC32C failed)"])


def format_summary(rows: list[dict]) -> str:
    """The summary as an aligned text table."""
    headers = ["replica", "topic", "queue_id", *KINDS, "common_prefix", "queue_end"]
    table = [[str(row[name]) for name in headers] for row in rows]
    widths = [max(len(name), *(len(line[i]) for line in table)) if table else len(name)
              for i, name in enumerate(headers)]
    lines = ["  ".join(name.ljust(width) for name, width in zip(headers, widths, strict=True))]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
              for line in table]
    return "\n".join(lines)
