"""Records to Arrow columns in bulk: numpy over the record layout, Arrow over the bytes.

Theory of operation. A reader hands this module one ``bytes`` object holding whole
records as they lie in the commit log (docs/FORMAT.md) and the start of each record in
it. Nothing here loops over records in Python:

1. The 72-byte headers are gathered into one contiguous array with a single Arrow
   ``take`` (see ``slice_binary``) and viewed through a numpy structured dtype, so every
   header field becomes a numpy column at once.
2. The variable fields (topic, key, tags, properties, body) are spans of the buffer whose
   bounds follow from the header sizes by vector arithmetic. ``slice_binary`` turns spans
   into an Arrow binary column: it describes the buffer as an Arrow array whose elements
   alternate between "bytes to skip" and "a wanted span" (offsets ``0, lo0, hi0, lo1,
   hi1, ...`` are monotonic because spans never overlap), without copying, then takes
   the odd elements, which copies each wanted span once, in C.
3. Properties (a msgpack map per record) are decoded in Python only for the records that
   have any; most records have none, and then the column is a run of empty maps.

The result matches Spark's Arrow form of ``schema.SCHEMA`` exactly (int32/int64,
``binary`` not ``large_binary``, ``timestamp[us, tz=UTC]``, every field nullable), which
PySpark 4.2+ checks batch by batch.
"""

from __future__ import annotations

import json
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mqlog.spark_connector.schema import ARROW_SCHEMA, PROPERTIES_TYPE

HEADER_SIZE = 72
RECORD_MAGIC = b"MQR\x01"
BLANK_MAGIC = b"MQB\x01"

# The record header of docs/FORMAT.md, field by field.
HEADER = np.dtype([
    ("total_size", "<u4"), ("magic", "<u4"), ("crc", "<u4"), ("attrs", "<u2"),
    ("topic_size", "<u2"), ("queue_id", "<u4"), ("body_size", "<u4"), ("epoch", "<u8"),
    ("offset", "<u8"), ("position", "<u8"), ("born_timestamp", "<i8"),
    ("store_timestamp", "<i8"), ("key_size", "<u2"), ("tags_size", "<u2"),
    ("properties_size", "<u4"),
])
assert HEADER.itemsize == HEADER_SIZE

# A consume-queue entry (docs/FORMAT.md): position u64, size u32, tag hash u64.
CQ_ENTRY = np.dtype([("position", "<u8"), ("size", "<u4"), ("tag_hash", "<u8")])
assert CQ_ENTRY.itemsize == 20

_MAGIC_U32 = int.from_bytes(RECORD_MAGIC, "little")


def slice_binary(data: pa.Buffer, lo: np.ndarray, hi: np.ndarray) -> pa.BinaryArray:
    """The spans ``data[lo[i]:hi[i]]`` as one Arrow binary column (spans must be ascending
    and disjoint: ``hi[i] <= lo[i + 1]``)."""
    count = len(lo)
    if count == 0:
        return pa.array([], pa.binary())
    offsets = np.empty(2 * count + 1, np.int32)
    offsets[0] = 0
    offsets[1::2] = lo
    offsets[2::2] = hi
    interleaved = pa.Array.from_buffers(pa.binary(), 2 * count,
                                        [None, pa.py_buffer(offsets), data])
    return pc.take(interleaved, pa.array(np.arange(1, 2 * count, 2, dtype=np.int64)))


def headers(data: pa.Buffer, starts: np.ndarray) -> np.ndarray:
    """The headers of the records starting at ``starts`` as a structured array."""
    gathered = slice_binary(data, starts, starts + HEADER_SIZE)
    raw = gathered.buffers()[2]
    assert raw is not None and raw.size >= HEADER_SIZE * len(starts)
    return np.frombuffer(raw, HEADER, count=len(starts))


def _with_validity(column: pa.Array, valid: np.ndarray | None, kind: pa.DataType) -> pa.Array:
    """``column`` reinterpreted as ``kind`` with nulls where ``valid`` is False."""
    buffers = column.buffers()
    bitmap = None
    if valid is not None and not valid.all():
        bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(kind, len(column), [bitmap, *buffers[1:]])


def _timestamps(millis: np.ndarray) -> pa.Array:
    micros = np.ascontiguousarray(millis, dtype=np.int64) * 1000
    return pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), len(micros),
                                 [None, pa.py_buffer(micros)])


