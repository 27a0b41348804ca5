"""Crash tests: writers killed with SIGKILL, and damaged copies of stores.

The promises checked (DESIGN §4 and the issue on crash tests):

* sync flush: every put that returned PUT_OK is there after a crash, intact, at its
  offset and position;
* async flush: what each queue holds after a crash is a prefix of what was written;
* recovery never crashes on damaged files, never hands out a corrupt record, and
  reports where it cut the log.

The kill tests run ``tests/crash_child.py``, which writes a seeded stream and
acknowledges every stored record on stdout. The parent kills it after a seeded number
of acknowledgements, reopens the store and compares it with the stream; several rounds
run on one store, so each child also recovers what the previous one left. A process
kill keeps the page cache, so everything in the mapping survives it; losing unflushed
data (an OS crash) is simulated on copies of a store instead, by zeroing a torn tail and
flipping bits, and so is the loss or damage of the checkpoint, epoch and queue files.

Every test prints its seed; ``MQLOG_TEST_SEED=<seed>`` replays it. The long soak is
marked ``slow`` and runs only with ``-m slow``.
"""

from __future__ import annotations

import bisect
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import mqlog
from mqlog import errors
from mqlog import format as fmt
from mqlog.engine import checkpoint as cp
from mqlog.results import PutStatus
from tests import crash_child as child
from tests.conftest import SMALL

ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).with_name("crash_child.py")
CHILD_TIMEOUT_S = 60.0  # bounds every wait on a child: its whole life, and its reaping
SEGMENT = SMALL["segment_size_bytes"]
assert child.CONFIG["segment_size_bytes"] == SEGMENT


def _require_slow_selected(request: pytest.FixtureRequest) -> None:
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("a long soak: run it with -m slow")


# ==== part 1: real processes killed with SIGKILL ========================================


@dataclass(frozen=True)
class Ack:
    position: int
    size: int
    crc: int


@dataclass
class ChildRun:
    """What one child said before it died."""

    ready_end: int | None = None
    acks: dict[tuple[str, int, int], Ack] = field(default_factory=dict)
    done: bool = False
    errors: list[str] = field(default_factory=list)
    killed: bool = False
    returncode: int | None = None
    stderr: str = ""


