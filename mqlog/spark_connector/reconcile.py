"""Reconcile: compare replica copies of a store, record by record, with Spark.

Theory of operation. Every replica is read in commit-log mode (every record in its
segment files, each with its CRC verdict), so damage and records no queue points to
are seen too. The first directory is the reference; each other replica is compared
with it twice:

* as logs, by position: a record is identified by its position and compared by
  (epoch, content hash), where the content hash is a 64-bit hash of every decoded field
  the record's CRC32C covers (topic, queue, offset, epoch, timestamps, key, tags,
  properties, body) — what comparing (position, epoch, CRC) asks, computed in Spark;
* as queues, by (topic, queue_id, offset), compared by a hash of the body: this finds
  the same messages even where the logs' byte positions differ.

Each comparison is a full outer join; a row that only the reference has is ``missing``
from the replica, one only the replica has is ``extra``, one both have with different
hashes is ``divergent``. A record whose CRC fails is ``corrupt`` (and left out of the
comparisons). The report is one DataFrame with a row per finding (``REPORT_COLUMNS``),
and a summary per replica and queue: the count of each kind (queue-level findings, and
corrupt records) and the common prefix —
the first offset at which the replica and the reference disagree (the queue's end when
they never do).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mqlog.errors import InvalidArgument

REPORT_COLUMNS = ("level", "kind", "replica", "reference", "topic", "queue_id", "offset",
                  "position", "epoch", "reference_epoch")
KINDS = ("missing", "extra", "divergent", "corrupt")


@dataclass
class Reconciliation:
    """What ``reconcile`` found: the findings and the per-queue summary (DataFrames)."""

    findings: Any
    summary: Any

    def summary_rows(self) -> list[dict]:
        return [row.asDict() for row in self.summary.orderBy(
            "replica", "topic", "queue_id").collect()]


def reconcile(spark: Any, paths: Sequence[str]) -> Reconciliation:
    """Compare the stores at ``paths`` (the first is the reference); see the docstring."""
    from pyspark.sql import functions as F

    from mqlog.spark_connector import register

    if len(paths) < 2:
        raise InvalidArgument("reconcile needs at least two store directories")
    register(spark)
    hashed = {path: _hashed(spark, path) for path in paths}
    reference = paths[0]
    found = []
    for replica in paths[1:]:
        for keys, digest, level in ((["position"], "content", "log"),
                                    (["topic", "queue_id", "offset"], "body_hash", "queue")):
            found.append(_compare(hashed[reference].filter("crc_ok"),
                                  hashed[replica].filter("crc_ok"), reference, replica,
                                  keys, digest, level))
    corrupt: Any = None
    for path in paths:
        bad = hashed[path].filter(~F.col("crc_ok")).select(
            F.lit("log").alias("level"), F.lit("corrupt").alias("kind"), "replica",
            F.lit(reference).alias("reference"), "topic", "queue_id", "offset", "position",
            "epoch", F.lit(None).cast("bigint").alias("reference_epoch"))
        corrupt = bad if corrupt is None else corrupt.unionByName(bad)
    findings = corrupt
    for part in found:
        findings = findings.unionByName(part)
    findings = findings.cache()
    good = [hashed[path].filter("crc_ok") for path in paths]
    return Reconciliation(findings, _summary(spark, good, findings, paths))


def _hashed(spark: Any, path: str) -> Any:
    """One replica's records in commit-log mode, with their hashes."""
    from pyspark.sql import functions as F

    records = (spark.read.format("mqlog").option("path", path).option("mode", "commitlog")
               .load())
    return records.select(
        "replica", "topic", "queue_id", "offset", "position", "epoch", "crc_ok",
        F.xxhash64("topic", "queue_id", "offset", "epoch", "timestamp", "born_timestamp",
                   "key", "tags", F.to_json("properties"), "body").alias("content"),
        F.xxhash64("body").alias("body_hash"))


def _compare(ours_all: Any, theirs_all: Any, reference: str, replica: str, keys: list[str],
             digest: str, level: str) -> Any:
    from pyspark.sql import functions as F

    columns = ["topic", "queue_id", "offset", "position", "epoch", digest]
    ours = ours_all.select(*[F.col(name).alias(f"r_{name}") for name in columns])
    theirs = theirs_all.select(*[F.col(name).alias(f"x_{name}") for name in columns])
    joined = ours.join(theirs, [F.col(f"r_{key}") == F.col(f"x_{key}") for key in keys],
                       "full_outer")
    kind = (F.when(F.col(f"x_{digest}").isNull(), "missing")
            .when(F.col(f"r_{digest}").isNull(), "extra")
            .when(F.col(f"x_{digest}") != F.col(f"r_{digest}"), "divergent"))
    side = F.when(F.col(f"x_{digest}").isNull(), "r").otherwise("x")

    def pick(name: str) -> Any:
        return F.when(side == "r", F.col(f"r_{name}")).otherwise(F.col(f"x_{name}"))

    return joined.select(
        F.lit(level).alias("level"), kind.alias("kind"), F.lit(replica).alias("replica"),
        F.lit(reference).alias("reference"), pick("topic").alias("topic"),
        pick("queue_id").alias("queue_id"), pick("offset").alias("offset"),
        pick("position").alias("position"), pick("epoch").alias("epoch"),
        F.col("r_epoch").alias("reference_epoch")).filter(F.col("kind").isNotNull())


def _summary(spark: Any, good: list[Any], findings: Any, paths: Sequence[str]) -> Any:
    """Per (replica, topic, queue_id): counts of each kind, and the common prefix."""
    from pyspark.sql import functions as F

    every = good[0]
    for more in good[1:]:
        every = every.unionByName(more)
    ends = every.groupBy("topic", "queue_id").agg((F.max("offset") + 1).alias("queue_end"))
    queues = spark.createDataFrame([(path,) for path in paths[1:]], "replica STRING") \
        .crossJoin(ends)
    per_queue = findings.filter(F.col("topic").isNotNull()).groupBy(
        "replica", "topic", "queue_id").agg(
        *[F.sum(F.when((F.col("kind") == kind) & ((F.col("level") == "queue") |
                                                  (F.col("kind") == "corrupt")), 1)
                .otherwise(0)).alias(kind) for kind in KINDS],
        F.min(F.when(F.col("level") == "queue", F.col("offset"))).alias("first_difference"))
    joined = queues.join(per_queue, ["replica", "topic", "queue_id"], "left")
    return joined.select(
        "replica", "topic", "queue_id",
        *[F.coalesce(F.col(kind), F.lit(0)).alias(kind) for kind in KINDS],
        F.coalesce(F.col("first_difference"), F.col("queue_end")).alias("common_prefix"),
        "queue_end")


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
