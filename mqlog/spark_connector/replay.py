"""Replay: re-read a range of a store in queue order, into another store or into Parquet.

Theory of operation. The range is a read of the ``mqlog`` source: ``start``/``end`` are
its starting/ending offsets (``earliest``, ``latest``, a number for every queue, or
Kafka's JSON) or, written ``time:<ms>``, its starting/ending timestamps; ``where`` is a
Spark SQL condition on the source's columns.

``where`` is checked against the source's columns before Spark starts where that can be
told from the text alone (``check_filter``: a name that is neither a column, a function,
a keyword nor a lambda variable), and Spark's own analysis of it is the backstop (the
CLI turns its error into one line).

Neither output needs a global sort, so no shuffle runs: the planner's partitions are
queue ranges read in offset order (planner.py).

* To Parquet: the selected rows are written with Spark (``mode=overwrite``), so a rerun
  replaces the output with the same rows; each file is sorted by (topic, queue_id,
  offset) within itself. The count comes from the written files' footers.
* To a store: a store has one writer, so the driver writes. Spark picks the (topic,
  queue_id, offset) triples (one Arrow table on the driver: 20 bytes or so a record);
  the driver sorts them into queue order and reads the original records from the
  source through a read-only snapshot, so properties keep their msgpack types. It writes them with
  ``put_batch``, one call per run of records that share a queue, key, tags and
  properties (``put_batch`` gives all its records the same ones; each keeps its own
  born timestamp) and have consecutive source offsets, at most ``BATCH_RECORDS`` /
  ``BATCH_BYTES`` a call: records a producer sent without keys or per-record
  properties replay in batches; records that all differ replay one per call. Order is
  kept per queue.

  Idempotence. Every record of a batch carries two properties (as decimal strings, like
  every property a producer sets): ``REPLAY_PROPERTY``,
  the source offset of the batch's first record, and ``REPLAY_FIRST_PROPERTY``, the
  destination offset of that first record. So each replayed record knows its own
  source offset (``source_offset``: the first's plus its distance from the first in
  the destination), even when a crash kept only part of a batch. Before writing a
  queue the driver reads the source offsets the destination queue holds (its records'
  marks, as ranges: a batch's are consecutive) and skips exactly those, so running the
  same replay again writes nothing twice, an interrupted one resumes where it stopped,
  and replays of other selections into the same store (another ``where``, an earlier
  range) write what they select. (It skipped every source offset up to the last
  record's, so a second selection's records below it were counted "already there" and
  never written: a hostile review.) The read costs a pass over the destination queue;
  records its retention deleted are not known as replayed, and go again.

Neither output holds a lost-record filler (the source's ``lost`` column: what ``mqlog
repair`` wrote at an offset whose record it could not save). A filler is no message, and
copied it would read as an ordinary record (a store has no way to write one) or row whose
body is padding; both paths leave fillers out and count them (``ReplayResult.lost``),
whatever ``where`` says. The store path learns it from the triples it collects (the
``lost`` column comes with them), the Parquet path from an ``Observation`` of the write's
own scan (no second pass over the source).

Neither output shows the idempotent producer's tag (the ``producer_id``, ``sequence``
and ``producer_epoch`` properties a replicated group's producer stores with every record,
mqlog/replication/idempotence.py) as user properties: it names a request to the source's
group, not to whoever reads the copy. Both outputs tell the tag the same way, from the
record's msgpack types by the engine's own rule (``layout.user_properties``: a str
``producer_id``, an int ``sequence`` >= 0, an int ``producer_epoch`` >= 0 if there): the
store path on the records it reads back, the Parquet path through the reader, whose
hidden ``user_properties`` column (schema.py) ``select`` reads and ``to_parquet`` writes as
``properties``. Every other property is kept as it is, whatever its name: a user's
``sequence: "42"`` beside ``producer_id: "shop-7"`` is no tag (the Parquet path once
decided from the properties' text, which Spark's map holds, and dropped it: a hostile
review).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import mqlog
from mqlog.errors import InvalidArgument
from mqlog.spark_connector.layout import PRODUCER_TAG_PROPERTIES, user_properties
from mqlog.spark_connector.schema import HIDDEN_COLUMNS, spark_schema

REPLAY_PROPERTY = "mqlog.replay.offset"  # source offset of the batch's first record
REPLAY_FIRST_PROPERTY = "mqlog.replay.first"  # destination offset of that record
BATCH_RECORDS = 1000  # at most this many records per put_batch call
BATCH_BYTES = 4 << 20  # and about this many bytes of bodies
_READ_COUNT = 1000


@dataclass
class ReplayResult:
    """What a replay did: records selected, written (in ``batches`` put_batch calls; 0
    to Parquet), skipped as already there (to a store), and left out as ``lost``
    (lost-record fillers: see the module docstring). ``selected`` counts all of them:
    ``written + skipped + lost``."""

    selected: int = 0
    written: int = 0
    skipped: int = 0
    batches: int = 0
    lost: int = 0


def source_offset(record: Any) -> int | None:
    """The source offset of a record replay wrote (None: not a replayed record). The
    marks are decimal strings (integers from replays before they were)."""
    first = _number(record.properties.get(REPLAY_PROPERTY))
    if first is None:
        return None
    at = _number(record.properties.get(REPLAY_FIRST_PROPERTY))
    return first + (record.offset - at if at is not None else 0)


def _number(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


IDEMPOTENCE_PROPERTIES = PRODUCER_TAG_PROPERTIES  # (the name replay had for them)


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
    """The DataFrame of the records to replay (unordered; see the module docstring): the
    source's columns and the hidden ``user_properties`` (``to_parquet`` writes it as the
    output's ``properties``)."""
    from mqlog.spark_connector import register

    check_filter(where)
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
    frame = spark.read.format("mqlog").schema(spark_schema(hidden=True)).options(**options) \
        .load()
    return frame.where(where) if where else frame


