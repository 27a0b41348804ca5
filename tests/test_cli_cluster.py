"""`mqlog produce|consume --bootstrap`: what is refused before anything is sent (the
happy path against a real cluster is tests/test_docs.py, docs/CLUSTER.md's block)."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from mqlog import errors
from mqlog.cluster_client import ClusterClient
from mqlog.replication.local import free_ports
from tests.test_cli_node import MQLOG, one_error_line


def mqlog(*args: object, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([MQLOG, *map(str, args)], input=stdin, capture_output=True,
                          text=True, timeout=120)


def usage_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mqlog: error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("command", ["produce", "consume"])
def test_a_store_or_a_cluster_one_of_the_two(tmp_path, command):
    for args in ((), (tmp_path / "s", "--bootstrap", "127.0.0.1:1")):
        line = usage_error(mqlog(command, *args, "--topic", "t"))
        assert "give DATA_DIR (a store directory) or --bootstrap" in line, line
    assert not (tmp_path / "s").exists()  # nothing created on the way


@pytest.mark.parametrize(("command", "option"), [
    ("produce", ("--sync",)), ("produce", ("--property", "a=b")),
    ("produce", ("--config", "x.toml")), ("consume", ("--group", "g")),
    ("consume", ("--follow",)), ("consume", ("--from-time", "0")),
    ("consume", ("--tags", "a")), ("consume", ("--poll-ms", "5"))])
def test_store_only_options_are_refused_with_bootstrap(command, option):
    line = usage_error(mqlog(command, "--bootstrap", "127.0.0.1:1", "-t", "t", *option))
    assert f"{option[0]}: only for a store directory, not with --bootstrap" in line, line


@pytest.mark.parametrize("option", [("--acks", "1"), ("--timeout-s", "3")])
def test_cluster_only_options_are_refused_with_a_store(tmp_path, option):
    line = usage_error(mqlog("produce", tmp_path / "s", "-t", "t", *option, stdin="x\n"))
    assert f"{option[0]}: only for --bootstrap (a cluster), not with DATA_DIR" in line, line
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("option", [("--timeout-ms", "5"), ("--poll-ms", "5")])
def test_follow_only_options_are_refused_without_follow(tmp_path, option):
    """They were taken and did nothing: consume without --follow prints what is there."""
    mqlog("produce", tmp_path / "s", "-t", "t", stdin="a\n")
    line = usage_error(mqlog("consume", tmp_path / "s", "-t", "t", *option))
    assert f"{option[0]}: only with --follow" in line, line


def test_no_broker_answering_is_one_line_within_the_timeout():
    port = free_ports(1)[0]
    line = one_error_line(mqlog("consume", "-b", f"127.0.0.1:{port}", "-t", "t",
                                "--timeout-s", "1"))
    assert f"127.0.0.1:{port}" in line and "cannot reach" in line, line


def start(config: Path) -> subprocess.Popen:
    process = subprocess.Popen([MQLOG, "node", "--config", str(config)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        if "serving on" in line:
            threading.Thread(target=process.stdout.read, daemon=True).start()  # drained
            return process
    process.wait()
    pytest.fail(f"{config.name} ended before it listened: status {process.returncode}")


def test_controllers_and_brokers_mixed_up_are_said_plainly(tmp_path):
    """The two --bootstrap lists are not interchangeable (as in Kafka): produce and
    consume name brokers, topics and brokers name controllers; each mix-up says so."""
    controller_port, broker_port = free_ports(2)
    controller, broker = tmp_path / "c1.toml", tmp_path / "b1.toml"
    controller.write_text(f"""[node]
id = "c1"
listen = "127.0.0.1:{controller_port}"
data_dir = "{tmp_path / 'c1'}"
process_roles = "controller"

[controller]
voters = {{c1 = "127.0.0.1:{controller_port}"}}
""")
    broker.write_text(f"""[node]
id = "b1"
listen = "127.0.0.1:{broker_port}"
data_dir = "{tmp_path / 'b1'}"

