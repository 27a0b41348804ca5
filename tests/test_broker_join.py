"""A broker that can never join its cluster stops (status 1, one error line) instead of
staying up for ever: a new user's review.

* Controllers of another cluster_id: the registration is refused InconsistentClusterId
  (Kafka's InconsistentClusterIdException), and the broker stops at once, naming both ids.
* A second process on a running broker's data_dir (its config copied, another port): the
  data_dir's lock (``broker.lock``, held for the process's life) refuses it before it
  opens or looks at a store. It used to open the live broker's stores beside it, report
  them "not closed cleanly", and then ask to register for ever.
* A second process with a running broker's id and its own data_dir: refused
  DuplicateBrokerRegistration, it asks again until no restart's old session could still
  hold the id (DUPLICATE_WAIT_SESSIONS sessions: a broker restarted at a new address is
  taken once its last life's session ends, and must not stop before), then stops.

Real ``mqlog node`` processes on 127.0.0.1 (one controller, one broker) for what a user
sees; the agent's rule on a virtual clock (tests/test_controller_host.py's ClockIo); the
lock in-process (several brokers of one process, a restart, a forked child)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import signal
import socket
import subprocess
import threading
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mqlog import errors
from mqlog.client import Client
from mqlog.config import BrokerConfig
from mqlog.replication.broker import Broker
from mqlog.replication.controller import host
from mqlog.replication.local import free_ports, wait_until
from tests import inprocess
from tests.processes import DEADLINE_S, change_metadata, cluster_state
from tests.test_cli_node import MQLOG, one_error_line, run_to_end
from tests.test_controller_host import ClockIo, _config
from tests.test_controller_sim import Host

SESSION_MS, HEARTBEAT_MS = 1_500, 300  # short, so a duplicate's wait is seconds
CLUSTER = "demo"


# --- real processes: one controller, one broker --------------------------------------------


def _config_text(root: Path, name: str, ports: dict[str, int], roles: str,
                 cluster_id: str = CLUSTER, listen_port: int = 0,
                 data_dir: Path | None = None) -> str:
    peers = "\n".join(f'{other} = "127.0.0.1:{port}"' for other, port in ports.items()
                      if other != name)
    return f"""[node]
id = "{name}"
listen = "127.0.0.1:{listen_port or ports[name]}"
data_dir = "{data_dir or root / name}"
process_roles = "{roles}"
cluster_id = "{cluster_id}"

[node.peers]
{peers}

[controller]
voters = {{c1 = "127.0.0.1:{ports['c1']}"}}
broker_session_timeout_ms = {SESSION_MS}
broker_heartbeat_interval_ms = {HEARTBEAT_MS}
"""


class NodeProcess:
    """A running `mqlog node` (started once it printed "serving on"), its output kept."""

    def __init__(self, config: Path) -> None:
        self.process = subprocess.Popen([MQLOG, "node", "--config", str(config)],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True)
        self.lines: deque[str] = deque(maxlen=200)
        self.serving = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self.serving.wait(DEADLINE_S):
            self.kill()
            pytest.fail(f"{config.name} did not start: {list(self.lines)}")

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip())
            if "serving on" in line:
                self.serving.set()
        self.serving.set()  # (it ended: the waiter looks)

    def stop(self) -> int:
        """SIGTERM, and its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"did not stop within {DEADLINE_S} s of SIGTERM")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


