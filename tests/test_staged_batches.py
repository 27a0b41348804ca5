"""Records that reach the commit log with pwrite (the log core's ``write_segment``), not
through the mapping: each put_batch of a sync-flush store, and a replica's records
(append_raw, any store, with no zeros written ahead of them). The files must be the
bytes the mapping path writes, readers beside it must never meet an entry whose record
is not there yet, a write that fails must leave nothing a reader or a recovery could
find, and a write through the mapping after raw records must not touch them.
"""

from __future__ import annotations

import errno
import os
import random
import sys
import threading

import pytest

import mqlog
from mqlog import ext
from mqlog.engine import files
from mqlog.engine.store import Store
from mqlog.errors import ConsumeQueueMismatch, DiskFull, StoreFailed
from mqlog.ext import fallback
from tests.conftest import SMALL

SEEDS = (1, 2, 3)
BODY = b"staged batch body "


@pytest.fixture
def staged_writes(monkeypatch):
    """How many batches went through write_segment (a test of the staged path that
    never took it would prove nothing)."""
    calls = []
    original = files.MappedFile.write_records

    def counted(self, offset, data):
        calls.append(len(data))
        return original(self, offset, data)

    monkeypatch.setattr(files.MappedFile, "write_records", counted)
    return calls


@pytest.fixture
def fast_switching():
    """The interpreter switches threads every microsecond while the test runs."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


def _batches(seed: int) -> list[dict]:
    """put_batch arguments: 1-40 bodies of 0-300 bytes, in three queues, some with a key,
    tags, properties or a born timestamp per body (SMALL's 64 KiB segments and 64
    entries per consume-queue file make batches cross both ends)."""
    rng = random.Random(seed)
    found = []
    for index in range(120):
        count = rng.randint(1, 40)
        arguments: dict = {"bodies": [BODY[:rng.randint(0, len(BODY))] * rng.randint(0, 16)
                                      for _ in range(count)],
                           "queue_id": rng.randint(0, 2)}
        if rng.random() < 0.3:
            arguments["key"] = f"key-{index}"
        if rng.random() < 0.3:
            arguments["tags"] = rng.choice(["a", "b"])
        if rng.random() < 0.2:
            arguments["properties"] = {"n": index}
        if rng.random() < 0.2:
            arguments["born_timestamp"] = [rng.randint(1, 10**12) for _ in range(count)]
        found.append(arguments)
    return found


def _files_of(root) -> dict[str, bytes]:
    """The commit log's and the consume queues' bytes, by path under the store."""
    return {str(path.relative_to(root)): path.read_bytes()
            for directory in ("commitlog", "consumequeue")
            for path in sorted((root / directory).rglob("*")) if path.is_file()}


@pytest.mark.parametrize("seed", SEEDS)
def test_staged_batches_write_the_bytes_the_mapping_writes(tmp_path, impl, seed,
                                                           staged_writes):
    """The same batches into a sync-flush store (pwrite) and an async one (the
    mapping), the clock fixed: the same answers and byte-identical files."""
    answers = {}
    for mode in ("sync", "async"):
        with mqlog.open(tmp_path / mode, implementation=impl, flush_mode=mode,
                        clock_ms=lambda: 1_700_000_000_000, **SMALL) as store:
            answers[mode] = [tuple(store.put_batch("t", **arguments))
                             for arguments in _batches(seed)]
        if mode == "sync":
            staged = len(staged_writes)
    assert answers["sync"] == answers["async"], f"seed {seed}"
    assert 60 <= staged < len(_batches(seed)), \
        f"seed {seed}: {staged} batches staged (the rest cross a file's end)"
    assert _files_of(tmp_path / "sync") == _files_of(tmp_path / "async"), f"seed {seed}"


def test_readers_beside_staged_batches_see_whole_batches(open_store, staged_writes,
                                                        fast_switching):
    """Readers by queue (get) and by position (read_raw, what a follower fetches) run
    beside a writer of staged batches: every record is the one its entry names, and
    never an entry whose record is not written yet (records are published first). The
    interpreter switches threads every microsecond, so the twin's readers run between
    its steps."""
    store = open_store(flush_mode="sync", segment_size_bytes=1 << 20)
    batches, per_batch = 150, 20
    problems: list[BaseException] = []
    done = threading.Event()

    def by_queue() -> None:
        offset = 0
        while offset < batches * per_batch and not problems:
            for record in store.get("t", 0, offset, 1000):
                assert record.offset == offset and record.body == b"%d" % offset
                offset += 1

    def by_position() -> None:
        position = 0
        while not (done.is_set() and position == store.written_position) and not problems:
            if position < store.written_position:
                position += len(store.read_raw(position, 64 << 10))

    def guarded(target) -> threading.Thread:
        def run() -> None:
            try:
                target()
            except BaseException as error:  # reported below, with the writer stopped
                problems.append(error)
        thread = threading.Thread(target=run)
        thread.start()
        return thread

    readers = [guarded(by_queue), guarded(by_position)]
    for batch in range(batches):
        if problems:
            break
        first = batch * per_batch
        store.put_batch("t", [b"%d" % offset for offset in range(first, first + per_batch)])
    done.set()
    for reader in readers:
        reader.join()
    assert not problems, problems
    assert batches // 2 <= len(staged_writes) < batches  # (some cross a queue file's end)


def _bare_core(impl: str, writes: list[int], after_write=None):  # noqa: ANN001
    """A log core on in-memory segments whose write_segment copies the batch in, as the
    engine's pwrite does, notes its size in ``writes`` and calls ``after_write(core)``
    if given; 1 MiB segments, consume queues of 65,536 entries a file."""
    module, buffers = ext.load(impl), {}
    entries = 1 << 16

    def new_segment(base: int) -> None:
        buffers[base] = bytearray(1 << 20)
        core.attach_segment(base, buffers[base])

    def new_queue_file(topic: str, queue_id: int, base_offset: int) -> None:
        core.add_queue(topic, queue_id, base_offset, base_offset, entries)
        core.attach_queue_file(topic, queue_id, base_offset, bytearray(entries * 20))

    def write_segment(base: int, offset: int, data) -> None:  # noqa: ANN001
        buffers[base][offset:offset + len(data)] = data
        writes.append(len(data))
        if after_write is not None:
            after_write(core)

    core = module.LogCore(segment_size_bytes=1 << 20, message_size_bytes_max=4096,
                          key_size_bytes_max=255, tags_size_bytes_max=255,
                          new_segment=new_segment, new_queue_file=new_queue_file,
                          write_segment=write_segment, stage_batches=True)
    core.restore(0)
    return core


def test_the_written_position_moves_last():
    """What a checkpoint and the key index read without the write lock: once the written
    position covers a batch, its entries and its keyed end are in place (published the
    other way round, a checkpoint could save a position past its queues' synced entries,
    and the key index skip a keyed batch), and a reader meanwhile takes the entries ahead
    of it for records to come, not for garbage. Checked at every line the twin runs
    while it stores (a trace function: a thread switch may land between any two); the C
    core publishes under the GIL in one step, which no Python thread can split."""
    writes: list[int] = []
    core, problems = _bare_core("python", writes), []
    size = core.put_batch("t", [b"0123456789"], key="k").end_position

    def check(frame, event, argument):  # noqa: ANN001, ANN202  (sys.settrace's shape)
        written = core.written_position
        next_offset, keyed_end = core.queue_offsets("t", 0)[1], core.last_keyed_end
        where = f"{frame.f_code.co_name}:{frame.f_lineno}"
        if next_offset < written // size or keyed_end < written:
            problems.append(f"{where}: written {written}, {next_offset} entries, keyed "
                            f"end {keyed_end}")
        try:  # and a reader here meets no entry it takes for garbage
            core.get("t", 0, 0, 1 << 20, 1 << 24)
        except ConsumeQueueMismatch as error:
            problems.append(f"{where}: {error}")
        return check

    def trace(frame, event, argument):  # noqa: ANN001, ANN202
        return check if frame.f_code.co_filename == fallback.__file__ else None

    sys.settrace(trace)
    try:
        for _ in range(20):
            core.put_batch("t", [b"0123456789"] * 10, key="k")
    finally:
        sys.settrace(None)
    assert not problems, problems[:3]
    assert len(writes) == 21


def test_a_new_epoch_set_during_the_write_is_not_the_batch_s(impl):
    """set_epoch takes no write lock, and the engine's pwrite lets the GIL go: the batch
    keeps the epoch it was encoded with, and the epochs noted say so (the next put starts
    the new epoch)."""
    def new_epoch(core) -> None:  # noqa: ANN001
        core.epoch = 7  # (what Store.set_epoch does to the core)

    writes: list[int] = []
    core = _bare_core(impl, writes, after_write=new_epoch)
    core.put_batch("t", [b"epoch zero"] * 3)
    third = core.put("t", b"epoch seven")
    assert len(writes) == 1
    assert [record.epoch for record in core.get("t", 0, 0, 10, 1 << 20)] == [0] * 3 + [7]
    assert core.epoch_starts == [(0, 0), (7, third.position)]


def _failing_pwrite(monkeypatch, error: int):
    """os.pwrite whose next use by this thread writes half of what it is given, the one
    after raises ``error``; then the real one again. Other threads (the allocator's,
    which writes zeros with os.pwrite in the twin) get the real one throughout."""
    real, uses, mine = os.pwrite, [], threading.get_ident()

    def pwrite(fd, data, offset):
        if threading.get_ident() != mine:
            return real(fd, data, offset)
        uses.append(len(data))
        if len(uses) == 1:
            return real(fd, memoryview(data)[:len(data) // 2], offset)
        if len(uses) == 2:
            raise OSError(error, os.strerror(error))
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    return uses


@pytest.mark.parametrize("end", ["close", "crash"])
def test_a_failed_write_fences_the_store_and_leaves_no_records(tmp_path, impl, monkeypatch,
                                                                end):
    """EIO half way through a batch's pwrite: StoreFailed and the store fenced; the half
    that reached the file is zeroed, so a recovery finds only what was acknowledged
    (without the zeroing it finds the first half of the failed batch), and close()
    raises the failure and leaves the store for recovery, as after a failed flush."""
    path = tmp_path / "store"
    store = mqlog.open(path, implementation=impl, flush_mode="sync", **SMALL)
    acknowledged = store.put_batch("t", [b"kept"] * 10)
    uses = _failing_pwrite(monkeypatch, errno.EIO)
    with pytest.raises(StoreFailed, match="nothing of this write was stored"):
        store.put_batch("t", [b"failed"] * 40)
    monkeypatch.undo()
    assert len(uses) >= 2
    assert store.written_position == acknowledged.end_position
    assert store.max_offset("t", 0) == 10
    with pytest.raises(StoreFailed):
        store.put("t", b"after")
    if end == "close":
        with pytest.raises(StoreFailed, match="writing the commit log failed"):
            store.close()
    else:
        store.abandon("a crash after the failed write")
    with mqlog.open(path, implementation=impl, flush_mode="sync", **SMALL) as store:
        assert not store.recovery_report.clean
        assert [record.body for record in store.get("t", 0, 0, 100)] == [b"kept"] * 10
        assert store.written_position == acknowledged.end_position


def test_a_full_disk_on_a_batch_changes_nothing(tmp_path, impl, monkeypatch):
    """ENOSPC half way through: DiskFull, nothing published or left in the file (a crash
    right after finds only what was acknowledged), and the next batch goes where the
    failed one would have."""
    path = tmp_path / "store"
    store = mqlog.open(path, implementation=impl, flush_mode="sync", **SMALL)
    store.put_batch("t", [b"kept"] * 10)
    end = store.written_position
    _failing_pwrite(monkeypatch, errno.ENOSPC)
    with pytest.raises(DiskFull):
        store.put_batch("t", [b"failed"] * 40)
    monkeypatch.undo()
    assert store.written_position == end and store.max_offset("t", 0) == 10
    store.abandon("a crash after the full disk")
    with mqlog.open(path, implementation=impl, flush_mode="sync", **SMALL) as store:
        assert [record.body for record in store.get("t", 0, 0, 100)] == [b"kept"] * 10
        assert store.put_batch("t", [b"next"] * 5).position == end
        bodies = [record.body for record in store.get("t", 0, 0, 100)]
        assert bodies == [b"kept"] * 10 + [b"next"] * 5


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
def test_descriptors_do_not_pile_up_as_the_log_rolls(tmp_path, impl, staged_writes):
    """write_records keeps a descriptor on the segment it writes to; the next segment
    closes the last one's (one per segment ever written would reach the process's limit
    on a long-lived store). Each mapped file holds one descriptor of its own (files.py)."""
    root = tmp_path / "store"

    def mapped_files() -> int:
        return sum(1 for directory in ("commitlog", "consumequeue")
                   for path in (root / directory).rglob("*") if path.is_file())

    with mqlog.open(root, implementation=impl, flush_mode="sync", **SMALL) as store:
        store.put_batch("t", [b"x" * 1000] * 20)
        descriptors, files_before = _open_descriptors(), mapped_files()
        for _ in range(60):  # ~20 KB a batch: a 64 KiB segment every three batches
            store.put_batch("t", [b"x" * 1000] * 20)
        new_files = mapped_files() - files_before
        assert len(store.files.segments()) > 15 and len(staged_writes) > 30
        # (+3: the allocator or a checkpoint may hold a file open for a moment)
        assert _open_descriptors() - descriptors <= new_files + 3


# --- a replica's records (append_raw) ---------------------------------------------------


def _raw_chunks(store, seed: int) -> list[bytes]:
    """The store's log as a follower fetches it: read_raw pieces of 1-20 KB."""
    rng, chunks, position = random.Random(seed), [], 0
    while position < store.written_position:
        chunks.append(store.read_raw(position, rng.randint(1_000, 20_000)))
        position += len(chunks[-1])
    return chunks


