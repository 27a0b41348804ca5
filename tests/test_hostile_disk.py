"""A hostile machine: a full disk, too few file descriptors, a store that must stay small.

Issue 14's findings 2 (SIGBUS on a full disk), 11 (two descriptors per mapped file; EMFILE
fenced the store) and 14 (a new store cost 1.1 GB). The full-disk and descriptor cases
run in a child process, so a SIGBUS fails the test instead of killing pytest, on a small
file system the test makes itself (a tmpfs, and a loop-mounted ext4 image), skipped with
the reason when the machine does not let it mount one.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import mqlog
from mqlog import errors, ext
from mqlog import format as fmt
from mqlog.config import MiB

ROOT = Path(__file__).resolve().parent.parent

# --- the child programs --------------------------------------------------------------------

FULL_DISK_CHILD = r"""
import json, os, sys, time
import mqlog
from mqlog import errors

root, impl, settings = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
resume = settings.pop("resume")
filler = os.path.join(root, "filler")
with open(filler, "wb") as file:  # room to give back once the disk is full
    file.write(os.urandom(settings.pop("filler_bytes")))
reserve = os.path.join(root, "reserve")  # room for the last checkpoint, below
with open(reserve, "wb") as file:
    file.write(os.urandom(64 << 10))
acked = {}  # (topic, queue id) -> bodies stored
store = mqlog.open(os.path.join(root, "store"), implementation=impl, **settings)
full = None
for index in range(1_000_000):
    topic, queue_id = f"t{index % 3}", index % 5
    body = index.to_bytes(4, "little") * 250
    try:
        store.put(topic, body, queue_id=queue_id, key=f"k{index}")
    except errors.DiskFull as error:
        full = error
        break
    acked.setdefault((topic, queue_id), []).append(body)
assert full is not None, "the disk never filled"
assert "full" in str(full) and "retry" in str(full), str(full)
try:  # a new consume queue on a full disk: typed too
    store.put("fresh", b"y", queue_id=9)
    acked[("fresh", 9)] = [b"y"]
except errors.DiskFull:
    pass
try:  # a query runs the indexer, which needs room for its entries
    store.query("t0", "k0")
except errors.DiskFull:
    pass
# The last checkpoint: each one replaces its file (a block taken, the old one given
# back), so one running while the disk is topped up could leave a block for the commit
# below (it happened once under load). Given room, it catches up with the log; after
# that it writes nothing while the log stands still.
os.unlink(reserve)
os.sync()
deadline = time.monotonic() + 60
while store.checkpointed_position != store.written_position or store.checkpoint_error:
    assert time.monotonic() < deadline, f"no checkpoint caught up: {store.checkpoint_error}"
    time.sleep(0.001)
topup = os.path.join(root, "topup")  # the last blocks too: nothing is left for a commit
with open(topup, "wb", buffering=0) as file:
    try:
        while True:
            file.write(bytes(512))
    except OSError:
        pass
try:  # a commit on a full disk: DiskFull (never a raw OSError), the old offsets stay
    store.commit_offset("g", "t0", 0, 1)
    raise AssertionError("a commit on a full disk succeeded")
except errors.DiskFull as error:
    assert "full" in str(error), str(error)
assert store.committed_offset("g", "t0", 0) is None
for (topic, queue_id), bodies in acked.items():  # reads work on a full disk
    got = store.get(topic, queue_id, 0, len(bodies) + 1, 64 << 20)
    assert [record.body for record in got] == bodies, (topic, queue_id)
if not resume:  # stop here, without a close: on a full disk it needs room for its files
    print("ok", flush=True)
    os._exit(0)
os.unlink(filler)  # space returns (ext4 frees it at its next commit): writes resume
os.unlink(topup)
os.sync()
store.put("t0", b"after", queue_id=0)
acked[("t0", 0)].append(b"after")
store.commit_offset("g", "t0", 0, 1)
store.flush()
store.close()
with mqlog.open(os.path.join(root, "store"), implementation=impl, **settings) as store:
    for (topic, queue_id), bodies in acked.items():
        got = store.get(topic, queue_id, 0, len(bodies) + 1, 64 << 20)
        assert [record.body for record in got] == bodies, (topic, queue_id)
    assert store.committed_offset("g", "t0", 0) == 1
print("ok", sum(len(bodies) for bodies in acked.values()))
"""

DURABLE_BATCHES_CHILD = r"""
import os, sys
import mqlog
from mqlog import errors

root, impl = sys.argv[1], sys.argv[2]
path = os.path.join(root, "store")
settings = dict(implementation=impl, flush_mode="sync", segment_size_bytes=1 << 20,
                message_size_bytes_max=1 << 16, segment_prepare_ahead_bytes_max=256 << 10,
                checkpoint_interval_ms=5)
acked, full = [], None
store = mqlog.open(path, **settings)
for index in range(1_000_000):
    bodies = [index.to_bytes(4, "little") * 250] * 20
    try:
        store.put_batch("t", bodies, key=f"k{index}")
    except errors.DiskFull as error:
        full = error
        break
    acked.extend(bodies)
assert full is not None, "the disk never filled"
assert [r.body for r in store.get("t", 0, 0, len(acked) + 100, 64 << 20)] == acked
store.abandon("a crash on the full disk")
with mqlog.open(path, implementation=impl, read_only=True) as store:
    got = [r.body for r in store.get("t", 0, 0, len(acked) + 100, 64 << 20)]
    assert got == acked, (len(got), len(acked))  # (nothing of the refused batch)
