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

Replicas that hold little together (``driver_bytes_max``, ``DRIVER_BYTES_MAX`` by default:
bytes of records, as the planner counts them) are compared on the driver instead, with
no Spark job: the source's own planner and reader (the code every task runs) read them
in commit-log mode there, and the comparisons below run in Python (``_DriverComparison``)
by the same rules, on the exact field values where the shuffles compare their 64-bit
hashes, so both ways give the same findings, counts and summary (a test damages
replicas and compares them). The source is not even registered; the findings and
summary DataFrames are built from Arrow (local relations) when first asked for. Larger
replicas take the shuffles.

Each comparison is one shuffle: the rows are grouped by their key with one column per
replica (a pivot), ``stage_tasks`` partitions (the task slots, more only for large
data). A key only the reference has is ``missing`` from the replica, one only the
replica has is ``extra``, one both have with different hashes is ``divergent``. Keys
before a replica's start are neither: each replica's log start (its first segment) and
queue starts (``min_offset``), read from the stores on the driver (``_starts``), say
what retention or a reset took from it, so a replica that keeps less history than the
reference is not reported missing what it deleted (nor the reference, extra). A
record whose CRC fails is ``corrupt`` (log level), and its key is no other finding of its
replica — nor of any replica when the reference's record there is the corrupt one: a
damaged record counted once, not also as missing at both levels. The
report is one DataFrame with a row per finding (``REPORT_COLUMNS``; cached), its counts
per level and kind (``counts``), and a summary per replica and queue, computed on the
driver from small aggregates: the count of each kind among that queue's queue-level
findings and corrupt records, the replica's start in that queue (``held_from``), and
the common prefix — the first offset at which the replica and the reference disagree
(the queue's end when they never do). The reference has a row of its own for a queue
where its own records are corrupt (its only kind of finding), so that the summary shows
every damaged copy.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mqlog
from mqlog.engine.files import numbered_files
from mqlog.errors import InvalidArgument, MqlogError

REPORT_COLUMNS = ("level", "kind", "replica", "reference", "topic", "queue_id", "offset",
                  "position", "epoch", "reference_epoch")
KINDS = ("missing", "extra", "divergent", "corrupt")


class Reconciliation:
    """What ``reconcile`` found: the findings (a DataFrame, cached when Spark computed
    them; built from Arrow on first use when the driver did), their counts per (level,
    kind), and the per-queue summary (a DataFrame, and its rows)."""

    def __init__(self, spark: Any, findings: Any, counts: dict[tuple[str, str], int],
                 rows: list[dict]) -> None:
        self.spark = spark
        self._findings = findings  # a DataFrame, or a pyarrow Table (the driver's)
        self._summary: Any = None
        self.counts = counts
        self.rows = rows

    @property
    def findings(self) -> Any:
        import pyarrow as pa

        if isinstance(self._findings, pa.Table):
            if self.spark is None:
                raise InvalidArgument("the findings were computed without a Spark session: "
                                      "use write_parquet, or pass a session to reconcile")
            self._findings = self.spark.createDataFrame(self._findings)
        return self._findings

    def write_parquet(self, out: str) -> None:
        """Write the findings to the Parquet directory ``out`` (replaced if it exists):
        with Spark when it computed them, else from the driver's Arrow table (one file,
        ``part-00000.parquet``, and ``_SUCCESS``, as Spark leaves them)."""
        import pyarrow as pa

        if not isinstance(self._findings, pa.Table):
            self._findings.write.mode("overwrite").parquet(out)
            return
        import pyarrow.parquet as pq

        if os.path.isdir(out):
            shutil.rmtree(out)
        elif os.path.lexists(out):
            os.remove(out)
        os.makedirs(out)
        pq.write_table(self._findings, os.path.join(out, "part-00000.parquet"))
        open(os.path.join(out, "_SUCCESS"), "wb").close()

    @property
    def summary(self) -> Any:
        if self._summary is None:
            self._summary = _summary_frame(self.spark, self.rows)
        return self._summary

    def summary_rows(self) -> list[dict]:
        return list(self.rows)

    def total(self, level: str | None = None) -> int:
        return sum(count for (at, _kind), count in self.counts.items()
                   if level is None or at == level)


# Replicas holding at most this many bytes of records together are compared on the driver,
# which then holds every record's decoded fields, bodies included (3 replicas x 30,000
# records of 150 bytes, 19 MiB: 5.5 s and ~130 MiB more at load 8, where the shuffles
# take tens of seconds).
DRIVER_BYTES_MAX = 16 << 20



def reconcile(spark: Any, paths: Sequence[str],
              driver_bytes_max: int = DRIVER_BYTES_MAX) -> Reconciliation:
    """Compare the stores at ``paths`` (the first is the reference); see the docstring.
    ``driver_bytes_max``: compare on the driver when the replicas hold at most this many
    bytes of records together (0: always shuffle). ``spark`` may be None for replicas
    that small (the command starts no session for them); the findings and summary
    DataFrames then need one, the rows, counts and ``write_parquet`` do not."""
    from mqlog.spark_connector import register
    from mqlog.spark_connector.planner import held_bytes

    paths = list(paths)
    if len(paths) < 2 or len(set(paths)) != len(paths):
        raise InvalidArgument("reconcile needs at least two distinct store directories")
    if isinstance(driver_bytes_max, bool) or not isinstance(driver_bytes_max, int) \
            or driver_bytes_max < 0:
        raise InvalidArgument(f"driver_bytes_max must be an int >= 0 (bytes), not "
                              f"{driver_bytes_max!r}")
    held = held_bytes(paths)
    starts = _starts(paths)
    if held <= driver_bytes_max:
        return _reconcile_on_driver(spark, paths, starts)
    if spark is None:
        raise InvalidArgument(f"the replicas hold {held} bytes of records, more than "
                              f"driver_bytes_max={driver_bytes_max}: comparing them needs a "
                              "Spark session")
    register(spark)
    return _reconcile_shuffled(spark, paths, held, starts)


@dataclass(frozen=True)
class _Starts:
    """Where each replica's log and queues start now, by replica index: a record
    before a replica's start is one retention (or a reset) took from it, not one it
    lacks. A queue a replica has no consume queue for has no start there (None)."""

    log: list[int]
    queues: dict[tuple[str, int], list[int | None]]

    def queue(self, topic: str, queue_id: int) -> list[int | None]:
        return self.queues.get((topic, queue_id)) or [None] * len(self.log)


def _starts(paths: list[str]) -> _Starts:
    """Each replica's log start and queue starts, from read-only opens on the driver. A
    replica too damaged to open (a lost segment, a copy cut short: the cases reconcile is
    for, which its commit-log scan reads as they are) starts where its first segment
    file does, and its queues' starts are unknown (a record before one is reported)."""
    logs: list[int] = []
    queues: dict[tuple[str, int], list[int | None]] = {}
    for index, path in enumerate(paths):
        try:
            store = mqlog.open(path, read_only=True)
        except MqlogError:
            bases = numbered_files(Path(path) / "commitlog")
            logs.append(bases[0][0] if bases else 0)
            continue
        with store:
            logs.append(store.first_segment_base())
            for topic, queue_id in store.queues():
                queues.setdefault((topic, queue_id), [None] * len(paths))[index] = \
                    store.min_offset(topic, queue_id)
    return _Starts(logs, queues)


def _reconcile_shuffled(spark: Any, paths: list[str], held: int,
                        starts: _Starts) -> Reconciliation:
    """The comparisons as Spark shuffles, one per level (large replicas)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from mqlog.spark_connector.planner import stage_tasks

    partitions = stage_tasks(held, spark.sparkContext.defaultParallelism)
    hashed = _hashed(spark, paths).persist(StorageLevel.MEMORY_AND_DISK)
    good = hashed.filter("crc_ok")
    corrupt = hashed.filter(~F.col("crc_ok")).select(
        F.lit("log").alias("level"), F.lit("corrupt").alias("kind"), "replica",
        F.lit(paths[0]).alias("reference"), "topic", "queue_id", "offset", "position",
        "epoch", F.lit(None).cast("bigint").alias("reference_epoch"))
    logs = _compare(hashed, paths, ["position"], "content", "log",
                    lambda number: F.col("position") < F.lit(starts.log[number]))
    queues = _compare(hashed.filter(F.col("topic") != ""), paths,
                      ["topic", "queue_id", "offset"], "body_hash", "queue",
                      lambda number: F.col("offset") < F.col(f"start_{number}"),
                      _queue_starts_frame(spark, starts), starts.log)
    with shuffle_partitions(spark, partitions):  # (a cache's plan is made at persist)
        findings = corrupt.unionByName(logs).unionByName(queues).coalesce(partitions) \
            .persist(StorageLevel.MEMORY_AND_DISK)
        groups = findings.groupBy("level", "kind", "replica", "topic", "queue_id").agg(
            F.count("*").alias("count"), F.min("offset").alias("first")).collect()
        counts: dict[tuple[str, str], int] = {}
        for group in groups:
            key = (group["level"], group["kind"])
            counts[key] = counts.get(key, 0) + int(group["count"])
        ends = {(row["topic"], row["queue_id"]): int(row["queue_end"]) for row in
                good.filter(F.col("topic") != "").groupBy("topic", "queue_id")
                .agg((F.max("offset") + 1).alias("queue_end")).collect()}
        rows = _summary(ends, groups, paths, starts)
    hashed.unpersist()
    return Reconciliation(spark, findings, counts, rows)


def _reconcile_on_driver(spark: Any, paths: list[str], starts: _Starts) -> Reconciliation:
    """The comparisons in Python over every replica's records, read on the driver with
    the source's own planner and reader (small replicas: no Spark job)."""
    import pyarrow as pa

    compared = _DriverComparison(paths, _driver_rows(paths), starts)
    columns: list[Any] = list(zip(*compared.findings, strict=True)) or \
        [[] for _ in REPORT_COLUMNS]
    findings = pa.table(columns, schema=_findings_arrow())
    rows = _summary(compared.ends, compared.groups(), paths, starts)
    return Reconciliation(spark, findings, compared.counts(), rows)


def _driver_rows(paths: list[str]) -> list[tuple]:
    """Every record of every replica in commit-log mode, as ``_HASHED`` tuples whose
    ``content`` is the tuple of the fields ``_hashed`` hashes, compared exactly."""
    from mqlog.spark_connector import options
    from mqlog.spark_connector.datasource import read_partition
    from mqlog.spark_connector.planner import plan

    wanted = options.parse({"paths": json.dumps(paths), "mode": "commitlog"}, slots=1)
    rows: list[tuple] = []
    for partition in plan(wanted):
        for batch in read_partition(partition, wanted):
            got = {name: batch.column(name).to_pylist() for name in batch.schema.names}
            content = zip(*(got[name] for name in _CONTENT), strict=True)
            rows.extend(zip(*(got[name] for name in _HASHED[:7]), content, got["body"],
                            strict=True))
    return rows


_HASHED = ("replica", "topic", "queue_id", "offset", "position", "epoch", "crc_ok",
           "content", "body_hash")
_CONTENT = ("topic", "queue_id", "offset", "epoch", "timestamp", "born_timestamp", "key",
            "tags", "properties", "body", "lost")


class _DriverComparison:
    """``_compare``'s and the corrupt rows' rules in Python, over rows in ``_HASHED``
    order: the findings as tuples in ``REPORT_COLUMNS`` order, their groups and counts,
    and each queue's end (its highest offset among good records, plus 1)."""

    def __init__(self, paths: list[str], rows: list[tuple], starts: _Starts) -> None:
        self.paths = paths
        self.starts = starts
        number = {path: index for index, path in enumerate(paths)}
        self.findings: list[tuple] = []
        self.ends: dict[tuple[str, int], int] = {}
        logs: dict[tuple, list] = {}
        queues: dict[tuple, list] = {}
        for row in rows:
            replica, topic, queue_id, offset, position, epoch, crc_ok = row[:7]
            if not crc_ok:
                self.findings.append(("log", "corrupt", replica, paths[0], topic, queue_id,
                                      offset, position, epoch, None))
            index = number.get(replica)
            if index is None:
                continue
            _first(logs, (position,), index, len(paths), (row[7], *row[1:6], crc_ok))
            if topic:  # (Spark's topic != "" is not true for a null either)
                _first(queues, (topic, queue_id, offset), index, len(paths),
                       (row[8], *row[1:6], crc_ok))
                if crc_ok:
                    end = self.ends.get((topic, queue_id), 0)
                    self.ends[(topic, queue_id)] = max(end, offset + 1)
        self._compare(logs, "log")
        self._compare(queues, "queue")

    def _compare(self, grouped: dict[tuple, list], level: str) -> None:
        for key, slots in grouped.items():
            reference = slots[0]
            starts = self.starts.log if level == "log" else self.starts.queue(*key[:2])
            for number in range(1, len(self.paths)):
                theirs = slots[number]
                if theirs is None and reference is None:
                    continue
                if theirs is not None and not theirs[6] or \
                        reference is not None and not reference[6]:
                    continue  # (a corrupt record there: a finding of its own already)
                if theirs is None and _taken(key[-1], reference[4], starts[number],
                                             self.starts.log[number]) or \
                        reference is None and _taken(key[-1], theirs[4], starts[0],
                                                     self.starts.log[0]):
                    continue  # (before the start of the replica without it: taken)
                kind = "missing" if theirs is None else "extra" if reference is None \
                    else "divergent" if theirs[0] != reference[0] else None
                if kind is None:
                    continue
                record = reference if theirs is None else theirs
                self.findings.append((level, kind, self.paths[number], self.paths[0],
                                      *record[1:6], None if reference is None else
                                      reference[5]))

    def groups(self) -> list[dict]:
        """The findings counted per (level, kind, replica, topic, queue_id), each with
        the first offset (what the shuffled job's aggregate gives)."""
        found: dict[tuple, dict] = {}
        for finding in self.findings:
            level, kind, replica, _reference, topic, queue_id, offset = finding[:7]
            group = found.setdefault((level, kind, replica, topic, queue_id), {
                "level": level, "kind": kind, "replica": replica, "topic": topic,
                "queue_id": queue_id, "count": 0, "first": None})
            group["count"] += 1
            if offset is not None:
                group["first"] = offset if group["first"] is None else \
                    min(group["first"], offset)
        return list(found.values())

    def counts(self) -> dict[tuple[str, str], int]:
        counted: dict[tuple[str, str], int] = {}
        for finding in self.findings:
            counted[finding[:2]] = counted.get(finding[:2], 0) + 1
        return counted


def _before(at: int, start: int | None) -> bool:
    """Whether position or offset ``at`` lies before a replica's ``start`` (no start
    known: not before; Spark's comparison with a null is not true either)."""
    return start is not None and at < start


def _taken(key: int, position: int, start: int | None, log_start: int) -> bool:
    """Whether a record (its key's last field, a position or an offset, and its position)
    is one a replica's retention or reset took: before that replica's start there, or
    before its log's start. (A queue whose records a reset took all of has no consume
    queue in the replica, so no start of its own: every record of it was reported
    missing, though the log level said none was.)"""
    return _before(key, start) or position < log_start


def _first(grouped: dict[tuple, list], key: tuple, index: int, replicas: int,
           record: tuple) -> None:
    """``record`` (digest, topic, queue_id, offset, position, epoch, crc_ok) in its
    replica's slot under ``key``, unless that slot holds one already — a corrupt one
    gives way to a whole one (the pivot's ``first`` of the whole ones, else of all)."""
    slots = grouped.get(key)
    if slots is None:
        slots = grouped[key] = [None] * replicas
    held = slots[index]
    if held is None or not held[6] and record[6]:
        slots[index] = record


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

    records = (spark.read.format("mqlog").option("paths", json.dumps(paths))
               .option("mode", "commitlog").load())
    return records.select(
        "replica", "topic", "queue_id", "offset", "position", "epoch", "crc_ok",
        F.xxhash64("topic", "queue_id", "offset", "epoch", "timestamp", "born_timestamp",
                   "key", "tags", F.to_json("properties"), "body", "lost",
                   # a null adds nothing to the hash: say which fields are null, or a
                   # key moved into the tags would hash the same
                   *(F.isnull(name) for name in ("key", "tags", "properties")))
        .alias("content"),
        F.xxhash64("body").alias("body_hash"))


def _queue_starts_frame(spark: Any, starts: _Starts) -> Any:
    """Each queue's start in every replica: columns topic, queue_id, start_0, ..."""
    from pyspark.sql import types as T

    replicas = len(starts.log)
    schema = T.StructType([T.StructField("topic", T.StringType()),
                           T.StructField("queue_id", T.IntegerType()),
                           *(T.StructField(f"start_{number}", T.LongType())
                             for number in range(replicas))])
    return spark.createDataFrame([(topic, queue_id, *found) for (topic, queue_id), found
                                  in sorted(starts.queues.items())], schema)


def _compare(rows: Any, paths: list[str], keys: list[str], digest: str, level: str,
             before_start: Callable[[int], Any], starts: Any = None,
             log_starts: list[int] | None = None) -> Any:
    """Findings of one level: rows grouped by ``keys`` with a column per replica (its
    record's fields, by replica index), each other replica checked against the first.
    ``before_start(number)``: whether a key lies before that replica's start (a column,
    over ``starts`` joined on the keys but the last, when given); ``log_starts``: each
    replica's log start, before which a record is taken too (``_taken``)."""
    from pyspark.sql import functions as F

    index = F.lit(None).cast("int")
    for number, path in enumerate(paths):
        index = F.when(F.col("replica") == path, number).otherwise(index)
    fields = F.struct(F.col(digest).alias("digest"), "epoch", "topic", "queue_id", "offset",
                      "position", "crc_ok")
    whole = F.first(F.when(F.col("crc_ok"), F.col("record")), ignorenulls=True)
    grouped = (rows.select(*keys, "crc_ok", index.alias("replica_index"),
                           fields.alias("record"))
               .groupBy(*keys)
               .pivot("replica_index", list(range(len(paths))))
               .agg(F.coalesce(whole, F.first("record", ignorenulls=True))))
    if starts is not None:
        grouped = grouped.join(F.broadcast(starts), keys[:-1], "left")
    reference = F.col("0")
    found = []
    for number in range(1, len(paths)):
        theirs = F.col(str(number))
        kind = (F.when(theirs.isNull() & reference.isNull(), F.lit(None))  # others' key
                # (a corrupt record there: a finding of its own already)
                .when(theirs.isNotNull() & ~theirs["crc_ok"], F.lit(None))
                .when(reference.isNotNull() & ~reference["crc_ok"], F.lit(None))
                .when(theirs.isNull() & (before_start(number) | _before_log(
                    reference, log_starts, number)), F.lit(None))  # taken there
                .when(reference.isNull() & (before_start(0) | _before_log(
                    theirs, log_starts, 0)), F.lit(None))
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


def _before_log(record: Any, log_starts: list[int] | None, number: int) -> Any:
    """Whether ``record`` (a struct column) lies before replica ``number``'s log start
    (``_taken``'s second test, as a column; none given: false)."""
    from pyspark.sql import functions as F

    if log_starts is None:
        return F.lit(False)
    return record["position"] < F.lit(log_starts[number])


def _findings_arrow() -> Any:
    import pyarrow as pa

    kinds = {"queue_id": pa.int32(), "offset": pa.int64(), "position": pa.int64(),
             "epoch": pa.int64(), "reference_epoch": pa.int64()}
    return pa.schema([pa.field(name, kinds.get(name, pa.string())) for name in REPORT_COLUMNS])


_SUMMARY_COLUMNS = ("replica", "topic", "queue_id", *KINDS, "held_from", "common_prefix",
                    "queue_end")


def _summary_frame(spark: Any, rows: list[dict]) -> Any:
    """The summary rows as a DataFrame (from Arrow: a local relation, no job)."""
    import pyarrow as pa

    kinds = {"replica": pa.string(), "topic": pa.string(), "queue_id": pa.int32()}
    arrow = pa.schema([pa.field(name, kinds.get(name, pa.int64()))
                       for name in _SUMMARY_COLUMNS])
    return spark.createDataFrame(pa.Table.from_pylist(rows, schema=arrow))


def _summary(ends: dict[tuple[str, int], int], groups: list[Any],
             paths: list[str], starts: _Starts) -> list[dict]:
    """Per (replica, topic, queue_id) of the replicas compared: counts of each kind (queue
    level, and corrupt records), and the common prefix; see the module docstring.
    ``ends``: each queue's end among the good records of all replicas; ``groups``: the
    findings counted per (level, kind, replica, topic, queue_id), with the first offset
    of each; ``starts``: each replica's queue starts (``held_from``)."""
    counted: dict[tuple[str, str, int], dict[str, Any]] = {}
    for group in groups:
        if group["level"] != "queue" and group["kind"] != "corrupt":
            continue
        row = counted.setdefault((group["replica"], group["topic"], group["queue_id"]),
                                 {kind: 0 for kind in KINDS} | {"first_difference": None})
        row[group["kind"]] += int(group["count"])
        if (group["level"] == "queue" or group["kind"] == "corrupt") and \
                group["first"] is not None:  # (a corrupt record is a difference too)
            first = row["first_difference"]
            row["first_difference"] = group["first"] if first is None else \
                min(first, group["first"])
    rows = []
    for number, replica in enumerate(paths):
        for (topic, queue_id), end in sorted(ends.items()):
            found = counted.get((replica, topic, queue_id), {})
            if number == 0 and not found:  # (the reference: a row where it is damaged)
                continue
            first = found.get("first_difference")
            rows.append({"replica": replica, "topic": topic, "queue_id": queue_id,
                         **{kind: int(found.get(kind, 0)) for kind in KINDS},
                         "held_from": starts.queue(topic, queue_id)[number],
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
    headers = list(_SUMMARY_COLUMNS)
    table = [[str(row[name]) for name in headers] for row in rows]
    widths = [max(len(name), *(len(line[i]) for line in table)) if table else len(name)
              for i, name in enumerate(headers)]
    lines = ["  ".join(name.ljust(width) for name, width in zip(headers, widths, strict=True))]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
              for line in table]
    return "\n".join(lines)
