"""Read-only opens: a snapshot beside a live writer, of a crashed store, and of a torn
tail — never a byte written, never a lock taken, every write refused."""

from __future__ import annotations

import hashlib
import os

import pytest

import mqlog
from mqlog import errors
from tests.conftest import SMALL


def _digest(root) -> dict[str, str]:
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(root.rglob("*")) if path.is_file()}


def _records(store, topic="t") -> list[tuple[int, int, bytes]]:
    found = []
    for name, queue_id in store.queues():
        if name == topic:
            offset = store.min_offset(topic, queue_id)
            while batch := store.get(topic, queue_id, offset, 1000, 1 << 24):
                found += [(r.queue_id, r.offset, r.body) for r in batch]
                offset = batch[-1].offset + 1
    return sorted(found)


def test_a_snapshot_beside_a_live_writer(tmp_path, impl, rng):
    writer = mqlog.open(tmp_path, implementation=impl, **SMALL)
    for index in range(2000):
        writer.put("t", rng.randbytes(rng.randrange(1, 200)), index % 3, key=f"k{index % 9}")
    expected = _records(writer)
    with mqlog.open(tmp_path, implementation=impl, read_only=True, **SMALL) as snapshot:
        for index in range(500):  # the writer goes on; the snapshot does not move
            writer.put("t", b"later", index % 3)
        assert _records(snapshot) == expected
        assert snapshot.query("t", "k4", max_count=999) == [
            record for record in writer.query("t", "k4", max_count=999)
            if record.position < snapshot.committed_position]
    writer.close()


def test_a_read_only_open_writes_nothing_and_refuses_writes(tmp_path, impl, rng):
    with mqlog.open(tmp_path, implementation=impl, **SMALL) as store:
        for index in range(800):
            store.put("t", rng.randbytes(100), index % 2, key="k")
        store.commit_offset("g", "t", 0, 3)
    before = _digest(tmp_path)
    with mqlog.open(tmp_path, implementation=impl, read_only=True, **SMALL) as snapshot:
        assert snapshot.recovery_report.clean
        assert snapshot.committed_offset("g", "t", 0) == 3
        refusals = [lambda: snapshot.put("t", b"x"), lambda: snapshot.put_batch("t", [b"x"]),
                    snapshot.flush, lambda: snapshot.commit_offset("g", "t", 0, 1),
                    snapshot.apply_retention, lambda: snapshot.truncate(0),
                    lambda: snapshot.set_epoch(9), lambda: snapshot.append_raw(0, b""),
                    lambda: snapshot.set_committed_position(0)]
        for refused in refusals:
            with pytest.raises(errors.StoreReadOnly):
                refused()
        with mqlog.open(tmp_path, implementation=impl, read_only=True, **SMALL) as second:
            assert _records(second) == _records(snapshot)  # no lock between readers
    assert _digest(tmp_path) == before


def test_a_snapshot_of_a_crashed_store_with_a_torn_tail(tmp_path, impl, rng):
    store = mqlog.open(tmp_path, implementation=impl, **SMALL)
    for index in range(1500):
        store.put("t", rng.randbytes(rng.randrange(1, 300)), index % 2)
    store.flush()
    written = store.written_position
    store.core.fence(errors.StoreClosed("simulated crash"))
    store._maintenance.stop()
    store._flusher.stop()
    store._release_files()
    os.close(store._lock_fd)
    segment = max((tmp_path / "commitlog").iterdir())
    with open(segment, "r+b") as file:  # half a record's worth of garbage past the end
        file.seek(written - int(segment.name))
        file.write(rng.randbytes(50))
    before = _digest(tmp_path)
    with mqlog.open(tmp_path, implementation=impl, read_only=True, **SMALL) as snapshot:
        assert not snapshot.recovery_report.clean
        assert snapshot.committed_position == written
        seen = _records(snapshot)
    assert _digest(tmp_path) == before
    with mqlog.open(tmp_path, implementation=impl, **SMALL) as recovered:
        assert _records(recovered) == seen and recovered.written_position == written


def test_a_read_only_open_of_nothing_says_so(tmp_path, impl):
    with pytest.raises(errors.StoreNotFound, match="not an mqlog store"):
        mqlog.open(tmp_path / "missing", implementation=impl, read_only=True)
    assert not (tmp_path / "missing").exists()