print("ok", len(acked))
"""

CQ_CROSSING_CHILD = r"""
import os, sys
import mqlog
from mqlog import errors

root, impl, mode = sys.argv[1], sys.argv[2], sys.argv[3]
path = os.path.join(root, "store")
# 16 entries a consume-queue file. Nothing runs beside the writer (no thread takes or
# gives back blocks), and nothing backs the segment ahead of it but its own 64 KiB
# steps: the batch below needs no segment block, only the next consume-queue file.
settings = dict(implementation=impl, flush_mode=mode, background_threads=False,
                segment_size_bytes=1 << 20, message_size_bytes_max=1 << 16,
                consume_queue_entries_per_file=16, segment_allocate_step_bytes=64 << 10,
                segment_prepare_ahead_bytes_max=0)


def fill():
    # Until a pass finds no room at all: ext4 gives back, at a sync, what it reserved.
    with open(os.path.join(root, "filler"), "ab", buffering=0) as file:
        while True:
            wrote = 0
            try:
                while True:
                    wrote += file.write(bytes(1024))
            except OSError:
                pass
            os.sync()
            if not wrote:
                return


def free():
    os.unlink(os.path.join(root, "filler"))
    os.sync()


def bodies(store):
    return [record.body for record in store.get("t", 0, 0, 1000, 1 << 20)]


def refused(store, batch, acked):
    # Offsets 10..19: the queue's first file ends at 16, the disk is full.
    try:
        store.put_batch("t", batch)
    except errors.DiskFull:
        pass
    else:
        raise AssertionError("a batch was stored on a full disk")
    assert bodies(store) == acked, bodies(store)  # (nothing of it, live)


acked = [b"acked %d" % index for index in range(10)]
batch = [b"batch %d" % index for index in range(10)]
store = mqlog.open(path, **settings)
store.put_batch("t", acked)
store.flush()
fill()
refused(store, batch, acked)
store.abandon("a crash on the full disk")
with mqlog.open(path, implementation=impl, read_only=True) as store:
    assert bodies(store) == acked, bodies(store)  # (nothing of it after a crash)
free()
store = mqlog.open(path, **settings)
assert bodies(store) == acked, bodies(store)
fill()  # again, and this time the store lives on: room returns, the batch goes whole
refused(store, batch, acked)
free()
store.put_batch("t", batch)
store.put("t", b"one more")
acked += batch + [b"one more"]
assert bodies(store) == acked, bodies(store)
store.close()
with mqlog.open(path, **settings) as store:
    assert bodies(store) == acked, bodies(store)
print("ok")
"""

RAW_RECORDS_CHILD = r"""
import os, shutil, sys, tempfile
import mqlog
from mqlog import errors

root, impl = sys.argv[1], sys.argv[2]
path = os.path.join(root, "store")
sizes = dict(implementation=impl, segment_size_bytes=1 << 20, message_size_bytes_max=1 << 16)
source = tempfile.mkdtemp()  # the leader's log, on the machine's disk
leader = mqlog.open(os.path.join(source, "leader"), **sizes)
follower = mqlog.open(path, **sizes, segment_prepare_ahead_bytes_max=256 << 10,
                      checkpoint_interval_ms=5)
full = None
for index in range(1_000_000):
    leader.put_batch("t", [index.to_bytes(4, "little") * 250] * 20)
    try:
        while follower.written_position < leader.written_position:
            at = follower.written_position
            follower.append_raw(at, leader.read_raw(at, 37_000))
    except errors.DiskFull as error:
        full = error
        break
assert full is not None, "the disk never filled"
have = follower.max_offset("t", 0)
expected = [r.body for r in leader.get("t", 0, 0, have, 64 << 20)]
assert [r.body for r in follower.get("t", 0, 0, have + 100, 64 << 20)] == expected
try:  # it leads now: a put through the mapping, after raw records that end in a page
    follower.put("t", b"led")
    expected.append(b"led")
except errors.DiskFull:
    pass
follower.abandon("a crash on the full disk")
leader.close()
shutil.rmtree(source)
with mqlog.open(path, implementation=impl, read_only=True) as store:
    got = [r.body for r in store.get("t", 0, 0, len(expected) + 100, 64 << 20)]
    assert got == expected, (len(got), len(expected))  # (nothing of the refused write)
print("ok", len(expected))
"""

RAW_TAIL_CUT_CHILD = r"""
import os, shutil, sys, tempfile
import mqlog
from mqlog import errors

root, impl = sys.argv[1], sys.argv[2]
sizes = dict(implementation=impl, segment_size_bytes=1 << 20, message_size_bytes_max=1 << 16)
source = tempfile.mkdtemp()
leader = mqlog.open(os.path.join(source, "leader"), **sizes)
follower = mqlog.open(os.path.join(root, "store"), **sizes,
                      segment_prepare_ahead_bytes_max=256 << 10)
while True:  # a record at a time, until the log ends 100-900 bytes into a page
    leader.put("t", b"x" * 200)
    last = follower.written_position
    follower.append_raw(last, leader.read_raw(last, 1 << 20))
    end = follower.written_position
    if end > 300_000 and 100 < end % 4096 < 900:
        break
