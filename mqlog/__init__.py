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

from mqlog import errors
from mqlog.client import Client  # noqa: E402,I001  (after the engine: it builds on it)
from mqlog.config import StoreConfig
from mqlog.engine.recovery import RecoveryReport
from mqlog.engine.store import Store, open
from mqlog.ext import IMPLEMENTATION
from mqlog.group_client import GroupClient  # noqa: E402,I001
from mqlog.results import BatchPutResult, PutResult, PutStatus
from mqlog.routing import Producer, SendResult  # noqa: E402,I001

__all__ = [
    "IMPLEMENTATION",
    "BatchPutResult",
    "Client",
    "GroupClient",
    "PutResult",
    "Producer",
    "PutStatus",
    "RecoveryReport",
    "SendResult",
    "Store",
    "StoreConfig",
    "errors",
    "open",
]
__version__ = "0.1.0"
