"""`mqlog node` and `mqlog registry` as a new user meets them: a port already taken, a
stop asked before the node ever listened, a config with a typo. Each must end in one
error line and a non-zero status, never a hang or a traceback, and leave its store
closed (a second start works)."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import mqlog
from mqlog.replication.local import free_ports

MQLOG = shutil.which("mqlog", path=str(Path(sys.executable).parent)) or "mqlog"
STOP_TIMEOUT_S = 60  # generous: a loaded machine; a hang is what is tested


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port this test holds listening, so anything else that binds it fails."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def node_config(tmp_path: Path, port: int, extra: str = "") -> Path:
    path = tmp_path / "n1.toml"
    path.write_text(f"""[node]
id = "n1"
listen = "127.0.0.1:{port}"
data_dir = "{tmp_path / 'data'}"
layer = "raft"
voters = ["n1"]
{extra}""")
    return path


def run_to_end(*args: object) -> subprocess.CompletedProcess:
    process = subprocess.Popen([MQLOG, *map(str, args)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"`mqlog {' '.join(map(str, args))}` still ran after "
                    f"{STOP_TIMEOUT_S} s: {out[-2000:]} {err[-2000:]}")
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mqlog: error: "), result.stderr
    return lines[0]


def test_a_node_on_a_taken_port_fails_with_one_line_and_frees_its_store(tmp_path, taken_port):
    config = node_config(tmp_path, taken_port)
    line = one_error_line(run_to_end("node", "--config", config))
    assert f"cannot listen on 127.0.0.1:{taken_port}" in line and "listen" in line, line
    with mqlog.open(tmp_path / "data"):  # not left locked by the failed node
        pass


def test_a_registry_on_a_taken_port_fails_with_one_line(taken_port):
    line = one_error_line(run_to_end("registry", "--listen", f"127.0.0.1:{taken_port}"))
    assert f"cannot listen on 127.0.0.1:{taken_port}" in line, line


def test_a_node_listening_on_a_foreign_host_fails_with_one_line(tmp_path):
    config = node_config(tmp_path, free_ports(1)[0]).read_text()
    path = tmp_path / "foreign.toml"
    path.write_text(config.replace('listen = "127.0.0.1:', 'listen = "192.0.2.77:'))
    assert "cannot listen on 192.0.2.77:" in one_error_line(run_to_end("node", "--config",
                                                                       path))


def test_a_config_typo_names_the_nearest_key(tmp_path):
    config = node_config(tmp_path, free_ports(1)[0], 'election_timeout_tick = 10\n')
    line = one_error_line(run_to_end("node", "--config", config))
    assert "unknown key 'election_timeout_tick'" in line, line
    assert "did you mean 'election_timeout_ticks'" in line, line


def test_sigterm_stops_a_broker_whose_controllers_never_answer(tmp_path):
    """A broker of a cluster whose controllers are all down keeps trying to register; a
    SIGTERM (or Ctrl-C) must still stop it at once, status 0, its stores closed."""
    port, dead = free_ports(2)
    path = tmp_path / "b1.toml"
    path.write_text(f"""[node]
id = "b1"
listen = "127.0.0.1:{port}"
data_dir = "{tmp_path / 'data'}"

[node.peers]
c1 = "127.0.0.1:{dead}"

[controller]
voters = {{c1 = "127.0.0.1:{dead}"}}
""")
    process = subprocess.Popen([MQLOG, "node", "--config", str(path)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        for line in process.stdout:  # until it listens (then it is trying to register)
            if "serving on" in line:
                break
        else:
            pytest.fail(f"the broker ended before it listened: {process.wait()}")
        # its failed registrations go on printing: keep the pipe drained so that a full
        # pipe cannot be what holds it
        threading.Thread(target=process.stdout.read, daemon=True).start()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=STOP_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
            pytest.fail(f"the broker did not stop within {STOP_TIMEOUT_S} s of SIGTERM")
    assert process.returncode == 0, process.returncode


def test_a_store_setting_typo_names_the_nearest_and_creates_nothing(tmp_path):
    config = tmp_path / "store.toml"
    config.write_text("[store]\nsegment_size_byte = 67108864\n")
    result = subprocess.run([MQLOG, "produce", str(tmp_path / "s"), "-t", "t", "--config",
                             str(config)], input="x\n", capture_output=True, text=True,
                            timeout=STOP_TIMEOUT_S)
    line = one_error_line(result)
    assert "'segment_size_byte' (did you mean 'segment_size_bytes'?)" in line, line
    assert "known settings" not in line, line  # not forty names to read through
    assert not (tmp_path / "s").exists()


def test_cluster_status_with_no_node_answering_fails():
    """A table of unreachable rows is still shown, but a script must see the failure."""
    port = free_ports(1)[0]
    result = run_to_end("cluster", "status", f"127.0.0.1:{port}", "localhost")
    assert "unreachable" in result.stdout, result.stdout
    assert f"no node answered at 127.0.0.1:{port}, localhost" in one_error_line(result)