def _run_child(store_dir: Path, impl: str, mode: str, seed: int, round_index: int,
               limit: int, kill_after: int, stderr_path: Path) -> ChildRun:
    """Run one child until it has acknowledged ``kill_after`` records, SIGKILL it, and
    collect every line it wrote before it died. The child is always reaped."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    command = [sys.executable, str(CHILD), str(store_dir), impl, mode, str(seed),
               str(round_index), str(limit)]
    run = ChildRun()
    with open(stderr_path, "w+b") as stderr:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=stderr, env=env)
        try:
            _read_until_eof(process, run, kill_after)
            process.wait(timeout=CHILD_TIMEOUT_S)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=CHILD_TIMEOUT_S)
            assert process.stdout is not None
            process.stdout.close()
            stderr.seek(0)
            run.stderr = stderr.read().decode(errors="replace")[-4000:]
    run.returncode = process.returncode
    return run


def _read_until_eof(process: subprocess.Popen, run: ChildRun, kill_after: int) -> None:
    """Parse the child's lines until its stdout closes, killing it at the chosen moment.

    Lines that arrive after the kill was sent were written before the child died: their
    puts returned PUT_OK too, so they count. A torn last line is dropped."""
    assert process.stdout is not None
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    fd = process.stdout.fileno()
    pending = b""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"the child did not die within {CHILD_TIMEOUT_S} s "
                                 f"({len(run.acks)} acks, done={run.done})")
        readable, _, _ = select.select([fd], [], [], remaining)
        if not readable:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            _parse_line(line.decode(), run)
        if not run.killed and run.ready_end is not None and (
                len(run.acks) >= kill_after or run.done):
            os.kill(process.pid, signal.SIGKILL)
            run.killed = True


def _parse_line(line: str, run: ChildRun) -> None:
    kind, *fields = line.split(" ")
    if kind == "A":
        topic, queue_id, offset, position, size, crc = fields
        run.acks[(topic, int(queue_id), int(offset))] = Ack(int(position), int(size), int(crc))
    elif kind == "READY":
        run.ready_end = int(fields[1])
    elif kind == "DONE":
        run.done = True
    elif kind != "T":  # T: stored but not acknowledged; nothing is promised about it
        run.errors.append(line)


def _kill_point(rng: random.Random, total: int) -> int:
    """How many acks to wait for: now and then none at all, often few, else any."""
    roll = rng.random()
    if roll < 0.1:
        return 0
    if roll < 0.35:
        return rng.randint(1, 40)
    return rng.randint(1, total)


def _crash_rounds(tmp_path: Path, impl: str, mode: str, seed: int, rounds: int,
                  limit: int) -> None:
    """Run ``rounds`` children on one store, killing each, and check the store after each."""
    rng = random.Random(seed)
    store_dir = tmp_path / "store"
    writers = child.writers_for(mode)
    acked: dict[tuple[str, int, int], Ack] = {}
    starts: dict[tuple[str, int], int] = {}
    end = 0
    for round_index in range(rounds):
        kill_after = _kill_point(rng, limit * writers)
        context = (f"seed={seed} impl={impl} mode={mode} round={round_index} "
                   f"kill_after={kill_after}")
        run = _run_child(store_dir, impl, mode, seed, round_index, limit, kill_after,
                         tmp_path / f"child-{round_index}.stderr")
        assert not run.errors, f"{context}: the child failed: {run.errors}\n{run.stderr}"
        assert run.killed and run.returncode == -signal.SIGKILL, (
            f"{context}: the child ended with status {run.returncode} before it was killed"
            f"\n{run.stderr}")
        assert run.ready_end == end, (
            f"{context}: the child found the log ending at {run.ready_end}, but the parent "
            f"closed it cleanly at {end}")
        again = sorted(acked.keys() & run.acks.keys())[:5]
        assert not again, f"{context}: offsets acknowledged in an earlier round again: {again}"
        acked.update(run.acks)
        check = CrashCheck(seed, mode, round_index, limit, starts, run, acked, context)
        starts, end = check.verify(store_dir, impl, last=round_index == rounds - 1)


@dataclass
class CrashCheck:
    """Everything the parent verifies after one kill (see the module docstring)."""

    seed: int
    mode: str
    round_index: int
    limit: int
    starts: dict[tuple[str, int], int]  # queue ends when the round began
    run: ChildRun
    acked: dict[tuple[str, int, int], Ack]  # acks of every round so far
    context: str

    def verify(self, store_dir: Path, impl: str, *, last: bool) -> tuple[dict, int]:
        """Reopen, check, and close cleanly; return the queue ends and the log end."""
        store = _open_or_fail(store_dir, impl, self.context, **child.config_for(self.mode))
        try:
            self.check_report(store)
            held = {queue: _read_queue(store, *queue, self.context)
                    for queue in store.queues()}
            assert set(held) <= set(child.QUEUES), f"{self.context}: unknown queues {held}"
            for queue, records in held.items():
                self.check_stream(queue, records)
            self.check_positions(held, store.written_position)
            self.check_acks(held)
            self.check_writer_prefixes(held)
            if last:
                self.check_still_works(store, held)
            ends = {queue: len(records) for queue, records in held.items()}
            end = store.written_position
        finally:
            store.close()
        if last:
            _check_clean_reopen(store_dir, impl, end, self.mode, self.context)
        return ends, end

    def check_report(self, store: mqlog.Store) -> None:
        report, where = store.recovery_report, f"{self.context}: {store.recovery_report}"
        assert not report.clean, f"{where}: the abort marker was left, a scan is due"
        assert report.end_position == store.written_position, where
        assert report.end_position >= self.run.ready_end, f"{where}: lost older records"
        # The child's open wrote a checkpoint at its start; checkpoints only move forward.
        assert self.run.ready_end <= report.scanned_from <= report.end_position, where
        if report.truncated_at is not None:
            assert report.truncated_at == report.end_position, where
            assert report.truncation_reason, where

    def check_stream(self, queue: tuple[str, int], records: list) -> None:
        """The queue holds the seeded stream from offset 0 on: a prefix of what was written."""
        topic, queue_id = queue
        for offset, record in enumerate(records):
            where = f"{self.context}: {topic}/{queue_id} offset {offset}"
            assert (record.topic, record.queue_id, record.offset) == (topic, queue_id,
                                                                      offset), where
            assert record.body == child.body_for(self.seed, topic, queue_id, offset), where
            first, count = record.properties["first"], record.properties["count"]
            assert first <= offset < first + count, where
            assert (record.key, record.tags, record.properties) == child.fields_for(
                self.seed, topic, queue_id, first, count), where
        positions = [record.position for record in records]
        assert all(a < b for a, b in zip(positions, positions[1:], strict=False)), (
            f"{self.context}: {topic}/{queue_id}: positions are not increasing")

    def check_positions(self, held: dict, end: int) -> None:
        positions = [r.position for records in held.values() for r in records]
        assert len(positions) == len(set(positions)), f"{self.context}: a position twice"
        ends = [r.end_position for records in held.values() for r in records]
        assert max(ends, default=0) <= end, f"{self.context}: a record past the log's end"

    def check_acks(self, held: dict) -> None:
        """Every acknowledged record is there, at its offset and position, intact. With
        async flush this is no promise of the store, but a process kill keeps the page
        cache, so recovery must not throw away records that are whole."""
        for (topic, queue_id, offset), ack in sorted(self.acked.items()):
            records = held.get((topic, queue_id), [])
            where = (f"{self.context}: acked record {topic}/{queue_id} offset {offset} at "
                     f"position {ack.position}")
            assert offset < len(records), f"{where} is lost (the queue holds {len(records)})"
            record = records[offset]
            assert (record.position, record.size, zlib.crc32(record.body)) == (
                ack.position, ack.size, ack.crc), where

    def check_writer_prefixes(self, held: dict) -> None:
        """Each writer's records of this round, in log order, are a prefix of its plan
        (async: one writer, so the round's whole log is a prefix of what was written)."""
        writers = child.writers_for(self.mode)
        for writer in range(writers):
            plan = child.writer_plan(self.seed, self.round_index, writer, writers, self.starts,
                                     self.limit)
            planned = [(op.topic, op.queue_id, op.first_offset + index)
                       for op in plan for index in range(op.count)]
            mine = sorted((record.position, record.topic, record.queue_id, record.offset)
                          for queue in child.queues_of(writer, writers)
                          for record in held.get(queue, [])[self.starts.get(queue, 0):])
            found = [entry[1:] for entry in mine]
            assert found == planned[:len(found)], (
                f"{self.context}: writer {writer}'s records are not a prefix of its plan")

    def check_still_works(self, store: mqlog.Store, held: dict) -> None:
        topic, queue_id = child.QUEUES[0]
        offset = len(held.get((topic, queue_id), []))
        body = child.body_for(self.seed, topic, queue_id, offset)
        key, tags, properties = child.fields_for(self.seed, topic, queue_id, offset, 1)
        end = store.written_position
        result = store.put(topic, body, queue_id, key, tags, properties)
        assert result.status is PutStatus.PUT_OK and result.offset == offset, self.context
        assert result.position == _next_position(end, result.size), self.context


def _next_position(end: int, size: int) -> int:
    """Where a record of ``size`` bytes goes when the log ends at ``end``."""
    if end % SEGMENT + size + child.BLANK_SIZE_MIN > SEGMENT:
        return end + SEGMENT - end % SEGMENT
    return end


def _check_clean_reopen(store_dir: Path, impl: str, end: int, mode: str, context: str) -> None:
    with _open_or_fail(store_dir, impl, context, **child.config_for(mode)) as store:
        report = store.recovery_report
        assert report.clean and report.records_scanned == 0, f"{context}: {report}"
        assert report.end_position == end == store.written_position, f"{context}: {report}"


def _open_or_fail(path: Path, impl: str, context: str, **settings: object) -> mqlog.Store:
    try:
        return mqlog.open(path, implementation=impl, **settings)
    except Exception as error:
        pytest.fail(f"{context}: opening (recovery) raised {error!r}")


def _read_queue(store: mqlog.Store, topic: str, queue_id: int, context: str) -> list:
    """Every record of a queue, from offset 0 to its end; a CorruptRecord fails the test."""
    assert store.min_offset(topic, queue_id) == 0, f"{context}: {topic}/{queue_id} min offset"
    end = store.max_offset(topic, queue_id)
    records: list = []
    try:
        while len(records) < end:
            batch = store.get(topic, queue_id, len(records), max_count=512)
            assert batch, f"{context}: get({topic}/{queue_id}, {len(records)}) found nothing"
            records.extend(batch)
        assert store.get(topic, queue_id, end) == [], context
    except errors.CorruptRecord as error:
        pytest.fail(f"{context}: get() raised {error}")
    assert len(records) == end, context
    return records


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_killed_writer_keeps_its_promises(tmp_path, impl, mode, rng):
    """sync: every acked put survives; async: each queue is a prefix of the stream."""
    limit = 3_200 // child.writers_for(mode)  # records per writer and round
    _crash_rounds(tmp_path, impl, mode, rng.randrange(1 << 32), rounds=4, limit=limit)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_soak_many_kills(request, tmp_path, impl, mode, rng):
    _require_slow_selected(request)
    limit = 2_000 // child.writers_for(mode)
    _crash_rounds(tmp_path, impl, mode, rng.randrange(1 << 32), rounds=40, limit=limit)


# ==== part 2: damaged copies of a store =================================================

# The checkpoint stays where each open put it, so the scanned area is known exactly.
# No flushed-position file: these images test the rules recovery applies from the
# checkpoint alone (a store written before the file, or with saving off); a torn page
# can then lie anywhere past the checkpoint. test_flushed_position_* test the file.
IMAGE_CONFIG = {**SMALL, "checkpoint_interval_ms": 3_600_000,
                "flushed_position_save_interval_ms": -1}
IMAGE_QUEUES = [(topic, queue_id) for topic in ("a", "b") for queue_id in range(3)]


@dataclass(frozen=True)
class Rec:
    """A record of the original store, as bytes."""

    topic: str
    queue_id: int
    offset: int
    position: int
    raw: bytes

    @property
    def end(self) -> int:
        return self.position + len(self.raw)


@dataclass(frozen=True)
class Image:
    """A store's files copied from disk, and what the store held when they were copied."""

    path: Path
    records: list[Rec]  # ascending position
    checkpoint: int  # where the checkpoint lets a scan start
    written: int  # where the log ended
    epochs: list[tuple[int, int]]
    crashed: bool  # copied while open (abort marker present) or after a clean close

    def units(self) -> list[tuple[int, int]]:
        """The byte ranges the recovery scan checks: each record whole, the 8-byte header
        of each blank record, and the 8 bytes past the log's end (zero at a clean end)."""
        units: list[tuple[int, int]] = []
        previous_end = 0
        for record in self.records:
            if record.position != previous_end:  # a roll: a blank fills the gap
                units.append((previous_end, previous_end + child.BLANK_SIZE_MIN))
            units.append((record.position, record.end))
            previous_end = record.end
        units.append((self.written, self.written + child.BLANK_SIZE_MIN))
        return units


def _copy_store(source: Path, target: Path) -> None:
    """Copy a store directory, open or not, as a crash leaves it on disk: files still in
    the making (``*.tmp``) and files that vanish while being copied are left out."""
    for directory, _, names in os.walk(source):
        relative = Path(directory).relative_to(source)
        (target / relative).mkdir(parents=True, exist_ok=True)
        for name in names:
            if name.endswith(".tmp"):
                continue
            try:
                shutil.copyfile(Path(directory) / name, target / relative / name)
            except FileNotFoundError:
                pass


def _write_ops(store: mqlog.Store, rng: random.Random, count: int, epoch: int,
               queues: list[tuple[str, int]], size_max: int) -> None:
    for index in range(count):
        if index == count // 2:
            store.set_epoch(epoch)
        topic, queue_id = rng.choice(queues)
        key = f"k{index}" if rng.random() < 0.5 else None
        tags = rng.choice((None, "x", "yy"))

        def body() -> bytes:
            return rng.randbytes(rng.randrange(size_max if rng.random() < 0.1 else 300))

        if rng.random() < 0.15:
            bodies = [body() for _ in range(rng.randint(2, 4))]
            store.put_batch(topic, bodies, queue_id, key=key, tags=tags)
        else:
            store.put(topic, body(), queue_id, key=key, tags=tags)


def _records_of(store: mqlog.Store) -> list[Rec]:
    found = []
    for topic, queue_id in store.queues():
        offset = 0
        while offset < store.max_offset(topic, queue_id):
            for record in store.get(topic, queue_id, offset, max_count=512):
                found.append(Rec(topic, queue_id, record.offset, record.position,
                                 bytes(record.raw)))
                offset += 1
    return sorted(found, key=lambda record: record.position)


def _build_image(root: Path, impl: str, rng: random.Random, *, crashed: bool = True,
                 first_ops: int = 150, second_ops: int = 250,
                 queues: list[tuple[str, int]] = IMAGE_QUEUES,
                 size_max: int = 8_000) -> Image:
    """Write ``first_ops`` and close cleanly, reopen (the checkpoint is now at the end of
    the first part), write ``second_ops``, and copy the files: while the store is open
    (``crashed``: the copy has an abort marker) or after closing it."""
    live = root / "live"
    with mqlog.open(live, implementation=impl, **IMAGE_CONFIG) as store:
        _write_ops(store, rng, first_ops, 1, queues, size_max)
    store = mqlog.open(live, implementation=impl, **IMAGE_CONFIG)
    try:
        checkpoint = store.recovery_report.end_position
        _write_ops(store, rng, second_ops, 4, queues, size_max)
        image = Image(root / "image", _records_of(store), checkpoint, store.written_position,
                      store.epoch_starts(), crashed)
        if crashed:
            _copy_store(live, image.path)
    finally:
        store.close()
    if not crashed:
        _copy_store(live, image.path)
        checkpoint = image.written
    assert (image.path / "abort").exists() == crashed
    saved = cp.read_checkpoint(image.path / "checkpoint")
    assert saved is not None and saved.log_position == checkpoint, "test set-up"
    return image


def _segment_bases(store_path: Path) -> list[int]:
    directory = store_path / "commitlog"
    return sorted(int(name) for name in os.listdir(directory)
                  if name.isdigit() and len(name) == 20)


def _log_bytes(store_path: Path, end: int) -> bytearray:
    """The commit log's bytes [0, end) as the segment files hold them."""
    data = bytearray()
    for base in _segment_bases(store_path):
        if base >= end:
            break
        assert base == len(data), "segments must be contiguous from 0"
        data += (store_path / "commitlog" / f"{base:020d}").read_bytes()
    return data[:end]


def _patch_log(store_path: Path, position: int, data: bytes) -> None:
    """Overwrite log bytes at ``position`` (within one segment) in the segment file."""
    base = position - position % SEGMENT
    assert position % SEGMENT + len(data) <= SEGMENT
    with open(store_path / "commitlog" / f"{base:020d}", "r+b") as file:
        file.seek(position - base)
        file.write(data)


def _zero_log(store_path: Path, start: int, end: int) -> None:
    while start < end:
        stop = min(end, start - start % SEGMENT + SEGMENT)
        _patch_log(store_path, start, bytes(stop - start))
        start = stop


def _flip_bit(store_path: Path, position: int, bit: int) -> None:
    byte = _log_bytes(store_path, position + 1)[position]
    _patch_log(store_path, position, bytes([byte ^ (1 << bit)]))


def _changed_positions(before: bytes, after: bytes) -> list[int]:
    changed = []
    for start in range(0, len(before), 4096):
        if before[start:start + 4096] != after[start:start + 4096]:
            changed += [start + i for i in range(min(4096, len(before) - start))
                        if before[start + i] != after[start + i]]
    return changed


@dataclass(frozen=True)
class Expected:
    end: int  # where the recovered log ends
    truncated_at: int | None
    corrupt: frozenset[int]  # positions of kept records that reads must refuse
    refused: bool = False  # damage with intact records after it: CorruptStore, no open
    torn: bool = False  # a bad record past the checkpoint, intact ones after it: all cut


def _expect(image: Image, copy: Path, scan_from: int) -> Expected:
    """What recovery of ``copy`` must do: derived from which bytes differ from the image.

    The scan starts at ``scan_from`` and stops at the first unit (see Image.units) with a
    changed byte: a clean end if its first 8 bytes are now zero, a truncation otherwise.
    Damaged records before ``scan_from`` are not scanned; reading them must fail. A bad
    record with an intact one after it is damage (refused) before the position of the
    copy's checkpoint, a torn tail (cut there, the intact ones too) at or past it, and
    damage wherever it lies when the copy has no valid checkpoint."""
    span = image.written + child.BLANK_SIZE_MIN
    changed = _changed_positions(_log_bytes(image.path, span), _log_bytes(copy, span))

    def damaged(start: int, end: int) -> bool:
        index = bisect.bisect_left(changed, start)
        return index < len(changed) and changed[index] < end

    end, truncated_at = image.written, None
    for start, stop in image.units():
        if start >= scan_from and damaged(start, stop):
            header = _log_bytes(copy, start + child.BLANK_SIZE_MIN)[start:]
            end, truncated_at = start, (start if any(header) else None)
            break
    corrupt = frozenset(r.position for r in image.records
                        if r.end <= end and damaged(r.position, r.end))
    # A bad record (not zeros) with an intact one anywhere after it is mid-log damage,
    # unless it lies past the checkpoint: then it is a torn tail.
    intact_after = truncated_at is not None and any(
        r.position > truncated_at and not damaged(r.position, r.end) for r in image.records)
    saved = cp.read_checkpoint(copy / "checkpoint")
    torn = intact_after and saved is not None and truncated_at is not None and \
        truncated_at >= saved.log_position
    return Expected(end, truncated_at, corrupt, intact_after and not torn, torn)


def _check_refused(copy: Path, impl: str, expected: Expected, where: str) -> None:
    """Opening must raise CorruptStore naming the damaged position, and change no byte
    of the log (no segment cut, zeroed or deleted)."""
    before = {path.name: path.read_bytes() for path in (copy / "commitlog").iterdir()}
    with pytest.raises(errors.CorruptStore) as raised:
        mqlog.open(copy, implementation=impl, **IMAGE_CONFIG).close()
    message = str(raised.value)
    assert f"damaged: the record at position {expected.truncated_at} " in message, where
    assert "mqlog repair" in message, where
    after = {path.name: path.read_bytes() for path in (copy / "commitlog").iterdir()}
    assert after == before, f"{where}: a refused open changed the log"


def _check_recovered_copy(image: Image, copy: Path, impl: str, context: str, *,
                          scan_from: int | None,
                          extra: Callable[[mqlog.Store, Expected], None] | None = None) -> None:
    """Open a damaged copy and hold it to ``_expect``: the report, the dropped segments,
    the zeroed dead tail, every queue's offsets, every record's bytes, and the epochs."""
    expected = _expect(image, copy, image.written if scan_from is None else scan_from)
    # Segments past the end that held bytes must be reported; an empty one (the
    # allocator's prepared-ahead segment) is removed without being news.
    bases = [base for base in _segment_bases(copy)
             if (copy / "commitlog" / f"{base:020d}").read_bytes()[:8] != bytes(8)]
    if expected.refused:
        _check_refused(copy, impl, expected, f"{context}: expected {expected}")
        return
    store = _open_or_fail(copy, impl, context, **IMAGE_CONFIG)
    with store:
        report = store.recovery_report
        where = f"{context}: expected {expected}, got {report}"
        assert (report.end_position, report.truncated_at) == (
            expected.end, expected.truncated_at), where
        if scan_from is not None:
            assert report.scanned_from == scan_from, where
        assert ("a torn tail" in report.truncation_reason) == expected.torn, where
        assert report.segments_dropped == [base for base in bases if base > expected.end], where
        if not report.clean:
            _check_dead_tail_is_zero(copy, expected.end, where)
        _check_records(store, image, expected, where)
        assert store.epoch_starts() == [(e, p) for e, p in image.epochs if p < expected.end], (
            f"{where}: epoch starts {store.epoch_starts()}, the log had {image.epochs}")
        if extra is not None:
            extra(store, expected)
        result = store.put("a", b"after recovery", 0)
        assert result.position == _next_position(expected.end, result.size), where
        assert result.offset == sum(1 for r in image.records if r.end <= expected.end
                                    and (r.topic, r.queue_id) == ("a", 0)), where


def _check_dead_tail_is_zero(copy: Path, end: int, where: str) -> None:
    base = end - end % SEGMENT
    tail = (copy / "commitlog" / f"{base:020d}").read_bytes()[end - base:]
    assert not any(tail), f"{where}: stale bytes left after the log's end"


def _check_records(store: mqlog.Store, image: Image, expected: Expected, where: str) -> None:
    kept = [record for record in image.records if record.end <= expected.end]
    assert set(store.queues()) <= {(r.topic, r.queue_id) for r in image.records}, where
    for queue in {(r.topic, r.queue_id) for r in image.records}:
        count = sum(1 for r in kept if (r.topic, r.queue_id) == queue)
        assert store.max_offset(*queue) == count, f"{where}: {queue} max offset"
        if count:
            assert store.min_offset(*queue) == 0, f"{where}: {queue} min offset"
    for record in kept:
        if record.position in expected.corrupt:
            with pytest.raises(errors.CorruptRecord) as raised:
                store.get(record.topic, record.queue_id, record.offset, max_count=1)
            assert raised.value.position == record.position, where
            continue
        try:
            [got] = store.get(record.topic, record.queue_id, record.offset, max_count=1)
        except errors.CorruptRecord as error:
            pytest.fail(f"{where}: intact record at {record.position} refused: {error}")
        assert bytes(got.raw) == record.raw, f"{where}: record at {record.position} differs"


def test_torn_tail_is_cut_at_the_first_bad_record(tmp_path, impl, rng):
    """Unflushed pages lost in an OS crash: zero the log from a point inside its last
    records to its end; recovery cuts there, reports it, and keeps everything before.
    (Case 0 cuts at a record's start: that looks like a clean end, so nothing is
    reported, and nothing before it is lost.)"""
    _torn_tails(tmp_path, impl, rng.randrange(1 << 32), cases=12)


def _torn_tails(tmp_path: Path, impl: str, seed: int, cases: int) -> None:
    rng = random.Random(seed)
    image = _build_image(tmp_path, impl, rng)
    low = max(image.checkpoint, image.records[-12].position)
    starts = [record.position for record in image.records if record.position >= low]
    for case in range(cases):
        cut = rng.choice(starts) if case == 0 else rng.randrange(low, image.written)
        copy = tmp_path / f"torn-{case}"
        _copy_store(image.path, copy)
        _zero_log(copy, cut, image.written)
        _check_recovered_copy(image, copy, impl, f"seed={seed} case={case} cut={cut}",
                              scan_from=image.checkpoint)
        shutil.rmtree(copy)


def _unwritten_page(image: Image, low: int, high: int, rng: random.Random) -> int:
    """A page-aligned position in [low, high) whose page holds record bytes (not only a
    blank's zeros), starts no record (zeros there are a bad record, not an end) and has
    intact records after it."""
    starts = {record.position for record in image.records}
    pages = [page for page in range(low - low % 4096 + 4096, high - 4096, 4096)
             if page not in starts and image.records[-1].position > page + 4096
             and any(r.position < page + 4096 and r.end > page for r in image.records)]
    assert pages, f"test set-up: no page in [{low}, {high})"
    return rng.choice(pages)


def test_an_unwritten_page_past_the_checkpoint_is_a_torn_tail(tmp_path, impl, rng):
    """A power loss in async mode may leave a page that was never written in the middle
    of unflushed data, with later pages written (issue 14, part B). Past the checkpoint
    that is a torn tail: the log is cut at the first record the page touches, the intact
    records after it too, and the report says so; the store opens and takes writes.
    Before the checkpoint (found when the epochs file is lost and the scan starts at the
    first segment) it stays damage: CorruptStore, and no byte changes."""
    seed = rng.randrange(1 << 32)
    rng = random.Random(seed)
    image = _build_image(tmp_path, impl, rng)
    for case in range(4):
        copy = tmp_path / f"torn-{case}"
        _copy_store(image.path, copy)
        page = _unwritten_page(image, image.checkpoint, image.written, rng)
        _zero_log(copy, page, page + 4096)
        expected = _expect(image, copy, image.checkpoint)
        assert expected.torn and not expected.refused, f"test set-up: {expected}"
        _check_recovered_copy(image, copy, impl, f"seed={seed} page={page}",
                              scan_from=image.checkpoint)
        with mqlog.open(copy, implementation=impl, **IMAGE_CONFIG) as store:
            assert store.recovery_report.clean  # what the cut left is a whole log
        shutil.rmtree(copy)
    copy = tmp_path / "before"
    _copy_store(image.path, copy)
    page = _unwritten_page(image, 0, image.checkpoint, rng)
    _zero_log(copy, page, page + 4096)
    (copy / "epochs").unlink()
    expected = _expect(image, copy, 0)
    assert expected.refused and not expected.torn, f"test set-up: {expected}"
    _check_refused(copy, impl, expected, f"seed={seed} page={page} before the checkpoint")


def test_killed_async_writer_with_an_unwritten_page_recovers_a_prefix(tmp_path, impl, rng):
    """A real async writer (tests/crash_child.py, no checkpoint after its open) killed
    part way; then a page of what it wrote is zeroed, as a power loss may leave it. The
    store opens (before issue 14 part B: CorruptStore), cut at the first record the page
    touches, every queue a prefix of the seeded stream, and reports a torn tail."""
    seed = rng.randrange(1 << 32)
    store_dir = tmp_path / "store"
    with mqlog.open(store_dir, implementation=impl, **child.config_for(child.TORN_MODE)):
        pass  # a checkpoint at 0, so everything the child writes lies past it
    run = _run_child(store_dir, impl, child.TORN_MODE, seed, 0, 1_500, 1_200,
                     tmp_path / "child.stderr")
    context = f"seed={seed} impl={impl}"
    assert not run.errors and run.killed, f"{context}: {run.errors}\n{run.stderr}"
    acks = sorted(run.acks.values(), key=lambda ack: ack.position)
    page_rng = random.Random(seed)
    page = page_rng.choice([p for p in range(4096, acks[-1].position - 8192, 4096)
                            if p not in {ack.position for ack in acks} and any(
                                a.position < p + 4096 and a.position + a.size > p
                                for a in acks)])  # record bytes, not a blank's zeros
    first_cut = min(ack.position for ack in acks if ack.position + ack.size > page)
    saved = cp.read_checkpoint(store_dir / "checkpoint")
    assert saved is not None and saved.log_position <= page, f"{context}: set-up {saved}"
    _zero_log(store_dir, page, page + 4096)
    store = _open_or_fail(store_dir, impl, context, **child.config_for(child.TORN_MODE))
    with store:
        report = store.recovery_report
        where = f"{context} page={page}: {report}"
        assert report.end_position == report.truncated_at == first_cut, where
        assert "a torn tail" in report.truncation_reason, where
        check = CrashCheck(seed, child.TORN_MODE, 0, 1_500, {}, run, {}, context)
        for queue in store.queues():
            check.check_stream(queue, _read_queue(store, *queue, context))
        kept = [ack for ack in acks if ack.position < first_cut]
        assert sum(store.max_offset(*queue) for queue in store.queues()) == len(kept), where


def test_bit_flips_never_yield_a_corrupt_record(tmp_path, impl, rng):
    """Flip bits before the checkpoint (reads must refuse those records), in the scanned
    area (recovery cuts at the first damaged record if nothing intact follows it, and
    otherwise refuses to open with a CorruptStore naming it: issue 14, finding 12) and
    just past the log's end."""
    _bit_flips(tmp_path, impl, rng.randrange(1 << 32), cases=16)


def _bit_flips(tmp_path: Path, impl: str, seed: int, cases: int) -> None:
    rng = random.Random(seed)
    image = _build_image(tmp_path, impl, rng)
    tail_end = min(image.written + 16, image.written - image.written % SEGMENT + SEGMENT)
    for case in range(cases):
        flips = []
        for _ in range(rng.randint(1, 3)):
            roll = rng.random()
            if roll < 0.45:
                position = rng.randrange(0, image.checkpoint)
            elif roll < 0.9:
                position = rng.randrange(image.checkpoint, image.written)
            else:
                position = rng.randrange(image.written, tail_end)
            flips.append((position, rng.randrange(8)))
        copy = tmp_path / f"flipped-{case}"
        _copy_store(image.path, copy)
        for position, bit in flips:
            _flip_bit(copy, position, bit)
        _check_recovered_copy(image, copy, impl, f"seed={seed} case={case} flips={flips}",
                              scan_from=image.checkpoint)
        shutil.rmtree(copy)


@pytest.mark.slow
def test_soak_damaged_copies(request, tmp_path, impl, rng):
    _require_slow_selected(request)
    seed = rng.randrange(1 << 32)
    for index in range(20):
        _torn_tails(tmp_path / f"torn-{index}", impl, seed + index, cases=30)
        _bit_flips(tmp_path / f"flips-{index}", impl, seed + index, cases=40)


def _damage_file(path: Path, how: str, rng: random.Random) -> None:
    """Damage a small file so that its content really changes (the epochs file is text:
    a lost final newline, or a newline flipped into another line break, changes nothing)."""
    data = bytearray(path.read_bytes())
    if how == "missing":
        path.unlink()
    elif how == "short":
        path.write_bytes(data[:rng.randrange(len(data) - 1)])
    elif how == "garbage":
        path.write_bytes(rng.randbytes(len(data)))
    else:  # one flipped bit
        index = rng.choice([i for i, byte in enumerate(data) if byte != ord("\n")])
        data[index] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))


