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

import json
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


# --- what consumers see of damage and of lost records (new-user review) -----------------


def _run_cli(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    """``mqlog args...`` in this process: (exit status, stdout, stderr)."""
    from mqlog import cli

    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        cli.main([str(arg) for arg in args])
    out, err = capsys.readouterr()
    return int(exited.value.code or 0), out, err


def _numbered(path: Path, impl: str, count: int = 300) -> list[mqlog.PutResult]:
    """``count`` records "1", "2", ... in queue t/0 (as `seq 1 N | mqlog produce`), closed
    cleanly: every one acknowledged as flushed."""
    with mqlog.open(path, implementation=impl, **CONFIG) as store:
        return [store.put("t", str(number).encode()) for number in range(1, count + 1)]


def _flip_body(path: Path, result: mqlog.PutResult) -> None:
    """Flip a bit of the last byte (the body's) of the record ``result`` names."""
    _flip(path, result.position + result.size - 1)


def test_a_lost_record_is_marked_lost_by_record_and_by_consume_dump_and_query(
        tmp_path, impl, capsys):
    """New-user review, item 1: after `mqlog repair` a lost record reached consumers as an
    ordinary message whose body was the filler's padding, b"\\x00\\x00": consume printed
    `\\x00\\x00`, --json `"body": "\\u0000\\u0000"`, dump `"control": false`, and Record
    had nothing but ``attributes & 2`` to tell it by. Now ``Record.lost`` says it (both
    cores, its repr too), and consume, dump and query mark it: text that no body prints
    as, JSON ``"lost": true`` with a null body (docs/CLI.md)."""
    store = tmp_path / "store"
    results = _numbered(store, impl)
    _flip_body(store, results[66])
    assert repair(store).lost[0].first == 66
    with mqlog.open(store, implementation=impl, read_only=True) as opened:
        records = opened.get("t", 0, 0, 300)
        assert [record.offset for record in records] == list(range(300))
        assert [record.lost for record in records] == [offset == 66 for offset in range(300)]
        assert "lost=True" in repr(records[66]) and "body" not in repr(records[66])
        assert "lost" not in repr(records[65])
    status, out, _ = _run_cli(capsys, "consume", store, "--topic", "t")
    lines = out.splitlines()
    assert status == 0 and len(lines) == 300
    assert lines[64:69] == ["65", "66", "\\lost t/0 offset 66", "68", "69"]
    status, out, _ = _run_cli(capsys, "consume", store, "--topic", "t", "--json")
    objects = [json.loads(line) for line in out.splitlines()]
    assert objects[66]["lost"] is True and objects[66]["body"] is None
    assert objects[66]["offset"] == 66 and "body_encoding" not in objects[66]
    assert all("lost" not in item for index, item in enumerate(objects) if index != 66)
    status, out, _ = _run_cli(capsys, "dump", store)
    lines = out.splitlines()
    assert lines[66].endswith(" lost: true") and " body: " not in lines[66]
    assert " offset: 66 " in lines[66] and lines[65].endswith(" body: 66")
    status, out, _ = _run_cli(capsys, "dump", store, "--json")
    objects = [json.loads(line) for line in out.splitlines()]
    assert [item["lost"] for item in objects] == [index == 66 for index in range(300)]
    assert objects[66]["body"] is None and objects[66]["control"] is False
    status, out, _ = _run_cli(capsys, "query", store, "--topic", "t", "--time", "..",
                              "--max", "300")
    marked = [line for line in out.splitlines() if line.endswith(" lost: true")]
    assert len(marked) == 1 and " offset: 66 " in marked[0]


def test_consume_prints_the_records_before_mid_log_damage_then_names_it(tmp_path, impl,
                                                                         capsys):
    """New-user review, item 3: `mqlog consume` on a store damaged mid-log printed none
    of the intact records before the damage (a read of 100 raised for the whole batch),
    only the error; `--max 10` printed 10. Now it prints every record before the damaged
    one, then one error line naming its position (Kafka's behaviour, and dump's)."""
    store = tmp_path / "store"
    results = _numbered(store, impl)
    _flip_body(store, results[66])
    status, out, err = _run_cli(capsys, "consume", store, "--topic", "t")
    assert status == 1
    assert out.splitlines() == [str(number) for number in range(1, 67)]
    assert f"corrupt record at position {results[66].position}" in err
    assert len(err.splitlines()) == 1


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` and its bytes."""
    return {str(path.relative_to(root)): path.read_bytes()
            for path in sorted(root.rglob("*")) if path.is_file()}


def _last_record_end(store: Path, impl: str) -> int:
    with mqlog.open(store, implementation=impl, read_only=True) as snapshot:
        return snapshot.written_position


_DAMAGE = {  # what each case does to the store (and, for some, to its replica)
    "one-record": lambda store, end: _flip(store, 3000),
    "two-ranges": lambda store, end: (_flip(store, 3000), _flip(store, 3 * SEGMENT + 5000)),
    "missing-segment": lambda store, end: (store / "commitlog" / f"{2 * SEGMENT:020d}").unlink(),
    "short-segment": lambda store, end: _cut_segment(store, 2, SEGMENT // 3),
    "empty-segment": lambda store, end: _cut_segment(store, 2, 0),
    "acknowledged-tail": lambda store, end: _flip(store, end - 5),
    "mid-log-and-tail": lambda store, end: (_flip(store, 3000), _flip(store, end - 5)),
    "zeros-mid-log": lambda store, end: _zero_records(store, 1, 100, 3),
}


def _record_starts(store: Path, index: int) -> list[int]:
    """The positions of the records in segment ``index``, as the log holds them now."""
    data = (store / "commitlog" / f"{index * SEGMENT:020d}").read_bytes()
    return [index * SEGMENT + step.offset for step in fmt.walk(data, index * SEGMENT)
            if step.kind == "record"]


def _zero(store: Path, start: int, end: int) -> None:
    """Zeros over [start, end) (one segment's)."""
    name = store / "commitlog" / f"{start - start % SEGMENT:020d}"
    data = bytearray(name.read_bytes())
    data[start % SEGMENT:end - start + start % SEGMENT] = bytes(end - start)
    name.write_bytes(bytes(data))


def _zero_records(store: Path, index: int, first: int, count: int | None) -> tuple[int, int]:
    """Zero ``count`` records of segment ``index`` from its record ``first`` (None: to
    the segment's end); returns the range zeroed."""
    starts = _record_starts(store, index)
    start = starts[first]
    end = (index + 1) * SEGMENT if count is None else starts[first + count]
    _zero(store, start, end)
    return start, end


def _cut_segment(store: Path, index: int, size: int) -> None:
    victim = store / "commitlog" / f"{index * SEGMENT:020d}"
    victim.write_bytes(victim.read_bytes()[:size])


@pytest.mark.parametrize("replica", ["none", "intact", "damaged"])
@pytest.mark.parametrize("damage", sorted(_DAMAGE))
def test_a_dry_run_says_exactly_what_the_repair_then_does(tmp_path, impl, damage, replica):
    """New-user review, item 2: with one damaged record mid-log, `repair --dry-run`
    announced that the next open would cut 147952 bytes of acknowledged records (it
    looked for the log's end without the damage blanked), then the 75 bytes blanked;
    the real repair blanked the 75 bytes and cut nothing. Now the dry run plans exactly
    as the repair does, for every kind of damage, with or without a replica (whole, or
    damaged at the same places), and changes no byte."""
    store, copy = tmp_path / "store", tmp_path / "replica"
    _build(store, impl)
    end = _last_record_end(store, impl)
    if replica != "none":
        shutil.copytree(store, copy)
    _DAMAGE[damage](store, end)
    if replica == "damaged":
        _DAMAGE[damage](copy, end)
    source = copy if replica != "none" else None
    before = _tree(store)
    planned = repair(store, source, dry_run=True)
    assert _tree(store) == before  # not a byte changed, nothing added
    done = repair(store, source)
    assert planned.lines() == [line for line in done.lines()
                               if not line.startswith("the bytes replaced are saved")]
    assert planned.acknowledged_tail == done.acknowledged_tail
    assert [(piece.start, piece.end, piece.how, piece.fillers) for piece in planned.pieces] \
        == [(piece.start, piece.end, piece.how, piece.fillers) for piece in done.pieces]
    with mqlog.open(store, implementation=impl, **CONFIG) as opened:  # (it did mend)
        assert sum(map(len, _read_all(opened).values())) > 0


def test_repair_dry_run_on_the_command_line_prints_the_repairs_lines(tmp_path, impl,
                                                                      capsys):
    """The review's case end to end: one damaged record mid-log, every record
    acknowledged as flushed. The dry run prints the one blanked range and the offset
    lost, as the real repair then does, and no cut of acknowledged records."""
    store = tmp_path / "store"
    results = _numbered(store, impl)
    _flip_body(store, results[66])
    status, dry, _ = _run_cli(capsys, "repair", store, "--dry-run")
    assert status == 0 and "acknowledged" not in dry
    status, real, _ = _run_cli(capsys, "repair", store)
    assert status == 0
    assert dry.splitlines()[:-1] == real.splitlines()[:-2]  # (less "saved in", summary)
    assert dry.splitlines()[-1].startswith("dry run: 1 damaged range(s) to mend, 1 record")
    with mqlog.open(store, implementation=impl, read_only=True) as opened:
        assert opened.max_offset("t", 0) == 300


# --- hostile review of repair ------------------------------------------------------------


@pytest.mark.parametrize("count", [3, None], ids=["three-records", "to-segment-end"])
def test_zeros_with_intact_records_after_them_are_blanked_not_cut(tmp_path, impl, count):
    """Hostile review, item 1: three records zeroed from a record boundary in segment 1,
    three intact segments after them, everything flushed. Repair took the zeros for the
    log's end and cut every acknowledged record after them ("[98423, 298864): ...
    acknowledged ... cut"): 800 intact records lost, where a flipped byte loses only
    the 3. Zeros before the saved flushed position with an intact record after them are
    damage like any other: blanked, a filler per lost record, nothing cut."""
    store = tmp_path / "store"
    _build(store, impl)
    with mqlog.open(store, implementation=impl, read_only=True) as opened:
        original = _read_all(opened)
    start, end = _zero_records(store, 1, 100, count)
    (store / "checkpoint").unlink()  # (a clean open would scan nothing)
    with pytest.raises(errors.CorruptStore, match="acknowledged"):
        mqlog.open(store, implementation=impl, **CONFIG)
    planned = repair(store, dry_run=True)
    report = repair(store)
    assert planned.lines() == report.lines()[:-1]  # (less "saved in")
    assert report.acknowledged_tail is None
    assert [(piece.start, piece.end, piece.how) for piece in report.pieces] == \
        [(start, end, "blank")]
    zeroed = sum(gap.count for gap in report.lost)
    assert zeroed == len(report.pieces[0].fillers) and (count is None or zeroed == count)
    with mqlog.open(store, implementation=impl, **CONFIG) as opened:
        assert opened.recovery_report.truncated_at is None
        held = _read_all(opened)
    assert held.keys() == original.keys()
    for queue, records in held.items():
        assert len(records) == len(original[queue])
        for got, want in zip(records, original[queue], strict=True):
            if start <= want.position < end:
                assert got.lost and got.offset == want.offset
            else:
                assert bytes(got.raw) == bytes(want.raw)


def test_zeros_past_what_was_flushed_still_end_the_log(tmp_path, impl):
    """What item 1's fix must not touch: past the saved flushed position and the
    checkpoint's, zeros with intact records after them are a truncation's crash (it
    lowers both, then zeroes the tail before it deletes later segments) or a torn tail:
    the log's end, for the next open to cut, not damage to blank."""
    store = tmp_path / "store"
    _build(store, impl)
    start, _end = _zero_records(store, 1, 100, None)
    (store / "flushed").unlink()
    (store / "checkpoint").unlink()
    assert repair(store).clean
    with mqlog.open(store, implementation=impl, **CONFIG) as opened:
        assert opened.written_position == start


def test_repair_from_another_stores_directory_is_refused(tmp_path, impl):
    """Hostile review, item 2: `repair --from` another partition's store (same topic and
    queue, same record sizes, other bodies) copied that store's records in as this
    one's, since they verify at their positions. Now the intact records next to the
    damaged range must be the same in both stores: they are not, so repair refuses
    (ReplicaDataRejected naming the replica), dry run or not, and changes nothing."""
    store, other = tmp_path / "orders-0", tmp_path / "orders-1"
    for path, fill in ((store, b"A"), (other, b"B")):
        with mqlog.open(path, implementation=impl, **CONFIG) as opened:
            results = [opened.put("orders", fill * 100 + b"%06d" % index)
                       for index in range(500)]
    _flip_body(store, results[200])
    before = _tree(store)
    for dry_run in (True, False):
        with pytest.raises(errors.ReplicaDataRejected, match="not a replica of this store"):
            repair(store, other, dry_run=dry_run)
        after = _tree(store)
        after.pop("changes"), before.pop("changes", None)  # (the change count moved)
        assert after == before
    report = repair(store)  # (without --from: blanked, one record lost)
    assert [(gap.first, gap.count) for gap in report.lost] == [(200, 1)]


def test_repair_from_a_directory_that_is_no_store_is_refused(tmp_path, impl):
    """Hostile review, item 3: `repair --from` a directory that is not a store (no
    commitlog/) was taken as a replica that verified nothing: every damaged range was
    blanked, and a missing segment made anew. Now it is StoreNotFound naming the
    directory, before anything is done."""
    store, elsewhere = tmp_path / "store", tmp_path / "notastore"
    _build(store, impl)
    elsewhere.mkdir()
    (store / "commitlog" / f"{SEGMENT:020d}").unlink()
    before = _tree(store)
    for dry_run in (True, False):
        with pytest.raises(errors.StoreNotFound, match="notastore"):
            repair(store, elsewhere, dry_run=dry_run)
        assert _tree(store) == before


def test_records_lost_at_the_head_of_a_queue_are_reported_and_marked_lost(tmp_path, impl):
    """Hostile review, item 4: the first record of a queue damaged. Repair saw no gap
    (no record of the queue before it) and reported no loss; the queue started at
    offset 1 after it, offset 0 gone without a trace. The old queue manifest knew the
    queue started at 0: now offset 0 is reported lost and reads as a filler."""
    store = tmp_path / "store"
    results = _numbered(store, impl)
    _flip_body(store, results[0])
    planned = repair(store, dry_run=True)
    report = repair(store)
    assert planned.lines() == report.lines()[:-1]
    assert [(gap.topic, gap.first, gap.count) for gap in report.lost] == [("t", 0, 1)]
    with mqlog.open(store, implementation=impl, read_only=True) as opened:
        records = opened.get("t", 0, 0, 300)
        assert [record.offset for record in records] == list(range(300))
        assert [record.lost for record in records] == [offset == 0 for offset in range(300)]
