"""The Raft layer (DLedger-style): a sans-IO core; see core.py."""

from mqlog.replication.raft.core import RaftCore

__all__ = ["RaftCore"]
