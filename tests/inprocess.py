"""Clusters of in-process brokers on 127.0.0.1, each a ``Broker`` on its own event loop
and thread, for the tests that stop and start brokers without processes
(test_controller_cluster, test_isr_cluster, test_isr_client, test_isr_min_insync,
test_cluster_client_pipeline, test_router, test_controller_balancing,
test_controller_unclean; test_broker runs one ``BrokerThread`` alone). The controller
requests they make are tests/processes.py's, the same for every cluster test.

Shapes. ``configs(root, combined)`` is Kafka's two: three brokers b1..b3 that are each a
controller voter too (combined mode), or three controllers c1..c3 beside them (stopping
two brokers then leaves the controller quorum whole); other names give other sizes.
Keyword arguments add to (or replace) the ``[controller]`` table: a short session timeout
by default, so fencing is seen soon. ``Cluster(configs)`` starts and stops any of them
by name; used in a ``with`` it starts them all and stops what still runs when the block
ends, however it ends.

Loops. A ``BrokerThread`` runs its broker's ``serve`` on an ``asyncio.Runner``, as
``mqlog node`` runs it under ``asyncio.run``: once ``serve`` ends, the runner cancels every
task still on the loop and waits for them (a connection accepted in the loop's last
iterations, whose handler never started; a client's connection still open), shuts down
the default executor (the broker agent's controller calls run there) and only then
closes the loop. A loop closed with tasks pending leaves their coroutines to the garbage
collector, whose warnings ("coroutine 'Broker._accepted' was never awaited", "Task was
destroyed but it is pending") then surface inside whatever runs next; on CPython 3.11
one raised inside a compile failed pytest's summary (gh-106905)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from mqlog.config import BrokerConfig
from mqlog.replication.broker import Broker
from mqlog.replication.local import free_ports
from tests.processes import BROKERS, SESSION_MS

CONTROLLERS = ("c1", "c2", "c3")
HEARTBEAT_MS = 200  # broker_heartbeat_interval_ms: several beats within SESSION_MS
LOOP_WAIT_S = 30.0  # for a broker's loop to start, stop, or run one call


class BrokerThread:
    """A Broker serving on its own loop in a thread; ``call(fn)`` runs fn on that loop."""

    def __init__(self, config: BrokerConfig) -> None:
        self.broker = Broker(config)
        self.loop: asyncio.AbstractEventLoop | None = None  # (the runner's, once started)
        self.thread = threading.Thread(target=self._run, name=config.broker_id, daemon=True)
        self.ready = threading.Event()

    def _run(self) -> None:
        async def main() -> None:
            ready = asyncio.Event()
            serving = asyncio.create_task(self.broker.serve(ready))
            await ready.wait()
            self.ready.set()
            await serving

        with asyncio.Runner() as runner:  # (its close: the tasks left, the executor, the loop)
            self.loop = runner.get_loop()
            runner.run(main())

    def call(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        async def run() -> Any:
            return function(*args, **kwargs)

        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=LOOP_WAIT_S)

    def start(self) -> BrokerThread:
        self.thread.start()
        assert self.ready.wait(timeout=LOOP_WAIT_S), f"{self.thread.name} did not start"
        return self

    def stop(self) -> None:
        if self.thread.is_alive():
            assert self.loop is not None
            self.loop.call_soon_threadsafe(self.broker.stop)
            self.thread.join(timeout=LOOP_WAIT_S)
            assert not self.thread.is_alive(), f"{self.thread.name} did not stop"

    def __enter__(self) -> BrokerThread:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def configs(root: Path, combined: bool = False, *, brokers: tuple[str, ...] = BROKERS,
            controllers: tuple[str, ...] = CONTROLLERS,
            **controller: Any) -> dict[str, BrokerConfig]:
    """``brokers`` (and the controller voters too if ``combined``), else ``controllers``
    beside them (controllers only); ``controller``: more keys of every node's
    [controller] table."""
    voters = brokers if combined else controllers
    names = brokers if combined else (*controllers, *brokers)
    ports = free_ports(len(names))
    addresses = {name: f"127.0.0.1:{port}" for name, port in zip(names, ports, strict=True)}
    table = {"voters": {name: addresses[name] for name in voters},
             "broker_session_timeout_ms": SESSION_MS,
             "broker_heartbeat_interval_ms": HEARTBEAT_MS, **controller}
    roles = {name: ("broker", "controller") if combined else
             ("controller",) if name in controllers else ("broker",) for name in names}
    return {name: BrokerConfig(broker_id=name, listen=addresses[name], data_dir=root / name,
                               peers=addresses, process_roles=roles[name],
                               controller=table).validate() for name in names}


class Cluster:
    """The brokers of ``configs``, each on a ``BrokerThread`` while it runs."""

    def __init__(self, configs: dict[str, BrokerConfig]) -> None:
        self.configs = configs
        self.threads: dict[str, BrokerThread] = {}

    @property
    def controllers(self) -> list[str]:
        """The controller voters' addresses."""
        return [config.listen for config in self.configs.values()
                if "controller" in config.process_roles]

    def addresses(self, names: tuple[str, ...] | list[str] = BROKERS) -> list[str]:
        return [self.configs[name].listen for name in names]

    def start(self, *names: str) -> None:
        for name in names or self.configs:
            self.threads[name] = BrokerThread(self.configs[name]).start()

    def stop(self, *names: str) -> None:
        for name in names or list(self.threads):
            self.threads.pop(name).stop()

    def leader(self) -> str:
        """The controller that leads now."""
        return next(name for name, thread in self.threads.items()
                    if "__controller" in thread.broker.groups
                    and thread.broker.groups["__controller"].driver.serving)

    def __enter__(self) -> Cluster:
        try:
            self.start()
        except BaseException:
            self.stop()  # (the ones that started)
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