def _property_text(value: Any) -> str:
    """A property value as text: str as it is, anything else as JSON (bytes as UTF-8
    where possible, else hex) — Spark's map<string,string> cannot hold mixed types."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), sort_keys=True, default=_json_default)


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            return bytes(value).hex()
    return repr(value)


def properties_column(packed: pa.BinaryArray, sizes: np.ndarray) -> pa.Array:
    """map<string,string> from msgpack maps; rows whose size is 0 get an empty map."""
    count = len(sizes)
    offsets = np.zeros(count + 1, np.int32)
    keys: list[str] = []
    values: list[str] = []
    rows = np.flatnonzero(sizes)
    if len(rows):
        lengths = np.zeros(count, np.int32)
        for row, blob in zip(rows.tolist(), packed.take(pa.array(rows)).to_pylist(),
                             strict=True):
            try:
                mapping = msgpack.unpackb(blob, raw=False)
            except (ValueError, msgpack.ExtraData, msgpack.FormatError):
                mapping = None  # only a record whose CRC failed can get here
            if isinstance(mapping, dict):
                keys.extend(str(key) for key in mapping)
                values.extend(_property_text(value) for value in mapping.values())
                lengths[row] = len(mapping)
        np.cumsum(lengths, out=offsets[1:])
    return pa.MapArray.from_arrays(pa.array(offsets), pa.array(keys, pa.string()),
                                   pa.array(values, pa.string()), type=PROPERTIES_TYPE)


_SPAN_FIELDS = ("topic_size", "key_size", "tags_size", "properties_size", "body_size")
_SPAN_OF = {"topic": 0, "key": 1, "tags": 2, "properties": 3, "body": 4}


def build_batch(buffer: bytes, starts: np.ndarray, replica: str,
                crc_ok: np.ndarray | None = None, head: np.ndarray | None = None,
                schema: pa.Schema = ARROW_SCHEMA) -> pa.RecordBatch:
    """One record batch of the records starting at ``starts`` (ascending) in ``buffer``.

    ``crc_ok`` (commit-log mode) marks records whose CRC failed; a field whose span does
    not fit such a record's size is null rather than garbage. ``head`` is
    ``headers(buffer, starts)`` if the caller has it; ``schema`` (a projection of
    ``ARROW_SCHEMA``) says which columns to build, in which order.
    """
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    data = pa.py_buffer(buffer)
    if head is None:
        head = headers(data, starts)
    bounds = np.empty((6, len(starts)), np.int64)
    bounds[0] = starts + HEADER_SIZE
    for row, field in enumerate(_SPAN_FIELDS, start=1):
        bounds[row] = bounds[row - 1] + head[field]
    fits = (bounds[5] - starts == head["total_size"]) & (bounds[5] <= len(buffer))
    if not fits.all():
        bounds[:, ~fits] = starts[~fits]  # empty spans: the record is garbage past its header
    columns = [_column(name, data, head, bounds, fits, crc_ok, replica)
               for name in schema.names]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _column(name: str, data: pa.Buffer, head: np.ndarray, bounds: np.ndarray,
            fits: np.ndarray, crc_ok: np.ndarray | None, replica: str) -> pa.Array:
    count = len(head)
    if name in _SPAN_OF:
        index = _SPAN_OF[name]
        sizes = head[_SPAN_FIELDS[index]]
        if name in ("key", "tags") and not sizes.any():
            return pa.nulls(count, pa.string())
        if name == "properties":
            if not sizes.any():
                return pa.MapArray.from_arrays(pa.array(np.zeros(count + 1, np.int32)),
                                               pa.array([], pa.string()),
                                               pa.array([], pa.string()),
                                               type=PROPERTIES_TYPE)
            span = slice_binary(data, bounds[index], bounds[index + 1])
            return properties_column(span, np.where(fits, sizes, 0))
        span = slice_binary(data, bounds[index], bounds[index + 1])
        valid = fits & (sizes > 0) if name in ("key", "tags") else fits
        return _with_validity(span, valid, pa.binary() if name == "body" else pa.string())
    if name in ("timestamp", "born_timestamp"):
        return _timestamps(head["store_timestamp" if name == "timestamp" else name])
    if name == "crc_ok":
        return pa.array(np.ones(count, bool) if crc_ok is None else crc_ok.astype(bool))
    if name == "replica":
        return pa.repeat(pa.scalar(replica, pa.string()), count)
    kind = np.int32 if name == "queue_id" else np.int64
    return pa.array(head[name].astype(kind))


def empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], field.type) for field in ARROW_SCHEMA],
                                      schema=ARROW_SCHEMA)


def magic_ok(head: np.ndarray) -> np.ndarray:
    """Which headers carry the record magic."""
    return head["magic"] == _MAGIC_U32
