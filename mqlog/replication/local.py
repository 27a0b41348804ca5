"""A local replica group of real `mqlog node` processes on 127.0.0.1, for tests,
benchmarks and the demo: it writes each node's TOML, starts, kills and stops the
processes, and waits for conditions with deadlines (never for a fixed time)."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mqlog.client import Client
from mqlog.errors import MqlogError

STARTUP_TIMEOUT_S = 60.0


LISTEN_PORTS = range(20_000, 32_768)  # below Linux's ephemeral range (32768-60999)
FREE_PORT_DRAWS_MAX = 10_000  # ports tried before giving up (a machine out of ports)


def free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 now (used at once), drawn below the kernel's ephemeral
    range: a port the kernel handed out for a moment (bind to port 0) is handed out again
    as the source port of any process's next outgoing connection, and one took a node's
    port between this call and its bind on a busy machine (the node then exits: cannot
    listen). The draw is random (not seeded: which port is picked changes nothing but
    collisions between runs side by side); each port is checked by binding it."""
    draw = random.Random(int.from_bytes(os.urandom(8), "little"))
    ports: list[int] = []
    for _ in range(FREE_PORT_DRAWS_MAX):
        if len(ports) == count:
            return ports
        port = draw.choice(LISTEN_PORTS)
        if port in ports:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:  # taken: draw again
                continue
        ports.append(port)
    if len(ports) == count:
        return ports
    raise OSError(f"no {count} free ports found in {FREE_PORT_DRAWS_MAX} draws from "
                  f"{LISTEN_PORTS.start}..{LISTEN_PORTS.stop - 1} on 127.0.0.1")


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # polling a condition, with a deadline
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.01)


class NodeProcesses:
    """What every local group does with its `mqlog node` processes (``root`` holds each
    node's TOML, ``processes`` the running ones, ``address(name)`` where each listens)."""

    root: Path
    processes: dict[str, subprocess.Popen]

    def address(self, name: str) -> str:
        raise NotImplementedError

    def start(self, name: str) -> None:
        self.processes[name] = _start([sys.executable, "-m", "mqlog.cli", "node", "--config",
                                       str(self.root / f"{name}.toml")], f"node {name}")

    def kill(self, name: str) -> None:
        process = self.processes.pop(name)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)

    def pause(self, name: str) -> None:
        self.processes[name].send_signal(signal.SIGSTOP)

    def resume(self, name: str) -> None:
        self.processes[name].send_signal(signal.SIGCONT)

    def stop_all(self) -> None:
        for process in self.processes.values():
            process.send_signal(signal.SIGCONT)  # a paused node cannot act on SIGTERM
            process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes.clear()

    def metadata(self, name: str, timeout_s: float = 10) -> dict:
        with Client(self.address(name), timeout_s=timeout_s) as client:
            return client.metadata()


