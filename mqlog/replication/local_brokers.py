"""Local brokers, each hosting several Raft groups, as real `mqlog node` processes on
127.0.0.1 (tests and benchmarks): it writes each broker's TOML with ``[groups.NAME]``
tables, starts, kills and stops the processes, and waits for conditions with deadlines."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from mqlog.client import Client
from mqlog.errors import MqlogError
from mqlog.replication.local import NodeProcesses, _toml_list, free_ports, wait_until


@dataclass
class LocalBrokers(NodeProcesses):
    """Brokers ``b1``..``bN``, each a voter of every Raft group ``g1``..``gM``."""

    root: Path
    size: int = 3
    group_count: int = 3
    store_settings: str = "segment_size_bytes = 67108864\nflush_mode = \"sync\""
    node_settings: str = "election_timeout_ticks = 30\nheartbeat_ticks = 5"
    cluster_id: str = "local"
    ports: dict[str, int] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [f"b{index}" for index in range(1, self.size + 1)]

    @property
    def groups(self) -> list[str]:
        return [f"g{index}" for index in range(1, self.group_count + 1)]

    def address(self, name: str) -> str:
        return f"127.0.0.1:{self.ports[name]}"

    @property
    def addresses(self) -> list[str]:
        return [self.address(name) for name in self.names]

    def write_configs(self) -> None:
        if not self.ports:
            self.ports = dict(zip(self.names, free_ports(len(self.names)), strict=True))
        self.root.mkdir(parents=True, exist_ok=True)
        for name in self.names:
            peers = "\n".join(f'{other} = "{self.address(other)}"'
                              for other in self.names if other != name)
            groups = "".join(f"[groups.{group}]\nlayer = \"raft\"\npartitions = "
                             f"[[\"{group}-topic\", 0]]\n" for group in self.groups)
            (self.root / f"{name}.toml").write_text(
                f'[node]\nid = "{name}"\nlisten = "{self.address(name)}"\n'
                f'data_dir = "{self.root / name}"\ncluster_id = "{self.cluster_id}"\n'
                f"voters = {_toml_list(self.names)}\n{self.node_settings}\n"
                f"[node.peers]\n{peers}\n[store]\n{self.store_settings}\n{groups}")

    def start_all(self) -> None:
        self.write_configs()
        for name in self.names:
            self.start(name)

    def broker_metadata(self, name: str, timeout_s: float = 10) -> dict:
        with Client(self.address(name), timeout_s=timeout_s) as client:
            return client.call({"kind": "broker_metadata"})[0]

    def leaders(self, among: list[str] | None = None) -> dict[str, str]:
        """Group -> the broker leading its newest term, among those that answer."""
        found: dict[str, tuple[int, str]] = {}
        for name in among or list(self.processes):
            try:
                facts = self.broker_metadata(name, timeout_s=2)
            except (OSError, MqlogError):
                continue
            for group, status in facts["groups"].items():
                if status["role"] == "LEADER" and status["term"] > found.get(group, (-1, ""))[0]:
                    found[group] = (status["term"], name)
        return {group: name for group, (_, name) in found.items()}

    def wait_leaders(self, among: list[str] | None = None, timeout_s: float = 60.0) -> dict:
        wait_until(lambda: len(self.leaders(among)) == self.group_count,
                   "a leader in every group", timeout_s)
        return self.leaders(among)

    def wait_converged(self, timeout_s: float = 60.0) -> None:
        """Every running broker holds the same log of each group and committed all of it."""
        def converged() -> bool:
            facts = [self.broker_metadata(name)["groups"] for name in self.processes]
            return all(len({(f[group]["written"], f[group]["commit"]) for f in facts}) == 1
                       and facts[0][group]["commit"] == facts[0][group]["written"]
                       for group in self.groups)
        wait_until(converged, "every group's replicas to converge", timeout_s)

    def __enter__(self) -> LocalBrokers:
        self.start_all()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop_all()
