"""Hostile cases (issue 14): what a careless caller, a racing thread, a damaged file or a
full disk does to a store, on both log cores. Each test's docstring names the finding
it guards (issue 14, item N); each failed before its fix.

Races run in a subprocess (``_run_child``) so that a segfault fails the test instead of
killing pytest; their rounds are counted, not timed, and every reader checks each answer
it gets, so the test can fail on a quiet machine and on a loaded one alike.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import mqlog
from mqlog import errors, ext, format
from tests.conftest import IMPLEMENTATIONS, SMALL

ROOT = Path(__file__).resolve().parent.parent

# --- races: readers beside truncate, reset, retention and close --------------------------

RACE_RECORD_BYTES = 70 * 1024  # above the cores' GIL_FREE_BYTES: CRCs run without the GIL
RACE_SEGMENT_BYTES = 256 * 1024  # three records fill a segment
RACE_ROUNDS = {"truncate": 800, "reset": 250, "retention": 400, "close": 50, "drop": 400}


def _race_store(path: Path, impl: str, **overrides: object) -> mqlog.Store:
    settings = {**SMALL, "segment_size_bytes": RACE_SEGMENT_BYTES,
                "message_size_bytes_max": 128 * 1024, **overrides}
    return mqlog.open(path, implementation=impl, **settings)


class _Readers:
    """Threads that read what ``target`` names, again and again, and note every answer
    that is wrong: an untyped error, a CorruptRecord, or a record that is not the one
    asked for. ``allowed`` are the typed errors a read beside the change may get."""

    def __init__(self, allowed: tuple[type[BaseException], ...], count: int = 2) -> None:
        self.allowed = allowed
        self.store: mqlog.Store | None = None
        self.target: tuple[int, int, int] | None = None  # (position, offset, count)
        self.failures: list[str] = []
        self.reads = 0
        self._stopping = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(count)]

    def __enter__(self) -> _Readers:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join()

    def _run(self, which: int) -> None:
        while not self._stopping.is_set() and len(self.failures) < 5:
            store, target = self.store, self.target
            if store is None or target is None:
                continue
            try:
                self._read(store, target, which)
            except self.allowed:
                pass
            except BaseException as error:  # noqa: BLE001 (every other error is a finding)
                self.failures.append(f"{type(error).__name__}: {error}\n"
                                     f"{traceback.format_exc(limit=-4)}")
            self.reads += 1

    def _read(self, store: mqlog.Store, target: tuple[int, int, int], which: int) -> None:
        position, offset, count = target
        if which % 2 == 0:
            raw = store.read_raw(position, 1)  # one record (and a blank), then the next
            if raw:  # (b"": the log ends there now)
                assert int.from_bytes(raw[:4], "little") == RACE_RECORD_BYTES + 73, raw[:80]
            store.read_record(position)
        else:
            for record in store.get("t", 0, offset, count, 1 << 24):
                assert (record.topic, record.queue_id, record.offset) == ("t", 0, offset)
                assert record.body == _body(offset), f"record of offset {offset} differs"
                offset += 1


def _body(offset: int) -> bytes:
    return offset.to_bytes(8, "little") * (RACE_RECORD_BYTES // 8)


def _race(directory: str, impl: str, mode: str, rounds: int) -> None:
    """The child's work: ``rounds`` of five puts, then the change ``mode`` names, with
    readers reading those records all along."""
    path = Path(directory)
    sys.setswitchinterval(1e-5)  # switch threads often: more interleavings per round
    allowed: tuple[type[BaseException], ...] = (errors.InvalidPosition,
                                                errors.OffsetOutOfRange)
    if mode == "close":
        allowed += (errors.StoreClosed,)
    overrides: dict[str, object] = {}
    if mode == "retention":
        overrides = {"retention_bytes": 2 * RACE_SEGMENT_BYTES}
    elif mode == "drop":  # every checkpoint drops every sealed segment's pages
        overrides = {"page_cache_window_bytes": 1, "checkpoint_interval_ms": 1,
                     "retention_bytes": 4 * RACE_SEGMENT_BYTES}
    store = _race_store(path / "store", impl, **overrides)
    with _Readers(allowed) as readers:
        readers.store = store
        for round_index in range(rounds):
            start = store.written_position
            first = store.max_offset("t", 0)
            # Three records fill a segment: the fourth and fifth open the next one, which
            # a truncation to ``start`` unmaps while a reader may be checking the fifth.
            results = [store.put("t", _body(first + i)) for i in range(5)]
            readers.target = (results[3].position, first, 5)
            if mode == "drop":  # a truncation, retention, or the log grows a round
                if round_index % 3 == 1:
                    store.truncate(start)
                elif round_index % 3 == 2:
                    store.apply_retention()
            elif mode == "truncate":
                store.truncate(start)
            elif mode == "reset":
                store.reset(store.written_position + 8, [])
            elif mode == "retention":
                store.apply_retention()
            else:
                store.close()
                store = _race_store(path / f"store{round_index % 2}", impl)
                readers.store = store
        readers.target = None
    store.close()
    print(f"{mode}: {rounds} rounds, {readers.reads} reads")
    assert not readers.failures, readers.failures


def _run_child(function: str, *arguments: object, timeout_s: float = 600) -> str:
    """Run ``tests.test_hostile.<function>(*arguments)`` in a fresh interpreter; fail
    the test with its output if it dies (a signal) or fails."""
    code = f"from tests.test_hostile import {function}; {function}(*{arguments!r})"
    try:
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"{function}{arguments} hung (killed after {timeout_s} s):\n"
                    f"{expired.stdout!r}\n{expired.stderr!r}")
    if done.returncode != 0:
        how = f"signal {-done.returncode}" if done.returncode < 0 else \
            f"exit {done.returncode}"
        pytest.fail(f"{function}{arguments} died ({how}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


@pytest.fixture
def fast_path(tmp_path):
    """A directory on tmpfs when there is one (a truncation fsyncs its checkpoint: on a
    disk that is most of a race round's time), else tmp_path."""
    if not os.access("/dev/shm", os.W_OK):
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(prefix="mqlog-hostile-", dir="/dev/shm"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("mode", ["truncate", "reset", "retention", "close", "drop"])
def test_reads_beside_a_change_that_unmaps_never_crash(fast_path, impl, mode):
    """Issue 14, items 1 and 9: read_raw kept a raw segment pointer across its GIL-free
    CRC pass while truncate unmapped the segment (SIGSEGV, C core); close() during reads
    gave AssertionError (C) or ``ValueError: mmap closed`` (twin) instead of StoreClosed;
    readers beside a truncation saw ``CorruptRecord ... run recovery`` for healthy records
    being dropped. Readers (read_raw, read_record, get) run beside truncate, reset,
    retention or close for hundreds of rounds ("drop": beside the checkpoint thread
    dropping every sealed segment's pages from memory, page_cache_window_bytes, with
    truncations and retention): only typed "gone" errors are allowed, and
    every record returned must be the one asked for."""
    output = _run_child("_race", str(fast_path), impl, mode, RACE_ROUNDS[mode])
    assert f"{mode}: {RACE_ROUNDS[mode]} rounds" in output


REWRITE_READS_MIN = 50_000  # read_raw calls beside the rewriter, at least ...
REWRITE_REFUSALS_MIN = 1_000  # ... and this many of them refused (it ran between them)
REWRITE_READS_MAX = 5_000_000


def _rewrite_sizes(segment: str, offsets: list[int]) -> None:
    """The rewriter process: zero the size field of the records at ``offsets`` and put
    it back, again and again, until stdin closes (says "ready" after the first pass)."""
    import mmap

    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    with open(segment, "r+b") as file, mmap.mmap(file.fileno(), 0) as mapping:
        sizes = [mapping[at:at + 4] for at in offsets]
        ready = False
        while not stop.is_set():
            for at in offsets:
                mapping[at:at + 4] = bytes(4)
            for at, size in zip(offsets, sizes, strict=True):
                mapping[at:at + 4] = size
            if not ready:
                print("ready", flush=True)
                ready = True


def _read_beside_a_rewriter(directory: str, impl: str) -> None:
    """The child's work: read_raw over records whose sizes another process keeps
    zeroing and restoring; every answer must be the records as written."""
    path = Path(directory) / "store"
    with _race_store(path, impl) as store:
        for index in range(200):
            store.put("t", _body(index)[:300])
        offsets = [record.position for record in store.get("t", 0, 10, 190, 1 << 24)[::7]]
        written = store.read_raw(0, 1 << 20)
    code = (f"from tests.test_hostile import _rewrite_sizes; "
            f"_rewrite_sizes({str(path / 'commitlog' / f'{0:020d}')!r}, {offsets!r})")
    rewriter = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    reads = refused = 0
    try:
        assert rewriter.stdout is not None and rewriter.stdout.readline() == "ready\n"
        with mqlog.open(path, read_only=True, implementation=impl) as snapshot:
            while reads < REWRITE_READS_MIN or refused < REWRITE_REFUSALS_MIN:
                assert reads < REWRITE_READS_MAX, f"the rewriter ran beside {refused} reads"
                reads += 1
                try:
                    answer = snapshot.read_raw(0, 1 << 20)
                except (errors.CorruptRecord, errors.InvalidPosition):
                    refused += 1
                    continue
                assert answer == written[:len(answer)], f"read {reads}: torn bytes returned"
    finally:
        rewriter.communicate(input="", timeout=60)
    print(f"{reads} reads, {refused} refused")


def test_read_raw_beside_a_process_rewriting_the_records_never_crashes_nor_tears(
        fast_path, impl):
    """The Spark source's reads beside a writer process (CI, 2026-12-03): the C core
    walked a run of records on the mapping, copied it, and ran the CRCs over the copy
    with the sizes read again from it; a size rewritten in between (a truncation's
    zeroing) ran the CRC past the copy: SIGSEGV. The twin checked each record and then
    copied the run again: it returned bytes it never checked. Another process zeroes and
    restores record sizes here while read_raw runs: each answer is refused (a typed
    error) or the records as written. Both failed within a second before their fix."""
    output = _run_child("_read_beside_a_rewriter", str(fast_path), impl)
    assert " reads, " in output


# --- damaged consume-queue entries ---------------------------------------------------------


def _queue_file(store: mqlog.Store, topic: str, queue_id: int) -> Path:
    return store.paths.queue_dir(topic, queue_id) / f"{0:020d}"


def _set_entry_position(store: mqlog.Store, offset: int, position: int) -> None:
    """Overwrite the position of entry ``offset`` of queue t/0 (the file is mapped shared:
    the store sees the change at once)."""
    with open(_queue_file(store, "t", 0), "r+b") as file:
        file.seek(offset * 20)
        file.write(position.to_bytes(8, "little"))


def test_an_entry_pointing_at_another_record_is_a_mismatch_not_a_wrong_record(open_store):
    """Issue 14, item 4: reads checked a record's CRC and position but never that its
    topic, queue and offset are the ones the consume-queue entry claimed: with entry 10
    pointing at record 11, offset 10 was never delivered while 11 came twice."""
    store = open_store()
    results = [store.put("t", bytes([i]) * 10) for i in range(20)]
    store.put("u", b"other" * 4)  # a larger record than those of "t"
    _set_entry_position(store, 10, results[11].position)
    with pytest.raises(errors.ConsumeQueueMismatch, match="entry of offset 10 points at"):
        store.get("t", 0, 0, 32)
    with pytest.raises(errors.ConsumeQueueMismatch, match="'t'/0 offset 11"):
        store.get("t", 0, 10, 1)
    assert [r.offset for r in store.get("t", 0, 0, 10)] == list(range(10))  # before: fine
    assert [r.offset for r in store.get("t", 0, 11, 32)] == list(range(11, 20))
    _set_entry_position(store, 10, results[-1].position + results[-1].size)  # "u"'s record
    with pytest.raises(errors.ConsumeQueueMismatch, match="'u'/0 offset 0"):
        store.get("t", 0, 10, 1)


def test_a_garbage_entry_past_the_log_end_is_a_mismatch_not_an_empty_answer(open_store):
    """Issue 14, item 4: a garbage entry past the committed position made ``get`` return
    [] below max_offset, so the consumer was stuck forever; it is a ConsumeQueueMismatch
    (with pull too). A size that runs past the segment over an intact record is one as
    well."""
    store = open_store()
    results = [store.put("t", bytes([i]) * 10) for i in range(20)]
    _set_entry_position(store, 10, 1 << 40)
    for read in (lambda: store.get("t", 0, 10, 5), lambda: store.pull("t", 0, 10, 5)):
        with pytest.raises(errors.ConsumeQueueMismatch, match="past the end of the log"):
            read()
    _set_entry_position(store, 10, results[10].position)
    assert store.get("t", 0, 10, 1)[0].offset == 10
    with open(_queue_file(store, "t", 0), "r+b") as file:  # the size of entry 10
        file.seek(10 * 20 + 8)
        file.write((results[10].size + 8).to_bytes(4, "little"))
    with pytest.raises(errors.ConsumeQueueMismatch, match=f"size {results[10].size + 8}"):
        store.get("t", 0, 10, 1)


def test_an_entry_pointing_inside_a_whole_record_is_a_mismatch_not_log_damage(open_store):
    """An entry whose position had a bit flipped points inside record 3: the log is whole
    there (``mqlog verify`` finds nothing), so the read is a ConsumeQueueMismatch, whose
    advice rebuilds the queue, not a CorruptRecord that sends the operator to repair a
    log that needs none. Damage in the log before that point is still a CorruptRecord."""
    store = open_store()
    results = [store.put("t", b"body-%d" % i * 20) for i in range(10)]
    _set_entry_position(store, 3, results[3].position + 1)
    with pytest.raises(errors.ConsumeQueueMismatch, match="inside a record, not at its start"):
        store.get("t", 0, 3, 1)
    assert [r.offset for r in store.get("t", 0, 4, 32)] == list(range(4, 10))
    segment = store.paths.commitlog / f"{0:020d}"
    with open(segment, "r+b") as file:  # record 2's magic: the walk cannot vouch for 3
        file.seek(results[2].position + 4)
        file.write(b"\0\0\0\0")
    with pytest.raises(errors.CorruptRecord):
        store.get("t", 0, 3, 1)


def test_a_file_where_a_store_directory_belongs_is_a_typed_error(open_store, tmp_path):
    """A plain file where the commit log's directory, or a queue's, belongs: CorruptStore
    naming it (before: a raw FileExistsError), and the records stored stay readable."""
    store = open_store(tmp_path / "queue")
    store.put("t", b"kept")
    (store.paths.consumequeue / "t" / "1").write_bytes(b"")
    with pytest.raises(errors.CorruptStore, match="must be a directory of the store"):
        store.put("t", b"refused", queue_id=1)
    assert [record.body for record in store.get("t", 0, 0, 10)] == [b"kept"]
    store.close()
    store = open_store(tmp_path / "log")
    store.close()
    shutil.rmtree(store.paths.commitlog)
    store.paths.commitlog.write_bytes(b"")
    with pytest.raises(errors.CorruptStore, match="commitlog must be a directory"):
        open_store(tmp_path / "log")


# --- damaged key-index files ----------------------------------------------------------------

INDEX_KEYS = 50  # keys k0..k49, each on several records


def _index_store(path: Path, impl: str) -> mqlog.Store:
    return mqlog.open(path, implementation=impl, **SMALL)


def _damage_index_chain(directory: str, impl: str, how: str) -> None:
    """The child's work: fill and seal an index file, damage the chain of key k7's
    bucket as ``how`` says, reopen, and query k7: exactly its records, newest first."""
    path = Path(directory) / "store"
    with _index_store(path, impl) as store:
        expected = [store.put("t", b"x", key=f"k{i % INDEX_KEYS}").position
                    for i in range(600)]
        store.query("t", "k0")  # index everything now
    core = store.core_module
    data = bytearray((path / "index" / f"{0:020d}").read_bytes())
    slot_count = int.from_bytes(data[8:12], "little")
    bucket = core.key_hash("t", "k7", 64) % slot_count
    newest = int.from_bytes(data[64 + 4 * bucket:68 + 4 * bucket], "little")
    entry_at = 64 + 4 * slot_count + (newest - 1) * 32
    if how == "link to itself":  # two flipped bits can do that
        data[entry_at + 24:entry_at + 28] = newest.to_bytes(4, "little")
    elif how == "link forward":
        data[entry_at + 24:entry_at + 28] = (newest + 3).to_bytes(4, "little")
    elif how == "hash":  # a low bit: the entry now sits in the wrong bucket
        data[entry_at] ^= 0x01
    else:  # a position inside a record
        data[entry_at + 8] ^= 0x04
    (path / "index" / f"{0:020d}").write_bytes(bytes(data))
    with _index_store(path, impl) as store:
        got = [record.position for record in store.query("t", "k7", max_count=64)]
        assert got == expected[7::INDEX_KEYS][::-1], got
        assert store.key_index.rebuilt_count == 1
    print("ok")


@pytest.mark.parametrize("how", ["link to itself", "link forward", "hash", "position"])
def test_a_damaged_index_chain_never_hangs_nor_misses(fast_path, impl, how):
    """Issue 14, item 3: query() followed index ``prev`` links without requiring them to
    point backwards: two flipped bits in a sealed index file spun forever holding the
    index lock (so the indexer and close() blocked too); garbage entries made queries
    miss records silently. A chain that does not hold together, or an entry that names
    no record, is rebuilt from the log and the query answers right. (Since format
    version 2 each entry's CRC32C catches these first; tests/test_hostile_index.py
    flips every kind of bit, the high bits of a hash included.)"""
    assert "ok" in _run_child("_damage_index_chain", str(fast_path), impl, how,
                              timeout_s=120)


# --- consumer offsets ---------------------------------------------------------------------


@pytest.mark.parametrize("topic, queue_id", [("a b", 0), ("", 0), ("a\nb", 0), ("t", "x"),
                                             ("t", -1), ("t", True), (None, 0),
                                             ("\ud800", 0), ("t", 1 << 40)])
def test_commit_offset_validates_topic_and_queue_like_put(open_store, tmp_path, topic,
                                                          queue_id):
    """Issue 14, item 6: commit_offset validated neither topic nor queue id; ``"a b"``,
    ``""``, ``"a\\nb"`` or queue id ``"x"`` went into the offsets file and every later
    open, read-only too, raised CorruptStore. Now they are refused as put refuses them,
    and nothing is written."""
    store = open_store()
    store.put("t", b"x")
    store.commit_offset("g", "t", 0, 1)
    with pytest.raises(errors.InvalidArgument):
        store.commit_offset("g", topic, queue_id, 0)
    with pytest.raises(errors.InvalidArgument):
        store.commit_offsets("g", {(topic, queue_id): 0})
    store.close()
    again = open_store()
    assert again.committed_offset("g", "t", 0) == 1
    again.close()
    with mqlog.open(tmp_path / "store", read_only=True) as snapshot:
        assert snapshot.committed_offset("g", "t", 0) == 1


def test_a_damaged_offsets_file_does_not_brick_the_store(open_store, tmp_path):
    """Issue 14, item 6: a damaged consumer_offsets file (here one an older version
    wrote with a bad topic name) made every open raise CorruptStore. The store opens,
    reads and writes; only the calls that need the offsets raise CorruptStore, saying
    what to do, and nothing silently resets them."""
    from mqlog.engine import checkpoint as cp

    store = open_store()
    store.put("t", b"x")
    store.commit_offset("g", "t", 0, 1)
    store.close()
    path = tmp_path / "store" / "consumer_offsets"
    cp.write_offsets(path, {("g", "a b", 0): 1, ("g", "t", 0): 1})
    damaged = path.read_bytes()
    store = open_store()
    assert [r.body for r in store.get("t")] == [b"x"]
    store.put("t", b"y")
    for call in (lambda: store.committed_offset("g", "t", 0), lambda: store.groups(),
                 lambda: store.commit_offset("g", "t", 0, 2), lambda: store.lag("g")):
        with pytest.raises(errors.CorruptStore, match="move it away"):
            call()
    store.close()
    assert path.read_bytes() == damaged  # never overwritten
    with mqlog.open(tmp_path / "store", read_only=True) as snapshot:
        assert len(snapshot.get("t")) == 2
    path.unlink()
    store = open_store()
    store.commit_offset("g", "t", 0, 2)
    assert store.committed_offset("g", "t", 0) == 2


# --- lost consume-queue files, read-only ---------------------------------------------------

LOST_PUTS = 600  # queues t/0 and t/1: offsets 0..299 each, in five files of 64 entries


def _queue_body(queue_id: int, offset: int) -> bytes:
    return b"%d/%d|" % (queue_id, offset) + bytes([offset % 251]) * (20 + offset % 200)


def _fill_queues(store: mqlog.Store, count: int, queues: int = 2) -> None:
    for index in range(count):
        queue_id = index % queues
        store.put("t", _queue_body(queue_id, store.max_offset("t", queue_id)), queue_id)


def _queue_contents(store: mqlog.Store) -> dict[tuple[str, int], list[tuple[int, bytes]]]:
    """Every queue's (offset, body) pairs, from its minimum to its end."""
    found = {}
    for topic, queue_id in store.queues():
        low, high = store.min_offset(topic, queue_id), store.max_offset(topic, queue_id)
        got: list[Any] = []
        while len(got) < high - low:
            more = store.get(topic, queue_id, low + len(got), 256, 1 << 24)
            assert more, (f"get({topic!r}, {queue_id}, {low + len(got)}) returned nothing "
                          f"below the queue's end {high}: a consumer would wait forever")
            got += more
        found[(topic, queue_id)] = [(record.offset, record.body) for record in got]
    return found


def _as_written(contents: dict[tuple[str, int], list[tuple[int, bytes]]]) -> None:
    """Each queue holds consecutive offsets, each with the body written there."""
    for (_topic, queue_id), pairs in contents.items():
        low = pairs[0][0] if pairs else 0
        assert pairs == [(offset, _queue_body(queue_id, offset))
                         for offset in range(low, low + len(pairs))], queue_id


def _read_only(path: Path, impl: str, **overrides: object) -> mqlog.Store:
    return mqlog.open(path, implementation=impl, read_only=True, **{**SMALL, **overrides})


def _manifest(path: Path) -> dict[tuple[str, int], tuple[int, int]]:
    from mqlog.engine import checkpoint as cp

    manifest = cp.read_queues(path / "queues")
    assert manifest is not None
    return manifest


def _await_checkpoint(store: mqlog.Store, queue: tuple[str, int], next_offset: int) -> None:
    """Until checkpoints (every 50 ms, on the flush thread) covered every record written
    and saved a queue manifest in which ``queue`` reaches ``next_offset``."""
    from mqlog.engine import checkpoint as cp

    store.flush()
    deadline = time.monotonic() + 60
    while _manifest(store.paths.root).get(queue, (0, 0))[1] < next_offset or \
            cp.read_checkpoint(store.paths.checkpoint).log_position < store.written_position:
        assert time.monotonic() < deadline, "no checkpoint covered the records"
        time.sleep(0.001)


@pytest.mark.parametrize("writer", ["closed", "crashed", "live"])
@pytest.mark.parametrize("lost", ["first file", "middle file", "last file", "every file"])
def test_a_read_only_open_refuses_a_queue_that_lost_a_file(open_store, tmp_path, impl,
                                                            lost, writer):
    """Issue 14 (derived files rebuilt from the log when missing or damaged, and the
    rebuild reported): a read-only open of a store one of whose consume-queue files was
    deleted served that queue short with no error: a lost first file raised its minimum
    to 64, a lost last one ended it at 256 (of 300), a lost queue vanished (a lost
    middle file was a plain CorruptStore). It raises ConsumeQueueMismatch, naming the
    queue, a record it lacks and what to do: open the store for writing once, which
    rebuilds the queues and says so in its report; read-only opens then serve all.
    After a crash the writable open rebuilt nothing for a lost last file (it served the
    queue short too); beside a live writer the manifest did not reach the last file
    (it was rewritten when a queue appeared, not when one began a file)."""
    store = open_store()
    _fill_queues(store, LOST_PUTS // 2)
    if writer == "live":  # the manifest lists the queues, then they grow by two files
        _await_checkpoint(store, ("t", 0), LOST_PUTS // 4)
    _fill_queues(store, LOST_PUTS // 2)
    expected = _queue_contents(store)
    if writer == "live":
        _await_checkpoint(store, ("t", 0), 257)
    else:
        store.close()
    if writer == "crashed":
        open_store().abandon("simulated crash")
    directory = tmp_path / "store" / "consumequeue" / "t" / "0"
    files = sorted(directory.iterdir())
    assert len(files) == 5, "test set-up"
    if lost == "every file":
        shutil.rmtree(directory)
    else:
        files[{"first file": 0, "middle file": 2, "last file": -1}[lost]].unlink()
    with pytest.raises(errors.ConsumeQueueMismatch,
                       match=r"consume queue \('t', 0\).*for writing once"):
        _read_only(tmp_path / "store", impl)
    store.close()
    store = open_store()
    rebuilt = store.recovery_report.rebuilt
    store.close()
    assert any("consume queues rebuilt" in what for what in rebuilt), rebuilt
    with _read_only(tmp_path / "store", impl) as snapshot:
        assert _queue_contents(snapshot) == expected


@pytest.mark.parametrize("size", [0, 333, 10 * format.CQ_ENTRY_SIZE],
                         ids=["empty", "odd size", "ten whole entries"])
@pytest.mark.parametrize("which", [0, -1], ids=["first file", "last file"])
def test_a_read_only_open_refuses_a_queue_file_cut_short(open_store, tmp_path, impl, size,
                                                         which):
    """Issue 14 (derived files rebuilt from the log when missing or damaged, and the
    rebuild reported): a consume-queue file cut to 0 bytes, to an odd size or to fewer
    whole entries made a read-only open raise a plain CorruptStore whose message named
    another file's size. It is a ConsumeQueueMismatch that names the file cut and its
    size, and says to open the store for writing once (which rebuilds the queue)."""
    store = open_store()
    _fill_queues(store, LOST_PUTS)
    expected = _queue_contents(store)
    store.close()
    victim = sorted((tmp_path / "store" / "consumequeue" / "t" / "1").iterdir())[which]
    os.truncate(victim, size)
    with pytest.raises(errors.ConsumeQueueMismatch,
                       match=rf"\('t', 1\) has a file of {size} bytes \({victim.name};"
                             r".*for writing once"):
        _read_only(tmp_path / "store", impl)
    open_store().close()
    with _read_only(tmp_path / "store", impl) as snapshot:
        assert _queue_contents(snapshot) == expected


@pytest.mark.parametrize("position", ["zeros", "zeros, below the log's start",
                                      "another record's"])
@pytest.mark.parametrize("reader", ["read-only", "writable"])
def test_a_queue_entry_torn_by_a_crash_is_not_served(open_store, tmp_path, impl, position,
                                                     reader):
    """Issue 14, item 4 (a garbage entry past the committed position makes get return []
    below max_offset, or fail): two consume-queue entries in 1,024 have part of their
    position on one page and their size on the next, and the entries of records past the
    last checkpoint are not synced. A crash can keep the page with the size and lose the
    one with the position: the entry then names position 0 (or, in a file written
    before, an older record's) with a size, so an open counted it as an entry of a
    record before the checkpoint. Each open now checks the last entry it counts against
    the record it names in the log, and leaves out a torn one; below the log's start
    (retention deleted that part), where no record can be checked, it must at least lie
    past the entry before it."""
    retained = position == "zeros, below the log's start"
    store = open_store(retention_bytes=SMALL["segment_size_bytes"] // 4) if retained else \
        open_store()
    _fill_queues(store, LOST_PUTS)
    if retained:
        store.flush()
        store.apply_retention()
        assert store.first_segment_base() > 0, "test set-up"
    expected = _queue_contents(store)
    end = store.max_offset("t", 0)
    _await_checkpoint(store, ("t", 0), end)
    other = store.get("t", 1, end - 2, 1)[0]  # (not at position 0)
    torn_at = 0 if position.startswith("zeros") else other.position
    size = len(other.raw)
    store.abandon("simulated crash")
    last = sorted((tmp_path / "store" / "consumequeue" / "t" / "0").iterdir())[-1]
    with open(last, "r+b") as file:
        file.seek((end - int(last.name)) * format.CQ_ENTRY_SIZE)
        file.write(format.CQ_ENTRY.pack(torn_at, size, 0))
    if reader == "read-only":
        with _read_only(tmp_path / "store", impl) as snapshot:
            assert snapshot.max_offset("t", 0) == end
            assert _queue_contents(snapshot) == expected
    else:
        store = open_store()
        assert store.max_offset("t", 0) == end
        assert _queue_contents(store) == expected
        _fill_queues(store, 2)
        _as_written(_queue_contents(store))


@pytest.mark.parametrize("field", [format.QUEUE_OFFSET_AT, format.POSITION_AT,
                                   format.RECORD_HEADER_SIZE])  # (the topic's name)
@pytest.mark.parametrize("reader", ["read-only", "writable"])
@pytest.mark.parametrize("last", ["a queue's", "the log's"])
def test_a_damaged_checkpointed_record_at_a_queues_end_is_refused_by_reads_not_opens(
        open_store, tmp_path, impl, field, reader, last):
    """The torn-entry check (above) took the last entry of a queue whose record, before
    the checkpoint, a bit flip had damaged, for a torn entry: left out, the recovery
    scan then found the queue's next record one offset past its end, rebuilt every queue
    from the log's start, met the damage and refused to open (CorruptStore; the bit-flip
    test's seed 2396515097). Such an entry still ends where a record starts, or where
    the log ends, which a torn one does not: it is counted, the open works and reads
    refuse the record."""
    store = open_store()
    _fill_queues(store, LOST_PUTS)
    if last == "a queue's":
        _fill_queues(store, 2, queues=1)  # (t/1's last record is not the log's)
    queue = ("t", 1)
    end = store.max_offset(*queue)
    _await_checkpoint(store, queue, end)
    record = store.get(*queue, end - 1, 1)[0]
    assert (record.position + len(record.raw) == store.written_position) == \
        (last == "the log's"), "test set-up"
    store.abandon("simulated crash")
    segment = max(path for path in (tmp_path / "store" / "commitlog").iterdir()
                  if int(path.name) <= record.position)
    with open(segment, "r+b") as file:
        file.seek(record.position - int(segment.name) + field)
        byte = file.read(1)[0]
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte ^ 0x10]))
    opened = _read_only(tmp_path / "store", impl) if reader == "read-only" else open_store()
    with opened:
        assert opened.max_offset(*queue) == end
        assert len(opened.get(*queue, end - 2, 1)) == 1
        with pytest.raises((errors.CorruptRecord, errors.ConsumeQueueMismatch)):
            opened.get(*queue, end - 1, 1)


@pytest.mark.parametrize("writer", ["live", "crashed"])
def test_a_read_only_open_beside_a_truncation_refuses_nothing(open_store, tmp_path, impl,
                                                              writer):
    """Issue 14 (derived files rebuilt from the log when missing or damaged, and the
    rebuild reported), the other side: after a truncation the queue manifest says the
    queues reach further than their files do (until the next checkpoint, or for good if
    the writer crashed first). That is no lost file: read-only opens, beside the live
    writer or after its crash, serve every record, and so does the writable open."""
    store = open_store(checkpoint_interval_ms=3_600_000)  # the manifest stays stale
    _fill_queues(store, LOST_PUTS)
    store.close()
    store = open_store(checkpoint_interval_ms=3_600_000)  # (its manifest is exact)
    store.truncate(store.get("t", 0, 100, 1)[0].position)  # t/0's last three files go
    _fill_queues(store, 40)  # offsets 100.. and 101.. again
    expected = _queue_contents(store)
    assert _manifest(tmp_path / "store")[("t", 0)][1] == 300 > store.max_offset("t", 0), \
        "test set-up: the manifest is stale"
    if writer == "crashed":
        store.abandon("simulated crash")
    with _read_only(tmp_path / "store", impl) as snapshot:
        assert _queue_contents(snapshot) == expected
    store.close()
    store = open_store()
    assert _queue_contents(store) == expected and not store.recovery_report.rebuilt


@pytest.mark.parametrize("writer", ["live", "crashed before the manifest"])
def test_a_read_only_open_after_retention_refuses_nothing(open_store, tmp_path, impl,
                                                          writer):
    """Issue 14 (derived files rebuilt from the log when missing or damaged, and the
    rebuild reported), the other side: retention deletes a queue's oldest files and then
    rewrites the queue manifest; a crash between the two leaves a manifest whose
    minimum offsets are too low. Neither is a lost file: read-only opens serve each
    queue from its new minimum."""
    config = {"retention_bytes": 2 * SMALL["segment_size_bytes"]}
    store = open_store(**config)
    _fill_queues(store, 3 * LOST_PUTS)
    store.close()
    store = open_store(**config)  # (its manifest is exact: every queue from offset 0)
    before = (tmp_path / "store" / "queues").read_bytes()
    assert store.apply_retention().segments_deleted, "test set-up"
    expected = _queue_contents(store)
    assert min(pairs[0][0] for pairs in expected.values()) > 64, "test set-up: files went"
    if writer != "live":
        store.abandon("simulated crash")
        (tmp_path / "store" / "queues").write_bytes(before)  # as the crash left it
        assert _manifest(tmp_path / "store")[("t", 0)][0] == 0, "test set-up"
    with _read_only(tmp_path / "store", impl, **config) as snapshot:
        assert _queue_contents(snapshot) == expected


BESIDE_CONFIG = {**SMALL, "retention_bytes": 4 * SMALL["segment_size_bytes"],
                 "consume_queue_entries_per_file": 32, "checkpoint_interval_ms": 20,
                 "retention_check_interval_ms": 1 << 30}
BESIDE_GOAL = 25  # truncations and retention passes each, while the reader opens
BESIDE_DEEP_CUTS = 1500  # truncations anywhere in a queue, while the reader opens


def _write_beside_readers(directory: str, impl: str, seed: int, cut_depth: int | None) -> None:
    """The child's work: put into three queues, truncate (holding ``truncating``, so no
    read-only open runs across a truncation) at most ``cut_depth`` records of a queue
    from its end (None: anywhere in it), and apply retention, until stdin closes;
    ``progress`` holds how many truncations and retention passes it did."""
    import fcntl
    import json
    import random

    path, local, stop = Path(directory), random.Random(seed), threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    done = {"truncations": 0, "retentions": 0}
    with mqlog.open(path / "store", implementation=impl, **BESIDE_CONFIG) as store, \
            open(path / "truncating", "wb") as lock:
        print("ready", flush=True)
        while not stop.is_set():
            step, queue_id = local.random(), local.randrange(3)
            low, high = store.min_offset("t", queue_id), store.max_offset("t", queue_id)
            if step < 0.7 or high - low < 10:
                _fill_queues(store, local.randrange(1, 60), queues=3)
            elif step < 0.85:
                deepest = low + 1 if cut_depth is None else max(low + 1, high - cut_depth)
                at = local.randrange(deepest, high)
                cut = store.get("t", queue_id, at, 1)[0]
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    store.truncate(cut.position)
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)
                done["truncations"] += 1
            else:
                store.flush()
                done["retentions"] += bool(store.apply_retention().segments_deleted)
            (path / "progress.tmp").write_text(json.dumps(done))
            os.replace(path / "progress.tmp", path / "progress")


@pytest.mark.parametrize(("cut_depth", "goal"), [
    (20, {"truncations": BESIDE_GOAL, "retentions": BESIDE_GOAL}),
    (None, {"truncations": BESIDE_DEEP_CUTS}),  # (they leave retention little to delete)
], ids=["cuts_near_the_end", "cuts_anywhere"])
def test_read_only_opens_beside_a_writer_in_another_process_refuse_nothing(fast_path, impl,
                                                                           rng, cut_depth, goal):
    """Issue 14 (derived files rebuilt from the log when missing or damaged, and the
    rebuild reported), the other side: read-only opens beside a writer in another
    process, which truncates its queues (the manifest then says they reach further)
    and lets retention delete their oldest files (the manifest's minimum lags), while
    checkpoints rewrite the manifest every 20 ms. No open may take that for a lost
    file: each serves every queue as consecutive offsets with the bodies written there.
    Runs until the writer did ``goal`` (its seed is drawn from the rng fixture's); the
    opens' interleaving with it is the machine's.

    Cuts anywhere in a queue zero many of its entries; the writer then writes them again
    while opens search the queue's files. An entry read half-written (its size new, its
    position still zero) was counted as before the snapshot's end: the queue reached one
    offset too far and reading it raised ConsumeQueueMismatch (seed 4157037921)."""
    import fcntl
    import json

    code = (f"from tests.test_hostile import _write_beside_readers; "
            f"_write_beside_readers({str(fast_path)!r}, {impl!r}, {rng.randrange(1 << 32)}, "
            f"{cut_depth!r})")
    child = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    opens, done = 0, dict.fromkeys(goal, 0)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        with open(fast_path / "truncating", "wb") as lock:
            while any(done[name] < count for name, count in goal.items()) and \
                    child.poll() is None:
                opens += 1
                assert opens <= 20_000, f"the writer did only {done}"
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    with _read_only(fast_path / "store", impl, **BESIDE_CONFIG) as snapshot:
                        _as_written(_queue_contents(snapshot))
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)
                if (fast_path / "progress").exists():
                    done = json.loads((fast_path / "progress").read_text())
    finally:
        _output, error = child.communicate(input="", timeout=120)
    assert child.returncode == 0, error
    assert all(done[name] >= count for name, count in goal.items()), (done, error)


# --- the maintenance thread ---------------------------------------------------------------


@pytest.mark.parametrize("failure", [AssertionError("indexer raced truncate"),
                                     OSError(5, "Input/output error")])
def test_maintenance_survives_any_failure_and_retention_keeps_running(open_store, failure):
    """Issue 14, item 7: the maintenance thread died silently on anything but an
    MqlogError (an AssertionError from an indexer racing truncate, an EIO sealing an
    index file), and retention never ran again. The indexer fails on every pass here:
    retention still runs and trims the log, the failure shows as maintenance_error, and
    the thread lives on."""
    store = open_store(index_interval_ms=5, retention_check_interval_ms=10,
                       retention_bytes=SMALL["segment_size_bytes"])
    retained = threading.Event()

    def failing_catch_up() -> None:
        raise failure

    def retention(now_ms: int | None = None) -> object:
        report = apply_retention(now_ms)
        if report.segments_deleted:
            retained.set()
        return report

    store.key_index.catch_up = failing_catch_up  # type: ignore[method-assign]
    apply_retention, store.apply_retention = store.apply_retention, retention
    for index in range(40):
        store.put("t", bytes(4000), key=f"k{index}")
    store.flush()
    try:
        assert retained.wait(60), "retention never ran beside a failing indexer"
        assert store.maintenance_error is failure  # and the thread ran retention after it
        assert store.min_offset("t") > 0
    finally:
        del store.key_index.catch_up  # (close() runs the indexer once more)


# --- durability of names --------------------------------------------------------------------


def test_a_new_segment_name_is_durable_before_a_record_in_it_is_acked(open_store,
                                                                      monkeypatch):
    """Issue 14, item 5: a new segment is made as ``*.tmp`` and renamed, and commitlog/
    was never fsynced, while recovery deletes ``*.tmp`` leftovers: after a power loss the
    acked records of a new segment could vanish with its name. A sync put into a new
    segment returns only after commitlog/ was fsynced (after the segment was made)."""
    synced: list[str] = []  # what each fsync'd descriptor names
    real = os.fsync

    def recording(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    store = open_store(flush_mode="sync")
    rolled = 0
    while rolled < 3:
        bases = len(store.segments())
        del synced[:]
        result = store.put("t", bytes(3000))
        if len(store.segments()) > bases and result.position >= store.segments()[-1][0]:
            rolled += 1
            assert str(store.paths.commitlog.resolve()) in synced, \
                "acked before commitlog/ was synced"


# --- bad arguments ------------------------------------------------------------------------


@pytest.mark.parametrize("properties", [{"a": {1: 2}}, {"a": [{"b": {(1,): 3}}]},
                                        {"a": ({"ok": {b"k": 1}},)}])
def test_nested_property_keys_must_be_str(open_store, properties):
    """Issue 14, item 10: nested property keys were not checked: ``{"a": {1: 2}}`` was
    stored and could never be read back (msgpack reads only str keys). It is refused,
    by put and put_batch, and nothing is stored; str keys at any depth are fine."""
    store = open_store()
    for call in (lambda: store.put("t", b"x", properties=properties),
                 lambda: store.put_batch("t", [b"x"], properties=properties)):
        with pytest.raises(errors.InvalidArgument, match="nested dicts"):
            call()
    assert store.written_position == 0
    nested = {"a": {"b": [1, {"c": 2}]}, "d": [[{"e": None}]]}
    store.put("t", b"x", properties=nested)
    assert store.get("t")[0].properties == nested


@pytest.mark.parametrize("call", [
    lambda s: s.put("t\ud800", b"x"), lambda s: s.put("t", b"x", key="k\udfff"),
    lambda s: s.put("t", b"x", tags="\ud800"), lambda s: s.put_batch("\udc00", [b"x"]),
    lambda s: s.get("t", max_count=1.5), lambda s: s.get("t", max_count="5"),
    lambda s: s.get("t", max_count=None), lambda s: s.get("t", max_count=True),
    lambda s: s.get("t", max_bytes=2.0), lambda s: s.get("t", queue_id=[]),
    lambda s: s.pull("t", queue_id="0"), lambda s: s.get(None), lambda s: s.pull(b"t"),
    lambda s: s.apply_retention("x"), lambda s: s.apply_retention(True),
    lambda s: s.put("t", b"x", tags="a||b"), lambda s: s.put("t", b"x", tags=" a "),
    lambda s: s.put("t", b"x", tags="*"), lambda s: s.put_batch("t", [b"x"], tags="a\n"),
    lambda s: s.put_batch("t", [b"x"] * 9),
], ids=["topic surrogate", "key surrogate", "tags surrogate", "batch topic surrogate",
        "max_count float", "max_count str", "max_count None", "max_count True",
        "max_bytes float", "queue_id list", "pull queue_id str", "get topic None",
        "pull topic bytes", "retention str", "retention bool", "tags a||b",
        "tags spaces", "tags star", "tags newline", "batch over batch_count_max"])
def test_bad_arguments_get_a_typed_error_and_store_nothing(open_store, call):
    """Issue 14, item 13: lone surrogates in topic/key raised UnicodeEncodeError;
    ``get(max_count=1.5|"5"|None)`` raised TypeError and ``True`` was accepted;
    ``get(queue_id=[])`` and ``apply_retention("x")`` raised TypeError;
    ``batch_count_max`` was never enforced; tags ``"a||b"`` or ``" a "`` were stored
    but could never be selected; ``get(None, ...)`` differed between the cores. Each is
    an InvalidArgument now (both cores, the same), and nothing is stored."""
    store = open_store(batch_count_max=8)
    store.put("t", b"kept", tags="a")
    written = store.written_position
    with pytest.raises(errors.InvalidArgument):
        call(store)
    assert store.written_position == written
    assert [r.body for r in store.get("t", tags="a")] == [b"kept"]


# --- the twin: the same bad call, the same answer ---------------------------------------------

TWIN_SEGMENT_BYTES = 4096
TWIN_ENTRIES_PER_FILE = 16
twin_only = pytest.mark.skipif(len(IMPLEMENTATIONS) < 2, reason="the C core is not built")


def _bare_core(implementation: str) -> tuple[Any, list[bytearray]]:
    """A log core over bytearrays (and them, segments and queue files in the order
    made), with the engine's callbacks reduced to attaching them."""
    core_module = ext.load(implementation)
    buffers: list[bytearray] = []  # (kept alive while attached)
    clock = iter(range(1_000, 1 << 40))

    def new_segment(base: int) -> None:
        buffers.append(bytearray(TWIN_SEGMENT_BYTES))
        core.attach_segment(base, buffers[-1])

    def new_queue_file(topic: str, queue_id: int, base_offset: int) -> None:
        if core.queue_offsets(topic, queue_id) is None:
            core.add_queue(topic, queue_id, base_offset, base_offset, TWIN_ENTRIES_PER_FILE)
            base_offset -= base_offset % TWIN_ENTRIES_PER_FILE
        buffers.append(bytearray(TWIN_ENTRIES_PER_FILE * 20))
        core.attach_queue_file(topic, queue_id, base_offset, buffers[-1])

    core = core_module.LogCore(
        segment_size_bytes=TWIN_SEGMENT_BYTES, message_size_bytes_max=1024,
        key_size_bytes_max=64, tags_size_bytes_max=64, new_segment=new_segment,
        new_queue_file=new_queue_file, clock_ms=lambda: next(clock), batch_count_max=8)
    return core, buffers


def _outcome(call: Any) -> Any:
    try:
        result = call()
    except Exception as error:  # noqa: BLE001 (the error is the answer compared)
        return type(error), str(error)
    if isinstance(result, list):
        return [bytes(record.raw) for record in result]
    if hasattr(result, "raw"):
        return bytes(result.raw)
    if hasattr(result, "stop_reason"):
        return result.end_offset, result.record_count, result.stop_reason
    return result


def _both(call: Any, cores: tuple[Any, Any]) -> None:
    c_answer, twin_answer = (_outcome(lambda core=core: call(core)) for core in cores)
    assert c_answer == twin_answer


def _twins_with_records(count: int) -> tuple[Any, Any]:
    (c_core, c_buffers), (twin, twin_buffers) = _bare_core("cython"), _bare_core("python")
    cores = (c_core, twin)
    for core in cores:
        for index in range(count):
            core.put(f"t{index % 2}", bytes([index]) * (index * 7 % 90), index % 3,
                     f"k{index}" if index % 2 else None, "tag" if index % 3 else None)
    for core, buffers in ((c_core, c_buffers), (twin, twin_buffers)):
        _SEGMENT_0[id(core)] = next(b for b in buffers if len(b) == TWIN_SEGMENT_BYTES)
    return cores


_SEGMENT_0: dict[int, bytearray] = {}  # id(core) -> its first segment's bytes


TWIN_SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                         suppress_health_check=[HealthCheck.too_slow])
HASHABLE = st.one_of(st.none(), st.booleans(), st.integers(-3, 1 << 65), st.floats(),
                     st.text(max_size=6), st.binary(max_size=6))
ANYTHING = st.one_of(HASHABLE, st.lists(st.integers(), max_size=2))


@twin_only
@TWIN_SETTINGS
@given(data=st.binary(max_size=400), at=st.sampled_from([0, 72, 4096, -1, "end"]),
       prefix=st.booleans())
def test_twin_append_raw_garbage(data, at, prefix):
    """Issue 14 (Build): the same garbage handed to ``append_raw`` of both cores gets the
    same answer, (type(e), str(e)) of the error included; a valid record's bytes with
    garbage after them too."""
    cores = _twins_with_records(5)
    head = cores[1].read_raw(0, 1 << 20)[:200] if prefix else b""
    for core in cores:
        core.truncate(0)
    position = cores[0].written_position if at == "end" else at
    _both(lambda core: core.append_raw(position, head + data), cores)
    _both(lambda core: core.read_raw(0, 1 << 20), cores)


@twin_only
@TWIN_SETTINGS
@given(kept=st.integers(0, 12), changed=st.integers(0, 11),
       delta=st.sampled_from([-2, -1, 1, 3, 1 << 40]))
def test_twin_append_raw_offset_gaps(kept, changed, delta):
    """append_raw checks that each record continues its queue (issue 17: the C core now
    follows the run of records of one queue without Python objects, and goes the slow way
    at each change of queue): runs of records of four queues, the follower holding
    the first ``kept`` of them, one of the rest with its queue offset moved by ``delta``
    (CRC resealed): both cores refuse it alike, naming the queue and the offsets, and
    take the same data whole once it is intact."""
    cores = (_bare_core("cython")[0], _bare_core("python")[0])
    for core in cores:  # runs of records of one queue, and changes of queue
        for index in range(12):
            core.put(f"t{index // 6}", bytes([index]) * 5, index // 3 % 2)
    data = cores[0].read_raw(0, 1 << 20)
    steps = [step for step in format.walk(data + bytes(16), 0) if step.kind == "record"]
    for core in cores:
        core.truncate(steps[kept].offset if kept < len(steps) else len(data))
    rest = bytearray(data[steps[min(kept, len(steps) - 1)].offset:] if kept < len(steps)
                     else b"")
    start = len(data) - len(rest)
    target = [step for step in steps if step.offset >= start][changed % max(1, len(
        steps) - kept)] if rest else None
    if target is not None:
        at = target.offset - start
        header = target.header
        format.RECORD_HEADER.pack_into(rest, at, *header._replace(
            queue_offset=max(0, header.queue_offset + delta)))
        record = bytearray(rest[at:at + header.size])
        format.seal_record(record)
        rest[at:at + header.size] = record
    _both(lambda core: core.append_raw(start, bytes(rest)), cores)
    _both(lambda core: core.append_raw(start, data[start:]), cores)
    _both(lambda core: core.read_raw(0, 1 << 20), cores)


@twin_only
@TWIN_SETTINGS
@given(flips=st.lists(st.tuples(st.integers(0, 1500), st.integers(0, 7)), min_size=1,
                      max_size=3),
       position=st.integers(0, 1600), max_bytes=st.integers(-1, 2000))
def test_twin_damaged_log_reads_and_scans(flips, position, max_bytes):
    """Issue 14 (Build): flipped bits in a segment, then read_raw, read_record, get and
    scan_segment from anywhere: both cores answer alike."""
    cores = _twins_with_records(20)
    for buffer in (_SEGMENT_0.pop(id(core)) for core in cores):
        for at, bit in flips:
            buffer[at] ^= 1 << bit
    _both(lambda core: core.read_raw(position, max_bytes), cores)
    _both(lambda core: core.read_record(position), cores)
    _both(lambda core: core.get("t0", 0, 0, 50, 1 << 20), cores)
    _both(lambda core: core.scan_segment(0, position % 1600, False), cores)


@twin_only
@TWIN_SETTINGS
@given(topic=st.one_of(ANYTHING, st.sampled_from(["t", "t\ud800", ""])),
       queue_id=st.one_of(ANYTHING, st.integers(0, 3)),
       key=st.one_of(ANYTHING, st.sampled_from(["k", "a||b", "\udfff"])),
       tags=st.one_of(ANYTHING, st.sampled_from(["x", " x", "a||b", "*"])),
       properties=st.one_of(ANYTHING, st.dictionaries(HASHABLE, ANYTHING, max_size=2)),
       body=st.one_of(ANYTHING, st.binary(max_size=20)), count=ANYTHING, offset=ANYTHING)
# A get of a topic that cannot be encoded: [] from the C core, UnicodeEncodeError from the
# twin (found by a run of this test; derandomized since, so this example stays checked).
@example(topic="t\ud800", queue_id=0, key=None, tags=None, properties=None, body=None,
         count=0, offset=0)
def test_twin_bad_put_and_get_arguments(topic, queue_id, key, tags, properties, body,
                                        count, offset):
    """Issue 14 (Build): bad put, put_batch and get arguments get the same answer from
    both cores."""
    cores = _twins_with_records(3)
    _both(lambda core: core.put(topic, body, queue_id, key, tags, properties), cores)
    _both(lambda core: core.put_batch(topic, [body] * 2, queue_id, key, tags, properties),
          cores)
    _both(lambda core: core.get(topic, queue_id, offset, count, 1 << 20), cores)
    _both(lambda core: core.written_position, cores)


def test_a_read_only_open_over_a_topic_name_that_is_not_utf8_is_corrupt_store(
        open_store, tmp_path, impl):
    """Beside a writer in another process that truncated and wrote again, a read-only
    open looking for a queue's lost entries read a record header whose topic bytes were
    not UTF-8 and raised a raw UnicodeDecodeError (test_spark_hostile, a seed in a few
    hundred), which the Spark reader could not tell from a bug, so no StoreChanged. It is
    a CorruptStore naming the record (the reader turns it into StoreChanged when the
    store's change count moved)."""
    store = open_store()
    results = [store.put("t", _queue_body(0, offset), 0) for offset in range(LOST_PUTS // 2)]
    store.close()
    files = sorted((tmp_path / "store" / "consumequeue" / "t" / "0").iterdir())
    files[-1].unlink()  # (a lost entry: the open looks for its record in the log)
    segments = sorted((tmp_path / "store" / "commitlog").iterdir())
    for result in results:
        at = result.position + format.RECORD_HEADER_SIZE
        path = [path for path in segments if int(path.name) <= at][-1]
        with open(path, "r+b") as segment:
            segment.seek(at - int(path.name))
            segment.write(b"\xc4")  # (a first byte of two, with no second)
    with pytest.raises(errors.CorruptStore, match="not UTF-8"):
        _read_only(tmp_path / "store", impl)
