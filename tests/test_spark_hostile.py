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
from dataclasses import replace

import pytest

import mqlog
from mqlog.config import PAGE_SIZE
from mqlog.engine.checkpoint import ChangeCount
from mqlog.engine.store import StorePaths
from mqlog.errors import ConsumeQueueMismatch, CorruptStore, StoreChanged
from tests.conftest import SMALL, local_spark_session

pytest.importorskip("pyspark", reason="pyspark is not installed (the spark extra)")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (the spark extra)")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from mqlog.spark_connector import options as opts  # noqa: E402
from mqlog.spark_connector import planner, reader  # noqa: E402
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


def _counted_read(path, tmp_path):
    """The rows (as ``_read``) of a queue-mode read of ``path`` and the bytes it read."""
    metrics = tmp_path / "metrics"
    options = opts.parse({"path": str(path), "metricsDir": str(metrics)}, None, 2)
    rows = _read(options, planner.plan(options))
    return rows, sum(found["bytes"] for found in reader.load_counters(str(metrics)))


def test_a_queue_among_many_is_not_read_through_the_others_records(tmp_path):
    """Records of 32 queues written round-robin: each queue's gaps (the other 31's
    records, ~32 KiB) were under GAP_BYTES (256 KiB), so every chunk read through them
    and a full read read the log 32 times over. Now a gap is read through only when it is
    small next to the record after it: about the log, once."""
    rng = random.Random(41)
    path = tmp_path / "s"
    with mqlog.open(path, **SMALL) as store:
        for index in range(1600):
            store.put("t", rng.randbytes(1000), index % 32)
        written = store.written_position
    rows, read = _counted_read(path, tmp_path)
    with mqlog.open(path, read_only=True) as store:
        assert rows == _engine(store)
    assert read <= 2 * written, f"read {read} bytes of a {written}-byte log"


def test_a_chunk_reads_at_most_chunk_bytes_gaps_and_closing_blanks_included(
        tmp_path, monkeypatch):
    """A chunk was limited by its records' own bytes, not by what it read: the gaps read
    through (and a segment's closing blank, which read_raw adds to a run's end) came on
    top, so one chunk's joined buffer grew with the span of log it covered (past 2 GiB,
    Arrow's int32 offsets wrapped: ArrowInvalid). Tested with a small CHUNK_BYTES: no
    chunk's pieces hold more than it, or more than the span from its first record's
    start to its last one's end."""
    monkeypatch.setattr(reader, "CHUNK_BYTES", 16 << 10)
    rng = random.Random(42)
    path = tmp_path / "s"
    with mqlog.open(path, **SMALL) as store:
        for index in range(1200):  # queue 1's records lie in queue 0's gaps, and back
            store.put("t", rng.randbytes(rng.randrange(900, 1600)), index % 2)
            if index % 7 == 0:
                store.put("u", rng.randbytes(rng.randrange(100, 12000)), 0)
    seen = []
    fetch = reader.fetch

    def measured(store, entries, counters):
        fetched = fetch(store, entries, counters)
        span = int(entries["position"][-1]) + int(entries["size"][-1]) - \
            int(entries["position"][0])
        seen.append((sum(len(piece) for piece in fetched.pieces), span,
                     int(entries["size"].max())))
        return fetched

    monkeypatch.setattr(reader, "fetch", measured)
    rows, _read_bytes = _counted_read(path, tmp_path)
    with mqlog.open(path, read_only=True) as store:
        assert rows == _engine(store)
    assert len(seen) > 20, "test set-up: many chunks"
    for pieces, span, largest in seen:
        assert pieces <= max(reader.CHUNK_BYTES, largest) and pieces <= span, seen


def test_a_record_past_2_gib_of_a_buffer_is_cut_right(tmp_path):
    """layout cut spans with int32 offsets: a record starting past 2 GiB of its buffer
    (a reader's joined chunk, before chunks were bounded by what they read) came out as
    ArrowInvalid "Negative offsets" or another record's bytes. (The buffer is zeros
    mapped on demand: only the record's pages are touched.)"""
    from mqlog.spark_connector import layout

    with mqlog.open(tmp_path / "s", **SMALL) as store:
        store.put("t", b"far away", 3, key="k", tags="x")
        raw = store.read_raw(0, 1 << 20)
    buffer = np.zeros((1 << 31) + (1 << 16), np.uint8)
    at = (1 << 31) + 1000
    buffer[at:at + len(raw)] = np.frombuffer(raw, np.uint8)
    spans = layout.slice_binary(pa.py_buffer(buffer), np.array([10, at], np.int64),
                                np.array([12, at + 4], np.int64))
    assert spans.type == pa.binary() and spans.to_pylist() == [b"\0\0", raw[:4]]
    batch = layout.build_batch(buffer, np.array([at]), "r")
    assert batch.to_pydict() | {"timestamp": None, "born_timestamp": None} == {
        "topic": ["t"], "queue_id": [3], "offset": [0], "position": [0], "epoch": [0],
        "timestamp": None, "born_timestamp": None, "key": ["k"], "tags": ["x"],
        "properties": [[]], "body": [b"far away"], "crc_ok": [True], "lost": [False],
        "replica": ["r"]}


