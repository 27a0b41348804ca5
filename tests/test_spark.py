"""The Spark connector against a real local Spark session (one per test run).

Every check compares with what the engine's own read API returns; pushdown is checked
through the reader's own counters (the metricsDir option); replicas are made by copying
a store and changing the copies through the engine (truncate, epochs, puts).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import mqlog
from tests.conftest import SMALL, local_spark_session

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (the spark extra)")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (the spark extra)")

from mqlog.spark_connector.reader import load_counters  # noqa: E402

TOPICS = ("orders", "payments")


@pytest.fixture(scope="session")
def spark():
    session = local_spark_session()
    yield session
    session.stop()


def _fill(path, rng, count=600, **overrides):
    """A small-file store with two topics, three queues each, varied fields."""
    with mqlog.open(path, **{**SMALL, **overrides}) as store:
        for index in range(count):
            topic = TOPICS[index % 2]
            key = f"k{index % 7}" if index % 3 else None
            tags = rng.choice([None, "created", "paid"])
            properties = {"n": str(index), "i": index} if index % 5 == 0 else None
            store.put(topic, rng.randbytes(rng.randrange(1, 300)), index % 3, key=key,
                      tags=tags, properties=properties,
                      born_timestamp=1_700_000_000_000 + index)
    return path


def _engine_rows(path):
    """Every record through the engine's read API, as the source's rows would be."""
    from mqlog.spark_connector.layout import _property_text

    rows = []
    with mqlog.open(path, read_only=True) as store:
        for topic, queue_id in store.queues():
            offset = store.min_offset(topic, queue_id)
            while offset < store.max_offset(topic, queue_id):
                for r in store.get(topic, queue_id, offset, 1000, 1 << 24):
                    rows.append((r.topic, r.queue_id, r.offset, r.position, r.epoch,
                                 r.store_timestamp, r.born_timestamp, r.key, r.tags,
                                 {k: _property_text(v) for k, v in r.properties.items()},
                                 None if r.lost else r.body, True, r.lost, str(path)))
                    offset = r.offset + 1
    return sorted(rows, key=lambda row: (row[0], row[1], row[2]))


def _millis(value):
    return (value - dt.datetime(1970, 1, 1)) // dt.timedelta(milliseconds=1)


def _spark_rows(frame):
    rows = []
    for row in frame.collect():
        values = list(row)
        values[5], values[6] = _millis(values[5]), _millis(values[6])
        values[10] = None if values[10] is None else bytes(values[10])
        rows.append(tuple(values))
    return sorted(rows, key=lambda row: (row[0], row[1], row[2]))


def test_schema_matches_pysparks_arrow_conversion():
    from pyspark.sql.pandas.types import to_arrow_schema

    from mqlog.spark_connector import schema

    assert to_arrow_schema(schema.spark_schema(), timezone="UTC").equals(schema.ARROW_SCHEMA)


def test_every_field_equals_the_engine_read_api(spark, tmp_path, rng):
    path = _fill(tmp_path / "store", rng)
    frame = (spark.read.format("mqlog").option("path", str(path))
             .option("maxRecordsPerPartition", "70").load())
    expected = _engine_rows(path)
    assert len(expected) == 600
    assert _spark_rows(frame) == expected
    assert frame.rdd.getNumPartitions() > 6  # 6 queues of ~100 records, cut at 70


def test_options_select_queues_offsets_and_times(spark, tmp_path, rng):
    path = _fill(tmp_path / "store", rng)
    expected = _engine_rows(path)
    frame = (spark.read.format("mqlog").option("path", str(path)).option("topic", "orders")
             .option("queues", "0,orders:2")
             .option("startingOffsets", '{"orders": {"0": 10, "2": -2}}')
             .option("endingOffsets", '{"orders": {"0": 20}}').load())
    wanted = [row for row in expected if row[0] == "orders" and (
        row[1] == 0 and 10 <= row[2] < 20 or row[1] == 2)]
    assert _spark_rows(frame) == wanted
    middle = sorted(row[5] for row in expected)[300]
    later = spark.read.format("mqlog").option("path", str(path)) \
        .option("startingTimestamp", str(middle)).load()
    assert _spark_rows(later) == [row for row in expected if row[5] >= middle]


def _records_read(spark, path, metrics, where, **options):
    """(rows, records the reader read) of a read of ``path`` filtered by ``where``."""
    shutil.rmtree(metrics, ignore_errors=True)
    frame = (spark.read.format("mqlog").option("path", str(path))
             .option("metricsDir", str(metrics)).options(**options).load().where(where))
    rows = frame.collect()
    counted = sum(item["records"] for item in load_counters(str(metrics))) \
        if metrics.exists() else 0
    return len(rows), counted


def test_filters_narrow_the_read_only_where_the_jvm_keeps_them_in_their_scan(spark,
                                                                            tmp_path, rng):
    """Where Spark keeps a pushdown's plan on the DataFrame (PySpark <= 4.3), WHERE clauses
    are Spark's alone and the options narrow the read; where it keeps it in the scan,
    pushed filters narrow it too."""
    from mqlog.spark_connector.datasource import scan_scoped_pushdown

    path = _fill(tmp_path / "store", rng, count=900)
    metrics = tmp_path / "metrics"
    narrow = scan_scoped_pushdown(spark)
    assert narrow == (spark.conf.get("spark.sql.python.filterPushdown.enabled",
                                     "false") == "true")
    assert _records_read(spark, path, metrics, "length(body) >= 0") == (900, 900)
    where = "topic = 'orders' AND queue_id = 1 AND offset >= 40"
    assert _records_read(spark, path, metrics, where) == (110, 110 if narrow else 900)
    assert _records_read(spark, path, metrics, "offset < 5") == (30, 30 if narrow else 900)
    assert _records_read(spark, path, metrics, "offset >= 40", topic="orders", queues="1",
                         startingOffsets='{"orders": {"1": 40}}') == (110, 110)


def test_the_narrowing_reader_reads_only_what_pushed_filters_leave(tmp_path, rng):
    """``NarrowingReader`` (used where the JVM keeps pushed filters in their scan), driven
    as Spark drives it: filters pushed, partitions planned, each partition read."""
    from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, In, LessThan

    from mqlog.spark_connector import options
    from mqlog.spark_connector.datasource import NarrowingReader, read_partition

    # Store timestamps come from the coarse clock (a tick is 1-10 ms), and 900 puts can
    # fit in one tick on an idle machine: every record then shares the cut's timestamp
    # and nothing is left to narrow. The last 100 records come a tick after the rest.
    path = _fill(tmp_path / "store", rng, count=800)
    _await_clock_past(max(row[5] for row in _engine_rows(path)))
    _fill(path, rng, count=100)
    expected = _engine_rows(path)
    cut = sorted(row[5] for row in expected)[800]
    assert cut > sorted(row[5] for row in expected)[799], "test set-up"
    when = dt.datetime.fromtimestamp(cut / 1000, dt.UTC)
    cases = [
        ([EqualTo(("topic",), "orders"), EqualTo(("queue_id",), 1),
          GreaterThanOrEqual(("offset",), 40)], lambda r: r[:2] == ("orders", 1) and
         r[2] >= 40, 0),
        ([LessThan(("offset",), 5)], lambda r: r[2] < 5, 0),
        ([In(("offset",), (3, 7))], lambda r: 3 <= r[2] <= 7, 1),  # narrows; Spark checks
        ([GreaterThanOrEqual(("timestamp",), when)], lambda r: r[5] >= cut, 1),
    ]
    for filters, keep, residual in cases:
        reader = NarrowingReader(options.parse({"path": str(path)}))
        assert len(reader.pushFilters(filters)) == residual
        read = [row for part in reader.partitions()
                for batch in read_partition(part, reader.options)
                for row in zip(batch.column("topic").to_pylist(),
                               batch.column("queue_id").to_pylist(),
                               batch.column("offset").to_pylist(), strict=True)]
        wanted = sorted(r[:3] for r in expected if keep(r))
        assert sorted(read) == wanted if not residual else set(wanted) <= set(read)
        assert len(read) < len(expected)


def _await_clock_past(timestamp_ms: int) -> None:
    """Until the store's clock (the coarse wall clock, fallback.py) is past ``timestamp_ms``."""
    import time

    from mqlog.ext.fallback import CLOCK_REALTIME_COARSE

    while time.clock_gettime_ns(CLOCK_REALTIME_COARSE) // 1_000_000 <= timestamp_ms:
        time.sleep(0.001)


def _seven(path):
    """The issue's store: 7 records in topic orders (4 in queue 0, 3 in queue 1), 2 in
    payments."""
    with mqlog.open(path, **SMALL) as store:
        for index in range(7):
            store.put("orders", b"order-%d" % index, index % 2, born_timestamp=index)
        for index in range(2):
            store.put("payments", b"payment-%d" % index, 0)
    return path


def test_a_filtered_action_leaves_later_actions_on_the_dataframe_alone(spark, tmp_path):
    """Issue 15, finding 1: pushed filters belong to one scan, never to the DataFrame."""
    path = _seven(tmp_path / "store")
    o = spark.read.format("mqlog").option("path", str(path)).option("topic", "orders").load()
    assert o.count() == 7
    assert o.where("offset >= 2").count() == 3
    assert o.count() == 7
    assert len(o.collect()) == 7
    assert o.where("queue_id = 1").count() == 3
    assert o.count() == 7
    assert sorted(tuple(r) for r in o.groupBy("queue_id").count().collect()) == \
        [(0, 4), (1, 3)]


