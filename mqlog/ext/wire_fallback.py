"""The pure-Python twin of mqlog's wire codec (``mqlog.ext._wire``): the specification.

A frame (docs/FORMAT.md, "Frames") is a size, a CRC32C, a msgpack header map and a raw
payload. ``encode_frame`` builds one (``encode_frame_head`` all of it but the payload, which
a sender may then write from where it lies); ``decode_frames`` cuts every whole frame out of a
buffer at once and says where the rest begins. Both twins write the same bytes (msgpack's
smallest encodings, str for text, bin for bytes) and decode to equal values; any garbage
is a RemoteProtocolError. ``mqlog.replication.wire`` holds the stream decoder that uses
them.
"""

from __future__ import annotations

import functools
import itertools
import struct
from dataclasses import dataclass, field
from typing import Any, Final

import msgpack
from crc32c import crc32c

from mqlog.errors import RemoteProtocolError

IMPLEMENTATION: Final = "python"
PREFIX_SIZE: Final = 12  # frame_size u32, crc32c u32, header_size u32
_PREFIX = struct.Struct("<III")
_SIZE = struct.Struct("<I")
_CRC_FROM = 8  # the CRC covers everything after its own field


@dataclass(frozen=True)
class Frame:
    """One decoded frame: a header map and a payload of raw bytes."""

    header: dict[str, Any]
    payload: bytes = field(default=b"", repr=False)


def packb(value: Any) -> bytes:
    """``msgpack.packb(value)`` (the C twin's is faster for the types headers use)."""
    return msgpack.packb(value, use_bin_type=True)


def split_bodies(payload: bytes, sizes: Any) -> list[bytes]:
    """The bodies of a produce request: ``payload`` cut at ``sizes``, a list of ints >= 0
    that add up to its length (RemoteProtocolError naming what is wrong otherwise). One
    body of the whole payload is the payload itself, not a copy."""
    if type(sizes) is not list or not all(type(size) is int and size >= 0 for size in sizes):
        raise RemoteProtocolError("produce sizes must be a list of non-negative ints")
    if sum(sizes) != len(payload):
        raise RemoteProtocolError(f"produce sizes add up to {sum(sizes)} bytes, its "
                                  f"payload has {len(payload)}")
    if len(sizes) == 1:
        return [payload]
    ends = itertools.accumulate(sizes)
    return [payload[end - size:end] for size, end in zip(sizes, ends, strict=True)]


def encode_frame(header: dict[str, Any], payload: Any = b"") -> bytes:
    """The bytes of one frame (docs/FORMAT.md)."""
    return encode_frame_head(header, payload) + payload


def encode_frame_head(header: dict[str, Any], payload: Any = b"") -> bytes:
    """The bytes of one frame up to its payload (its sizes and CRC count the payload):
    the head then ``payload`` is ``encode_frame(header, payload)``, without the copy."""
    packed = msgpack.packb(header, use_bin_type=True)
    head = _SIZE.pack(len(packed)) + packed
    crc = crc32c(payload, crc32c(head))
    return _SIZE.pack(len(head) + len(payload) + 4) + _SIZE.pack(crc) + head


def encode_frame_head_of(header: dict[str, Any], payload_size: int, payload_crc: int
                         ) -> bytes:
    """``encode_frame_head`` for a payload that is not in memory (log records sent from
    their file): its size and CRC32C stand for its bytes."""
    if payload_size < 0:
        raise ValueError(f"a payload of {payload_size} bytes cannot be framed")
    empty = encode_frame_head(header)
    crc = crc32c_combine(_SIZE.unpack_from(empty, 4)[0], payload_crc, payload_size)
    return _SIZE.pack(len(empty) - 4 + payload_size) + _SIZE.pack(crc) + empty[8:]


def crc32c_combine(crc_a: int, crc_b: int, size_b: int) -> int:
    """The CRC32C of A then B from crc32c(A), crc32c(B) and len(B) (zlib's
    crc32_combine; crc32c.h says why it holds)."""
    for zeros in _zero_operators():
        if not size_b:
            break
        if size_b & 1:
            crc_a = _gf2_apply(zeros, crc_a)
        size_b >>= 1
    return crc_a ^ crc_b


@functools.cache
def _zero_operators() -> tuple[tuple[int, ...], ...]:
    """Operator k moves a CRC32C register over 2**k zero bytes (column n: bit n's image)."""
    operator = (0x82F63B78, *(1 << (n - 1) for n in range(1, 32)))  # one zero bit
    for _ in range(3):  # one bit -> one byte
        operator = tuple(_gf2_apply(operator, column) for column in operator)
    operators = [operator]
    for _ in range(63):
        operator = tuple(_gf2_apply(operator, column) for column in operator)
        operators.append(operator)
    return tuple(operators)


def _gf2_apply(operator: tuple[int, ...], vector: int) -> int:
    total, n = 0, 0
    while vector:
        if vector & 1:
            total ^= operator[n]
        vector >>= 1
        n += 1
    return total


def decode_frames(buffer: Any, start: int, frame_size_bytes_max: int
                  ) -> tuple[list[Frame], int, RemoteProtocolError | None]:
    """Every whole frame in ``buffer[start:]``: (frames, where the rest begins, error).

    Decoding stops at the first incomplete frame, or at the first bad one: then
    ``error`` is the RemoteProtocolError it raises and the rest begins at it."""
    frames: list[Frame] = []
    view = memoryview(buffer)
    while len(view) - start >= 4:
        (frame_size,) = _SIZE.unpack_from(view, start)
        if not 8 <= frame_size <= frame_size_bytes_max - 4:
            return frames, start, RemoteProtocolError(
                f"frame of {frame_size + 4} bytes is outside [12, frame_size_bytes_max="
                f"{frame_size_bytes_max}]; the peer is not speaking mqlog, or sends "
                "frames larger than this node accepts")
        if len(view) - start < frame_size + 4:
            break
        try:
            frames.append(_decode_one(view[start:start + 4 + frame_size]))
        except RemoteProtocolError as error:
            return frames, start, error
        start += 4 + frame_size
    return frames, start, None


def _decode_one(data: memoryview) -> Frame:
    _size, crc, header_size = _PREFIX.unpack_from(data)
    if crc32c(data[_CRC_FROM:]) != crc:
        raise RemoteProtocolError("frame CRC32C mismatch: the connection corrupted data")
    if PREFIX_SIZE + header_size > len(data):
        raise RemoteProtocolError(f"frame header of {header_size} bytes overruns its frame")
    try:
        header = msgpack.unpackb(data[PREFIX_SIZE:PREFIX_SIZE + header_size], raw=False,
                                 ext_hook=_refuse_ext)
    except (ValueError, msgpack.UnpackException) as error:
        raise RemoteProtocolError(f"frame header is not msgpack: {error}") from None
    if type(header) is not dict:  # (msgpack's strict_map_key allows str and bytes keys)
        raise RemoteProtocolError("frame header must be a map")
    return Frame(header, bytes(data[PREFIX_SIZE + header_size:]))


def _refuse_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"type ext {code} (an ext type) is never in a header")