kept = [r.body for r in follower.get("t", 0, 0, 10_000, 64 << 20)][:-1]
spare = os.path.join(root, "spare")  # room for the truncation's checkpoint, no more
with open(spare, "wb") as file:
    file.write(bytes(1024))
os.sync()
with open(os.path.join(root, "fill"), "wb", buffering=0) as file:
    try:
        while True:
            file.write(bytes(1024))
    except OSError:
        pass
os.unlink(spare)
os.sync()
try:  # a Raft follower's cut: the tail is zeroed through the mapping
    follower.truncate(last)
except errors.DiskFull:
    pass
assert [r.body for r in follower.get("t", 0, 0, 10_000, 64 << 20)] == kept
follower.abandon("a crash on the full disk")
leader.close()
shutil.rmtree(source)
print("ok", len(kept))
"""

CUT_PAGE_CHILD = r"""
import os, sys
import mqlog
from mqlog import errors
from mqlog.engine import files

root, impl, phase = sys.argv[1], sys.argv[2], sys.argv[3]
path = os.path.join(root, "store")
settings = dict(implementation=impl, checkpoint_interval_ms=3_600_000,
                index_interval_ms=3_600_000, segment_size_bytes=1 << 20,
                message_size_bytes_max=1 << 16)
if phase == "write":  # 100 entries (2,000 bytes) checkpointed, 50 more flushed, a crash
    with mqlog.open(path, **settings) as store:
        for index in range(100):
            store.put("t", b"%d" % index)
    store = mqlog.open(path, **settings)
    for index in range(100, 150):
        store.put("t", b"%d" % index)
    store.flush()
    os._exit(0)
filler = os.path.join(root, "filler")
cut = files.MappedFile.zero_from


def cut_then_fill(self, offset):
    # Recovery cuts the queue at entry 100, inside its first page. It keeps the blocks
    # after the cut now (clear_from), but a hole there is what a queue started after
    # tombstones has: punched here, with 1 KiB blocks the page is partly a hole. The disk
    # fills right then, before the rebuilt entries are written into that page.
    cut(self, offset)
    if "consumequeue" in str(self.path) and not os.path.exists(filler):
        gap = os.path.join(root, "gap")  # room for the prefill after the cut, no more
        with open(gap, "wb") as file:
            file.write(bytes(mqlog.StoreConfig().consume_queue_prefill_bytes))
        with open(filler, "wb", buffering=0) as file:
            try:
                while True:
                    file.write(bytes(1024))
            except OSError:
                pass
        os.unlink(gap)
        os.sync()


files.MappedFile.clear_from = cut_then_fill
try:
    mqlog.open(path, **settings).close()
    print("opened")
except errors.DiskFull as error:
    print("full:", error)
os.unlink(filler)
os.sync()
with mqlog.open(path, **settings) as store:
    got = [record.body for record in store.get("t", 0, 0, 1000, 1 << 20)]
    assert got == [b"%d" % index for index in range(150)], got
print("ok")
"""

# The child programs' way to fill a disk: ``fill(name)`` writes a file until ENOSPC.
FILL_DISK = r"""

def fill(name):
    with open(os.path.join(root, name), "wb", buffering=0) as file:
        try:
            while True:
                file.write(bytes(1024))
        except OSError:
            pass
    os.sync()  # (ext4 gives back what it reserved for delayed allocation)


"""

CLEAR_TAIL_CHILD = r"""
import os, sys
import mqlog
from mqlog import errors
from mqlog.engine import files

root, impl, phase, lives = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
path = os.path.join(root, "store")
settings = dict(implementation=impl, checkpoint_interval_ms=3_600_000,
                index_interval_ms=3_600_000, segment_size_bytes=1 << 20,
                message_size_bytes_max=1 << 16)
bodies = [b"%d" % index for index in range(2100)]
if phase == "write":  # 2,100 entries (42,000 bytes) flushed, a crash; with two lives, the
    if lives == "two":  # first 100 checkpointed by a clean close (else none is)
        with mqlog.open(path, **settings) as store:
            for body in bodies[:100]:
                store.put("t", body)
    store = mqlog.open(path, **settings)
    for body in bodies[100 if lives == "two" else 0:]:
        store.put("t", body)
    store.flush()
    os._exit(0)

""" + FILL_DISK + r"""
fill("filler")
fill("topup")
try:
    fill("probe")
    with open(os.path.join(root, "probe"), "ab", buffering=0) as file:
        file.write(bytes(1024))
        os.fsync(file.fileno())
    raise AssertionError("the disk is not full")
except OSError:
    pass


def data_ranges(mapped, offset):
    fd = os.open(mapped.path, os.O_RDONLY)
    try:
        return list(files._data_ranges(fd, offset, mapped.size))
    finally:
        os.close(fd)


def room():
    return os.statvfs(root).f_bfree


clear_from, cleared = files.MappedFile.clear_from, []


def watched(self, offset):
    # Recovery zeroes the queue's entries past the checkpoint: over blocks it has, on a
    # disk that has none to give.
    before = (data_ranges(self, offset), os.stat(self.path).st_blocks, room())
    clear_from(self, offset)
    os.sync()
    after = (data_ranges(self, offset), os.stat(self.path).st_blocks, room())
    fd = os.open(self.path, os.O_RDONLY)  # (pread: a hole read through the mapping of
    try:                                  # a full tmpfs is a SIGBUS)
        assert os.pread(fd, self.size, offset) == bytes(self.size - offset), "not zeroed"
    finally:
        os.close(fd)
    cleared.append((self.path.name, offset, before, after))