_WHERE = {  # a filter as Spark SQL, and as a predicate on an _engine_rows row
    None: lambda r: True,
    "offset >= 2": lambda r: r[2] >= 2,
    "offset < 3": lambda r: r[2] < 3,
    "queue_id = 1": lambda r: r[1] == 1,
    "topic = 'payments'": lambda r: r[0] == "payments",
    "queue_id IN (0, 2) AND offset >= 1": lambda r: r[1] in (0, 2) and r[2] >= 1,
    "offset IN (1, 4)": lambda r: r[2] in (1, 4),
    "born_timestamp < TIMESTAMP '1970-01-01 00:00:00.010'": lambda r: r[6] < 10,
    "length(body) > 7": lambda r: len(r[10]) > 7,
}
_ACTIONS = ("count", "collect", "groupBy")


@pytest.fixture(scope="module")
def mixed_store(tmp_path_factory):
    """30 records in two topics, queues 0-2, born at 0..29 ms, bodies of 0-10 bytes."""
    path = tmp_path_factory.mktemp("mixed") / "store"
    with mqlog.open(path, **SMALL) as store:
        for index in range(30):
            store.put(TOPICS[index % 2], b"b" * (index % 11), index % 3,
                      born_timestamp=index)
    return path


def _answer(frame, action):
    if action == "count":
        return frame.count()
    if action == "collect":
        return sorted((r.topic, r.queue_id, r.offset) for r in frame.collect())
    return sorted(tuple(r) for r in frame.groupBy("topic", "queue_id").count().collect())


def _expected(rows, where, action):
    kept = [row for row in rows if _WHERE[where](row)]
    if action == "count":
        return len(kept)
    if action == "collect":
        return sorted(row[:3] for row in kept)
    counts: dict = {}
    for row in kept:
        counts[row[:2]] = counts.get(row[:2], 0) + 1
    return sorted((*key, value) for key, value in counts.items())


_STEPS = st.lists(st.tuples(st.sampled_from(sorted(_WHERE, key=str)),
                            st.sampled_from(_ACTIONS)), min_size=2, max_size=5)


