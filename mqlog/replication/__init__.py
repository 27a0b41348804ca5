"""Replication: the wire, the sans-IO cores (master_slave/; isr/ and raft/ to come) and
the drivers that run them (DESIGN §5).

``core_for(config, log)`` picks the core of the configured ``layer``; drivers (the node,
the simulator) know only the shared shape: tick, step, propose, ready, advance.
"""

from __future__ import annotations

from typing import Any


def core_for(config: Any, log: Any, **options: Any) -> Any:
    """The replication core of ``config.layer`` over ``log``."""
    from mqlog.replication.master_slave import MasterSlaveCore

    cores = {"master_slave": MasterSlaveCore}
    return cores[config.layer](config, log, **options)
