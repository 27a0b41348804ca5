"""The DataFrame schema of the ``mqlog`` source, in Spark's and in Arrow's terms.

Names and types follow Spark's Kafka source where the two overlap (DESIGN §6): Kafka's
``partition`` is ``queue_id`` (int), ``value`` is ``body`` (binary), ``headers`` is
``properties``, and ``offset``/``timestamp`` keep their names and types. mqlog's keys
and tags are UTF-8 text in the record, so they are strings (Kafka's key is binary;
``CAST(key AS STRING)`` works on both). ``properties`` is a map<string,string>: string
values as they are, any other msgpack value as JSON. mqlog adds ``position``,
``epoch``, ``born_timestamp``, ``tags``, ``crc_ok``, ``lost`` and ``replica``.

``lost`` is true for a lost-record filler (``attrs & format.ATTR_FILLER``: what ``mqlog
repair`` writes at a queue offset whose record it could not save; ``Record.lost`` in the
embedded API), false for every other record, and false for a record whose CRC failed (its
attributes are not to be trusted). A filler is no message: its ``body`` is null (the
bytes it holds are padding). Every field is
nullable, as in the Kafka source; a field is null only when mqlog has no value for it
(no key, no tags, a filler's body), when Spark has none (a timestamp beyond its range:
``layout.TIMESTAMP_MS_MAX``) or, in commit-log mode, when a damaged record's field cannot
be cut out of it. A user-given schema must keep every column nullable (``projection``).

``ARROW_SCHEMA`` is the Arrow schema PySpark expects for ``SCHEMA`` (int32 and int64,
``binary`` not ``large_binary``, ``timestamp[us, tz=UTC]``); it is written out here so
that building batches does not need pyspark, and a test checks it against PySpark's
own conversion.

A column outside the default schema (``HIDDEN_COLUMNS``) is read only when a user-given
schema names it; every column costs Spark per row, so a read that does not ask for it
does not pay for it. ``user_properties`` (map<string,string>, like ``properties``) is
``properties`` without the idempotent producer's tag, decided from the record's msgpack
types as the engine decides it (``layout.user_properties``): replay to Parquet writes it
as the output's ``properties``, so both replay paths leave out the same tag and no user
property.
"""

from __future__ import annotations

import pyarrow as pa

COLUMNS = ("topic", "queue_id", "offset", "position", "epoch", "timestamp", "born_timestamp",
           "key", "tags", "properties", "body", "crc_ok", "lost", "replica")

SCHEMA_DDL = (
    "topic STRING, queue_id INT, offset BIGINT, position BIGINT, epoch BIGINT, "
    "timestamp TIMESTAMP, born_timestamp TIMESTAMP, key STRING, tags STRING, "
    "properties MAP<STRING, STRING>, body BINARY, crc_ok BOOLEAN, lost BOOLEAN, "
    "replica STRING"
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
    pa.field("lost", pa.bool_()),
    pa.field("replica", pa.string()),
])
assert tuple(ARROW_SCHEMA.names) == COLUMNS

# Read only when a user-given schema names them (see the module docstring).
HIDDEN_COLUMNS = ("user_properties",)
HIDDEN_DDL = "user_properties MAP<STRING, STRING>"
_HIDDEN_ARROW = {"user_properties": pa.field("user_properties", PROPERTIES_TYPE)}
assert tuple(_HIDDEN_ARROW) == HIDDEN_COLUMNS


def spark_schema(hidden: bool = False) -> object:
    """The schema as a pyspark StructType (imports pyspark; needs no session); with
    ``hidden``, the hidden columns after ours (a user-given schema that reads them)."""
    from pyspark.sql import types as t

    kinds = {"topic": t.StringType(), "queue_id": t.IntegerType(), "offset": t.LongType(),
             "position": t.LongType(), "epoch": t.LongType(), "timestamp": t.TimestampType(),
             "born_timestamp": t.TimestampType(), "key": t.StringType(),
             "tags": t.StringType(), "properties": t.MapType(t.StringType(), t.StringType()),
             "body": t.BinaryType(), "crc_ok": t.BooleanType(),
             "lost": t.BooleanType(), "replica": t.StringType(),
             "user_properties": t.MapType(t.StringType(), t.StringType())}
    names = (*COLUMNS, *HIDDEN_COLUMNS) if hidden else COLUMNS
    return t.StructType([t.StructField(name, kinds[name], True) for name in names])


def projection(requested: object) -> pa.Schema:
    """The Arrow schema of a user-given schema that picks (and may reorder) columns of
    ours with our types — the way to read fewer columns (PySpark's Python data sources
    get no column pruning): ``.schema("offset BIGINT, body BINARY")``.

    Refused (``InvalidArgument``): a column we do not have, or not with that type; a
    column named twice (Spark would fail deep in the JVM); and a column declared NOT
    NULL. Every column of ours is nullable, and Spark believes a NOT NULL: it answers
    ``key IS NULL`` from the schema (false) instead of from the rows, so counts come out
    wrong, and a null then breaks the read."""
    from mqlog.errors import InvalidArgument

    ours = {field.name: field
            for field in spark_schema(hidden=True).fields}  # type: ignore[attr-defined]
    fields = []
    seen: set[str] = set()
    for field in requested.fields:  # type: ignore[attr-defined]
        mine = ours.get(field.name)
        if mine is None or mine.dataType != field.dataType:
            kind = mine.dataType.simpleString() if mine is not None else None
            raise InvalidArgument(
                f"the mqlog source has no column {field.name} "
                f"{field.dataType.simpleString()}"
                + (f" (its {field.name} is {kind}, nullable, map values too)" if kind else "")
                + f"; its schema is {SCHEMA_DDL} (and, named in a schema, {HIDDEN_DDL})")
        if field.name in seen:
            raise InvalidArgument(
                f"the schema given to the mqlog source names column {field.name} twice; "
                "name each column once (select it twice afterwards if need be)")
        if not field.nullable:
            raise InvalidArgument(
                f"the schema given to the mqlog source declares {field.name} NOT NULL, but "
                "every column of the source is nullable (a record may have no key or "
                f"tags; a damaged record's fields are null): declare it as {field.name} "
                f"{field.dataType.simpleString().upper()}, without NOT NULL, and filter "
                "out the nulls in the query if need be")
        seen.add(field.name)
        fields.append(pa.field(field.name, _arrow_field(field.name).type, nullable=True))
    return pa.schema(fields)


def arrow_schema(columns: tuple[str, ...] | None) -> pa.Schema:
    """The Arrow schema of the named columns of ours (None: all but the hidden ones), in
    that order."""
    if columns is None:
        return ARROW_SCHEMA
    return pa.schema([_arrow_field(name) for name in columns])


def _arrow_field(name: str) -> pa.Field:
    """The Arrow field of a column of ours, hidden ones included."""
    hidden = _HIDDEN_ARROW.get(name)
    return hidden if hidden is not None else ARROW_SCHEMA.field(name)
