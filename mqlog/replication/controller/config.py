"""``ControllerConfig``: the controller's limits and timeouts (the ``[controller]`` table of
a node config), validated as a whole; a misspelt key gets a suggestion, not a TypeError.

Time is in the controller group's ticks where the service counts it (a session is
measured by the controller leader's ticks, ``tick_ms`` each), in milliseconds in the
file, as Kafka names them (``broker_session_timeout_ms``, ``broker_heartbeat_interval_ms``).
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any

from mqlog.config import ReplicationConfig
from mqlog.errors import ConfigError

CONTROLLER_GROUP = "__controller"  # the controller's Raft group (and store directory)
_PERCENTAGES = ("leader_imbalance_per_broker_percentage",)  # ints that may be 0


@dataclass(frozen=True)
class ControllerConfig:
    voters: dict[str, str] = field(default_factory=dict)  # controller id -> host:port
    broker_session_timeout_ms: int = 9_000  # Kafka's default: fenced after this silence
    broker_heartbeat_interval_ms: int = 2_000  # Kafka's default: brokers heartbeat this often
    auto_failover: bool = False  # promote an in-sync slave when a master-slave master goes
    partitions_max: int = 1_024  # per topic
    replication_factor_max: int = 7
    topics_max: int = 10_000
    brokers_max: int = 1_024
    snapshot_interval_bytes: int = 1 << 20  # log written since the last snapshot -> one more
    pull_bytes_max: int = 1 << 20  # metadata log bytes one metadata_since answer carries
    requests_waiting_max: int = 1_024  # proposals waiting for their commit
    # ISR topics (Kafka's names; brokers' ISR cores and the controller's elections use them)
    min_insync_replicas: int = 1  # acks=all needs this many in ISR; the HW waits for them
    replica_lag_time_ms: int = 30_000  # a follower not caught up this long leaves the ISR
    # Followers' fetches (Kafka's replica.fetch.*; each ISR partition's fetch_wait_ms_max,
    # fetch_bytes_min, fetch_bytes_max): a fetch waits at the leader until min bytes are
    # there or wait max passed, and is answered at once if an acks=all write waits for it
    replica_fetch_wait_max_ms: int = 500
    replica_fetch_min_bytes: int = 1
    replica_fetch_max_bytes: int = 1 << 20
    unclean_leader_election: bool = False  # elect outside ISR and ELR: may lose records
    # Leader balancing (Kafka's names and defaults): every check interval, a broker whose
    # share of partitions led by another broker, among those it is the preferred (first)
    # replica of, is above the percentage gets them back (decisions.imbalanced)
    auto_leader_rebalance_enable: bool = True
    leader_imbalance_per_broker_percentage: int = 10  # 0..100; 0: any imbalance moves
    leader_imbalance_check_interval_ms: int = 300_000

    def validate(self) -> ControllerConfig:
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if item.type == "int" and (not isinstance(value, int) or isinstance(value, bool)
                                       or value < 1) and item.name not in _PERCENTAGES:
                raise ConfigError(f"[controller] {item.name} must be a positive integer, got "
                                  f"{value!r}")
        for name in _PERCENTAGES:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 100:
                raise ConfigError(f"[controller] {name} must be an integer 0..100 (a "
                                  f"percentage), got {value!r}")
        for name in ("auto_failover", "unclean_leader_election",
                     "auto_leader_rebalance_enable"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"[controller] {name} must be true or false, got "
                                  f"{getattr(self, name)!r}")
        if not isinstance(self.voters, dict) or not all(
                isinstance(key, str) and isinstance(value, str) and ":" in value
                for key, value in self.voters.items()):
            raise ConfigError("[controller] voters must map each controller id to its "
                              "host:port, e.g. voters = {c1 = \"127.0.0.1:7001\"}")
        if self.voters and len(self.voters) not in (1, 3, 5):
            raise ConfigError(f"[controller] has {len(self.voters)} voters: use 3 or 5 (1 "
                              "for a test), an odd count, so a majority survives failures")
        if self.broker_heartbeat_interval_ms * 2 > self.broker_session_timeout_ms:
            raise ConfigError("[controller] broker_session_timeout_ms must be at least twice "
                              "broker_heartbeat_interval_ms, or one late heartbeat fences")
        tick_ms = ReplicationConfig().tick_ms  # (an assigned ISR partition's)
        if self.replica_lag_time_ms <= self.replica_fetch_wait_max_ms + tick_ms:
            raise ConfigError(f"[controller] replica_lag_time_ms={self.replica_lag_time_ms} "
                              f"must exceed replica_fetch_wait_max_ms="
                              f"{self.replica_fetch_wait_max_ms} plus a tick ({tick_ms} ms): "
                              "an idle follower waiting on its fetch would leave the ISR (no "
                              "broker could host an ISR partition)")
        frame_max = ReplicationConfig().frame_size_bytes_max
        if self.replica_fetch_max_bytes + 4096 > frame_max:
            raise ConfigError(f"[controller] replica_fetch_max_bytes must leave 4 KiB of the "
                              f"frame_size_bytes_max={frame_max} for the frame header")
        return self

    def isr_settings(self) -> dict[str, Any]:
        """The ReplicationConfig fields every ISR partition takes from this table."""
        return {"min_insync_replicas": self.min_insync_replicas,
                "replica_lag_time_ms": self.replica_lag_time_ms,
                "fetch_wait_ms_max": self.replica_fetch_wait_max_ms,
                "fetch_bytes_min": self.replica_fetch_min_bytes,
                "fetch_bytes_max": self.replica_fetch_max_bytes}

    def session_ticks(self, tick_ms: int) -> int:
        """The session timeout in ticks of ``tick_ms`` (at least one)."""
        return max(1, -(-self.broker_session_timeout_ms // tick_ms))

    def balance_ticks(self, tick_ms: int) -> int:
        """The leader imbalance check interval in ticks of ``tick_ms`` (at least one)."""
        return max(1, -(-self.leader_imbalance_check_interval_ms // tick_ms))

    @classmethod
    def from_table(cls, table: dict[str, Any]) -> ControllerConfig:
        """Build from a TOML table; unknown keys are ConfigErrors with a suggestion."""
        names = [item.name for item in dataclasses.fields(cls)]
        for key in table:
            if key not in names:
                close = difflib.get_close_matches(key, names, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else \
                    f"; the keys are {', '.join(names)}"
                raise ConfigError(f"unknown key {key!r} in [controller]{hint}")
        return cls(**table).validate()
