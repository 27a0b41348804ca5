"""mqlog: a message-log storage engine for Python.

Embed a store and use it directly — no server::

    import mqlog

    with mqlog.open("data/") as store:
        result = store.put("orders", b"hello", key="order-1", tags="created")
        for record in store.get("orders", queue_id=0, offset=0):
            print(record.offset, record.key, record.body)

``IMPLEMENTATION`` says which log core is live: "cython" (the C extension) or "python"
(its pure-Python twin; ``MQLOG_PUREPYTHON=1`` selects it).
"""

from typing import TYPE_CHECKING, Any

from mqlog import errors
from mqlog.config import StoreConfig
from mqlog.engine.recovery import RecoveryReport
from mqlog.engine.store import Store, open
from mqlog.ext import IMPLEMENTATION
from mqlog.results import BatchPutResult, PutResult, PutStatus

if TYPE_CHECKING:
    from mqlog.client import Client
    from mqlog.cluster_client import ClusterClient, ProducedRecord
    from mqlog.group_client import GroupClient
    from mqlog.replication.idempotence import new_producer_epoch
    from mqlog.routing import Producer, SendResult

# The clients load asyncio and the replication layers: only when first asked for, so an
# embedded store (DESIGN §2: ``import mqlog`` loads neither) starts in milliseconds.
_LAZY = {"Client": "mqlog.client", "GroupClient": "mqlog.group_client",
         "ClusterClient": "mqlog.cluster_client", "ProducedRecord": "mqlog.cluster_client",
         "Producer": "mqlog.routing", "SendResult": "mqlog.routing",
         "new_producer_epoch": "mqlog.replication.idempotence"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mqlog' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value

__all__ = [
    "IMPLEMENTATION",
    "BatchPutResult",
    "Client",
    "ClusterClient",
    "GroupClient",
    "PutResult",
    "Producer",
    "ProducedRecord",
    "PutStatus",
    "RecoveryReport",
    "SendResult",
    "Store",
    "StoreConfig",
    "errors",
    "new_producer_epoch",
    "open",
]
__version__ = "0.1.0"
