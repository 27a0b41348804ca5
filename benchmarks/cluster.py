"""Metadata convergence after a broker is SIGKILLed, on a real cluster (issue 16).

Three controllers and three brokers, six `mqlog node` processes on 127.0.0.1 (the
copy-paste cluster of docs/CLUSTER.md), a topic of 6 partitions x RF 3 as Raft groups.
Each round SIGKILLs one broker and measures, from the kill:

* ``writable``: until every partition took a write again (its Raft group elected a
  leader among the two brokers left: no controller involved);
* ``fenced``: until the controller leader's metadata shows the broker fenced (the session
  timeout, ``broker_session_timeout_ms``, plus a heartbeat and a commit);
* ``converged``: until every live broker's pulled metadata (``cluster_metadata``) shows it
  fenced too;

then restarts the broker and waits for it to be live again. The session timeout is the
baseline of the same run: ``fenced`` / timeout says what the controller adds to it.

    python -m benchmarks.cluster [--rounds 3] [--session-ms 1500]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from mqlog import errors
from mqlog.client import Client
from mqlog.replication import local_controller
from mqlog.replication.local import wait_until
from mqlog.replication.local_controller import BROKERS, CONTROLLERS, ask, start, state


@contextlib.contextmanager
def started(prefix: str, session_ms: int,
            controller: str = "") -> Iterator[tuple[Path, dict[str, str],
                                                    dict[str, subprocess.Popen]]]:
    """local_controller.started in a new temporary directory named ``prefix``...:
    (that directory, name -> address, name -> process); the directory is removed at the
    end (a run writes gigabytes)."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        with local_controller.started(root, session_ms, controller) as (addresses, processes):
            yield root, addresses, processes
    finally:
        shutil.rmtree(root, ignore_errors=True)


def fenced_at(addresses: list[str], broker: str, kind: str) -> bool:
    found = state(ask(addresses, {"kind": kind}))
    return found is not None and broker in found.brokers and found.brokers[broker].fenced


def writable(addresses: list[str], partition: int) -> bool:
    for address in addresses:
        try:
            with Client(address, timeout_s=5) as client:
                client.produce("orders", b"x", partition)
                return True
        except (errors.MqlogError, OSError):
            continue
    return False


def run(rounds: int, session_ms: int) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {"writable": [], "fenced": [], "converged": []}
    with started("mqlog-bench-cluster-", session_ms) as (root, addresses, processes):
        controllers = [addresses[name] for name in CONTROLLERS]
        ask(controllers, {"kind": "create_topic", "name": "orders", "partitions": 6,
                          "replication_factor": 3, "layer": "raft"})
        everyone = [addresses[name] for name in BROKERS]
        wait_until(lambda: all(writable(everyone, p) for p in range(6)), "6 partitions", 60)
        for index in range(rounds):
            victim = BROKERS[index % 3]
            alive = [addresses[name] for name in BROKERS if name != victim]
            processes[victim].send_signal(signal.SIGKILL)
            processes[victim].wait()
            killed = time.perf_counter()
            pending = {"writable", "fenced", "converged"}
            while pending and time.perf_counter() - killed < 60:
                now = time.perf_counter() - killed
                if "writable" in pending and all(writable(alive, p) for p in range(6)):
                    figures["writable"].append(now)
                    pending.discard("writable")
                if "fenced" in pending and fenced_at(controllers, victim, "describe_cluster"):
                    figures["fenced"].append(now)
                    pending.discard("fenced")
                if "converged" in pending and all(
                        fenced_at([address], victim, "cluster_metadata") for address in alive):
                    figures["converged"].append(now)
                    pending.discard("converged")
            processes[victim] = start(root, victim)
            wait_until(lambda v=victim: not fenced_at(controllers, v, "describe_cluster"),
                       f"{victim} live again", 60)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--session-ms", type=int, default=1500)
    args = parser.parse_args()
    figures = run(args.rounds, args.session_ms)
    print(f"broker SIGKILLed, 3 controllers + 3 brokers, 6 partitions x RF 3 (Raft), "
          f"broker_session_timeout_ms={args.session_ms}, {args.rounds} rounds, pid {os.getpid()}")
    for name, values in figures.items():
        if values:
            print(f"  {name:10s} median {statistics.median(values) * 1000:7.0f} ms "
                  f"(min {min(values) * 1000:.0f}, max {max(values) * 1000:.0f}); "
                  f"{statistics.median(values) * 1000 / args.session_ms:.2f}x the session "
                  "timeout")
        else:
            print(f"  {name:10s} never within 60 s")


if __name__ == "__main__":
    main()