files.MappedFile.clear_from = watched
store = mqlog.open(path, **settings)  # recovery on the full disk
assert cleared, "recovery zeroed no queue tail"
for name, offset, before, after in cleared:
    assert before[0] and offset < before[0][-1][1], (name, offset, before)  # blocks to zero
    assert before == after, (name, offset, before, after)  # the same blocks, no new one
assert [record.body for record in store.get("t", 0, 0, 3000, 1 << 20)] == bodies
stored = 0
try:  # what truly needs room is typed
    for _ in range(1_000_000):
        store.put("t", b"more")
        stored += 1
    raise AssertionError("the disk never filled")
except errors.DiskFull as error:
    assert "full" in str(error), str(error)
for name in ("filler", "topup", "probe"):
    os.unlink(os.path.join(root, name))
os.sync()
store.close()
with mqlog.open(path, **settings) as store:
    got = []
    while records := store.get("t", 0, len(got), 4096, 1 << 24):
        got += [record.body for record in records]
    assert got == bodies + [b"more"] * stored, (len(got), stored)
print("ok", cleared[0][:2], cleared[0][2], stored)
"""

FULL_AT_OPEN_CHILD = r"""
import os, sys
import mqlog
from mqlog import errors

root, impl, phase = sys.argv[1], sys.argv[2], sys.argv[3]
path = os.path.join(root, "store")
settings = dict(implementation=impl, segment_size_bytes=1 << 20,
                message_size_bytes_max=1 << 16)
bodies = [b"%d" % index * 50 for index in range(2000)]
if phase == "write":  # flushed, then a crash: no clean close
    store = mqlog.open(path, **settings)
    for index, body in enumerate(bodies):
        store.put("t", body, key="k%d" % index)
    store.flush()
    os._exit(0)

""" + FILL_DISK + r"""
# Opening for writing needs room for the files it writes anew (the room recovery frees
# at the log's end may be enough once): it opens, or says DiskFull naming the way to
# read. Never a raw OSError.
fill("filler")
for attempt in range(1, 4):
    fill("topup%d" % attempt)
    try:
        mqlog.open(path, **settings).close()
    except errors.DiskFull as error:
        assert "read_only=True" in str(error), str(error)
        break
else:
    raise AssertionError("opened for writing on a full disk, three times")
print("DiskFull at attempt", attempt)
with mqlog.open(path, read_only=True, **settings) as store:
    got = [record.body for record in store.get("t", 0, 0, 4000, 1 << 24)]
    assert got == bodies, (len(got), len(bodies))
os.unlink(os.path.join(root, "filler"))
os.sync()
with mqlog.open(path, **settings) as store:  # room again: recovery, then writes
    store.put("t", b"after")
    got = [record.body for record in store.get("t", 0, 0, 4000, 1 << 24)]
    assert got == bodies + [b"after"], len(got)
print("ok")
"""

DESCRIPTOR_CHILD = r"""
import os, resource, sys, time
import mqlog
from mqlog import errors

path, impl, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
# No indexer: it would open files of its own while the last descriptors are taken.
store = mqlog.open(path, implementation=impl, checkpoint_interval_ms=1,
                   index_interval_ms=3_600_000)
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
queues = 0
try:
    for queue_id in range(limit * 4):
        store.put("t", b"x", queue_id=queue_id)
        queues += 1
    raise AssertionError("never ran out of descriptors")
except errors.TooManyOpenFiles as error:
    assert "ulimit" in str(error), str(error)
print("queues", queues)
assert queues > limit * 3 // 4, f"only {queues} queues under a limit of {limit}"
# The checkpoint catches up (the failed call gave its descriptor back) and then writes
# nothing until the log grows. Taken while a checkpoint held its file open, the last
# descriptors would leave it that one for good, and no checkpoint would ever fail.
deadline = time.monotonic() + 60
while store.checkpointed_position != store.written_position:
    assert time.monotonic() < deadline, f"no checkpoint caught up: {store.checkpoint_error!r}"
    time.sleep(0.001)
spare = []  # every free descriptor: nothing else in this process opens one now
try:
    while True:
        spare.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
store.put("t", b"y", queue_id=0)  # (a mapped queue file: no descriptor needed)
while store.checkpoint_error is None:  # the next checkpoint needs one
    assert time.monotonic() < deadline, f"no checkpoint ran: {store.checkpointed_position}"
    time.sleep(0.001)
assert isinstance(store.checkpoint_error, errors.TooManyOpenFiles), store.checkpoint_error
for fd in spare:
    os.close(fd)
for queue_id in range(1, queues):  # not fenced: the queues that exist take writes
    store.put("t", b"y", queue_id=queue_id)
store.flush()
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
store.put("t", b"z", queue_id=queues)  # and new ones, once the limit is raised
store.close()
with mqlog.open(path, implementation=impl) as store:
    assert store.get("t", 0, 0, 10) and len(store.queues()) == queues + 1
    assert [r.body for r in store.get("t", queues - 1, 0, 10)] == [b"x", b"y"]