@settings(max_examples=6, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(steps=[(None, "count"), ("offset >= 2", "count"), (None, "count"),
                (None, "collect"), ("queue_id = 1", "groupBy"), (None, "count")])
@given(steps=_STEPS)
def test_any_sequence_of_actions_on_one_dataframe_matches_the_engine(spark, mixed_store,
                                                                      steps):
    """Random sequences of filtered and unfiltered actions on one loaded DataFrame, each
    answer compared with the engine's read API (derandomized: the same sequences every
    run; a failure prints the sequence)."""
    rows = _engine_rows(mixed_store)
    frame = spark.read.format("mqlog").option("path", str(mixed_store)).load()
    for where, action in steps:
        filtered = frame if where is None else frame.where(where)
        assert _answer(filtered, action) == _expected(rows, where, action), (where, action)


def _flip_crc(path, position):
    """Flip one bit of the CRC field of the record at ``position`` (a real bit flip)."""
    segment_dir = path / "commitlog"
    bases = sorted(int(name) for name in os.listdir(segment_dir) if name.isdigit())
    base = max(b for b in bases if b <= position)
    with open(segment_dir / f"{base:020d}", "r+b") as segment:
        segment.seek(position - base + 8)
        byte = segment.read(1)[0]
        segment.seek(position - base + 8)
        segment.write(bytes([byte ^ 0x10]))


def test_commitlog_mode_finds_a_flipped_crc(spark, tmp_path, rng):
    path = _fill(tmp_path / "store", rng)
    expected = _engine_rows(path)
    victim = expected[123]
    _flip_crc(path, victim[3])
    frame = spark.read.format("mqlog").option("path", str(path)) \
        .option("mode", "commitlog").option("minPartitions", "5").load()
    rows = frame.select("position", "crc_ok", "offset", "topic", "body").collect()
    assert len(rows) == len(expected)
    assert [row.position for row in rows if not row.crc_ok] == [victim[3]]
    assert sorted((r.topic, r.offset, bytes(r.body)) for r in rows) == \
        sorted((row[0], row[2], row[10]) for row in expected)


def test_commitlog_mode_sees_records_past_the_consume_queues(spark, tmp_path, rng):
    path = _fill(tmp_path / "store", rng, count=50)
    positions = {row[3] for row in _engine_rows(path)}
    frame = spark.read.format("mqlog").option("path", str(path)) \
        .option("mode", "commitlog").load().where("position >= 0")
    assert {row.position for row in frame.select("position").collect()} == positions


def _damaged_store(path, rng, fixed):
    """Two queues written in runs of 1500 records (~300 KB, more than the reader reads
    through), so that a chunk's records come in several pieces; bodies of one size
    (the reader's matrix path) or of many (its gather path)."""
    with mqlog.open(path, segment_size_bytes=1 << 20,
                    message_size_bytes_max=64 << 10) as store:
        for _run in range(3):
            for queue_id in (0, 1):
                store.put_batch("t", [b"f" * 128 if fixed else rng.randbytes(rng.randrange(
                    1, 256)) for _ in range(1500)], queue_id)
    return path


def _entry(path, queue_id, offset, value=None):
    """The consume-queue entry (position, size, tag hash) of ``offset``; with ``value``,
    overwrite it first."""
    import struct

    with mqlog.open(path, read_only=True) as store:
        directory = store.paths.queue_dir("t", queue_id)
    bases = {int(name): name for name in os.listdir(directory) if name.isdigit()}
    base = max(b for b in bases if b <= offset)
    with open(directory / bases[base], "r+b") as queue_file:
        queue_file.seek((offset - base) * 20)
        if value is not None:
            queue_file.write(struct.pack("<QIQ", *value))
            queue_file.seek((offset - base) * 20)
        return struct.unpack("<QIQ", queue_file.read(20))


_DAMAGE = {  # entry 2500 of queue 0 made to point ...
    "at_the_previous_record": lambda path, at: _entry(path, 0, 2499),
    "far_back": lambda path, at: _entry(path, 0, 100),
    "at_another_queues_earlier_record": lambda path, at: _entry(path, 1, 10),
    "into_an_earlier_record": lambda path, at: (_entry(path, 0, 2100)[0] + 8, *at[1:]),
    "into_its_own_record": lambda path, at: (at[0] + 8, *at[1:]),
    "at_a_later_record": lambda path, at: _entry(path, 0, 2600),
    "past_the_log": lambda path, at: (at[0] + (1 << 30), *at[1:]),
    "with_a_size_below_a_header": lambda path, at: (at[0], 40, at[2]),
}


@pytest.mark.parametrize("fixed", [True, False], ids=["one-size", "sizes-vary"])
@pytest.mark.parametrize("damage", sorted(_DAMAGE))
def test_a_wrong_consume_queue_entry_is_a_mismatch(tmp_path, rng, fixed, damage):
    """An entry that points backwards, into a record, past the log or at another record
    raises ConsumeQueueMismatch naming that entry (never an Arrow error, never rows)."""
    from mqlog.errors import ConsumeQueueMismatch
    from mqlog.spark_connector import options
    from mqlog.spark_connector.datasource import read_partition

    path = _damaged_store(tmp_path / "store", rng, fixed)
    _entry(path, 0, 2500, _DAMAGE[damage](path, _entry(path, 0, 2500)))
    part = options.QueueRange(str(path), str(path), "t", 0, 0, 4500)
    # an entry moved forwards is found when the next one cannot follow it
    blamed = "2500" if damage.startswith(("at_the", "far", "at_another", "into_an", "with"))\
        else "2501 .* the entry before it \\(offset 2500\\)"
    with pytest.raises(ConsumeQueueMismatch, match=f"the entry of offset {blamed}"):
        list(read_partition(part, options.parse({"path": str(path)})))
    intact = options.QueueRange(str(path), str(path), "t", 0, 0, 2500)
    assert sum(batch.num_rows for batch in read_partition(
        intact, options.parse({"path": str(path)}))) == 2500


def test_queue_mode_reports_a_flipped_crc_as_corrupt_not_as_a_mismatch(tmp_path, rng):
    from mqlog.errors import CorruptRecord
    from mqlog.spark_connector import options
    from mqlog.spark_connector.datasource import read_partition

    path = _damaged_store(tmp_path / "store", rng, fixed=True)
    _flip_crc(path, _entry(path, 0, 2000)[0])  # the first record of a run
    for start in (2000, 1990):  # at the start of what is read, and inside it
        part = options.QueueRange(str(path), str(path), "t", 0, start, 2100)
        with pytest.raises(CorruptRecord, match="CRC32C"):
            list(read_partition(part, options.parse({"path": str(path)})))


def test_a_dataframe_over_a_wrong_consume_queue_fails_with_the_mismatch(spark, tmp_path,
                                                                        rng):
    path = _damaged_store(tmp_path / "store", rng, fixed=False)
    _entry(path, 0, 2500, _entry(path, 0, 2499))
    frame = spark.read.format("mqlog").option("path", str(path)).load()
    with pytest.raises(Exception, match="ConsumeQueueMismatch"):
        frame.agg({"body": "count"}).collect()


def test_commitlog_mode_cuts_a_large_segment_at_verified_record_starts(spark, tmp_path,
                                                                       rng):
    """A segment cut into several partitions: each walk starts at its own first record
    (a consume-queue position the planner read back), none steps from the segment's
    start, and together they report every record once; with a damaged record the
    rows are still every record once, the damaged one with crc_ok false."""
    path = _fill(tmp_path / "store", rng, count=2000, segment_size_bytes=4 << 20)
    assert len(os.listdir(path / "commitlog")) == 1
    expected = sorted(row[3] for row in _engine_rows(path))
    metrics = tmp_path / "metrics"

    def read(run):
        frame = (spark.read.format("mqlog").option("path", str(path)).option("mode",
                 "commitlog").option("minPartitions", "4")
                 .option("metricsDir", str(metrics / run)).load())
        rows = frame.select("position", "crc_ok").collect()
        return frame, rows, load_counters(str(metrics / run))

    frame, rows, counters = read("intact")
    assert frame.rdd.getNumPartitions() == 4
    assert sorted(row.position for row in rows) == expected and all(r.crc_ok for r in rows)
    assert len(counters) == 4 and sum(item["stepped"] for item in counters) == 0
    assert sum(item["records"] for item in counters) == len(expected)

    _flip_crc(path, expected[700])
    _frame, rows, counters = read("damaged")
    assert sorted(row.position for row in rows) == expected
    assert [row.position for row in rows if not row.crc_ok] == [expected[700]]


def _replicas(tmp_path, rng):
    """A reference store and three copies: one short, one longer, one diverged."""
    reference = _fill(tmp_path / "a", rng, count=300)
    copies = {name: tmp_path / name for name in ("short", "long", "diverged")}
    for copy in copies.values():
        shutil.copytree(reference, copy)
    rows = _engine_rows(reference)
    cut = sorted(row[3] for row in rows)[len(rows) // 2]
    with mqlog.open(copies["short"], **SMALL) as store:
        store.truncate(cut)
    with mqlog.open(copies["long"], **SMALL) as store:
        extra = [store.put("orders", b"extra-%d" % i, 1).position for i in range(7)]
    with mqlog.open(reference, read_only=True) as origin:
        originals = [origin.read_record(row[3]) for row in sorted(rows, key=lambda r: r[3])
                     if row[3] >= cut]
    with mqlog.open(copies["diverged"], **SMALL) as store:
        store.truncate(cut)
        store.set_epoch(3)
        for r in originals:  # the same sizes, so the same places, but a new epoch and body
            body = r.body[:-1] + bytes([r.body[-1] ^ 1])
            store.put(r.topic, body, r.queue_id, key=r.key, tags=r.tags,
                      properties=r.properties or None, born_timestamp=r.born_timestamp)
    return reference, copies, rows, cut, extra


def test_reconcile_finds_exactly_the_injected_differences(spark, tmp_path, rng):
    from mqlog.spark_connector.reconcile import reconcile

    reference, copies, rows, cut, extra = _replicas(tmp_path, rng)
    found = reconcile(spark, [str(reference), *map(str, copies.values())])
    findings = found.findings.collect()

    def positions(replica, kind, level="log"):
        return sorted(f.position for f in findings if f.replica == str(copies[replica])
                      and f.kind == kind and f.level == level)

    after_cut = sorted(row[3] for row in rows if row[3] >= cut)
    assert positions("short", "missing") == after_cut
    assert positions("short", "extra") == positions("short", "divergent") == []
    assert positions("long", "extra") == sorted(extra)
    assert positions("long", "missing") == positions("long", "divergent") == []
    assert positions("diverged", "divergent") == after_cut  # same places, new epoch/body
    assert positions("diverged", "missing") == positions("diverged", "extra") == []
    queue_level = sorted((f.topic, f.queue_id, f.offset) for f in findings
                         if f.replica == str(copies["diverged"]) and f.level == "queue")
    assert queue_level == sorted((row[0], row[1], row[2]) for row in rows if row[3] >= cut)
    assert not [f for f in findings if f.kind == "corrupt"]
    summary = {(s["replica"], s["topic"], s["queue_id"]): s for s in found.summary_rows()}
    first_missing = min(row[2] for row in rows if row[3] >= cut and row[:2] == ("orders", 0))
    assert summary[(str(copies["short"]), "orders", 0)]["common_prefix"] == first_missing
    assert summary[(str(copies["long"]), "orders", 1)]["extra"] == 7


def test_reconcile_on_the_driver_and_by_shuffles_give_the_same_answer(spark, tmp_path,
                                                                       rng):
    """The same damaged replicas (short, longer, diverged, a flipped CRC, control records)
    compared on the driver and by shuffles: the same findings, counts, summary and
    schema; the driver's way runs no Spark job."""
    from mqlog.spark_connector.reconcile import reconcile

    reference, copies, rows, _cut, _extra = _replicas(tmp_path, rng)
    _flip_crc(copies["long"], sorted(row[3] for row in rows)[10])
    _flip_crc(reference, sorted(row[3] for row in rows)[20])
    raft_reference, raft_copy = _raft_like(tmp_path / "raft")
    moved = [tmp_path / "moved-a", tmp_path / "moved-b"]  # the key moved into the tags
    for path, (key, tags) in zip(moved, ((None, "k"), ("k", None)), strict=True):
        with mqlog.open(path, clock_ms=lambda: 1_000, **SMALL) as store:
            for body in (b"one", b"two"):
                store.put("orders", body, 0, key=key, tags=tags, born_timestamp=7)
    cases = [[str(reference), *map(str, copies.values())], [str(raft_reference),
             str(raft_copy)], list(map(str, moved))]
    context = spark.sparkContext
    for paths in cases:
        answers = []
        for way, limit in (("driver", 1 << 30), ("shuffled", 0)):
            context.setJobGroup(f"reconcile-{way}-{len(paths)}", way)
            found = reconcile(spark, paths, driver_bytes_max=limit)
            jobs = context.statusTracker().getJobIdsForGroup(f"reconcile-{way}-{len(paths)}")
            answers.append((sorted(tuple(row) for row in found.findings.collect()),
                            found.counts, found.summary_rows(),
                            found.findings.schema.simpleString()))
            if way == "driver":
                assert jobs == [], jobs
        assert answers[0] == answers[1]
        assert answers[0][0], "the damage was found"
    assert answers[0][1] == {("log", "divergent"): 2}
    context.setJobGroup("after", "after")


def _retained_copies(tmp_path, rng):
    """A reference store, a copy whose retention took its first segments, and a copy of
    that retained copy with its last records truncated: the first differs from the
    reference only in what it no longer holds, the second in its tail too."""
    reference = _fill(tmp_path / "full", rng, count=600)
    retained, cut = tmp_path / "retained", tmp_path / "retained-cut"
    shutil.copytree(reference, retained)
    with mqlog.open(retained, **{**SMALL, "retention_bytes": 64 * 1024}) as store:
        assert store.apply_retention().segments_deleted
    shutil.copytree(retained, cut)
    rows = sorted(_engine_rows(reference), key=lambda row: row[3])
    tail = rows[-40:]
    with mqlog.open(cut, **SMALL) as store:
        store.truncate(tail[0][3])
    return reference, retained, cut, tail


def test_reconcile_does_not_call_what_retention_took_missing(tmp_path, rng):
    """A replica that keeps less history (retention took its first segments) is not
    missing those records, nor is the reference's longer history extra when the
    retained copy is the reference; what a truncation took from its end still is. The
    summary says where each replica's copy of a queue starts (held_from). On the driver:
    no Spark session at all."""
    from mqlog.spark_connector.reconcile import reconcile

    reference, retained, cut, tail = _retained_copies(tmp_path, rng)
    with mqlog.open(retained, read_only=True) as store:
        starts = {queue: store.min_offset(*queue) for queue in store.queues()}
        log_start = store.first_segment_base()
    assert log_start > 0 and any(start > 0 for start in starts.values())
    found = reconcile(None, [str(reference), str(retained), str(cut)])
    assert found.counts == {("log", "missing"): len(tail), ("queue", "missing"): len(tail)}
    rows = {(r["replica"], r["topic"], r["queue_id"]): r for r in found.summary_rows()}
    for (topic, queue_id), start in starts.items():
        for copy in (retained, cut):
            assert rows[(str(copy), topic, queue_id)]["held_from"] == start
        assert rows[(str(retained), topic, queue_id)]["missing"] == 0
    reverse = reconcile(None, [str(retained), str(reference)])
    assert reverse.counts == {}, reverse.counts


def test_reconcile_reports_what_a_replica_too_damaged_to_open_lacks(tmp_path):
    """A copy that lost a middle segment, or whose last segment was cut short, cannot be
    opened (CorruptStore), and reconcile refused it, though these are the replicas it is
    for and its commit-log scan reads what is there. Now their lost records are
    reported missing, at both levels."""
    from mqlog.errors import CorruptStore
    from mqlog.spark_connector.reconcile import reconcile

    reference = tmp_path / "a"
    with mqlog.open(reference, **SMALL) as store:
        positions = [store.put("t", b"%05d" % n + b"y" * 95).position for n in range(1000)]
        segments = [base for base, _size in store.segments()]
    assert len(segments) == 3
    holed, short = tmp_path / "holed", tmp_path / "short"
    shutil.copytree(reference, holed)
    shutil.copytree(reference, short)
    os.remove(holed / "commitlog" / f"{segments[1]:020d}")
    os.truncate(short / "commitlog" / f"{segments[-1]:020d}", 20_000)
    size = positions[1] - positions[0]  # (of each record)
    lost = {holed: [p for p in positions if segments[1] <= p < segments[2]],
            short: [p for p in positions if p + size > segments[-1] + 20_000]}
    for copy, gone in lost.items():
        with pytest.raises(CorruptStore):
            mqlog.open(copy, read_only=True)
        found = reconcile(None, [str(reference), str(copy)])
        assert found.counts == {("log", "missing"): len(gone),
                                ("queue", "missing"): len(gone)}, copy


def test_reconcile_counts_a_corrupt_record_once_and_blames_no_healthy_copy(tmp_path):
    """One record's CRC flipped in one of two copies: it was counted three times (corrupt,
    and missing at both levels), and with the damaged copy as the reference the healthy
    replica was reported extra. Now it is one corrupt finding either way, and the damaged
    replica's common prefix ends at it."""
    from mqlog.spark_connector.reconcile import reconcile

    healthy, damaged = tmp_path / "healthy", tmp_path / "damaged"
    with mqlog.open(healthy, **SMALL) as store:
        positions = [store.put("t", b"%02d" % n * 10).position for n in range(10)]
    shutil.copytree(healthy, damaged)
    _flip_crc(damaged, positions[3])
    for paths in ([healthy, damaged], [damaged, healthy]):
        found = reconcile(None, list(map(str, paths)))
        assert found.counts == {("log", "corrupt"): 1}, paths
        rows = {row["replica"]: row for row in found.summary_rows()}
        assert all((row["missing"], row["extra"], row["divergent"]) == (0, 0, 0)
                   for row in rows.values())
        # (the damaged copy has a row, as the reference too: the summary shows it)
        assert (rows[str(damaged)]["corrupt"], rows[str(damaged)]["common_prefix"]) == \
            (1, 3), paths
        assert rows.get(str(healthy), {"corrupt": 0})["corrupt"] == 0
        assert list(rows) == list(map(str, paths[1:] if paths[0] == healthy else paths))


def test_reconcile_does_not_call_what_a_reset_took_missing(spark, tmp_path):
    """A replica reset to a position of the reference (Kafka's truncate fully and start
    at) that then copied the reference's records from there holds all it should. A queue
    whose records all lie before the reset has no consume queue there, so no start of
    its own: its 40 records were reported missing at the queue level, though the log
    level found none (a hostile review). On the driver and by shuffles alike."""
    from mqlog.spark_connector.reconcile import reconcile

    reference, replica = tmp_path / "reference", tmp_path / "replica"
    with mqlog.open(reference, **SMALL) as store:
        for _ in range(40):
            store.put("old", b"o" * 500)
        for _ in range(40):
            store.put("orders", b"n" * 500)
        cut = store.get("orders", 0, 20, 1)[0].position
        copied, at = [], cut
        while at < store.written_position:  # (read_raw stops at a segment's end)
            chunk = store.read_raw(at, 1 << 20)
            copied.append((at, chunk))
            at += len(chunk)
    with mqlog.open(replica, **SMALL) as store:
        store.reset(cut, [])
        for at, chunk in copied:
            store.append_raw(at, chunk)
        assert store.queues() == [("orders", 0)]  # ("old": none at all)
    for driver_bytes_max in (1 << 30, 0):
        found = reconcile(spark, [str(reference), str(replica)],
                          driver_bytes_max=driver_bytes_max)
        assert found.counts == {}, (driver_bytes_max, found.counts)


def test_reconcile_takes_replicas_whose_names_hold_commas(spark, tmp_path):
    """reconcile joined its replicas' paths with commas for the source, which split
    them again: "node,1" and "node,2" were four stores (a hostile review). It passes
    them as a JSON list now (the 'paths' option takes one)."""
    from mqlog.errors import InvalidArgument
    from mqlog.spark_connector.reconcile import reconcile

    first, second = tmp_path / "node,1", tmp_path / "node,2"
    with mqlog.open(first, **SMALL) as store:
        for index in range(5):
            store.put("orders", b"%d" % index)
    shutil.copytree(first, second)
    for driver_bytes_max in (1 << 30, 0):
        found = reconcile(spark, [str(first), str(second)], driver_bytes_max=driver_bytes_max)
        assert found.counts == {}
    from mqlog.spark_connector import options
    for bad in ("[1, 2", "[1, 2]", "[]"):
        with pytest.raises(InvalidArgument, match="must be a JSON list|distinct store"):
            options.parse({"paths": bad}, slots=1)


def test_reconcile_of_retained_replicas_by_shuffles_agrees_with_the_driver(spark,
                                                                            tmp_path, rng):
    """The same retained and truncated copies compared by shuffles: the same findings,
    counts and summary as on the driver."""
    from mqlog.spark_connector.reconcile import reconcile

    reference, retained, cut, _tail = _retained_copies(tmp_path, rng)
    paths = [str(reference), str(retained), str(cut)]
    answers = []
    for limit in (1 << 30, 0):
        found = reconcile(spark, paths, driver_bytes_max=limit)
        answers.append((sorted(tuple(row) for row in found.findings.collect()),
                        found.counts, found.summary_rows()))
    assert answers[0] == answers[1]
    assert answers[0][1] == {("log", "missing"): 40, ("queue", "missing"): 40}


def test_reconcile_refuses_a_bad_driver_limit(spark, tmp_path, rng):
    from mqlog.errors import InvalidArgument
    from mqlog.spark_connector.reconcile import reconcile

    path = _fill(tmp_path / "a", rng, count=10)
    for bad in (-1, True, 1.5, "1"):
        with pytest.raises(InvalidArgument, match="driver_bytes_max"):
            reconcile(spark, [str(path), str(path) + "/"], driver_bytes_max=bad)


def _replayed(path):
    """What a replay wrote, as (topic, queue, source offset, key, tags, born timestamp,
    properties without replay's, body), in destination order."""
    from mqlog.spark_connector import replay

    got = []
    with mqlog.open(path, read_only=True) as store:
        for topic, queue_id in store.queues():
            for r in store.get(topic, queue_id, 0, 10_000, 1 << 24):
                properties = {key: value for key, value in r.properties.items()
                              if key not in (replay.REPLAY_PROPERTY,
                                             replay.REPLAY_FIRST_PROPERTY)}
                got.append((topic, queue_id, replay.source_offset(r), r.key, r.tags,
                            r.born_timestamp, properties, r.body))
    return got


def _originals(path, keys):
    with mqlog.open(path, read_only=True) as store:
        found = [(t, q, o, store.get(t, q, o, 1)[0]) for t, q, o in sorted(keys)]
    return [(t, q, o, r.key, r.tags, r.born_timestamp, r.properties, r.body)
            for t, q, o, r in found]


def test_replay_to_store_equals_the_source_range_and_is_idempotent(spark, tmp_path, rng):
    from mqlog.spark_connector import replay

    source = _fill(tmp_path / "src", rng)
    target = tmp_path / "dst"
    frame = replay.select(spark, str(source), "10", "60", "tags IS NOT NULL OR key = 'k1'")
    first = replay.to_store(frame, str(source), str(target))
    again = replay.to_store(frame, str(source), str(target))
    wanted = [row for row in _engine_rows(source) if 10 <= row[2] < 60
              and (row[8] is not None or row[7] == "k1")]
    assert first.written == len(wanted) > 0 and again.written == again.batches == 0
    assert again.skipped == len(wanted)
    got = _replayed(target)
    assert got == _originals(source, [(r[0], r[1], r[2]) for r in wanted])
    assert {type(p.get("i")) for *_, p, _body in got} == {int, type(None)}  # msgpack types


def test_replay_to_store_writes_runs_in_batches_and_resumes_after_a_torn_one(spark, tmp_path,
                                                                            rng):
    """Records a producer sent in batches replay in batches (put_batch); an interrupted
    replay whose last batch is only partly in the destination (a crash) resumes exactly
    after the last record that is there."""
    from mqlog.spark_connector import replay

    source = tmp_path / "src"
    with mqlog.open(source, **SMALL) as store:
        for queue_id in (0, 1):
            store.put_batch("orders", [rng.randbytes(30) for _ in range(40)], queue_id,
                            key="a", tags="x", properties={"p": 1}, born_timestamp=1000)
            # equal to the run before for Python (1 == True), not for msgpack: a new batch
            store.put_batch("orders", [rng.randbytes(30) for _ in range(30)], queue_id,
                            key="a", tags="x", properties={"p": True}, born_timestamp=1000)
            for index in range(5):  # each its own born timestamp: still one batch
                store.put("orders", rng.randbytes(30), queue_id, born_timestamp=2000 + index)
    target = tmp_path / "dst"
    everything = replay.select(spark, str(source))
    keys = [(r.topic, r.queue_id, r.offset) for r in everything.collect()]
    assert len(keys) == 150

    first = replay.to_store(replay.select(spark, str(source), None, "60"), str(source),
                            str(target))
    assert (first.written, first.batches) == (120, 4)  # 40 + 20 per queue
    with mqlog.open(target, **SMALL) as store:  # a crash kept 13 of queue 1's last 20
        torn = store.get("orders", 1, 40 + 13, 1)[0]
        store.truncate(torn.position)
    resumed = replay.to_store(everything, str(source), str(target))
    assert (resumed.written, resumed.skipped) == (150 - 113, 113)
    assert resumed.batches == 1 + 1 + 1 + 1  # queue 0: 10 + 5; queue 1: 17 + 5
    assert _replayed(target) == _originals(source, keys)
    again = replay.to_store(everything, str(source), str(target))
    assert (again.written, again.skipped) == (0, 150)


def test_replays_of_other_selections_into_one_store_write_what_they_select(spark,
                                                                          tmp_path):
    """Two selections replayed into one destination, a filter's complement after it, an
    earlier range after a later one: the second wrote nothing of what it selected below
    the last source offset already there (it was counted "already there": a hostile
    review). Each writes exactly what it selects and the destination is not there yet;
    running them all again writes nothing."""
    from mqlog.spark_connector import replay

    source = tmp_path / "src"
    with mqlog.open(source, **SMALL) as store:
        for index in range(10):
            store.put("orders", b"m%d" % index, 0, key="a" if index % 2 == 0 else "b")
    runs = [(tmp_path / "by_key", [dict(where="key = 'a'"), dict(where="key = 'b'")]),
            (tmp_path / "by_range", [dict(start="6", end="10"), dict(start="0", end="6")])]
    for target, selections in runs:
        for selection in selections:
            done = replay.to_store(replay.select(spark, str(source), **selection),
                                   str(source), str(target))
            assert done.written == done.selected and done.skipped == 0, (selection, done)
        with mqlog.open(target, read_only=True) as copy:
            got = sorted(replay.source_offset(record) for record in copy.get("orders", 0, 0,
                                                                             100))
        assert got == list(range(10)), (target, got)
        for selection in selections:
            again = replay.to_store(replay.select(spark, str(source), **selection),
                                    str(source), str(target))
            assert again.written == 0 and again.skipped == again.selected > 0


def test_replay_to_parquet_equals_the_source_range(spark, tmp_path, rng):
    from mqlog.spark_connector import replay

    source = _fill(tmp_path / "src", rng)
    out = str(tmp_path / "out.parquet")
    frame = replay.select(spark, str(source), "5", "25")
    assert replay.to_parquet(frame, out) == replay.to_parquet(frame, out)  # rerun replaces
    written = spark.read.parquet(out)
    assert _spark_rows(written) == [row for row in _engine_rows(source) if 5 <= row[2] < 25]


def test_streaming_picks_up_appends_and_resumes_without_duplicates(spark, tmp_path, rng):
    path = tmp_path / "store"
    with mqlog.open(path, **SMALL) as store:
        for index in range(40):
            store.put("orders", b"first-%d" % index, index % 2)
    checkpoint, out = str(tmp_path / "checkpoint"), str(tmp_path / "out")

    def run_available_now():
        stream = (spark.readStream.format("mqlog").option("path", str(path))
                  .option("maxRecordsPerTrigger", "15").load()
                  .select("queue_id", "offset", "body"))
        query = (stream.writeStream.format("parquet").option("path", out)
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        query.awaitTermination()
        return query

    query = run_available_now()
    assert query.lastProgress is not None
    batches = len(query.recentProgress)
    assert batches >= 3  # 40 records at most 15 per trigger
    with mqlog.open(path, **SMALL) as store:
        for index in range(25):
            store.put("orders", b"second-%d" % index, index % 3)
    run_available_now()
    rows = sorted((r.queue_id, r.offset, bytes(r.body))
                  for r in spark.read.parquet(out).collect())
    expected = []
    with mqlog.open(path, read_only=True) as store:
        for topic, queue_id in store.queues():
            expected += [(queue_id, r.offset, r.body)
                         for r in store.get(topic, queue_id, 0, 1000, 1 << 24)]
    assert rows == sorted(expected)
    assert len(rows) == 65


def test_streaming_fails_on_data_loss_unless_told_to_skip(spark, tmp_path):
    """Records retention deleted before the query read them stop it (Kafka's
    failOnDataLoss); with failOnDataLoss=false it skips to the oldest record kept."""
    path = tmp_path / "store"
    with mqlog.open(path, **SMALL) as store:
        for index in range(40):
            store.put("orders", b"early-%d" % index)
    checkpoint, out = str(tmp_path / "checkpoint"), str(tmp_path / "out")

    def run_available_now(fail_on_data_loss: str):
        stream = (spark.readStream.format("mqlog").option("path", str(path))
                  .option("failOnDataLoss", fail_on_data_loss).load()
                  .select("offset", "body"))
        query = (stream.writeStream.format("parquet").option("path", out)
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        query.awaitTermination()

    run_available_now("true")
    with mqlog.open(path, **{**SMALL, "retention_bytes": 64 * 1024}) as store:
        for index in range(2000):
            store.put("orders", b"late-%d" % index)
        store.flush()
        store.apply_retention()
        kept_from = store.min_offset("orders", 0)
    assert kept_from > 40, "retention must delete records the query has not read"
    with pytest.raises(Exception, match="failOnDataLoss=false"):
        run_available_now("true")
    run_available_now("false")
    offsets = sorted(row.offset for row in spark.read.parquet(out).collect())
    assert offsets == list(range(40)) + list(range(kept_from, 2040))


def test_bad_options_are_typed_errors(tmp_path):
    from mqlog.errors import InvalidArgument
    from mqlog.spark_connector import options

    for bad in ({}, {"path": "a", "paths": "b"}, {"path": "a", "mode": "x"},
                {"path": "a", "startingOffsets": "{bad"}, {"path": "a", "queues": "x:y"},
                {"path": "a", "minPartitions": "-1"}, {"path": "a", "failOnDataLoss": "maybe"},
                {"path": "a", "startingOffsets": '{"t": {"0": 7.9}}'},
                {"path": "a", "endingOffsets": '{"t": {"0": true}}'}):
        with pytest.raises(InvalidArgument):
            options.parse(bad)
    # A misspelled option was ignored, and the read silently widened to everything.
    for typo in ("startingOffset", "topik", "endingTimestmp"):
        with pytest.raises(InvalidArgument, match=f"no option '{typo.lower()}'"):
            options.parse({"path": "a", typo: "1"})
    # One store's path is taken whole, a comma too (only 'paths' lists several).
    assert options.parse({"path": "a,b"}).paths == (("a,b", "a,b"),)
    assert options.parse({"PATHS": "a,b", "StartingOffsets": '{"t": {"0": 7}}'}).starting \
        == {"t": {0: 7}}


def test_cli_reconcile_and_replay(spark, tmp_path, rng):
    from click.testing import CliRunner

    from mqlog.spark_connector.cli import reconcile, replay
    from mqlog.spark_connector.reconcile import REPORT_COLUMNS

    source = _fill(tmp_path / "a", rng, count=60)
    shutil.copytree(source, tmp_path / "b")
    runner = CliRunner()
    same = runner.invoke(reconcile, [str(source), str(tmp_path / "b"),
                                     "--out", str(tmp_path / "report.parquet")])
    assert same.exit_code == 0, same.output
    assert "0 finding(s)" in same.output and "common_prefix" in same.output
    findings = spark.read.parquet(str(tmp_path / "report.parquet"))
    assert findings.count() == 0 and tuple(findings.columns) == REPORT_COLUMNS
    refused = runner.invoke(replay, [str(source), "--from", "0"])
    assert refused.exit_code == 2  # (bad usage, as docs/CLI.md says)
    assert "give exactly one of" in refused.output
    done = runner.invoke(replay, [str(source), "--from", "0", "--to", "5",
                                  "--to-parquet", str(tmp_path / "out")])
    assert done.exit_code == 0 and "30 record(s)" in done.output, done.output
    for bad, said in (("nosuchcol = 1", "'nosuchcol', which is not a column"),
                      ("offset = = 1", "--filter: "),  # Spark's parser says why
                      ("length(nosuchcol) > 1", "'nosuchcol'"),
                      ("offset = 'x' + array(1)", "--filter: ")):  # Spark's analysis
        refused = runner.invoke(replay, [str(source), "--filter", bad,
                                         "--to-parquet", str(tmp_path / "bad")])
        assert refused.exit_code == 2, refused.output
        line = refused.stderr.strip()
        assert "\n" not in line and line.startswith("mqlog: error: ") and said in line, line
    assert not (tmp_path / "bad").exists()


def test_cli_reconcile_of_small_replicas_starts_no_spark(spark, tmp_path, rng,
                                                         monkeypatch):
    """Small replicas are compared in the command's own process: no Spark session is
    built (session() would fail the test), the findings Parquet is what Spark writes for
    the same replicas with --driver-bytes-max 0, and reconcile() without a session
    refuses replicas over the limit with a typed error."""
    from click.testing import CliRunner

    from mqlog.errors import InvalidArgument
    from mqlog.spark_connector import cli
    from mqlog.spark_connector.reconcile import reconcile

    reference, copies, *_rest = _replicas(tmp_path, rng)
    paths = [str(reference), str(copies["short"]), str(copies["diverged"])]
    runner = CliRunner()
    shuffled = runner.invoke(cli.reconcile, [*paths, "--driver-bytes-max", "0", "--out",
                                             str(tmp_path / "shuffled.parquet")])
    assert shuffled.exit_code == 3, shuffled.output  # (findings)

    def no_session(*args, **kwargs):
        raise AssertionError("a Spark session was built")

    monkeypatch.setattr(cli, "session", no_session)
    driver = runner.invoke(cli.reconcile, [*paths, "--out", str(tmp_path / "driver.parquet")])
    assert driver.exit_code == 3, driver.output
    assert driver.output == shuffled.output.replace("shuffled.parquet", "driver.parquet")

    def rows(name):
        return sorted(tuple(row) for row in spark.read.parquet(str(tmp_path / name)).collect())

    assert rows("driver.parquet") == rows("shuffled.parquet") != []
    with pytest.raises(InvalidArgument, match="needs a Spark session"):
        reconcile(None, paths, driver_bytes_max=0)


def _mqlog(capsys, *args):
    """``mqlog ARGS`` as the console script runs it (mqlog.cli.main): its exit status,
    stdout and stderr."""
    from mqlog.cli import main

    with pytest.raises(SystemExit) as done:
        main([str(arg) for arg in args])
    out = capsys.readouterr()
    return done.value.code, out.out, out.err


def test_cli_statuses_tell_findings_from_errors(tmp_path, rng, monkeypatch, capsys):
    """`mqlog reconcile a /nonexist` (a typo) exited 2, the status of replicas that
    differ, and the usage errors of reconcile and replay exited 1, though docs/CLI.md
    says 2 for bad usage. Now: 0 same, 3 findings (no error has it), 1 an operating
    error (a directory that is not a store), 2 bad usage; none of these starts Spark."""
    from mqlog.spark_connector import cli

    def no_session(*args, **kwargs):
        raise AssertionError("a Spark session was built")

    monkeypatch.setattr(cli, "session", no_session)
    source = _fill(tmp_path / "a", rng, count=60)
    same, other = tmp_path / "same", tmp_path / "other"
    shutil.copytree(source, same)
    shutil.copytree(source, other)
    with mqlog.open(other, **SMALL) as store:
        store.put("orders", b"only here")
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out.parquet"
    assert _mqlog(capsys, "reconcile", source, same)[0] == 0
    status, printed, _ = _mqlog(capsys, "reconcile", source, other)
    assert status == 3 and "2 finding(s)" in printed, printed  # (queue and log level)
    for status, args in (
            (1, ["reconcile", source, tmp_path / "nonexist"]),  # a typo: not a store
            (1, ["reconcile", source, tmp_path / "empty"]),
            (2, ["reconcile", source]),  # bad usage
            (1, ["replay", tmp_path / "nonexist", "--to-parquet", out]),
            (2, ["replay", source]),
            (2, ["replay", source, "--to-store", tmp_path / "r", "--to-parquet", out]),
            (2, ["replay", source, "--from", "{bad", "--to-parquet", out]),
            (2, ["replay", source, "--to", "time:soon", "--to-parquet", out]),
            (2, ["replay", source, "--filter", "nosuchcol = 1", "--to-parquet", out])):
        got, printed, said = _mqlog(capsys, *args)
        assert got == status, (args, got, said)
        assert printed == "" and said.startswith("mqlog: error: ") and \
            said.count("\n") == 1, (args, said)
    assert not out.exists() and not (tmp_path / "r").exists()


def test_cli_jobs_remove_sparks_log_on_success_and_name_it_on_failure(spark, tmp_path, rng,
                                                                      monkeypatch):
    """Every successful job left /tmp/mqlog-spark-<pid>.log behind. Now a job removes
    the log it pointed its JVM at when it succeeds (reconcile's findings are a success)
    and keeps it, named in its error line, when it fails. (A session that starts no
    JVM, the tests', writes no log: a stand-in writes one as a JVM would.)"""
    import atexit

    from click.testing import CliRunner

    from mqlog.spark_connector import cli

    log = tmp_path / "mqlog-spark-test.log"
    monkeypatch.setattr(cli, "JVM_LOG", str(log))
    fresh = type("_LogState", (), {"opened": False, "kept": False, "named": False})
    monkeypatch.setattr(cli, "_LogState", fresh, raising=False)  # (this test's own)
    monkeypatch.setattr(atexit, "register", lambda function: function)  # (not pytest's)

    def session(*args, **kwargs):
        with cli._jvm_log():
            os.write(2, b"WARN a JVM's start-up warning\n")
        return spark

    monkeypatch.setattr(cli, "session", session)
    source = _fill(tmp_path / "a", rng, count=60)
    other = tmp_path / "b"
    shutil.copytree(source, other)
    with mqlog.open(other, **SMALL) as store:
        store.put("orders", b"only here")
    runner = CliRunner()
    done = runner.invoke(cli.replay, [str(source), "--to-parquet", str(tmp_path / "out")])
    assert done.exit_code == 0 and "record(s) written" in done.output, done.output
    assert not log.exists()
    found = runner.invoke(cli.reconcile, [str(source), str(other), "--driver-bytes-max", "0"])
    assert found.exit_code == 3 and not log.exists(), found.output
    failed = runner.invoke(cli.replay, [str(source), "--to-store", str(source)])  # itself
    assert failed.exit_code == 1, failed.output
    assert failed.stderr.strip().endswith(f"; Spark's log: {log}"), failed.stderr
    assert log.read_text() == "WARN a JVM's start-up warning\n"  # (the failed job's)
    cli.discard_jvm_log()  # (a later success in the same process keeps it too)
    assert log.exists()


def test_a_programs_spark_log_goes_when_it_exits_unless_an_exception_ends_it(tmp_path):
    """``session()`` outside the commands (``make demo``, benchmarks/spark_jobs.py) left
    its log behind too: it is removed when the program exits, and kept and named on
    stderr when an uncaught exception ends the program."""
    import subprocess
    import sys

    program = """if True:
        import os, sys
        from mqlog.spark_connector import cli
        cli.JVM_LOG = sys.argv[1]
        with cli._jvm_log():  # as session() does before it starts a JVM
            os.write(2, b"WARN a JVM's start-up warning\\n")
        assert os.path.exists(cli.JVM_LOG)
        if sys.argv[2] == "fail":
            raise RuntimeError("the program failed")
    """
    for ending in ("succeed", "fail"):
        log = tmp_path / f"{ending}.log"
        done = subprocess.run([sys.executable, "-c", program, str(log), ending],
                              capture_output=True, text=True, timeout=120)
        if ending == "succeed":
            assert done.returncode == 0 and done.stderr == "", done.stderr
            assert not log.exists()
        else:
            assert done.returncode == 1 and "RuntimeError: the program failed" in done.stderr
            assert done.stderr.endswith(f"mqlog: Spark's log: {log}\n"), done.stderr
            assert log.read_text() == "WARN a JVM's start-up warning\n"


def test_the_filter_check_refuses_unknown_names_only():
    from mqlog.errors import InvalidArgument
    from mqlog.spark_connector.replay import check_filter

    for good in ("queue_id = 1 AND offset >= 100", "tags = 'paid'", "Offset < 3",
                 "properties['n'] = '5' OR key IS NULL", "length(body) > 3",
                 "exists(map_keys(properties), k -> k = 'nosuchcol')",
                 "transform_keys(properties, (k, v) -> upper(k)) IS NOT NULL",
                 "timestamp >= TIMESTAMP '2024-01-01' - INTERVAL 1 DAY",
                 "CAST(offset AS STRING) = \"x\"", "`offset` IN (1, 2)",
                 "timestamp < current_timestamp"):
        check_filter(good)
    for bad in ("nosuchcol = 1", "offset > 1 AND `nope` = 2", "upper(tag) = 'A'", " "):
        with pytest.raises(InvalidArgument):
            check_filter(bad)


def _raft_like(tmp_path):
    """A reference store with control records (a leader's no-ops: empty topic) and
    records a producer tagged (producer_id, sequence; the later ones a second life's, with
    producer_epoch), and a copy with one more record in orders/0 and one more control
    record."""
    reference = tmp_path / "a"
    with mqlog.open(reference, **SMALL) as store:
        store.append_control()
        for index in range(20):
            epoch = {"producer_epoch": 7} if index >= 10 else {}
            store.put("orders", b"o%d" % index, index % 2,
                      properties={"producer_id": "p1", "sequence": index, "x": "1", **epoch})
        store.set_epoch(2)
        store.append_control()
        store.put("orders", b"late", 0)
    copy = tmp_path / "b"
    shutil.copytree(reference, copy)
    with mqlog.open(copy, **SMALL) as store:
        store.append_control()
        store.put("orders", b"extra", 0)
    return reference, copy


def test_reconcile_counts_queue_and_log_findings_and_leaves_control_records_out_of_queues(
        spark, tmp_path):
    from mqlog.spark_connector.reconcile import format_counts, reconcile

    reference, copy = _raft_like(tmp_path)
    found = reconcile(spark, [str(reference), str(copy)])
    assert found.counts == {("queue", "extra"): 1, ("log", "extra"): 2}
    rows = found.summary_rows()
    assert [(r["topic"], r["queue_id"], r["extra"], r["common_prefix"], r["queue_end"])
            for r in rows] == [("orders", 0, 1, 11, 12), ("orders", 1, 0, 10, 10)]
    text = format_counts(found)
    assert text.startswith("3 finding(s): 1 queue-level") and "2 log-level" in text
    assert found.findings.count() == 3
    assert sorted(found.summary.columns) == sorted(rows[0])


def test_replay_leaves_out_the_producer_tag_and_marks_records_with_strings(spark,
                                                                            tmp_path):
    from mqlog.spark_connector import replay

    source, _copy = _raft_like(tmp_path)
    target, out = tmp_path / "dst", str(tmp_path / "out.parquet")
    frame = replay.select(spark, str(source))
    assert replay.to_store(frame, str(source), str(target)).written == 21
    with mqlog.open(target, read_only=True) as store:
        records = store.get("orders", 0, 0, 100) + store.get("orders", 1, 0, 100)
    assert len(records) == 21
    for record in records:
        marks = {key: value for key, value in record.properties.items()
                 if key.startswith("mqlog.replay.")}
        assert all(isinstance(value, str) for value in marks.values()), marks
        assert "producer_id" not in record.properties
        assert "sequence" not in record.properties
        assert "producer_epoch" not in record.properties
    assert replay.to_parquet(frame, out) == 21
    written = spark.read.parquet(out).collect()
    assert {tuple(sorted(row.properties)) for row in written} == {("x",), ()}


# Properties that look like the idempotent producer's tag by name, and are it or not by
# their msgpack types (the engine's rule: a str producer_id, an int sequence >= 0 and, if
# there, an int producer_epoch >= 0; bool is no int).
_LOOK_ALIKES = [
    {"producer_id": "shop-7", "sequence": "42", "note": "x"},  # text: a user's, kept
    {"producer_id": 7, "sequence": 3, "note": "y"},  # an int producer id: no tag
    {"producer_id": "p1", "sequence": 3, "x": "1"},  # the tag, no epoch
    {"producer_id": "p1", "sequence": 4, "producer_epoch": 9, "x": "1"},  # the tag
    {"producer_id": "p1", "sequence": (1 << 64) - 1},  # the tag, msgpack's largest int
    {"producer_id": "p1", "sequence": True, "note": "z"},  # bool: no tag
    {"producer_id": "p1", "sequence": -1},  # negative: no tag
    {"producer_id": "p1", "sequence": "-3"},
    {"producer_id": "p1", "sequence": 5, "producer_epoch": "7"},  # a text epoch: no tag
    {"producer_id": "p1", "sequence": 5, "producer_epoch": None},
    {"producer_id": None, "sequence": 1},
    {"producer_id": "p1", "sequence": 1.0},
    {"producer_id": "", "sequence": 0, "producer_epoch": 0},  # the tag (the engine's rule)
    {"sequence": 8}, {"producer_id": "p1"}, {"producer_epoch": 2, "n": [1, "a"]},
]


def _look_alike(rng):
    """Random properties named like the tag (each name absent or a value of some type)."""
    pools = {"producer_id": ["p2", "7", 7, None, b"p", True],
             "sequence": [0, 12, "12", -4, 2.5, False, None, "x"],
             "producer_epoch": [0, 3, "3", -1, None, True]}
    found = {name: rng.choice(pool) for name, pool in pools.items() if rng.random() < 0.8}
    return {**found, **({"u": rng.randrange(5)} if rng.random() < 0.5 else {})}


def _engine_tagged(path):
    """The offsets of the records the engine reads a producer tag in: the idempotence
    table's own scan of the log (what a new leader rebuilds its table from)."""
    from mqlog.replication.idempotence import producer_tags

    found = set()
    with mqlog.open(path, read_only=True) as store:
        position = store.first_segment_base()
        while position < store.written_position:
            data = store.read_raw(position, 1 << 20)
            found |= {stored.offset for _tag, stored in producer_tags(position, data)}
            position += len(data)
    return found


def test_both_replays_leave_out_the_engines_producer_tag_and_no_user_property(spark,
                                                                             tmp_path, rng):
    """Replay to Parquet told the producer's tag from the properties' text (a
    ``producer_id`` and a ``sequence`` of digits), replay to a store from their msgpack
    types, and neither as the engine does: a user's ``sequence: "42"`` beside
    ``producer_id: "shop-7"`` was dropped from the Parquet output only, and a bool or
    negative ``sequence``, or a text epoch, from the store's only (a hostile review). Now
    both leave out exactly the tag the engine itself reads in the record, and every
    other property as it is (in the store with its msgpack type)."""
    import msgpack

    from mqlog.spark_connector import replay
    from mqlog.spark_connector.layout import _property_text
    from mqlog.spark_connector.schema import COLUMNS

    cases = _LOOK_ALIKES + [_look_alike(rng) for _ in range(40)]
    source = tmp_path / "src"
    with mqlog.open(source, **SMALL) as store:
        for index, properties in enumerate(cases):
            store.put("orders", b"m%d" % index, 0, properties=properties)
    tagged = _engine_tagged(source)
    assert {0, 1, 5, 6, 7, 8, 9, 10, 11} & tagged == set() and {2, 3, 4, 12} <= tagged
    wanted = [{key: value for key, value in properties.items()
               if offset not in tagged or key not in replay.IDEMPOTENCE_PROPERTIES}
              for offset, properties in enumerate(cases)]

    frame = replay.select(spark, str(source))
    out, target = str(tmp_path / "out.parquet"), tmp_path / "dst"
    assert replay.to_parquet(frame, out) == len(cases)
    written = spark.read.parquet(out)
    assert tuple(written.columns) == COLUMNS  # the source's, in order
    got = {row.offset: dict(row.properties) for row in written.collect()}
    assert got == {offset: {key: _property_text(value) for key, value in properties.items()}
                   for offset, properties in enumerate(wanted)}

    assert replay.to_store(frame, str(source), str(target)).written == len(cases)
    stored = {row[2]: msgpack.packb(row[6]) for row in _replayed(target)}  # by source offset
    assert stored == {offset: msgpack.packb(properties) for offset, properties
                      in enumerate(wanted)}  # msgpack types kept: 1 and True differ

    # A --filter still sees every property (the tag too): it selects by the source's.
    assert replay.select(spark, str(source), where="properties['producer_id'] = 'p1'") \
        .count() == sum(properties.get("producer_id") == "p1" for properties in cases)


def test_user_properties_is_read_only_when_a_schema_names_it(spark, tmp_path):
    """The hidden column: not in the default schema; named in a user-given one, it is
    ``properties`` without the producer's tag, in queue and commit-log mode alike."""
    from mqlog.spark_connector.schema import COLUMNS

    path = tmp_path / "s"
    with mqlog.open(path, **SMALL) as store:
        store.put("t", b"a", 0, properties={"producer_id": "p", "sequence": 1, "k": "v"})
        store.put("t", b"b", 0, properties={"producer_id": "p", "sequence": "1"})
        store.put("t", b"c", 0)
    assert tuple(spark.read.format("mqlog").load(str(path)).columns) == COLUMNS
    for mode in ("queue", "commitlog"):
        rows = spark.read.format("mqlog").option("mode", mode) \
            .schema("offset BIGINT, user_properties MAP<STRING, STRING>, "
                    "properties MAP<STRING, STRING>").load(str(path)).collect()
        assert sorted((row.offset, dict(row.user_properties), len(row.properties))
                      for row in rows) == [
            (0, {"k": "v"}, 3), (1, {"producer_id": "p", "sequence": "1"}, 2), (2, {}, 0)]


def test_queue_mode_cuts_by_bytes_not_record_counts(tmp_path, rng):
    """Skewed record sizes: two queues of 1,000 small records, two of 1,000 ~4 KiB
    records, one of a single record. Packed into fewer partitions than queues, each
    holds an equal share of the bytes within one record (by record count they would be
    ~25x apart); ``minPartitions`` halves the heaviest queues, not the small ones;
    every record is in exactly one partition; maxRecordsPerPartition still caps each."""
    from mqlog.spark_connector import options, planner

    path = tmp_path / "store"
    sizes = {}
    with mqlog.open(path, **SMALL) as store:
        for index in range(1000):
            for queue_id, size in ((0, 10), (1, 4000), (2, 10), (3, 4000)):
                sizes[(queue_id, index)] = store.put("orders", rng.randbytes(size),
                                                     queue_id).size
        sizes[(9, 0)] = store.put("orders", b"x", 9).size
    biggest = max(sizes.values())

    def plan(slots, **given):
        parts = planner.plan(options.parse({"path": str(path), **given}, slots=slots))
        ranges = [list(p.ranges) if isinstance(p, options.QueueRanges) else [p]
                  for p in parts]
        held = [sum(sizes[(r.queue_id, o)] for r in rs for o in range(r.start, r.end))
                for rs in ranges]
        covered = sorted((r.queue_id, o) for rs in ranges for r in rs
                         for o in range(r.start, r.end))
        assert covered == sorted(sizes)
        return ranges, held

    for slots in (2, 3, 4):
        ranges, held = plan(slots)
        assert len(ranges) == slots
        assert max(held) - min(held) <= biggest, (slots, held)
    ranges, held = plan(1, minPartitions="8")
    assert len(ranges) == 8
    whole = [r.queue_id for rs in ranges for r in rs if r.count == 1000 or r.queue_id == 9]
    assert sorted(whole) == [0, 2, 9], "the small queues are not the ones cut"
    ranges, _held = plan(2, maxRecordsPerPartition="300")
    assert all(sum(r.count for r in rs) <= 300 for rs in ranges)


def test_the_planner_cuts_by_what_stores_hold(tmp_path, rng):
    """Default-config stores (segments allocated at their full size) of a few thousand
    records are one task however many replicas; a large store is cut evenly; no plan
    has more partitions than max(2 x slots, held bytes / 64 MiB)."""
    from mqlog.spark_connector import options, planner

    small = tmp_path / "small"
    with mqlog.open(small) as store:
        for index in range(2000):
            store.put("orders", rng.randbytes(100), index % 4)
    copies = [str(small)] + [str(tmp_path / f"copy{i}") for i in range(2)]
    for copy in copies[1:]:
        shutil.copytree(small, copy)
    held = planner.held_bytes([str(small)])
    assert held < 1 << 20 < os.path.getsize(small / "commitlog" / f"{0:020d}")
    for slots in (1, 2, 8):
        parts = planner.plan(options.parse({"paths": ",".join(copies), "mode": "commitlog"},
                                           slots=slots))
        assert len(parts) == 1
    large = tmp_path / "large"
    with mqlog.open(large, segment_size_bytes=1 << 20, message_size_bytes_max=64 << 10) as store:
        for queue_id in range(3):
            store.put_batch("t", [rng.randbytes(300) for _ in range(20_000)], queue_id)
    held = planner.held_bytes([str(large)])
    for slots, minimum in ((2, 1), (4, 1), (2, 16)):
        parts = planner.plan(options.parse({"path": str(large), "mode": "commitlog",
                                            "minPartitions": str(minimum)}, slots=slots))
        sizes = [_held_in(part) for part in parts]
        assert sum(sizes) == held
        assert len(parts) == max(minimum, min(slots, -(-held // planner.TASK_BYTES_MIN)))
        assert len(parts) <= max(2 * slots, held // planner.STAGE_BYTES, minimum)
        assert max(sizes) - min(sizes) <= 2 * (1 << 20)  # even, within a segment's cut
    for part in planner.plan(options.parse({"path": str(large), "mode": "commitlog"},
                                           slots=2)):
        assert not isinstance(part, options.SegmentRanges) or len(part.ranges) > 1


def _held_in(part):
    """Bytes of records that a partition's ranges hold (up to the store's end)."""
    from mqlog.spark_connector import options

    pieces = part.ranges if isinstance(part, options.SegmentRanges) else (part,)
    total = 0
    for piece in pieces:
        with mqlog.open(piece.path, read_only=True) as store:
            total += max(0, min(piece.end, store.written_position) - piece.start)
    return total


def _blocks(path, language):
    import re

    text = (Path(__file__).parent.parent / path).read_text()
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def test_the_spark_docs_examples_run_on_the_readmes_store(spark, tmp_path, monkeypatch):
    """docs/SPARK.md's batch example and replay commands, on the store README.md's
    example creates (finding 5: they must return rows, not an empty table)."""
    import shlex

    from click.testing import CliRunner

    from mqlog.spark_connector.cli import replay

    monkeypatch.chdir(tmp_path)
    exec(_blocks("README.md", "python")[0], {})  # noqa: S102 - the README's own example
    data = repr(str(tmp_path / "data"))  # Spark's workers do not share the test's cwd
    example = _blocks("docs/SPARK.md", "python")[0].replace(".show()", ".collect()") \
        .replace('"data/"', data)
    lines = example.splitlines()
    lines[-1] = "rows = " + lines[-1]
    scope: dict = {}
    exec("\n".join(lines), scope)  # noqa: S102 - the doc's example
    assert scope["rows"], "the SPARK.md example returns no rows on the README's store"
    commands = [line for block in _blocks("docs/SPARK.md", "sh") for line in
                block.splitlines() if line.startswith("mqlog replay")]
    assert len(commands) == 2
    for command in commands:
        args = [str(tmp_path / arg) if arg in ("data/", "replayed/", "out.parquet") else arg
                for arg in shlex.split(command)[2:]]
        done = CliRunner().invoke(replay, args)
        assert done.exit_code == 0, done.output
        assert not done.output.startswith("0 "), (command, done.output)


def _with_a_lost_record(path, count=120, lost=66, healthy=None):
    """``count`` records "0000", "0001", ... in queue t/0 and a few in u/0, closed
    cleanly (and copied to ``healthy``, if given); then record ``lost`` of t/0 damaged (a
    bit of its body flipped) and `mqlog repair` run, which writes a lost-record filler at
    its offset (as tests/test_recovery_repair.py does)."""
    from mqlog.engine.repair import repair

    with mqlog.open(path, **SMALL) as store:
        results = [store.put("t", b"%04d" % number) for number in range(count)]
        for number in range(5):
            store.put("u", b"u%d" % number)
    if healthy is not None:
        shutil.copytree(path, healthy)
    victim = results[lost]
    segment_dir = path / "commitlog"
    bases = sorted(int(name) for name in os.listdir(segment_dir) if name.isdigit())
    base = max(b for b in bases if b <= victim.position)
    with open(segment_dir / f"{base:020d}", "r+b") as segment:
        at = victim.position + victim.size - 1 - base  # the body's last byte
        segment.seek(at)
        byte = segment.read(1)[0]
        segment.seek(at)
        segment.write(bytes([byte ^ 0x10]))
    assert [(gap.first, gap.count) for gap in repair(path).lost] == [(lost, 1)]
    return path


def test_a_lost_record_reads_as_lost_with_a_null_body(spark, tmp_path):
    """A filler `mqlog repair` wrote read as an ordinary row whose body was its padding;
    now the source's ``lost`` column is true for it (only), its body is null, and the
    engine's read agrees row for row."""
    path = _with_a_lost_record(tmp_path / "store")
    frame = spark.read.format("mqlog").load(str(path))
    assert _spark_rows(frame) == _engine_rows(path)
    rows = frame.select("topic", "offset", "lost", "body", "crc_ok").collect()
    assert len(rows) == 125 and all(row.crc_ok for row in rows)
    assert [(row.topic, row.offset) for row in rows if row.lost] == [("t", 66)]
    assert [row.body for row in rows if row.lost] == [None]
    assert all(bytes(row.body) == b"%04d" % row.offset for row in rows
               if row.topic == "t" and not row.lost)
    # commit-log mode too
    log = spark.read.format("mqlog").option("mode", "commitlog").load(str(path))
    assert [(row.offset, row.body) for row in log.where("lost").collect()] == [(66, None)]


def test_replay_leaves_lost_records_out_and_counts_them(spark, tmp_path):
    """Replay copied a filler as an ordinary record (to a store) or row (to Parquet);
    both leave it out now and say so (``lost``)."""
    from mqlog.spark_connector import replay

    source = _with_a_lost_record(tmp_path / "src")
    target, out = tmp_path / "dst", str(tmp_path / "out.parquet")
    frame = replay.select(spark, str(source), topics="t")
    result = replay.to_store(frame, str(source), str(target))
    with mqlog.open(target, read_only=True) as store:
        records = store.get("t", 0, 0, 200, 1 << 24)
    assert [replay.source_offset(record) for record in records] == \
        [offset for offset in range(120) if offset != 66]
    assert not any(record.lost for record in records)
    assert all(record.body == b"%04d" % replay.source_offset(record) for record in records)
    assert (result.selected, result.written, result.lost) == (120, 119, 1)
    again = replay.to_store(frame, str(source), str(target))
    assert (again.written, again.skipped, again.lost) == (0, 119, 1)
    assert replay.to_parquet(frame, out) == 119
    rows = spark.read.parquet(out).select("offset", "lost", "body").collect()
    assert sorted(row.offset for row in rows) == [o for o in range(120) if o != 66]
    assert not any(row.lost for row in rows) and all(row.body is not None for row in rows)
    written = replay.write_parquet(frame, out)
    assert (written.selected, written.written, written.lost) == (120, 119, 1)


def test_reconcile_shows_a_lost_record_where_a_replica_holds_it(tmp_path):
    """A filler in one copy where the other holds the record is a queue-level divergence
    at that offset (on the driver: no Spark job)."""
    from mqlog.spark_connector.reconcile import reconcile

    healthy = tmp_path / "healthy"
    repaired = _with_a_lost_record(tmp_path / "repaired", healthy=healthy)
    for paths in ([healthy, repaired], [repaired, healthy]):
        found = reconcile(None, list(map(str, paths)))
        assert found.counts.get(("queue", "divergent")) == 1, (paths, found.counts)
        assert set(found.counts) <= {("queue", "divergent"), ("log", "divergent"),
                                     ("log", "missing"), ("log", "extra")}, found.counts
        row = next(row for row in found.summary_rows() if row["topic"] == "t")
        assert (row["divergent"], row["common_prefix"]) == (1, 66), row
