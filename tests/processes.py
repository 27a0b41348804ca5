"""Clusters of real `mqlog node` processes on 127.0.0.1, for the tests that SIGKILL,
SIGSTOP and partition them (test_controller_processes, test_controller_failover,
test_isr_processes): the two shapes Kafka runs, the controller requests those tests
make, and a store's bytes, to compare replicas. The controller requests serve the
in-process clusters too (tests/inprocess.py): one set for every cluster test.

Shapes. ``Processes(root, combined=True)`` is three processes b1..b3, each a broker and a
controller voter (Kafka's combined mode); ``combined=False`` is three controllers c1..c3
beside three brokers b1..b3. ``write_configs`` gives each its TOML (``config_text``:
subclasses add lines to the ``[controller]`` table, or route a broker's connections to a
peer elsewhere with ``peer_address``: a fault proxy). Processes start in the order the
seeded ``rng`` draws (``start_all``), so which one leads the controller quorum varies with
the seed, not with the machine.

Output. Each process's output is read on a thread for its whole life and its last
``OUTPUT_LINES`` lines are kept; ``tails()`` gives them. The fixtures print them when they
tear down: pytest shows that only for a test that failed, which is when it is wanted.

Controller requests go to the controllers' addresses in turn (one that is down, or not
the leader for a change, passes it on), each condition with a deadline (``DEADLINE_S``:
a loaded machine is slow, not wrong); none waits a fixed time."""

from __future__ import annotations

import contextlib
import random
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mqlog
from mqlog import errors
from mqlog.client import Client
from mqlog.replication.controller import records
from mqlog.replication.controller.records import PartitionInfo
from mqlog.replication.controller.state import ClusterMetadata
from mqlog.replication.local import STARTUP_TIMEOUT_S, NodeProcesses, free_ports, wait_until

BROKERS = ("b1", "b2", "b3")
SESSION_MS = 1_500  # broker_session_timeout_ms: short, so fencing is seen soon
DEADLINE_S = 60.0  # for any one condition
OUTPUT_LINES = 60  # of each process's output, kept for tails()
IMAGE_CHUNK_BYTES = 1 << 20  # store_image reads a log in pieces of this size


