"""Records to Arrow columns in bulk: numpy over the record layout, Arrow over the bytes.

Theory of operation. A reader hands this module whole records as they lie in the
commit log (docs/FORMAT.md), in one of two forms; nothing here loops over records in
Python.

* One ``bytes`` buffer and the start of each record in it (``headers``,
  ``build_batch``). The 72-byte headers are gathered into one contiguous array with a
  single Arrow ``take`` (see ``slice_binary``) and viewed through a numpy structured
  dtype. The variable fields (topic, key, tags, properties, body) are spans of the
  buffer whose bounds follow from the header sizes by vector arithmetic.
  ``slice_binary`` turns spans into an Arrow binary column: it describes the buffer as
  an Arrow array whose elements alternate between "bytes to skip" and "a wanted span"
  (offsets ``0, lo0, hi0, lo1, hi1, ...`` are monotonic because spans never overlap),
  without copying, then takes the odd elements, which copies each wanted span once, in C.
* Matrices whose rows are records of one size, back to back (``row_headers``,
  ``build_row_batch``: fixed-size messages, as the reader learns from the consume queue
  before reading). The headers are a structured view of the rows, with no copy; when
  every record's field sizes are the same as well, every field is at the same column
  of every row, and each is cut with one strided numpy copy per matrix: no gather, and
  the pieces read are never joined into one buffer.

Then, in both forms:

1. Header fields are split out of the structured headers once (``Fields``), block by
   block so that each record's header is fetched from memory once, not once per field.
2. Properties (a msgpack map per record) are decoded in Python only for the records that
   have any; most records have none, and then the column is a run of empty maps. The
   hidden ``user_properties`` column (schema.py) is the same maps without the idempotent
   producer's tag, which ``producer_tagged`` tells from the decoded msgpack types.
3. Columns whose every row is the same (the replica; the topic when the caller has
   checked it; all-null keys or tags; all-empty properties; an all-true ``crc_ok``; an
   all-false ``lost``, when no record is a lost-record filler) are
   built once per value and length and shared by the batches that follow: Arrow arrays
   are immutable, and rebuilding them took a fifth of a batch's building time.

The result matches Spark's Arrow form of ``schema.SCHEMA`` exactly (int32/int64,
``binary`` not ``large_binary``, ``timestamp[us, tz=UTC]``, every field nullable), which
PySpark 4.2+ checks batch by batch.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mqlog.format import ATTR_FILLER
from mqlog.replication.idempotence import tag_of
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
    and disjoint: ``hi[i] <= lo[i + 1]``). The interleaved array's offsets are int32
    while the spans end within 2 GiB of ``data``'s start, else int64 (``large_binary``,
    then cast back: the spans themselves must add up to less than 2 GiB, as a reader's
    chunk does; ``ArrowInvalid`` says so otherwise, rather than wrapped offsets)."""
    count = len(lo)
    if count == 0:
        return pa.array([], pa.binary())
    large = int(hi[-1]) > _INT32_MAX
    offsets = np.empty(2 * count + 1, np.int64 if large else np.int32)
    offsets[0] = 0
    offsets[1::2] = lo
    offsets[2::2] = hi
    interleaved = pa.Array.from_buffers(pa.large_binary() if large else pa.binary(),
                                        2 * count, [None, pa.py_buffer(offsets), data])
    taken = pc.take(interleaved, pa.array(np.arange(1, 2 * count, 2, dtype=np.int64)))
    return taken.cast(pa.binary()) if large else taken


_INT32_MAX = (1 << 31) - 1


