"""The ISR core, driven by datadriven scripts (tests/data/isr/*.txt) over real stores,
with the controller's decisions (mqlog/replication/isr/decisions.py) played by the script.

The harness is the Raft one (tests/test_raft.py: real stores without background threads,
the one driver, a test network through the real wire codec, crashes that lose what no
Ready synced); the nodes run IsrCore, and the script is the controller as well: it names
leaders and ISRs, decides the AlterPartition requests the leaders send, and hands each
decision to the nodes it chooses (a broker that has not pulled it yet keeps the old one).

Commands beyond the Raft harness's (deliver, drop, process, stabilize, tick, run, crash,
partition, heal, log, compare, retain):

    add n1 n2 n3 [min_isr=K] [ack=written|flushed]  replicas of one partition
    metadata leader=n1 isr=n1,n2 [elr=n3] [to=n1,n2]  the controller's decision (a new
                           partition epoch; a new leader epoch if the leader changed),
                           handed to the named nodes (every running node if none)
    controller [to=...]    decide the AlterPartition requests the leaders sent, in order
                           (a stale one is refused), and hand each new state out
    fence n1 [unclean=true] [to=...]  the controller fences broker n1 and elects a
                           leader if it led (ISR, then ELR, then unclean if allowed)
    put n1 [count=K] [size=B] [acks=all|1]  a client's write, as a node stores it: asked
                           first (NotEnoughReplicas stores nothing), proposed if acks=all
    restart n1             reopen it (recovery), and hand it the controller's state
    flush n1 [n2 ...]      the OS writes the store's pages out on its own (now durable)
    status [n1 ...]        role, epochs, ISR, high watermark, log end (+ followers' ends)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import mqlog
from mqlog.config import ReplicationConfig
from mqlog.errors import MetadataChangeRefused, StaleAlterPartition
from mqlog.replication.driver import Driver
from mqlog.replication.isr import AlterPartition, IsrCore, PartitionState
from mqlog.replication.isr.decisions import decide_alter_partition, elect_leader
from tests import datadriven, scripted
from tests import test_raft as raft_harness

SCRIPTS = sorted((Path(__file__).parent / "data" / "isr").glob("*.txt"))
# 10 ms ticks: a follower leaves the ISR after 10 ticks without catching up, a fetch
# waits at most 4 ticks at the leader, an unanswered one is sent again 2 ticks later.
TICK_SETTINGS = dict(tick_ms=10, replica_lag_time_ms=100, fetch_wait_ms_max=40,
                     retransmit_ticks=2, sync_timeout_ticks=30, fetch_bytes_max=600,
                     frame_size_bytes_max=8192, alter_partition_retry_ms=50)


class Interaction(raft_harness.Interaction):
    """The replicas of one partition, the network between them, and the controller."""

    def __init__(self, root: Path, impl: str, test_break: str = "") -> None:
        super().__init__(root, impl, test_break)
        self.partition = PartitionState("", 0, 0, ())
        self.min_isr = 1
        self.alters: list[AlterPartition] = []
        self.fenced: set[str] = set()

    def do_add(self, args: list[str], kwargs: dict[str, str]) -> str:
        self.min_isr = int(kwargs.get("min_isr", 1))
        self.partition = PartitionState("", 0, 0, (), (), tuple(args))
        for name in args:
            self.configs[name] = ReplicationConfig(
                layer="isr", node_id=name, replicas=tuple(args),
                min_insync_replicas=self.min_isr,
                replica_ack=kwargs.get("ack", "written"),  # type: ignore[arg-type]
                **TICK_SETTINGS)  # type: ignore[arg-type]
            self._start(name)
        return self._flush_ready(list(args))

    def _start(self, name: str) -> None:
        self.stores[name] = mqlog.open(self.root / name, implementation=self.impl,
                                       clock_ms=lambda: 1_000, **raft_harness.STORE_SETTINGS)
        self.starts[name] = self.starts.get(name, 0) + 1
        self.cores[name] = IsrCore(self.configs[name], self.stores[name],  # type: ignore
                                   test_break=self.test_break)
        self.drivers[name] = Driver(self.stores[name], self.cores[name],
                                    scripted.ScriptIo(self, name), describe=True)

    def do_crash(self, args: list[str], kwargs: dict[str, str]) -> str:
        lines = []
        for name in args:
            durable, written = self._lose_power(name)
            lines.append(f"{name}: crashed, " + (f"lost [{durable}, {written})"
                                                 if written > durable else "lost nothing"))
        return "\n".join(lines)

    def do_restart(self, args: list[str], kwargs: dict[str, str]) -> str:
        lines = []
        for name in args:
            self._start(name)
            lines.append(f"{name}: restarted, log ends at {self.stores[name].written_position}")
            self.cores[name].apply_metadata(self.partition)  # type: ignore[attr-defined]
            lines += [line for line in [self._flush_ready([name])] if line]
        return "\n".join(lines)

    # --- the controller --------------------------------------------------------------------

    def _hand_out(self, kwargs: dict[str, str]) -> str:
        state = self.partition
        for name in raft_harness._names(kwargs.get("to", "")) or self._up():
            self.cores[name].apply_metadata(state)  # type: ignore[attr-defined]
        return (f"partition epoch {state.partition_epoch}: leader {state.leader or '-'} "
                f"(leader epoch {state.leader_epoch}) isr={','.join(state.isr) or '-'} "
                f"elr={','.join(state.elr) or '-'}")

    def do_metadata(self, args: list[str], kwargs: dict[str, str]) -> str:
        current = self.partition
        leader = kwargs["leader"]
        self.partition = PartitionState(
            leader, current.leader_epoch + (leader != current.leader),
            current.partition_epoch + 1, tuple(raft_harness._names(kwargs["isr"])),
            tuple(raft_harness._names(kwargs.get("elr", ""))), current.replicas)
        return self._hand_out(kwargs)

    def do_controller(self, args: list[str], kwargs: dict[str, str]) -> str:
        lines = []
        live = {name for name in self.configs if name not in self.fenced}
        alters, self.alters = self.alters, []
        for request in alters:
            text = (f"{request.src}: AlterPartition isr={','.join(request.isr)} "
                    f"(leader epoch {request.epoch}, partition epoch "
                    f"{request.partition_epoch}): ")
            try:
                self.partition = decide_alter_partition(self.partition, request,
                                                        self.min_isr, live)
            except MetadataChangeRefused as error:
                lines.append(text + f"refused: {error}")
                if request.src in self.cores:  # (the answer reaches the leader, as the
                    self.cores[request.src].alter_partition_refused(  # agent passes it)
                        str(error), isinstance(error, StaleAlterPartition))
                continue
            lines.append(text + "accepted; " + self._hand_out(kwargs))
        return "\n".join(lines)

    def do_fence(self, args: list[str], kwargs: dict[str, str]) -> str:
        self.fenced |= set(args)
        live = {name for name in self.configs if name not in self.fenced}
        current = self.partition
        if current.leader in live:
            isr = tuple(name for name in current.isr if name in live)
            state = decide_alter_partition(
                current, AlterPartition(current.leader, "controller", current.leader_epoch,
                                        current.partition_epoch, isr), self.min_isr)
            self.partition, how = state, "leader stays"
        else:
            self.partition, how = elect_leader(current, live, self.min_isr,
                                               kwargs.get("unclean") == "true")
        return f"fenced {','.join(args)}; elected from {how}: " + self._hand_out(kwargs)

    def do_unfence(self, args: list[str], kwargs: dict[str, str]) -> str:
        self.fenced -= set(args)
        return ""

    def _flush_ready(self, names: list[str]) -> str:
        output = super()._flush_ready(names)
        self.alters += [message for message in self.network
                        if isinstance(message, AlterPartition)]
        self.network = [message for message in self.network
                        if not isinstance(message, AlterPartition)]
        return output

    # --- clients ---------------------------------------------------------------------------

    def do_put(self, args: list[str], kwargs: dict[str, str]) -> str:
        name, lines = args[0], []
        driver, acks = self.drivers[name], kwargs.get("acks", "all")
        count, first = int(kwargs.get("count", 1)), self.proposals + 1
        for _ in range(count):
            driver.check_writable()  # as a node asks before it stores a client's write
            self.cores[name].may_accept("replicated" if acks == "all" else "master")
            stored = driver.write("t", [b"x" * int(kwargs.get("size", 100))])
            self.proposals += 1
            if acks == "all":
                driver.propose(f"p{self.proposals}", stored.end)
            lines.append(f"p{self.proposals}: stored [{stored.position}, {stored.end})"
                         + ("" if acks == "all" else f" (acks={acks}: answered PUT_OK)"))
        if count > 10:
            lines = [f"p{first}..p{self.proposals}: stored [{lines[0].split('[')[1][:-1]}"
                     f" ... {lines[-1].split('[')[1]}"]
        return "\n".join(lines)

    def do_status(self, args: list[str], kwargs: dict[str, str]) -> str:
        lines = []
        for name in args or sorted(self.configs):
            if name not in self.cores:
                lines.append(f"{name}: down")
                continue
            core: Any = self.cores[name]
            core.invariants()
            store = self.stores[name]
            lines.append(f"{name}: {core.role} leader={core.leader or '-'} "
                         f"leader_epoch={core.epoch} partition_epoch="
                         f"{core.state.partition_epoch} isr={','.join(core.isr) or '-'} "
                         f"hw={core.hw} written={store.written_position} "
                         f"durable={store.flushed_position}")
            for peer, progress in sorted(core.followers.items()):
                lines.append(f"  {peer}: log_end={progress.log_end}")
        return "\n".join(lines)


@pytest.mark.parametrize("script", SCRIPTS, ids=[path.stem for path in SCRIPTS])
def test_isr_script(script, tmp_path, impl):
    scripted.run_script(script, Interaction(tmp_path, impl))


KIP101 = Path(__file__).parent / "data" / "isr" / "kip101_hw_truncation.txt"


def _run_broken(script: Path, tmp_path: Path, impl: str,
                test_break: str) -> tuple[list[Any], list[str], int]:
    """Run ``script`` on cores with ``test_break`` on: its cases, what each printed, and
    the index of the first case whose output differs from the script's (it must)."""
    cases = datadriven.parse(script.read_text())
    outputs = scripted.outputs(cases, Interaction(tmp_path, impl, test_break=test_break))
    first_difference = next((index for index, (case, output) in enumerate(
        zip(cases, outputs, strict=True)) if output != case.expected), None)
    assert first_difference is not None, f"{script.name} passed with --break {test_break}"
    return cases, outputs, first_difference


