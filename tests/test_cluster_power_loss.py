"""A SYNC_MASTER with async flush loses power: three real `mqlog node` processes.

Issue 13's last hole, end to end. The master runs `flush_mode = "async"` (the default)
with a flush interval far longer than the test, so it acknowledges writes once a slave
has them while its own disk has none of them. It is SIGKILLed; SIGKILL keeps the page
cache, so the test then does what a power loss would have done (as tests/test_crash.py
and the simulator's disk do): every commit-log byte past the master's checkpoint — the
last position its own disk is known to hold — is zeroed. Restarted, the master must
catch up from its slaves before it serves, in a new epoch: every acknowledged write is
then readable from the master, and after more writes the three logs are byte-identical.
"""

from __future__ import annotations

from pathlib import Path

import mqlog
from mqlog.engine import checkpoint as cp
from mqlog.replication.local import LocalCluster, wait_until
from tests.test_cluster import _image, _present, _produce

# Nothing flushes the master's log during the test but a clean close: no interval flush,
# no thorough flush, no checkpoint after the one each open writes.
STORE = ("segment_size_bytes = 16777216\nflush_interval_ms = 3600000\n"
         "flush_thorough_interval_ms = 3600000\ncheckpoint_interval_ms = 3600000")


def _lose_power_after_kill(store_path: Path) -> int:
    """Zero every commit-log byte past the checkpoint (what the page cache held and a
    power loss takes); returns the position kept."""
    checkpoint = cp.read_checkpoint(store_path / "checkpoint")
    assert checkpoint is not None
    kept = checkpoint.log_position
    for segment in sorted((store_path / "commitlog").iterdir()):
        base, size = int(segment.name), segment.stat().st_size
        start = max(kept, base)
        if start < base + size:
            with open(segment, "r+b") as file:
                file.seek(start - base)
                file.write(bytes(base + size - start))
    return kept


def test_a_sync_master_that_loses_power_catches_up_before_it_serves(tmp_path):
    cluster = LocalCluster(tmp_path, "SYNC_MASTER", store_settings=STORE)
    with cluster:
        master = cluster.address("m")
        wait_until(lambda: len(cluster.metadata("m")["slaves"]) == 2, "both slaves of m")
        acked = _produce(master, "durable", 30)
        cluster.stop_all()  # a clean close: the master's disk holds these 30 records
        for name in cluster.names:
            cluster.start(name)
        wait_until(lambda: cluster.metadata("m")["accepts_writes"], "m to serve again")
        wait_until(lambda: len(cluster.metadata("m")["slaves"]) == 2, "both slaves of m")
        lost = _produce(master, "acked-then-lost", 40)  # on the slaves, not on m's disk
        end = max(position for position, _ in lost)
        cluster.kill("m")
        kept = _lose_power_after_kill(tmp_path / "m")
        assert kept <= min(position for position, _ in lost) < end, "test set-up"
        cluster.start("m")
        wait_until(lambda: cluster.metadata("m")["accepts_writes"], "m to serve again")
        status = cluster.metadata("m")
        assert status["written"] > end, f"m serves without records it acknowledged: {status}"
        assert status["epoch"] == 3, status  # fresh 1, clean restart 2, power loss 3
        acked += lost
        with mqlog.Client(master, timeout_s=10) as client:  # readable from the master
            bodies = {record.body for queue_id in range(3) for record in client.fetch(
                "orders", queue_id, offset=0, max_count=1000)}
        assert {body for _, body in acked} <= bodies
        acked += _produce(master, "after", 30)
        cluster.wait_converged()
    for name in cluster.names:
        assert _present(tmp_path / name, acked) == {position for position, _ in acked}, name
    assert len({_image(tmp_path / name) for name in cluster.names}) == 1, "the logs differ"