def headers(data: pa.Buffer, starts: np.ndarray, tail: int = 0) -> np.ndarray:
    """The headers of the records starting at ``starts`` as a structured array.

    With ``tail``, each row also holds the ``tail`` bytes that follow its header (field
    ``tail``, numpy ``S<tail>``): a reader that knows the topic's length gets every
    record's topic in the same gather. (``S`` comparison ignores trailing NULs, which is
    exact between two values of the same length, and is several times faster than
    comparing a uint8 subarray.) The spans ``[start, start + HEADER_SIZE + tail)`` must be
    ascending and disjoint, as for ``slice_binary``.
    """
    dtype = _with_tail(tail)
    gathered = slice_binary(data, starts, starts + dtype.itemsize)
    raw = gathered.buffers()[2]
    assert raw is not None and raw.size >= dtype.itemsize * len(starts)
    return np.frombuffer(raw, dtype, count=len(starts))


class Fields:
    """Header fields as contiguous arrays, read out of the structured headers (one array,
    or several in order) on first use, all at once (see ``_split_fields``): the checks
    and the columns need nearly every field, most of them twice."""

    def __init__(self, head: np.ndarray | list[np.ndarray]) -> None:
        self.parts = head if isinstance(head, list) else [head]
        self.count = sum(len(part) for part in self.parts)
        self.names: tuple[str, ...] = self.parts[0].dtype.names or ()
        self._read: dict[str, np.ndarray] | None = None

    def __getitem__(self, name: str) -> np.ndarray:
        if self._read is None:
            wanted = [field for field in self.names if field not in _UNUSED_FIELDS]
            self._read = _split_fields(self.parts, wanted)
        return self._read[name]


_UNUSED_FIELDS = ("crc",)  # read_raw checked the CRC (attrs: the ``lost`` column)
_BLOCK_ROWS = 4096  # records of a block: ~0.7 MB of 180-byte records, well within L2


def _split_fields(parts: list[np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    """The named fields of structured arrays as contiguous arrays, copied block by block:
    a block's records come from memory once and stay in cache while each field is
    copied out of them. (Field by field over a whole chunk, every field would fetch a
    cache line per record again: twice the time.)"""
    out = {name: np.empty(sum(len(part) for part in parts), parts[0].dtype[name])
           for name in names}
    at = 0
    for part in parts:
        for low in range(0, len(part), _BLOCK_ROWS):
            block = part[low:low + _BLOCK_ROWS]
            for name in names:
                out[name][at:at + len(block)] = block[name]
            at += len(block)
    return out


def _fields(head: np.ndarray | Fields) -> Fields:
    return head if isinstance(head, Fields) else Fields(head)


@functools.lru_cache(maxsize=8)
def _with_tail(tail: int, itemsize: int = 0) -> np.dtype:
    """HEADER, plus the ``tail`` bytes after it as field ``tail``; with ``itemsize``, the
    same fields in items of that many bytes: a view over whole records."""
    if itemsize:
        packed = _with_tail(tail)
        fields: Any = packed.fields
        spec: Any = {"names": list(fields), "itemsize": itemsize,
                     "formats": [fields[name][0] for name in fields],
                     "offsets": [fields[name][1] for name in fields]}
        return np.dtype(spec)
    if not tail:
        return HEADER
    return np.dtype(HEADER.descr + [("tail", f"S{tail}")])


def _with_validity(column: pa.Array, valid: np.ndarray | None, kind: pa.DataType) -> pa.Array:
    """``column`` reinterpreted as ``kind`` with nulls where ``valid`` is False."""
    buffers = column.buffers()
    bitmap = None
    if valid is not None and not valid.all():
        bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(kind, len(column), [bitmap, *buffers[1:]])


# Spark's timestamps are int64 microseconds: a record's milliseconds beyond this many
# (either way: about 292,000 years from 1970) have no timestamp value in Spark.
TIMESTAMP_MS_MAX = ((1 << 63) - 1) // 1000


def _timestamps(millis: np.ndarray) -> pa.Array:
    """Milliseconds (int64) as a timestamp[us] column; null where a value is beyond
    ``TIMESTAMP_MS_MAX`` either way (its microseconds would wrap around int64 into
    another, wrong, time: a producer may set any born timestamp; see docs/SPARK.md)."""
    micros = np.multiply(millis, 1000, dtype=np.int64)  # a new array: ``millis`` is shared
    bitmap = None
    if len(millis) and (int(millis.min()) < -TIMESTAMP_MS_MAX or
                        int(millis.max()) > TIMESTAMP_MS_MAX):
        valid = (millis >= -TIMESTAMP_MS_MAX) & (millis <= TIMESTAMP_MS_MAX)
        micros[~valid] = 0
        bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), len(micros),
                                 [bitmap, pa.py_buffer(micros)])


