"""``mqlog topics create|delete`` whose answer is lost: not sent again (a hostile review).

A change to the cluster's metadata is not safe to repeat: a second ``create_topic`` after
the first committed is refused "exists already" (the operator's own, successful create
reported as a failure), and a second ``delete_topic`` deletes whatever topic of that
name exists by then — one created meanwhile by someone else. So the command sends a
change to the next controller only when the one asked surely did not carry it out (its
address refused the connection: nothing was sent; NotLeader: a follower proposes
nothing), and otherwise fails with ``RequestOutcomeUnknown``, which says to describe the
topic before running the command again.

Real processes on 127.0.0.1: one controller and one broker. The lost answer is made by a
proxy put first in ``--bootstrap``: it passes the request on to the controller and, once
the controller's answer comes back (the change is committed then: no timing involved),
closes the command's connection instead of passing the answer on.
"""

from __future__ import annotations

import select
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mqlog import errors
from mqlog.client import Client
from mqlog.replication.local import free_ports, wait_until
from mqlog.replication.local_controller import ask, state
from tests.test_cli_cluster import mqlog, start
from tests.test_cli_node import STOP_TIMEOUT_S, one_error_line

LIVE_TIMEOUT_S = 120.0  # generous: a loaded 2-core machine
CALL_TIMEOUT_S = 60.0


class AnswerCutter:
    """A TCP proxy to ``upstream`` whose connections carry requests there and never an
    answer back: when the first answer's bytes arrive, ``on_answer()`` runs, then the
    client's connection is closed (the "connection cut after the request was sent" of an
    outcome unknown)."""

    def __init__(self, upstream: str, on_answer: Callable[[], None] = lambda: None) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream, self.on_answer = (host, int(port)), on_answer
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.cut = 0  # answers withheld
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            while not self._stop.is_set():
                if select.select([self.listener], [], [], 0.1)[0]:
                    client, _ = self.listener.accept()
                    with client, socket.create_connection(self.upstream, timeout=30) as up:
                        self._carry(client, up)
        except BaseException as error:  # (reported by close(), in the test's thread)
            self.failure = error

    def _carry(self, client: socket.socket, up: socket.socket) -> None:
        while not self._stop.is_set():
            for ready in select.select([client, up], [], [], 0.1)[0]:
                data = ready.recv(1 << 16)
                if ready is client:
                    if not data:
                        return  # (the client went away)
                    up.sendall(data)
                    continue
                if data:  # the answer: the change is decided; withhold it
                    self.on_answer()
                    self.cut += 1
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=STOP_TIMEOUT_S)
        self.listener.close()
        if self.failure is not None:
            raise self.failure


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """One controller and one broker registered with it (live): their addresses."""
    controller_port, broker_port = free_ports(2)
    address = f"127.0.0.1:{controller_port}"
    quorum = f'[controller]\nvoters = {{c1 = "{address}"}}\n'
    for name, port, role in (("c1", controller_port, "controller"),
                             ("b1", broker_port, "broker")):
        (tmp_path / f"{name}.toml").write_text(
            f'[node]\nid = "{name}"\nlisten = "127.0.0.1:{port}"\n'
            f'data_dir = "{tmp_path / name}"\nprocess_roles = "{role}"\n'
            f'[node.peers]\nc1 = "{address}"\nb1 = "127.0.0.1:{broker_port}"\n{quorum}')
    processes: list[subprocess.Popen] = []
    try:
        for name in ("c1", "b1"):
            processes.append(start(tmp_path / f"{name}.toml"))
        wait_until(lambda: (found := state(ask([address], {"kind": "describe_cluster"})))
                   is not None and len(found.live_brokers()) == 1, "b1 live", LIVE_TIMEOUT_S)
        yield address, f"127.0.0.1:{broker_port}"
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def topics(address: str) -> dict[str, int]:
    """Topic -> partition count, as the controller has them."""
    found = state(ask([address], {"kind": "describe_cluster"}))
    assert found is not None
    return {name: len(topic.partitions) for name, topic in found.topics.items()}


def create_directly(address: str, name: str, partitions: int) -> None:
    with Client(address, timeout_s=CALL_TIMEOUT_S) as client:
        client.call({"kind": "create_topic", "name": name, "partitions": partitions,
                     "replication_factor": 1, "layer": "raft"})


def test_a_create_whose_answer_is_lost_is_not_sent_again(
        cluster: tuple[str, str]) -> None:
    """It was: the next controller refused the copy ("exists already") and the operator
    read that their create failed, though it had made the topic."""
    controller = cluster[0]
    proxy = AnswerCutter(controller)
    try:
        result = mqlog("topics", "create", "orders", "--partitions", "2",
                       "--replication-factor", "1", "--timeout-s", CALL_TIMEOUT_S,
                       "--bootstrap", f"{proxy.address},{controller}")
    finally:
        proxy.close()
    assert proxy.cut == 1
    line = one_error_line(result)
    assert "exists already" not in line, line
    assert f"create_topic of 'orders' sent to {proxy.address}" in line, line
    assert "may have been carried out" in line and "not sent again" in line, line
    assert "mqlog topics describe orders" in line, line
    assert topics(controller) == {"orders": 2}  # (made once, as asked)


def test_a_delete_whose_answer_is_lost_does_not_delete_a_topic_made_meanwhile(
        cluster: tuple[str, str]) -> None:
    """It did: the copy sent to the next controller deleted the topic someone created
    under the same name after the first delete committed, and the command said "deleted
    topic orders", exit 0."""
    controller = cluster[0]
    create_directly(controller, "orders", 1)
    proxy = AnswerCutter(controller, on_answer=lambda: create_directly(controller,
                                                                       "orders", 3))
    try:
        result = mqlog("topics", "delete", "orders", "--timeout-s", CALL_TIMEOUT_S,
                       "--bootstrap", f"{proxy.address},{controller}")
    finally:
        proxy.close()
    assert proxy.cut == 1
    line = one_error_line(result)
    assert f"delete_topic of 'orders' sent to {proxy.address}" in line, line
    assert "may have been carried out" in line, line
    assert "mqlog topics describe orders" in line, line
    assert topics(controller) == {"orders": 3}  # the new topic lives


def test_a_change_goes_on_past_what_surely_did_not_carry_it_out(
        cluster: tuple[str, str]) -> None:
    """Nothing was sent to an address that refused the connection, and a broker (no
    controller there: UnknownGroup) carried nothing out: the change goes on to the next."""
    (controller, broker), closed = cluster, free_ports(1)[0]
    result = mqlog("topics", "create", "orders", "--partitions", "1",
                   "--replication-factor", "1", "--timeout-s", CALL_TIMEOUT_S,
                   "--bootstrap", f"127.0.0.1:{closed},{broker},{controller}")
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "created topic orders: 1 partition x 1 replica (raft)" in result.stdout
    assert topics(controller) == {"orders": 1}


def test_outcome_unknown_is_a_node_unavailable() -> None:
    """Handlers of NodeUnavailable (outcome unknown) still catch it."""
    assert issubclass(errors.RequestOutcomeUnknown, errors.NodeUnavailable)
