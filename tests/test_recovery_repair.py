"""Mid-log damage: recovery refuses to open, and `mqlog repair` mends it (issue 14, 12).

Before issue 14, one flipped bit in segment 0 with the checkpoint lost made recovery cut
the log there and delete every later, intact, fsynced segment, without asking. Now the
store refuses to open with a CorruptStore naming the damaged range, deletes nothing,
and `mqlog repair DIR [--from REPLICA_DIR]` replaces exactly the damaged records: with
blank fillers (every queue keeps consecutive offsets: a lost record reads back as a
filler with ``format.ATTR_FILLER`` and an empty body), or with the replica's bytes where
they verify. Both cores; the command runs in this process (``cli.main``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import mqlog
from mqlog import errors
from mqlog import format as fmt
from mqlog.engine.repair import repair
from tests.conftest import SMALL

CONFIG = {**SMALL, "checkpoint_interval_ms": 3_600_000}
SEGMENT = SMALL["segment_size_bytes"]
RECORDS = 1200


def _body(index: int) -> bytes:
    return index.to_bytes(4, "little") * 40


def _build(path: Path, impl: str) -> None:
    """Five segments' worth of records in four queues, closed cleanly (all fsynced)."""
    with mqlog.open(path, implementation=impl, **CONFIG) as store:
        for index in range(RECORDS):
            store.put("ab"[index % 2], _body(index), index % 2, key=f"k{index % 9}")
    assert len(_segments(path)) >= 5, "test set-up"


def _segments(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((path / "commitlog").iterdir())}


def _read_all(store: mqlog.Store) -> dict[tuple[str, int], list]:
    """Every queue's records from offset 0, checking that offsets are consecutive."""
    held = {}
    for topic, queue_id in store.queues():
        records, offset = [], store.min_offset(topic, queue_id)
        while offset < store.max_offset(topic, queue_id):
            for record in store.get(topic, queue_id, offset, max_count=64):
                assert record.offset == offset
                records.append(record)
                offset += 1
        held[(topic, queue_id)] = records
    return held


def _flip(path: Path, position: int) -> None:
    name = path / "commitlog" / f"{position - position % SEGMENT:020d}"
    data = bytearray(name.read_bytes())
    data[position % SEGMENT] ^= 0x10
    name.write_bytes(bytes(data))


def _cli(*args: object) -> None:
    from mqlog import cli

    with pytest.raises(SystemExit) as exited:
        cli.main([str(arg) for arg in args])
    assert exited.value.code == 0


def test_a_flipped_bit_with_the_checkpoint_lost_refuses_to_open_and_deletes_nothing(
        tmp_path, impl):
    """The issue's case: the scan from the first segment meets the bad record; three and
    more intact segments follow it, and every byte of them stays."""
    store = tmp_path / "store"
    _build(store, impl)
    _flip(store, 3000)
    (store / "checkpoint").unlink()
    before = _segments(store)
    with pytest.raises(errors.CorruptStore) as raised:
        mqlog.open(store, implementation=impl, **CONFIG)
    message = str(raised.value)
    assert "is damaged: the record at position" in message and "mqlog repair" in message
    low, high = message.split("the damaged range is [")[1].split(")")[0].split(", ")
    assert int(low) <= 3000 < int(high)
    assert _segments(store) == before  # nothing cut, zeroed or deleted


def test_repair_blanks_exactly_the_damaged_records(tmp_path, impl, capsys):
    store = tmp_path / "store"
    _build(store, impl)
    with mqlog.open(store, implementation=impl, **CONFIG) as opened:
        original = _read_all(opened)
        opened.query("a", "k0")  # index every record: the index now points everywhere
    _flip(store, 3000)
    _flip(store, 3 * SEGMENT + 5000)
    (store / "checkpoint").unlink()
    before = _segments(store)
    _cli("repair", store)
    out = capsys.readouterr().out
    assert "2 damaged range(s) mended, 2 record(s)" in out
    assert "lost a/" in out or "lost b/" in out
    with mqlog.open(store, implementation=impl, **CONFIG) as opened:
        held = _read_all(opened)
        assert held.keys() == original.keys()
        fillers = 0
        for queue, records in held.items():
            assert len(records) == len(original[queue])
            for got, want in zip(records, original[queue], strict=True):
                if got.attributes & fmt.ATTR_FILLER:
                    fillers += 1
                    assert got.body == b"" and got.position < 4 * SEGMENT
                    assert (got.topic, got.queue_id, got.offset) == \
                        (want.topic, want.queue_id, want.offset)
                else:
                    assert bytes(got.raw) == bytes(want.raw)
        assert fillers == 2  # one record each (small records, one flipped bit each)
        # The key index was rebuilt: it answers every key, never with a filler, and
        # never points into a mended range (where no record starts any more).
        for key in range(9):
            found = opened.query("a", f"k{key}", max_count=1000) + \
                opened.query("b", f"k{key}", max_count=1000)
            want = [r for records in original.values() for r in records
                    if r.key == f"k{key}"]
            assert len(want) - 2 <= len(found) <= len(want)  # 2 records were lost
            assert {bytes(r.raw) for r in found} <= {bytes(r.raw) for r in want}
    # What was replaced is kept, byte for byte.
    [saved] = (store / "repair").iterdir()
    for piece in saved.iterdir():
        start, end = map(int, piece.name.split("-"))
        base = start - start % SEGMENT
        assert piece.read_bytes() == before[f"{base:020d}"][start - base:end - base]