@functools.lru_cache(maxsize=6)  # a partition's replica, topic and null, at two lengths
def repeated(text: str | None, count: int) -> pa.Array:
    """``count`` rows of ``text`` (None: of null) as a string column, shared (cached)."""
    if text is None:
        return pa.nulls(count, pa.string())
    return pa.repeat(pa.scalar(text, pa.string()), count)


@functools.lru_cache(maxsize=4)
def _empty_maps(count: int) -> pa.Array:
    return pa.MapArray.from_arrays(pa.array(np.zeros(count + 1, np.int32)),
                                   pa.array([], pa.string()), pa.array([], pa.string()),
                                   type=PROPERTIES_TYPE)


@functools.lru_cache(maxsize=4)
def _all_true(count: int) -> pa.Array:
    return pa.array(np.ones(count, bool))


@functools.lru_cache(maxsize=4)
def _all_false(count: int) -> pa.Array:
    return pa.array(np.zeros(count, bool))


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


# The idempotent producer's tag: the properties a replicated group's producer stores with
# each record of an idempotent request (mqlog/replication/idempotence.py, docs/FORMAT.md).
PRODUCER_TAG_PROPERTIES = ("producer_id", "sequence", "producer_epoch")


def producer_tagged(properties: dict) -> bool:
    """Whether decoded msgpack ``properties`` carry the idempotent producer's tag, by the
    engine's own rule (``idempotence.tag_of``, which a leader rebuilds its table with):
    by the values' types, never by their text."""
    return tag_of(properties) is not None


def user_properties(properties: dict) -> dict:
    """``properties`` without the idempotent producer's tag (``producer_tagged``): its
    ``producer_id``, ``sequence`` and ``producer_epoch`` when they are one; otherwise
    ``properties`` itself, whatever the names in it. Both replay paths use this."""
    if producer_tagged(properties):
        return {key: value for key, value in properties.items()
                if key not in PRODUCER_TAG_PROPERTIES}
    return properties


def properties_column(packed: pa.BinaryArray, sizes: np.ndarray,
                      user: bool = False) -> pa.Array:
    """map<string,string> from msgpack maps; rows whose size is 0 get an empty map. With
    ``user``, each map without the producer's tag (``user_properties``)."""
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
                if user:
                    mapping = user_properties(mapping)
                keys.extend(str(key) for key in mapping)
                values.extend(_property_text(value) for value in mapping.values())
                lengths[row] = len(mapping)
        np.cumsum(lengths, out=offsets[1:])
    return pa.MapArray.from_arrays(pa.array(offsets), pa.array(keys, pa.string()),
                                   pa.array(values, pa.string()), type=PROPERTIES_TYPE)


_SPAN_FIELDS = ("topic_size", "key_size", "tags_size", "properties_size", "body_size")
_SPAN_OF = {"topic": 0, "key": 1, "tags": 2, "properties": 3, "body": 4,
            "user_properties": 3}  # (hidden: properties without the producer's tag)