@pytest.mark.parametrize("seed", SEEDS)
def test_raw_records_write_the_bytes_the_leader_wrote(tmp_path, impl, seed, staged_writes):
    """A leader's log (batches through the mapping, crossing segment ends: blanks) copied
    to a follower piece by piece with append_raw, each piece with one pwrite per segment
    it reaches: byte-identical files, and every record read back."""
    with mqlog.open(tmp_path / "leader", implementation=impl, **SMALL) as leader:
        for arguments in _batches(seed):
            leader.put_batch("t", **arguments)
        chunks = _raw_chunks(leader, seed)
        expected = {queue: [record.body for record in leader.get("t", queue, 0, 10_000)]
                    for queue in range(3)}
    assert not staged_writes  # (the leader's batches went through the mapping)
    with mqlog.open(tmp_path / "follower", implementation=impl, **SMALL) as follower:
        position = 0
        for chunk in chunks:
            position = follower.append_raw(position, chunk)
        assert len(follower.files.segments()) > 3, f"seed {seed}"
        for queue, bodies in expected.items():
            got = [record.body for record in follower.get("t", queue, 0, 10_000)]
            assert got == bodies, f"seed {seed}, queue {queue}"
        segments = len(follower.files.segments())
    # (one pwrite a piece, and one more for each segment end a piece crosses)
    assert len(chunks) <= len(staged_writes) <= len(chunks) + segments, f"seed {seed}"
    assert _files_of(tmp_path / "follower") == _files_of(tmp_path / "leader"), f"seed {seed}"


