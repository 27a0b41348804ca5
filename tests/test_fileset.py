"""engine/fileset.py: the store's mapped files, and the only door to them.

The helper modules (recovery, snapshot, retention, queries, maintenance) take the file
set, or less, never the Store; nothing outside the store touches its core or its
private attributes (pebble's commitEnv). The first test greps the code for it.
"""

from __future__ import annotations

import mmap
import re
from pathlib import Path

import pytest

import mqlog
from mqlog.engine.files import file_name
from mqlog.ext import libc
from mqlog.replication.local import wait_until
from tests.conftest import SMALL

ROOT = Path(__file__).resolve().parent.parent
OWNERS = {Path("mqlog/engine/store.py"), Path("mqlog/engine/fileset.py")}
REACHING_IN = re.compile(r"\bstore\.(core\b|_[a-z]\w*)")
HELPERS = ("recovery", "snapshot", "retention", "queries", "maintenance")


# Tests that still reach in, and why: the flush service's fault injection (a stalled or
# failing sync under the group commit's waiters, and a deadline changed part way) has no
# public hook, and the putfast work is rewriting that path.
_FLUSHER = re.compile(r"\bstore\._flusher\b")
ALLOWED_IN_TESTS = {Path("tests/test_store.py"): _FLUSHER,
                    Path("tests/test_group_commit.py"): _FLUSHER}


def test_nothing_outside_the_store_touches_its_core_or_files():
    """Issue 14: recovery, snapshot, retention and the CLI reached into
    ``store._segments`` and ``store.core``; a change to the store's bookkeeping had to
    be made in six modules. Now only store.py and fileset.py may; tests use the public
    API too (Store.abandon, segments(), closed...), but for ALLOWED_IN_TESTS."""
    found = []
    paths = [*ROOT.glob("mqlog/**/*.py"), *ROOT.glob("benchmarks/*.py"),
             *ROOT.glob("tests/*.py")]
    for path in sorted(paths):
        relative = path.relative_to(ROOT)
        if relative in OWNERS or relative == Path("tests/test_fileset.py"):
            continue
        allowed = ALLOWED_IN_TESTS.get(relative)
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if REACHING_IN.search(line) and not (allowed and allowed.search(line)):
                found.append(f"{relative}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_helpers_never_see_the_store():
    """The helper modules import no Store (only the file set and what they need)."""
    for name in HELPERS:
        text = (ROOT / "mqlog" / "engine" / f"{name}.py").read_text()
        assert "engine.store import" not in text, name


def test_the_file_set_tracks_segments_and_queues(tmp_path, impl):
    """Segments and queue files come and go with the core's view of them: rolls,
    retention, truncation, reset, and a read-only snapshot."""
    settings = dict(SMALL, retention_bytes=3 * SMALL["segment_size_bytes"])
    with mqlog.open(tmp_path / "s", implementation=impl, **settings) as store:
        files = store.files
        for number in range(400):
            store.put(f"t{number % 2}", bytes(900), number % 3)
        assert [base for base, _ in store.segments()] == files.segment_bases()
        assert len(files.segment_bases()) > 4
        store.flush()
        store.apply_retention()
        assert files.first_segment_base() == store.first_segment_base() > 0
        assert sorted(p.name for p in (tmp_path / "s" / "commitlog").iterdir()
                      if not p.name.endswith(".tmp")) >= \
            [f"{base:020d}" for base in files.segment_bases()]
        middle = store.get("t0", 0, store.max_offset("t0", 0) - 5, 1)[0].position
        store.truncate(middle)
        assert files.files_end() >= store.written_position == middle
        assert all(base < middle for base in files.segment_bases()[:-1])
        store.reset(1 << 24, [(store.epoch, 0)])
        assert files.segment_bases() == [1 << 24] and store.queues() == []
        store.put("t0", b"after the reset")
    with mqlog.open(tmp_path / "s", implementation=impl, read_only=True, **settings) as snap:
        assert snap.files.segment_bases() == [1 << 24]
        assert [r.body for r in snap.get("t0", 0, 0, 5)] == [b"after the reset"]


@pytest.mark.parametrize("window", [1 << 20, 0])
def test_log_pages_behind_the_window_leave_memory(tmp_path, impl, window):
    """StoreConfig.page_cache_window_bytes: after a checkpoint, the log's pages more than
    the window behind it are out of the page cache (mincore on a mapping of our own), and
    every record still reads back (from the disk). window=0 keeps them: the control that
    shows the residency check can fail."""
    body = bytes(range(256)) * 4
    with mqlog.open(tmp_path / "s", implementation=impl, segment_size_bytes=8 << 20,
                    checkpoint_interval_ms=20, page_cache_window_bytes=window) as store:
        for _ in range(5):
            store.put_batch("t", [body] * 1000)
        end = store.written_position
        wait_until(lambda: store.checkpointed_position >= end, "a checkpoint at the end", 30)
        (base, _size), = store.segments()
        below = 3 << 20  # at least what the window drops: end - 1 MiB, in whole MiB
        assert end - (1 << 20) >= below
        resident = _resident_pages(tmp_path / "s" / "commitlog" / file_name(base), below)
        if window:
            assert resident == 0, f"{resident} pages below {below} still cached"
        else:
            assert resident == below // mmap.PAGESIZE
        records = store.get("t", 0, 0, 5000, 64 << 20)
        assert [r.offset for r in records] == list(range(5000))
        assert all(r.body == body for r in records)


def _resident_pages(path: Path, length: int) -> int:
    """How many of the file's first ``length`` bytes' pages are in the page cache."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), length,
                                             access=mmap.ACCESS_READ) as mapped:
        mapping = libc.Mapping(mapped)
        try:
            return mapping.resident_pages()
        finally:
            mapping.release()