@dataclass
class _Cut:
    """What a batch's columns are cut from: the headers, which records their sizes fit,
    the constants; ``span``/``sizes`` say where the variable fields are."""

    head: Fields
    fits: np.ndarray
    crc_ok: np.ndarray | None
    replica: str
    topic: str | None

    def sizes(self, index: int) -> np.ndarray:
        """Span field ``index``'s sizes, 0 where the record does not fit."""
        raise NotImplementedError

    @functools.cached_property
    def lost(self) -> np.ndarray | None:
        """Which records are lost-record fillers (``ATTR_FILLER``; not where the CRC
        failed: such a record's attributes are not to be trusted); None when none is."""
        lost = (self.head["attrs"] & ATTR_FILLER) != 0
        if self.crc_ok is not None:
            lost &= self.crc_ok.astype(bool)
        return lost if lost.any() else None

    def span(self, index: int) -> pa.BinaryArray:
        """Span field ``index`` of every record as a binary column."""
        raise NotImplementedError


@dataclass
class _BufferCut(_Cut):
    """Fields cut out of one buffer by ``bounds`` (row ``i``: where span field ``i``
    starts; row 5: the record's end)."""

    data: pa.Buffer
    bounds: np.ndarray

    def sizes(self, index: int) -> np.ndarray:
        # from the bounds, not the header: 0 where the record does not fit
        return self.bounds[index + 1] - self.bounds[index]

    def span(self, index: int) -> pa.BinaryArray:
        return slice_binary(self.data, self.bounds[index], self.bounds[index + 1])


