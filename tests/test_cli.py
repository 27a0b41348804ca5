"""The `mqlog` command, run as the installed console script in a subprocess.

Every store here uses small files (a --config TOML with conftest's SMALL settings) so that
segments roll and blank records appear. Errors must be one line on stderr, never a
traceback unless --debug asks for one.
"""

from __future__ import annotations

import hashlib
import json
import os
import selectors
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import mqlog
from mqlog.cli import format_time
from mqlog.replication.local import wait_until
from tests.conftest import SMALL

MQLOG = Path(sys.executable).parent / "mqlog"
TIMEOUT_S = 60


def run(*args: object, stdin: str | bytes | None = None,
        check: bool = True) -> subprocess.CompletedProcess:
    """Run ``mqlog args...``; with ``check``, a non-zero exit fails the test."""
    binary = isinstance(stdin, bytes)
    result = subprocess.run([str(MQLOG), *map(str, args)], input=stdin, capture_output=True,
                            text=not binary, timeout=TIMEOUT_S)
    if check and result.returncode != 0:
        pytest.fail(f"mqlog {args} exited {result.returncode}: {result.stderr!r}")
    return result


def stderr_text(result: subprocess.CompletedProcess) -> str:
    err = result.stderr
    return err.decode() if isinstance(err, bytes) else err


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "small.toml"
    lines = ["[store]"] + [f"{name} = {value}" for name, value in SMALL.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "store"


def produce(store: Path, config: Path, lines: list[str], *options: object) -> dict:
    """Produce ``lines`` with --json; returns the summary."""
    result = run("produce", store, "--config", config, "--json", *options,
                 stdin="".join(line + "\n" for line in lines))
    return json.loads(result.stdout)


def consume_json(store: Path, config: Path, *options: object) -> list[dict]:
    result = run("consume", store, "--config", config, "--format", "json", *options)
    return [json.loads(line) for line in result.stdout.splitlines()]


def assert_one_error_line(result: subprocess.CompletedProcess, status: int = 1) -> str:
    err = stderr_text(result)
    assert result.returncode == status, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("mqlog: error: "), err
    return lines[0]


# --- produce and consume -----------------------------------------------------------------


def test_produce_then_consume_round_trips_lines(store, config):
    lines = ["hello", "wörld ✓", "", "tab\there", "last"]
    result = run("produce", store, "--config", config, "--topic", "orders",
                 stdin="".join(line + "\n" for line in lines))
    assert result.stdout == ""
    assert "produced 5 records to 'orders' queue 0: offsets 0..4" in result.stderr
    consumed = run("consume", store, "--config", config, "--topic", "orders")
    assert consumed.stdout.splitlines() == lines


def test_produce_json_summary_matches_consumed_records(store, config):
    summary = produce(store, config, ["a", "b", "c"], "--topic", "t", "--queue", "3",
                      "--key", "k1", "--tags", "TagA", "--property", "source=cli")
    assert summary["count"] == 3 and summary["queue_id"] == 3
    assert (summary["first_offset"], summary["last_offset"]) == (0, 2)
    records = consume_json(store, config, "--topic", "t")
    assert [r["body"] for r in records] == ["a", "b", "c"]
    assert {(r["key"], r["tags"], r["queue_id"]) for r in records} == {("k1", "TagA", 3)}
    assert all(r["properties"] == {"source": "cli"} for r in records)
    assert [r["offset"] for r in records] == [0, 1, 2]
    assert records[0]["position"] == summary["first_position"]
    assert summary["end_position"] > records[-1]["position"]
    assert all(r["timestamp"] > 0 and r["born_timestamp"] > 0 for r in records)
    assert all("body_encoding" not in r for r in records)


def test_binary_bodies_are_escaped_in_text_and_base64_in_json(store, config, tmp_path):
    source = tmp_path / "input.bin"
    source.write_bytes(b"caf\xc3\xa9 \xff\x01 back\\slash\r\n")
    run("produce", store, "--config", config, "--topic", "bin", "--file", source)
    text = run("consume", store, "--config", config, "--topic", "bin").stdout
    assert text == "café \\xff\\x01 back\\\\slash\n"
    (record,) = consume_json(store, config, "--topic", "bin")
    assert record["body_encoding"] == "base64"
    import base64
    assert base64.b64decode(record["body"]) == b"caf\xc3\xa9 \xff\x01 back\\slash"


def test_batches_and_per_line_keys(store, config):
    summary = produce(store, config, [f"m{i}" for i in range(10)], "--topic", "t",
                      "--batch", "4")
    assert (summary["count"], summary["last_offset"]) == (10, 9)
    produce(store, config, ["alpha:one", "beta:two", "no key here"], "--topic", "t",
            "--key-separator", ":")
    records = consume_json(store, config, "--topic", "t")
    assert [r["body"] for r in records] == [f"m{i}" for i in range(10)] + [
        "one", "two", "no key here"]
    assert [r["key"] for r in records[10:]] == ["alpha", "beta", None]


def test_consume_every_queue_of_a_topic_and_max(store, config):
    produce(store, config, ["q0-a", "q0-b"], "--topic", "t", "--queue", "0")
    produce(store, config, ["q1-a"], "--topic", "t", "--queue", "1")
    produce(store, config, ["other"], "--topic", "u")
    out = run("consume", store, "--config", config, "--topic", "t").stdout
    assert out.splitlines() == ["q0-a", "q0-b", "q1-a"]
    out = run("consume", store, "--config", config, "--topic", "t", "--queue", "1").stdout
    assert out.splitlines() == ["q1-a"]
    out = run("consume", store, "--config", config, "--topic", "t", "--max", "2").stdout
    assert out.splitlines() == ["q0-a", "q0-b"]
    out = run("consume", store, "--config", config, "--topic", "t", "--from-offset", "1",
              "--queue", "0").stdout
    assert out.splitlines() == ["q0-b"]


def test_consume_filters_by_tags(store, config):
    for index, tag in enumerate(["TagA", "TagB", "TagC", "TagA"]):
        produce(store, config, [f"{tag}-{index}"], "--topic", "t", "--tags", tag)
    produce(store, config, ["untagged"], "--topic", "t")
    out = run("consume", store, "--config", config, "--topic", "t",
              "--tags", "TagA || TagC").stdout
    assert out.splitlines() == ["TagA-0", "TagC-2", "TagA-3"]


def test_consume_from_time(store, config):
    produce(store, config, ["early-1", "early-2"], "--topic", "t")
    produce(store, config, ["late-1", "late-2"], "--topic", "t")
    records = consume_json(store, config, "--topic", "t")
    late = next(r for r in records if r["body"] == "late-1")["timestamp"]
    early = max(r["timestamp"] for r in records if r["body"].startswith("early"))
    assert early < late  # two processes, started one after the other
    expected = [r["body"] for r in records if r["timestamp"] >= late]
    assert expected[:2] == ["late-1", "late-2"]
    out = run("consume", store, "--config", config, "--topic", "t", "--from-time", late).stdout
    assert out.splitlines() == expected
    iso = format_time(late)  # e.g. 2026-01-02T03:04:05.678Z
    out = run("consume", store, "--config", config, "--topic", "t", "--from-time", iso).stdout
    assert out.splitlines() == expected


def test_group_commit_then_continue(store, config):
    produce(store, config, [f"m{i}" for i in range(5)], "--topic", "t")
    first = run("consume", store, "--config", config, "--topic", "t", "--group", "billing",
                "--commit", "--max", "2").stdout
    assert first.splitlines() == ["m0", "m1"]
    rest = run("consume", store, "--config", config, "--topic", "t", "--group", "billing",
               "--commit").stdout
    assert rest.splitlines() == ["m2", "m3", "m4"]
    again = run("consume", store, "--config", config, "--topic", "t", "--group", "billing",
                "--commit").stdout
    assert again == ""
    facts = json.loads(run("inspect", store, "--config", config, "--json").stdout)
    assert facts["groups"] == [{"group": "billing", "topic": "t", "queue_id": 0,
                                "committed_offset": 5, "lag": 0}]
    # A group that only reads does not move its offset.
    peek = run("consume", store, "--config", config, "--topic", "t", "--group", "audit")
    assert peek.stdout.splitlines() == [f"m{i}" for i in range(5)]
    facts = json.loads(run("inspect", store, "--config", config, "--json").stdout)
    assert [g["group"] for g in facts["groups"]] == ["billing"]


def test_from_offset_starts_each_queue_within_its_offsets(store, config):
    """--from-offset N over queues of different lengths: a queue that ends before N has
    nothing to print (no error, after printing the others' records, as before), and
    starts at its end; a note on stderr names it. So does one that begins past N."""
    produce(store, config, [f"q0-{i}" for i in range(10)], "--topic", "t", "--queue", "0")
    produce(store, config, [f"q1-{i}" for i in range(3)], "--topic", "t", "--queue", "1")
    result = run("consume", store, "--config", config, "--topic", "t", "--from-offset", "5")
    assert result.stdout.splitlines() == [f"q0-{i}" for i in range(5, 10)]
    assert result.stderr.splitlines() == [
        "mqlog: note: queue 1 of 't' ends at offset 3, before offset 5: starting at its end"]
    result = run("consume", store, "--config", config, "--topic", "t", "--from-offset", "99",
                 "--queue", "0")
    assert result.stdout == "" and "queue 0 of 't' ends at offset 10" in result.stderr
    result = run("consume", store, "--config", config, "--topic", "t", "--from-offset", "2",
                 "--format", "json")
    assert [(r["queue_id"], r["offset"]) for r in map(json.loads, result.stdout.splitlines())
            ] == [(0, i) for i in range(2, 10)] + [(1, 2)]
    assert result.stderr == ""


def test_a_group_committed_past_a_queues_end_commits_every_queue(store, config):
    """A group's committed offset past its queue's end (the log was cut since) made
    `consume --group --commit` print and commit the queues before that one, then fail:
    a re-run started from a half-moved group. Every queue's start is now within its
    offsets before anything is printed: the queue cut starts at its end (noted)."""
    produce(store, config, ["q0-0", "q0-1", "q0-2"], "--topic", "t", "--queue", "0")
    produce(store, config, ["q1-0", "q1-1", "q1-2"], "--topic", "t", "--queue", "1")
    run("consume", store, "--config", config, "--topic", "t", "--group", "g", "--commit")
    [cut] = [r for r in consume_json(store, config, "--topic", "t", "--queue", "1")
             if r["offset"] == 1]
    with mqlog.open(store, **SMALL) as opened:  # q1 ends at offset 1 now; g committed 3
        opened.truncate(cut["position"])
    produce(store, config, ["q0-3", "q0-4"], "--topic", "t", "--queue", "0")
    result = run("consume", store, "--config", config, "--topic", "t", "--group", "g",
                 "--commit")
    assert result.stdout.splitlines() == ["q0-3", "q0-4"]
    assert result.stderr.splitlines() == [
        "mqlog: note: queue 1 of 't' ends at offset 1, before g's committed offset 3: "
        "starting at its end"]
    facts = json.loads(run("inspect", store, "--config", config, "--json").stdout)
    assert [(g["queue_id"], g["committed_offset"]) for g in facts["groups"]] == [(0, 5),
                                                                                (1, 1)]


def test_produce_stopped_by_ctrl_c_says_what_it_stored(store, config):
    """Ctrl-C (SIGINT) in the middle of a produce: exit 130 and an empty stderr, so the
    user could not tell where to go on (a new user's review). It now says how many
    records it stored, as lines 1..N, and from which line to produce again, counted
    from the queue itself (exact wherever the signal came); the store is closed cleanly."""
    import signal

    producer = subprocess.Popen([str(MQLOG), "produce", str(store), "--config", str(config),
                                 "--topic", "t"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    try:
        assert producer.stdin is not None
        producer.stdin.write(b"".join(b"line-%d\n" % number for number in range(1, 6)))
        producer.stdin.flush()

        def stored() -> int:
            if not (store / "meta.json").exists():
                return 0
            with mqlog.open(store, read_only=True) as snapshot:
                return snapshot.max_offset("t")
        wait_until(lambda: stored() == 5, "the five lines stored", TIMEOUT_S)
        producer.send_signal(signal.SIGINT)  # (its input still open: as Ctrl-C to it alone)
        producer.wait(TIMEOUT_S)
        _, err = producer.communicate(timeout=TIMEOUT_S)
    finally:
        if producer.poll() is None:
            producer.kill()
            producer.wait()
    assert producer.returncode == 130
    assert "interrupted: produced 5 records to 't' queue 0 (lines 1..5, offsets 0..4); " \
        "to go on, produce again from line 6" in err.decode(), err
    with mqlog.open(store, config=mqlog.config.load(config)) as reopened:
        assert reopened.recovery_report.clean  # (closed cleanly: no recovery scan)
        assert [r.body for r in reopened.get("t", 0, 0, 10)] == \
            [b"line-%d" % number for number in range(1, 6)]


def test_produce_stopped_by_a_bad_line_says_what_it_stored(store, config):
    """A line that cannot be stored ends produce; the lines before it stay stored. The
    error said only what was wrong with the line, so a re-run of the whole input stored
    those lines twice: now it says how many records were stored (lines 1..N) and from
    which line to produce again, and --json prints the summary of what was stored."""
    result = run("produce", store, "--config", config, "--topic", "t", "--json",
                 "--key-separator", ":", stdin=b"k1:a\nk2:b\n\xff:c\nk4:d\n", check=False)
    line = assert_one_error_line(result)
    assert "line 3: its key is not UTF-8" in line
    assert "the 2 records before it, lines 1..2, were stored in 't' queue 0 (offsets 0..1)" \
        in line and "produce from line 3 again" in line
    assert json.loads(result.stdout)["count"] == 2
    run("produce", store, "--config", config, "--topic", "t", "--key-separator", ":",
        stdin=b"k3:c\nk4:d\n")  # the rest, fixed
    assert [(r["key"], r["body"]) for r in consume_json(store, config, "--topic", "t")] == [
        ("k1", "a"), ("k2", "b"), ("k3", "c"), ("k4", "d")]
    # A batch is stored whole or not at all: the error names its lines.
    big = "x" * SMALL["message_size_bytes_max"]
    result = run("produce", store, "--config", config, "--topic", "u", "--batch", "2",
                 stdin="".join(f"{body}\n" for body in ["a", "b", "c", big, "e"]),
                 check=False)
    line = assert_one_error_line(result)
    assert line.startswith("mqlog: error: lines 3..4 (one batch): record of ")
    assert "the 2 records before it, lines 1..2, were stored in 'u' queue 0" in line
    assert result.stdout == ""
    assert [r["body"] for r in consume_json(store, config, "--topic", "u")] == ["a", "b"]
    # The first line refused: nothing stored, and the error says so.
    line = assert_one_error_line(run("produce", store, "--config", config, "--topic", "v",
                                     stdin=f"{big}\nb\n", check=False))
    assert line.startswith("mqlog: error: line 1: record of ")
    assert line.endswith("; nothing was stored")


# --- follow ------------------------------------------------------------------------------


def read_lines(process: subprocess.Popen, count: int, timeout_s: float) -> list[str]:
    """Read ``count`` lines of the process's stdout, failing after ``timeout_s``."""
    assert process.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline, buffer, lines = time.monotonic() + timeout_s, b"", []
    fd = process.stdout.fileno()
    while len(lines) < count:
        left = deadline - time.monotonic()
        if left <= 0 or not selector.select(left):
            pytest.fail(f"waited {timeout_s} s for {count} lines, got {lines}")
        chunk = os.read(fd, 65536)
        if not chunk:
            pytest.fail(f"the follower ended after {lines}")
        buffer += chunk
        *whole, buffer = buffer.split(b"\n")
        lines.extend(line.decode() for line in whole)
    return lines


def test_follow_sees_records_produced_by_another_process(store, config):
    produce(store, config, ["before-1", "before-2"], "--topic", "t")
    follower = subprocess.Popen([str(MQLOG), "consume", str(store), "--config", str(config),
                                 "--topic", "t", "--follow", "--poll-ms", "20",
                                 "--timeout-ms", str(TIMEOUT_S * 1000)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert read_lines(follower, 2, TIMEOUT_S) == ["before-1", "before-2"]
        # The follower does not hold the store: a producer can open it now.
        produce(store, config, ["after-1"], "--topic", "t")
        produce(store, config, ["other-topic"], "--topic", "u")
        produce(store, config, ["new-queue"], "--topic", "t", "--queue", "7")
        assert read_lines(follower, 2, TIMEOUT_S) == ["after-1", "new-queue"]
    finally:
        follower.terminate()
        follower.wait(TIMEOUT_S)
        follower.stdout.close()  # type: ignore[union-attr]
        follower.stderr.close()  # type: ignore[union-attr]


def test_follow_stops_after_max_records_and_when_idle(store, config):
    produce(store, config, ["a", "b", "c"], "--topic", "t")
    result = run("consume", store, "--config", config, "--topic", "t", "--follow",
                 "--max", "2")
    assert result.stdout.splitlines() == ["a", "b"]
    result = run("consume", store, "--config", config, "--topic", "t", "--follow",
                 "--timeout-ms", "100", "--from-offset", "1")
    assert result.stdout.splitlines() == ["b", "c"]


def test_follow_stops_with_one_error_line_at_a_damaged_record(store, config):
    """A record damaged below the store's saved flushed position was written whole
    once: --follow took it for one still being written and waited there for good, with
    no word (and --timeout-ms then ended it with status 0, the records after it never
    delivered: a hostile review). It stops there now as consume without --follow does:
    the records before it, then one error line naming it, status 1."""
    produce(store, config, [str(number) for number in range(1, 301)], "--topic", "t")
    with mqlog.open(store, read_only=True) as snapshot:
        damaged = snapshot.get("t", 0, 150, 1)[0]
    segment = store / "commitlog" / f"{0:020d}"
    data = bytearray(segment.read_bytes())
    data[damaged.position + damaged.size - 1] ^= 0x10
    segment.write_bytes(bytes(data))
    result = run("consume", store, "--config", config, "--topic", "t", "--follow",
                 "--poll-ms", "20", "--timeout-ms", str(TIMEOUT_S * 1000), check=False)
    assert result.stdout.splitlines() == [str(number) for number in range(1, 151)]
    line = assert_one_error_line(result)
    assert f"corrupt record at position {damaged.position}" in line


# --- query, inspect, stats, dump ---------------------------------------------------------


def test_query_by_key_and_by_time(store, config):
    produce(store, config, ["order-1:created", "order-2:created", "order-1:paid"],
            "--topic", "orders", "--key-separator", ":")
    out = run("query", store, "--config", config, "--topic", "orders", "--key", "order-1")
    lines = out.stdout.splitlines()
    assert len(lines) == 2
    assert "key: order-1" in lines[0] and lines[0].endswith("body: paid")  # newest first
    assert lines[1].endswith("body: created") and "offset: 0" in lines[1]
    found = [json.loads(line) for line in run(
        "query", store, "--config", config, "--topic", "orders", "--key", "order-2",
        "--json").stdout.splitlines()]
    assert [(r["key"], r["body"], r["offset"]) for r in found] == [("order-2", "created", 1)]
    by_time = [json.loads(line) for line in run(
        "query", store, "--config", config, "--topic", "orders", "--time", "0..",
        "--format", "json").stdout.splitlines()]
    assert [r["body"] for r in by_time] == ["created", "created", "paid"]
    none = run("query", store, "--config", config, "--topic", "orders", "--key", "order-1",
               "--time", "..0")
    assert none.stdout == ""


def fill(store: Path, config: Path, count: int = 300, size: int = 500) -> list[str]:
    """Enough records to fill a few 64 KiB segments."""
    bodies = [f"{index:05d}-" + "x" * size for index in range(count)]
    produce(store, config, bodies, "--topic", "big", "--batch", "16")
    return bodies


def test_inspect_shows_segments_positions_queues(store, config):
    fill(store, config)
    facts = json.loads(run("inspect", store, "--config", config, "--json").stdout)
    segments = facts["segments"]
    assert len(segments) >= 3
    for previous, segment in zip(segments, segments[1:], strict=False):
        assert segment["base_position"] == previous["base_position"] + previous["size_bytes"]
        assert previous["used_bytes"] == previous["size_bytes"]
    assert all(s["size_bytes"] == SMALL["segment_size_bytes"] for s in segments)
    positions = facts["positions"]
    last = segments[-1]
    assert positions["written_position"] == last["base_position"] + last["used_bytes"]
    assert positions["committed_position"] == positions["written_position"]
    assert facts["epochs"] == [{"epoch": 0, "first_position": 0}]
    assert facts["queues"] == [{"topic": "big", "queue_id": 0, "min_offset": 0,
                                "max_offset": 300, "records": 300}]
    text = run("inspect", store, "--config", config).stdout
    assert "Segments" in text and "Queues" in text and "written_position" in text
    assert f"{segments[1]['base_position']:020d}" in text
    assert "Consumer groups: none" in text


def test_stats_counts_records_per_topic_and_queue(store, config):
    produce(store, config, ["a", "b", "c"], "--topic", "t", "--queue", "0")
    produce(store, config, ["d"], "--topic", "t", "--queue", "1")
    produce(store, config, ["e", "f"], "--topic", "u")
    facts = json.loads(run("stats", store, "--config", config, "--json").stdout)
    assert facts["totals"]["records"] == 6
    assert facts["totals"]["segments"] == 1 and facts["totals"]["epoch"] == 0
    assert facts["totals"]["log_bytes"] == facts["totals"]["written_position"] > 0
    assert facts["topics"] == [{"topic": "t", "queues": 2, "records": 4},
                               {"topic": "u", "queues": 1, "records": 2}]
    assert [(q["topic"], q["queue_id"], q["records"]) for q in facts["queues"]] == [
        ("t", 0, 3), ("t", 1, 1), ("u", 0, 2)]
    text = run("stats", store, "--config", config).stdout
    assert "Topics" in text and "records" in text


def tree_digest(root: Path) -> dict[str, str]:
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(root.rglob("*")) if path.is_file()}


def test_dump_lists_records_in_position_order_read_only(store, config):
    bodies = fill(store, config, count=200)
    before = tree_digest(store)
    dumped = [json.loads(line) for line in run("dump", store, "--json").stdout.splitlines()]
    assert tree_digest(store) == before  # dump changes nothing
    assert [r["body"] for r in dumped] == bodies
    positions = [r["position"] for r in dumped]
    assert positions == sorted(positions)
    assert all(r["crc"] > 0 and r["size"] > 500 and not r["control"] for r in dumped)
    # Crosses segment boundaries: some record starts in a later segment.
    assert positions[-1] > SMALL["segment_size_bytes"]
    text = run("dump", store, "--from-position", positions[150], "--max", "2").stdout
    lines = text.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"position: {positions[150]} ")
    assert "offset: 150" in lines[0] and "crc: 0x" in lines[0]
    assert lines[1].startswith(f"position: {positions[151]} ")


def test_reading_commands_work_while_another_process_holds_the_store(store, config):
    produce(store, config, ["one", "two"], "--topic", "t")
    with mqlog.open(store, **SMALL) as held:
        held.put("t", b"three")
        held.flush()
        dumped = run("dump", store).stdout.splitlines()
        assert [line.rsplit("body: ", 1)[1] for line in dumped] == ["one", "two", "three"]
        verified = run("verify", store)
        assert "ok: 3 records" in verified.stdout
        consumed = run("consume", store, "--topic", "t")  # a read-only snapshot
        assert consumed.stdout.splitlines() == ["one", "two", "three"]
        locked = run("consume", store, "--topic", "t", "--group", "g", "--commit",
                     check=False)  # committing needs the store itself
        line = assert_one_error_line(locked)
        assert "open in another process" in line


# --- verify ------------------------------------------------------------------------------


def test_verify_clean_store(store, config):
    fill(store, config)
    result = run("verify", store, "--quiet")
    assert result.returncode == 0
    assert result.stdout.startswith("ok: 300 records in ")
    assert "segments" in result.stdout
    assert result.stderr == ""


def corrupt_copy(store: Path, tmp_path: Path, record: dict, at_end: int = 1) -> Path:
    """A copy of the (closed) store with one byte of ``record``'s body flipped."""
    copy = tmp_path / "copy"
    shutil.copytree(store, copy)
    base = record["position"] // SMALL["segment_size_bytes"] * SMALL["segment_size_bytes"]
    segment = copy / "commitlog" / f"{base:020d}"
    data = bytearray(segment.read_bytes())
    where = record["position"] - base + record["size"] - at_end  # the body is last
    data[where] ^= 0x40
    segment.write_bytes(bytes(data))
    return copy


def test_verify_names_the_position_of_a_corrupt_record(store, config, tmp_path):
    fill(store, config)
    dumped = [json.loads(line) for line in run("dump", store, "--json").stdout.splitlines()]
    victim = dumped[len(dumped) * 2 // 3]  # in a later segment, not the first
    assert victim["position"] >= SMALL["segment_size_bytes"]
    copy = corrupt_copy(store, tmp_path, victim)
    result = run("verify", copy, check=False)
    line = assert_one_error_line(result)
    base = victim["position"] // SMALL["segment_size_bytes"] * SMALL["segment_size_bytes"]
    assert f"segment {base:020d}, position {victim['position']}: crc mismatch" in line
    assert f"; the {dumped.index(victim)} records before it are intact" in line
    assert run("verify", store).returncode == 0  # the original is untouched
    dump = run("dump", copy, check=False)
    assert dump.returncode == 1
    assert f"position {victim['position']}" in assert_one_error_line(dump)


def test_verify_rejects_garbage_after_the_last_record(store, config, tmp_path):
    summary = produce(store, config, ["a", "b"], "--topic", "t")
    copy = tmp_path / "copy"
    shutil.copytree(store, copy)
    segment = copy / "commitlog" / f"{0:020d}"
    data = bytearray(segment.read_bytes())
    data[summary["end_position"] + 100] = 0x5A
    segment.write_bytes(bytes(data))
    line = assert_one_error_line(run("verify", copy, check=False))
    assert f"position {summary['end_position']}: non-zero bytes at position " \
           f"{summary['end_position'] + 100}" in line


def test_verify_a_torn_header(store, config, tmp_path):
    summary = produce(store, config, ["a", "b"], "--topic", "t")
    records = consume_json(store, config, "--topic", "t")
    copy = tmp_path / "copy"
    shutil.copytree(store, copy)
    segment = copy / "commitlog" / f"{0:020d}"
    data = bytearray(segment.read_bytes())
    data[records[1]["position"] + 5] ^= 0xFF  # the magic
    segment.write_bytes(bytes(data))
    line = assert_one_error_line(run("verify", copy, check=False))
    assert f"position {records[1]['position']}: bad magic" in line
    assert summary["count"] == 2


# --- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize("args, status, words", [
    (("produce", "{store}", "--topic", "a/b"), 1, "may use only letters"),
    (("consume", "{missing}", "--topic", "t"), 1, "is not an mqlog store"),
    (("consume", "{store}", "--topic", "t", "--from-offset", "-1"), 2, "--from-offset"),
    (("consume", "{store}", "--topic", "nope"), 1, "topic 'nope' has no records"),
    (("consume", "{store}", "--topic", "t", "--commit"), 2, "--commit needs --group"),
    (("consume", "{store}", "--topic", "t", "--group", "g", "--from-offset", "0"), 2,
     "use one of"),
    (("consume", "{store}", "--topic", "t", "--from-time", "yesterday"), 2, "ISO 8601"),
    (("consume", "{store}"), 2, "--topic"),
    (("query", "{store}", "--topic", "t"), 2, "--key"),
    (("frobnicate",), 2, "frobnicate"),
    (("verify", "{missing}"), 1, "is not an mqlog store"),
    (("inspect", "{store}", "--config", "{missing}"), 1, "cannot read config file"),
])
def test_bad_arguments_give_one_clear_line(store, config, tmp_path, args, status, words):
    produce(store, config, ["x"], "--topic", "t")
    names = {"store": store, "missing": tmp_path / "missing"}
    result = run(*[arg.format(**names) for arg in args], stdin="line\n", check=False)
    line = assert_one_error_line(result, status)
    assert words in line
    assert result.stdout == ""
    # Nothing stored was lost, and a bad produce stored nothing.
    assert [r["body"] for r in consume_json(store, config, "--topic", "t")] == ["x"]
    assert not (tmp_path / "missing").exists()


def test_debug_shows_the_traceback(tmp_path):
    for args in (("--debug", "consume", tmp_path / "missing", "--topic", "t"),
                 ("verify", tmp_path / "missing", "--debug")):
        result = run(*args, check=False)
        assert result.returncode != 0
        assert "Traceback (most recent call last)" in result.stderr
        assert "InvalidArgument" in result.stderr


def test_help_version_and_bench_compare_passthrough():
    assert "consume" in run("--help").stdout
    assert mqlog.__version__ in run("--version").stdout
    assert "--follow" in run("consume", "--help").stdout
    result = run("bench", "compare", "--help")
    assert "usage: mqlog bench compare" in result.stdout  # benchmarks/compare.py's parser
