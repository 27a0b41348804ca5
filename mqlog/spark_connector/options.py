"""The source's options, checked once, and the partitions a read is cut into.

Options follow Spark's Kafka source where they overlap (DESIGN §6):

* ``path`` (one store) or ``paths`` (comma-separated: one store per replica; each row's
  ``replica`` column names the store it came from, as the path was given);
* ``topic`` / ``topics`` (comma-separated), ``queues`` (comma-separated queue ids, or
  ``topic:queue_id`` items);
* ``startingOffsets`` / ``endingOffsets``: ``earliest``, ``latest`` or Kafka's JSON
  ``{"orders": {"0": 23, "1": -2}}`` (-2 earliest, -1 latest; a queue the JSON does not
  name starts at earliest / ends at latest); the end is exclusive;
* ``startingTimestamp`` / ``endingTimestamp`` (ms): from the first record stored at or
  after the start, up to the first one stored at or after the end (Kafka's rule);
* ``mode``: ``queue`` (the default: records through their consume queues, in queue
  order, from a read-only snapshot) or ``commitlog`` (every record in the segment files,
  with its CRC checked and reported in ``crc_ok``);
* ``minPartitions``, ``maxRecordsPerPartition``; ``metricsDir``: a directory where each
  partition read leaves its counters (records and bytes read), for tests and tuning.

A partition is a frozen, picklable description: (store, replica, topic, queue, offset
range) in queue mode, (store, replica, segment, position range) in commit-log mode.
Offsets and times are resolved to offset ranges while planning, on the driver, so that
``read()`` needs nothing but the partition.

Cutting (``split``) gives every range at most ``maxRecordsPerPartition`` records and
makes at least ``minPartitions`` pieces (halving the heaviest). Packing (``pack``) then
joins pieces when there are more of them than the session has task slots (``slots``: its default
parallelism, which ``register`` records): a task costs a Python worker round trip and
every wave of tasks beyond the first costs one more, so 4 queues of 250,000 records
on 2 cores are read as 2 partitions of 500,000 (``QueueRanges``: several queue ranges
read one after the other), cut evenly so that the cores finish together. "Evenly" is by
weight: the planner weighs records by their bytes (``Weights``; planner.py), so a
queue of 10 KiB records is cut where a queue of 100-byte records would not be.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from pyspark.sql.datasource import InputPartition

from mqlog.errors import InvalidArgument

EARLIEST, LATEST = -2, -1
DEFAULT_RECORDS_PER_PARTITION = 1_000_000
MODES = ("queue", "commitlog")
# Every option the source reads (as written in the docs; Spark passes them lower-cased)
OPTION_NAMES = ("path", "paths", "topic", "topics", "queues", "mode", "startingOffsets",
                "endingOffsets", "startingTimestamp", "endingTimestamp", "minPartitions",
                "maxRecordsPerPartition", "maxRecordsPerTrigger", "failOnDataLoss",
                "metricsDir")


@dataclass(frozen=True)
class QueueRange(InputPartition):
    """Offsets [start, end) of one queue of one store.

    ``marks``: (position, CRC32C) of the range's first and last records as the planner
    saw them (reader.py checks that they are still there: nothing was deleted or
    replaced since); empty when unknown. ``changes``: the store's change count when the
    planner looked (``Store.change_count``), by which a read that fails tells a change
    under it from damage; neither (a range not planned, or from a store with no count
    yet) reads what the store holds when it is read. ``skip_lost``: a streaming read
    with failOnDataLoss=false, which skips what retention deleted meanwhile."""

    path: str
    replica: str
    topic: str
    queue_id: int
    start: int
    end: int
    marks: tuple[tuple[int, int], ...] = ()
    changes: int | None = None
    skip_lost: bool = False

    @property
    def count(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class QueueRanges(InputPartition):
    """Several queue ranges read one after the other by one task (see ``pack``)."""

    ranges: tuple[QueueRange, ...]

    @property
    def count(self) -> int:
        return sum(part.count for part in self.ranges)


@dataclass(frozen=True)
class SegmentRange(InputPartition):
    """Records that start in [start, end) of one segment file (positions); the walk
    over them starts at ``walk_from`` (None: the segment's first byte), a position
    known to hold a record, at or before ``start``. ``written``: where the store's log
    ended when the read was planned (None: the store could not be opened), past which
    zeros are the unwritten tail, not a hole."""

    path: str
    replica: str
    base: int
    start: int
    end: int
    walk_from: int | None = None
    written: int | None = None

    @property
    def count(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class SegmentRanges(InputPartition):
    """Several segment ranges (of one store or several) read one after the other by one
    task (planner.py packs small work)."""

    ranges: tuple[SegmentRange, ...]


@dataclass(frozen=True)
class Bounds:
    """Narrowing from pushed filters: a half-open range per column (None: unbounded),
    and the allowed values of topic, queue_id and replica (None: any)."""

    topics: frozenset[str] | None = None
    queue_ids: frozenset[int] | None = None
    replicas: frozenset[str] | None = None
    offset: tuple[int | None, int | None] = (None, None)
    timestamp_ms: tuple[int | None, int | None] = (None, None)
    position: tuple[int | None, int | None] = (None, None)


@dataclass(frozen=True)
class ReadOptions:
    paths: tuple[tuple[str, str], ...]  # (store path, replica name)
    topics: frozenset[str] | None = None
    queues: frozenset[tuple[str | None, int]] | None = None
    starting: Any = "earliest"
    ending: Any = "latest"
    starting_ms: int | None = None
    ending_ms: int | None = None
    mode: str = "queue"
    min_partitions: int = 1
    records_per_partition: int = DEFAULT_RECORDS_PER_PARTITION
    records_per_trigger: int | None = None
    fail_on_data_loss: bool = True  # streaming: retention deleted records not yet read
    metrics_dir: str | None = None
    columns: tuple[str, ...] | None = None  # a projection given as a schema; None: all
    slots: int | None = None  # the session's task slots (see ``pack``); None: unknown
    bounds: Bounds = field(default_factory=Bounds)

    def wants(self, topic: str, queue_id: int) -> bool:
        if self.topics is not None and topic not in self.topics:
            return False
        if self.bounds.topics is not None and topic not in self.bounds.topics:
            return False
        if self.bounds.queue_ids is not None and queue_id not in self.bounds.queue_ids:
            return False
        return self.queues is None or (topic, queue_id) in self.queues or \
            (None, queue_id) in self.queues

    def with_bounds(self, bounds: Bounds) -> ReadOptions:
        return replace(self, bounds=bounds)


def parse(options: Any, columns: tuple[str, ...] | None = None,
          slots: int | None = None) -> ReadOptions:
    """Check the user's options (a case-insensitive mapping of str) into ReadOptions;
    ``columns``: the columns a user-given schema picks (None: all); ``slots``: the
    session's default parallelism, if known."""
    given = {str(key).lower(): str(value) for key, value in dict(options).items()}
    unknown = sorted(set(given) - {name.lower() for name in OPTION_NAMES})
    if unknown:  # (a misspelled bound would silently widen the read to everything)
        raise InvalidArgument(f"the mqlog source has no option {', '.join(map(repr, unknown))}"
                              f"; its options are {', '.join(OPTION_NAMES)}")
    get = given.get
    paths = _paths(get("path"), get("paths"))
    topics = _names(get("topic"), get("topics"))
    mode = (get("mode") or "queue").lower()
    if mode not in MODES:
        raise InvalidArgument(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    return ReadOptions(
        paths=paths, topics=topics, queues=_queues(get("queues")),
        starting=_offsets("startingOffsets", get("startingoffsets"), "earliest"),
        ending=_offsets("endingOffsets", get("endingoffsets"), "latest"),
        starting_ms=_int("startingTimestamp", get("startingtimestamp"), 0),
        ending_ms=_int("endingTimestamp", get("endingtimestamp"), 0),
        mode=mode,
        min_partitions=_int("minPartitions", get("minpartitions"), 1) or 1,
        records_per_partition=_int("maxRecordsPerPartition", get("maxrecordsperpartition"),
                                   1) or DEFAULT_RECORDS_PER_PARTITION,
        records_per_trigger=_int("maxRecordsPerTrigger", get("maxrecordspertrigger"), 1),
        fail_on_data_loss=_bool("failOnDataLoss", get("failondataloss"), True),
        metrics_dir=get("metricsdir"), columns=columns, slots=slots)


def _paths(path: str | None, paths: str | None) -> tuple[tuple[str, str], ...]:
    if (path is None) == (paths is None):
        raise InvalidArgument("give the mqlog source exactly one of the options 'path' (one "
                              "store) or 'paths' (comma-separated stores, one per replica)")
    if path is not None:  # (one store: a comma may be part of its name)
        return ((path, path),)
    assert paths is not None
    named = _json_paths(paths) if paths.lstrip().startswith("[") else \
        [item.strip() for item in paths.split(",") if item.strip()]
    if not named or len(set(named)) != len(named):
        raise InvalidArgument(f"'paths' must name distinct store directories, got {named}")
    return tuple((item, item) for item in named)


def _json_paths(text: str) -> list[str]:
    """'paths' as a JSON list of strings: names that hold commas (reconcile passes its
    replicas so; split on commas, "node,1" was two stores)."""
    try:
        named = json.loads(text)
    except ValueError:
        named = None
    if not isinstance(named, list) or not all(isinstance(item, str) for item in named):
        raise InvalidArgument(f"'paths' starting with '[' must be a JSON list of store "
                              f"directories, got {text!r}")
    return named


def _names(topic: str | None, topics: str | None) -> frozenset[str] | None:
    names = [name.strip() for text in (topic, topics) if text for name in text.split(",")]
    return frozenset(name for name in names if name) or None


def _queues(text: str | None) -> frozenset[tuple[str | None, int]] | None:
    if not text:
        return None
    found: set[tuple[str | None, int]] = set()
    for item in (part.strip() for part in text.split(",")):
        topic, _, queue_id = item.rpartition(":")
        if not queue_id.isdigit():
            raise InvalidArgument(f"'queues' items are queue ids or topic:queue_id, got "
                                  f"{item!r}")
        found.add((topic or None, int(queue_id)))
    return frozenset(found)


def _int(name: str, text: str | None, low: int) -> int | None:
    if text is None or text == "":
        return None
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgument(f"option {name} must be an integer, got {text!r}") from None
    if value < low:
        raise InvalidArgument(f"option {name} must be >= {low}, got {value}")
    return value


def _bool(name: str, text: str | None, default: bool) -> bool:
    if text is None or text == "":
        return default
    if text.lower() not in ("true", "false"):
        raise InvalidArgument(f"option {name} must be true or false, got {text!r}")
    return text.lower() == "true"


def _offsets(name: str, text: str | None, default: str) -> Any:
    """'earliest', 'latest', or {topic: {queue_id: offset}} with -2/-1 allowed."""
    if text is None or text.strip().lower() in ("", default):
        return default
    if text.strip().lower() in ("earliest", "latest"):
        return text.strip().lower()
    try:
        parsed = json.loads(text)
        offsets = {str(topic): {int(queue): offset for queue, offset in queues.items()}
                   for topic, queues in parsed.items()}
        if any(type(offset) is not int for queues in offsets.values()
               for offset in queues.values()):
            raise TypeError("an offset that is not an integer")  # (7.9 or true read as 7, 1)
        return offsets
    except (ValueError, AttributeError, TypeError):
        raise InvalidArgument(f"option {name} must be 'earliest', 'latest' or JSON like "
                              f'{{"orders": {{"0": 23, "1": -2}}}}, got {text!r}') from None


def resolve(spec: Any, topic: str, queue_id: int, low: int, high: int, default: int) -> int:
    """One queue's offset from a starting/ending spec, clamped into [low, high]."""
    if spec == "earliest":
        value = EARLIEST
    elif spec == "latest":
        value = LATEST
    else:
        value = spec.get(topic, {}).get(queue_id, default)
    if value == EARLIEST:
        return low
    if value == LATEST:
        return high
    if value < 0:
        raise InvalidArgument(f"offset {value} for {topic}/{queue_id}: use -2 (earliest), "
                              "-1 (latest) or an offset >= 0")
    return min(max(value, low), high)


Piece = TypeVar("Piece", QueueRange, SegmentRange)


class Weights(Protocol):
    """What a queue range weighs, for cutting work into equal shares (the planner's
    ``QueueBytes``: bytes, from the consume-queue entries' sizes)."""

    def size(self, piece: QueueRange) -> int:
        """The weight of ``piece``'s records."""

    def advance(self, piece: QueueRange, start: int, weight: int) -> int:
        """The first offset ``o`` in (start, piece.end] such that records [start, o)
        weigh at least ``weight`` (piece.end when the rest weighs less)."""


class RecordWeights:
    """Every record weighs 1 (ranges that are not queue ranges, or no sizes known)."""

    def size(self, piece: Any) -> int:
        return int(piece.count)

    def advance(self, piece: Any, start: int, weight: int) -> int:
        return int(min(piece.end, start + max(weight, 1)))


def split(ranges: Sequence[Piece], per_partition: int | None, min_partitions: int,
          weights: Weights | None = None) -> list[Piece]:
    """Cut ranges into pieces of at most ``per_partition`` records (None: no cap), then
    keep halving the heaviest piece (by ``weights``: records, unless given) until there
    are ``min_partitions`` (or none can be cut)."""
    weigh: Any = weights or RecordWeights()
    pieces: list[Piece] = []
    for part in ranges:
        step = per_partition or max(part.count, 1)
        pieces.extend(replace(part, start=start, end=min(part.end, start + step))
                      for start in range(part.start, part.end, step))
    while len(pieces) < min_partitions:
        largest = max(pieces, key=weigh.size, default=None)
        if largest is None or largest.count < 2:
            break
        middle = weigh.advance(largest, largest.start, weigh.size(largest) // 2)
        middle = min(max(middle, largest.start + 1), largest.end - 1)
        index = pieces.index(largest)
        pieces[index:index + 1] = [replace(largest, end=middle),
                                   replace(largest, start=middle)]
    return pieces


def pack(pieces: Sequence[QueueRange], slots: int | None, per_partition: int,
         min_partitions: int, weights: Weights | None = None) -> list[QueueRange | QueueRanges]:
    """Join ``split``'s pieces into fewer partitions when there are more pieces than
    ``slots``: as many partitions as the slots, ``min_partitions`` and
    ``per_partition`` ask for, each the next equal share of the pieces' weight (by
    ``weights``: records, unless given) in order (a share may end inside a piece and
    the next one start there; it ends at the record that fills it), and never more than
    ``per_partition`` records. Unchanged when ``slots`` is unknown or the pieces already
    fit."""
    weigh: Any = weights or RecordWeights()
    records = sum(piece.count for piece in pieces)
    if slots is None or len(pieces) <= slots or records == 0:
        return list(pieces)
    wanted = max(slots, min_partitions, -(-records // per_partition))
    if wanted >= len(pieces):
        return list(pieces)
    share = sum(weigh.size(piece) for piece in pieces) / wanted
    packed: list[QueueRange | QueueRanges] = []
    current: list[QueueRange] = []
    taken_weight, records_room = 0, per_partition
    for piece in pieces:
        start = piece.start
        while start < piece.end:
            room = share * (len(packed) + 1) - taken_weight  # the next cut's target
            end, close = _cut(weigh, piece, start, room)
            end = min(end, start + records_room)
            taken = replace(piece, start=start, end=end)
            current.append(taken)
            taken_weight += weigh.size(taken)
            records_room -= end - start
            start = end
            if close or records_room == 0 or taken_weight >= share * (len(packed) + 1):
                packed.append(current[0] if len(current) == 1 else QueueRanges(tuple(current)))
                current, records_room = [], per_partition
    if current:
        packed.append(current[0] if len(current) == 1 else QueueRanges(tuple(current)))
    return packed


def _cut(weigh: Any, piece: QueueRange, start: int, room: float) -> tuple[int, bool]:
    """Where a partition with ``room`` left ends in ``piece`` from ``start``: at the
    record boundary nearest the room's end (so shares are even to half a record, and
    the error does not add up over partitions), and whether it ends there."""
    end = weigh.advance(piece, start, max(1, math.ceil(room)))
    over = weigh.size(replace(piece, start=start, end=end))
    if over < room:  # the piece ends first
        return end, False
    if end - 1 > start and room - weigh.size(replace(piece, start=start, end=end - 1)) \
            < over - room:
        return end - 1, True
    return end, True