def test_repair_is_a_change_to_readers_in_other_processes(tmp_path, impl):
    """Repair rewrites records while read-only readers (the Spark source's) may read:
    like a truncation it moves the change count (docs/FORMAT.md, ``changes``), so such
    a reader says StoreChanged rather than damage; a dry run changes nothing."""
    from mqlog.engine.checkpoint import read_changes

    store = tmp_path / "store"
    _build(store, impl)
    before = read_changes(store / "changes")
    _flip(store, 3000)
    repair(store, dry_run=True)
    assert read_changes(store / "changes") == before
    repair(store)
    assert read_changes(store / "changes") == before + 2


def test_repair_from_a_replica_loses_nothing(tmp_path, impl, capsys):
    store, replica = tmp_path / "store", tmp_path / "replica"
    _build(store, impl)
    shutil.copytree(store, replica)
    _flip(store, 3000)
    (store / "checkpoint").unlink()
    _cli("repair", store, "--from", replica)
    assert "copied from the replica" in capsys.readouterr().out
    assert _segments(store) == _segments(replica)
    with mqlog.open(store, implementation=impl, **CONFIG) as opened:
        assert sum(map(len, _read_all(opened).values())) == RECORDS


def test_a_replica_damaged_at_the_same_place_is_not_trusted(tmp_path, impl):
    store, replica = tmp_path / "store", tmp_path / "replica"
    _build(store, impl)
    shutil.copytree(store, replica)
    _flip(store, 3000)
    _flip(replica, 3001)
    report = repair(store, replica)
    assert [piece.how for piece in report.pieces] == ["blank"]
    with mqlog.open(store, implementation=impl, **CONFIG) as opened:
        assert sum(map(len, _read_all(opened).values())) == RECORDS


@pytest.mark.parametrize("how", ["missing", "short", "empty"])
def test_a_hole_in_the_segment_files_is_refused_then_repaired(tmp_path, impl, how):
    store = tmp_path / "store"
    _build(store, impl)
    with mqlog.open(store, implementation=impl, **CONFIG) as opened:
        opened.query("a", "k0")  # index every record, those of the victim too
    victim = store / "commitlog" / f"{2 * SEGMENT:020d}"
    if how == "missing":
        victim.unlink()
    else:
        victim.write_bytes(victim.read_bytes()[:SEGMENT // 3 if how == "short" else 0])
    with pytest.raises(errors.CorruptStore, match="has a hole"):
        mqlog.open(store, implementation=impl, **CONFIG)
    report = repair(store)
    assert report.files and report.lost
    with mqlog.open(store, implementation=impl, **CONFIG) as opened:
        held = _read_all(opened)
        assert sum(map(len, held.values())) == RECORDS  # fillers keep every offset
        intact = [r for records in held.values() for r in records
                  if not r.attributes & fmt.ATTR_FILLER]
        assert all(r.body == _body(int.from_bytes(r.body[:4], "little")) for r in intact)
        assert all(not 2 * SEGMENT <= r.position < 3 * SEGMENT or how == "short"
                   for r in intact)
        for key in range(9):  # no index entry points into the mended segment
            for record in opened.query("a", f"k{key}", max_count=1000):
                assert record.key == f"k{key}" and not record.attributes & fmt.ATTR_FILLER


def test_repair_leaves_a_healthy_store_and_a_damaged_tail_alone(tmp_path, impl):
    store = tmp_path / "store"
    _build(store, impl)
    before = _segments(store)
    assert repair(store).clean
    assert _segments(store) == before
    with mqlog.open(store, implementation=impl, read_only=True) as snapshot:
        written = snapshot.written_position
    _flip(store, written - 5)  # inside the last record
    (store / "flushed").rename(tmp_path / "flushed")  # as a store written before the file
    assert repair(store).clean  # a damaged tail is recovery's to cut
    with mqlog.open(store, implementation=impl, **CONFIG) as opened:
        assert opened.recovery_report.clean  # a clean close: reads find it, not the open
    # The close saved the flushed position at the log's end: the damaged last record was
    # acknowledged as flushed, recovery would refuse it, and repair cuts it.
    (tmp_path / "flushed").rename(store / "flushed")
    (start, end, how) = repair(store).acknowledged_tail
    assert start < written - 5 and end == written and how.startswith("cut"), how
    with mqlog.open(store, implementation=impl, **CONFIG) as opened:
        assert opened.recovery_report.truncated_at == start


def test_repair_refuses_an_open_store(tmp_path, impl):
    store = tmp_path / "store"
    _build(store, impl)
    with mqlog.open(store, implementation=impl, **CONFIG), pytest.raises(errors.StoreLocked):
        repair(store)
    with pytest.raises(errors.StoreNotFound):
        repair(tmp_path / "nothing")
    assert not os.path.exists(tmp_path / "nothing")
