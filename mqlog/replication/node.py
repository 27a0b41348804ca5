"""A replicated node: one store, one replication core, and the asyncio driver between
them and the network (``mqlog node --config node.toml``).

The node is the asyncio ``Io`` of the one driver (driver.py, DESIGN §5.1): every
``tick_ms`` it ticks the core; every message a peer sends is stepped in; once the loop
iteration's events are all in (every frame read together), the driver carries out the
core's Ready and asks this node to send, flush (on the store's flush thread: the loop
goes on meanwhile) and answer. A Ready that cannot be carried out stops the node loudly
(exit status 1): a restart runs the engine's recovery.

Connections. A node listens on one TCP address (127.0.0.1 in tests) for peers and
clients alike; the first frame of a connection says which it is. To send to a peer a
node opens its own connection, lazily, and drops it on any error: messages then lost
are the core's business (it retransmits, or says Hello again). Frames are checked by
the wire codec; a peer or client that sends garbage is disconnected.

Clients (``mqlog.Client``) send requests, one frame each, and get one response frame:

* ``produce`` {topic, queue_id, key, tags, sizes} + payload (the bodies, back to back;
  ``sizes`` lists their sizes) → {status, position, offset, count} once the role's rule is met
  (a SYNC_MASTER waits for its slaves); a slave answers with a NotMaster error.
* ``fetch`` {topic, queue_id, offset, max_count, max_bytes} → {next_offset, count} +
  the raw records (slaves serve fetches only with ``slave_read_enable``).
* ``metadata`` {} → the node's id, role, epoch and positions (``core.status()``).
* ``transfer`` {target} → a Raft leader hands leadership to voter ``target``.
Errors come back as {kind: "error", error: <class name>, message}; a NotLeader error also
names the ``leader`` and its ``leader_address`` when the node knows them.

Raft (``layer = "raft"``). The store's committed position is the group's commit
(``committed_follows = "external"``), the hard state lives in ``raft-state`` beside the
store (hardstate.py), and a produce with ``producer_id`` and ``sequence`` is idempotent:
the leader looks the pair up in its producer table (idempotence.py), rebuilt from its
log each time it gains leadership, and answers a retry with the first write's place.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mqlog import errors
from mqlog.config import ReplicationConfig, StoreConfig
from mqlog.engine.store import open as open_store
from mqlog.replication import core_for, hardstate, messages
from mqlog.replication.driver import Driver
from mqlog.replication.idempotence import Stored
from mqlog.replication.wire import Frame, FrameDecoder, encode_frame
from mqlog.results import PutStatus

_REPLICATION_KINDS = frozenset(messages.KINDS)
_READ_SIZE_BYTES = 1 << 20  # per read from a connection: requests read together go together


@dataclass(frozen=True)
class NodeConfig:
    """A node's place: its address, its data directory, its peers' addresses."""

    listen: str
    data_dir: Path
    peers: dict[str, str] = field(default_factory=dict)  # node id -> "host:port"
    slave_read_enable: bool = False
    group: str = ""  # the replica group's name in the route registry
    registries: tuple[str, ...] = ()  # route registries to register with ("host:port")
    topics: dict[str, int] = field(default_factory=dict)  # topic -> queues it serves
    register_interval_ms: int = 1_000
    replication: ReplicationConfig = field(default_factory=ReplicationConfig)
    store: StoreConfig = field(default_factory=StoreConfig)

    @classmethod
    def load(cls, path: str | Path) -> NodeConfig:
        """From a TOML file: ``[node]`` (id, listen, data_dir, role, master, slaves,
        in_sync_slaves_min, ..., and ``[node.peers]``) and ``[store]``."""
        try:
            document = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise errors.ConfigError(f"cannot read node config {path}: {error}") from None
        table = dict(document.get("node", {}))
        try:
            listen, data_dir = table.pop("listen"), Path(table.pop("data_dir"))
        except KeyError as missing:
            raise errors.ConfigError(f"{path}: [node] needs {missing}") from None
        peers = dict(table.pop("peers", {}))
        slave_read = bool(table.pop("slave_read_enable", False))
        routing = dict(group=str(table.pop("group", "")),
                       registries=tuple(table.pop("registries", ())),
                       topics={str(k): int(v) for k, v in table.pop("topics", {}).items()},
                       register_interval_ms=int(table.pop("register_interval_ms", 1_000)))
        if "id" in table:
            table["node_id"] = table.pop("id")
        for name in ("slaves", "voters", "learners"):
            if name in table:
                table[name] = tuple(table[name])
        try:
            replication = ReplicationConfig(**table).validate()
        except TypeError as error:
            raise errors.ConfigError(f"{path}: [node]: {error}") from None
        store = StoreConfig().replace(**document.get("store", {}))
        return cls(listen, data_dir, peers, slave_read, replication=replication, store=store,
                   **routing)  # type: ignore[arg-type]


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise errors.ConfigError(f"address {address!r} must be host:port")
    return host, int(port)


def unpack_bodies(payload: bytes, sizes: Any) -> list[bytes]:
    """The bodies of a produce request: ``payload`` cut at ``sizes``."""
    if type(sizes) is not list:
        raise errors.RemoteProtocolError("produce sizes must be a list of non-negative ints")
    if len(sizes) == 1 and sizes[0] == len(payload) and type(sizes[0]) is int:
        return [payload]  # the common case, checked at once
    if not all(type(size) is int and size >= 0 for size in sizes):
        raise errors.RemoteProtocolError("produce sizes must be a list of non-negative ints")
    if sum(sizes) != len(payload):
        raise errors.RemoteProtocolError(f"produce sizes add up to {sum(sizes)} bytes, its "
                                         f"payload has {len(payload)}")
    ends = list(itertools.accumulate(sizes))
    return [payload[end - size:end] for size, end in zip(sizes, ends, strict=True)]


class Node:
    """One running node; ``await node.serve()`` until ``node.stop()``."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.node_id = config.replication.node_id
        self.raft = config.replication.layer == "raft"
        store_config = config.store.replace(committed_follows="external") if self.raft \
            else config.store
        self.store = open_store(config.data_dir, store_config)
        try:
            core = self._new_core()
        except BaseException:
            self.store.close()
            raise
        self.driver = Driver(self.store, core, self,
                             window_bytes=config.replication.idempotence_window_bytes,
                             sequences_max=config.replication.idempotence_sequences_max)
        self.failure: BaseException | None = None
        self.peers = dict(config.peers)  # node id -> address; membership changes add more
        self._learn_addresses()
        self._waiting: dict[Any, asyncio.Future[PutStatus]] = {}
        self._outbound: dict[str, asyncio.StreamWriter] = {}
        self.dropped_sends: dict[str, int] = {}  # messages a slow peer's buffer refused
        self._connecting: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._scheduled = False
        self._requests = 0
        self._stopping = asyncio.Event()
        self._server: asyncio.Server | None = None

    @property
    def core(self) -> Any:
        return self.driver.core

    async def serve(self, ready: asyncio.Event | None = None) -> None:
        host, port = split_address(self.config.listen)
        self._server = await asyncio.start_server(self._connection, host, port,
                                                  limit=_READ_SIZE_BYTES)
        self.driver.run()  # a master already in its store's epoch takes writes at once
        ticker = asyncio.create_task(self._tick_forever())
        registering = asyncio.create_task(self._register_forever())
        if ready is not None:
            ready.set()
        try:
            await self._stopping.wait()
        finally:
            ticker.cancel()
            registering.cancel()
            self._server.close()
            for writer in self._outbound.values():
                writer.close()
            for future in self._waiting.values():
                future.cancel()
            try:
                self.store.close()
            except errors.MqlogError as error:
                if self.failure is None:
                    raise
                print(f"[{self.node_id}] closing the failed store: {error}", flush=True)

    def stop(self) -> None:
        self._stopping.set()

    def _new_core(self) -> Any:
        replication = self.config.replication
        if replication.layer != "raft":  # the role an operator gave it last wins
            return core_for(replication, self.store,
                            hard_state=hardstate.load_role(self.config.data_dir))
        # Unseeded on purpose: a real node's election jitter must differ from its peers'
        # (the simulator and the datadriven tests pass seeded generators).
        return core_for(replication, self.store, rng=random.Random(),
                        hard_state=hardstate.load(self.config.data_dir))

    # --- the driver loop ----------------------------------------------------------------

    async def _tick_forever(self) -> None:
        interval = self.config.replication.tick_ms / 1000
        while True:
            await asyncio.sleep(interval)
            self.driver.tick()
            self._schedule()

    async def _register_forever(self) -> None:
        """Tell each route registry who this node is, now and every interval."""
        config = self.config
        while config.registries:
            header = {"kind": "register", "group": config.group or self.node_id,
                      "node_id": self.node_id, "role": self.core.role,
                      "epoch": self.core.epoch, "address": config.listen,
                      "topics": config.topics}
            for address in config.registries:
                with contextlib.suppress(OSError, asyncio.TimeoutError):
                    await asyncio.wait_for(_request_once(address, header), timeout=5)
            await asyncio.sleep(config.register_interval_ms / 1000)

    def _schedule(self) -> None:
        """Carry out the core's Ready once this loop iteration's events are all in, so
        that writes and acks that arrive together are sent together."""
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._run_driver)

    def _run_driver(self) -> None:
        self._scheduled = False
        self.driver.run()

    # --- the driver's Io ------------------------------------------------------------------

    def send(self, outgoing: list[messages.Message]) -> None:
        self._send_all(outgoing)

    def save_hard_state(self, state: Any) -> None:
        hardstate.save(self.config.data_dir, state)
        self._learn_addresses()

    def start_flush(self, done: Any) -> None:
        self._spawn(self._flush(done))

    async def _flush(self, done: Any) -> None:
        try:
            await self.store.flush_async()
        except (errors.FlushFailed, errors.StoreFailed, errors.StoreClosed) as error:
            print(f"[{self.node_id}] a flush failed: {error}", flush=True)
            done(False)
            return
        done(True)
        self._schedule()  # a leader's own flush may let it commit

    def answer(self, request: Any, status: PutStatus) -> None:
        future = self._waiting.pop(request, None)
        if future is not None and not future.done():
            future.set_result(status)

    def note(self, event: str) -> None:
        print(f"[{self.node_id}] {event}", flush=True)

    def failed(self, error: BaseException) -> None:
        """A Ready could not be carried out: stop loudly; a restart runs recovery."""
        print(f"[{self.node_id}] FATAL: stopping: {error!r}", flush=True)
        self.failure = error
        self.stop()

    def _learn_addresses(self) -> None:
        """Addresses named by the group's membership changes (a node added later)."""
        for membership in getattr(self.core, "memberships", ()):
            for name, address in membership.addresses.items():
                if name != self.node_id:
                    self.peers.setdefault(name, address)

    def _send_all(self, outgoing: list[messages.Message]) -> None:
        """Send messages in order, one socket write per peer (a write is a system call).
        A peer that does not read what was sent (stopped, slow, or a stranger that only
        accepts) gets nothing more once ``peer_send_bytes_max`` is queued toward it: the
        messages are dropped and counted, and the cores resend what it still lacks."""
        by_peer: dict[str, list[messages.Message]] = {}
        for message in outgoing:
            by_peer.setdefault(message.dst, []).append(message)
        limit = self.config.replication.peer_send_bytes_max
        for peer, batch in by_peer.items():
            writer = self._outbound.get(peer)
            if writer is not None and not writer.is_closing():
                queued = writer.transport.get_write_buffer_size()
                data = b"".join(map(messages.encode, batch))
                if queued and queued + len(data) > limit:
                    self.dropped_sends[peer] = self.dropped_sends.get(peer, 0) + len(batch)
                    continue
                writer.write(data)
            elif peer not in self._connecting and peer in self.peers:
                self._connecting.add(peer)  # what else it had to say is lost: cores resend
                asyncio.get_running_loop().create_task(self._connect(batch[0]))

    async def _connect(self, first: messages.Message) -> None:
        try:
            host, port = split_address(self.peers[first.dst])
            _reader, writer = await asyncio.open_connection(host, port)
            self._outbound[first.dst] = writer
            writer.write(messages.encode(first))
        except OSError:
            pass  # down: the core will try again (retransmit, Hello)
        finally:
            self._connecting.discard(first.dst)

    # --- connections --------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder(self.config.replication.frame_size_bytes_max)
        try:
            while data := await reader.read(_READ_SIZE_BYTES):
                decoder.feed(data)
                produces = []
                while isinstance(frame := decoder.next_frame(), Frame):
                    kind = frame.header.get("kind")
                    if kind in _REPLICATION_KINDS:
                        self.driver.step(messages.decode(frame))
                        self._schedule()
                    elif kind == "produce":  # answered together with the others read here
                        produces.append(frame)
                    else:  # a client's request: answered when done, in any order
                        self._spawn(self._answer(frame, writer))
                if produces:
                    self._spawn(self._answer_produces(produces, writer))
        except (errors.RemoteProtocolError, ConnectionError) as error:
            print(f"[{self.node_id}] dropped a connection: {error}", flush=True)
        finally:
            writer.close()

    def _spawn(self, coroutine: Any) -> None:
        self._tasks.add(task := asyncio.create_task(coroutine))
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, frame: Frame, writer: asyncio.StreamWriter) -> None:
        try:
            header, payload = await self._request(frame.header.get("kind"), frame)
        except errors.MqlogError as error:
            header, payload = self._error_header(error), b""
        header["id"] = frame.header.get("id")
        await _write(writer, encode_frame(header, payload))

    def _error_header(self, error: errors.MqlogError) -> dict[str, Any]:
        header: dict[str, Any] = {"kind": "error", "error": type(error).__name__,
                                  "message": str(error)}
        if isinstance(error, errors.NotLeader) and error.leader:
            header["leader"] = error.leader
            header["leader_address"] = self.peers.get(error.leader)
        return header

    async def _answer_produces(self, frames: list[Frame], writer: asyncio.StreamWriter) -> None:
        """Produce requests that arrived together are stored, made durable, replicated
        and answered together — one flush wait, one proposal, one socket write (the
        shape of pebble's commit pipeline) — each with its own status or error."""
        answers, stored = [], []
        try:
            self.driver.check_writable()  # (once: nothing below can make it step down)
        except errors.MqlogError as error:
            answers = [(frame, self._error_header(error)) for frame in frames]
            frames = []
        for frame in frames:
            refused = self.core.may_accept(frame.header.get("acks", "replicated"))
            if refused is not PutStatus.PUT_OK:  # decided before storing: nothing stored
                answers.append((frame, {"kind": "produced", "status": refused.value,
                                        "position": -1, "offset": -1, "count": 0}))
                continue
            try:
                stored.append((frame, *self._store_request(frame.header, frame.payload)))
            except errors.MqlogError as error:
                answers.append((frame, self._error_header(error)))
        if stored:
            self._schedule()  # followers get the records while this node's flush runs
            answers += await self._settle(stored)
        for frame, header in answers:
            header["id"] = frame.header.get("id")
        await _write(writer, b"".join([encode_frame(header) for _, header in answers]))

    async def _settle(self, stored: list[tuple[Frame, Stored, str]]) -> list[tuple[Frame, dict]]:
        """Wait for the flush and (for acks=replicated) the layer's rule, for all at once.
        The proposal goes in before anything is awaited, while this node is surely still
        the leader that stored the records: a verdict cannot be missed by stepping down."""
        end = max(item.end for _, item, _ in stored)
        replicated = [item.end for _, item, acks in stored if acks == "replicated"]
        decision: asyncio.Future[PutStatus] | errors.MqlogError | None = None
        if replicated:
            try:
                decision = self._propose(max(replicated))
            except errors.MqlogError as error:
                decision = error
        durable = await self.store.flushed_async(end)
        flushed = self.store.flushed_position
        decided = await decision if isinstance(decision, asyncio.Future) else decision
        answers = []
        for frame, item, acks in stored:
            status = PutStatus.PUT_OK if durable or flushed >= item.end else \
                PutStatus.FLUSH_DISK_TIMEOUT
            if acks == "replicated" and status is PutStatus.PUT_OK:
                if isinstance(decided, errors.MqlogError):
                    answers.append((frame, self._error_header(decided)))
                    continue
                assert decided is not None
                status = decided
            answers.append((frame, {"kind": "produced", "status": status.value,
                                    "position": item.position, "offset": item.offset,
                                    "count": item.count}))
        return answers

    def _propose(self, end: int) -> asyncio.Future[PutStatus]:
        """Propose everything up to ``end``; the future has the layer's verdict."""
        self.driver.check_writable()  # (it may have stepped down since they were stored)
        request = self._new_request()
        future = self._waiting[request]
        try:
            self.driver.propose(request, end)
        except BaseException:
            self._waiting.pop(request)
            raise
        self._schedule()
        return future

    def _new_request(self) -> tuple[str, int]:
        """A request id, and the future its answer resolves."""
        self._requests += 1
        request = (self.node_id, self._requests)
        self._waiting[request] = asyncio.get_running_loop().create_future()
        return request


    async def _request(self, kind: Any, frame: Frame) -> tuple[dict[str, Any], bytes]:
        if kind == "fetch":
            return self._fetch(frame)
        if kind == "metadata":
            return self.metadata(), b""
        if kind in ("promote", "follow") and self.raft:
            raise errors.InvalidArgument(f"{kind} is an operator command of master-slave "
                                         "groups; a Raft group elects its leader (use "
                                         "transfer to move leadership)")
        if kind == "promote":
            return self._promote(frame.header), b""
        if kind == "follow":
            return self._follow(frame.header), b""
        if kind == "transfer":
            return self._transfer(frame.header), b""
        if kind == "membership":
            return await self._change_membership(frame.header), b""
        raise errors.RemoteProtocolError(f"unknown request kind {kind!r}")

    def _store_request(self, header: dict[str, Any], payload: bytes) -> tuple[Stored, str]:
        """Store one produce request's records (or find them: an idempotent retry);
        where they went, and what the client waits for. (The caller checked that this
        node leads.)"""
        bodies = unpack_bodies(payload, header.get("sizes"))
        if not bodies:
            raise errors.InvalidArgument("a produce request needs at least one body")
        acks = header.get("acks", "replicated")
        if acks != "replicated" and acks != "master":
            raise errors.InvalidArgument(f"acks must be 'replicated' or 'master', got {acks!r}")
        producer = _producer_tag(header)
        # (the store checks every field's type)
        return self.driver.write(header.get("topic"), bodies, header.get("queue_id", 0),
                                 header.get("key"), header.get("tags"), producer), acks

    def _fetch(self, frame: Frame) -> tuple[dict[str, Any], bytes]:
        if not self.core.is_master and not self.config.slave_read_enable:
            raise errors.NotMaster(f"node {self.node_id} is a slave and slave_read_enable "
                                   "is off; fetch from the master")
        header = frame.header
        records = self.store.get(header["topic"], header.get("queue_id", 0),
                                 header.get("offset", 0), header.get("max_count", 32),
                                 header.get("max_bytes", 1 << 20))
        next_offset = records[-1].offset + 1 if records else header.get("offset", 0)
        return ({"kind": "records", "count": len(records), "next_offset": next_offset},
                b"".join(record.raw for record in records))

    def _promote(self, header: dict[str, Any]) -> dict[str, Any]:
        """Operator command: this slave becomes master of ``slaves`` in a new epoch."""
        role, slaves = header.get("role", "SYNC_MASTER"), tuple(header.get("slaves", ()))
        if role not in ("ASYNC_MASTER", "SYNC_MASTER") or not all(
                isinstance(name, str) and name in self.config.peers for name in slaves):
            raise errors.InvalidArgument("promote needs role ASYNC_MASTER or SYNC_MASTER and "
                                         "slaves named in this node's [node.peers]")
        epoch = header.get("epoch", 0)
        if not isinstance(epoch, int) or epoch < 0:
            raise errors.InvalidArgument(f"epoch must be a non-negative int, got {epoch!r}")
        self.core.promote(role, slaves, epoch)
        self._schedule()
        return {"kind": "promoted", "role": role, "epoch": self.core.epoch}

    def _follow(self, header: dict[str, Any]) -> dict[str, Any]:
        """Operator command: this node becomes a slave of ``master`` (after a promotion
        elsewhere); a fresh core says Hello and is truncated if it diverged."""
        master = header.get("master")
        if master not in self.config.peers or master == self.node_id:
            raise errors.InvalidArgument(f"follow needs a master named in [node.peers], got "
                                         f"{master!r}")
        self.core.follow(master)
        # (what waited here was stored here; its fate on the new master is unknown)
        self.driver.abandon_waiting()
        self._schedule()
        return {"kind": "following", "master": master}

    def _transfer(self, header: dict[str, Any]) -> dict[str, Any]:
        """Operator command: a Raft leader hands leadership to voter ``target``."""
        target = header.get("target")
        if not self.raft:
            raise errors.InvalidArgument("transfer is an operator command of Raft groups")
        self.core.transfer_leadership(target)
        self._schedule()
        return {"kind": "transferring", "target": target, "term": self.core.epoch}

    async def _change_membership(self, header: dict[str, Any]) -> dict[str, Any]:
        """Operator command: a Raft leader changes the group's voters and learners (one
        voter at a time); answered once the change is committed."""
        voters: Any = header.get("voters")
        learners: Any = header.get("learners", [])
        addresses = header.get("addresses", {})
        if not self.raft or not _names(voters) or not _names(learners) or \
                not isinstance(addresses, dict) or not all(
                    isinstance(value, str) for value in addresses.values()):
            raise errors.InvalidArgument("membership needs a Raft group, voters and learners "
                                         "as lists of node ids, addresses as {id: host:port}")
        request = self._new_request()
        try:  # (proposed at once: it may commit, and this leader step down because of it,
            # before anything awaited here would return)
            self.driver.change_membership(request, tuple(voters), tuple(learners), addresses)
        except BaseException:
            self._waiting.pop(request)
            raise
        self._schedule()
        status = await self._waiting[request]
        return {"kind": "membership", "status": status.value, "voters": list(voters),
                "learners": list(learners)}

    def metadata(self) -> dict[str, Any]:
        queued = {peer: writer.transport.get_write_buffer_size()
                  for peer, writer in self._outbound.items() if not writer.is_closing()}
        return {"kind": "metadata", "node_id": self.node_id, "epoch": self.core.epoch,
                "log_start": self.store.first_segment_base(), "peers": dict(self.peers),
                "send_queued": queued, "send_dropped": dict(self.dropped_sends),
                **self.core.status()}


