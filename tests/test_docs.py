"""The copy-paste blocks of the docs, run as a user runs them: docs/CLUSTER.md's "from
nothing to three controllers and three brokers" block is extracted from the file (not
copied here), its fixed ports swapped for free ones, and run by bash in a fresh
directory with the venv's `mqlog` and `python` first on PATH. Every process it starts is
stopped: the block runs in a session of its own, whose processes are all killed at the
end (a block that hangs is killed at its deadline and the test fails)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mqlog.replication.local import free_ports

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BLOCK_TIMEOUT_S = 240  # three controllers, three brokers, six Raft groups, a loaded machine


def sh_block(document: Path, heading: str, language: str = "sh") -> str:
    """The first ```sh (or ``language``) block after ``heading`` in ``document``."""
    text = document.read_text()
    start = text.index(heading)
    found = re.compile(rf"^```{language}\n(.*?)^```$", re.S | re.M).search(text, start)
    assert found, f"no ```{language} block after {heading!r} in {document}"
    return found.group(1)


def test_readme_embedded_example_runs_and_prints_what_it_says(tmp_path):
    block = sh_block(ROOT / "README.md", "# mqlog", "python")
    promised = re.search(r"# (PutStatus\.PUT_OK 0 0)", block)
    assert promised, "the README's first example no longer says what it prints"
    done = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[0] == promised.group(1), done.stdout


def on_free_ports(block: str) -> str:
    """The block with each 7xxx port it names replaced by a port free now."""
    ports = sorted(set(re.findall(r"\b7\d{3}\b", block)))
    mapping = dict(zip(ports, map(str, free_ports(len(ports))), strict=True))
    return re.sub(r"\b7\d{3}\b", lambda match: mapping[match.group(0)], block)


def run_block(block: str, where: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}"
               f"{os.environ.get('PATH', '')}")
    process = subprocess.Popen(["bash", "-c", block], cwd=where, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"the block still ran after {BLOCK_TIMEOUT_S} s:\n{out[-3000:]}\n"
                    f"{err[-3000:]}\n{logs(where)}")
    finally:
        with_group_gone(process.pid)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def with_group_gone(pgid: int) -> None:
    """Kill whatever the block left running (its nodes run in the background)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return


def logs(where: Path) -> str:
    return "\n".join(f"--- {path.name}\n{path.read_text()[-1500:]}"
                     for path in sorted(where.rglob("*.log")))


def test_cluster_md_controllers_brokers_and_a_topic(tmp_path):
    block = on_free_ports(sh_block(DOCS / "CLUSTER.md",
                                   "### From nothing to three controllers and three brokers"))
    assert not re.search(r"\b7101\b", block) and "mqlog topics delete" in block  # (a free
    # port may hold those digits: 27101)
    # set -e: any step that fails fails the block; the trap stops its nodes as it ends
    done = run_block("set -e\ntrap 'kill $(jobs -p) 2>/dev/null; wait' EXIT\n" + block,
                     tmp_path)
    context = f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}\n{logs(tmp_path)}"
    assert done.returncode == 0, context
    out = done.stdout
    # (stderr has `mqlog produce`'s summary, and must have no error)
    assert "Traceback" not in out + done.stderr and "mqlog: error" not in done.stderr, context
    assert len(re.findall(r"^b[123]\tepoch=\d+\t127\.0\.0\.1:\d+\tlive$", out, re.M)) == 3, \
        context
    assert "created topic orders: 6 partitions x 3 replicas (raft)" in out, context
    assert re.search(r"^orders\traft\t6\t3$", out, re.M), context
    for key in ("alice", "bob", "carol"):
        assert re.search(rf"^{key} -> [0-5] PUT_OK offset 0$", out, re.M), context
    assert re.search(r"^\[b'(alice|bob|carol)'\]$", out, re.M), context
    assert re.search(r"^produced 2 records to 'orders': partition \d: offsets", done.stderr,
                     re.M), context
    consumed = re.findall(r"^(alice|bob|carol|hello|world)$", out, re.M)
    assert sorted(consumed) == ["alice", "bob", "carol", "hello", "world"], context
    described = re.findall(r"^  \d leader=(\S+) leader_epoch=(\d+) ", out, re.M)
    assert len(described) == 12, context  # twice six partitions
    assert all(leader != "-" and int(epoch) >= 1 for leader, epoch in described[6:]), context
    assert "deleted topic scratch" in out, context
