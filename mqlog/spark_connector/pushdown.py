"""Filter pushdown (PySpark 4.1+): which of Spark's filters narrow the read, and how.

Spark hands ``pushFilters`` the conjuncts of a query's WHERE clause. Each one this module
understands narrows ``Bounds`` (options.py), which the planner turns into fewer queues,
shorter offset ranges or fewer segments — records never read at all. A filter is
reported back to Spark as handled only when the narrowing is exact:

* queue mode: ``topic``, ``queue_id`` and ``replica`` equal to / in a set; ``offset``
  compared with a number (=, <, <=, >, >=). Offset ``IN`` narrows to the set's span and
  stays with Spark;
* ``timestamp`` compared with a time narrows through ``offset_for_timestamp`` (rounded
  outward to whole milliseconds) and always stays with Spark, which re-checks it;
* commit-log mode: ``replica`` is exact; ``position`` bounds narrow the segments read and
  stay with Spark (a record is read when it starts inside the range).

Every other filter stays with Spark.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
)

from mqlog.spark_connector.options import Bounds

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_RANGE = (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)


def push(filters: Iterable[Filter], mode: str) -> tuple[Bounds, list[Filter]]:
    """(the narrowing, the filters Spark must still apply), in the order given."""
    bounds, residual = Bounds(), []
    for item in filters:
        bounds, exact = _narrow(bounds, item, mode)
        if not exact:
            residual.append(item)
    return bounds, residual


def _narrow(bounds: Bounds, item: Filter, mode: str) -> tuple[Bounds, bool]:
    column = getattr(item, "attribute", ("",))
    name = column[0] if len(column) == 1 else ""
    values = _values(item)
    if name == "replica" and values is not None and _all(values, str):
        return replace(bounds, replicas=_meet(bounds.replicas, values)), True
    if mode == "commitlog":
        if name == "position" and isinstance(item, _RANGE) and _number(item.value):
            return replace(bounds, position=_range(bounds.position, item, item.value)), False
        return bounds, False
    if name == "topic" and values is not None and _all(values, str):
        return replace(bounds, topics=_meet(bounds.topics, values)), True
    if name == "queue_id" and values is not None and _all(values, int):
        return replace(bounds, queue_ids=_meet(bounds.queue_ids, values)), True
    if name == "offset":
        if isinstance(item, _RANGE) and _number(item.value):
            return replace(bounds, offset=_range(bounds.offset, item, item.value)), True
        if isinstance(item, In) and item.value and _all(item.value, int):
            span = (min(item.value), max(item.value) + 1)
            return replace(bounds, offset=_intersect(bounds.offset, span)), False
    if name == "timestamp" and isinstance(item, _RANGE):
        micros = _micros(item.value)
        if micros is not None:
            return replace(bounds, timestamp_ms=_time_range(bounds.timestamp_ms, item,
                                                            micros)), False
    return bounds, False


def _values(item: Filter) -> tuple[Any, ...] | None:
    if isinstance(item, EqualTo):
        return (item.value,)
    if isinstance(item, In):
        return tuple(item.value)
    return None


def _all(values: Iterable[Any], kind: type) -> bool:
    return all(isinstance(value, kind) and not isinstance(value, bool) for value in values)


def _number(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _meet(current: frozenset | None, values: Iterable[Any]) -> frozenset:
    allowed = frozenset(values)
    return allowed if current is None else current & allowed


def _intersect(current: tuple[int | None, int | None],
               new: tuple[int | None, int | None]) -> tuple[int | None, int | None]:
    low = new[0] if current[0] is None else current[0] if new[0] is None else \
        max(current[0], new[0])
    high = new[1] if current[1] is None else current[1] if new[1] is None else \
        min(current[1], new[1])
    return low, high


def _range(current: tuple[int | None, int | None], item: Filter,
           value: int) -> tuple[int | None, int | None]:
    """Integer comparisons as a half-open [low, high)."""
    new: tuple[int | None, int | None] = {
        EqualTo: (value, value + 1), GreaterThan: (value + 1, None),
        GreaterThanOrEqual: (value, None), LessThan: (None, value),
        LessThanOrEqual: (None, value + 1)}[type(item)]
    return _intersect(current, new)


def _time_range(current: tuple[int | None, int | None], item: Filter,
                micros: int) -> tuple[int | None, int | None]:
    """Microsecond comparisons as a half-open range of whole milliseconds, rounded so
    that it holds every record the filter keeps (Spark applies the filter exactly)."""
    floor_ms = micros // 1000
    new: tuple[int | None, int | None] = {
        EqualTo: (floor_ms, floor_ms + 1), GreaterThan: (floor_ms, None),
        GreaterThanOrEqual: (floor_ms, None), LessThan: (None, floor_ms + 1),
        LessThanOrEqual: (None, floor_ms + 1)}[type(item)]
    return _intersect(current, new)


def _micros(value: Any) -> int | None:
    """A timestamp literal as microseconds since the epoch; None when it is not an aware
    datetime (a naive one's zone is unknown here, so it narrows nothing)."""
    if not isinstance(value, dt.datetime) or value.tzinfo is None:
        return None
    return (value - _EPOCH) // dt.timedelta(microseconds=1)
