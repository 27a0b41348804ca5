"""The controller: the cluster's metadata on a Raft group of mqlog's own (DESIGN §5.2).

records.py (the metadata records and their msgpack bodies), state.py (``ClusterMetadata``,
the pure fold of committed records), decisions.py (replica assignment, what fencing
changes), service.py (the controller replica: a Raft core run by the one driver over a
store whose records are metadata records), host.py (hosting it in a broker, and a
broker's agent: register, heartbeat, pull, host assigned partitions).
"""

from typing import Any

from mqlog.replication.controller.records import METADATA_TOPIC
from mqlog.replication.controller.state import ClusterMetadata, fold

__all__ = ["METADATA_TOPIC", "ClusterMetadata", "fold", "host_controller", "join_cluster"]


def host_controller(broker: Any) -> Any:
    """What a broker with the controller role calls (host.py; loaded only then)."""
    from mqlog.replication.controller import host
    return host.host_controller(broker)


def join_cluster(broker: Any) -> Any:
    """A broker's agent: register, heartbeat, pull metadata, host its partitions."""
    from mqlog.replication.controller import host
    return host.join_cluster(broker)