@dataclass
class LocalCluster(NodeProcesses):
    """A master ``m`` and slaves ``s1``..``sN`` (none: a master alone)."""

    root: Path
    role: str = "SYNC_MASTER"
    slave_count: int = 2
    in_sync_slaves_min: int = 1
    store_settings: str = "segment_size_bytes = 67108864"
    prefix: str = ""  # node names: <prefix>m, <prefix>s1, ... (several groups side by side)
    node_settings: str = ""  # more lines for every node's [node] table
    ports: dict[str, int] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [f"{self.prefix}m",
                *(f"{self.prefix}s{index}" for index in range(1, self.slave_count + 1))]

    @property
    def master(self) -> str:
        return f"{self.prefix}m"

    def address(self, name: str) -> str:
        return f"127.0.0.1:{self.ports[name]}"

    def write_configs(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.ports = dict(zip(self.names, free_ports(len(self.names)), strict=True))
        peers = "\n".join(f'{name} = "{self.address(name)}"' for name in self.names)
        slaves = ", ".join(f'"{name}"' for name in self.names[1:])
        for name in self.names:
            role = self.role if name == self.master else "SLAVE"
            links = f"slaves = [{slaves}]" if name == self.master else \
                f'master = "{self.master}"'
            minimum = min(self.in_sync_slaves_min, max(1, self.slave_count))
            (self.root / f"{name}.toml").write_text(
                f'[node]\nid = "{name}"\nlisten = "{self.address(name)}"\n'
                f'data_dir = "{self.root / name}"\nrole = "{role}"\n{links}\n'
                f"in_sync_slaves_min = {minimum}\nslave_timeout_ticks = 50\n"
                f"{self.node_settings}\n"
                f"[node.peers]\n{peers}\n[store]\n{self.store_settings}\n")

    def start_all(self) -> None:
        self.write_configs()
        for name in self.names:
            self.start(name)

    def wait_converged(self, timeout_s: float = 60.0) -> None:
        wait_until(lambda: len({self.metadata(name)["written"] for name in self.names}) == 1,
                   "the replicas to converge", timeout_s)

    def __enter__(self) -> LocalCluster:
        self.start_all()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop_all()


@dataclass
class LocalRaftCluster(NodeProcesses):
    """A Raft group of ``size`` voters ``n1``..``nN`` as `mqlog node` processes.

    ``links`` may route a node's connections to a peer elsewhere (a fault-injecting proxy):
    {(from, to): "host:port"}; call ``assign_ports()`` first to learn the real addresses.
    """

    root: Path
    size: int = 3
    store_settings: str = "segment_size_bytes = 67108864\nflush_mode = \"sync\""
    node_settings: str = "election_timeout_ticks = 30\nheartbeat_ticks = 5"
    links: dict[tuple[str, str], str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [f"n{index}" for index in range(1, self.size + 1)]

    def address(self, name: str) -> str:
        return f"127.0.0.1:{self.ports[name]}"

    @property
    def addresses(self) -> list[str]:
        return [self.address(name) for name in self.names]

    def assign_ports(self) -> None:
        if not self.ports:
            self.ports = dict(zip(self.names, free_ports(len(self.names)), strict=True))

    def write_configs(self) -> None:
        self.assign_ports()
        for name in self.names:
            self.write_config(name, self.names, [])

    def write_config(self, name: str, voters: list[str], learners: list[str]) -> None:
        """``name``'s TOML: its group starts as ``voters`` and ``learners``."""
        self.root.mkdir(parents=True, exist_ok=True)
        peers = "\n".join(f'{other} = "{self.links.get((name, other), self.address(other))}"'
                          for other in voters + learners if other != name)
        (self.root / f"{name}.toml").write_text(
            f'[node]\nid = "{name}"\nlisten = "{self.address(name)}"\n'
            f'data_dir = "{self.root / name}"\nlayer = "raft"\nvoters = {_toml_list(voters)}\n'
            f"learners = {_toml_list(learners)}\n{self.node_settings}\n[node.peers]\n{peers}\n"
            f"[store]\n{self.store_settings}\n")

    def add_learner_process(self, name: str) -> None:
        """Start node ``name`` knowing the group as it began, itself a learner; the
        leader must still add it (``Client.change_membership``)."""
        self.ports[name] = free_ports(1)[0]
        self.write_config(name, self.names, [name])
        self.start(name)

    def start_all(self) -> None:
        self.write_configs()
        for name in self.names:
            self.start(name)


    def leader(self, among: list[str] | None = None) -> str | None:
        """The node that leads the newest term among those that answer, if any."""
        found: tuple[int, str] | None = None
        for name in among or list(self.processes):
            try:
                facts = self.metadata(name, timeout_s=2)
            except (OSError, MqlogError):
                continue
            if facts["role"] == "LEADER" and (found is None or facts["term"] > found[0]):
                found = (facts["term"], name)
        return found[1] if found else None

    def wait_leader(self, among: list[str] | None = None, timeout_s: float = 60.0) -> str:
        wait_until(lambda: self.leader(among) is not None, "a leader", timeout_s)
        leader = self.leader(among)
        assert leader is not None
        return leader

    def wait_converged(self, timeout_s: float = 60.0) -> None:
        """Every running node holds the same log and has committed all of it."""
        def converged() -> bool:
            facts = [self.metadata(name) for name in self.processes]
            return len({(f["written"], f["commit"]) for f in facts}) == 1 and \
                facts[0]["commit"] == facts[0]["written"]
        wait_until(converged, "the replicas to converge", timeout_s)

    def __enter__(self) -> LocalRaftCluster:
        self.start_all()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop_all()


def _toml_list(names: list[str]) -> str:
    return "[" + ", ".join(f'"{name}"' for name in names) + "]"


def _drain(process: subprocess.Popen) -> None:
    assert process.stdout is not None
    for _line in process.stdout:
        pass


@dataclass
class LocalRegistry:
    """A route registry process (``mqlog registry``) on 127.0.0.1."""

    node_timeout_ms: int = 1_000
    port: int = 0
    process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> LocalRegistry:
        self.port = free_ports(1)[0]
        self.process = _start([sys.executable, "-m", "mqlog.cli", "registry", "--listen",
                               self.address, "--node-timeout-ms", str(self.node_timeout_ms)],
                              "registry")
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)


def _start(command: list[str], name: str) -> subprocess.Popen:
    """Start a process and wait for its "serving on" line."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    started = time.monotonic()
    assert process.stdout is not None
    for line in process.stdout:
        if "serving on" in line:
            break
        if time.monotonic() - started > STARTUP_TIMEOUT_S:
            raise TimeoutError(f"{name} did not start")
    else:
        raise RuntimeError(f"{name} exited with status {process.wait()}")
    threading.Thread(target=_drain, args=(process,), daemon=True).start()
    return process
