"""What the datadriven replication harnesses share (tests/test_raft.py, whose Interaction
test_isr.py extends, and tests/test_master_slave.py): a layer's nodes as real stores, each
with its core and the one driver, over an Io that is the test network.

``ScriptIo`` is the driver's world in a script: messages go to the test network (a script
delivers or drops them), a hard state is saved, and synced, the moment a Ready asks (kept
in ``hard_states``: what a restart starts from), and a flush is done at once. Stores have
no background threads, so a store is durable exactly up to where a Ready last asked.

``Interaction`` holds the nodes, their stores and the network of one script; a layer's
subclass adds its ``do_<command>`` methods. ``handle`` runs one command and turns a typed
error into output. ``run_script`` runs a whole file and ``outputs`` a list of cases (what a
broken core printed), each closing the stores however the run ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mqlog
from mqlog.config import ReplicationConfig
from mqlog.errors import MqlogError
from mqlog.replication.driver import Driver
from mqlog.replication.messages import Message
from tests import datadriven

STABILIZE_ROUNDS_MAX = 100  # of processing and delivering, before a script is said to loop


class ScriptIo:
    """The driver's world in a script: the test network, a hard state saved (and synced)
    in memory, a flush done at once."""

    def __init__(self, interaction: Interaction, name: str) -> None:
        self._interaction, self._name = interaction, name

    def send(self, messages: list[Message]) -> None:
        self._interaction.network += messages

    def save_hard_state(self, state: Any) -> None:
        self._interaction.hard_states[self._name] = state  # (a restart starts from it)

    def start_flush(self, done: Any) -> None:
        self._interaction.stores[self._name].flush()
        done(True)

    def answer(self, request: Any, status: Any) -> None:
        pass  # the driver's description prints it

    def note(self, event: str) -> None:
        pass  # likewise

    def failed(self, error: BaseException) -> None:
        self._interaction.drivers[self._name].described.append(f"stopped: {error!r}")

    def refused(self, error: BaseException) -> None:
        self._interaction.drivers[self._name].described.append(f"refused: {error!r}")


class Interaction:
    """The nodes, their stores and the network of one script."""

    def __init__(self, root: Path, impl: str) -> None:
        self.root, self.impl = root, impl
        self.stores: dict[str, mqlog.Store] = {}
        self.cores: dict[str, Any] = {}
        self.drivers: dict[str, Driver] = {}
        self.configs: dict[str, ReplicationConfig] = {}
        self.hard_states: dict[str, Any] = {}  # saved (synced) by a Ready
        self.network: list[Message] = []
        self.proposals = 0

    def close(self) -> None:
        for store in self.stores.values():
            store.close()

    def handle(self, command: str, args: list[str], kwargs: dict[str, str]) -> str:
        try:
            return getattr(self, f"do_{command.replace('-', '_')}")(args, kwargs) or ""
        except MqlogError as error:
            return f"error: {type(error).__name__}: {error}"

    def _up(self) -> list[str]:
        return sorted(self.cores)

    def _flush_ready(self, names: list[str]) -> str:
        raise NotImplementedError  # (a layer's: carry out each node's Ready, say what it did)

    def do_deliver(self, args: list[str], kwargs: dict[str, str]) -> str:
        raise NotImplementedError  # (a layer's: deliver the queued messages, say which)

    def do_stabilize(self, args: list[str], kwargs: dict[str, str]) -> str:
        """Process every node's Ready and deliver the messages until nothing happens."""
        lines = []
        for _ in range(STABILIZE_ROUNDS_MAX):
            output = self._flush_ready(self._up())
            delivered = self.do_deliver([], {})
            if not output and not delivered:
                return "\n".join(lines)
            lines += [text for text in (output, delivered) if text]
        raise AssertionError(f"did not stabilize in {STABILIZE_ROUNDS_MAX} rounds")

    def do_flush(self, args: list[str], kwargs: dict[str, str]) -> str:
        """The OS writes the named stores' pages out on its own: now durable."""
        for name in args:
            self.stores[name].flush()
        return ""

    def _lose_power(self, name: str) -> tuple[int, int]:
        """``name`` loses what no Ready synced (its log cut back to the flushed position),
        and its core and driver with it: (flushed, written) as they were."""
        store = self.stores.pop(name)
        durable, written = store.flushed_position, store.written_position
        if written > durable:
            store.truncate(durable)
        store.close()
        del self.cores[name], self.drivers[name]
        return durable, written


def run_script(path: Path, interaction: Interaction) -> None:
    """``path``'s script on ``interaction`` (datadriven.run_file), closed after."""
    try:
        datadriven.run_file(path, interaction.handle)
    finally:
        interaction.close()


def outputs(cases: list[datadriven.Case], interaction: Interaction) -> list[str]:
    """What ``interaction`` printed for each of ``cases``, in order, closed after."""
    try:
        return [interaction.handle(case.command, case.args, case.kwargs).rstrip("\n")
                for case in cases]
    finally:
        interaction.close()
