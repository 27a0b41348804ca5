"""The wire codec: frames survive any split of the byte stream, and garbage is always a
RemoteProtocolError, never a crash or a wrong message."""

from __future__ import annotations

import dataclasses
import random
import struct

import msgpack
import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from mqlog import ext
from mqlog.errors import RemoteProtocolError
from mqlog.replication import messages
from mqlog.replication.wire import (
    NEED_DATA,
    RECEIVE_BYTES_MAX,
    RECEIVE_BYTES_MIN,
    RECEIVE_KEPT_BYTES,
    WRITTEN_APART_BYTES,
    Frame,
    FrameDecoder,
    encode_frame,
)

headers = st.dictionaries(st.text(max_size=8), st.one_of(
    st.integers(-(1 << 63), (1 << 64) - 1), st.text(max_size=20), st.binary(max_size=20),
    st.booleans(), st.none()), max_size=6)
payloads = st.binary(max_size=3000)
names = st.text(min_size=1, max_size=10)
numbers = st.integers(0, messages.NUMBER_LIMIT - 1)  # (what a message may carry)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 63), (1 << 64) - 1),
                    st.floats(allow_nan=False), st.text(max_size=40),
                    st.binary(max_size=300))
nested = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=40), inner, max_size=6)),
    max_leaves=20)
TWINS = [ext.load_wire("python")]
try:
    TWINS.append(ext.load_wire("cython"))
except ImportError:
    pass
any_message = st.one_of(
    st.builds(messages.Hello, names, names, numbers, numbers, st.integers(-1, 1 << 40)),
    st.builds(messages.Append, names, names, numbers, numbers, payloads),
    st.builds(messages.Report, names, names, numbers, numbers, numbers),
    st.builds(messages.Truncate, names, names, numbers, numbers, st.integers(-1, 1 << 40)))


def _drain(decoder: FrameDecoder) -> list[Frame]:
    frames = []
    while (frame := decoder.next_frame()) is not NEED_DATA:
        assert isinstance(frame, Frame)
        frames.append(frame)
    return frames


@given(st.lists(st.tuples(headers, payloads), max_size=5), st.data())
def test_frames_survive_any_split_of_the_stream(items, data):
    stream = b"".join(encode_frame(header, payload) for header, payload in items)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    decoder, frames, start = FrameDecoder(1 << 20), [], 0
    for cut in [*cuts, len(stream)]:
        decoder.feed(stream[start:cut])
        frames += _drain(decoder)
        start = cut
    assert [(f.header, f.payload) for f in frames] == items
    assert decoder.buffered_size == 0


def test_a_byte_at_a_time():
    stream = encode_frame({"kind": "x", "n": 1}, b"payload") * 3
    decoder, frames = FrameDecoder(1 << 10), []
    for index in range(len(stream)):
        decoder.feed(stream[index:index + 1])
        frames += _drain(decoder)
    assert [f.payload for f in frames] == [b"payload"] * 3


def test_bytes_that_end_on_a_frame_are_decoded_where_they_lie():
    """A read that ends where a frame ends is decoded in place, not copied into the
    decoder's buffer first (a fetch answer is a few hundred KB); a frame cut by the read
    is kept, and a bytearray fed is copied (its owner may change it afterwards)."""
    first, second = encode_frame({"n": 1}, b"a" * 500), encode_frame({"n": 2}, b"b" * 500)
    decoder = FrameDecoder(1 << 20)
    data = first + second
    decoder.feed(data)
    assert decoder._buffer is data  # (not a copy)
    assert [f.header["n"] for f in _drain(decoder)] == [1, 2]
    decoder.feed(first + second[:100])
    assert [f.header["n"] for f in _drain(decoder)] == [1]
    decoder.feed(second[100:])
    assert [f.header["n"] for f in _drain(decoder)] == [2]
    mutable = bytearray(second[:300])
    decoder.feed(mutable)
    mutable[:] = bytes(300)
    decoder.feed(second[300:])
    assert [(f.header, f.payload) for f in _drain(decoder)] == [({"n": 2}, b"b" * 500)]
    assert decoder.buffered_size == 0



def _receive(decoder: FrameDecoder, data: bytes, most: int) -> None:
    """What a socket does: write at most ``most`` bytes where get_buffer says."""
    while data:
        room = decoder.get_buffer(-1)
        count = min(len(room), most, len(data))
        room[:count] = data[:count]
        decoder.buffer_updated(count)
        data = data[count:]


