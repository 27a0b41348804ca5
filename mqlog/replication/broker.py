"""A broker: one process, one asyncio loop, hosting one or more replica groups
(``mqlog node --config node.toml``; DESIGN §5.2).

Groups. Each hosted group is a ``Node`` (node.py): its own store directory
(``data_dir/GROUP/``; the one group of a single-group config keeps ``data_dir`` itself),
its own core and its own Driver (driver.py, the one executor of a Ready). The broker owns
what they share: the listening socket, the connections, the address book of the other
brokers. Groups come from the config at start and come and go at runtime through
``ensure_group(GroupSpec)`` and ``drop_group(name)`` (the controller's commands).

Ticks. One ``Ticker`` per ``tick_ms`` ticks every group of that ``tick_ms`` in one pass,
on one loop timer: a started group joins it, a closed (dropped) one leaves it, and a
broker with no group has no timer. Each group's order within a pass is its own: tick its
core, its tick callbacks, schedule its driver run (node.py). An idle broker's cost is
then a wake-up per tick plus a few attribute reads per group, not a timer, a task step
and a driver run per group per tick.

Peer connections. Exactly one TCP connection joins two brokers, whatever the number of
groups they share, and carries every group's messages both ways. A broker dials a peer
when it has something to send and no connection to it; its first frame is ``peer_hello``
{broker_id, cluster_id}, answered by the acceptor's own ``peer_hello``. The acceptor
refuses (closes, counts) a hello from another cluster, from itself, or from a broker it
knows nothing of (not in its address book nor in any hosted group), and a replication
frame that comes before any hello. When both brokers dialed at once, both keep the
connection dialed by the smaller broker id and close the other: each side decides alone
and they agree. Each replication frame names its group (header key ``group``; missing:
the broker's ``default_group``, which is how a single-group broker's frames look, byte
for byte as before). A message for a group this broker does not
host, or whose sender is not the broker at the other end, is dropped and counted (a group
may be created or dropped on one side first: the cores resend). Garbage — a bad frame, a
malformed message, a client request on a peer connection — closes that one connection;
the other peers and every group go on. A connection that breaks is dropped; the next
message to that peer dials again, at most once per ``peer_redial_interval_ms`` (what was
lost meanwhile the cores resend). Bytes
queued toward a peer slow to read are bounded by ``peer_send_bytes_max``: past it,
messages to that peer are dropped and counted.

Clients. Any other connection is a client's: a request (one frame) names its group with
the header key ``group``; without one it goes to the group serving its (topic, queue_id)
(``GroupSpec.partitions``), else to the default group, else UnknownGroup. Produce requests
read together for one group are answered together (node.py). ``broker_metadata`` answers
the broker's own facts: its groups and their roles, its peer connections and counters.
Kinds registered with ``add_service`` (the controller's requests) go to their handler.

Failure. A group whose Ready cannot be carried out stops the whole broker loudly (exit
status 1): the groups share a process, and a restart runs the engine's recovery on each.
A broker its cluster refuses for good (``cannot_run``: controllers of another cluster, or
its id held by another live process) stops too, and ``mqlog node`` ends with that
refusal's one line, status 1.

The data_dir's lock. A broker holds ``data_dir/broker.lock`` (flock, as a store holds its
own ``lock``) from before it opens any store until it has closed them all, and writes its
pid, id and address in it. A second process given the same data_dir (a copied config)
is refused at once, ``DataDirLocked`` naming the holder, before it opens a store or reads
one's abort marker: it opened the live broker's stores beside it, took them for a crash's
("stores not closed cleanly"), and then fought it for its broker id. The lock is the
process's own: a child forked from it lets go of its copy (never of the parent's lock).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import resource
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from mqlog import errors
from mqlog.config import DATA_DIR_LOCK_FILE, BrokerConfig, GroupSpec
from mqlog.engine.files import FileExtent, LockFile, LockHeld, delete_store
from mqlog.ext import libc
from mqlog.replication import messages
from mqlog.replication.connection import BACKED_UP, BUSY, Connection
from mqlog.replication.node import (
    Node,
    error_answer,
    run_until_signalled,
    split_address,
    start_listening,
)
from mqlog.replication.wire import RECEIVE_KEPT_BYTES, Frame, encode_frame

__all__ = ["Broker", "GroupSpec", "run_broker"]

PEER_HELLO = "peer_hello"
_REPLICATION_KINDS = frozenset(messages.KINDS)
_DIAL_TIMEOUT_S = 5.0  # a peer that does not accept within this is down for now
# malloc's heap serves blocks up to this (frames are at most frame_size_bytes_max, 16 MiB
# by default) and keeps this much freed: see keep_freed_buffers in run_broker.
_HEAP_BLOCK_BYTES_MAX = 32 << 20
_HEAP_KEPT_BYTES = 64 << 20


Handler = Callable[[dict[str, Any], bytes], Awaitable[tuple[dict[str, Any], bytes]]]


@dataclass
class PeerLink:
    """The one connection to a peer broker, and who dialed it."""

    peer: str
    dialer: str
    writer: Connection
    confirmed: bool  # the acceptor's peer_hello came back (always, on the acceptor's side)


@dataclass
class PeerCounters:
    """What happened on the connections to one peer broker (``broker_metadata``)."""

    dialed: int = 0  # connections this broker opened to it
    accepted: int = 0  # connections it opened that this broker accepted
    duplicates_closed: int = 0  # a second connection of the pair, closed
    protocol_errors: int = 0  # connections closed because it sent garbage
    dropped_messages: int = 0  # messages its full send buffer refused
    misaddressed: int = 0  # messages for no hosted group, or not from it
    messages_sent: int = 0  # replication messages written to it
    writes: int = 0  # socket writes that carried them (one per peer per loop iteration)
    bytes_sent: int = 0
    bytes_sent_from_file: int = 0  # ... of them sent by sendfile (large fetch answers)


class Ticker:
    """Ticks every group of one ``tick_ms`` that a broker hosts, in one pass per tick: one
    loop timer for them all, not one per group (an idle group's tick is a few attribute
    reads; a timer wake-up and a task step per group per tick were most of an idle
    broker's CPU). Each group in turn, in the order they started: its tick (core, tick
    callbacks, its driver run scheduled if needed: ``Node.tick``). A group added during a
    pass is ticked from the next one; a group removed during a pass (dropped by an
    earlier group's tick callback) is not ticked again. A group whose tick raises is
    removed, the error reported to the loop's exception handler, and the others go on:
    as when each group had its own task, which that error ended."""

    def __init__(self, tick_ms: int) -> None:
        self.interval_s = tick_ms / 1000
        self.nodes: dict[Node, None] = {}  # (a dict: ordered, and a removal is O(1))
        self.passes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._passing = False

    def add(self, node: Node) -> None:
        """Tick ``node`` from the next pass on (call on the broker's running loop)."""
        self.nodes[node] = None
        self._arm()

    def remove(self, node: Node) -> None:
        self.nodes.pop(node, None)
        if not self.nodes:
            self.stop()  # (no group: no wake-ups)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        """The next pass an interval from now (as each group's sleep after its tick was),
        unless one is due already or this is a pass (it arms the next when it ends)."""
        if self._timer is None and not self._passing:
            self._timer = asyncio.get_running_loop().call_later(self.interval_s, self._pass)

    def _pass(self) -> None:
        self._timer, self._passing = None, True
        self.passes += 1
        nodes = self.nodes
        try:
            for node in list(nodes):
                if node in nodes:
                    self._tick(node)
        finally:
            self._passing = False
        if nodes:
            self._arm()

    def _tick(self, node: Node) -> None:
        try:
            node.tick()
        except Exception as error:  # noqa: BLE001 (one group's bug ends its ticks only)
            self.remove(node)
            asyncio.get_running_loop().call_exception_handler({
                "message": f"group {node.name} stopped ticking", "exception": error})


class Broker:
    """One running broker; ``await broker.serve()`` until ``broker.stop()``."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.broker_id = config.broker_id
        self.peers = {name: address for name, address in config.peers.items()
                      if name != config.broker_id}  # broker id -> host:port
        self.groups: dict[str, Node] = {}
        self.routes: dict[tuple[str, int], str] = {}  # (topic, queue_id) -> group
        # An ISR leader's AlterPartition (node, request) goes to the controller through
        # this (join_cluster sets it); without one it is dropped, and noted.
        self.alter_partition: Callable[[Any, Any], None] | None = None
        self.services: dict[str, Handler] = {}
        self.failure: BaseException | None = None
        self.counters: dict[str, PeerCounters] = {}
        self.refused = 0  # peers refused: another cluster, a stranger, or no peer_hello
        self.connections_refused = 0  # accepted past connections_max, and closed
        self.connections_max = _connections_max(config.connections_max)
        self._links: dict[str, PeerLink] = {}
        self._connections: set[Connection] = set()  # every open one: aborted at the stop
        self._dialing: set[str] = set()
        self._opening: set[str] = set()  # groups whose stores open on a thread now
        self._dial_after: dict[str, float] = {}  # peer -> loop time its next dial may start
        # peer -> frames of this loop iteration, in pieces (messages.encode_pieces)
        self._outbox: dict[str, list[tuple[bytes | FileExtent, ...]]] = {}
        self._flush_token = 0  # the outbox write placed last (only that one writes)
        self._flush_pending = False  # a write of the outbox is placed and not yet run
        self._tasks: set[asyncio.Task[None]] = set()
        self.tickers: dict[int, Ticker] = {}  # tick_ms -> the groups ticked every tick_ms
        self._stopping = asyncio.Event()
        self._running = False
        self.exit_error: errors.MqlogError | None = None  # cannot_run's: mqlog node's line
        # (first of all: a second process on this data_dir opens no store, nor looks at one)
        self._data_dir_lock = lock_data_dir(config.data_dir, config.broker_id, config.listen)
        try:
            for spec in config.groups:
                self._open(spec)
        except BaseException:
            try:
                for node in self.groups.values():
                    node.close()
            finally:
                self._data_dir_lock.release()
            raise

    # --- groups ------------------------------------------------------------------------

    def ensure_group(self, spec: GroupSpec) -> Node:
        """Host ``spec``'s group (opening its store: recovery runs, on the loop) unless it
        is hosted already with an equal spec; call on the broker's loop. A store that may
        take long to recover: ``ensure_group_async``."""
        spec = spec.for_broker(self.broker_id)
        existing = self._check_new(spec)
        if existing is not None:
            return existing
        return self._started(self._register(Node(spec, self)))

    async def ensure_group_async(self, spec: GroupSpec) -> Node:
        """``ensure_group`` with the store opened (and recovered) on a thread: the loop,
        and every other group's ticks and messages, go on meanwhile."""
        spec = spec.for_broker(self.broker_id)
        existing = self._check_new(spec)
        if existing is not None:
            return existing
        if spec.name in self._opening:
            raise errors.InvalidArgument(f"group {spec.name!r} is being opened already")
        self._opening.add(spec.name)
        try:
            node = await asyncio.get_running_loop().run_in_executor(None, Node, spec, self)
        finally:
            self._opening.discard(spec.name)
        try:
            self._check_new(spec)  # (nothing else may have taken its name or partitions)
        except errors.MqlogError:
            node.close()
            raise
        return self._started(self._register(node))

    def _check_new(self, spec: GroupSpec) -> Node | None:
        """The group already hosted with this spec, None if it may be added, else raise."""
        existing = self.groups.get(spec.name)
        if existing is not None:
            if existing.spec == spec:
                return existing
            if dataclasses.replace(existing.spec, addresses=spec.addresses) == spec:
                return self._moved_members(existing, spec)
            raise errors.InvalidArgument(
                f"group {spec.name!r} is hosted here with another spec; drop_group it first "
                "(a Raft group's members change through a membership change)")
        if len(self.groups) + len(self._opening) >= self.config.groups_max:
            raise errors.InvalidArgument(f"broker {self.broker_id} hosts groups_max="
                                         f"{self.config.groups_max} groups already")
        for partition in spec.partitions:
            if self.routes.get(partition, spec.name) != spec.name:
                raise errors.InvalidArgument(
                    f"{partition} is served by group {self.routes[partition]!r} already")
        return None

    def _moved_members(self, node: Node, spec: GroupSpec) -> Node:
        """The same group, some of whose members listen elsewhere now (a broker that
        registered again at another address): the group goes on, and those members are
        dialed where they listen. Refused as "another spec", the partitions this broker
        shares with a moved one were never handed a decision again, and one was left
        without a working leader (a hostile review)."""
        for name, address in spec.addresses.items():
            if node.spec.addresses.get(name) != address:
                self.follow_registration(name, address)
        node.spec = spec
        return node

    def _started(self, node: Node) -> Node:
        if self._running:
            node.start()
        return node

    def drop_group(self, name: str, delete_data: bool = False) -> None:
        """Stop hosting group ``name``: what waits on it is answered FLUSH_SLAVE_TIMEOUT
        (its fate is unknown), its store is closed, and deleted if ``delete_data``."""
        node = self.groups.pop(name, None)
        if node is None:
            raise errors.UnknownGroup(f"broker {self.broker_id} hosts no group {name!r}")
        self.routes = {key: group for key, group in self.routes.items() if group != name}
        node.close()
        if delete_data:
            try:
                delete_store(node.store_dir)
            except OSError as error:  # (a group of that name hosted again deletes it then)
                print(f"broker {self.broker_id}: cannot delete {node.store_dir}: {error}",
                      flush=True)

    def add_service(self, kinds: tuple[str, ...], handler: Handler) -> None:
        """Client requests of these kinds go to ``handler(header, payload)``, whose answer
        (header, payload) goes back; an mqlog error it raises goes back typed."""
        for kind in kinds:
            if kind in _REPLICATION_KINDS or kind in (PEER_HELLO, "broker_metadata"):
                raise errors.InvalidArgument(f"{kind!r} is the broker's own request kind")
            self.services[kind] = handler

    def _open(self, spec: GroupSpec) -> Node:
        return self._register(Node(spec.for_broker(self.broker_id), self))

    def _register(self, node: Node) -> Node:
        spec = node.spec
        self.groups[spec.name] = node
        for partition in spec.partitions:
            self.routes[partition] = spec.name
        for name, address in spec.addresses.items():
            self.learn_address(name, address)
        return node

    def start_ticking(self, node: Node) -> None:
        """Tick ``node`` with the other groups of its ``tick_ms`` (its start)."""
        tick_ms = node.replication.tick_ms
        ticker = self.tickers.get(tick_ms)
        if ticker is None:
            ticker = self.tickers[tick_ms] = Ticker(tick_ms)
        ticker.add(node)

    def stop_ticking(self, node: Node) -> None:
        """Tick ``node`` no more (it closed: dropped, or the broker stops)."""
        ticker = self.tickers.get(node.replication.tick_ms)
        if ticker is not None:
            ticker.remove(node)

    def learn_address(self, name: str, address: str) -> None:
        if name != self.broker_id:
            self.peers.setdefault(name, address)

    def follow_registrations(self, addresses: Mapping[str, str]) -> None:
        """Where the controller's metadata says each broker listens (``follow_registration``
        of each)."""
        for name, address in addresses.items():
            self.follow_registration(name, address)

    def follow_registration(self, name: str, address: str) -> None:
        """Broker ``name`` registered at ``address``: dial it there (``set_address``),
        unless this broker's ``[peers]`` table names where to dial it — an operator's
        address wins (a proxy, a NAT; the fault proxies of the process tests)."""
        if name not in self.config.peers:
            self.set_address(name, address)

    # --- running -------------------------------------------------------------------------

    async def serve(self, ready: asyncio.Event | None = None) -> None:
        try:
            server = await start_listening(self.config.listen, protocol=self._connection)
        except BaseException:  # (CannotListen, say)
            self._close_groups()  # (their stores were opened by __init__: unlock them)
            raise
        try:  # (a hook that fails, a bad [controller] table, closes what is open too)
            self._running = True
            for node in list(self.groups.values()):
                node.start()
            if "controller" in self.config.process_roles:
                _controller_hook(self, "host_controller")
            if "broker" in self.config.process_roles and "voters" in self.config.controller:
                _controller_hook(self, "join_cluster")
            if ready is not None:
                ready.set()
            await self._stopping.wait()
        finally:
            self._running = False
            server.close()
            for connection in list(self._connections):
                connection.abort()
            for task in list(self._tasks):
                task.cancel()
            for ticker in self.tickers.values():
                ticker.stop()
            self._close_groups()

    def _close_groups(self) -> None:
        """Close every group, even past one whose store fails to close (raised after),
        then let go of the data_dir's lock: the broker is over."""
        failure: BaseException | None = None
        for node in self.groups.values():
            try:
                node.close()
            except Exception as error:  # noqa: BLE001 (the others must close too)
                failure = failure or error
        self._data_dir_lock.release()  # (last: no store of this data_dir is open now)
        if failure is not None:
            raise failure

    def stop(self) -> None:
        self._stopping.set()

    def failed(self, error: BaseException) -> None:
        """A group could not carry out a Ready: the broker stops (exit status 1)."""
        self.failure = error
        self.stop()

    def cannot_run(self, error: errors.MqlogError) -> None:
        """The broker cannot run as configured, and waiting cannot change that (its
        cluster refused it for good: controllers of another cluster_id, or its id held by
        another live process): it stops, its stores closed cleanly, and ``mqlog node``
        ends with ``error``'s one line, status 1 (``run_broker``)."""
        self.failure = self.exit_error = error
        self.stop()

    def banner(self) -> str:
        """The line printed once it listens (scripts and tests wait for "serving on")."""
        if list(self.groups) == [self.config.default_group]:  # a single-group node
            role = self.groups[self.config.default_group].core.role
            return f"[{self.broker_id}] {role} serving on {self.config.listen}"
        return (f"[{self.broker_id}] broker serving on {self.config.listen}, groups: "
                f"{', '.join(sorted(self.groups)) or '-'}")

    def spawn(self, coroutine: Any) -> asyncio.Task[None]:
        """Run ``coroutine`` as a task of the broker: cancelled when the broker stops."""
        self._tasks.add(task := asyncio.create_task(coroutine))
        task.add_done_callback(self._tasks.discard)
        return task

    _spawn = spawn

    @property
    def stopping(self) -> asyncio.Event:
        """Set once the broker is asked to stop."""
        return self._stopping

    def set_address(self, name: str, address: str) -> None:
        """Broker ``name`` listens at ``address`` now (it registered anew, elsewhere): the
        connection to its old address, if any, is closed; the next message dials anew."""
        if name == self.broker_id or self.peers.get(name) == address:
            return
        self.peers[name] = address
        link = self._links.pop(name, None)
        if link is not None:
            link.writer.close()

    # --- sending ---------------------------------------------------------------------------

    def send(self, group: str, outgoing: list[messages.Message], topic_id: int = 0) -> None:
        """Send a group's messages in order. They wait in a per-peer outbox until the
        loop has run the callbacks scheduled before its write (the other groups' driver
        runs among them: ``flush_behind``), then go in one socket write per peer (a write
        is a system call); see the module docstring for what is dropped. ``topic_id``:
        the group's topic id, which the receiving group must have too (GroupSpec.topic_id)."""
        if not outgoing:
            return  # nothing to send: no write to schedule
        tag = "" if group == self.config.default_group else group
        if not self._flush_pending:
            self.flush_behind()
        outbox = self._outbox
        for message in outgoing:
            pieces = messages.encode_pieces(message, tag, topic_id)  # (first: one that
            # cannot be encoded leaves no empty outbox entry behind it)
            outbox.setdefault(message.dst, []).append(pieces)

    def flush_behind(self) -> None:
        """Place the outbox's write behind every callback scheduled so far. A group that
        schedules its driver run places one behind it: what the run sends leaves in that
        loop iteration, not in the next one (a loop iteration and its poll less for
        each fetch a follower sends, each answer a leader does). Only the write placed
        last runs, so the groups scheduled in between still share one write per peer."""
        self._flush_token += 1
        self._flush_pending = True
        asyncio.get_running_loop().call_soon(self._write_outbox, self._flush_token)

    def _write_outbox(self, token: int) -> None:
        if token != self._flush_token:
            return  # (a later one writes)
        self._flush_pending = False
        outbox, self._outbox = self._outbox, {}
        limit = self.config.peer_send_bytes_max
        for peer, frames in outbox.items():
            link = self._links.get(peer)
            if link is not None and not link.writer.is_closing():
                queued = link.writer.write_buffer_size()
                pieces = [piece for frame in frames for piece in frame]
                size = sum(map(len, pieces))
                if queued and queued + size > limit:
                    self._counters(peer).dropped_messages += len(frames)
                    continue
                from_file = link.writer.sent_from_file
                link.writer.write_frames(pieces)
                counters = self._counters(peer)
                counters.bytes_sent_from_file += link.writer.sent_from_file - from_file
                counters.messages_sent += len(frames)
                counters.writes += 1
                counters.bytes_sent += size
            elif peer not in self._dialing and peer in self.peers and \
                    (now := asyncio.get_running_loop().time()) >= self._dial_after.get(peer, 0):
                # At most one dial per interval: a peer that is down or refuses this one
                # (another cluster) is not dialed on every tick of every group.
                self._dial_after[peer] = now + self.config.peer_redial_interval_ms / 1000
                self._dialing.add(peer)  # what else it had to say is lost: cores resend
                self._spawn(self._dial(peer, frames[0]))

    def send_counters(self, peers: Any) -> tuple[dict[str, int], dict[str, int]]:
        """Bytes queued toward each of ``peers``, and messages dropped for them."""
        queued = {peer: link.writer.write_buffer_size()
                  for peer, link in self._links.items()
                  if peer in peers and not link.writer.is_closing()}
        dropped = {peer: counters.dropped_messages for peer, counters in self.counters.items()
                   if peer in peers and counters.dropped_messages}
        return queued, dropped

    def _counters(self, peer: str) -> PeerCounters:
        counters = self.counters.get(peer)
        if counters is None:
            counters = self.counters[peer] = PeerCounters()
        return counters

    def _hello(self) -> bytes:
        return encode_frame({"kind": PEER_HELLO, "broker_id": self.broker_id,
                             "cluster_id": self.config.cluster_id})

    async def _dial(self, peer: str, first: tuple[bytes | FileExtent, ...]) -> None:
        try:
            host, port = split_address(self.peers[peer])
            _, connection = await asyncio.wait_for(asyncio.get_running_loop().create_connection(
                lambda: self._connection(peer), host, port), _DIAL_TIMEOUT_S)
        except (TimeoutError, OSError, errors.ConfigError):
            return  # down: the core will try again (retransmit, Hello)
        finally:
            self._dialing.discard(peer)
        self._counters(peer).dialed += 1
        if connection.is_closing():  # (lost before this resumed: never a link)
            return
        connection.write(self._hello())
        if not self._adopt(connection.link):
            connection.close()
            return
        connection.write_frames(first)

    def _adopt(self, link: PeerLink) -> bool:
        """Make ``link`` the one connection to its peer, unless the one in place wins: of
        two, the one dialed by the smaller broker id stays (both sides agree)."""
        current = self._links.get(link.peer)
        if current is not None and not current.writer.is_closing():
            self._counters(link.peer).duplicates_closed += 1
            preferred = min(self.broker_id, link.peer)
            if current.dialer == preferred and link.dialer != preferred:
                return False
            current.writer.close()
        self._links[link.peer] = link
        return True

    # --- receiving -------------------------------------------------------------------------

    def _connection(self, peer: str = "") -> Connection:
        """A new connection: one this broker dials to ``peer``, or accepts (no peer)."""
        return Connection(self, self.config.frame_size_bytes_max, peer)

    def connected(self, connection: Connection) -> None:
        if not self._running:  # (accepted as serve() ended: nothing would close it)
            connection.abort()
            return
        if not connection.peer and len(self._connections) >= self.connections_max:
            self.connections_refused += 1  # (said at 1, 2, 4, 8...: a flood is no log flood)
            if self.connections_refused & (self.connections_refused - 1) == 0:
                print(f"broker {self.broker_id}: {len(self._connections)} connections are "
                      f"open, connections_max={self.connections_max}: closed a new one "
                      f"({self.connections_refused} so far)", flush=True)
            connection.abort()
            return
        self._connections.add(connection)
        if connection.peer:  # (dialed: the peer speaks only once it has this one's hello)
            _linked(connection, PeerLink(connection.peer, self.broker_id, connection,
                                         confirmed=False))

    def received(self, connection: Connection) -> None:
        """Handle every whole frame received; garbage closes the connection."""
        try:
            self._frames(connection)
        except errors.RemoteProtocolError as error:
            link = connection.link
            if link is not None:
                self._counters(link.peer).protocol_errors += 1
            print(f"[{self.broker_id}] dropped a connection"
                  f"{f' to {link.peer}' if link else ''}: {error}", flush=True)
            connection.close()

    def lost(self, connection: Connection) -> None:
        self._connections.discard(connection)
        link = connection.link
        if link is not None and self._links.get(peer := link.peer) is link:
            del self._links[peer]

    def _frames(self, connection: Connection) -> None:
        """Handle every whole frame received (a peer_hello makes the connection a peer's:
        ``connection.link``), or as many of a client's as may be in progress (the rest
        wait in its decoder: ``_served`` takes them up again). Produce requests read
        together are answered together — those read before garbage too (a request read
        is handled, however the bytes after it were split)."""
        produces: dict[str, list[Frame]] = {}
        decoder, taken = connection.decoder, connection.requests_in_progress
        limit = self.config.client_requests_in_progress_max
        try:
            while not connection.reading_held and \
                    isinstance(frame := decoder.next_frame(), Frame):
                if self._take(connection, frame, produces):
                    taken += 1
                    if taken >= limit:
                        connection.hold_reading(BUSY)
        finally:
            for name, frames in produces.items():
                node = self.groups[name]
                self._serve(connection, partial(node._answer_produces, frames, connection),
                            len(frames), node._spawn,
                            partial(node.refuse_closing, frames, connection))

    def _take(self, connection: Connection, frame: Frame,
              produces: dict[str, list[Frame]]) -> bool:
        """Handle one frame; whether it is a client's request (counted in progress; a
        produce goes to ``produces``, by group)."""
        kind = frame.header.get("kind")
        if connection.link is not None:  # a peer connection: replication messages only
            self._from_peer(connection.link, frame)
            return False
        if not isinstance(kind, str | None):  # (a list is no kind: garbage, not a crash)
            raise errors.RemoteProtocolError(f"a frame's kind must be a string, not {kind!r}")
        if kind == PEER_HELLO:
            _linked(connection, self._greeted(frame.header, connection))
            return False
        if kind in _REPLICATION_KINDS:
            self.refused += 1  # (a peer that skipped the handshake is refused too)
            raise errors.RemoteProtocolError(f"a {kind} message on a connection that did "
                                             "not start with peer_hello")
        if kind == "produce":  # answered together with the others read here
            try:
                produces.setdefault(self._group_for(frame.header).name, []).append(frame)
            except errors.MqlogError as error:
                self._serve(connection, partial(self._answer_error, frame, connection, error))
        else:  # a client's request: answered when done, in any order
            self._serve(connection, partial(self._answer, frame, connection))
        return True

    def _serve(self, connection: Connection, answer: Callable[[], Awaitable[None]],
               count: int = 1,
               spawn: Callable[[Any], asyncio.Task[None]] | None = None,
               refuse: Callable[[], None] | None = None) -> None:
        """Answer ``count`` requests of a client's ``connection`` (``answer()``) in a task
        (the broker's, or ``spawn``'s: a group's, cancelled when it closes: ``refuse()``
        then answers them if ``answer()`` had not begun), counted in progress till it
        ends."""
        connection.requests_in_progress += count
        began = False  # answer() began: it answers then, cancelled or not

        def begin() -> None:
            nonlocal began
            began = True

        def done(task: asyncio.Task[None]) -> None:
            if refuse is not None and task.cancelled() and not began:
                refuse()  # (cancelled before it began, or while it waited to)
            self._served(connection, count)

        task = (spawn or self._spawn)(_once_drained(connection, answer, begin))
        task.add_done_callback(done)

    def _served(self, connection: Connection, count: int) -> None:
        connection.requests_in_progress -= count
        if connection.requests_in_progress < self.config.client_requests_in_progress_max:
            connection.release_reading(BUSY)

    def _check_hello(self, header: dict[str, Any]) -> str:
        """The peer a ``peer_hello`` names, or RemoteProtocolError (counted) if refused."""
        peer, cluster = header.get("broker_id"), header.get("cluster_id")
        reason = ""
        if not isinstance(peer, str) or not peer or peer == self.broker_id:
            reason = f"a peer_hello names broker {peer!r}"
        elif cluster != self.config.cluster_id:
            reason = (f"broker {peer} is of cluster {cluster!r}, this one of "
                      f"{self.config.cluster_id!r}")
        elif peer not in self.peers and not any(
                peer in node.spec.members or peer in node.peers for node in self.groups.values()):
            reason = f"broker {peer} is not in [node.peers] nor a member of a hosted group"
        if reason:
            self.refused += 1
            raise errors.RemoteProtocolError(f"refused a peer: {reason}")
        assert isinstance(peer, str)
        return peer

    def _greeted(self, header: dict[str, Any], writer: Connection) -> PeerLink:
        """A peer dialed this broker: answer its hello; the connection is theirs now."""
        peer = self._check_hello(header)
        writer.write(self._hello())
        self._counters(peer).accepted += 1
        link = PeerLink(peer, peer, writer, confirmed=True)
        if not self._adopt(link):
            writer.close()  # (what it sent meanwhile is still read and stepped)
        return link

    def _from_peer(self, link: PeerLink, frame: Frame) -> None:
        header = frame.header
        if header.get("kind") == PEER_HELLO:  # the acceptor's answer to this broker's dial
            if link.confirmed or self._check_hello(header) != link.peer:
                raise errors.RemoteProtocolError(f"{link.peer} answered with a second or "
                                                 f"another broker's peer_hello: {header}")
            link.confirmed = True
            return
        if header.get("kind") not in _REPLICATION_KINDS:
            raise errors.RemoteProtocolError(f"peer {link.peer} sent {header.get('kind')!r} "
                                             "on a peer connection")
        routed = route_peer_frame(self.groups, self.config.default_group, link.peer, frame)
        if routed is None:
            self._counters(link.peer).misaddressed += 1
            return
        node, message = routed
        node.driver.step(message)
        node.took(message)

    # --- client requests ---------------------------------------------------------------------

    def _group_for(self, header: dict[str, Any]) -> Node:
        """The group a client's request is for (see the module docstring)."""
        name = header.get("group")
        if name is None:
            try:
                key: Any = (header.get("topic"), header.get("queue_id", 0))
                name = self.routes.get(key, self.config.default_group)
            except TypeError:  # an unhashable topic: the store refuses it by name
                name = self.config.default_group
        node = self.groups.get(name) if isinstance(name, str) else None
        if node is None:
            raise errors.UnknownGroup(
                f"broker {self.broker_id} hosts no group {name!r} (it hosts "
                f"{', '.join(sorted(self.groups)) or 'none'}); name one in the request")
        return node

    async def _answer(self, frame: Frame, writer: Connection) -> None:
        kind = frame.header.get("kind")
        try:
            if kind == "broker_metadata":
                header, payload = self.metadata(), b""
            elif kind in self.services:
                header, payload = await self.services[kind](dict(frame.header), frame.payload)
            else:
                await self._group_for(frame.header)._answer(frame, writer)
                return
        except errors.MqlogError as error:
            await self._answer_error(frame, writer, error)
            return
        header["id"] = frame.header.get("id")
        await writer.answer(encode_frame(header, payload))

    async def _answer_error(self, frame: Frame, writer: Connection,
                            error: errors.MqlogError) -> None:
        header = error_answer(error, self.peers.get)
        header["id"] = frame.header.get("id")
        await writer.answer(encode_frame(header))

    def metadata(self) -> dict[str, Any]:
        """The broker's facts: its groups, its peer connections and their counters."""
        links = {}
        for peer, link in self._links.items():
            if not link.writer.is_closing():
                local = link.writer.get_extra_info("sockname")
                remote = link.writer.get_extra_info("peername")
                links[peer] = {"dialer": link.dialer, "confirmed": link.confirmed,
                               "local": f"{local[0]}:{local[1]}",
                               "remote": f"{remote[0]}:{remote[1]}"}
        groups = {name: {"layer": node.spec.replication.layer, "node_id": node.node_id,
                         **node.core.status()} for name, node in self.groups.items()}
        return {"kind": "broker_metadata", "broker_id": self.broker_id,
                "listen": self.config.listen, "process_roles": list(self.config.process_roles),
                "default_group": self.config.default_group, "groups": groups,
                "peers": dict(self.peers), "links": links, "refused": self.refused,
                "counters": {peer: dataclasses.asdict(counters)
                             for peer, counters in self.counters.items()}}


async def _once_drained(connection: Connection, answer: Callable[[], Awaitable[None]],
                        begin: Callable[[], None]) -> None:
    """Handle a client's request only while its connection's answers do not back up:
    tasks run one at a time, so at most one answer is made past the transport's
    high-water mark, not one for every request in progress (a fetch answer may be a
    megabyte). A request read is handled even if its connection is lost meanwhile (an
    acks=0 write, sent just before the client closed, is stored)."""
    with contextlib.suppress(ConnectionError):  # (lost: drain() raises, and the loop ends)
        while connection.backed_up:  # (woken with others, it may find it backed up again)
            await connection.drain()
    begin()
    await answer()  # (made now: a task cancelled before leaves no coroutine unawaited)


def _linked(connection: Connection, link: PeerLink) -> None:
    """``connection`` is ``link``'s now: its receive buffer is kept between its frames
    (fetch answers and Entries are large and steady; a client's buffer is let go), and it
    is never held back (connection.py says why)."""
    connection.link = link
    connection.decoder.keep_bytes = RECEIVE_KEPT_BYTES
    connection.holds_back = False  # (a peer link: connection.py says why)
    connection.release_reading(BACKED_UP)


def route_peer_frame(groups: Mapping[str, Any], default_group: str, peer: str,
                     frame: Frame) -> tuple[Any, messages.Message] | None:
    """The hosted group (of ``groups``: name -> a Node, or the simulator's SimGroup) that a
    replication frame from broker ``peer`` is for, and the message it carries; None if
    it is misaddressed: no such group here (not yet, or no longer), a message that says
    it comes from another broker than the connection's, or a group whose topic id is
    not the frame's (a deleted topic's replica and one of the topic created again under
    its name share the group name; neither may step the other). RemoteProtocolError if
    the frame is no valid message. The simulator's brokers route with this too."""
    message = messages.decode(frame)
    node = groups.get(frame.header.get("group", default_group))
    if node is None or message.src != peer or \
            frame.header.get("topic_id", 0) != node.spec.topic_id:
        return None
    return node, message


def _connections_max(configured: int) -> int:
    """``connections_max``, at most half the descriptors this process may open (the rest
    for stores, peers and the controller's calls)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return configured if soft == resource.RLIM_INFINITY else max(1, min(configured, soft // 2))


def _controller_hook(broker: Broker, name: str) -> None:
    """mqlog.replication.controller's ``host_controller(broker)`` (a broker with the
    controller role hosts the controller's Raft group and its requests) or
    ``join_cluster(broker)`` (a broker that knows the controller quorum, ``[controller]
    voters``, registers, heartbeats, and hosts the groups the controller assigns it).
    Both read ``broker.config.controller``, the ``[controller]`` table."""
    import importlib

    try:
        hook = getattr(importlib.import_module("mqlog.replication.controller"), name)
    except (ImportError, AttributeError):
        raise errors.ConfigError(f"{broker.config.source}: process_roles and [controller] ask "
                                 f"for the controller's {name}, which this mqlog lacks") from None
    hook(broker)


def run_broker(config: BrokerConfig) -> None:
    """Serve until SIGTERM or SIGINT; used by ``mqlog node``. The process's malloc keeps
    its freed buffers (libc.keep_freed_buffers): a replicated record passes through a
    few buffers of a fetch answer's size on each broker, which otherwise fault fresh
    pages in again for every fetch."""
    libc.keep_freed_buffers(_HEAP_BLOCK_BYTES_MAX, _HEAP_KEPT_BYTES)
    broker = Broker(config)  # (DataDirLocked: another process runs on its data_dir)
    run_until_signalled(broker, broker.banner)
    if broker.exit_error is not None:  # (refused by its cluster: the CLI's one line)
        raise broker.exit_error
    if broker.failure is not None:
        raise SystemExit(1)


def lock_data_dir(data_dir: Path | str, broker_id: str, listen: str) -> LockFile:
    """A broker's hold on its data_dir: ``data_dir/broker.lock`` (``files.LockFile``;
    the data_dir made if missing), held for as long as the broker has any of its stores
    open, saying "pid broker_id listen" for the message of the next one refused."""
    root = Path(data_dir)
    root.mkdir(parents=True, exist_ok=True)
    try:
        return LockFile.take(root / DATA_DIR_LOCK_FILE, f"{broker_id} {listen}")
    except LockHeld as held:
        raise errors.DataDirLocked(
            f"data_dir {root} is in use by {_holder(held.holder.split())}: two brokers on "
            "one data_dir would open the same stores; this one opened none. Stop that one "
            "first, or give this one a data_dir of its own (and, in a cluster, an id of "
            "its own)") from None


def _holder(words: list[str]) -> str:
    """Who holds a data_dir's lock, from its lock file's "pid broker_id listen"."""
    pid = words[0] if words else "unknown"
    who = f"broker {words[1]}, listening on {words[2]}" if len(words) >= 3 else ""
    if pid == str(os.getpid()):
        return f"another Broker of this process{f' ({who})' if who else ''}"
    return f"another process (pid {pid}{f': {who}' if who else ''})"



