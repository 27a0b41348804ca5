"""The wire codec: frames survive any split of the byte stream, and garbage is always a
RemoteProtocolError, never a crash or a wrong message."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqlog.errors import RemoteProtocolError
from mqlog.replication import messages
from mqlog.replication.wire import NEED_DATA, Frame, FrameDecoder, encode_frame

headers = st.dictionaries(st.text(max_size=8), st.one_of(
    st.integers(-(1 << 63), (1 << 64) - 1), st.text(max_size=20), st.binary(max_size=20),
    st.booleans(), st.none()), max_size=6)
payloads = st.binary(max_size=3000)
names = st.text(min_size=1, max_size=10)
numbers = st.integers(0, (1 << 63) - 1)
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


@given(any_message)
def test_messages_round_trip(message):
    decoder = FrameDecoder(1 << 20)
    decoder.feed(messages.encode(message))
    frame = decoder.next_frame()
    assert isinstance(frame, Frame)
    assert messages.decode(frame) == message


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
                                     "position": "7", "last_epoch": 0}])
def test_malformed_messages_are_protocol_errors(header):
    with pytest.raises(RemoteProtocolError):
        messages.decode(Frame(header))