@pytest.mark.parametrize(("ddl", "said"), [
    ("offset BIGINT, key STRING NOT NULL", "declares key NOT NULL.*declare it as key STRING"),
    ("offset BIGINT, body BINARY, offset BIGINT", "names column offset twice"),
])
def test_a_schema_with_a_not_null_or_a_repeated_column_is_refused(ddl, said):
    """A user schema declaring a column NOT NULL was taken: Spark then answered
    ``key IS NULL`` from the schema (0 rows where there were some) and failed on the
    first null; a column named twice failed deep in the JVM. Both are InvalidArgument,
    saying what to do."""
    from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

    from mqlog.errors import InvalidArgument
    from mqlog.spark_connector import schema

    kinds = {"BIGINT": LongType(), "STRING": StringType(), "BINARY": BinaryType()}
    fields = []
    for column in ddl.split(", "):
        name, kind, *rest = column.split(" ")
        fields.append(StructField(name, kinds[kind], nullable=not rest))
    with pytest.raises(InvalidArgument, match=said):
        schema.projection(StructType(fields))


def test_spark_refuses_a_not_null_schema_when_it_reads(spark, tmp_path):
    path = tmp_path / "s"
    with mqlog.open(path, **SMALL) as store:
        store.put("t", b"a", 0, key="k")
        store.put("t", b"b", 0)
    frame = spark.read.format("mqlog").schema("offset BIGINT, key STRING NOT NULL") \
        .load(str(path))
    with pytest.raises(Exception, match="declares key NOT NULL"):
        frame.collect()
    assert spark.read.format("mqlog").schema("offset BIGINT, key STRING").load(str(path)) \
        .where("key IS NULL").count() == 1


@pytest.mark.parametrize("mode", ["queue", "commitlog"])
def test_planning_while_retention_deletes_files_it_listed_is_not_a_raw_error(
        tmp_path, monkeypatch, mode):
    """Retention beside the planner deleted a consume-queue or segment file between its
    listing and its opening: the planner raised a raw FileNotFoundError (getsize,
    np.memmap). A file gone is passed over, as the reader does; what the plan's tasks
    then read is the planned snapshot's rows or StoreChanged, and a plan made again
    reads what the store holds now."""
    path = _fill(tmp_path / "s", random.Random(43))
    listed = planner.numbered_files
    trimmed = []

    def listed_then_trimmed(directory):
        found = listed(directory)
        kind = "consumequeue" if mode == "queue" else "commitlog"
        if not trimmed and kind in str(directory) and len(found) > 2:
            with mqlog.open(path, **SMALL) as store:  # (retention, in another process)
                trimmed.append(store.trim_front(store.segments()[2][0]))
            assert not found[0][1].exists(), "test set-up: a listed file deleted"
        return found

    monkeypatch.setattr(planner, "numbered_files", listed_then_trimmed)
    options, parts = _plan(path, mode)
    assert trimmed
    monkeypatch.setattr(planner, "numbered_files", listed)
    with mqlog.open(path, read_only=True) as store:
        expected = _engine(store)
    if mode == "queue":  # (the ranges start at offsets retention deleted)
        with pytest.raises(StoreChanged, match="load the DataFrame again"):
            _read(options, parts)
    else:  # (the files as they are: the deleted one left out of the plan)
        assert _read(options, parts) == expected
    assert _read(*_plan(path, mode)) == expected


def test_born_timestamps_beyond_sparks_range_are_null_not_wrapped(spark, tmp_path):
    """A producer's born timestamp of 10**16 ms (year ~318,857) became, in microseconds,
    an int64 that wrapped around: -8446744073709551616, a time in another era, without a
    word. Spark has no value for it: it is null (born_timestamp is never null
    otherwise); the last representable millisecond either way still reads exactly."""
    limit = ((1 << 63) - 1) // 1000  # (Spark's timestamps: int64 microseconds)
    path = tmp_path / "s"
    born = [10 ** 16, -(10 ** 16), limit, -limit,
            limit + 1, 1_700_000_000_000, (1 << 63) - 1, -(1 << 63)]
    with mqlog.open(path, **SMALL) as store:
        for index, millis in enumerate(born):
            store.put("t", b"x", 0, born_timestamp=millis)
            store.put("t", b"y" * index, 1)  # (a second queue: records of other sizes)
    expected = [millis * 1000 if abs(millis) <= limit else None
                for millis in born]
    for mode in ("queue", "commitlog"):
        options = opts.parse({"path": str(path), "mode": mode, "queues": "0"}, None, 2)
        found = [value for part in planner.plan(options)
                 for batch in read_partition(part, options)
                 for queue_id, value in zip(
                     batch.column("queue_id").to_pylist(),
                     batch.column("born_timestamp").cast(pa.int64()).to_pylist(),
                     strict=True) if queue_id == 0]
        assert found == expected, mode
    frame = spark.read.format("mqlog").load(str(path)).where("queue_id = 0")
    assert frame.where("born_timestamp IS NULL").count() == expected.count(None) == 5


def test_a_range_planned_without_marks_fails_once_the_store_changed(tmp_path):
    """A range whose first or last record the planner could not mark (a file deleted
    beside it, or damage) was read "whole or fail" on the change count alone, which is
    consulted only on an error: after a truncation and as many offsets written again, it
    read the new records as if planned. Now an unmarked planned range whose store changed
    since is StoreChanged before anything is read."""
    rng = random.Random(44)
    path = _fill(tmp_path / "s", rng)
    options, parts = _plan(path)
    unmarked = [replace(piece, marks=()) for part in parts
                for piece in getattr(part, "ranges", [part])]
    with mqlog.open(path, read_only=True) as store:
        assert _read(options, unmarked) == _engine(store)  # (unchanged: read whole)
    with mqlog.open(path, **SMALL) as store:
        _truncation_and_new_writes(store, rng)
    with pytest.raises(StoreChanged, match="could not be marked"):
        _read(options, unmarked)
