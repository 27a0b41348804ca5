"""Hostile cases for the key index (issue 14): flipped bits in a sealed index file's
entries and slots, and an index file of the previous format version, on both log cores.

A sealed file is built once per core (400 records, keys k0..k49, 64 buckets: several
keys share a bucket, and a flip in a hash's high bits keeps the entry in its bucket),
then copied and damaged for each case. Every case queries every key and expects
exactly its records, newest first, and the damage reported (a rebuild counted).
"""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mqlog
from mqlog import ext
from mqlog import format as fmt
from tests.conftest import IMPLEMENTATIONS, SMALL

KEYS = 50
RECORDS = 400  # under SMALL's index_entries_per_file: one file
FLIP_ROUNDS = 24  # seeded single-bit flips per core


def _open(path: Path, impl: str) -> mqlog.Store:
    return mqlog.open(path, implementation=impl, **SMALL)


@pytest.fixture
def sealed(tmp_path: Path, impl: str) -> tuple[Path, dict[str, list[int]]]:
    """A closed store whose one index file is sealed, and each key's positions."""
    path = tmp_path / "sealed"
    expected: dict[str, list[int]] = {f"k{key}": [] for key in range(KEYS)}
    with _open(path, impl) as store:
        for number in range(RECORDS):
            key = f"k{number % KEYS}"
            expected[key].append(store.put("t", b"x%d" % number, key=key).position)
        store.query("t", "k0")  # index everything now
    assert sorted(p.name for p in (path / "index").iterdir()) == [f"{0:020d}"]
    return path, expected


def _index_path(store_path: Path) -> Path:
    return store_path / "index" / f"{0:020d}"


def _layout(data: bytes) -> tuple[int, int, int]:
    """(slot_count, entry_count, where the entries start) of an index file's bytes."""
    header = fmt.INDEX_HEADER.unpack(data[:fmt.INDEX_HEADER_SIZE])
    slot_count, entry_count = header[2], header[4]
    return slot_count, entry_count, fmt.INDEX_HEADER_SIZE + fmt.INDEX_SLOT_SIZE * slot_count


def _check_every_key(path: Path, impl: str, expected: dict[str, list[int]],
                     rebuilt: int) -> mqlog.Store:
    """Reopen, query every key (every chain of the file is walked to its end), and
    return the closed store for its counters."""
    with _open(path, impl) as store:
        for key, positions in expected.items():
            got = [record.position for record in store.query("t", key, max_count=64)]
            assert got == positions[::-1], (key, got)
        assert store.key_index.rebuilt_count == rebuilt
    return store