@given(st.lists(st.tuples(headers, st.binary(max_size=200_000)), max_size=4), st.data())
@settings(max_examples=40)
def test_frames_received_in_place_survive_any_split(items, data):
    """A socket writing into get_buffer's room, in reads of any size, mixed with feed:
    the same frames, and what is received is not lost when the buffer moves or grows."""
    stream = b"".join(encode_frame(header, payload) for header, payload in items)
    decoder, frames, start = FrameDecoder(1 << 20), [], 0
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    for cut in [*cuts, len(stream)]:
        piece = stream[start:cut]
        if data.draw(st.booleans()):
            decoder.feed(piece)
        else:
            _receive(decoder, piece, data.draw(st.integers(1, 300_000)))
        frames += _drain(decoder)
        start = cut
    assert [(f.header, f.payload) for f in frames] == items
    assert decoder.buffered_size == 0


def test_room_grows_with_what_arrives_and_a_drained_buffer_is_let_go():
    """A frame's size field makes no room by itself (a peer announcing a large frame
    gets memory only as it sends it): room grows with what is buffered and with reads
    that fill it; once everything received is decoded, a buffer larger than
    ``keep_bytes`` is let go."""
    frame = encode_frame({"kind": "big"}, bytes(3 * RECEIVE_KEPT_BYTES))
    decoder = FrameDecoder(16 << 20)
    assert len(decoder.get_buffer(-1)) == RECEIVE_BYTES_MIN
    _receive(decoder, frame[:100], 100)
    assert len(decoder._buffer) <= 2 * RECEIVE_BYTES_MIN
    grown, received = [], 100
    while received < len(frame):
        room = decoder.get_buffer(-1)
        grown.append(len(decoder._buffer))
        assert len(decoder._buffer) <= 4 * (received + RECEIVE_BYTES_MAX)
        count = min(len(room), len(frame) - received)
        room[:count] = frame[received:received + count]
        decoder.buffer_updated(count)
        received += count
    assert len(set(grown)) < 20  # (grown geometrically, not read by read)
    assert [f.header for f in _drain(decoder)] == [{"kind": "big"}]
    assert decoder._buffer == b""  # (drained, and larger than keep_bytes: let go)
    small = encode_frame({"kind": "small"}, b"x")
    _receive(decoder, small, 5)
    assert [f.header for f in _drain(decoder)] == [{"kind": "small"}]
    assert len(decoder._buffer) <= decoder.keep_bytes  # (an idle one keeps no more)


def test_an_oversized_frame_received_in_place_is_refused_without_room_for_it():
    decoder = FrameDecoder(frame_size_bytes_max=100)
    _receive(decoder, encode_frame({}, b"x" * (1 << 20))[:4], 4)
    assert len(decoder.get_buffer(-1)) < 1 << 20  # (no room made for a refused size)
    with pytest.raises(RemoteProtocolError, match="frame_size_bytes_max=100"):
        decoder.next_frame()


sizes_lists = st.one_of(
    st.lists(st.integers(0, 40), max_size=12),
    st.lists(st.one_of(st.integers(-(1 << 70), 1 << 70), st.booleans(), st.floats(),
                       st.text(max_size=2), st.none()), max_size=6),
    st.tuples(st.integers(0, 40)), st.none())


@given(st.binary(max_size=200), sizes_lists)
def test_the_twins_split_a_produce_payload_alike(payload, sizes):
    """A produce request's bodies: the same bodies from both twins, or the same
    RemoteProtocolError (sizes not a list of ints >= 0, or not adding up to the
    payload's length); a whole payload of one body is not copied."""
    outcomes = []
    for twin in TWINS:
        try:
            outcomes.append(twin.split_bodies(payload, sizes))
        except RemoteProtocolError as error:
            outcomes.append(str(error))
    assert all(outcome == outcomes[0] for outcome in outcomes), outcomes
    if isinstance(outcomes[0], list):
        assert b"".join(outcomes[0]) == payload and \
            [len(body) for body in outcomes[0]] == sizes
        if len(sizes) == 1:
            assert all(outcome[0] is payload for outcome in outcomes)


def test_sizes_past_a_payload_are_refused_naming_their_sum():
    for twin in TWINS:
        with pytest.raises(RemoteProtocolError, match="add up to 36893488147419103236 bytes"):
            twin.split_bodies(b"abc", [1 << 64, 1 << 64, 4])
        with pytest.raises(RemoteProtocolError, match="non-negative ints"):
            twin.split_bodies(b"abc", [3, True])

@given(any_message)
def test_messages_round_trip(message):
    decoder = FrameDecoder(1 << 20)
    decoder.feed(messages.encode(message))
    frame = decoder.next_frame()
    assert isinstance(frame, Frame)
    assert messages.decode(frame) == message


def _example(cls: type[messages.Message], salt: int) -> messages.Message:
    """An instance of a message class with every field set (by its type) from ``salt``."""
    values = {"str": f"s{salt}", "int": salt, "bool": salt % 2 == 0,
              "bytes": bytes([salt % 256]) * salt}
    values["bytes | FileExtent"] = values["bytes"]  # (a payload: bytes once received)
    return cls(**{item.name: values[str(item.type)] for item in dataclasses.fields(cls)})


