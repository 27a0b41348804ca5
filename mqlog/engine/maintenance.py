"""The store's background chores, on one thread: the indexer and retention.

Every ``index_interval_ms`` the key index catches up with the committed position; every
``retention_check_interval_ms`` a retention pass runs. A chore that fails (a damaged
record met by the indexer) is remembered in ``error`` and retried next time; the
same failure reaches a caller directly when a query runs the indexer itself.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from mqlog.errors import MqlogError

if TYPE_CHECKING:
    from mqlog.engine.store import Store


class Maintenance:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mqlog-maintenance",
                                        daemon=True)
        self.error: MqlogError | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        config = self._store.config
        next_retention = time.monotonic() + config.retention_check_interval_ms / 1000
        while not self._stopping.wait(config.index_interval_ms / 1000):
            try:
                index = self._store.key_index
                with index.lock:
                    index.catch_up()
                if time.monotonic() >= next_retention:
                    next_retention = time.monotonic() + \
                        config.retention_check_interval_ms / 1000
                    self._store.apply_retention()
                self.error = None
            except MqlogError as error:
                self.error = error