FILE_DAMAGE = ["missing", "short", "garbage", "bit flip"]


@pytest.mark.parametrize("how", FILE_DAMAGE)
@pytest.mark.parametrize("crashed", [True, False], ids=["crashed", "closed"])
def test_damaged_checkpoint_means_a_full_scan(tmp_path, impl, rng, how, crashed):
    """Without a checkpoint recovery scans from the first segment; a record damaged before
    the old checkpoint is then found by the scan. Intact records follow it, so the store
    refuses to open (CorruptStore naming it) and deletes nothing: before issue 14
    (finding 12) recovery cut the log there and deleted every later, intact segment."""
    seed = rng.randrange(1 << 32)
    rng = random.Random(seed)
    image = _build_image(tmp_path, impl, rng, crashed=crashed)
    copy = tmp_path / "copy"
    _copy_store(image.path, copy)
    _damage_file(copy / "checkpoint", how, rng)
    victim = None
    if crashed:  # also damage a record the old checkpoint would have skipped
        victim = rng.choice([r for r in image.records if r.end <= image.checkpoint])
        _flip_bit(copy, rng.randrange(victim.position, victim.end), rng.randrange(8))

    def full_scan(store: mqlog.Store, expected: Expected) -> None:
        report = store.recovery_report
        assert not report.clean
        assert report.records_scanned == sum(1 for r in image.records if r.end <= expected.end)
        assert expected.truncated_at is None and victim is None
        assert any("checkpoint" in what for what in report.rebuilt), report.rebuilt

    if victim is not None:
        assert _expect(image, copy, 0).refused, "test set-up: intact records follow"

    _check_recovered_copy(image, copy, impl, f"seed={seed} victim={victim}", scan_from=0,
                          extra=full_scan)


