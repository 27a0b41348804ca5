"""A local cluster with a controller quorum, as real `mqlog node` processes on 127.0.0.1
(the demo, benchmarks): three controllers ``c1``..``c3`` and three brokers
``b1``..``b3`` — the copy-paste cluster of docs/CLUSTER.md. It writes each process's
TOML, starts and stops the processes, asks the controllers, and waits for conditions
with deadlines (never for a fixed time)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mqlog import errors
from mqlog.client import Client
from mqlog.replication.controller import records
from mqlog.replication.controller.state import ClusterMetadata
from mqlog.replication.local import free_ports, wait_until

CONTROLLERS, BROKERS = ("c1", "c2", "c3"), ("b1", "b2", "b3")
STOP_TIMEOUT_S = 20.0  # for a process to exit after SIGTERM (then SIGKILL)
LIVE_TIMEOUT_S = 60.0  # for the brokers to register and be live
ASK_TIMEOUT_S = 5.0  # for one controller's answer (then the next is asked)


def write_configs(root: Path, session_ms: int, controller: str = "") -> dict[str, str]:
    """Every process's TOML in ``root``; ``controller``: more [controller] lines. Returns
    name -> address."""
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
    """SIGTERM every process still running, then wait for each (SIGKILL after a while)."""
    for process in processes.values():
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes.values():
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def started(root: Path, session_ms: int, controller: str = ""
            ) -> Iterator[tuple[dict[str, str], dict[str, subprocess.Popen]]]:
    """The six processes, their files in ``root``, with three live brokers: (name ->
    address, name -> process). Every process in that dict when the block ends is stopped
    (``stop_all``), however it ends."""
    root.mkdir(parents=True, exist_ok=True)
    addresses = write_configs(root, session_ms, controller)
    processes = {name: start(root, name) for name in CONTROLLERS + BROKERS}
    try:
        wait_live_brokers([addresses[name] for name in CONTROLLERS])
        yield addresses, processes
    finally:
        stop_all(processes)


def wait_live_brokers(controllers: list[str]) -> None:
    wait_until(lambda: (found := state(ask(controllers, {"kind": "describe_cluster"})))
               is not None and len(found.live_brokers()) == len(BROKERS),
               "three live brokers", LIVE_TIMEOUT_S)


def ask(addresses: list[str], header: dict[str, Any]) -> dict[str, Any] | None:
    """The first answer from the controllers, each asked at most once: a follower's
    NotLeader hint is asked next (the leader may be one not in ``addresses``); None if
    none answered."""
    waiting, asked = list(addresses), set()
    while waiting:
        address = waiting.pop(0)
        if address in asked:
            continue
        asked.add(address)
        try:
            with Client(address, timeout_s=ASK_TIMEOUT_S) as client:
                return client.call(dict(header))[0]
        except errors.NotLeader as error:
            if error.leader_address:  # (the leader: asked next)
                waiting.insert(0, error.leader_address)
        except (errors.NodeUnavailable, errors.RemoteError, errors.UnknownGroup):
            continue
    return None


def state(answer: dict[str, Any] | None) -> ClusterMetadata | None:
    """The folded metadata of a describe_cluster (or cluster_metadata) answer."""
    if answer is None:
        return None
    return ClusterMetadata().apply(records.decode(answer["snapshot"]), answer["position"])
