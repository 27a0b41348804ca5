"""The core modules: CRC32C against the reference package, tag hashes, the switch."""

from __future__ import annotations

import errno
import os
import random
import subprocess
import sys
from pathlib import Path

import crc32c as reference
import pytest
from hypothesis import given
from hypothesis import strategies as st

import mqlog
from mqlog import ext
from mqlog.config import StoreConfig
from mqlog.engine.files import FileExtent
from mqlog.errors import CorruptRecord, InvalidPosition
from mqlog.ext import fallback
from tests.conftest import IMPLEMENTATIONS

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(params=IMPLEMENTATIONS)
def core(request):
    return ext.load(request.param)


def test_crc32c_known_vector(core):
    assert core.crc32c(b"123456789") == 0xE3069283
    assert core.crc32c(b"") == 0


@given(data=st.binary(max_size=5000), start=st.integers(0, 0xFFFF_FFFF),
       cut=st.integers(0, 5000), shift=st.integers(0, 15))
def test_crc32c_matches_the_reference_package(data, start, cut, shift):
    for name in IMPLEMENTATIONS:
        core = ext.load(name)
        expected = reference.crc32c(data, start)
        assert core.crc32c(data, start) == expected
        # Any alignment, any split: the hardware path must agree with the table path.
        view = memoryview(b"\0" * shift + data)[shift:]
        assert core.crc32c(view, start) == expected
        head = core.crc32c(data[:cut], start)
        assert core.crc32c(data[cut:], head) == expected


@given(size=st.sampled_from([3 * 8192 - 1, 3 * 8192, 3 * 8192 + 767, 6 * 8192 + 3 * 256])
       | st.integers(0, 80_000), seed=st.integers(0, 2**32 - 1), shift=st.integers(0, 7))
def test_crc32c_of_long_buffers_matches_the_reference_package(size, seed, shift):
    # Buffers of three-stream blocks (long: 3 x 8 KiB, short: 3 x 256 bytes), whose
    # registers are joined by table: one wrong entry changes most results.
    data = random.Random(seed).randbytes(size)
    view = memoryview(b"\0" * shift + data)[shift:]
    expected = reference.crc32c(data, seed)
    for name in IMPLEMENTATIONS:
        assert ext.load(name).crc32c(view, seed) == expected, f"seed {seed}"


@given(tags=st.one_of(st.none(), st.text(max_size=40)))
def test_tag_hash_agrees_between_cores(tags):
    values = {ext.load(name).tag_hash(tags) for name in IMPLEMENTATIONS}
    assert len(values) == 1
    assert fallback.tag_hash("TagA") == fallback.tag_hash(b"TagA") != 0
    assert fallback.tag_hash(None) == fallback.tag_hash("") == 0


def test_layout_constants_agree(core):
    names = ["HEADER_SIZE", "CRC_START", "MAGIC", "BLANK_MAGIC", "BLANK_SIZE_MIN",
             "CQ_ENTRY_SIZE", "ATTR_CONTROL"]
    assert {n: getattr(core, n) for n in names} == {n: getattr(fallback, n) for n in names}


