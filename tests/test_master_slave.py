"""The master-slave core, driven by datadriven scripts (tests/data/master_slave/*.txt)
over real stores: each node is an mqlog.Store in a temporary directory and a
MasterSlaveCore, run by the one driver (mqlog/replication/driver.py) that nodes and the
simulator run; a test network holds the messages between them until a script delivers
or drops them, and ``process`` prints the driver's own description of what it did
(as tests/test_raft.py does: one description for every layer)."""

from __future__ import annotations

from pathlib import Path

import pytest

import mqlog
from mqlog.config import ReplicationConfig
from mqlog.replication import messages as wire_messages
from mqlog.replication.driver import Driver, describe_message
from mqlog.replication.master_slave import MasterSlaveCore
from mqlog.replication.messages import Message
from mqlog.replication.wire import Frame, FrameDecoder
from mqlog.sim.node import power_off
from tests import scripted
from tests.conftest import SMALL

SCRIPTS = sorted((Path(__file__).parent / "data" / "master_slave").glob("*.txt"))
# Retention runs only when a script says ``retain``.
STORE_SETTINGS = dict(SMALL, retention_ms=-1, retention_bytes=0, background_threads=False,
                      segment_prepare_ahead=False, segment_preallocate=False,
                      retention_check_interval_ms=3_600_000)
TICK_SETTINGS = dict(heartbeat_ticks=3, slave_timeout_ticks=10, sync_timeout_ticks=6,
                     retransmit_ticks=4, append_bytes_max=600, inflight_bytes_max=1200,
                     frame_size_bytes_max=8192)


