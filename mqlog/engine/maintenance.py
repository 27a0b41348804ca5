"""The store's background chores, on one thread: the indexer and retention.

Every ``index_interval_ms`` the key index catches up with the committed position; every
``retention_check_interval_ms`` a retention pass runs. The two chores fail apart: a
failing indexer (a damaged record, an EIO sealing an index file, an assertion racing a
truncation) never stops retention, and the reverse. A failure of any kind, not only an
MqlogError, is remembered in ``error`` (the Store shows it as ``maintenance_error``),
counted in ``failure_count`` and logged on the ``mqlog`` logger (once while it
repeats); the chore is retried next time, and the thread never dies of it (issue 14:
it used to, silently, and retention never ran again). The same failure reaches a
caller directly when a query runs the indexer itself.

With ``background_threads = False`` there is no thread: the owner calls ``run_once``.
It is handed only what its chores need (the config, the key index, and the store's
retention pass), never the store.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mqlog.config import StoreConfig
    from mqlog.engine.index import KeyIndex

_log = logging.getLogger("mqlog")


class Maintenance:
    def __init__(self, config: StoreConfig, index: KeyIndex,
                 retention: Callable[[], object]) -> None:
        self._config = config
        self._index_files = index
        self._retention = retention
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mqlog-maintenance",
                                        daemon=True)
        self.error: BaseException | None = None  # the last chore's failure, if it failed
        self.failure_count = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        config = self._config
        next_retention = time.monotonic() + config.retention_check_interval_ms / 1000
        while not self._stopping.wait(config.index_interval_ms / 1000):
            indexed = self._chore("indexer", self._index)
            if time.monotonic() >= next_retention:
                next_retention = time.monotonic() + \
                    config.retention_check_interval_ms / 1000
                if self._chore("retention", self._retention) and indexed:
                    self.error = None
            elif indexed:
                self.error = None

    def _index(self) -> None:
        index = self._index_files
        with index.lock:
            index.catch_up()

    def _chore(self, name: str, chore: Callable[[], object]) -> bool:
        """Run one chore; a failure is remembered and logged, never raised."""
        try:
            chore()
            return True
        except Exception as error:  # noqa: BLE001 (the thread must outlive any failure)
            if self._stopping.is_set():
                return False  # (closing: the store's files may be going away)
            news = repr(error) != repr(self.error)  # (a failure on every pass: log it once)
            self.error = error
            self.failure_count += 1
            if news:
                _log.warning("mqlog %s failed (retried in the next pass): %r", name, error,
                             exc_info=error)
            return False

    def run_once(self, retention: bool) -> None:
        """One round from the owner (``background_threads = False``): the indexer, and
        retention if asked; failures as on the thread."""
        indexed = self._chore("indexer", self._index)
        if (not retention or self._chore("retention", self._retention)) and indexed:
            self.error = None