@dataclass
class _RowsCut(_Cut):
    """Fields at the same place in every record: records are the rows of ``rows``'
    matrices, and ``lengths`` are the span fields' sizes, the same in every record."""

    rows: list[np.ndarray]
    lengths: tuple[int, ...]

    def sizes(self, index: int) -> np.ndarray:
        return np.full(self.head.count, self.lengths[index], np.int64)

    def span(self, index: int) -> pa.BinaryArray:
        length, count = self.lengths[index], self.head.count
        data = _copy_columns(self.rows, HEADER_SIZE + sum(self.lengths[:index]), length)
        offsets = (np.arange(count + 1, dtype=np.int64) * length).astype(np.int32)
        return pa.Array.from_buffers(pa.binary(), count,
                                     [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _copy_columns(rows: list[np.ndarray], start: int, width: int) -> np.ndarray:
    """Bytes ``[start, start + width)`` of every row, rows after rows, as one (rows,
    width) array: one strided numpy copy per matrix, no per-record work."""
    out = np.empty((sum(len(matrix) for matrix in rows), width), np.uint8)
    at = 0
    for matrix in rows:
        out[at:at + len(matrix)] = matrix[:, start:start + width]
        at += len(matrix)
    return out


def row_headers(rows: list[np.ndarray], tail: int = 0) -> Fields | None:
    """The header fields (see ``headers``) of records given as the rows of uint8 matrices
    (one matrix per piece of back-to-back records of one size): each matrix viewed as
    an array of structured records, no copy and no gather. None when the rows are too
    short to hold a header and ``tail`` bytes."""
    size = rows[0].shape[1]
    if size < _with_tail(tail).itemsize:
        return None
    dtype = _with_tail(tail, size)
    return Fields([matrix.view(dtype).reshape(-1) for matrix in rows])


def build_batch(buffer: bytes | memoryview, starts: np.ndarray, replica: str,
                crc_ok: np.ndarray | None = None, head: np.ndarray | Fields | None = None,
                schema: pa.Schema = ARROW_SCHEMA, topic: str | None = None) -> pa.RecordBatch:
    """One record batch of the records starting at ``starts`` (ascending) in ``buffer``.

    ``crc_ok`` (commit-log mode) marks records whose CRC failed; a field whose span does
    not fit such a record's size is null rather than garbage. ``head`` is
    ``headers(buffer, starts)`` (or its ``Fields``) if the caller has it; ``schema`` (a
    projection of ``ARROW_SCHEMA``) says which columns to build, in which order.
    ``topic``: every record's topic, when the caller has checked that (queue mode); the
    column is then a constant rather than a copy of each record's bytes.
    """
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    data = pa.py_buffer(buffer)
    fields = _fields(headers(data, starts) if head is None else head)
    bounds = np.empty((6, len(starts)), np.int64)
    np.add(starts, HEADER_SIZE, out=bounds[0])
    for row, field in enumerate(_SPAN_FIELDS, start=1):
        np.add(bounds[row - 1], fields[field], out=bounds[row])  # no temporaries
    fits = (bounds[5] - starts == fields["total_size"]) & (bounds[5] <= len(buffer))
    if not fits.all():
        bounds[:, ~fits] = starts[~fits]  # empty spans: the record is garbage past its header
        topic = None
    cut = _BufferCut(fields, fits, crc_ok, replica, topic, data, bounds)
    return pa.RecordBatch.from_arrays([_column(name, cut) for name in schema.names],
                                      schema=schema)


def build_row_batch(rows: list[np.ndarray], head: np.ndarray | Fields, replica: str,
                    schema: pa.Schema = ARROW_SCHEMA,
                    topic: str | None = None) -> pa.RecordBatch | None:
    """``build_batch`` for records given as matrix rows (see ``row_headers``), whose
    ``head`` the caller has; None unless every record has the same field sizes, adding
    up to the row's size (then every field sits at the same place in every row, and
    each column is one strided copy)."""
    fields = _fields(head)
    lengths = _fixed_lengths(fields, rows[0].shape[1])
    if lengths is None:
        return None
    fits = np.ones(fields.count, bool)
    cut = _RowsCut(fields, fits, None, replica, topic, rows, lengths)
    return pa.RecordBatch.from_arrays([_column(name, cut) for name in schema.names],
                                      schema=schema)


def _fixed_lengths(head: Fields, size: int) -> tuple[int, ...] | None:
    """The span fields' sizes if they are the same in every record and fill ``size``."""
    lengths = tuple(int(head[field][0]) for field in _SPAN_FIELDS)
    if HEADER_SIZE + sum(lengths) != size or (head["total_size"] != size).any():
        return None
    for field, length in zip(_SPAN_FIELDS, lengths, strict=True):
        if (head[field] != length).any():
            return None
    return lengths


def _column(name: str, cut: _Cut) -> pa.Array:
    count = cut.head.count
    if name in _SPAN_OF:
        return _span_column(name, cut)
    if name in ("timestamp", "born_timestamp"):
        return _timestamps(cut.head["store_timestamp" if name == "timestamp" else name])
    if name == "crc_ok":
        return _all_true(count) if cut.crc_ok is None else pa.array(cut.crc_ok.astype(bool))
    if name == "lost":
        return _all_false(count) if cut.lost is None else pa.array(cut.lost)
    if name == "replica":
        return repeated(cut.replica, count)
    # a view, not a cast: same-size integers, and the same wrap-around as astype
    return pa.array(cut.head[name].view(np.int32 if name == "queue_id" else np.int64))


def _span_column(name: str, cut: _Cut) -> pa.Array:
    """topic, key, tags, properties (or user_properties) or body: cut out of the records
    unless constant."""
    count, index = cut.head.count, _SPAN_OF[name]
    if name == "topic" and cut.topic is not None:
        return repeated(cut.topic, count)
    sizes = cut.sizes(index)
    maps = name in ("properties", "user_properties")
    if (maps or name in ("key", "tags")) and not sizes.any():
        return _empty_maps(count) if maps else repeated(None, count)
    if maps:
        return properties_column(cut.span(index), sizes, user=name == "user_properties")
    valid = cut.fits & (sizes > 0) if name in ("key", "tags") else cut.fits
    if name == "body" and cut.lost is not None:
        valid = valid & ~cut.lost  # a filler has no body: its bytes are padding
    return _with_validity(cut.span(index), valid,
                          pa.binary() if name == "body" else pa.string())


def empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], field.type) for field in ARROW_SCHEMA],
                                      schema=ARROW_SCHEMA)


def magic_ok(head: np.ndarray | Fields) -> np.ndarray:
    """Which headers carry the record magic."""
    return head["magic"] == _MAGIC_U32
