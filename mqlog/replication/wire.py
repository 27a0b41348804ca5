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

Frames are coded by ``mqlog.ext.wire`` (the C codec, or its pure-Python twin, chosen as
the log core is). The decoder here is sans-IO (h11's shape): ``feed(data)`` takes
whatever the socket gave, ``next_frame()`` returns a ``Frame`` or ``NEED_DATA``. It
decodes every whole frame buffered in one call to the codec and hands them out one by
one. It never buffers a frame larger than ``frame_size_bytes_max`` (the size field is
checked before the body arrives), and a bad CRC, size or header raises
``RemoteProtocolError`` once the frames before it are handed out: the connection must be
dropped.

A socket may also read straight into the decoder (asyncio's ``BufferedProtocol``, a
broker's connections): ``get_buffer()`` is where the next bytes go, ``buffer_updated(n)``
says how many came. The decoder then keeps one bytearray and receives in place: a fetch
answer of a megabyte is copied once, into its frame's payload (``feed`` copies what a
read returned unless it ends on a frame's end, and a stream reader copies it twice
before that). Its room grows with what arrives, never ahead of it: for the rest of the
frame begun, at most twice what is buffered (a peer announcing a 16 MiB frame gets no
16 MiB until it sends them), and for the next read, doubling while reads fill it (up to
``RECEIVE_BYTES_MAX``: requests pipelined together are read, and answered, together),
halving while they do not. Once everything received is decoded, a buffer larger than
``keep_bytes`` is let go (``RECEIVE_BYTES_MIN`` unless set: an idle connection keeps
that much; a broker's peer connections keep ``RECEIVE_KEPT_BYTES``, their answers are
large and steady).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from mqlog.ext import wire as _codec

if TYPE_CHECKING:
    from mqlog.ext.wire_fallback import Frame
else:
    Frame = _codec.Frame
encode_frame = _codec.encode_frame
encode_frame_head = _codec.encode_frame_head  # all of a frame but its payload
encode_frame_head_of = _codec.encode_frame_head_of  # ... given the payload's size and CRC
split_bodies = _codec.split_bodies  # a produce request's payload cut into its bodies
PREFIX_SIZE: Final = _codec.PREFIX_SIZE
RECEIVE_BYTES_MIN: Final = 64 << 10  # get_buffer offers at least this much room
RECEIVE_BYTES_MAX: Final = 1 << 20  # ... and at most this for the next read alone
RECEIVE_KEPT_BYTES: Final = 4 << 20  # what a peer connection's buffer may keep, drained
# A payload this large is written after its frame's head, not copied into the frame (a
# fetch answer's records: messages.encode_pieces, Connection.write_frames)
WRITTEN_APART_BYTES: Final = 64 << 10


class _NeedData:
    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = _NeedData()


class FrameDecoder:
    """Turns a byte stream into frames; see the module docstring."""

    def __init__(self, frame_size_bytes_max: int,
                 keep_bytes: int = RECEIVE_BYTES_MIN) -> None:
        assert frame_size_bytes_max >= PREFIX_SIZE
        self.frame_size_bytes_max = frame_size_bytes_max
        self.keep_bytes = keep_bytes  # a receive buffer's size kept once drained
        self._read_bytes = RECEIVE_BYTES_MIN  # room offered for the next read
        # What was fed and is not decoded yet is _buffer[_start:_end]: the bytes fed last
        # as they are while everything before them was decoded (a read that ends on a
        # frame's end is decoded where it lies: a fetch answer is not copied once more),
        # else a bytearray they were copied into, or received into (its room past _end
        # is where get_buffer lets the socket write).
        self._buffer: bytes | bytearray = b""
        self._start = 0  # where the next undecoded frame begins in _buffer
        self._end = 0  # where what was fed or received ends
        self._decoded: list[Frame] = []  # frames decoded, not yet handed out
        self._next = 0  # the next of them to hand out

    def feed(self, data: bytes) -> None:
        buffer = self._buffer
        if self._start == self._end:  # all decoded: start over with these bytes
            self._buffer, self._start = (data if type(data) is bytes else bytes(data)), 0
            self._end = len(self._buffer)
            return
        if isinstance(buffer, bytes):  # a frame's start is left of the last bytes fed
            buffer = self._buffer = bytearray(memoryview(buffer)[self._start:self._end])
            self._start = 0
        else:
            del buffer[self._end:]  # (room a receive left)
            if self._start and self._start * 2 >= len(buffer):
                del buffer[:self._start]  # compact: amortised O(1) per byte
                self._start = 0
        buffer += data
        self._end = len(buffer)

    def get_buffer(self, size_hint: int = -1) -> memoryview:
        """Where the socket may write the next bytes received (``buffer_updated`` says
        how many it wrote); see the module docstring for how much room. Not to be kept
        past that call: the next may move it."""
        buffer, start, end = self._buffer, self._start, self._end
        pending = end - start
        room = max(self._read_bytes, size_hint,
                   min(self._frame_rest(), 2 * max(pending, RECEIVE_BYTES_MIN)))
        if isinstance(buffer, bytearray) and len(buffer) - end >= room:
            return memoryview(buffer)[end:]
        size = pending + room
        if isinstance(buffer, bytearray) and size <= len(buffer):
            memoryview(buffer)[:pending] = memoryview(buffer)[start:end]  # (a memmove)
        else:  # (grown: at most twice what it holds, amortised O(1) a byte)
            grown = bytearray(max(size, min(2 * len(buffer), pending + 2 * room)))
            grown[:pending] = memoryview(buffer)[start:end]
            self._buffer = buffer = grown
        self._start, self._end = 0, pending
        return memoryview(buffer)[pending:]

    def buffer_updated(self, size: int) -> None:
        """``size`` bytes were received where ``get_buffer`` said."""
        room = len(self._buffer) - self._end
        self._end += size
        if size == room and self._read_bytes < RECEIVE_BYTES_MAX:
            self._read_bytes *= 2  # (a read filled what it was offered: more waits)
        elif size * 4 < self._read_bytes and self._read_bytes > RECEIVE_BYTES_MIN:
            self._read_bytes //= 2

    def _frame_rest(self) -> int:
        """Bytes still to come of the frame begun (0: none begun, or its size is bad:
        decoding says so)."""
        start, pending = self._start, self._end - self._start
        if pending < 4:
            return 0
        whole = int.from_bytes(self._buffer[start:start + 4], "little") + 4
        return whole - pending if whole <= self.frame_size_bytes_max else 0

    @property
    def buffered_size(self) -> int:
        """Bytes fed that are not yet decoded into frames."""
        return self._end - self._start

    def next_frame(self) -> Frame | _NeedData:
        """The next whole frame, or NEED_DATA; raises RemoteProtocolError on garbage."""
        if self._next < len(self._decoded):
            self._next += 1
            return self._decoded[self._next - 1]
        buffer = self._buffer
        received = memoryview(buffer)[:self._end] if self._end != len(buffer) else buffer
        frames, self._start, error = _codec.decode_frames(received, self._start,
                                                          self.frame_size_bytes_max)
        del received  # (no view of the buffer outlives this call)
        if self._start == self._end and len(buffer) > self.keep_bytes and \
                isinstance(buffer, bytearray):
            self._buffer, self._start, self._end = b"", 0, 0  # (drained: let it go)
        if not frames:
            if error is not None:
                raise error
            return NEED_DATA
        self._decoded, self._next = frames, 1
        return frames[0]