def _implementation_with(env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MQLOG_")}
    return subprocess.run([sys.executable, "-c", "import mqlog; print(mqlog.IMPLEMENTATION)"],
                          env={**clean, **env}, cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def test_purepython_switch_selects_the_twin():
    assert _implementation_with({"MQLOG_PUREPYTHON": "1"}).stdout.strip() == "python"


@pytest.mark.skipif("cython" not in IMPLEMENTATIONS, reason="the C extension is not built")
def test_the_extension_is_the_default_when_built():
    assert _implementation_with({}).stdout.strip() == "cython"
    assert _implementation_with({"MQLOG_REQUIRE_EXTENSION": "1"}).stdout.strip() == "cython"


def test_load_rejects_unknown_names():
    with pytest.raises(ValueError):
        ext.load("rust")


def test_write_zeros_agrees_between_cores(core, tmp_path):
    """files.write_zeros's work (backing a file with blocks): zeros over exactly [start,
    end), in pieces, the file grown as needed; a piece out of 1..1 MiB is a ValueError,
    a descriptor that cannot be written an OSError with its errno."""
    path = tmp_path / "f"
    path.write_bytes(b"\xff" * 100_000)
    fd = os.open(path, os.O_RDWR)
    try:
        core.write_zeros(fd, 1_000, 70_001, 16 << 10)
        core.write_zeros(fd, 99_000, 150_000, 1 << 20)
        for piece in (0, (1 << 20) + 1):
            with pytest.raises(ValueError, match="piece"):
                core.write_zeros(fd, 0, 10, piece)
    finally:
        os.close(fd)
    data = path.read_bytes()
    assert data == b"\xff" * 1_000 + bytes(69_001) + b"\xff" * 28_999 + bytes(51_000)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(OSError) as refused:
            core.write_zeros(fd, 0, 10, 4096)
        assert refused.value.errno == errno.EBADF  #: not open for writing
    finally:
        os.close(fd)


@pytest.mark.parametrize("name", IMPLEMENTATIONS)
def test_read_for_send_is_read_raw_from_the_file_in_both_cores(name, tmp_path):
    """Store.read_for_send (a fetch answer to be sent with sendfile): read_raw's very
    bytes — whole records, a segment's closing blank as its header then zeros — as a
    FileExtent once 64 KiB or more are asked and there, with the CRC32C of those bytes;
    read_raw's errors for a position inside a record and a damaged record."""
    store = mqlog.open(tmp_path / "s", StoreConfig(segment_size_bytes=1 << 20,
                                                   message_size_bytes_max=64 << 10),
                       implementation=name)
    try:
        rnd = random.Random(5)
        for _ in range(600):
            store.put_nowait("t", [rnd.randbytes(rnd.randrange(1, 3000))]
                             * rnd.randrange(1, 20), 0)
        position, kinds = 0, set()
        while position < store.written_position:
            limit = rnd.choice([100, 70_000, 256 << 10, 1 << 20])
            expected = store.read_raw(position, limit)
            answer = store.read_for_send(position, limit)
            if isinstance(answer, FileExtent):
                kinds.add("blank" if answer.zeros else "extent")
                assert (len(answer), answer.read(), answer.crc) == (
                    len(expected), expected, reference.crc32c(expected)), position
                third = len(expected) // 3
                assert answer.read(third) == expected[third:]
            else:
                kinds.add("bytes")
                assert answer == expected
            position += len(expected)
        assert kinds == {"blank", "extent", "bytes"}
        with pytest.raises(InvalidPosition):
            store.read_for_send(1, 1 << 20)
        size = int.from_bytes(store.read_raw(0, 1)[:4], "little")
        segment = tmp_path / "s" / "commitlog" / f"{0:020d}"
        with open(segment, "r+b") as damaged:  # a bit of the first record's body flipped
            damaged.seek(size - 1)
            byte = damaged.read(1)[0]
            damaged.seek(size - 1)
            damaged.write(bytes([byte ^ 1]))
        with pytest.raises(CorruptRecord):
            store.read_raw(0, 1 << 20)
        with pytest.raises(CorruptRecord):
            store.read_for_send(0, 1 << 20)
    finally:
        store.close()


def test_read_for_send_beside_retention_and_without_descriptors_is_read_raw(tmp_path,
                                                                             monkeypatch):
    """A hostile review: retention (the store's maintenance thread) letting a segment go
    between the core's raw_extent and the extent's opening raised KeyError out of an ISR
    leader's ready(), and so did running out of descriptors (OSError): the answer is
    read_raw's now, a typed error or the bytes."""
    store = mqlog.open(tmp_path / "s", StoreConfig(segment_size_bytes=1 << 20,
                                                   message_size_bytes_max=64 << 10))
    try:
        for n in range(300):
            store.put_nowait("t", [bytes([n % 251]) * 1000] * 10, 0)
        store.flush()
        store.set_committed_position(store.written_position)
        second = [base for base, _ in store.files.segments()][2]
        segment_file = store.files.segment_file

        def after_retention(base):  # (retention ran since the core's check)
            store.trim_front(second)
            return segment_file(base)

        monkeypatch.setattr(store.files, "segment_file", after_retention)
        with pytest.raises(InvalidPosition):
            store.read_for_send(0, 256 << 10)
        monkeypatch.setattr(store.files, "segment_file", segment_file)

        def no_descriptor_left(extent, *args):  # (as os.open raises it in __init__)
            extent._fd = -1
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

        monkeypatch.setattr(FileExtent, "__init__", no_descriptor_left)
        assert store.read_for_send(second, 256 << 10) == store.read_raw(second, 256 << 10)
    finally:
        store.close()
