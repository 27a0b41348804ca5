"""Streaming reads: ``spark.readStream.format("mqlog")`` tails one store.

Theory of operation. A stream offset is Kafka's JSON form, ``{"topic": {"queue_id":
next_offset}}`` (queue ids as strings, as JSON needs). Spark checkpoints the offsets it
planned and, on restart, resumes from the last committed ones, so the source keeps no
state of its own across runs:

* ``initialOffset``: each wanted queue at the ``startingOffsets`` / ``startingTimestamp``
  position (earliest by default);
* ``latestOffset(start, limit)``: a fresh read-only snapshot gives each queue's end; a
  queue that appeared since ``start`` starts at its minimum. ``maxRecordsPerTrigger``
  (Spark's ``ReadMaxRows``) is shared fairly among the queues that have records; with
  ``Trigger.AvailableNow`` the ends are frozen by ``prepareForTriggerAvailableNow`` so
  the query stops once it has read what existed when it started;
* ``partitions(start, end)``: one ``QueueRange`` per queue that moved, cut by
  ``maxRecordsPerPartition`` and packed as a batch read's are (options.py: no more
  partitions than task slots unless the ranges are large); ``read`` is the batch
  source's. If retention deleted
  records the query had not read yet (its start is below the queue's minimum offset),
  the batch fails with OffsetOutOfRange — Kafka's ``failOnDataLoss``, true by default —
  or, with ``failOnDataLoss=false``, starts at the minimum and says what it skipped
  (then also what retention deletes between planning and reading: ``skip_lost``). A
  truncation between the two fails the batch with ``StoreChanged`` (reader.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from mqlog.errors import InvalidArgument, OffsetOutOfRange
from mqlog.spark_connector import planner
from mqlog.spark_connector.options import QueueRange, ReadOptions, pack, resolve, split

Offsets = dict[str, dict[str, int]]


class MqlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """See the module docstring."""

    def __init__(self, options: ReadOptions) -> None:
        if len(options.paths) != 1 or options.mode != "queue":
            raise InvalidArgument("a streaming mqlog read tails one store in queue mode: give "
                                  "'path' (not 'paths') and no mode=commitlog")
        self.options = options
        self.path, self.replica = options.paths[0]
        self.target: Offsets | None = None  # frozen ends under Trigger.AvailableNow

    def initialOffset(self) -> dict:
        found: Offsets = {}
        with planner.open_store(self.path) as store:
            for topic, queue_id in store.queues():
                if self.options.wants(topic, queue_id):
                    start, _ = planner.queue_bounds(store, self.options, topic, queue_id)
                    found.setdefault(topic, {})[str(queue_id)] = start
        return found

    def _ends(self) -> Offsets:
        ends: Offsets = {}
        with planner.open_store(self.path) as store:
            for topic, queue_id in store.queues():
                if self.options.wants(topic, queue_id):
                    low, high = store.min_offset(topic, queue_id), \
                        store.max_offset(topic, queue_id)
                    end = resolve(self.options.ending, topic, queue_id, low, high, -1)
                    ends.setdefault(topic, {})[str(queue_id)] = end
        return ends

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._ends()

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.records_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        ends = self.target if self.target is not None else self._ends()
        begin = {(topic, queue): offset for topic, queues in start.items()
                 for queue, offset in queues.items()}
        wanted = {(topic, queue): (begin.get((topic, queue)), end)
                  for topic, queues in ends.items() for queue, end in queues.items()}
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        latest = _share(wanted, self._minimum_offsets(wanted), budget)
        for key, offset in begin.items():
            latest.setdefault(key, offset)  # a queue that vanished keeps its place
        result: Offsets = {}
        for (topic, queue), offset in sorted(latest.items()):
            result.setdefault(topic, {})[queue] = offset
        return result

    def _minimum_offsets(self, wanted: dict) -> dict[tuple[str, str], int]:
        missing = [key for key, (first, _) in wanted.items() if first is None]
        if not missing:
            return {}
        with planner.open_store(self.path) as store:
            return {key: store.min_offset(key[0], int(key[1])) for key in missing}

    def reportLatestOffset(self) -> dict | None:
        return dict(self._ends())

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        ranges = []
        weights = planner.QueueBytes()
        with planner.open_store(self.path) as store:
            for topic, queues in end.items():
                for queue, stop in queues.items():
                    low = store.min_offset(topic, int(queue))
                    first = self._check_loss(topic, queue, start.get(topic, {}).get(queue),
                                             low, store.max_offset(topic, int(queue)))
                    if first < stop:
                        ranges.append(QueueRange(
                            self.path, self.replica, topic, int(queue), first, stop,
                            skip_lost=not self.options.fail_on_data_loss))
                        weights.add(store, ranges[-1])
            per_partition = self.options.records_per_partition
            return planner.mark_ranges(
                pack(split(ranges, per_partition, 1, weights), self.options.slots,
                     per_partition, 1, weights), {self.path: store})

    def _check_loss(self, topic: str, queue: str, first: int | None, low: int,
                    high: int) -> int:
        """Where this batch starts reading the queue: ``first``, unless retention deleted
        it (then fail, or skip to ``low`` when failOnDataLoss is false)."""
        if first is None or first >= low:
            return low if first is None else first
        lost = (f"offsets [{first}, {low}) of {topic}/{queue} were deleted by retention "
                "before this query read them")
        if self.options.fail_on_data_loss:
            raise OffsetOutOfRange(f"{lost}; set failOnDataLoss=false to skip them, or keep "
                                   "records longer (retention_ms, retention_bytes)",
                                   min_offset=low, max_offset=high)
        print(f"mqlog stream: {lost}; skipped (failOnDataLoss=false)", flush=True)
        return low

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from mqlog.spark_connector.datasource import read_partition

        return read_partition(partition, self.options)

    def commit(self, end: dict) -> None:
        """Nothing to release: Spark's checkpoint holds the offsets."""


def _share(wanted: dict, minimums: dict, budget: int | None) -> dict[tuple[str, str], int]:
    """Each queue's next end: all it has, or a fair share of ``budget`` records."""
    first = {key: minimums[key] if start is None else start
             for key, (start, _) in wanted.items()}
    spare = {key: max(0, end - first[key]) for key, (_, end) in wanted.items()}
    taken = dict.fromkeys(wanted, 0)
    if budget is None:
        taken = spare
    else:
        left = budget
        while left > 0 and any(spare[key] > taken[key] for key in wanted):
            hungry = [key for key in sorted(wanted) if spare[key] > taken[key]]
            share = max(1, left // len(hungry))
            for key in hungry:
                more = min(share, spare[key] - taken[key], left)
                taken[key] += more
                left -= more
    return {key: first[key] + taken[key] for key in wanted}