class Interaction(scripted.Interaction):
    """The nodes, their stores and the network of one script; a node's hard state is its
    role state (promote, follow): a restart starts from it."""

    def __init__(self, root: Path, impl: str) -> None:
        super().__init__(root, impl)
        self.cores: dict[str, MasterSlaveCore] = {}

    # --- commands --------------------------------------------------------------------

    def do_add(self, args: list[str], kwargs: dict[str, str]) -> str:
        name = args[0]
        config = ReplicationConfig(
            node_id=name, role=kwargs.get("role", "SLAVE"),  # type: ignore[arg-type]
            master=kwargs.get("master", ""),
            slaves=tuple(filter(None, kwargs.get("slaves", "").split(","))),
            in_sync_slaves_min=int(kwargs.get("min", 1)),
            restart_unclean_after_ticks=int(kwargs.get("unclean", 0)),
            slave_ack=kwargs.get("ack", "written"), **TICK_SETTINGS)  # type: ignore[arg-type]
        self.configs[name] = config
        self._start(name)
        return self._flush_ready([name])

    def _start(self, name: str) -> None:
        self.stores[name] = mqlog.open(self.root / name, implementation=self.impl,
                                       **STORE_SETTINGS)
        self.cores[name] = MasterSlaveCore(self.configs[name], self.stores[name],
                                           hard_state=self.hard_states.get(name))
        self.drivers[name] = Driver(self.stores[name], self.cores[name],
                                    scripted.ScriptIo(self, name), describe=True)

    def do_put(self, args: list[str], kwargs: dict[str, str]) -> str:
        name, lines = args[0], []
        driver = self.drivers[name]
        driver.check_writable()  # as a node does before it stores a client's write
        for _ in range(int(kwargs.get("count", 1))):
            stored = driver.write("t", [b"x" * int(kwargs.get("size", 100))])
            self.proposals += 1
            driver.propose(f"p{self.proposals}", stored.end)
            lines.append(f"p{self.proposals}: stored [{stored.position}, {stored.end})")
        return "\n".join(lines)

    def do_tick(self, args: list[str], kwargs: dict[str, str]) -> str:
        for _ in range(int(kwargs.get("n", 1))):
            for name in args:
                self.cores[name].tick()
        return ""

    def do_process(self, args: list[str], kwargs: dict[str, str]) -> str:
        return self._flush_ready(args or sorted(self.cores))

    def do_deliver(self, args: list[str], kwargs: dict[str, str]) -> str:
        """Deliver queued messages (to the named nodes only, if any; ``kind=K``: only
        messages of that kind), through the wire."""
        wanted = [m for m in self.network if (not args or m.dst in args)
                  and m.kind == kwargs.get("kind", m.kind)]
        self.network = [m for m in self.network if m not in wanted]
        lines = []
        for message in wanted:
            lines.append(f"{describe_message(message)}")
            if message.dst in self.cores:
                self.cores[message.dst].step(_through_the_wire(message))
        return "\n".join(lines)

    def do_drop(self, args: list[str], kwargs: dict[str, str]) -> str:
        dropped = [m for m in self.network if not args or m.dst in args]
        self.network = [m for m in self.network if m not in dropped]
        return "\n".join(f"dropped {describe_message(m)}" for m in dropped)

    def do_duplicate(self, args: list[str], kwargs: dict[str, str]) -> str:
        self.network += list(self.network)
        return ""

    def do_promote(self, args: list[str], kwargs: dict[str, str]) -> str:
        self.cores[args[0]].promote(kwargs.get("role", "SYNC_MASTER"),
                                    tuple(filter(None, kwargs.get("slaves", "").split(","))),
                                    epoch=int(kwargs.get("epoch", 0)))
        return self._flush_ready([args[0]])

    def do_restart(self, args: list[str], kwargs: dict[str, str]) -> str:
        """Close a node's store cleanly and start it again with a fresh core; ``as=ROLE``
        reconfigures it (an operator demoting an old master, say)."""
        name = args[0]
        self.stores.pop(name).close()
        if "as" in kwargs:  # (and forgets the role it saved: the operator's word wins)
            self.hard_states.pop(name, None)
            self.configs[name] = self.configs[name].replace(
                role=kwargs["as"], master=kwargs.get("master", ""), slaves=())
        self._start(name)
        return self._flush_ready([name])

    def do_crash(self, args: list[str], kwargs: dict[str, str]) -> str:
        """A power loss: the node's log keeps only what was flushed (its store runs with
        async flush and no flusher thread: only ``flush`` and its core's syncs flush),
        and it comes back through the engine's recovery, with its saved role state."""
        name = args[0]
        flushed, _kept = power_off(self.stores.pop(name), None)
        self._start(name)
        return f"{name}: lost power, kept [.., {flushed})\n" + self._flush_ready([name])

    def do_follow(self, args: list[str], kwargs: dict[str, str]) -> str:
        self.cores[args[0]].follow(kwargs["master"])
        return self._flush_ready([args[0]])

    def do_status(self, args: list[str], kwargs: dict[str, str]) -> str:
        lines = []
        for name in args or sorted(self.cores):
            core, store = self.cores[name], self.stores[name]
            lines.append(f"{name}: {core.role} epoch={core.epoch} written="
                         f"{store.written_position} epochs={store.epoch_starts()}")
            for slave, progress in sorted(core.slaves.items()):
                if progress.matched:
                    lines.append(f"  {slave}: acked={progress.acked} sent={progress.sent}")
        return "\n".join(lines)

    def do_compare(self, args: list[str], kwargs: dict[str, str]) -> str:
        """Whether the named nodes' logs are byte-identical up to the shortest (from the
        latest log start among them)."""
        ends = {name: self.stores[name].written_position for name in args}
        shortest = min(ends.values())
        start = max(self.stores[name].first_segment_base() for name in args)
        images = {_image(self.stores[name], start, shortest) for name in args}
        return (f"identical up to {shortest}" + (f" from {start}" if start else "")
                if len(images) == 1 else "DIFFERENT")

    def do_retain(self, args: list[str], kwargs: dict[str, str]) -> str:
        """Flush, then let retention go as far as it may; print the log's start."""
        lines = []
        for name in args:
            self.stores[name].flush()
            lines.append(f"{name}: log starts at {self.stores[name].apply_retention().log_start}")
        return "\n".join(lines)

    # --- carrying out a Ready ----------------------------------------------------------

    def _flush_ready(self, names: list[str]) -> str:
        lines = []
        for name in names:
            driver = self.drivers[name]
            driver.run()
            lines += [f"{name}: {line}" for line in driver.described]
        return "\n".join(lines)


def _through_the_wire(message: Message) -> Message:
    decoder = FrameDecoder(1 << 20)
    decoder.feed(wire_messages.encode(message))
    frame = decoder.next_frame()
    assert isinstance(frame, Frame) and decoder.buffered_size == 0
    return wire_messages.decode(frame)


def _image(store: mqlog.Store, start: int, end: int) -> bytes:
    chunks, position = [], start
    while position < end:
        data = store.read_raw(position, end - position)
        chunks.append(data[:end - position])
        position += len(data)
    return b"".join(chunks)


@pytest.mark.parametrize("script", SCRIPTS, ids=[path.stem for path in SCRIPTS])
def test_master_slave_script(script, tmp_path, impl):
    scripted.run_script(script, Interaction(tmp_path, impl))