def test_kip101_catches_a_follower_that_truncates_to_its_high_watermark(tmp_path, impl):
    """With the pre-KIP-101 rule (a follower cuts its log to its high watermark when it
    starts following), kip101_hw_truncation.txt must fail: n2 drops the acknowledged p1
    on its restart, and once it leads, neither log holds p1."""
    cases, outputs, first_difference = _run_broken(KIP101, tmp_path, impl, "truncate_to_hw")
    assert cases[first_difference].command == "restart", cases[first_difference]
    assert "truncated [0, 173) to its high watermark" in outputs[first_difference]
    log = outputs[[case.command for case in cases].index("log")]
    assert log.splitlines() == ["n1: (empty) end=0 committed=0",
                                "n2: (empty) end=0 committed=0"], log


STALE_REFUSAL = Path(__file__).parent / "data" / "isr" / "stale_refusal_keeps_maximal_isr.txt"


def test_a_leader_that_forgets_a_stale_refused_request_is_caught(tmp_path, impl):
    """With the refusal for a moved epoch read as "not applied" (the pending request
    dropped), stale_refusal_keeps_maximal_isr.txt must fail where n1's status shows its
    high watermark past n3, the follower the arriving metadata puts in the ISR."""
    cases, outputs, first_difference = _run_broken(STALE_REFUSAL, tmp_path, impl,
                                                   "forget_stale_alter")
    assert cases[first_difference].command == "stabilize", cases[first_difference]
    status = outputs[first_difference + 1]
    assert "isr=n1,n2 hw=519" in status and "n3: log_end=0" in status, status
