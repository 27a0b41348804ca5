"""Replication: the wire, the sans-IO cores (master_slave/, raft/, isr/) and
the drivers that run them (DESIGN §5).

``core_for(config, log)`` picks the core of the configured ``layer``; drivers (the node,
the simulator) know only the shared shape: tick, step, propose, ready, advance.
"""

from __future__ import annotations

from typing import Any


def core_for(config: Any, log: Any, **options: Any) -> Any:
    """The replication core of ``config.layer`` over ``log``; ``options`` are the layer's
    own (Raft: ``rng``, ``hard_state``; ISR: ``metadata``; all: ``test_break``)."""
    from mqlog.replication.isr import IsrCore
    from mqlog.replication.master_slave import MasterSlaveCore
    from mqlog.replication.raft import RaftCore

    cores: dict[str, Any] = {"master_slave": MasterSlaveCore, "raft": RaftCore,
                             "isr": IsrCore}
    return cores[config.layer](config, log, **options)
