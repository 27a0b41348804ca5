"""The DataFrame schema of the ``mqlog`` source, in Spark's and in Arrow's terms.

Names and types follow Spark's Kafka source where the two overlap (DESIGN §6): Kafka's
``partition`` is ``queue_id`` (int), ``value`` is ``body`` (binary), ``headers`` is
``properties``, and ``offset``/``timestamp`` keep their names and types. mqlog's keys
and tags are UTF-8 text in the record, so they are strings (Kafka's key is binary;
``CAST(key AS STRING)`` works on both). ``properties`` is a map<string,string>: string
values as they are, any other msgpack value as JSON. mqlog adds ``position``,
``epoch``, ``born_timestamp``, ``tags``, ``crc_ok`` and ``replica``. Every field is
nullable, as in the Kafka source; a field is null only when mqlog has no value for it
(no key, no tags) or, in commit-log mode, when a damaged record's field cannot be cut
out of it.

``ARROW_SCHEMA`` is the Arrow schema PySpark expects for ``SCHEMA`` (int32 and int64,
``binary`` not ``large_binary``, ``timestamp[us, tz=UTC]``); it is written out here so
that building batches does not need pyspark, and a test checks it against PySpark's
own conversion.
"""

from __future__ import annotations

import pyarrow as pa

COLUMNS = ("topic", "queue_id", "offset", "position", "epoch", "timestamp", "born_timestamp",
           "key", "tags", "properties", "body", "crc_ok", "replica")

SCHEMA_DDL = (
    "topic STRING, queue_id INT, offset BIGINT, position BIGINT, epoch BIGINT, "
    "timestamp TIMESTAMP, born_timestamp TIMESTAMP, key STRING, tags STRING, "
    "properties MAP<STRING, STRING>, body BINARY, crc_ok BOOLEAN, replica STRING"
)

PROPERTIES_TYPE = pa.map_(pa.field("key", pa.string(), nullable=False),
                          pa.field("value", pa.string(), nullable=True))

ARROW_SCHEMA = pa.schema([
    pa.field("topic", pa.string()),
    pa.field("queue_id", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("position", pa.int64()),
    pa.field("epoch", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("born_timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("key", pa.string()),
    pa.field("tags", pa.string()),
    pa.field("properties", PROPERTIES_TYPE),
    pa.field("body", pa.binary()),
    pa.field("crc_ok", pa.bool_()),
    pa.field("replica", pa.string()),
])
assert tuple(ARROW_SCHEMA.names) == COLUMNS


def spark_schema() -> object:
    """The schema as a pyspark StructType (imports pyspark; needs no session)."""
    from pyspark.sql import types as t

    kinds = {"topic": t.StringType(), "queue_id": t.IntegerType(), "offset": t.LongType(),
             "position": t.LongType(), "epoch": t.LongType(), "timestamp": t.TimestampType(),
             "born_timestamp": t.TimestampType(), "key": t.StringType(),
             "tags": t.StringType(), "properties": t.MapType(t.StringType(), t.StringType()),
             "body": t.BinaryType(), "crc_ok": t.BooleanType(), "replica": t.StringType()}
    return t.StructType([t.StructField(name, kinds[name], True) for name in COLUMNS])


def projection(requested: object) -> pa.Schema:
    """The Arrow schema of a user-given schema that picks (and may reorder) columns of
    ours with our types — the way to read fewer columns (PySpark's Python data sources
    get no column pruning): ``.schema("offset BIGINT, body BINARY")``."""
    from mqlog.errors import InvalidArgument

    ours = {field.name: field for field in spark_schema().fields}  # type: ignore[attr-defined]
    fields = []
    for field in requested.fields:  # type: ignore[attr-defined]
        mine = ours.get(field.name)
        if mine is None or mine.dataType != field.dataType:
            raise InvalidArgument(
                f"the mqlog source has no column {field.name} "
                f"{field.dataType.simpleString()}; its schema is {SCHEMA_DDL}")
        fields.append(pa.field(field.name, ARROW_SCHEMA.field(field.name).type,
                               nullable=field.nullable))
    return pa.schema(fields)


def arrow_schema(columns: tuple[str, ...] | None) -> pa.Schema:
    """The Arrow schema of the named columns of ours (None: all), in that order."""
    if columns is None:
        return ARROW_SCHEMA
    return pa.schema([ARROW_SCHEMA.field(name) for name in columns])