@pytest.mark.parametrize("seed", SEEDS)
def test_puts_after_raw_records_leave_them_whole(tmp_path, impl, seed, staged_writes):
    """Two stores trade the lead: one puts through the mapping, the other copies that
    with append_raw, then the other way round. Raw records end inside a page, past what
    was backed; the backing for the next put starts where they end, not at the page
    they end in (zeros there would wipe their tail: a CRC error on read, a cut log on
    recovery). Both logs stay whole and identical, and recover clean."""
    rng = random.Random(seed)
    paths = [tmp_path / "a", tmp_path / "b"]
    stores = [mqlog.open(path, implementation=impl, **SMALL) for path in paths]
    try:
        for turn in range(60):
            leader, follower = stores[turn % 2], stores[1 - turn % 2]
            for _ in range(rng.randint(1, 4)):
                leader.put_batch("t", [b"%d" % turn * rng.randint(1, 200)]
                                 * rng.randint(1, 12), queue_id=turn % 2)
            while follower.written_position < leader.written_position:
                follower.append_raw(follower.written_position, leader.read_raw(
                    follower.written_position, rng.randint(500, 9_000)))
        expected = [[record.body for record in stores[0].get("t", queue, 0, 60_000)]
                    for queue in (0, 1)]
        assert [[record.body for record in stores[1].get("t", queue, 0, 60_000)]
                for queue in (0, 1)] == expected, f"seed {seed}"
        assert len(stores[0].files.segments()) > 3 and len(staged_writes) > 60
    finally:
        for store in stores:
            store.close()
    assert _files_of(paths[0]) == _files_of(paths[1]), f"seed {seed}"
    for path in paths:
        with mqlog.open(path, implementation=impl, **SMALL) as store:
            assert store.recovery_report.clean, f"seed {seed}"
            assert [[record.body for record in store.get("t", queue, 0, 60_000)]
                    for queue in (0, 1)] == expected, f"seed {seed}"


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EIO])
def test_a_failed_write_of_raw_records_leaves_nothing(tmp_path, impl, monkeypatch, error):
    """Half of a replica's records reach the file, then the pwrite fails: nothing is
    published, the half is gone from the file (a hole or zeros: a recovery must not find
    whole records there), and then a full disk (DiskFull) changes nothing (the same
    records go in once there is room), a failing device (EIO) fences the store."""
    with mqlog.open(tmp_path / "leader", implementation=impl, **SMALL) as leader:
        leader.put_batch("t", [b"kept"] * 10)
        kept = leader.written_position
        leader.put_batch("t", [b"late"] * 40)
        first, second = leader.read_raw(0, kept), leader.read_raw(kept, 1 << 20)
    path = tmp_path / "follower"
    store = mqlog.open(path, implementation=impl, **SMALL)
    assert store.append_raw(0, first) == kept
    _failing_pwrite(monkeypatch, error)
    with pytest.raises(DiskFull if error == errno.ENOSPC else StoreFailed):
        store.append_raw(kept, second)
    monkeypatch.undo()
    assert store.written_position == kept and store.max_offset("t", 0) == 10
    segment = sorted((path / "commitlog").iterdir())[0]
    with open(segment, "rb") as file:
        file.seek(kept)
        assert not any(file.read(len(second))), "the failed write left bytes behind"
    if error == errno.ENOSPC:
        assert store.append_raw(kept, second) == kept + len(second)
        store.close()
    else:
        with pytest.raises(StoreFailed):
            store.append_raw(kept, second)
        store.abandon("a crash after the failed write")
    with mqlog.open(path, implementation=impl, **SMALL) as store:
        bodies = [record.body for record in store.get("t", 0, 0, 100)]
        assert bodies == [b"kept"] * 10 + ([b"late"] * 40 if error == errno.ENOSPC else [])


