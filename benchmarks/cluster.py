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
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mqlog import errors
from mqlog.client import Client
from mqlog.replication.controller import records
from mqlog.replication.controller.state import ClusterMetadata
from mqlog.replication.local import free_ports, wait_until

CONTROLLERS, BROKERS = ("c1", "c2", "c3"), ("b1", "b2", "b3")


def write_configs(root: Path, session_ms: int, controller: str = "") -> dict[str, str]:
    """Every process's TOML in ``root``; ``controller``: more [controller] lines."""
    names = CONTROLLERS + BROKERS
    addresses = {name: f"127.0.0.1:{port}"
                 for name, port in zip(names, free_ports(len(names)), strict=True)}
    voters = ", ".join(f'{name} = "{addresses[name]}"' for name in CONTROLLERS)
    peers = "\n".join(f'{name} = "{address}"' for name, address in addresses.items())
    for name in names:
        role = "controller" if name in CONTROLLERS else "broker"
        (root / f"{name}.toml").write_text(
            f'[node]\nid = "{name}"\nlisten = "{addresses[name]}"\n'
            f'data_dir = "{root / "data" / name}"\nprocess_roles = "{role}"\n'
            f'[node.peers]\n{peers}\n[controller]\nvoters = {{{voters}}}\n'
            f"broker_session_timeout_ms = {session_ms}\n"
            f"broker_heartbeat_interval_ms = {max(1, session_ms // 5)}\n{controller}")
    return addresses


def start(root: Path, name: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mqlog.cli", "node", "--config",
                             str(root / f"{name}.toml")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def stop_all(processes: dict[str, subprocess.Popen]) -> None:
    """SIGTERM every process still running, then wait for each (SIGKILL after 20 s)."""
    for process in processes.values():
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes.values():
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def started(prefix: str, session_ms: int,
            controller: str = "") -> Iterator[tuple[Path, dict[str, str],
                                                    dict[str, subprocess.Popen]]]:
    """The six processes, in a new temporary directory named ``prefix``..., with three
    live brokers: (that directory, name -> address, name -> process). Every process in
    that dict when the block ends is stopped (``stop_all``), however it ends."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    addresses = write_configs(root, session_ms, controller)
    processes = {name: start(root, name) for name in CONTROLLERS + BROKERS}
    try:
        wait_live_brokers([addresses[name] for name in CONTROLLERS])
        yield root, addresses, processes
    finally:
        stop_all(processes)
        shutil.rmtree(root, ignore_errors=True)  # (a run writes gigabytes)


def wait_live_brokers(controllers: list[str]) -> None:
    wait_until(lambda: (found := state(ask(controllers, {"kind": "describe_cluster"})))
               is not None and len(found.live_brokers()) == len(BROKERS),
               "three live brokers", 60)


def ask(addresses: list[str], header: dict[str, Any]) -> dict[str, Any] | None:
    for address in addresses:
        try:
            with Client(address, timeout_s=5) as client:
                return client.call(dict(header))[0]
        except errors.NotLeader as error:
            if error.leader_address:
                addresses = [error.leader_address, *addresses]
        except (errors.NodeUnavailable, errors.RemoteError, errors.UnknownGroup):
            continue
    return None


def state(answer: dict[str, Any] | None) -> ClusterMetadata | None:
    if answer is None:
        return None
    return ClusterMetadata().apply(records.decode(answer["snapshot"]), answer["position"])


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