# Words of Spark SQL that may stand alone in a condition without being columns.
_KEYWORDS = frozenset((
    "and", "or", "not", "in", "is", "null", "true", "false", "like", "ilike", "rlike",
    "regexp", "between", "escape", "case", "when", "then", "else", "end", "cast",
    "try_cast", "as", "distinct", "interval", "exists", "any", "some", "all", "div", "xor",
    "similar", "to", "from", "for", "position", "year", "years", "month", "months", "week",
    "weeks", "day", "days", "hour", "hours", "minute", "minutes", "second", "seconds",
    "millisecond", "milliseconds", "microsecond", "microseconds", "timestamp",
    "timestamp_ntz", "timestamp_ltz", "date", "string", "binary", "boolean", "int",
    "integer", "bigint", "smallint", "tinyint", "long", "short", "byte", "float", "double",
    "real", "decimal", "dec", "numeric", "char", "varchar", "array", "map", "struct",
    "nulls", "first", "last", "asc", "desc", "over", "partition", "by", "order", "rows",
    "range", "unbounded", "preceding", "following", "current", "row", "collate", "unknown",
    "current_date", "current_timestamp", "current_user", "current_timezone", "localtimestamp",
))
_TOKEN = re.compile(r"""'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|`((?:[^`]|``)*)`|"""
                    r"""([A-Za-z_][A-Za-z0-9_]*)|(\d[\w.]*)|(->)|(\S)""")