def test_raw_records_a_queue_cannot_take_leave_nothing_past_the_log(tmp_path, impl,
                                                                      monkeypatch):
    """A run of raw records is written at once and published one by one; when a record's
    consume queue cannot take it (its file's next page on a full disk), the records
    written and not published are zeroed. They stayed whole in the file before (a
    helper's review): a crash then brought them back although append_raw had refused
    them, and after puts in their place the store did not open (ConsumeQueueMismatch)."""
    with mqlog.open(tmp_path / "leader", implementation=impl, **SMALL) as leader:
        for _ in range(40):
            leader.put("t", b"a" * 100, queue_id=0)
            leader.put("t", b"b" * 100, queue_id=1)
        data = leader.read_raw(0, 1 << 20)
    real, refusing = Store._prepare_queue, [True]

    def full(self, topic, queue_id, offset):  # noqa: ANN001, ANN202
        if queue_id == 1 and refusing[0]:
            raise DiskFull("no room for the consume queue (test)")
        return real(self, topic, queue_id, offset)

    path = tmp_path / "follower"
    settings = {**SMALL, "consume_queue_entries_per_file": 1 << 16}  # (backed in steps)
    monkeypatch.setattr(Store, "_prepare_queue", full)  # (the core keeps the bound one)
    store = mqlog.open(path, implementation=impl, **settings)
    with pytest.raises(DiskFull):
        store.append_raw(0, data)
    refusing[0] = False  # (room again)
    end = store.written_position
    assert store.max_offset("t", 0) == 1 and store.max_offset("t", 1) == 0
    with open(sorted((path / "commitlog").iterdir())[0], "rb") as file:
        file.seek(end)
        assert not any(file.read(len(data))), "unpublished records left in the file"
    for _ in range(3):  # it leads now: records of the same size where they were
        store.put("t", b"c" * 100, queue_id=1)
    store.abandon("a crash after the refused append")
    with mqlog.open(path, implementation=impl, **settings) as store:
        assert [r.body for r in store.get("t", 1, 0, 100)] == [b"c" * 100] * 3
        assert [r.body for r in store.get("t", 0, 0, 100)] == [b"a" * 100]


def test_a_failed_write_keeps_no_view_of_the_records(tmp_path, impl, monkeypatch):
    """The failure a failed write leaves (raised again by close()) keeps its traceback,
    and with it the engine's frames: no view of the bytes written may stay usable there,
    for the C core frees them (it read freed memory before: a helper's review)."""
    with mqlog.open(tmp_path / "leader", implementation=impl, **SMALL) as leader:
        leader.put_batch("t", [b"L" * 200] * 50)
        data = leader.read_raw(0, 1 << 20)
    store = mqlog.open(tmp_path / "follower", implementation=impl, **SMALL)
    _failing_pwrite(monkeypatch, errno.EIO)
    with pytest.raises(StoreFailed) as failed:
        store.append_raw(0, bytearray(data))
    monkeypatch.undo()
    views, trace = [], failed.value.__cause__.__traceback__
    while trace is not None:
        views += [value for value in trace.tb_frame.f_locals.values()
                  if isinstance(value, memoryview)]
        trace = trace.tb_next
    assert views, "no view found: the test looks at the wrong frames"
    for view in views:
        with pytest.raises(ValueError, match="released"):
            bytes(view)
    store.abandon("after the failed write")
