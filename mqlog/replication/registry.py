"""The route registry: RocketMQ's NameServer idea for master-slave groups.

Nodes register themselves — group, node id, role, epoch, address, and the topics (with
their queue counts) their group serves — when they start and every
``register_interval_ms`` after; a node not heard from for ``node_timeout_ms`` is dropped
from the routes. Clients ask for a topic's route: every group that serves it, with its
queue count, its master's address (none while the group has no live master) and its
slaves' addresses. Registries keep no state on disk and do not talk to each other:
run several and give nodes and clients all of them, as with NameServers.

``Routes`` is the state, pure and clock-free (the caller passes the time); the server
answers ``register`` and ``route`` frames (docs/FORMAT.md) with ``mqlog registry``.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from mqlog import errors
from mqlog.replication.wire import Frame, FrameDecoder, encode_frame

MASTER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER", "LEADER")  # LEADER: a Raft group's


@dataclass
class Registration:
    group: str
    node_id: str
    role: str
    epoch: int
    address: str
    topics: dict[str, int]  # topic -> queue count
    heard_ms: int = 0


@dataclass
class Routes:
    node_timeout_ms: int = 10_000
    nodes: dict[str, Registration] = field(default_factory=dict)

    def register(self, header: dict[str, Any], now_ms: int) -> None:
        try:
            registration = Registration(
                str(header["group"]), str(header["node_id"]), str(header["role"]),
                int(header["epoch"]), str(header["address"]),
                {str(topic): int(count) for topic, count in dict(header["topics"]).items()},
                now_ms)
        except (KeyError, TypeError, ValueError) as error:
            raise errors.RemoteProtocolError(f"bad registration: {error!r}") from None
        self.nodes[registration.node_id] = registration

    def route(self, topic: str, now_ms: int) -> list[dict[str, Any]]:
        """Every group serving ``topic``: queue count, master address, slave addresses."""
        alive = [node for node in self.nodes.values()
                 if now_ms - node.heard_ms <= self.node_timeout_ms]
        groups: dict[str, dict[str, Any]] = {}
        for node in sorted(alive, key=lambda node: (node.group, node.node_id)):
            if topic not in node.topics:
                continue
            group = groups.setdefault(node.group, {"group": node.group, "queues": 0,
                                                   "master": None, "epoch": -1, "slaves": []})
            group["queues"] = max(group["queues"], node.topics[topic])
            if node.role in MASTER_ROLES and node.epoch > group["epoch"]:
                if group["master"] is not None:
                    group["slaves"].append(group["master"])
                group["master"], group["epoch"] = node.address, node.epoch
            else:
                group["slaves"].append(node.address)
        return list(groups.values())


class RegistryServer:
    """Serves ``Routes`` over TCP; ``await serve()`` until ``stop()``."""

    def __init__(self, listen: str, node_timeout_ms: int = 10_000,
                 frame_size_bytes_max: int = 1 << 20) -> None:
        self.listen = listen
        self.routes = Routes(node_timeout_ms)
        self._frame_size_bytes_max = frame_size_bytes_max
        self._stopping = asyncio.Event()

    async def serve(self, ready: asyncio.Event | None = None) -> None:
        from mqlog.replication.node import start_listening

        server = await start_listening(self.listen, self._connection)
        if ready is not None:
            ready.set()
        try:
            await self._stopping.wait()
        finally:
            server.close()

    def stop(self) -> None:
        self._stopping.set()

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder(self._frame_size_bytes_max)
        with contextlib.suppress(errors.RemoteProtocolError, ConnectionError):
            while data := await reader.read(1 << 16):
                decoder.feed(data)
                while isinstance(frame := decoder.next_frame(), Frame):
                    writer.write(encode_frame(self._answer(frame)))
                await writer.drain()
        writer.close()

    def _answer(self, frame: Frame) -> dict[str, Any]:
        now_ms = int(asyncio.get_running_loop().time() * 1000)
        kind, header = frame.header.get("kind"), frame.header
        try:
            if kind == "register":
                self.routes.register(header, now_ms)
                return {"kind": "registered", "id": header.get("id")}
            if kind == "route":
                return {"kind": "route", "id": header.get("id"),
                        "groups": self.routes.route(str(header.get("topic")), now_ms)}
            raise errors.RemoteProtocolError(f"unknown request kind {kind!r}")
        except errors.MqlogError as error:
            return {"kind": "error", "id": header.get("id"), "error": type(error).__name__,
                    "message": str(error)}


def run_registry(listen: str, node_timeout_ms: int) -> None:
    """Serve until SIGTERM or SIGINT; used by ``mqlog registry``."""
    from mqlog.replication.node import run_until_signalled

    run_until_signalled(RegistryServer(listen, node_timeout_ms),
                        lambda: f"[registry] serving on {listen}")
