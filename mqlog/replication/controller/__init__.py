"""The controller: the cluster's metadata on a Raft group of mqlog's own (DESIGN §5.2).

records.py (the metadata records and their msgpack bodies), state.py (``ClusterMetadata``,
the pure fold of committed records), decisions.py (replica assignment, what fencing
changes), service.py (the controller replica: a Raft core run by the one driver over a
store whose records are metadata records).
"""

from mqlog.replication.controller.records import METADATA_TOPIC
from mqlog.replication.controller.state import ClusterMetadata, fold

__all__ = ["METADATA_TOPIC", "ClusterMetadata", "fold"]