def test_every_flipped_bit_in_an_entry_is_found(tmp_path, impl, sealed, caplog, seed):
    """Issue 14 (open item of the fourth session): a flipped high bit in an index
    entry's hash left the entry in its bucket and hid that record: queries missed it
    silently. Each entry now carries a CRC32C of its bytes; any single flipped bit of
    any entry (hash, position, timestamp, link or the CRC itself) is found by the first
    query that walks it, the file is rebuilt from the log, and every key still finds
    exactly its records."""
    original, expected = sealed
    rng = random.Random(seed)
    data = _index_path(original).read_bytes()
    _slots, entry_count, entries_at = _layout(data)
    cases = [(0, 63)]  # the top bit of the oldest entry's hash: it stays in its bucket
    cases += [(rng.randrange(entry_count), rng.randrange(fmt.INDEX_ENTRY_SIZE * 8))
              for _ in range(FLIP_ROUNDS)]
    for round_index, (entry, bit) in enumerate(cases):
        copy = tmp_path / f"flip{round_index}"
        shutil.copytree(original, copy)
        damaged = bytearray(data)
        damaged[entries_at + entry * fmt.INDEX_ENTRY_SIZE + bit // 8] ^= 1 << (bit % 8)
        _index_path(copy).write_bytes(bytes(damaged))
        try:
            _check_every_key(copy, impl, expected, rebuilt=1)
        except AssertionError as error:
            raise AssertionError(f"seed {seed}, entry {entry}, bit {bit}: {error}") from None
        shutil.rmtree(copy)
    assert sum("rebuilding it from the commit log" in r.getMessage()
               for r in caplog.records) == len(cases)


def test_a_slot_naming_an_older_entry_is_found_at_open(tmp_path, impl, sealed):
    """A flipped bit in a slot that makes it name an older entry of the same bucket hid
    every newer record of that bucket (the chain held together). The sealed header
    carries the slots' CRC32C: the file is dropped at open, reported, and rebuilt."""
    path, expected = sealed
    data = bytearray(_index_path(path).read_bytes())
    slot_count, _entries, entries_at = _layout(data)
    for bucket in range(slot_count):
        slot_at = fmt.INDEX_HEADER_SIZE + fmt.INDEX_SLOT_SIZE * bucket
        newest = fmt.INDEX_SLOT.unpack_from(data, slot_at)[0]
        if newest:
            older = fmt.INDEX_ENTRY.unpack_from(
                data, entries_at + (newest - 1) * fmt.INDEX_ENTRY_SIZE)[3]
            if older:
                fmt.INDEX_SLOT.pack_into(data, slot_at, older)
                break
    else:
        pytest.fail("no bucket holds two entries")
    _index_path(path).write_bytes(bytes(data))
    store = _check_every_key(path, impl, expected, rebuilt=0)
    assert any("key index: 1 damaged file(s)" in what
               for what in store.recovery_report.rebuilt), store.recovery_report.rebuilt


def test_an_index_file_of_version_1_is_rebuilt_not_misread(tmp_path, impl, sealed):
    """Format version 2 of the index file added the CRCs. A sealed version-1 file (as
    the previous mqlog left it: magic "MQI" 0x01, no entry CRCs, a valid header CRC) is
    not read: opening drops it, says so, and rebuilds it as version 2."""
    path, expected = sealed
    data = bytearray(_index_path(path).read_bytes())
    _slots, entry_count, entries_at = _layout(data)
    for entry in range(entry_count):
        crc_at = entries_at + entry * fmt.INDEX_ENTRY_SIZE + fmt.INDEX_ENTRY_CRC_AT
        data[crc_at:crc_at + 4] = bytes(4)
    data[0:4] = b"MQI\x01"
    data[fmt.INDEX_SLOTS_CRC_AT:fmt.INDEX_SLOTS_CRC_AT + 4] = bytes(4)
    fmt.INDEX_SLOT.pack_into(data, fmt.INDEX_CRC_AT,
                             mqlog.format.crc32c(bytes(data[:fmt.INDEX_CRC_AT])))
    _index_path(path).write_bytes(bytes(data))
    store = _check_every_key(path, impl, expected, rebuilt=0)
    assert any("key index: 1 damaged file(s)" in what
               for what in store.recovery_report.rebuilt), store.recovery_report.rebuilt
    assert _index_path(path).read_bytes()[:4] == b"MQI\x02"


@pytest.mark.skipif("cython" not in IMPLEMENTATIONS, reason="the C core is not built")
@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_both_cores_walk_a_damaged_chain_alike(data):
    """index_chain (the lookup's walk, in the log core) answers alike on both cores for
    a real index file with bytes flipped anywhere, any hash, time range and resume
    point: the same positions, the same place to resume, the same words of damage."""
    cores = [ext.load("cython"), ext.load("python")]
    index = bytearray(_SAMPLE_INDEX)
    for _ in range(data.draw(st.integers(0, 3))):
        at = data.draw(st.integers(0, len(index) - 1))
        index[at] ^= 1 << data.draw(st.integers(0, 7))
    keys = [cores[1].key_hash("t", f"k{number}") for number in range(8)]
    value = data.draw(st.sampled_from(keys) | st.integers(0, (1 << 64) - 1))
    begin = data.draw(st.integers(-(1 << 63), (1 << 63) - 1) | st.just(0))
    end = data.draw(st.integers(-(1 << 63), (1 << 63) - 1) | st.just((1 << 63) - 1))
    count = data.draw(st.integers(1, 5))
    answers = [core.index_chain(bytes(index), value, begin, end, None, count)
               for core in cores]
    assert answers[0] == answers[1]
    for _ in range(50):  # resume to the end, alike
        if answers[0][1] is None:
            break
        answers = [core.index_chain(bytes(index), value, begin, end, answers[0][1], count)
                   for core in cores]
        assert answers[0] == answers[1]


def _sample_index() -> bytes:
    """A small sealed index file: 8 buckets, 60 keyed records of 8 keys."""
    with tempfile.TemporaryDirectory() as directory:
        settings_ = dict(SMALL, index_slots_per_file=8, index_entries_per_file=64)
        with mqlog.open(Path(directory), implementation="python", **settings_) as store:
            for number in range(60):
                store.put("t", b"x", key=f"k{number % 8}")
        return _index_path(Path(directory)).read_bytes()


_SAMPLE_INDEX = _sample_index()