[groups.orders]
layer = "raft"
voters = ["b1"]
""")
    processes = [start(controller), start(broker)]
    try:
        line = one_error_line(mqlog("consume", "-b", f"127.0.0.1:{controller_port}", "-t",
                                    "orders", "--timeout-s", "1"))
        assert "names controllers; produce and consume need brokers" in line, line
        # (told by the node's process_roles, a typed error: no longer "__controller" in a
        # message's text; and at once, not after retry_timeout_s)
        with ClusterClient(f"127.0.0.1:{controller_port}", retry_timeout_s=600) as client, \
                pytest.raises(errors.NotABroker, match="controllers, not brokers") as failed:
            client.metadata()
        assert failed.value.addresses == [f"127.0.0.1:{controller_port}"]
        # a controller beside a node that is no cluster's broker: each named for what it
        # is, at once (neither turns into a cluster's broker: it was said after
        # --timeout-s, "no broker answered")
        started = time.monotonic()
        line = one_error_line(mqlog("consume", "-b", f"127.0.0.1:{controller_port},"
                                    f"127.0.0.1:{broker_port}", "-t", "orders",
                                    "--timeout-s", "30"))
        assert time.monotonic() - started < 25, line
        assert f"127.0.0.1:{controller_port} is a controller, not a broker" in line, line
        assert f"127.0.0.1:{broker_port} is not a cluster's broker but a standalone " \
            "node" in line, line
        assert "mqlog.Client(ADDRESS)" in line and "mqlog consume DATA_DIR" in line, line
        with ClusterClient(f"127.0.0.1:{broker_port}", retry_timeout_s=600) as client, \
                pytest.raises(errors.NotABroker, match="hosting 'orders'") as failed:
            client.metadata()
        assert failed.value.standalone == [f"127.0.0.1:{broker_port}"]
        line = one_error_line(mqlog("topics", "list", "-b", f"127.0.0.1:{broker_port}"))
        assert f"127.0.0.1:{broker_port} is not a controller" in line, line
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            process.wait(timeout=60)


def test_cluster_status_of_a_broker_of_several_groups_names_them(tmp_path):
    """`mqlog cluster status` of a broker hosting several groups, without --group (or
    with one it does not host), printed "unreachable (broker b1 hosts no group '' (it
    hosts ...); name one in the request)" and then "no node answered at ADDRESS: check
    the addresses ... and that the nodes run" — though the node answered (new-user
    review). Now it says what the broker hosts and how to name one; an address where
    nothing answers is still told apart."""
    port, dead = free_ports(2)
    config = tmp_path / "b1.toml"
    config.write_text(f"""[node]
id = "b1"
listen = "127.0.0.1:{port}"
data_dir = "{tmp_path / 'b1'}"

[groups.orders]
layer = "raft"
voters = ["b1"]

[groups.payments]
layer = "raft"
voters = ["b1"]
""")
    address = f"127.0.0.1:{port}"
    process = start(config)
    try:
        for group, what in ((None, "hosts several groups and no default one"),
                            ("nope", "hosts no group 'nope'")):
            chosen = ("--group", group) if group else ()
            result = mqlog("cluster", *chosen, "status", address)
            line = one_error_line(result)
            for said in (f"{address} answered: broker b1 {what} (it hosts orders, "
                         "payments); use `mqlog cluster --group NAME status", "--group "
                         "orders"):
                assert said in line, line
            for blame in ("no node answered", "check the addresses", "name one in the "
                          "request"):
                assert blame not in line and blame not in result.stdout, result.stdout
            assert "no such group" in result.stdout and "unreachable" not in result.stdout
        result = mqlog("cluster", "status", address, f"127.0.0.1:{dead}")
        line = one_error_line(result)  # (each address for what it is)
        assert f"{address} answered: broker b1 hosts several groups" in line, line
        assert f"no node answered at 127.0.0.1:{dead}: check the addresses" in line, line
        result = mqlog("cluster", "--group", "payments", "status", address)
        assert result.returncode == 0, result.stderr
        assert "LEADER" in result.stdout or "CANDIDATE" in result.stdout, result.stdout
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