@dataclass
class Processes(NodeProcesses):
    """The cluster's `mqlog node` processes: b1..b3, each also a controller if
    ``combined``, else beside c1..c3 (controllers only)."""

    root: Path
    combined: bool = True
    rng: random.Random = field(default_factory=random.Random)  # the start order
    session_ms: int = SESSION_MS
    heartbeat_ms: int = 0  # 0: a fifth of session_ms
    ports: dict[str, int] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    output: dict[str, deque[str]] = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        return BROKERS if self.combined else ("c1", "c2", "c3", *BROKERS)

    @property
    def controllers(self) -> tuple[str, ...]:
        return self.names[:3]

    def roles(self, name: str) -> str:
        return "broker,controller" if self.combined else \
            "controller" if name.startswith("c") else "broker"

    def address(self, name: str) -> str:
        return f"127.0.0.1:{self.ports[name]}"

    def addresses(self, names: tuple[str, ...] | list[str] = BROKERS) -> list[str]:
        return [self.address(name) for name in names]

    def controller_addresses(self, without: str = "") -> list[str]:
        return self.addresses([name for name in self.controllers if name != without])

    def peer_address(self, name: str, other: str) -> str:
        """Where ``name`` reaches ``other`` (its [node.peers] entry)."""
        return self.address(other)

    def assign_ports(self) -> None:
        if not self.ports:
            self.ports = dict(zip(self.names, free_ports(len(self.names)), strict=True))

    def config_text(self, name: str) -> str:
        """``name``'s TOML; it ends inside the ``[controller]`` table."""
        peers = "\n".join(f'{other} = "{self.peer_address(name, other)}"'
                          for other in self.names if other != name)
        voters = ", ".join(f'{voter} = "{self.address(voter)}"' for voter in self.controllers)
        return (f'[node]\nid = "{name}"\nlisten = "{self.address(name)}"\n'
                f'data_dir = "{self.root / name}"\nprocess_roles = "{self.roles(name)}"\n'
                f"[node.peers]\n{peers}\n[controller]\nvoters = {{{voters}}}\n"
                f"broker_session_timeout_ms = {self.session_ms}\n"
                f"broker_heartbeat_interval_ms = {self.heartbeat_ms or self.session_ms // 5}\n")

    def write_configs(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.assign_ports()
        for name in self.names:
            (self.root / f"{name}.toml").write_text(self.config_text(name))

    def start(self, name: str) -> None:
        """Start ``name`` and wait for its "serving on" line; its output is kept."""
        process = subprocess.Popen([sys.executable, "-m", "mqlog.cli", "node", "--config",
                                    str(self.root / f"{name}.toml")],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = self.output.setdefault(name, deque(maxlen=OUTPUT_LINES))
        lines.append(f"--- started (pid {process.pid})")
        started = time.monotonic()
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.rstrip())
            if "serving on" in line:
                break
            if time.monotonic() - started > STARTUP_TIMEOUT_S:
                process.kill()
                raise TimeoutError(f"node {name} did not start")
        else:
            raise RuntimeError(f"node {name} exited with status {process.wait()}")
        threading.Thread(target=_keep, args=(process, lines), daemon=True).start()
        self.processes[name] = process

    def start_all(self) -> None:
        for name in self.rng.sample(self.names, len(self.names)):
            self.start(name)

    def kill_all(self) -> None:
        for name in list(self.processes):
            self.kill(name)

    def close(self) -> None:
        """Stop every process (a subclass stops what it added around them too)."""
        self.stop_all()

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.close()
        finally:
            print(self.tails())  # (pytest shows it only for a test that failed)

    def groups(self, name: str) -> dict[str, Any]:
        with Client(self.address(name), timeout_s=5) as client:
            return client.call({"kind": "broker_metadata"})[0]["groups"]

    def tails(self) -> str:
        """The last lines each process printed, oldest life first."""
        return "\n".join(f"=== {name}\n" + "\n".join(lines)
                         for name, lines in self.output.items())


def use_core(monkeypatch: Any, impl: str) -> None:
    """The log core of the processes started from now on (they inherit MQLOG_PUREPYTHON:
    set for ``impl`` "python", cleared otherwise); the test's end puts it back."""
    if impl == "python":
        monkeypatch.setenv("MQLOG_PUREPYTHON", "1")
    else:
        monkeypatch.delenv("MQLOG_PUREPYTHON", raising=False)


class Writer(threading.Thread):
    """A client writing on its own thread until told to ``finish``: a subclass's ``run``
    calls ``acknowledged(item)`` for each acknowledged write and adds each failure to
    ``failures``; ``wait_for_more`` waits for more acknowledgements (or the thread's
    end: an assertion error then, with its last failures)."""

    def __init__(self, label: str) -> None:
        super().__init__(name=f"writer-{label}", daemon=True)
        self.label = label
        self.acked: list[Any] = []
        self.failures: list[str] = []
        self.done = threading.Event()
        self.progress = threading.Condition()

    def acknowledged(self, item: Any) -> None:
        with self.progress:
            self.acked.append(item)
            self.progress.notify_all()

    def wait_for_more(self, count: int) -> None:
        with self.progress:
            target = len(self.acked) + count
            if not self.progress.wait_for(lambda: len(self.acked) >= target or
                                          not self.is_alive(), DEADLINE_S):
                raise TimeoutError(f"{self.name}: {count} more acks not within "
                                   f"{DEADLINE_S} s; failures: {self.failures[-3:]}")
        assert len(self.acked) >= target, f"{self.name} died: {self.failures[-3:]}"

    def finish(self) -> None:
        self.done.set()
        self.join(timeout=DEADLINE_S * 2)
        assert not self.is_alive()


@contextlib.contextmanager
def writing(writers: list[Writer], first_acks: int) -> Iterator[list[Writer]]:
    """The writers started, once each has ``first_acks`` acknowledged writes; each is
    finished when the block ends, however it ends."""
    for writer in writers:
        writer.start()
    try:
        for writer in writers:
            writer.wait_for_more(first_acks)
        yield writers
    finally:
        for writer in writers:
            writer.finish()


def _keep(process: subprocess.Popen, lines: deque[str]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line.rstrip())


def describe_cluster(addresses: list[str]) -> dict[str, Any] | None:
    """describe_cluster from the first controller that can answer it (None: none can)."""
    for address in addresses:
        try:
            with Client(address, timeout_s=5) as client:
                return client.call({"kind": "describe_cluster"})[0]
        except (errors.NodeUnavailable, errors.NotMaster):
            continue
    return None


def cluster_state(addresses: list[str]) -> ClusterMetadata:
    """The metadata as the first controller that answers has folded it."""
    answers: list[dict[str, Any]] = []

    def answered() -> bool:
        found = describe_cluster(addresses)
        if found is not None:
            answers.append(found)
        return found is not None
    wait_until(answered, "a controller describing the cluster", DEADLINE_S)
    return ClusterMetadata().apply(records.decode(answers[0]["snapshot"]),
                                   answers[0]["position"])


def controller_leader(addresses: list[str]) -> str | None:
    answer = describe_cluster(addresses)
    return answer.get("leader") if answer else None


def wait_controller_leader(addresses: list[str]) -> str:
    chief: list[str] = []

    def led() -> bool:
        found = controller_leader(addresses)
        if found:
            chief.append(found)
        return bool(found)
    wait_until(led, "a controller leader", DEADLINE_S)
    return chief[-1]


def wait_live_brokers(addresses: list[str], count: int = len(BROKERS)) -> None:
    """Until a controller's metadata shows ``count`` brokers registered and not fenced."""
    wait_until(lambda: len(cluster_state(addresses).live_brokers()) == count,
               f"{count} live brokers", DEADLINE_S)


def folded_partition(addresses: list[str], topic: str, index: int = 0) -> PartitionInfo:
    """The partition as a controller has it, once one has folded the topic (controllers
    fold at their own pace: one may not know it yet)."""
    found: list[PartitionInfo] = []

    def folded() -> bool:
        known = cluster_state(addresses).topics.get(topic)
        found[:] = [known.partitions[index]] if known is not None else []
        return bool(found)
    wait_until(folded, f"topic {topic}, folded", DEADLINE_S)
    return found[0]


def change_metadata(addresses: list[str], header: dict[str, Any]) -> dict[str, Any]:
    """A metadata change, sent on to the leader (waiting out an election); a read such as
    ``metadata_since`` goes the same way, answered by the first controller that can."""
    queue, answers = list(addresses), []

    def attempt() -> bool:
        address = queue.pop(0)
        queue.append(address)
        try:
            with Client(address, timeout_s=10) as client:
                answers.append(client.call(dict(header))[0])
                return True
        except errors.NotLeader as error:
            if error.leader_address:
                queue.insert(0, error.leader_address)
        except errors.NodeUnavailable:
            pass
        return False
    wait_until(attempt, f"the controller leader answering {header['kind']}", DEADLINE_S)
    return answers[0]


def store_image(path: Path, **options: Any) -> bytes:
    """The bytes of a stopped store's commit log, from its first segment to its end
    (``options``: mqlog.open's, such as the segment size it was written with)."""
    with mqlog.open(path, read_only=True, **options) as store:
        chunks, position = [], store.first_segment_base()
        while position < store.written_position:
            data = store.read_raw(position, IMAGE_CHUNK_BYTES)
            assert data, f"{path}: no whole record at {position}"
            chunks.append(data)
            position += len(data)
    return b"".join(chunks)