@pytest.mark.parametrize("cls", list(messages.KINDS.values()), ids=lambda cls: cls.kind)
def test_every_message_kind_codes_as_its_fields_in_order(cls):
    """encode writes the kind, the group, then every field but the payload in the
    dataclass's order (the bytes of before its field names were cached per class); decode
    makes a message equal to the constructor's, hashable and frozen as that one."""
    for salt in (3, 4):
        message = _example(cls, salt)
        fields = {item.name: getattr(message, item.name)
                  for item in dataclasses.fields(cls) if item.name != "payload"}
        frame = messages.encode(message, "g1")
        assert frame == encode_frame({"kind": cls.kind, "group": "g1", **fields},
                                     getattr(message, "payload", b""))
        decoder = FrameDecoder(1 << 20)
        decoder.feed(frame)
        decoded = messages.decode(decoder.next_frame())  # type: ignore[arg-type]
        assert type(decoded) is cls and decoded == message
        assert hash(decoded) == hash(message) and repr(decoded) == repr(message)
        with pytest.raises(dataclasses.FrozenInstanceError):
            decoded.src = "other"  # type: ignore[misc]


@settings(max_examples=300)
@given(st.binary(max_size=200), st.integers(0, 199), st.integers(1, 255))
def test_corruption_is_a_protocol_error(garbage, index, flip):
    """A flipped byte inside a frame is caught (CRC32C finds every burst of up to 32 bits):
    the first frame never decodes; garbage after it is only ever a RemoteProtocolError."""
    frame = bytearray(encode_frame({"kind": "append", "position": 7}, b"records"))
    frame[index % len(frame)] ^= flip
    decoder = FrameDecoder(64)
    decoder.feed(bytes(frame) + garbage)
    decoded_count = 0
    try:
        while (decoded := decoder.next_frame()) is not NEED_DATA:
            assert isinstance(decoded, Frame)
            decoded_count += 1
            assert decoded_count > 1, "a corrupted frame was accepted"
            messages.decode(decoded)
    except RemoteProtocolError:
        return


def test_an_oversized_frame_is_refused_before_its_body_arrives():
    decoder = FrameDecoder(frame_size_bytes_max=100)
    decoder.feed(encode_frame({}, b"x" * 200)[:4])  # only the size field
    with pytest.raises(RemoteProtocolError, match="frame_size_bytes_max=100"):
        decoder.next_frame()


@pytest.mark.parametrize("header", [{"kind": "nope"}, {"kind": "report", "src": "a"},
                                    {"kind": "truncate", "src": "a", "dst": "b", "epoch": 1,
                                     "position": "7", "last_epoch": 0},
                                    # numbers no life reaches, whose +1 no u64 holds (a
                                    # term of 2**64 - 1 stopped its node at every start)
                                    {"kind": "truncate", "src": "a", "dst": "b",
                                     "epoch": (1 << 64) - 1, "position": 0, "last_epoch": 0},
                                    {"kind": "truncate", "src": "a", "dst": "b", "epoch": 1,
                                     "position": 1 << 62, "last_epoch": 0},
                                    {"kind": "truncate", "src": "a", "dst": "b", "epoch": 1,
                                     "position": 0, "last_epoch": -(1 << 62) - 1}])
def test_malformed_messages_are_protocol_errors(header):
    with pytest.raises(RemoteProtocolError):
        messages.decode(Frame(header))


@pytest.mark.skipif(len(TWINS) < 2, reason="the C wire codec is not built")
@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=40), nested, max_size=8), st.binary(max_size=100))
def test_the_twins_write_the_same_bytes_and_read_them_back(header, payload):
    python, cython = TWINS
    frame = python.encode_frame(header, payload)
    assert cython.encode_frame(header, payload) == frame
    packed = msgpack.packb(header, use_bin_type=True)
    assert frame[12:12 + struct.unpack_from("<I", frame, 8)[0]] == packed
    assert python.packb(header) == cython.packb(header) == packed
    for twin in TWINS:
        frames, end, error = twin.decode_frames(bytearray(frame * 2), 0, 1 << 20)
        assert error is None and end == 2 * len(frame)
        assert [(f.header, f.payload) for f in frames] == [(header, payload)] * 2


@given(headers, st.binary(max_size=3000) | st.integers(0, 300 << 10).map(
    lambda size: random.Random(size).randbytes(size)), st.binary(max_size=40))
