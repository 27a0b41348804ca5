"""The ``mqlog`` PySpark data source: batch reads and streaming reads of mqlog stores.

``register(spark)`` registers the format. Then::

    spark.read.format("mqlog").option("path", "data/").load()
    spark.readStream.format("mqlog").option("path", "data/").load()

Batch: ``MqlogReader`` keeps the checked options (options.py), plans partitions on the
driver (planner.py) and reads each one in a worker, statelessly, from the partition
alone (reader.py for queues, commitlog.py for segment files), as Arrow batches.

Filters belong to one scan. A reader that narrows its read by pushed filters
(``NarrowingReader``, pushdown.py) is only correct if the partitions and read function
planned with those filters serve that scan alone. PySpark up to 4.3 keeps them on the
loaded DataFrame's provider instead (``PythonScanBuilder.pushFilters`` calls
``PythonDataSourceV2.setReadInfo``) and hands them to every later scan of that DataFrame
that pushes no filter of its own: ``df.where("offset >= 2").count()`` then made a later
``df.count()`` count only offsets >= 2 (issue 15). A scan without pushable filters never
reaches Python, so nothing on this side can tell it from the scan the plan was made for.
So ``register`` enables pushdown, and the narrowing reader, only where the JVM keeps a
pushdown's plan in its own scan (``scan_scoped_pushdown``: the scan builder holds it, as
in Spark after 4.3); elsewhere the reader plans the same partitions for every scan, Spark
applies every filter, and narrowing is done with the source's options (``topic``,
``queues``, ``startingOffsets``...), which belong to the DataFrame and so are the same for
all its scans. A DataFrame's partitions, and so the queue ends it reads up to, are fixed
by its first action (Spark keeps them too); load again to see records added since.

Streaming (stream.py): offsets are Kafka's JSON form ``{"topic": {"queue_id": next}}``;
each micro-batch reopens a read-only snapshot to find the queues' ends.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    Filter,
    InputPartition,
)

from mqlog.spark_connector import options as opts
from mqlog.spark_connector import planner, pushdown, schema
from mqlog.spark_connector.commitlog import read_segment
from mqlog.spark_connector.reader import Counters, keep_freed_memory, read_queue

FORMAT = "mqlog"


class MqlogDataSource(DataSource):
    """``spark.read.format("mqlog")``: see the module docstring and docs/SPARK.md.

    ``slots``: the session's default parallelism, which ``register`` records in the
    subclass it registers (None here: the planner then never packs small queues into
    fewer partitions; see options.pack)."""

    slots: int | None = None
    narrowing: bool = False  # pushed filters narrow the read (see the module docstring)

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> Any:
        return schema.spark_schema()

    def reader(self, schema: Any) -> DataSourceReader:
        options = opts.parse(self.options, _projection(schema), self.slots)
        return NarrowingReader(options) if self.narrowing else MqlogReader(options)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        from mqlog.spark_connector.stream import MqlogStreamReader

        return MqlogStreamReader(opts.parse(self.options, _projection(schema), self.slots))


def _projection(requested: Any) -> tuple[str, ...] | None:
    """The columns a user-given schema asks for (None: all of ours)."""
    arrow = schema.projection(requested)
    names = tuple(arrow.names)
    return None if arrow.equals(schema.ARROW_SCHEMA) else names


class MqlogReader(DataSourceReader):
    """A batch read: options in, partitions planned, batches out. No ``pushFilters``:
    Spark applies every filter, and every scan of a DataFrame reads the same plan."""

    def __init__(self, options: opts.ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        return list(planner.plan(self.options))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition, self.options)


class NarrowingReader(MqlogReader):
    """``MqlogReader`` whose pushed filters narrow the partitions it plans: for a JVM that
    keeps the plan in the scan that pushed them (see the module docstring)."""

    def pushFilters(self, filters: list[Filter]) -> Any:
        bounds, residual = pushdown.push(filters, self.options.mode)
        self.options = self.options.with_bounds(bounds)
        return residual


def read_partition(partition: InputPartition,
                   options: opts.ReadOptions) -> Iterator[pa.RecordBatch]:
    """Batches of one partition; its counters are saved to ``metricsDir`` at the end."""
    counters = Counters(partition=repr(partition))
    arrow = schema.arrow_schema(options.columns)
    keep_freed_memory()
    if isinstance(partition, opts.QueueRange):
        yield from read_queue(partition, counters, arrow)
    elif isinstance(partition, opts.QueueRanges):
        for part in partition.ranges:
            yield from read_queue(part, counters, arrow)
    elif isinstance(partition, opts.SegmentRange):
        yield from read_segment(partition, counters, arrow)
    elif isinstance(partition, opts.SegmentRanges):
        for piece in partition.ranges:
            yield from read_segment(piece, counters, arrow)
    else:
        assert partition.value is None, f"not an mqlog partition: {partition!r}"
    counters.save(options.metrics_dir)


def register(spark: Any) -> None:
    """Register the ``mqlog`` format with ``spark``; where the JVM keeps pushed filters
    in their own scan, enable filter pushdown and the narrowing reader.

    What is registered is a subclass of ``MqlogDataSource`` that knows the session's
    default parallelism (its task slots) and whether to narrow. Being defined here, not
    at module level, it is pickled by value, so the planning workers see both too."""
    found, scoped = _slots(spark), scan_scoped_pushdown(spark)
    if scoped:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")

    class RegisteredMqlogDataSource(MqlogDataSource):
        slots = found
        narrowing = scoped

    spark.dataSource.register(RegisteredMqlogDataSource)


_SCAN_BUILDER = "org.apache.spark.sql.execution.datasources.v2.python.PythonScanBuilder"


def scan_scoped_pushdown(spark: Any) -> bool:
    """Whether this Spark keeps a Python source's pushdown plan (``readInfo``) in the scan
    builder, one per scan, rather than on the DataFrame's provider (PySpark <= 4.3). False
    when it cannot tell (Spark Connect: no JVM to look at)."""
    try:
        builder = spark.sparkContext._jvm.java.lang.Class.forName(_SCAN_BUILDER)
        return any(field.getName() == "readInfo" for field in builder.getDeclaredFields())
    except Exception:  # noqa: BLE001 - Connect, or a JVM without the class: do not narrow
        return False


def _slots(spark: Any) -> int | None:
    """The session's default parallelism; None where there is no SparkContext (Spark
    Connect)."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:  # noqa: BLE001 - Connect raises its own error types here
        return None
