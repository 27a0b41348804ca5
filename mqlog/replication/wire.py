"""The wire: length-prefixed, CRC32C-checked frames with a msgpack header and a raw payload.

Every replication message and every client request travels as one frame::

    0               4               8               12
    +---------------+---------------+---------------+-------------------+-----------+
    | frame_size u32| crc32c u32    | header_size   | header (msgpack   | payload   |
    | bytes after   | of bytes      | u32           | map, str keys)    | raw bytes |
    | this field    | [8, end)      |               |                   |           |
    +---------------+---------------+---------------+-------------------+-----------+

Log bytes travel in the payload exactly as they lie on disk, so a follower appends them
verbatim and checks each record's own CRC as well. The header is small and structured: a
map (str keys; a bytes key is never looked up, so it is as good as absent).

The decoder is sans-IO (h11's shape): ``feed(data)`` takes whatever the socket gave,
``next_frame()`` returns a ``Frame`` or ``NEED_DATA``. It never buffers a frame larger
than ``frame_size_bytes_max`` (the size field is checked before the body arrives), and a
bad CRC, size or header raises ``RemoteProtocolError``: the connection must be dropped.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Final

import msgpack
from crc32c import crc32c

from mqlog.errors import RemoteProtocolError

_PREFIX = struct.Struct("<III")  # frame_size, crc32c, header_size
_SIZE = struct.Struct("<I")
PREFIX_SIZE: Final = _PREFIX.size
_CRC_FROM = 8  # the CRC covers everything after its own field


class _NeedData:
    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = _NeedData()


@dataclass(frozen=True)
class Frame:
    """One decoded frame: a header map and a payload of raw bytes."""

    header: dict[str, Any]
    payload: bytes = field(default=b"", repr=False)


def encode_frame(header: dict[str, Any], payload: bytes = b"") -> bytes:
    """The bytes of one frame."""
    packed = msgpack.packb(header, use_bin_type=True)
    body = struct.pack("<I", len(packed)) + packed + payload
    return struct.pack("<II", len(body) + 4, crc32c(body)) + body


class FrameDecoder:
    """Turns a byte stream into frames; see the module docstring."""

    def __init__(self, frame_size_bytes_max: int) -> None:
        assert frame_size_bytes_max >= PREFIX_SIZE
        self.frame_size_bytes_max = frame_size_bytes_max
        self._buffer = bytearray()
        self._start = 0  # where the next frame begins in _buffer

    def feed(self, data: bytes) -> None:
        if self._start and self._start * 2 >= len(self._buffer):
            del self._buffer[:self._start]  # compact: amortised O(1) per byte
            self._start = 0
        self._buffer += data

    @property
    def buffered_size(self) -> int:
        return len(self._buffer) - self._start

    def next_frame(self) -> Frame | _NeedData:
        """The next whole frame, or NEED_DATA; raises RemoteProtocolError on garbage."""
        buffered = len(self._buffer) - self._start
        if buffered < 4:
            return NEED_DATA
        (frame_size,) = _SIZE.unpack_from(self._buffer, self._start)
        if not 8 <= frame_size <= self.frame_size_bytes_max - 4:
            raise RemoteProtocolError(
                f"frame of {frame_size + 4} bytes is outside [12, frame_size_bytes_max="
                f"{self.frame_size_bytes_max}]; the peer is not speaking mqlog, or sends "
                "frames larger than this node accepts")
        if buffered < frame_size + 4:
            return NEED_DATA
        start, end = self._start, self._start + 4 + frame_size
        frame = _decode(memoryview(self._buffer)[start:end])
        self._start = end
        return frame


def _decode(data: memoryview) -> Frame:
    _size, crc, header_size = _PREFIX.unpack_from(data)
    if crc32c(data[_CRC_FROM:]) != crc:
        raise RemoteProtocolError("frame CRC32C mismatch: the connection corrupted data")
    if PREFIX_SIZE + header_size > len(data):
        raise RemoteProtocolError(f"frame header of {header_size} bytes overruns its frame")
    try:
        header = msgpack.unpackb(data[PREFIX_SIZE:PREFIX_SIZE + header_size], raw=False)
    except (ValueError, msgpack.UnpackException) as error:
        raise RemoteProtocolError(f"frame header is not msgpack: {error}") from None
    if type(header) is not dict:  # (msgpack's strict_map_key allows str and bytes keys)
        raise RemoteProtocolError("frame header must be a map")
    return Frame(header, bytes(data[PREFIX_SIZE + header_size:]))