@dataclasses.dataclass
class Cluster:
    root: Path
    ports: dict[str, int]
    nodes: dict[str, NodeProcess]

    @property
    def controllers(self) -> list[str]:
        return [f"127.0.0.1:{self.ports['c1']}"]

    def config(self, name: str, text: str) -> Path:
        path = self.root / f"{name}.toml"
        path.write_text(text)
        return path


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Controller c1 and broker b1 (cluster "demo"), b1 registered and live; every
    process stopped at the end (and its last lines printed, shown if the test failed)."""
    ports = dict(zip(("c1", "b1"), free_ports(2), strict=True))
    found = Cluster(tmp_path, ports, {})
    try:
        for name, roles in (("c1", "controller"), ("b1", "broker")):
            config = found.config(name, _config_text(tmp_path, name, ports, roles))
            found.nodes[name] = NodeProcess(config)
        wait_until(lambda: "b1" in cluster_state(found.controllers).live_brokers(),
                   "b1 registered and live", DEADLINE_S)
        yield found
    finally:
        for name, node in found.nodes.items():
            node.kill()
            print(f"=== {name}\n" + "\n".join(node.lines))


def _still_registered(cluster: Cluster, epoch: int) -> None:
    """b1 live in the broker epoch it had (a heartbeat late on a loaded machine may
    fence it a moment: it registers again as the same life, in the same epoch)."""
    def live() -> bool:
        state = cluster_state(cluster.controllers)
        return state.brokers["b1"].broker_epoch == epoch and "b1" in state.live_brokers()
    wait_until(live, f"b1 live in epoch {epoch}", DEADLINE_S)


def test_a_broker_of_another_cluster_exits_1_naming_both_ids(cluster: Cluster) -> None:
    """b2's config is b1's copied with cluster_id = "other": it used to print "serving
    on" and then the same refusal every heartbeat interval until killed. Now its first
    registration's refusal stops it: one error line naming both cluster ids and what to
    do, status 1, its stores closed."""
    port = free_ports(1)[0]
    text = _config_text(cluster.root, "b2", {**cluster.ports, "b2": port}, "broker",
                        cluster_id="other")
    result = run_to_end("node", "--config", cluster.config("b2", text))
    line = one_error_line(result)
    assert "cluster_id 'other'" in line and f"of {CLUSTER!r}" in line, line
    assert "[controller] voters" in line and "cluster_id of this one" in line, line
    assert f"127.0.0.1:{cluster.ports['c1']}" in line, line  # (which controller said so)
    assert result.stdout.count("is of cluster_id 'other'") == 1, result.stdout  # (once)
    assert host.unclean_stores(cluster.root / "b2") == []
    assert set(cluster_state(cluster.controllers).brokers) == {"b1"}


def test_a_second_broker_on_a_live_brokers_data_dir_exits_at_once(cluster: Cluster) -> None:
    """b1's config copied with another port (same id, same data_dir), while b1 runs and
    hosts a partition: the copy exits 1 at once, naming b1's pid, before it listens or
    looks at a store — it used to report b1's open stores as "not closed cleanly" and ask
    to register for ever. b1 is unharmed: still registered in the same epoch, and its
    stores close cleanly when it stops (no abort marker: its next start is clean)."""
    b1 = cluster.nodes["b1"]
    change_metadata(cluster.controllers, {"kind": "create_topic", "name": "t",
                                          "partitions": 1, "replication_factor": 1,
                                          "layer": "isr"})
    data_dir = cluster.root / "b1"

    def hosted() -> bool:
        with Client(f"127.0.0.1:{cluster.ports['b1']}", timeout_s=5) as client:
            return "t-0" in client.call({"kind": "broker_metadata"})[0]["groups"]
    wait_until(hosted, "b1 hosting t-0", DEADLINE_S)
    assert host.unclean_stores(data_dir) == ["t-0"]  # (open: what the copy used to see)
    epoch = cluster_state(cluster.controllers).brokers["b1"].broker_epoch

    text = _config_text(cluster.root, "b1", cluster.ports, "broker",
                        listen_port=free_ports(1)[0])
    result = run_to_end("node", "--config", cluster.config("b1-copy", text))
    line = one_error_line(result)
    assert f"data_dir {data_dir} is in use by another process (pid " \
        f"{b1.process.pid}: broker b1, listening on 127.0.0.1:{cluster.ports['b1']})" \
        in line, line
    assert "serving on" not in result.stdout and "not closed cleanly" not in result.stdout

    assert b1.process.poll() is None
    _still_registered(cluster, epoch)
    assert b1.stop() == 0
    assert host.unclean_stores(data_dir) == []  # closed cleanly: not marked unclean
    _lock(data_dir).release()  # (and let go with the process)


def test_a_second_process_with_a_live_brokers_id_exits_once_no_restart_could_be_it(
        cluster: Cluster) -> None:
    """b1's id on another port with its own data_dir, while b1 heartbeats: refused
    DuplicateBrokerRegistration, it asks again (said at the 1st, 2nd, 4th... refusal)
    until DUPLICATE_WAIT_SESSIONS sessions have passed — a broker restarted at a new
    address is taken once its old session ends, sooner — then exits 1 with one line. b1
    keeps its registration."""
    epoch = cluster_state(cluster.controllers).brokers["b1"].broker_epoch
    text = _config_text(cluster.root, "b1", cluster.ports, "broker",
                        listen_port=free_ports(1)[0], data_dir=cluster.root / "b1-elsewhere")
    result = run_to_end("node", "--config", cluster.config("b1-elsewhere", text))
    line = one_error_line(result)
    most = -(-host.DUPLICATE_WAIT_SESSIONS * SESSION_MS // HEARTBEAT_MS) + 1
    assert f"broker b1 cannot join its cluster: its registration was refused {most} " \
        "times" in line, line
    assert f"registered by another live process, at 127.0.0.1:{cluster.ports['b1']}" in line
    said = [text for text in result.stdout.splitlines() if "another live process" in text]
    assert [text.split("(refused ")[1].split(" ")[0] for text in said[:-1]] == \
        [str(1 << power) for power in range(len(said) - 1)], said  # (1, 2, 4, ...)
    assert "stopping" in said[-1], said
    _still_registered(cluster, epoch)
    assert cluster.nodes["b1"].process.poll() is None


# --- the agent's rule, on a virtual clock ------------------------------------------------


VOTERS = {"c1": "10.0.0.1:7000"}
OK = {"register_broker": {"broker_epoch": 1}, "broker_heartbeat": {"fenced": False},
      "metadata_since": {"records": [], "position": 0}}


def _agent(script: Any, fatal: list[errors.MqlogError] | None,
           **settings: int) -> tuple[host.BrokerAgent, ClockIo]:
    io = ClockIo(VOTERS, script)
    agent = host.BrokerAgent(Host(), _config(VOTERS, **settings), io, rng=random.Random(1))
    if fatal is not None:
        agent.on_fatal = fatal.append
    io.agent = agent
    agent.start()
    return agent, io


def _duplicate(until_ms: float) -> Any:
    """Controllers that refuse DuplicateBrokerRegistration until ``until_ms``."""
    def script(now: int, name: str, header: dict[str, Any]) -> tuple[int, Any, Any]:
        if header["kind"] == "register_broker" and now < until_ms:
            return 1, None, errors.DuplicateBrokerRegistration(
                "broker b1 is registered by another live process, at h:1")
        return 1, OK[header["kind"]], None
    return script


def test_another_clusters_refusal_stops_the_agent_at_once() -> None:
    def script(now: int, name: str, header: dict[str, Any]) -> tuple[int, Any, Any]:
        return 1, None, errors.InconsistentClusterId("broker 'b1' is of cluster_id 'x', "
                                                     "these controllers of 'y'")
    fatal: list[errors.MqlogError] = []
    agent, io = _agent(script, fatal)
    io.run_until(600_000)
    assert len(io.asked) == 1 and agent.stopped and len(fatal) == 1
    assert isinstance(fatal[0], errors.InconsistentClusterId)
    assert "controller at 10.0.0.1:7000" in str(fatal[0]) and "'x'" in str(fatal[0])
    agent, io = _agent(script, None)  # without on_fatal (the simulator): asks again
    io.run_until(60_000)
    assert len(io.asked) > 10 and not agent.stopped


@pytest.mark.parametrize("seed", range(6))
def test_one_misconfigured_controller_is_passed_over_all_of_them_stop_the_agent(
        seed: int) -> None:
    """c3 alone is of another cluster_id (it cannot join its quorum either): a broker
    that asked it first stopped for good (helper-57: two brokers of three, at random).
    The others are asked and the broker registers; only when every controller refuses
    is the broker the stranger, and it stops. Each seed orders the controllers anew."""
    voters = {"c1": "10.0.0.1:7000", "c2": "10.0.0.2:7000", "c3": "10.0.0.3:7000"}

    def refusing(names: set[str]) -> Any:
        def script(now: int, name: str, header: dict[str, Any]) -> tuple[int, Any, Any]:
            if header["kind"] == "register_broker" and name in names:
                return 1, None, errors.InconsistentClusterId(
                    "broker 'b1' is of cluster_id 'prod', these controllers of 'other'")
            return 1, OK[header["kind"]], None
        return script

    for names, stops in (({"c3"}, False), ({"c1", "c2", "c3"}, True)):
        fatal: list[errors.MqlogError] = []
        io = ClockIo(voters, refusing(names))
        agent = host.BrokerAgent(Host(), _config(voters), io, rng=random.Random(seed))
        agent.on_fatal = fatal.append
        io.agent = agent
        agent.start()
        io.run_until(60_000)
        assert agent.stopped == stops and len(fatal) == int(stops), (seed, names, io.notes)
        assert (agent.epoch is None) == stops, (seed, names)


def test_a_restart_at_a_new_address_is_waited_for_and_a_duplicate_is_not() -> None:
    """A registration refused DuplicateBrokerRegistration while the old session lasts (up
    to 3 sessions here: a leader change and late ticks) is waited for; one refused for
    good stops after duplicate_refusals_max refusals, spanning DUPLICATE_WAIT_SESSIONS
    sessions; said at the 1st, 2nd, 4th... refusal only."""
    session = 9_000
    fatal: list[errors.MqlogError] = []
    agent, io = _agent(_duplicate(3 * session), fatal)
    io.run_until(20 * session)
    assert agent.epoch == 1 and not fatal and not agent.stopped  # (the restart: taken)

    agent, io = _agent(_duplicate(float("inf")), fatal)
    io.run_until(20 * session)
    refusals = [now for _round, _name, kind, now in io.asked if kind == "register_broker"]
    assert len(refusals) == agent.duplicate_refusals_max() and len(fatal) == 1
    assert refusals[-1] - refusals[0] >= host.DUPLICATE_WAIT_SESSIONS * session
    assert isinstance(fatal[0], errors.DuplicateBrokerRegistration) and agent.stopped
    counts = [int(note.split("(refused ")[1].split(" ")[0]) for note in io.notes
              if "(refused " in note]
    assert counts == [1, 2, 4, 8, 16], io.notes


def test_a_life_that_registered_before_never_stops_for_a_duplicate() -> None:
    """Registered, then fenced ("register again") and its id taken meanwhile: it has
    served and may host partitions, so it asks again for ever, said rarely."""
    state = {"registered": False}

    def script(now: int, name: str, header: dict[str, Any]) -> tuple[int, Any, Any]:
        kind = header["kind"]
        if kind == "register_broker":
            if state["registered"]:
                return 1, None, errors.DuplicateBrokerRegistration("taken by another")
            state["registered"] = True
        if kind == "broker_heartbeat" and now > 10_000:
            return 1, None, errors.MetadataChangeRefused("fenced: register again")
        return 1, OK[kind], None
    fatal: list[errors.MqlogError] = []
    agent, io = _agent(script, fatal)
    io.run_until(600_000)
    assert agent.registered_once and not fatal and not agent.stopped
    assert agent.duplicate_refusals > 100
    said = [note for note in io.notes if "taken by another" in note]
    assert len(said) == agent.duplicate_refusals.bit_length(), said


# --- the lock, in-process ------------------------------------------------------------------


def _lock(data_dir: Path) -> Any:
    from mqlog.replication.broker import lock_data_dir  # (here: the old code, which the
    # process tests above are run against to see them fail, has none)

    return lock_data_dir(data_dir, "b1", "127.0.0.1:1")


def _single(tmp_path: Path, name: str = "b1", data_dir: Path | None = None) -> BrokerConfig:
    return BrokerConfig(name, f"127.0.0.1:{free_ports(1)[0]}", data_dir or tmp_path / name,
                        cluster_id="c").validate()


def test_two_brokers_of_one_process_on_one_data_dir_are_refused(tmp_path: Path) -> None:
    """A second Broker on a served broker's data_dir is refused, naming this process; a
    broker stopped lets go, so a restart in the same process works (the in-process
    clusters' stop and start), and brokers of other data_dirs run beside it."""
    config = _single(tmp_path)
    with inprocess.BrokerThread(config) as running:
        with pytest.raises(errors.DataDirLocked, match="another Broker of this process "
                           rf"\(broker b1, listening on {config.listen}\)"):
            Broker(dataclasses.replace(config, listen=f"127.0.0.1:{free_ports(1)[0]}"))
        with inprocess.BrokerThread(_single(tmp_path, "b2")):  # (its own data_dir)
            pass
        assert running.broker._data_dir_lock.held
    assert not running.broker._data_dir_lock.held  # (let go once stopped)
    with inprocess.BrokerThread(config):  # the restart
        pass
    assert (tmp_path / "b1" / "broker.lock").is_file()


def test_an_in_process_cluster_restarts_a_broker(tmp_path: Path) -> None:
    """Controller-only and broker processes (tests/inprocess.py) each hold their own
    data_dir; one stopped and started again in the same process takes its lock again."""
    configs = inprocess.configs(tmp_path, brokers=("b1",), controllers=("c1",))
    with inprocess.Cluster(configs) as cluster:
        cluster.stop("b1")
        cluster.start("b1")
        assert all(thread.broker._data_dir_lock.held for thread in cluster.threads.values())


def test_a_broker_that_cannot_listen_lets_go_of_its_data_dir(tmp_path: Path) -> None:
    """Refused at its bind (CannotListen), a broker closes its stores and lets go of the
    data_dir: the next one on it starts."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        config = dataclasses.replace(_single(tmp_path),
                                     listen=f"127.0.0.1:{holder.getsockname()[1]}")
        broker = Broker(config)
        with pytest.raises(errors.DataDirLocked):
            Broker(config)
        with pytest.raises(errors.CannotListen):
            asyncio.run(broker.serve())
    assert not broker._data_dir_lock.held
    Broker(config)._data_dir_lock.release()  # (the store's lock was let go of too)


def test_a_forked_child_does_not_keep_the_lock(tmp_path: Path) -> None:
    """flock locks belong to the open file, which a forked child shares: the child lets go
    of its copy as it starts (before fork() returns in it), so the parent's release frees
    the data_dir while the child lives."""
    lock = _lock(tmp_path / "d")
    go_read, go_write = os.pipe()
    up_read, up_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: say it runs, wait until told, then go
        os.write(up_write, b"x")
        os.read(go_read, 1)
        os._exit(0)
    try:
        assert os.read(up_read, 1) == b"x"  # (the child's fork() returned)
        lock.release()
        _lock(tmp_path / "d").release()  # (free: not the child's)
    finally:
        os.write(go_write, b"x")
        os.waitpid(pid, 0)
        for fd in (go_read, go_write, up_read, up_write):
            os.close(fd)