def test_a_frame_head_from_its_payloads_size_and_crc_is_the_frame_head(header, payload,
                                                                        before):
    """A payload sent from a file (a FileExtent) is framed from its size and CRC32C
    alone: the head's CRC continues over it by crc32c_combine (the register moved over
    the payload's zero bytes: a wrong operator breaks most sizes)."""
    for twin in TWINS:
        assert twin.crc32c_combine(crc32c(before), crc32c(payload), len(payload)) == \
            crc32c(before + payload)
        assert twin.encode_frame_head_of(header, len(payload), crc32c(payload)) == \
            twin.encode_frame_head(header, payload)


@given(headers, st.binary(max_size=3000) | st.integers(64 << 10, 300 << 10).map(bytes))
def test_a_frame_head_then_its_payload_is_the_frame(header, payload):
    """A fetch answer's records are written after their frame's head, not copied into
    it (messages.encode_pieces): the head's sizes and CRC count the payload."""
    for twin in TWINS:
        frame = twin.encode_frame(header, payload)
        assert twin.encode_frame_head(header, memoryview(payload)) + payload == frame
    message = messages.FetchReply("n1", "n2", 3, 7, 100, 2, 50, 0, -1, -1, "", -1, -1,
                                  payload=payload)
    pieces = messages.encode_pieces(message)
    assert len(pieces) == (2 if len(payload) >= WRITTEN_APART_BYTES else 1)
    assert pieces[-1] is payload or len(pieces) == 1
    assert b"".join(pieces) == messages.encode(message)
    decoder = FrameDecoder(1 << 20)
    decoder.feed(b"".join(pieces))
    frame = decoder.next_frame()
    assert isinstance(frame, Frame) and messages.decode(frame) == message


@pytest.mark.skipif(len(TWINS) < 2, reason="the C wire codec is not built")
@settings(max_examples=600)
@given(st.binary(max_size=60))
def test_the_twins_agree_on_any_header_bytes(packed):
    """Header bytes that are not one msgpack map, in a frame with a right CRC: both twins
    refuse them, or both decode the same header."""
    body = struct.pack("<I", len(packed)) + packed + b"payload"
    frame = struct.pack("<II", len(body) + 4, crc32c(body)) + body
    outcomes = []
    for twin in TWINS:
        frames, _end, error = twin.decode_frames(frame, 0, 1 << 20)
        outcomes.append(type(error) if error else [(f.header, f.payload) for f in frames])
    if isinstance(outcomes[0], list) and any(isinstance(value, msgpack.Timestamp)
                                             for value in outcomes[0][0][0].values()):
        return  # msgpack reads ext -1 itself (Timestamp); the C codec refuses every ext
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("twin", TWINS, ids=lambda twin: twin.IMPLEMENTATION)
@pytest.mark.parametrize("value, error", [
    (1 << 64, OverflowError), (-(1 << 63) - 1, OverflowError), (object(), TypeError),
    ({1: "an int key is packed", "set": {1}}, TypeError)])
def test_what_msgpack_cannot_carry_is_refused(twin, value, error):
    with pytest.raises(error):
        twin.encode_frame({"value": value})
    with pytest.raises(error):
        twin.packb({"value": value})


@pytest.mark.parametrize("twin", TWINS, ids=lambda twin: twin.IMPLEMENTATION)
def test_packb_is_msgpack_for_what_headers_never_hold(twin):
    value = {"when": msgpack.Timestamp(1, 2), "ext": msgpack.ExtType(5, b"x")}
    assert twin.packb(value) == msgpack.packb(value)


@pytest.mark.parametrize("twin", TWINS, ids=lambda twin: twin.IMPLEMENTATION)
def test_frames_before_garbage_are_handed_out_first(twin):
    good = twin.encode_frame({"kind": "x"}, b"1")
    frames, end, error = twin.decode_frames(good * 2 + b"\xff" * 16, 0, 1 << 10)
    assert [f.payload for f in frames] == [b"1", b"1"] and end == 2 * len(good)
    assert isinstance(error, RemoteProtocolError)
    decoder = FrameDecoder(1 << 10)
    decoder.feed(good + b"\xff" * 16)
    assert decoder.next_frame().payload == b"1"
    for _ in range(2):  # and the error stays: the connection must be dropped
        with pytest.raises(RemoteProtocolError):
            decoder.next_frame()


@pytest.mark.skipif(len(TWINS) < 2, reason="the C wire codec is not built")
def test_the_twins_agree_on_the_widest_encodings():
    """str/bin/array/map of 16- and 32-bit sizes, and a frame large enough to be
    checksummed with the GIL released."""
    header = {"s": "é" * 40_000, "b": b"y" * 70_000, "l": list(range(70_000)),
              "m": {str(index): index for index in range(70_000)}, "f": -1.5}
    frames = [twin.encode_frame(header, b"z" * 100_000) for twin in TWINS]
    assert frames[0] == frames[1]
    for twin in TWINS:
        decoded, _end, error = twin.decode_frames(frames[0], 0, 1 << 24)
        assert error is None and decoded[0].header == header
