"""The benchmark harness runs end to end on tiny sizes, so it cannot rot unnoticed."""

from __future__ import annotations

import pytest

from benchmarks import compare

pytest.importorskip("lmdb", reason="the bench extra (lmdb) is not installed")


def test_compare_quick_prints_every_row(tmp_path, monkeypatch):
    monkeypatch.setenv("MQLOG_BENCH_DIR", str(tmp_path))
    table = compare.main(["--quick"])
    for row in compare._rows().values():
        assert f"| {row.name} |" in table
    assert "records per fsync" in table and "recovery scan:" in table
    assert list(tmp_path.iterdir()) == []  # it cleans up after itself
