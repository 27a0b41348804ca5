"""Replay: re-read a range of a store in queue order, into another store or into Parquet.

Theory of operation. The range is a read of the ``mqlog`` source: ``start``/``end`` are
its starting/ending offsets (``earliest``, ``latest``, a number for every queue, or
Kafka's JSON) or, written ``time:<ms>``, its starting/ending timestamps; ``where`` is a
Spark SQL condition on the source's columns.

* To Parquet: the selected rows are written with Spark (``mode=overwrite``), so a rerun
  replaces the output with the same rows.
* To a store: a store has one writer, so the driver writes. Spark picks the (topic,
  queue_id, offset) triples in queue order; the driver streams them
  (``toLocalIterator``) and reads the original records from the source through a
  read-only snapshot, so properties keep their msgpack types. It writes them with
  ``put_batch``, one call per run of records that share a queue, key, tags and
  properties (``put_batch`` gives all its records the same ones; each keeps its own
  born timestamp) and have consecutive source offsets, at most ``BATCH_RECORDS`` /
  ``BATCH_BYTES`` a call: records a producer sent without keys or per-record
  properties replay in batches; records that all differ replay one per call. Order is
  kept per queue.

  Idempotence. Every record of a batch carries two properties: ``REPLAY_PROPERTY``,
  the source offset of the batch's first record, and ``REPLAY_FIRST_PROPERTY``, the
  destination offset of that first record. So each replayed record knows its own
  source offset (``source_offset``: the first's plus its distance from the first in
  the destination), even when a crash kept only part of a batch. Before writing a
  queue the driver reads the destination queue's last record and skips every source
  offset up to that record's, so running the same replay again writes nothing twice
  and an interrupted one resumes where it stopped.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import mqlog
from mqlog.errors import InvalidArgument

REPLAY_PROPERTY = "mqlog.replay.offset"  # source offset of the batch's first record
REPLAY_FIRST_PROPERTY = "mqlog.replay.first"  # destination offset of that record
BATCH_RECORDS = 1000  # at most this many records per put_batch call
BATCH_BYTES = 4 << 20  # and about this many bytes of bodies
_READ_COUNT = 1000


@dataclass
class ReplayResult:
    """What a replay did: records selected, written (in ``batches`` put_batch calls),
    and skipped as already there."""

    selected: int = 0
    written: int = 0
    skipped: int = 0
    batches: int = 0


def source_offset(record: Any) -> int | None:
    """The source offset of a record replay wrote (None: not a replayed record)."""
    first = record.properties.get(REPLAY_PROPERTY)
    if not isinstance(first, int):
        return None
    at = record.properties.get(REPLAY_FIRST_PROPERTY)
    return first + (record.offset - at if isinstance(at, int) else 0)


def range_options(start: str | None, end: str | None) -> dict[str, str]:
    """Source options for a replay range (see the module docstring)."""
    found: dict[str, str] = {}
    for text, offsets, times in ((start, "startingOffsets", "startingTimestamp"),
                                 (end, "endingOffsets", "endingTimestamp")):
        if text is None:
            continue
        text = text.strip()
        if text.startswith("time:"):
            found[times] = text[5:]
        else:
            found[offsets] = text  # a bare number is expanded per queue by select()
    return found


def select(spark: Any, source: str, start: str | None = None, end: str | None = None,
           where: str | None = None, topics: str | None = None) -> Any:
    """The DataFrame of the records to replay, in queue order."""
    from mqlog.spark_connector import register

    register(spark)
    options = {"path": source, **range_options(start, end)}
    if topics:
        options["topics"] = topics
    with mqlog.open(source, read_only=True) as store:
        for name in ("startingOffsets", "endingOffsets"):
            if options.get(name, "").lstrip("-").isdigit():
                number = int(options[name])
                per_queue: dict[str, dict[str, int]] = {}
                for topic, queue_id in store.queues():
                    per_queue.setdefault(topic, {})[str(queue_id)] = number
                options[name] = _json(per_queue)
    frame = spark.read.format("mqlog").options(**options).load()
    if where:
        frame = frame.where(where)
    return frame.orderBy("topic", "queue_id", "offset")


def _json(value: Any) -> str:
    import json

    return json.dumps(value)


def to_parquet(frame: Any, out: str) -> int:
    """Write the selection to Parquet at ``out`` (replacing it); the number of rows."""
    frame.write.mode("overwrite").parquet(out)
    return int(frame.count())


def to_store(frame: Any, source: str, destination: str) -> ReplayResult:
    """Write the selection into the store at ``destination``; see the module docstring."""
    if _same_dir(source, destination):
        raise InvalidArgument("replay cannot write into the store it reads; give another "
                              "destination directory")
    result = ReplayResult()
    keys = frame.select("topic", "queue_id", "offset").toLocalIterator()
    with mqlog.open(source, read_only=True) as origin, mqlog.open(destination) as target:
        done: dict[tuple[str, int], int] = {}
        for topic, queue_id, offsets in _runs(keys):
            result.selected += len(offsets)
            queue = (topic, queue_id)
            if queue not in done:
                done[queue] = _replayed_up_to(target, topic, queue_id)
            fresh = [offset for offset in offsets if offset > done[queue]]
            result.skipped += len(offsets) - len(fresh)
            for batch in _batches(_originals(origin, topic, queue_id, fresh)):
                _put(target, topic, queue_id, batch)
                result.written += len(batch)
                result.batches += 1
            if fresh:
                done[queue] = fresh[-1]
        target.flush()
    return result


def _batches(records: Iterator[Any]) -> Iterator[list[Any]]:
    """Records (of one queue, in offset order) in runs that one put_batch can write: the
    same key, tags and properties (compared as msgpack, so 1 and True differ),
    consecutive offsets, at most BATCH_RECORDS and about BATCH_BYTES."""
    batch: list[Any] = []
    shared: tuple[Any, ...] | None = None
    size = 0
    for record in records:
        fields = (record.key, record.tags, _packed(record.properties))
        if batch and (fields != shared or record.offset != batch[-1].offset + 1 or
                      len(batch) >= BATCH_RECORDS or size + len(record.body) > BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(record)
        shared = fields
        size += len(record.body)
    if batch:
        yield batch


def _packed(properties: dict) -> bytes:
    import msgpack

    return msgpack.packb(properties, use_bin_type=True)


def _put(target: Any, topic: str, queue_id: int, batch: list[Any]) -> None:
    """One put_batch of ``batch`` (see ``_batches``), marked as the module docstring says."""
    first = batch[0]
    at = target.max_offset(topic, queue_id)  # the driver is the destination's only writer
    properties = {**first.properties, REPLAY_PROPERTY: first.offset, REPLAY_FIRST_PROPERTY: at}
    written = target.put_batch(topic, [record.body for record in batch], queue_id,
                               key=first.key, tags=first.tags, properties=properties,
                               born_timestamp=[record.born_timestamp for record in batch])
    assert written.offset == at, f"replay expected offset {at}, put_batch wrote {written}"


def _same_dir(one: str, two: str) -> bool:
    import os

    return os.path.realpath(one) == os.path.realpath(two)


def _runs(rows: Iterator[Any]) -> Iterator[tuple[str, int, list[int]]]:
    """Rows sorted by queue and offset, grouped into (topic, queue, offsets) runs of at
    most _READ_COUNT offsets."""
    current: tuple[str, int] | None = None
    offsets: list[int] = []
    for row in rows:
        queue = (row[0], row[1])
        if (queue != current or len(offsets) >= _READ_COUNT) and offsets:
            assert current is not None
            yield current[0], current[1], offsets
            offsets = []
        current = queue
        offsets.append(row[2])
    if offsets:
        assert current is not None
        yield current[0], current[1], offsets


def _replayed_up_to(target: Any, topic: str, queue_id: int) -> int:
    """The source offset of the last record replayed into this queue (-1: none)."""
    end = target.max_offset(topic, queue_id)
    if end == 0 or end <= target.min_offset(topic, queue_id):
        return -1
    found = source_offset(target.get(topic, queue_id, end - 1, 1)[0])
    return -1 if found is None else found


def _originals(origin: Any, topic: str, queue_id: int, offsets: list[int]) -> Iterator[Any]:
    """The source records at ``offsets`` (ascending), read in runs."""
    if not offsets:
        return
    wanted = set(offsets)
    at, last = offsets[0], offsets[-1]
    while at <= last:
        batch = origin.get(topic, queue_id, at, min(_READ_COUNT, last - at + 1), 1 << 24)
        for record in batch:
            if record.offset in wanted:
                yield record
        at = batch[-1].offset + 1