def check_filter(where: str | None) -> None:
    """Refuse a condition that names something that is not a column (InvalidArgument),
    before any Spark work: every bare or `quoted` name must be a column, a function
    (followed by ``(``), a keyword, a lambda variable (before ``->``) or a field after a
    dot. What this cannot tell is left to Spark's analysis."""
    if not where or not where.strip():
        if where is not None:
            raise InvalidArgument("--filter is empty; give a Spark SQL condition such as "
                                  "\"queue_id = 1 AND offset >= 100\"")
        return
    from mqlog.spark_connector.schema import COLUMNS, SCHEMA_DDL

    tokens = [(match.group(1), match.group(2), match.group(4), match.group(5))
              for match in _TOKEN.finditer(where)]
    lambdas = {token[0] or token[1] for token, following
               in zip(tokens, tokens[1:], strict=False) if following[2] and (token[0] or token[1])}
    known = {name.lower() for name in (*COLUMNS, *lambdas, *_lambda_lists(tokens))}
    for index, (quoted, word, _arrow, _other) in enumerate(tokens):
        name = quoted if quoted is not None else word
        if name is None:
            continue
        before = tokens[index - 1][3] if index else None
        after = tokens[index + 1][3] if index + 1 < len(tokens) else None
        if before == "." or (quoted is None and (after == "(" or name.lower() in _KEYWORDS)):
            continue
        if name.lower() in known:  # (Spark's names are not case-sensitive by default)
            continue
        raise InvalidArgument(f"--filter names {name!r}, which is not a column of the "
                              f"mqlog source; its columns are {SCHEMA_DDL}")


def _lambda_lists(tokens: list[tuple[Any, ...]]) -> set[str]:
    """Names in ``(x, y) -> ...``: the parenthesised list just before an arrow."""
    found: set[str] = set()
    for index, (_quoted, _word, arrow, _other) in enumerate(tokens):
        if not arrow or index == 0 or tokens[index - 1][3] != ")":
            continue
        at = index - 2
        while at >= 0 and tokens[at][3] != "(":
            name = tokens[at][0] or tokens[at][1]
            if name:
                found.add(name)
            at -= 1
    return found


def _json(value: Any) -> str:
    import json

    return json.dumps(value)


def to_parquet(frame: Any, out: str) -> int:
    """``write_parquet``: the number of rows written."""
    return write_parquet(frame, out).written


