"""Hosting the controller in a broker process, and a broker's side of the cluster.

``host_controller(broker)`` runs when a broker's ``process_roles`` has "controller": it
hosts the controller's Raft group (``__controller``, voters = the ``[controller] voters``
table, whose ids are broker ids) through ``broker.ensure_group``, puts a ``Controller``
(service.py) over that group's store and driver, calls it after every driver run and
every tick, and serves its requests (``register_broker``, ``broker_heartbeat``,
``create_topic``, ``delete_topic``, ``describe_cluster``, ``metadata_since``). A change
is answered once its record is committed and folded on the leader; if the leader loses
its leadership (or ``broker_session_timeout_ms`` passes) first, the answer is NodeUnavailable:
the outcome is unknown.

``join_cluster(broker)`` runs in a broker (role "broker", alone or combined) that knows
the controller quorum (the ``[controller] voters`` table): the broker's agent registers
(a new broker epoch per process life), heartbeats every ``broker_heartbeat_interval_ms``,
pulls the committed metadata since the position it has (records, or a snapshot when it
is too far behind), and hosts the Raft group of every ``raft``-layer partition the
metadata assigns to it (group ``TOPIC-PARTITION``, serving (topic, partition)); a deleted
topic's groups are dropped.
Clients ask any broker ``cluster_metadata`` (the agent's view: topics, partitions,
replicas, brokers and their addresses) and route by partition.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

from mqlog import errors
from mqlog.client import Client
from mqlog.replication.controller import records
from mqlog.replication.controller.config import CONTROLLER_GROUP, ControllerConfig
from mqlog.replication.controller.service import Controller, Proposal
from mqlog.replication.controller.state import ClusterMetadata

KINDS = ("register_broker", "broker_heartbeat", "create_topic", "delete_topic",
         "describe_cluster", "metadata_since")
_STORE: dict[str, Any] = dict(segment_size_bytes=64 << 20, message_size_bytes_max=8 << 20,
              flush_mode="sync")


def _reports_from(value: Any) -> dict[Any, Any]:
    """[[topic, partition, epoch, position], ...] -> {(topic, partition): (epoch, position)}
    (the controller checks the values' types)."""
    if value is None:
        return {}
    if not isinstance(value, list) or not all(
            isinstance(item, list) and len(item) == 4 for item in value):
        raise errors.InvalidArgument("reports must be a list of [topic, partition, epoch, "
                                     "position]")
    return {(item[0], item[1]): (item[2], item[3]) for item in value}


def _config(broker: Any) -> ControllerConfig:
    return ControllerConfig.from_table(dict(getattr(broker.config, "controller", {}) or {}))


def host_controller(broker: Any) -> Controller:
    """Host the controller group in ``broker`` and serve its requests (see the docstring)."""
    from mqlog.config import GroupSpec, StoreConfig

    config = _config(broker)
    if broker.broker_id not in config.voters:
        raise errors.ConfigError(f"[controller] voters {sorted(config.voters)} must name this "
                                 f"process ({broker.broker_id}): a controller is a voter")
    spec = GroupSpec.raft(CONTROLLER_GROUP, dict(config.voters), store=StoreConfig(**_STORE))
    replica = broker.ensure_group(spec)
    controller = Controller(config, replica.store, replica.driver,
                            tick_ms=spec.replication.tick_ms, rng=random.Random(),
                            note=lambda text: print(f"controller: {text}", flush=True))
    replica.on_run(controller.after_run)
    replica.on_tick(controller.tick)
    timeout_s = config.broker_session_timeout_ms / 1000

    async def settled(proposal: Proposal) -> dict[str, Any]:
        replica.schedule()
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        def finish(ok: bool) -> None:
            if not future.done():
                future.set_result(ok)
        controller.wait(proposal, finish)
        try:
            ok = await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            ok = False
        if not ok:
            raise errors.NodeUnavailable(
                "the controller lost its leadership (or took too long) before the change "
                "committed: its outcome is unknown; describe the cluster, then retry")
        return proposal.answer

    async def handle(header: dict[str, Any], payload: bytes) -> tuple[dict[str, Any], bytes]:
        arg: Callable[..., Any] = header.get  # (a missing argument is None: refused typed)
        kind = arg("kind")
        if kind == "describe_cluster":
            return controller.describe(), b""
        if kind == "metadata_since":
            return controller.metadata_since(arg("position")), b""
        if kind == "register_broker":
            proposal = controller.register_broker(arg("broker_id"),
                                                  arg("address"), arg("rack", ""))
        elif kind == "broker_heartbeat":
            reports = _reports_from(arg("reports"))
            proposal = controller.heartbeat(arg("broker_id"),
                                            arg("broker_epoch"), reports)
        elif kind == "create_topic":
            proposal = controller.create_topic(arg("name"), arg("partitions"),
                                               arg("replication_factor"),
                                               arg("layer", "raft"))
        else:
            proposal = controller.delete_topic(arg("name"))
        return await settled(proposal), b""

    broker.add_service(KINDS, handle)
    return controller


# --- a broker's side: register, heartbeat, pull, host what is assigned -----------------------


class BrokerAgent:
    """One broker's membership in the cluster (see the module docstring)."""

    def __init__(self, broker: Any, config: ControllerConfig) -> None:
        self.broker, self.config = broker, config
        self.view = ClusterMetadata()
        self.position = 0
        self.epoch: int | None = None
        self.hosted: set[str] = set()  # groups this agent opened
        self._leader: str | None = None  # the address that last answered a change
        self._addresses = list(config.voters.values())

    async def run(self) -> None:
        interval = self.config.broker_heartbeat_interval_ms / 1000
        while True:
            try:
                await self.round()
            except errors.MqlogError as error:
                print(f"broker {self.broker.broker_id}: cluster: {error}", flush=True)
                if "register again" in str(error):
                    self.epoch = None
            await asyncio.sleep(interval)

    async def round(self) -> None:
        broker = self.broker
        if self.epoch is None:
            answer = await self._ask({"kind": "register_broker", "broker_id": broker.broker_id,
                                      "address": broker.config.listen}, leader=True)
            self.epoch = answer["broker_epoch"]
        await self._ask({"kind": "broker_heartbeat", "broker_id": broker.broker_id,
                         "broker_epoch": self.epoch, "reports": self._reports()}, leader=True)
        answer = await self._ask({"kind": "metadata_since", "position": self.position},
                                 leader=False)
        self.fold(answer)
        self.host_assigned()

    def fold(self, answer: dict[str, Any]) -> None:
        if "snapshot" in answer:
            self.view = ClusterMetadata().apply(records.decode(answer["snapshot"]),
                                                answer["position"])
        for end, body in answer["records"]:
            self.view = self.view.apply(records.decode(body), end)
        self.position = answer["position"]

    def host_assigned(self) -> None:
        """ensure_group each Raft partition assigned here; drop those no longer assigned."""
        from mqlog.config import GroupSpec

        broker, wanted = self.broker, {}
        for topic in self.view.topics.values():
            if topic.layer != "raft":
                continue
            for index, part in enumerate(topic.partitions):
                if broker.broker_id in part.replicas:
                    voters = {name: self.view.brokers[name].address for name in part.replicas}
                    wanted[f"{topic.name}-{index}"] = GroupSpec.raft(
                        f"{topic.name}-{index}", voters, partitions=((topic.name, index),))
        for name, spec in wanted.items():
            try:
                broker.ensure_group(spec)
            except errors.InvalidArgument as error:  # (a replica moved: not handled yet)
                print(f"broker {broker.broker_id}: cannot host {name}: {error}", flush=True)
                continue
            self.hosted.add(name)
        for name in sorted(self.hosted - set(wanted)):
            broker.drop_group(name)
            self.hosted.discard(name)

    def _reports(self) -> list[list[Any]]:
        """(topic, partition, epoch, written position) of each group this broker hosts."""
        found = []
        for node in self.broker.groups.values():
            for topic, partition in node.spec.partitions:
                found.append([topic, partition, node.store.epoch, node.store.written_position])
        return found

    async def _ask(self, header: dict[str, Any], *, leader: bool) -> dict[str, Any]:
        order = ([self._leader] if leader and self._leader else []) + \
            random.sample(self._addresses, len(self._addresses))
        failures = []
        for address in order:
            try:
                answer = await asyncio.to_thread(_call, address, header)
            except errors.NotLeader as error:
                failures.append(f"{address}: {error}")
                if error.leader_address:
                    self._leader = error.leader_address
                continue
            except (errors.NodeUnavailable, errors.RemoteError) as error:
                failures.append(f"{address}: {error}")
                continue
            if leader:
                self._leader = address
            return answer
        raise errors.NodeUnavailable("no controller answered: " + "; ".join(failures))

    def describe(self) -> dict[str, Any]:
        return {"snapshot": records.encode(self.view.snapshot()), "position": self.position}


def _call(address: str, header: dict[str, Any]) -> dict[str, Any]:
    with Client(address, timeout_s=5.0) as client:
        return client.call(dict(header))[0]


def join_cluster(broker: Any) -> BrokerAgent:
    """Start ``broker``'s agent (see the module docstring); call on its loop."""
    agent = BrokerAgent(broker, _config(broker))

    async def handle(header: dict[str, Any], payload: bytes) -> tuple[dict[str, Any], bytes]:
        return agent.describe(), b""

    broker.add_service(("cluster_metadata",), handle)
    broker.spawn(agent.run())  # (cancelled when the broker stops)
    return agent
