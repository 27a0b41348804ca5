"""The ``mqlog`` PySpark data source: batch reads and streaming reads of mqlog stores.

``register(spark)`` registers the format and switches on Python filter pushdown
(``spark.sql.python.filterPushdown.enabled``: PySpark refuses a reader that implements
``pushFilters`` without it). Then::

    spark.read.format("mqlog").option("path", "data/").load()
    spark.readStream.format("mqlog").option("path", "data/").load()

Batch: ``MqlogReader`` keeps the checked options (options.py), takes the filters it can
use (pushdown.py), plans partitions on the driver (planner.py) and reads each one in a
worker, statelessly, from the partition alone (reader.py for queues, commitlog.py for
segment files), as Arrow batches.

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

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> Any:
        return schema.spark_schema()

    def reader(self, schema: Any) -> DataSourceReader:
        return MqlogReader(opts.parse(self.options, _projection(schema), self.slots))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        from mqlog.spark_connector.stream import MqlogStreamReader

        return MqlogStreamReader(opts.parse(self.options, _projection(schema), self.slots))


def _projection(requested: Any) -> tuple[str, ...] | None:
    """The columns a user-given schema asks for (None: all of ours)."""
    arrow = schema.projection(requested)
    names = tuple(arrow.names)
    return None if arrow.equals(schema.ARROW_SCHEMA) else names


class MqlogReader(DataSourceReader):
    """A batch read: options in, filters pushed, partitions planned, batches out."""

    def __init__(self, options: opts.ReadOptions) -> None:
        self.options = options

    def pushFilters(self, filters: list[Filter]) -> Any:
        bounds, residual = pushdown.push(filters, self.options.mode)
        self.options = self.options.with_bounds(bounds)
        return residual

    def partitions(self) -> Sequence[InputPartition]:
        return list(planner.plan(self.options))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition, self.options)


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
    else:
        assert partition.value is None, f"not an mqlog partition: {partition!r}"
    counters.save(options.metrics_dir)


def register(spark: Any) -> None:
    """Register the ``mqlog`` format with ``spark`` and enable filter pushdown.

    What is registered is a subclass of ``MqlogDataSource`` that knows the session's
    default parallelism (its task slots). Being defined here, not at module level, it
    is pickled by value, so the planning workers see the number too."""
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    found = _slots(spark)

    class RegisteredMqlogDataSource(MqlogDataSource):
        slots = found

    spark.dataSource.register(RegisteredMqlogDataSource)


def _slots(spark: Any) -> int | None:
    """The session's default parallelism; None where there is no SparkContext (Spark
    Connect)."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:  # noqa: BLE001 - Connect raises its own error types here
        return None