print("ok")
"""


def _run_child(program: str, *arguments: str, timeout: float = 300) -> str:
    done = subprocess.run([sys.executable, "-c", program, *arguments], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        pytest.fail(f"the child died of {name}:\n{done.stdout}\n{done.stderr}")
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    return done.stdout


# --- small file systems ----------------------------------------------------------------


def _mount(arguments: list[str], mountpoint: Path) -> None:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small file system needs root and mount(8)")
    mountpoint.mkdir()
    done = subprocess.run(["mount", *arguments, str(mountpoint)], capture_output=True,
                          text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a small file system here: {done.stderr.strip()}")


@pytest.fixture(params=["tmpfs", "ext4"])
def small_fs(request: pytest.FixtureRequest, tmp_path: Path):
    """A file system of a few MiB: an 8 MiB tmpfs, or a 32 MiB ext4 image on a loop."""
    mountpoint = tmp_path / f"fs-{uuid.uuid4().hex[:8]}"
    if request.param == "tmpfs":
        _mount(["-t", "tmpfs", "-o", "size=8m", "tmpfs"], mountpoint)
        filler = 1 * MiB
    else:
        if shutil.which("mkfs.ext4") is None:
            pytest.skip("mkfs.ext4 is not installed")
        image = tmp_path / "ext4.img"
        with open(image, "wb") as file:
            file.truncate(32 * MiB)
        # 1 KiB blocks, as mkfs makes them on a small disk anyway: smaller than a page.
        made = subprocess.run(["mkfs.ext4", "-q", "-F", "-b", "1024", str(image)],
                              capture_output=True, text=True)
        if made.returncode:
            pytest.skip(f"mkfs.ext4 failed: {made.stderr.strip()}")
        _mount(["-o", "loop", str(image)], mountpoint)
        filler = 2 * MiB
    try:
        yield mountpoint, filler
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)


@pytest.mark.parametrize("resume", [False, True], ids=["full", "full-then-freed"])
@pytest.mark.parametrize("preallocate", [True, False])
def test_a_full_disk_is_a_typed_error_never_a_sigbus(small_fs, impl, preallocate, resume):
    """Finding 2: on a full disk the key index (written through its mapping by the
    maintenance thread) and, with segment_preallocate=False, the put path died of SIGBUS,
    and a new consume-queue file raised a raw OSError. Now every write is backed with
    blocks before it goes through a mapping: DiskFull, reads keep working, nothing acked
    is lost, and writes resume once space returns. A commit_offset on a full disk is
    DiskFull too (it was a raw OSError) and keeps the old offsets.

    Writes resuming failed ~4 runs in 10: blocks backed ahead in the background (the
    segment window, 1 MiB key-index steps) took the room given back, and close() then
    met ENOSPC on its files. Now nothing backs ahead of need into the last
    ``disk_headroom_bytes``, a failed step gives back what it took, and close() stops
    the backing thread first and leaves an index it cannot finish for the next open.

    "A commit on a full disk succeeded" once under load: a background checkpoint
    replaced its file while the disk was topped up and gave a block back. Checkpoints
    now write nothing while the log stands still, and the disk is topped up once the
    last one is written."""
    root, filler = small_fs
    # The window ahead is capped below the room given back: on a disk of a few MiB the
    # default (64 MiB) would take every freed byte for blocks ahead at once.
    settings = {"segment_preallocate": preallocate, "filler_bytes": filler, "resume": resume,
                "checkpoint_interval_ms": 5, "index_interval_ms": 1,
                "segment_prepare_ahead_bytes_max": filler // 4}
    out = _run_child(FULL_DISK_CHILD, str(root), impl, json.dumps(settings))
    assert out.startswith("ok"), out


def test_durable_batches_on_a_full_disk_are_typed_and_lose_nothing(small_fs, impl):
    """A sync-flush store writes its batches with pwrite into blocks backed ahead
    (tests/test_staged_batches.py): on a full disk a batch is refused with DiskFull
    before anything of it is written, never a SIGBUS; everything acknowledged reads back,
    and after a crash right there, nothing of the refused batch does."""
    root, _filler = small_fs
    out = _run_child(DURABLE_BATCHES_CHILD, str(root), impl)
    assert out.startswith("ok"), out


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_batches_crossing_a_consume_queue_file_on_a_full_disk_store_nothing(small_fs, impl,
                                                                            mode):
    """A batch whose entries cross the end of its queue's consume-queue file, the disk
    full: the next file was opened a record at a time, so the records before it were
    written and published, then the full disk refused the file: DiskFull, with part of
    the batch read back live and after a crash. put_batch now opens and backs every
    consume-queue file the batch's entries go in before it writes a record: DiskFull
    with nothing of it stored, before and after a crash; once there is room the batch
    is stored whole, by the store that refused it (its next file already open) and by
    one reopened. Both write paths: pwrite (sync) and the mapping (async)."""
    root, _filler = small_fs
    out = _run_child(CQ_CROSSING_CHILD, str(root), impl, mode)
    assert out.startswith("ok"), out


def test_raw_records_on_a_full_disk_are_typed_and_lose_nothing(small_fs, impl):
    """A follower writes a leader's records with pwrite past what is backed, no zeros
    ahead (tests/test_staged_batches.py): on a full disk append_raw is refused with
    DiskFull and what reached the file is given back, never a SIGBUS; a put through the
    mapping right after (the follower leads, its records ending inside a page) is
    DiskFull or stored whole; after a crash there, the log is what was acknowledged."""
    root, _filler = small_fs
    out = _run_child(RAW_RECORDS_CHILD, str(root), impl)
    assert out.startswith("ok"), out


@pytest.mark.parametrize("small_fs", ["ext4"], indirect=True)
def test_cutting_raw_records_on_a_full_disk_is_no_sigbus(small_fs, impl):
    """Raw records written with pwrite end inside a page; on ext4 with 1 KiB blocks the
    rest of that page was a hole, and a truncation (a Raft follower's cut), which zeroes
    the tail through the mapping, died of SIGBUS on a full disk (a helper's review).
    write_records now writes zeros to the end of the page with the records."""
    root, _filler = small_fs
    out = _run_child(RAW_TAIL_CUT_CHILD, str(root), impl)
    assert out.startswith("ok"), out


@pytest.mark.parametrize("small_fs", ["ext4"], indirect=True)
def test_a_page_cut_in_the_middle_is_held_before_entries_go_into_it(small_fs, impl):
    """A write fault backs the whole page it lands in. On ext4 with 1 KiB blocks (what
    mkfs makes on a small disk) a consume queue cut inside a page (recovery) or started
    after tombstones keeps blocks on one side of the cut only; the entries written next
    went into that page unbacked, and on a full disk the process died of SIGBUS (the
    twin once, in the full-disk test). Now the page is held (fallocate) before: DiskFull,
    and the store opens whole once there is room."""
    root, _filler = small_fs
    _run_child(CUT_PAGE_CHILD, str(root), impl, "write")
    out = _run_child(CUT_PAGE_CHILD, str(root), impl, "reopen")
    assert out.rstrip().endswith("ok"), out


@pytest.mark.parametrize("lives", ["one", "two"])
def test_recovery_zeroes_a_queue_tail_on_a_full_disk_over_the_blocks_it_has(small_fs, impl,
                                                                           lives):
    """Recovery zeroes a consume queue's entries past where it scans from (all of them
    with no checkpoint: one life; those past the checkpoint: two), keeping their blocks
    for the scan to write again (MappedFile.clear_from writes zeros over the ranges that
    hold blocks). On a disk filled before the open it takes no new block (the same data
    ranges, block count and free blocks after it), the store opens and reads every
    record, writes that need room say DiskFull, and nothing is lost once room returns.
    On tmpfs the open died of SIGBUS (one life): the search for the queue's end read
    holes through the mapping, and a tmpfs read fault allocates a page; it stops at the
    first hole now. Zeros over the whole tail (SEEK_DATA's ranges ignored) fail it with
    DiskFull, a punched hole instead with the blocks not kept."""
    root, _filler = small_fs
    _run_child(CLEAR_TAIL_CHILD, str(root), impl, "write", lives)
    out = _run_child(CLEAR_TAIL_CHILD, str(root), impl, "reopen", lives)
    assert out.startswith("ok"), out


def test_a_store_left_by_a_crash_on_a_disk_that_filled_opens_to_read(small_fs, impl):
    """A writer crashed, then the disk filled. Opening the store for writing raised a raw
    OSError (ENOSPC): its lock file was cut to 0 bytes, then the pid written into a block
    it no longer had. Now the pid is written over the old one; opening for writing still
    needs room for the files it writes anew (checkpoint, flushed position), so it is
    DiskFull saying to open read_only=True meanwhile — and that open reads every record,
    the tmpfs holes included (no SIGBUS). Once there is room, it opens and takes writes."""
    root, _filler = small_fs
    _run_child(FULL_AT_OPEN_CHILD, str(root), impl, "write")
    out = _run_child(FULL_AT_OPEN_CHILD, str(root), impl, "reopen")
    assert out.rstrip().endswith("ok"), out


def test_running_out_of_descriptors_is_typed_and_does_not_fence(tmp_path, impl):
    """Finding 11: every mapped file held two descriptors (at ulimit -n 1024, queue 506
    failed with a raw EMFILE) and the next checkpoint fenced the store. Now a mapped file
    holds one (mmap's own), EMFILE is TooManyOpenFiles, and a checkpoint that meets it
    waits for the next interval.

    It failed now and then under load ("no checkpoint ran"): the last descriptors were
    taken while the checkpoint thread held one (its temporary file), which it then gave
    back and reused for every later checkpoint. Now the checkpoint has caught up (and
    writes nothing while the log stands still) before they are taken, and a write
    follows; with a descriptor held by another thread at that moment the old order
    failed every time."""
    out = _run_child(DESCRIPTOR_CHILD, str(tmp_path / "store"), impl, "256")
    assert out.rstrip().endswith("ok"), out


# --- footprint -------------------------------------------------------------------------


def _disk_bytes(path: Path) -> dict[str, int]:
    return {str(item.relative_to(path)): item.stat().st_blocks * 512
            for item in path.rglob("*") if item.is_file()}


def test_a_new_store_costs_what_it_holds(tmp_path, impl):
    """Finding 14: the README's four-record store took 1.1 GB (a fallocated, populated
    1 GiB segment; a 138 MB index file; 6 MB per queue). DESIGN §4: a handful of records
    take at most 16 MiB on disk, with the default config."""
    path = tmp_path / "data"
    with mqlog.open(path, implementation=impl) as store:
        store.put("orders", b"...", key="order-17", tags="created",
                  properties={"region": "eu"})
        store.put_batch("orders", [b"a", b"b", b"c"], queue_id=1)
        assert store.query("orders", "order-17")
    with mqlog.open(path, implementation=impl, flush_mode="sync") as store:
        store.put("payments", b"...")
    used = _disk_bytes(path)
    assert sum(used.values()) <= 16 * MiB, used
    for name, size in used.items():
        if name.startswith("consumequeue"):  # sized by what it holds: a prefill step
            assert size <= mqlog.StoreConfig().consume_queue_prefill_bytes, (name, size)


def test_a_writer_is_backed_a_bounded_window_ahead(tmp_path, impl):
    """Segments are backed in steps ahead of the writer, never much further than
    segment_prepare_ahead_bytes_max: the blocks a segment holds follow what is written."""
    step, ahead = 1 * MiB, 4 * MiB
    with mqlog.open(tmp_path / "s", implementation=impl, segment_size_bytes=64 * MiB,
                    segment_allocate_step_bytes=step,
                    segment_prepare_ahead_bytes_max=ahead) as store:
        bodies = [b"b" * 1000] * 100
        while store.written_position < 12 * MiB:
            store.put_batch("t", bodies)
        written = store.written_position
        segment = store.paths.commitlog / "00000000000000000000"
        held = segment.stat().st_blocks * 512
        assert written <= held <= written + ahead + 2 * step, (written, held)


def test_nothing_is_backed_ahead_into_the_headroom(tmp_path, impl):
    """Blocks backed ahead of need (the segment window, the next segment, key-index
    steps) never take the last disk_headroom_bytes of the file system, so the room a
    full disk gives back goes to writes and close(). A headroom larger than any disk's
    free space: the writer backs only the pages it writes, the key index does not grow
    (DiskFull, naming the setting), and writes, reads and close go on: a query by key
    reads the topic's records instead."""
    path = tmp_path / "s"
    with mqlog.open(path, implementation=impl, segment_size_bytes=64 * MiB,
                    disk_headroom_bytes=1 << 60) as store:
        bodies = [b"b" * 1000] * 100
        while store.written_position < 4 * MiB:
            store.put_batch("t", bodies, key="k")
        written = store.written_position
        held = (store.paths.commitlog / "00000000000000000000").stat().st_blocks * 512
        assert written <= held <= written + 256 * 1024, (written, held)
        with store.key_index.lock, pytest.raises(errors.DiskFull,
                                                 match="disk_headroom_bytes"):
            store.key_index.catch_up()
        newest = store.get("t", 0, store.max_offset("t", 0) - 150, 150)
        assert [record.position for record in store.query("t", "k", max_count=150)] == \
            [record.position for record in reversed(newest)]
        assert store.key_index.file_count == 0
        assert len(store.get("t", 0, 0, 10)) == 10
    with mqlog.open(path, implementation=impl, segment_size_bytes=64 * MiB) as store:
        assert store.written_position == written
        assert store.query("t", "k")  # room enough again: the index is built


class _Refuse:
    """A prepare_segment that backs ``room`` bytes of each segment, then is full."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.calls: list[tuple[int, int]] = []

    def __call__(self, base: int, end: int) -> int:
        self.calls.append((base, end))
        if end - base > self.room:
            raise errors.DiskFull("full (test)")
        return base + self.room


@pytest.mark.parametrize("raw", [False, True])
def test_the_core_never_writes_past_what_the_engine_backed(impl, raw):
    """The log core's side of finding 2, on both cores alike: it asks prepare_segment
    before writing past the backed part of a segment (put and append_raw), and a refusal
    changes nothing: same error, same written position, every earlier record intact."""
    module = ext.load(impl)
    size, room = 1 << 16, 4096
    buffers: dict[int, bytearray] = {}
    refuse = _Refuse(room)

    def new_segment(base: int) -> None:
        buffers[base] = bytearray(size)
        core.attach_segment(base, buffers[base])

    def new_queue_file(topic: str, queue_id: int, base_offset: int) -> None:
        core.add_queue(topic, queue_id, base_offset, base_offset, 1024)
        core.attach_queue_file(topic, queue_id, base_offset, bytearray(1024 * 20))

    core = module.LogCore(segment_size_bytes=size, message_size_bytes_max=4096,
                          key_size_bytes_max=255, tags_size_bytes_max=255,
                          new_segment=new_segment, new_queue_file=new_queue_file,
                          prepare_segment=refuse)
    core.restore(0)
    stored = 0
    if raw:  # a leader's records, copied in one at a time by append_raw
        source, position = _leader_bytes(module, 60), 0
        with pytest.raises(errors.DiskFull):
            core.append_raw(0, source)  # all at once: a prefix of whole records is kept
        while position < core.written_position:
            position += int.from_bytes(source[position:position + 4], "little")
            stored += 1
        assert position == core.written_position
        with pytest.raises(errors.DiskFull):
            while True:
                record_size = int.from_bytes(source[position:position + 4], "little")
                core.append_raw(position, source[position:position + record_size])
                position += record_size
                stored += 1
    else:
        with pytest.raises(errors.DiskFull):
            for index in range(1000):
                core.put("t", bytes([index % 251]) * 100)
                stored += 1
    before = core.written_position
    assert 0 < before <= room - 8 and stored > 0
    assert bytes(buffers[0][before:]) == bytes(size - before)  # nothing past it
    assert [len(r.body) for r in core.get("t", 0, 0, 1000, 1 << 20)] == [100] * stored
    assert all(end - base <= size for base, end in refuse.calls)


def test_a_short_blank_is_the_same_error_in_both_cores(impl):
    """A blank that claims the segment's rest but is cut short (append_raw's plan lets it
    by; the copy cannot): IndexError in both cores, and the twin no longer asks the
    engine to back the rest first (on a full disk it said DiskFull, the C core
    IndexError: a helper's review)."""
    module = ext.load(impl)
    size = 1 << 16
    refuse = _Refuse(4096)

    def new_segment(base: int) -> None:  # (a mapping, as the engine's: a bytearray grows)
        core.attach_segment(base, mmap.mmap(-1, size))

    def new_queue_file(topic: str, queue_id: int, base_offset: int) -> None:
        core.add_queue(topic, queue_id, base_offset, base_offset, 1024)
        core.attach_queue_file(topic, queue_id, base_offset, bytearray(1024 * 20))

    core = module.LogCore(segment_size_bytes=size, message_size_bytes_max=4096,
                          key_size_bytes_max=255, tags_size_bytes_max=255,
                          new_segment=new_segment, new_queue_file=new_queue_file,
                          prepare_segment=refuse)
    core.restore(0)
    written = core.put("t", b"x" * 100).end_position
    blank = (size - written).to_bytes(4, "little") + fmt.BLANK_MAGIC.to_bytes(4, "little")
    calls = len(refuse.calls)
    with pytest.raises(IndexError):
        core.append_raw(written, blank)
    assert core.written_position == written and len(refuse.calls) == calls


def _leader_bytes(module, count: int) -> bytes:
    """The bytes of ``count`` records of a leader's log (unbounded room)."""
    buffers: dict[int, bytearray] = {}

    def new_segment(base: int) -> None:
        buffers[base] = bytearray(1 << 16)
        core.attach_segment(base, buffers[base])

    def new_queue_file(topic: str, queue_id: int, base_offset: int) -> None:
        core.add_queue(topic, queue_id, base_offset, base_offset, 1024)
        core.attach_queue_file(topic, queue_id, base_offset, bytearray(1024 * 20))

    core = module.LogCore(segment_size_bytes=1 << 16, message_size_bytes_max=4096,
                          key_size_bytes_max=255, tags_size_bytes_max=255,
                          new_segment=new_segment, new_queue_file=new_queue_file)
    core.restore(0)
    for index in range(count):
        core.put("t", bytes([index % 251]) * 100)
    return core.read_raw(0, 1 << 20)


def test_a_refused_write_whose_undoing_fails_is_not_found_by_a_recovery(tmp_path, impl,
                                                                        monkeypatch):
    """A sync store's batch that the disk filled part way (ENOSPC after some records went
    in) is refused, and its bytes zeroed. On a full ext4 that zeroing can fail too (a
    punched hole that splits an extent needs a block), and a recovery after a crash found
    the whole records the write had put there: a refused write, stored (seen once in a
    CI run: 12 records of a refused batch of 20). The first record's header is wiped
    first, in the block the write took already: a recovery stops there."""
    from mqlog.engine import files

    path = tmp_path / "s"
    store = mqlog.open(path, implementation=impl, flush_mode="sync")
    acked = [b"kept %d" % n * 20 for n in range(20)]
    store.put_batch("t", acked)

    def half_then_full(fd, data, offset):
        os.pwrite(fd, bytes(data)[:len(data) // 2], offset)
        raise OSError(28, "No space left on device (test)")

    def full(*_arguments):
        raise OSError(28, "No space left on device (test)")

    monkeypatch.setattr(files, "_pwrite_all", half_then_full)
    monkeypatch.setattr(files, "write_zeros", full)
    monkeypatch.setattr(files.libc, "punch_hole", full)
    with pytest.raises(errors.DiskFull):
        store.put_batch("t", [b"refused %d" % n * 20 for n in range(20)])
    monkeypatch.undo()
    store.abandon("a crash on the full disk")
    with mqlog.open(path, implementation=impl) as reopened:
        assert [r.body for r in reopened.get("t", 0, 0, 100)] == acked


def test_puts_go_on_when_the_background_thread_takes_no_more_work(tmp_path, impl,
                                                                  monkeypatch):
    """A put from a thread still running while the interpreter shuts down raised a raw
    RuntimeError ("cannot schedule new futures after interpreter shutdown"): its
    segment's backing ahead, or the next segment's making ahead, went to an executor that
    takes no new work. That work is only ahead of need: the writer backs what it needs
    itself."""
    import concurrent.futures.thread

    with mqlog.open(tmp_path / "s", implementation=impl, segment_size_bytes=1 * MiB,
                    message_size_bytes_max=64 * 1024) as store:
        # (what the interpreter's exit sets: every executor refuses new work)
        monkeypatch.setattr(concurrent.futures.thread, "_shutdown", True)
        bodies = [b"%06d" % n * 100 for n in range(4500)]  # (three segments of 1 MiB)
        for body in bodies:
            store.put("t", body)
        assert len(store.segments()) > 2
        assert [r.body for r in store.get("t", 0, 0, 5000, 16 * MiB)] == bodies
        monkeypatch.undo()  # (the close's own work runs as before)