def _names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(name, str) and name for name in value)


def _producer_tag(header: dict[str, Any]) -> tuple[str, int] | None:
    producer_id, sequence = header.get("producer_id"), header.get("sequence")
    if producer_id is None and sequence is None:
        return None
    if not isinstance(producer_id, str) or not producer_id or " " in producer_id or \
            not isinstance(sequence, int) or isinstance(sequence, bool) or sequence < 0:
        raise errors.InvalidArgument("an idempotent produce needs producer_id, a non-empty "
                                     "string, and sequence, a non-negative int")
    return producer_id, sequence


async def _write(writer: asyncio.StreamWriter, data: bytes) -> None:
    if not writer.is_closing():
        writer.write(data)
        with contextlib.suppress(ConnectionError):
            await writer.drain()


async def _request_once(address: str, header: dict[str, Any]) -> Frame:
    """Open a connection, send one request, read one answer, close."""
    host, port = split_address(address)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(encode_frame(header))
        decoder = FrameDecoder(1 << 20)
        while not isinstance(frame := decoder.next_frame(), Frame):
            data = await reader.read(1 << 16)
            if not data:
                raise ConnectionResetError("the registry closed the connection")
            decoder.feed(data)
        return frame
    finally:
        writer.close()


def run_node(config: NodeConfig) -> None:
    """Serve until SIGTERM or SIGINT; used by ``mqlog node``."""
    node = Node(config)
    run_until_signalled(node, lambda: f"[{node.node_id}] {node.core.role} serving on "
                                      f"{config.listen}")
    if node.failure is not None:
        raise SystemExit(1)


def run_until_signalled(server: Any, banner: Any) -> None:
    """Run ``server.serve(ready)`` until SIGTERM or SIGINT calls ``server.stop()``; print
    ``banner()`` once it listens (tests and scripts wait for "serving on")."""
    import signal

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, server.stop)
        ready = asyncio.Event()
        serving = asyncio.create_task(server.serve(ready))
        await ready.wait()
        print(banner(), flush=True)
        with contextlib.suppress(asyncio.CancelledError):
            await serving

    asyncio.run(main())
