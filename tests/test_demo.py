"""`make demo` is the README's first promise: the demo runs end to end (embedded store,
crash, master-slave, Raft and ISR processes, Spark) on a small record count, in a child
process as `make demo` runs it. It failed once unnoticed when a step's side effect moved
(the Spark format registered by reconcile): this test is what notices."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_the_demo_runs_end_to_end(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mqlog.demo", "--records", "20000", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600, env=dict(os.environ, COLUMNS="120"))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "no acknowledged record lost" in done.stdout, done.stdout[-4000:]
    assert "0 differences" in done.stdout, done.stdout[-4000:]
    assert "9/9 ISR: controllers and brokers" in done.stdout, done.stdout[-4000:]  # each step
    # announced (each step asserts its own figures: nothing acknowledged missing or twice)
    # readable: Spark's progress bars and start-up warnings go to its log file, not here
    for noise in ("[Stage ", "WARN ", "log4j"):
        assert noise not in done.stdout + done.stderr, (noise, done.stdout[-4000:],
                                                        done.stderr[-4000:])