@pytest.mark.parametrize("how", FILE_DAMAGE)
@pytest.mark.parametrize("crashed", [True, False], ids=["crashed", "closed"])
def test_damaged_epochs_file_means_a_full_scan(tmp_path, impl, rng, how, crashed):
    """The epochs are learned again from every record, so none is forgotten."""
    seed = rng.randrange(1 << 32)
    rng = random.Random(seed)
    image = _build_image(tmp_path, impl, rng, crashed=crashed)
    assert [epoch for epoch, _ in image.epochs] == [0, 1, 4], "test set-up"
    copy = tmp_path / "copy"
    _copy_store(image.path, copy)
    _damage_file(copy / "epochs", how, rng)

    def epochs_relearned(store: mqlog.Store, expected: Expected) -> None:
        assert store.epoch == 4
        assert store.recovery_report.records_scanned == len(image.records)

    _check_recovered_copy(image, copy, impl, f"seed={seed}", scan_from=0,
                          extra=epochs_relearned)


QUEUE_DAMAGE = {
    "queue directory": lambda files: files,
    "oldest file": lambda files: files[:1],
    "middle file": lambda files: files[len(files) // 2:len(files) // 2 + 1],
    "newest file": lambda files: files[-1:],
}


def _queue_damage_cases() -> list:
    return [pytest.param(crashed, how, id=f"{'crashed' if crashed else 'closed'}-{how}")
            for crashed in (True, False) for how in QUEUE_DAMAGE]


@pytest.mark.parametrize(("crashed", "how"), _queue_damage_cases())
def test_lost_consume_queue_files_are_rebuilt(tmp_path, impl, rng, crashed, how):
    """Consume queues are an index of the log: whatever of them is lost, every record
    is still found at its offset (the queues were rebuilt, or never needed to be)."""
    seed = rng.randrange(1 << 32)
    rng = random.Random(seed)
    victim = ("a", 1)
    # ~270 records for the victim queue (5 files of 64 entries), the checkpoint in file 4.
    image = _build_image(tmp_path, impl, rng, crashed=crashed, first_ops=260, second_ops=40,
                         queues=[victim] * 5 + [("b", 0)], size_max=600)
    copy = tmp_path / "copy"
    _copy_store(image.path, copy)
    queue_dir = copy / "consumequeue" / victim[0] / str(victim[1])
    files = sorted(queue_dir.iterdir())
    assert len(files) >= 4, "test set-up"
    for path in QUEUE_DAMAGE[how](files):
        path.unlink()
    if how == "queue directory":
        queue_dir.rmdir()
    _check_recovered_copy(image, copy, impl, f"seed={seed}", scan_from=None)


# ==== part 3: damaged and missing files (issue 14, finding 8) ===========================
#
# Each kind of file a store holds, damaged each way, on a store closed cleanly and on one
# copied while open. Derived files (consume queues, key index, checkpoint, epochs, the
# queue manifest) never stop an open: the store opens, every record is still found at
# its offset, and the report names what was rebuilt. The log's own files either lose a
# tail (cut and reported; past the checkpoint, garbage with records after it is such a
# tail too) or have a hole with records after it (CorruptStore naming it, and not a
# byte of the log changed). Never an AssertionError, ValueError, struct.error,
# NotADirectoryError, or a hang. The twin also opens each harmed segment under
# ``python -O`` (asserts stripped), in a child process with a deadline.

FILE_KINDS = ["middle segment", "last segment", "consume-queue file", "index file",
              "checkpoint", "epochs", "queue manifest", "flushed position"]
FILE_HARM = ["missing", "empty", "short", "long", "garbage"]
DERIVED = {"consume-queue file", "index file", "checkpoint", "epochs", "queue manifest",
           "flushed position"}
OPEN_DEADLINE_S = 60.0
MATRIX_CONFIG = {**SMALL, "checkpoint_interval_ms": 3_600_000}

_OPEN_SCRIPT = """
import json, sys
from tests.test_crash import open_and_read
print(json.dumps(open_and_read(sys.argv[1], sys.argv[2])))
"""


def open_and_read(path: str | Path, impl: str) -> dict:
    """Open a harmed store, read every queue and a key, write one record, close; say
    what happened (or which CorruptStore / CorruptRecord stopped it) as plain data."""
    try:
        store = mqlog.open(path, implementation=impl, **MATRIX_CONFIG)
    except errors.CorruptStore as error:
        return {"error": type(error).__name__, "message": str(error)}
    try:
        held = {f"{t}/{q}": [bytes(r.raw).hex() for o in range(
            store.min_offset(t, q), store.max_offset(t, q), 64)
            for r in store.get(t, q, o, max_count=64)] for t, q in store.queues()}
    except errors.CorruptRecord as error:
        store.close()
        return {"error": type(error).__name__, "message": str(error)}
    keys = sorted(r.position for r in store.query("a", "k1", max_count=1000))
    report = store.recovery_report
    store.put("a", b"after", 0)
    store.close()
    return {"held": held, "keys": keys, "rebuilt": report.rebuilt,
            "truncated_at": report.truncated_at, "end": report.end_position}


@pytest.fixture(scope="module", params=["closed", "crashed"])
def matrix_image(request, tmp_path_factory):
    """A store of four segments' worth of records in six queues, keyed, indexed."""
    root = tmp_path_factory.mktemp("matrix")
    store = mqlog.open(root / "live", implementation="python", **MATRIX_CONFIG)
    for index in range(700):
        store.put("ab"[index % 2], (index % 251).to_bytes(1, "little") * 300, index % 3,
                  key=f"k{index % 5}")
    store.flush()
    store.query("a", "k1")  # every record indexed
    deadline = time.monotonic() + 60  # the flushed position is saved (its own thread)
    while cp.read_flushed(root / "live" / "flushed") != store.flushed_position:
        assert time.monotonic() < deadline, "the flushed position was never saved"
        time.sleep(0.001)
    if request.param == "crashed":
        _copy_store(root / "live", root / "image")
        store.close()
    else:
        store.close()
        _copy_store(root / "live", root / "image")
    with mqlog.open(root / "live", implementation="python", read_only=True) as snapshot:
        held = {f"{t}/{q}": [bytes(r.raw).hex() for o in range(0, snapshot.max_offset(t, q), 64)
                             for r in snapshot.get(t, q, o, max_count=64)]
                for t, q in snapshot.queues()}
    return root / "image", held


def _victim(image: Path, kind: str) -> Path:
    def with_data(directory: Path) -> list[Path]:
        return [path for path in sorted(directory.iterdir()) if path.read_bytes()[:8] != bytes(8)]

    segments = with_data(image / "commitlog")
    assert len(segments) >= 4, "test set-up"
    return {
        "middle segment": lambda: segments[len(segments) // 2],
        "last segment": lambda: segments[-1],
        "consume-queue file": lambda: sorted((image / "consumequeue" / "a" / "0").iterdir())[1],
        "index file": lambda: sorted((image / "index").iterdir())[0],
        "checkpoint": lambda: image / "checkpoint",
        "epochs": lambda: image / "epochs",
        "queue manifest": lambda: image / "queues",
        "flushed position": lambda: image / "flushed",
    }[kind]()


def _harm(path: Path, how: str) -> None:
    data = path.read_bytes() if path.exists() else b""
    if how == "missing":
        path.unlink(missing_ok=True)
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "short":
        path.write_bytes(data[:max(1, len(data) // 3 + 7)])
    elif how == "long":
        path.write_bytes(data + bytes(4099))
    else:
        path.write_bytes(random.Random(len(data)).randbytes(max(len(data), 64)))


def _open_in_child(path: Path, impl: str, optimized: bool) -> dict:
    """``open_and_read`` in this process, or under ``python -O`` in a child with a
    deadline (where a hang was seen)."""
    import json

    if not optimized:
        return open_and_read(path, impl)
    command = [sys.executable, "-O", "-c", _OPEN_SCRIPT, str(path), impl]
    try:
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                              timeout=OPEN_DEADLINE_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"opening or closing {path} hung for {OPEN_DEADLINE_S} s")
    assert done.returncode == 0, f"opening {path} failed:\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("kind", FILE_KINDS)
def test_damaged_or_missing_files_never_stop_an_open_of_an_intact_log(
        matrix_image, tmp_path, impl, kind):
    """Every kind of file, each way harmed (missing, empty, short, long, garbage), plus
    stray files where a store keeps its own; both cores, and the twin under ``python -O``
    (before issue 14 a missing middle segment opened "clean" there, and close() looped
    forever on a cut last segment)."""
    image, held = matrix_image
    crashed = (image / "abort").exists()
    for how in FILE_HARM:
        copy = tmp_path / how
        _copy_store(image, copy)
        victim = _victim(copy, kind)
        _harm(victim, how)
        # -O strips asserts: the twin must check the log's files for real.
        twin_segment = impl == "python" and kind.endswith("segment") and \
            how in ("missing", "short")
        for optimized in ([False, True] if twin_segment else [False]):
            work = tmp_path / f"{how}-{optimized}"
            shutil.copytree(copy, work)
            where = f"{kind} {how} ({'crashed' if crashed else 'closed'}, -O={optimized})"
            _check_harmed_open(work, impl, optimized, kind, how, held, where)


def _check_harmed_open(path: Path, impl: str, optimized: bool, kind: str, how: str,
                       held: dict, where: str) -> None:
    before = {p.name: p.read_bytes() for p in (path / "commitlog").iterdir()}
    answer = _open_in_child(path, impl, optimized)
    if kind in DERIVED or (kind == "last segment" and how == "long"):
        assert "error" not in answer, f"{where}: {answer}"
        assert answer["held"] == held, f"{where}: records differ after the open"
        assert answer["keys"] == sorted(answer["keys"]) and answer["keys"], where
        if kind in ("consume-queue file", "queue manifest") and how != "long" and \
                "(closed" in where:
            assert any("consume queues rebuilt" in what for what in answer["rebuilt"]), where
        return
    if kind == "middle segment" and how != "garbage":
        assert answer.get("error") == "CorruptStore", f"{where}: {answer}"
        assert "has a hole" in answer["message"] and "mqlog repair" in answer["message"]
        after = {p.name: p.read_bytes() for p in (path / "commitlog").iterdir()}
        assert after == before, f"{where}: a refused open changed the log"
        return
    if kind == "middle segment":
        # Garbage: the image was flushed to its end and saved that position, so the
        # records there were acknowledged as durable: refused (crashed: the scan meets
        # it), or found by reads (closed: a clean open scans nothing).
        assert answer.get("error") in ("CorruptStore", "CorruptRecord"), f"{where}: {answer}"
        assert "mqlog repair" in answer["message"], f"{where}: {answer}"
        return
    # The last segment lost, cut or garbage: everything in it was flushed (the image's
    # saved flushed position is its end), so it is not a torn tail to cut: refused, and
    # nothing changes (before the flushed-position file it was cut as a lost tail; the
    # images of test_an_unwritten_page_* have no such file and still are). Garbage after
    # a clean close is found by reads.
    if answer.get("error") == "CorruptRecord" and how == "garbage":
        assert "mqlog repair" in answer["message"], f"{where}: {answer}"
        return
    if "error" not in answer:  # (cut past the records it held): nothing may be missing
        assert answer["held"] == held, f"{where}: records lost, and the store opened"
        return
    assert answer.get("error") == "CorruptStore", f"{where}: {answer['error']}"
    assert "acknowledged as durable" in answer["message"], f"{where}: {answer}"
    assert "mqlog repair" in answer["message"], f"{where}: {answer}"
    after = {p.name: p.read_bytes() for p in (path / "commitlog").iterdir()}
    assert after == before, f"{where}: a refused open changed the log"


def test_stray_files_are_left_alone(matrix_image, tmp_path, impl):
    """A stray file in consumequeue/ (before issue 14: NotADirectoryError), in a topic's
    directory, in a queue's, in commitlog/ and in index/ is ignored, and survives."""
    image, held = matrix_image
    copy = tmp_path / "copy"
    _copy_store(image, copy)
    strays = [copy / "consumequeue" / "stray", copy / "consumequeue" / "a" / "stray",
              copy / "consumequeue" / "a" / "0" / "stray", copy / "commitlog" / "stray",
              copy / "index" / "stray"]
    for path in strays:
        path.write_bytes(b"not mqlog's")
    (copy / "queues").unlink()  # the rebuild must step around them too
    answer = _open_in_child(copy, impl, optimized=False)
    assert answer["held"] == held
    assert all(path.read_bytes() == b"not mqlog's" for path in strays)


# --- the saved flushed position ------------------------------------------------------------

FLUSHED_CONFIG = {**SMALL, "flush_mode": "sync", "checkpoint_interval_ms": 3_600_000}


def _acked_then_crashed(path: Path, impl: str) -> tuple[list, list, int]:
    """A sync store: 120 records acknowledged (each put returns once it is flushed, and
    the flushed position is saved after its sync), 30 more written and never flushed,
    then a crash (abandon: written pages stay). Returns (acked, unflushed, flushed)."""
    store = mqlog.open(path, implementation=impl, **FLUSHED_CONFIG)
    acked = [store.put("t", b"%04d" % index * 50, queue_id=index % 3) for index in range(120)]
    assert all(result.status == PutStatus.PUT_OK for result in acked)
    flushed = store.flushed_position
    assert flushed == acked[-1].position + acked[-1].size, "test set-up"
    deadline = time.monotonic() + 60  # the saving thread catches up with the last sync
    while cp.read_flushed(path / "flushed") != flushed:
        assert time.monotonic() < deadline, f"never saved: {cp.read_flushed(path / 'flushed')}"
        time.sleep(0.001)
    unflushed = [store.put_nowait("t", b"u" * 200, queue_id=0) for _ in range(30)]
    store.abandon("test: a crash")
    assert cp.read_flushed(path / "flushed") == flushed
    assert cp.read_checkpoint(path / "checkpoint").log_position == 0, "test set-up"
    return acked, unflushed, flushed


def _log_files(path: Path) -> dict[str, bytes]:
    return {item.name: item.read_bytes() for item in (path / "commitlog").iterdir()}


def test_flushed_position_damage_before_it_is_refused_after_it_is_a_torn_tail(
        tmp_path, impl):
    """The sync-mode torn-tail trade-off (issue 14): acknowledged records damaged past
    the last checkpoint were cut as a torn tail. The flushed position is now saved after
    each log sync, and recovery refuses a log that is damaged before it (a bad record
    with intact ones after it, or with none: the end of what was acknowledged) and
    changes nothing; damage past it is still a torn tail, cut and reported."""
    original = tmp_path / "original"
    acked, unflushed, flushed = _acked_then_crashed(original, impl)
    cases = {  # name -> (where the damage starts, whether a record follows intact)
        "acknowledged, intact after": (acked[100].position, True),
        "acknowledged, the end": (acked[-1].position, False),
        "unflushed": (unflushed[5].position, True),
    }
    for name, (position, intact_after) in cases.items():
        copy = tmp_path / name.replace(",", "").replace(" ", "-")
        _copy_store(original, copy)
        _flip_bit(copy, position + 80, 3)  # in the record's body: its CRC fails
        if not intact_after:
            _zero_log(copy, position + 100, unflushed[-1].position + unflushed[-1].size)
        before = _log_files(copy)
        if position >= flushed:
            with mqlog.open(copy, implementation=impl, **FLUSHED_CONFIG) as store:
                report = store.recovery_report
                assert report.truncated_at == report.end_position == position, name
                assert "a torn tail" in report.truncation_reason, name
                assert [r.body for r in store.get("t", 1, 0, 1000)] == \
                    [b"%04d" % index * 50 for index in range(1, 120, 3)], name
            continue
        with pytest.raises(errors.CorruptStore, match="mqlog repair") as refused:
            mqlog.open(copy, implementation=impl, **FLUSHED_CONFIG)
        assert str(position) in str(refused.value), name
        if not intact_after:
            assert f"[{position}, {flushed})" in str(refused.value), name
            assert "acknowledged as durable" in str(refused.value), name
        assert _log_files(copy) == before, f"{name}: a refused open changed the log"


def test_repair_copies_damaged_acknowledged_records_from_a_replica_or_cuts_them(
        tmp_path, impl):
    """What the refusal above sends the user to: ``mqlog repair --from REPLICA`` copies
    the acknowledged records at the log's end from a replica whose bytes there verify
    (nothing lost); ``mqlog repair`` alone cuts them, saving their bytes, and lowers the
    saved flushed position: the next open cuts the tail and says so."""
    from mqlog.engine.repair import repair

    original = tmp_path / "original"
    acked, unflushed, flushed = _acked_then_crashed(original, impl)
    damaged = acked[-3].position
    for how in ("replica", "cut"):
        copy = tmp_path / how
        _copy_store(original, copy)
        _flip_bit(copy, damaged + 80, 5)
        _zero_log(copy, damaged + 100, unflushed[-1].position + unflushed[-1].size)
        report = repair(copy, original if how == "replica" else None)
        assert report.acknowledged_tail is not None, how
        assert report.acknowledged_tail[:2] == (damaged, flushed), how
        with mqlog.open(copy, implementation=impl, **FLUSHED_CONFIG) as store:
            held = sum(store.max_offset("t", queue) for queue in range(3))
            if how == "replica":
                assert held == len(acked), how
                assert store.read_record(damaged).body == b"%04d" % 117 * 50
            else:
                assert held == len(acked) - 3, how
                assert store.recovery_report.truncated_at == damaged, how
                saved = sorted(report.saved_to.iterdir())
                assert saved and saved[0].name.startswith(f"{damaged}-"), saved


def test_the_change_count_is_odd_while_records_are_cut_and_even_after(tmp_path, impl,
                                                                      monkeypatch):
    """What a reader in another process goes by (docs/FORMAT.md, ``changes``): each
    truncation, reset, trim and writable open is two steps of the count, odd while it
    runs; a count left odd by a crash is rounded up at the next open."""
    path = tmp_path / "s"
    counts = []
    write_checkpoint = cp.write_checkpoint

    def checkpoint_looked_at(file, checkpoint):  # (a truncation writes one part way)
        counts.append(cp.read_changes(path / "changes"))
        write_checkpoint(file, checkpoint)
    with mqlog.open(path, implementation=impl, **FLUSHED_CONFIG) as store:
        assert cp.read_changes(path / "changes") == store.change_count == 2
        monkeypatch.setattr(cp, "write_checkpoint", checkpoint_looked_at)
        results = [store.put("t", b"x" * 300, index % 2) for index in range(600)]
        store.truncate(results[500].position)  # (its checkpoint is written while odd)
        assert 3 in counts and store.change_count == 4
        store.trim_front(store.segments()[1][0])
        assert store.change_count == 6
        store.reset(store.written_position + 4096, [(store.epoch, 0)])
        assert 7 in counts and store.change_count == 8
        monkeypatch.undo()
        with mqlog.open(path, read_only=True) as snapshot:
            assert snapshot.change_count == 8
    (path / "changes").write_bytes(fmt.CHANGES.pack(fmt.CHANGES_MAGIC, 1, 11))  # a crash
    with mqlog.open(path, implementation=impl, **FLUSHED_CONFIG) as store:
        assert store.change_count == 14


def test_a_truncation_lowers_the_saved_flushed_position_first(tmp_path, impl):
    """A replica's truncation cuts flushed records: the saved flushed position goes down
    before the log does, so a crash right after opens without a refusal; and with saving
    off there is no file to go stale."""
    path = tmp_path / "s"
    store = mqlog.open(path, implementation=impl, **FLUSHED_CONFIG)
    results = [store.put("t", b"x" * 300) for _ in range(40)]
    cut = results[20].position
    deadline = time.monotonic() + 30
    while cp.read_flushed(path / "flushed") != store.flushed_position:  # (saved past cut)
        assert time.monotonic() < deadline, "the flushed position was never saved"
        time.sleep(0.005)
    store.truncate(cut)
    assert cp.read_flushed(path / "flushed") == cut
    store.put_nowait("t", b"y" * 300)
    store.abandon("test: a crash after the truncation")
    with mqlog.open(path, implementation=impl, **FLUSHED_CONFIG) as store:
        assert store.max_offset("t", 0) >= 20
        assert store.flushed_position >= cut
    with mqlog.open(path, implementation=impl, **FLUSHED_CONFIG,
                    flushed_position_save_interval_ms=-1):
        assert not (path / "flushed").exists()


def test_the_flushed_position_is_saved_at_most_once_an_interval(tmp_path):
    """Each save is an fdatasync of its own: ``flushed_position_save_interval_ms`` spaces
    them, and positions noted while the saver waits out the interval are coalesced into
    the save at its end. Every note used to wake the saver from that wait and save at
    once, so with a sync a note the interval never held (a second device flush per group
    commit: durable batches at 0.89x the rate they make with 50 ms)."""
    saver = cp.FlushedPosition(tmp_path / "flushed", 0, interval_ms=3_600_000,
                               threaded=True)
    try:
        for position in range(1, 201):
            saver.note(position * 100)
            time.sleep(0.001)  # (the old saver, woken by each note, saved within these)
        assert saver.save_count == 0 and cp.read_flushed(tmp_path / "flushed") == 0
    finally:
        saver.close()
    saver = cp.FlushedPosition(tmp_path / "flushed", 0, interval_ms=20, threaded=True)
    try:
        started = time.monotonic()
        for position in range(1, 201):
            saver.note(position * 100)
            time.sleep(0.001)
        deadline = time.monotonic() + 30
        while cp.read_flushed(tmp_path / "flushed") != 20_000:  # the last one, in the end
            assert time.monotonic() < deadline, cp.read_flushed(tmp_path / "flushed")
            time.sleep(0.005)
        elapsed = time.monotonic() - started
        assert 1 <= saver.save_count <= elapsed / 0.020 + 1, (saver.save_count, elapsed)
    finally:
        saver.close()
