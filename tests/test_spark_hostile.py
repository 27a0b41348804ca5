"""The Spark source against stores that change or break under it (a hostile review).

A read is planned on the driver from one snapshot and read later, partition by
partition, in workers that each open their own: whatever retention, a truncation or a
replica's reset did in between, every read either returns exactly the planned snapshot's
rows (checked against the engine's read API at planning time) or fails with
``StoreChanged``, never fewer rows or rows of two histories. Most checks call the
planner and the partition reader directly (what Spark's driver and tasks run), so that
the change can be made between the two; one goes through a real Spark session.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import shutil
import threading

import pytest

import mqlog
from mqlog.config import PAGE_SIZE
from mqlog.engine.checkpoint import ChangeCount
from mqlog.engine.store import StorePaths
from mqlog.errors import ConsumeQueueMismatch, CorruptStore, StoreChanged
from tests.conftest import SMALL, local_spark_session

pytest.importorskip("pyspark", reason="pyspark is not installed (the spark extra)")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (the spark extra)")

from mqlog.spark_connector import options as opts  # noqa: E402
from mqlog.spark_connector import planner  # noqa: E402
from mqlog.spark_connector.datasource import read_partition  # noqa: E402


@pytest.fixture(scope="module")
def spark():
    return local_spark_session()  # (the session test_spark.py's fixture made, if it ran)


def _fill(path, rng, count=600, impl=None):
    with mqlog.open(path, implementation=impl, **SMALL) as store:
        for index in range(count):
            store.put("t", rng.randbytes(rng.randrange(1, 300)), index % 2)
    return path


def _plan(path, mode="queue"):
    options = opts.parse({"path": str(path), "mode": mode}, None, 2)
    return options, planner.plan(options)


def _read(options, parts):
    """(queue_id, offset, position, body) of every row the partitions give."""
    rows = []
    for part in parts:
        for batch in read_partition(part, options):
            rows.extend(zip(*(batch.column(name).to_pylist()
                              for name in ("queue_id", "offset", "position", "body")),
                            strict=True))
    return sorted(rows)


def _engine(store):
    rows = []
    for topic, queue_id in store.queues():
        offset = store.min_offset(topic, queue_id)
        while offset < store.max_offset(topic, queue_id):
            for record in store.get(topic, queue_id, offset, 1000, 1 << 24):
                rows.append((record.queue_id, record.offset, record.position, record.body))
                offset = record.offset + 1
    return sorted(rows)


def _retention(store, rng):
    store.trim_front(store.segments()[1][0])  # the first segment goes


def _truncation(store, rng):
    store.truncate(store.get("t", 0, 200, 1)[0].position)


def _truncation_and_new_writes(store, rng):
    _truncation(store, rng)
    for index in range(300):  # as many offsets again: only the records differ
        store.put("t", rng.randbytes(50), index % 2)


def _reset(store, rng):
    store.reset(store.written_position + 4096, [(store.epoch, 0)])


@pytest.mark.parametrize("change", [_retention, _truncation, _truncation_and_new_writes,
                                    _reset])
def test_a_store_changed_between_planning_and_reading_fails_the_read(tmp_path, rng,
                                                                     impl, change):
    """Before: the reader clamped the planned range to what its own snapshot held, so
    retention, a truncation or a reset made it return fewer rows (or other records at
    the planned offsets) without an error."""
    path = _fill(tmp_path / "s", rng)
    options, parts = _plan(path)
    assert all(piece.marks for part in parts for piece in getattr(part, "ranges", [part]))
    with mqlog.open(path, read_only=True) as store:
        assert _read(options, parts) == _engine(store)
    with mqlog.open(path, implementation=impl, **SMALL) as store:
        change(store, rng)
    with pytest.raises(StoreChanged, match="load the DataFrame again"):
        _read(options, parts)
    options, parts = _plan(path)  # planned again: what the store holds now
    with mqlog.open(path, read_only=True) as store:
        assert _read(options, parts) == _engine(store)


def test_a_range_ending_before_a_segments_closing_blank_is_marked(tmp_path, impl):
    """read_raw answers a segment's last record with the blank that closes the segment:
    the planner took that for an unreadable record and left the range unmarked, so its
    read clamped to what the store held by then (a truncation lost rows without an
    error; CI seed 3833965536 of the test above)."""
    path = tmp_path / "s"
    with mqlog.open(path, implementation=impl, **SMALL) as store:
        body = bytes(100)
        while SMALL["segment_size_bytes"] - store.written_position > 2 * len(body):
            store.put("t", body, 0)
        store.put("u", bytes(4 * len(body)), 0)  # does not fit: a blank closes segment 0
        assert store.get("u", 0, 0, 1)[0].position == store.segments()[1][0]
    options, parts = _plan(path)
    assert all(piece.marks for part in parts for piece in getattr(part, "ranges", [part]))
    with mqlog.open(path, implementation=impl, **SMALL) as store:
        _truncation(store, None)
    with pytest.raises(StoreChanged, match="load the DataFrame again"):
        _read(options, parts)


@pytest.mark.parametrize("under_way", [True, False])
def test_a_read_failing_during_a_change_that_has_not_reached_the_marks_is_store_changed(
        tmp_path, rng, under_way):
    """A truncation in another process cuts queue entries before the records (and
    lowers the flushed position before either): a read failing in between, with both
    marked records still on disk, raised the raw ConsumeQueueMismatch or CorruptRecord
    (1 run in 20 of the writer-process test below). The change count tells: changed
    since planning is StoreChanged; the same count is damage, and said so."""
    path = _fill(tmp_path / "s", rng)
    options, parts = _plan(path)
    last_queue_file = max((tmp_path / "s" / "consumequeue" / "t" / "1").iterdir())
    if under_way:  # a change's first step: its entries cut, its records not yet
        counter = ChangeCount(StorePaths(path).changes)
        with counter.changing():
            last_queue_file.unlink()
            with pytest.raises(StoreChanged, match="load the DataFrame again"):
                _read(options, parts)
        counter.close()
    else:
        last_queue_file.unlink()
        with pytest.raises(ConsumeQueueMismatch, match="lacks entries"):
            _read(options, parts)


def test_a_read_planned_during_a_change_says_how_to_mend_a_dead_writers(tmp_path, rng):
    """Planned while the count was odd, a failing read is StoreChanged; if the change's
    writer died part way, the count stays odd until a writable open, and so does every
    such read: the error says what to do."""
    path = _fill(tmp_path / "s", rng)
    counter = ChangeCount(StorePaths(path).changes)
    with counter.changing():
        options, parts = _plan(path)
    counter.close()
    max((tmp_path / "s" / "consumequeue" / "t" / "1").iterdir()).unlink()
    with pytest.raises(StoreChanged, match="open the store for writing once"):
        _read(options, parts)


def test_a_range_with_damage_when_planned_fails_rather_than_shrinks(tmp_path, rng):
    """A range whose last record was damaged when the planner looked has no marks: it
    was read "as the store is now", so once a truncation had cut the damaged record the
    read returned the rest without an error (599 rows of the 600 planned). A planned
    range is whole or fails, marks or not."""
    path = _fill(tmp_path / "s", rng)
    with mqlog.open(path, read_only=True) as store:
        damaged = store.get("t", 0, store.max_offset("t", 0) - 1, 1)[0]
        assert damaged.position + len(damaged.raw) < store.written_position, "test set-up"
    segment = max(file for file in (path / "commitlog").iterdir()
                  if int(file.name) <= damaged.position)
    with open(segment, "r+b") as file:  # (the body's last byte: only its CRC fails)
        file.seek(damaged.position - int(segment.name) + len(damaged.raw) - 1)
        byte = file.read(1)[0]
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte ^ 0x10]))
    options, parts = _plan(path)
    [planned] = [piece for part in parts for piece in getattr(part, "ranges", [part])
                 if piece.queue_id == 0]
    assert not planned.marks, "test set-up"
    with mqlog.open(path, **SMALL) as store:
        store.truncate(damaged.position)
    with pytest.raises(StoreChanged, match="load the DataFrame again"):
        _read(options, [planned])


def test_commitlog_mode_over_a_deleted_segment_fails_typed(tmp_path, rng):
    path = _fill(tmp_path / "s", rng)
    options, parts = _plan(path, "commitlog")
    with mqlog.open(path, **SMALL) as store:
        _retention(store, rng)
    with pytest.raises(StoreChanged, match="was deleted after this read was planned"):
        _read(options, parts)


def _change_at_random(store, rng, lock, done):
    """Append, truncate or trim (retention) at random, a step per hold of ``lock``,
    until ``done``."""
    while not done.is_set():
        with lock:
            step = rng.random()
            if step < 0.3:
                for index in range(rng.randrange(1, 40)):
                    store.put("t", rng.randbytes(rng.randrange(1, 300)), index % 2)
            elif step < 0.6:  # (a sync-flush store writes a batch with one pwrite)
                store.put_batch("t", [rng.randbytes(rng.randrange(1, 300))
                                      for _ in range(rng.randrange(1, 40))], rng.randrange(2))
            elif step < 0.85:
                low = store.min_offset("t", 0)
                high = store.max_offset("t", 0)
                if high - low > 50:
                    at = rng.randrange(low + 1, high)
                    store.truncate(store.get("t", 0, at, 1)[0].position)
            else:
                store.trim_front(max(0, store.written_position - (48 << 10)))


_WRITER_SETTINGS = {**SMALL, "retention_check_interval_ms": 1 << 30}


def _writer_process(path, seed, lock, done, ready, flush_mode):
    """The writer of the cross-process case: its own interpreter, the store open
    writable there (the reads are planned and read in the test's process). It ends
    with the test's process, however that ends (a crash there once left it writing for
    hours, a lock held by the dead process or not)."""
    parent = multiprocessing.parent_process()
    assert parent is not None
    threading.Thread(target=lambda: (parent.join(), os._exit(1)), daemon=True).start()
    with mqlog.open(path, **_WRITER_SETTINGS, flush_mode=flush_mode) as store:
        ready.set()
        _change_at_random(store, random.Random(seed), lock, done)


@contextlib.contextmanager
def _writer_beside(path, where, seed, flush_mode="async"):
    """A writer changing the store at ``path`` at random, in a thread of this process or
    in a process of its own; yields the lock each of its steps holds."""
    if where == "thread":
        lock, done, failures = threading.Lock(), threading.Event(), []

        def write(store):
            try:
                _change_at_random(store, random.Random(seed), lock, done)
            except BaseException as error:  # noqa: BLE001 - the test reports it
                failures.append(error)

        with mqlog.open(path, **_WRITER_SETTINGS, flush_mode=flush_mode) as store:
            writer = threading.Thread(target=write, args=(store,))
            writer.start()
            try:
                yield lock
            finally:
                done.set()
                writer.join()
        assert not failures, failures
        return
    context = multiprocessing.get_context("spawn")
    lock, done, ready = context.Lock(), context.Event(), context.Event()
    child = context.Process(target=_writer_process, args=(str(path), seed, lock, done, ready,
                                                               flush_mode))
    child.start()
    try:
        assert ready.wait(120), "the writer process did not open the store"
        yield lock
    finally:
        done.set()
        child.join(120)
    assert child.exitcode == 0, f"the writer process ended with {child.exitcode}"


@pytest.mark.parametrize("where, flush_mode", [("thread", "async"), ("process", "async"),
                                               ("process", "sync")])
def test_reads_beside_a_writer_that_appends_truncates_and_trims_are_exact_or_fail(
        tmp_path, seed, where, flush_mode):
    """A writer appends, truncates and trims (retention) at random while reads are
    planned and read: each read gives exactly the rows the engine showed when it was
    planned, or StoreChanged. The writer is a thread of this process, or a process of
    its own (what a Spark job reading a live broker's store sees: the store's files
    change under mappings another process writes through, or, a sync-flush store's
    batches, with pwrite)."""
    rng = random.Random(seed)
    path = _fill(tmp_path / "s", rng, count=400)
    outcomes = {"exact": 0, "changed": 0}
    with _writer_beside(path, where, rng.random(), flush_mode) as lock:
        for _round in range(25):
            with lock:
                options, parts = _plan(path)
                with mqlog.open(path, read_only=True) as snapshot:
                    expected = _engine(snapshot)
            try:
                got = _read(options, parts)
            except StoreChanged:
                outcomes["changed"] += 1
                continue
            assert got == expected, f"seed {seed}: rows of another snapshot"
            outcomes["exact"] += 1
    assert outcomes["exact"] + outcomes["changed"] == 25, outcomes
    print(outcomes)


def test_a_dataframe_read_again_after_a_truncation_fails_rather_than_miscount(spark,
                                                                              tmp_path, rng):
    """A DataFrame's partitions are fixed by its first action: before, a later count
    after a truncation counted what was left (400 of 600) without an error."""
    path = _fill(tmp_path / "s", rng)
    frame = spark.read.format("mqlog").option("path", str(path)).load()
    assert frame.count() == 600
    with mqlog.open(path, **SMALL) as store:
        _truncation(store, rng)
    with pytest.raises(Exception, match="StoreChanged"):
        frame.count()


def test_a_last_segment_cut_short_is_corrupt_store_not_an_assertion(tmp_path, rng, impl):
    """A copy whose last segment file is shorter than its checkpoint says: read-only
    opens (every Spark read) failed with an AssertionError from the log core."""
    path = _fill(tmp_path / "s", rng)
    with mqlog.open(path, **SMALL) as store:
        while store.written_position % SMALL["segment_size_bytes"] < 2 * PAGE_SIZE:
            store.put("t", b"more")
        written, last = store.written_position, store.segments()[-1][0]
    # a page of it kept (a file under a page is refused as such, another error)
    os.truncate(path / "commitlog" / f"{last:020d}", PAGE_SIZE)
    with pytest.raises(CorruptStore, match="cut short"):
        mqlog.open(path, read_only=True, implementation=impl)
    options, parts = _plan(path, "commitlog")  # forensics still walk what is there
    rows = _read(options, parts)
    assert rows and max(row[2] for row in rows) < written


def _walked(path, min_partitions):
    """(position, crc_ok) of every row of a commit-log read cut into at least
    ``min_partitions`` partitions."""
    options = opts.parse({"path": str(path), "mode": "commitlog",
                          "minPartitions": str(min_partitions)}, None, 2)
    return sorted((position, ok) for part in planner.plan(options)
                  for batch in read_partition(part, options)
                  for position, ok in zip(batch.column("position").to_pylist(),
                                          batch.column("crc_ok").to_pylist(), strict=True))


def test_commitlog_mode_searches_past_a_damaged_size_and_a_zeroed_record(tmp_path):
    """A record's size field damaged (+1000): the walk stepped by it and hid the intact
    records it covered, how many depending on where partitions were cut (14, then 20
    rows). A record zeroed in a sealed segment (a lost page) ended that segment's walk,
    hiding every record after it, with no row flagged. Now every record is a row once,
    the damaged one with crc_ok false, however the read is cut; a zeroed one is gone."""
    path = tmp_path / "s"
    with mqlog.open(path, **SMALL) as store:
        positions = [store.put("t", b"%05d" % n + b"y" * 95).position for n in range(1000)]
        assert len(store.segments()) > 2
    segment = path / "commitlog" / f"{0:020d}"
    with open(segment, "r+b") as file:
        file.seek(positions[5])
        size = int.from_bytes(file.read(4), "little")
        file.seek(positions[5])
        file.write((size + 1000).to_bytes(4, "little"))
        file.seek(positions[50])
        file.write(bytes(positions[51] - positions[50]))
    expected = [(position, position != positions[5]) for position in positions
                if position != positions[50]]
    for min_partitions in (1, 4, 10, 40):
        assert _walked(path, min_partitions) == expected, min_partitions


def test_stray_entries_named_like_store_files_are_ignored(tmp_path, rng):
    """A directory named like a segment (or a consume-queue file) is not one: commit-log
    mode tried to open it (IsADirectoryError); the engine ignores such entries."""
    path = _fill(tmp_path / "s", rng, count=200)
    os.mkdir(path / "commitlog" / f"{1 << 40:020d}")
    os.mkdir(path / "consumequeue" / "t" / "0" / f"{1 << 20:020d}")
    shutil.copy(path / "meta.json", path / "commitlog" / "12345")
    with mqlog.open(path, read_only=True) as store:
        expected = _engine(store)
    for mode in ("queue", "commitlog"):
        options, parts = _plan(path, mode)
        assert _read(options, parts) == expected, mode
