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