def write_parquet(frame: Any, out: str) -> ReplayResult:
    """Write the selection (``select``'s DataFrame) to Parquet at ``out`` (replacing it),
    each file in queue order, the source's columns with ``properties`` without the
    producer's tag (the reader's ``user_properties``: see the module docstring), and
    without lost-record fillers; what it wrote (``written``: rows) and left out
    (``lost``)."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    (user,) = HIDDEN_COLUMNS
    if user not in frame.columns:
        raise InvalidArgument(f"to_parquet writes a DataFrame from replay.select, which has "
                              f"the source's {user} column; this one has only "
                              f"{', '.join(frame.columns)}")
    observed = Observation("mqlog replay")
    frame = frame.observe(observed, F.count_if(F.col("lost")).alias("lost")) \
        .where(~F.col("lost")).withColumn("properties", F.col(user)).drop(user)
    frame.sortWithinPartitions("topic", "queue_id", "offset").write.mode("overwrite") \
        .parquet(out)
    written = int(frame.sparkSession.read.parquet(out).count())
    lost = int(observed.get.get("lost") or 0)
    return ReplayResult(selected=written + lost, written=written, lost=lost)


def to_store(frame: Any, source: str, destination: str) -> ReplayResult:
    """Write the selection into the store at ``destination``; see the module docstring."""
    import pyarrow.compute as pc

    if _same_dir(source, destination):
        raise InvalidArgument("replay cannot write into the store it reads; give another "
                              "destination directory")
    result = ReplayResult()
    keys = frame.select("topic", "queue_id", "offset", "lost").toArrow()
    fillers = pc.fill_null(keys.column("lost"), False)
    result.lost = int(pc.sum(fillers).as_py() or 0)  # (a sum of booleans: the trues)
    result.selected += result.lost
    if result.lost:
        keys = keys.filter(pc.invert(fillers))
    with mqlog.open(source, read_only=True) as origin, mqlog.open(destination) as target:
        done: dict[tuple[str, int], Replayed] = {}
        for topic, queue_id, offsets in _runs(keys):
            result.selected += len(offsets)
            queue = (topic, queue_id)
            if queue not in done:
                done[queue] = _replayed(target, topic, queue_id)
            fresh = [offset for offset in offsets if offset not in done[queue]]
            result.skipped += len(offsets) - len(fresh)
            for batch in _batches(_originals(origin, topic, queue_id, fresh)):
                _put(target, topic, queue_id, batch)
                done[queue].add(batch[0].offset, batch[-1].offset + 1)
                result.written += len(batch)
                result.batches += 1
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
        fields = (record.key, record.tags, _packed(user_properties(record.properties)))
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
    properties = {**user_properties(first.properties), REPLAY_PROPERTY: str(first.offset),
                  REPLAY_FIRST_PROPERTY: str(at)}
    written = target.put_batch(topic, [record.body for record in batch], queue_id,
                               key=first.key, tags=first.tags, properties=properties,
                               born_timestamp=[record.born_timestamp for record in batch])
    assert written.offset == at, f"replay expected offset {at}, put_batch wrote {written}"


def _same_dir(one: str, two: str) -> bool:
    import os

    return os.path.realpath(one) == os.path.realpath(two)


def _runs(keys: Any) -> Iterator[tuple[str, int, list[int]]]:
    """An Arrow table of (topic, queue_id, offset), in any order, as (topic, queue,
    offsets) runs in queue order, at most _READ_COUNT offsets each."""
    import numpy as np
    import pyarrow.compute as pc

    if keys.num_rows == 0:
        return
    topics = pc.dictionary_encode(keys.column("topic")).combine_chunks()
    names = topics.dictionary.to_pylist()
    rank = np.argsort(np.argsort(np.asarray(names, dtype=object)))  # name order
    topic_rank = rank[topics.indices.to_numpy(zero_copy_only=False)]
    queue = keys.column("queue_id").to_numpy().astype(np.int64)
    offset = keys.column("offset").to_numpy().astype(np.int64)
    order = np.lexsort((offset, queue, topic_rank))
    topic_rank, queue, offset = topic_rank[order], queue[order], offset[order]
    by_rank = [names[index] for index in np.argsort(rank)]
    change = np.flatnonzero((np.diff(topic_rank) != 0) | (np.diff(queue) != 0)) + 1
    for low, high in zip([0, *change.tolist()], [*change.tolist(), len(order)], strict=True):
        for first in range(low, high, _READ_COUNT):
            yield (by_rank[int(topic_rank[low])], int(queue[low]),
                   offset[first:min(high, first + _READ_COUNT)].tolist())


class Replayed:
    """Source offsets a destination queue holds, as sorted disjoint [low, high) ranges
    (a batch's offsets are consecutive: few ranges for many records)."""

    def __init__(self) -> None:
        self.lows: list[int] = []
        self.highs: list[int] = []

    def add(self, low: int, high: int) -> None:
        at = bisect.bisect_left(self.lows, low)
        if at and self.highs[at - 1] >= low:  # (touches the one before: merge into it)
            at -= 1
            low = self.lows[at]
        end = at
        while end < len(self.lows) and self.lows[end] <= high:
            high = max(high, self.highs[end])
            end += 1
        self.lows[at:end], self.highs[at:end] = [low], [high]

    def __contains__(self, offset: int) -> bool:
        at = bisect.bisect_right(self.lows, offset) - 1
        return at >= 0 and offset < self.highs[at]


def _replayed(target: Any, topic: str, queue_id: int) -> Replayed:
    """The source offsets of the records replay wrote into this queue (one pass)."""
    found, at = Replayed(), target.min_offset(topic, queue_id)
    end = target.max_offset(topic, queue_id)
    while at < end:
        records = target.get(topic, queue_id, at, _READ_COUNT, 1 << 24)
        if not records:
            break
        for record in records:
            offset = source_offset(record)
            if offset is not None:
                found.add(offset, offset + 1)
        at = records[-1].offset + 1
    return found


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
