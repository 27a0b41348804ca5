"""One replica group's member on a broker: its store, its replication core, and the
asyncio ``Io`` of the one driver between them and the network.

A broker (broker.py; ``mqlog node --config node.toml``) hosts one or more of these, one
per replica group, and carries their messages over its connections; a node of the
single-group configs of before is a broker hosting one group. A ``Node`` here is the
per-group part: every ``tick_ms`` the broker's one ticker (broker.py's ``Ticker``: one
loop timer for all its groups of that ``tick_ms``, not a task each) ticks its core, then
its tick callbacks; every message a peer broker sent for its group is stepped in; once
the loop iteration's events are all in (every frame read together), the driver carries
out the core's Ready — after a tick only if the core has one (``has_ready``: an idle
follower's tick leaves none, nor an idle leader's, and an idle group costs its tick, no
driver run) — and asks this node to send (through the broker's one connection per
peer), flush (on the store's flush thread: the loop goes on meanwhile) and answer. A
Ready that cannot be carried out stops the broker loudly (exit status 1): a restart runs
the engine's recovery.

Clients (``mqlog.Client``) send requests, one frame each, and get one response frame;
a request's ``group`` names the group (none: by its topic and queue, else the broker's
default group; see broker.py):

* ``produce`` {topic, queue_id, key, tags, sizes} + payload (the bodies, back to back;
  ``sizes`` lists their sizes) → {status, position, offset, count, store_timestamp, size}
  once the role's rule is met (a SYNC_MASTER waits for its slaves); a slave answers with a
  NotMaster error. ``store_timestamp`` is the store time (ms) of the request's records
  (one per request), ``size`` the bytes they take in the commit log (the store's
  PutResult's); a write refused before anything was stored (SLAVE_NOT_AVAILABLE) has
  position, offset and store_timestamp -1 and size 0; -1: not known (a found copy whose
  record could not be read).
* ``produce``'s ``acks``: "all" (-1, "replicated": the default), "1" (1, "master") or "0"
  (0: stored as acks=1 and not answered at all unless refused or failed; the client
  sends on without waiting, Kafka's acks=0).
* ``fetch`` {topic, queue_id, offset, max_count, max_bytes} → {next_offset, count,
  committed} + the raw records, never past the committed position (slaves serve fetches
  only with ``slave_read_enable``; an ISR follower serves up to its high watermark).
* ``metadata`` {} → the node's id, role, epoch and positions (``core.status()``).
* ``transfer`` {target} → a Raft leader hands leadership to voter ``target``.
Errors come back as {kind: "error", error: <class name>, message}; a NotLeader error also
names the ``leader`` and its ``leader_address`` when the node knows them.

Raft (``layer = "raft"``). The store's committed position is the group's commit
(``committed_follows = "external"``), the hard state lives in ``raft-state`` beside the
store (hardstate.py), and a produce with ``producer_id`` and ``sequence`` (and
``producer_epoch``, the producer's life) is idempotent: the leader looks it up in its
producer table (idempotence.py), rebuilt from its log each time it gains leadership,
answers a retry with the first write's place, and refuses an older life of a producer
id than one it has records of (ProducerFenced, nothing stored). A request stored in part
(a retry whose copy here was cut inside it, or a batch the store cut) is answered as the
driver decides (driver.py's ``propose_write``: PartiallyStored, with its ``count``, only
after the layer's verdict committed the stored records); this node writes the header.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeGuard

from mqlog import errors
from mqlog.config import GroupSpec
from mqlog.engine.files import delete_store, typed_errors
from mqlog.engine.store import open as open_store
from mqlog.format import RECORD_HEADER, RecordHeader
from mqlog.replication import core_for, hardstate, messages
from mqlog.replication.driver import Answer, Driver, is_cut
from mqlog.replication.idempotence import ProducerTag, Stored
from mqlog.replication.isr.core import CONTROLLER, TEST_BREAKS
from mqlog.replication.wire import Frame, FrameDecoder, encode_frame, split_bodies
from mqlog.results import PutStatus

if TYPE_CHECKING:
    from mqlog.replication.broker import Broker
    from mqlog.replication.connection import Connection


# A deliberately broken ISR core (one of isr/core.py's TEST_BREAKS) in every ISR group of
# this process, for tests of real processes (tests/test_isr_processes.py): the variable
# names the break. Unset or empty: the real core.
ISR_TEST_BREAK_VARIABLE = "MQLOG_ISR_TEST_BREAK"


def split_address(address: str) -> tuple[str, int]:
    if not isinstance(address, str):
        raise errors.ConfigError(f"address {address!r} must be a 'host:port' string")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise errors.ConfigError(f"address {address!r} must be host:port")
    return host, int(port)


async def start_listening(address: str, handler: Any = None, *,
                          protocol: Callable[[], asyncio.BaseProtocol] | None = None,
                          ) -> asyncio.Server:
    """``asyncio.start_server(handler)`` on ``address``, or ``loop.create_server(protocol)``
    if a protocol factory is given; a port that is taken or a host that is not this
    machine's is CannotListen, naming the address and what to do."""
    host, port = split_address(address)
    try:
        if protocol is not None:
            return await asyncio.get_running_loop().create_server(protocol, host, port)
        return await asyncio.start_server(handler, host, port)
    except OSError as error:
        raise errors.CannotListen(
            f"cannot listen on {address}: {error.strerror or error} (another process may "
            "have the port: stop it or choose another `listen` host:port; the host must be "
            "an address of this machine)") from None



# An operator's command that a partition the controller assigned (a topic's: it has a
# topic id) would undo at its broker's next pull, or leave apart from the metadata
_MOVED_BY_CONTROLLER = ("the controller names the master of {group}, a partition of a "
                        "topic: a promotion or follow here is undone at the broker's next "
                        "pull of the metadata. With [controller] auto_failover = true it "
                        "moves the master once the master's broker is fenced")
_CONTROLLER_DECIDES = {
    "promote": _MOVED_BY_CONTROLLER, "follow": _MOVED_BY_CONTROLLER,
    "membership": ("the controller assigns the replicas of {group}, a partition of a "
                   "topic: a membership change here would leave its voters apart from the "
                   "metadata, which nothing brings back. Leadership moves with transfer")}


class Node:
    """One replica group's member on a broker: ``start()`` once the broker's loop runs,
    ``close()`` when the group is dropped or the broker stops."""

    def __init__(self, spec: GroupSpec, broker: Broker) -> None:
        self.spec, self.broker, self.name = spec, broker, spec.name
        self.node_id = spec.replication.node_id
        self.replication = spec.replication
        self.raft = spec.replication.layer == "raft"
        self.isr = spec.replication.layer == "isr"
        self.store_dir = broker.config.group_dir(spec)
        store_config = spec.store.replace(committed_follows="external") \
            if self.raft or self.isr else spec.store
        if spec.topic_id:
            self._claim_store(spec.topic_id)
        self.store = open_store(self.store_dir, store_config)
        self._saved_high_watermark = 0
        try:
            core = self._new_core()
        except BaseException:
            self.store.close()
            raise
        self.driver = Driver(self.store, core, self,
                             window_bytes=spec.replication.idempotence_window_bytes,
                             sequences_max=spec.replication.idempotence_sequences_max)
        self.failure: BaseException | None = None
        self.refusals = 0  # peers' records the store refused (``refused``)
        self._refusals_in_a_row = 0  # ... with nothing stored since the first of them
        self._stored_at_refusal = 0  # the log's end at the last refusal
        self._hold: asyncio.TimerHandle | None = None  # the new core waits (``refused``)
        self._held_as: Any = None  # ... its role then
        self._learn_addresses()
        self._waiting: dict[Any, asyncio.Future[Answer]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._scheduled = False
        self._requests = 0
        self._committed = self.store.committed_position
        self._commit_callbacks: list[Callable[[int], None]] = []
        self._run_callbacks: list[Callable[[], None]] = []
        self._tick_callbacks: list[Callable[[], None]] = []
        self._high_watermark_due = 0  # (an ISR replica's: the tick of its next save)
        self.closed = False

    def _claim_store(self, topic_id: int) -> None:
        """Make the store directory this partition's (topic ``topic_id``): one saved for
        another topic id held a deleted topic's partition of the same name (this broker
        was away when it was deleted, or a snapshot hid the deletion) and is deleted, as
        Kafka deletes a stray log (KIP-516). So is one that holds files but no id: every
        store of a topic with an id gets the file before anything else, so that is what
        a deletion cut short left, or a store of a topic from before ids."""
        directory = self.store_dir
        with typed_errors(f"cannot make {directory} the store of topic id {topic_id}"):
            found = directory.is_dir()
            held = hardstate.load_topic_id(directory) if found else None
            if held == topic_id:
                return
            if held is not None or (found and any(directory.iterdir())):
                print(f"[{self.node_id}/{self.name}] deleting the store of topic id "
                      f"{held or 'unknown'}: this partition is of topic id {topic_id} (its "
                      "topic was deleted and created again)", flush=True)
                delete_store(directory)
            directory.mkdir(parents=True, exist_ok=True)
            hardstate.save_topic_id(directory, topic_id)

    @property
    def core(self) -> Any:
        return self.driver.core

    @property
    def peers(self) -> dict[str, str]:
        """Where this group's other members listen: its spec's, and members added by a
        membership change since (the broker's address book knows where)."""
        book = self.broker.peers
        peers = {name: book.get(name, address) for name, address in self.spec.addresses.items()}
        for name in (*getattr(self.core, "voters", ()), *getattr(self.core, "learners", ())):
            if name != self.node_id and name in book:
                peers.setdefault(name, book[name])
        return peers

    def start(self) -> None:
        """Run the driver once (a master already in its store's epoch takes writes at
        once), then tick with the broker's other groups (broker.py's ``Ticker``), and
        register with the route registries if any."""
        self.driver.run()
        self.broker.start_ticking(self)
        if self.broker.config.registries:
            self._spawn(self._register_forever())

    def close(self) -> None:
        """Stop ticking; what waits gets FLUSH_SLAVE_TIMEOUT (its fate is unknown); close
        the store (a closing broker, or a dropped group)."""
        if self.closed:
            return
        self.closed = True
        self.broker.stop_ticking(self)
        if self._hold is not None:
            self._hold.cancel()
        if self.isr and self.failure is None:
            self._save_high_watermark()
        for task in list(self._tasks):
            task.cancel()
        self.driver.abandon_waiting()
        for future in self._waiting.values():
            future.cancel()
        try:
            self.store.close()
        except errors.MqlogError as error:
            if self.failure is None:
                raise
            print(f"[{self.node_id}/{self.name}] closing the failed store: {error}", flush=True)

    def on_commit(self, callback: Callable[[int], None]) -> None:
        """Call ``callback(committed_position)`` after each driver run that moved it."""
        self._commit_callbacks.append(callback)

    def on_run(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after every driver run (a service hosted on the group, such
        as the controller, learns of commits and lost leaderships there)."""
        self._run_callbacks.append(callback)

    def on_tick(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after every tick of the group's core."""
        self._tick_callbacks.append(callback)

    def _new_core(self) -> Any:
        replication = self.spec.replication
        if self.isr:  # its leader and ISR come from the controller (apply_metadata)
            high_watermark, trouble = hardstate.load_high_watermark(self.store_dir)
            if trouble:
                self.note(trouble)
            self._saved_high_watermark = high_watermark
            return core_for(replication, self.store, high_watermark=high_watermark,
                            test_break=_isr_test_break())
        if replication.layer != "raft":  # the role an operator gave it last wins
            return core_for(replication, self.store,
                            hard_state=hardstate.load_role(self.store_dir))
        # Unseeded on purpose: a real node's election jitter must differ from its peers'
        # (the simulator and the datadriven tests pass seeded generators).
        return core_for(replication, self.store, rng=random.Random(),
                        hard_state=hardstate.load(self.store_dir))

    # --- the driver loop ----------------------------------------------------------------

    def tick(self) -> None:
        """One tick (the broker's ticker calls it every ``tick_ms``): the core's, then the
        tick callbacks'; then the driver runs once this loop iteration's events are in
        — only if the core has something to carry out (``has_ready``: a follower whose
        Ready is empty does not, nor a leader whose log did not move since its last run
        and that has nothing in flight). A run of an empty Ready changes nothing, and
        would cost an idle broker a driver run per group per tick."""
        driver = self.driver
        driver.tick()
        if self._hold is not None and driver.core.role != self._held_as:
            self._end_hold()  # (a candidate now, or promoted: its messages go now)
        for callback in self._tick_callbacks:
            callback()
        if self.isr and driver.core.tick_count >= self._high_watermark_due:
            self._high_watermark_due = driver.core.tick_count + \
                self.replication.ticks(self.replication.high_watermark_save_interval_ms)
            self._save_high_watermark()
        if driver.failure is None and driver.core.has_ready():
            self._schedule()

    def _save_high_watermark(self) -> None:
        """Save an ISR replica's high watermark if it moved since the last save (Kafka's
        replication-offset-checkpoint): a restart starts from it, so readers do not lose
        sight of committed records until the ISR is large enough to move it again. A
        save that fails is reported and tried again at the next interval. One that
        went down (a cut below it after an unclean election, or a restart's saved one
        that the replica dropped as it followed) is saved at once and synced: an older
        file would show the records written since as committed after a restart."""
        high_watermark = self.core.high_watermark_to_save
        if high_watermark == self._saved_high_watermark:
            return
        try:
            hardstate.save_high_watermark(self.store_dir, high_watermark,
                                          sync=high_watermark < self._saved_high_watermark)
        except OSError as error:
            self.note(f"cannot save the high watermark {high_watermark}: {error}")
            return
        self._saved_high_watermark = high_watermark

    async def _register_forever(self) -> None:
        """Tell each route registry who this node is, now and every interval."""
        config = self.broker.config
        while True:
            header = {"kind": "register", "group": self.spec.registry_group or self.name,
                      "node_id": self.node_id, "role": self.core.role,
                      "epoch": self.core.epoch, "address": config.listen,
                      "topics": self.spec.topics}
            for address in config.registries:
                with contextlib.suppress(OSError, asyncio.TimeoutError):
                    await asyncio.wait_for(_request_once(address, header), timeout=5)
            await asyncio.sleep(config.register_interval_ms / 1000)

    def _schedule(self) -> None:
        """Carry out the core's Ready once this loop iteration's events are all in, so
        that writes and acks that arrive together are sent together."""
        if not self._scheduled and not self.closed and self._hold is None:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._run_driver)
            self.broker.flush_behind()  # (what the run sends leaves right after it)

    def schedule(self) -> None:
        """Carry out the core's Ready soon (after a proposal made from outside the node)."""
        self._schedule()

    def _run_driver(self) -> None:
        self._scheduled = False
        if self.closed:
            return
        self.driver.run()
        if self._refusals_in_a_row and self.store.written_position > self._stored_at_refusal:
            self._refusals_in_a_row = 0  # (records stored since: the peer mended)
        if self.isr and self.core.high_watermark_to_save < self._saved_high_watermark:
            self._save_high_watermark()  # (lowered: a cut below it, or dropped following)
        committed = self.store.committed_position
        if committed != self._committed:
            self._committed = committed
            for commit_callback in self._commit_callbacks:
                commit_callback(committed)
        for callback in self._run_callbacks:
            callback()

    # --- the driver's Io ------------------------------------------------------------------

    def send(self, outgoing: list[messages.Message]) -> None:
        peers = [message for message in outgoing if message.dst != CONTROLLER]
        for request in outgoing:
            if request.dst == CONTROLLER:  # an ISR leader's AlterPartition
                if self.broker.alter_partition is None:
                    self.note("an AlterPartition has no controller to go to: dropped")
                else:
                    self.broker.alter_partition(self, request)
        if peers:
            self.broker.send(self.name, peers, self.spec.topic_id)

    def save_hard_state(self, state: Any) -> None:
        hardstate.save(self.store_dir, state)
        self._learn_addresses()

    def start_flush(self, done: Any) -> None:
        self._spawn(self._flush(done))

    async def _flush(self, done: Any) -> None:
        try:
            await self.store.flush_async()
        except (errors.FlushFailed, errors.StoreFailed, errors.StoreClosed) as error:
            print(f"[{self.node_id}/{self.name}] a flush failed: {error}", flush=True)
            done(False)
            return
        done(True)
        self._schedule()  # a leader's own flush may let it commit

    def answer(self, request: Any, status: Answer) -> None:
        future = self._waiting.pop(request, None)
        if future is not None and not future.done():
            future.set_result(status)

    def note(self, event: str) -> None:
        print(f"[{self.node_id}/{self.name}] {event}", flush=True)

    def failed(self, error: BaseException) -> None:
        """A Ready could not be carried out: stop the broker loudly; a restart runs
        recovery (of every group: they share the process)."""
        print(f"[{self.node_id}/{self.name}] FATAL: stopping: {error!r}", flush=True)
        traceback.print_exception(error, file=sys.stderr)  # (where: for the bug report)
        self.failure = error
        self.broker.failed(error)

    def refused(self, error: errors.ReplicaDataRejected) -> None:
        """Records from a peer that the store refused (nothing of them stored: a peer's
        garbage, or a bug): this group's core starts over from its store, as a restart
        would make it (an ISR core with the controller's partition state it had), and
        the other groups of the broker go on. Said in the log at the 1st, 2nd, 4th, ...
        time: a peer that keeps sending them is not a flood. Nor is it a spin: while
        they go on with nothing stored between them (a lasting mismatch, not one bad
        message), the new core waits before it runs, 2, 4, 8... ticks, at most
        ``refused_records_hold_ms_max``; meanwhile it takes messages and ticks, as a slow
        disk would keep it waiting — unless an election asks for it (``took``: a vote or
        pre-vote, a leadership handed over) or its role moves (a candidate now, promoted,
        led: at the next tick). A held replica held back its vote, and a Raft failover
        that needed it took 7.9 s, not 0.4 (helper-57)."""
        self.refusals += 1
        self._refusals_in_a_row += 1
        self._stored_at_refusal = self.store.written_position
        hold_ms = self.refused_hold_ms
        if self.refusals & (self.refusals - 1) == 0:
            self.note(f"records from a peer refused, nothing of them stored ({error}); "
                      f"this group's core starts over from its store"
                      f"{f' in {hold_ms} ms' if hold_ms else ''} (refusal {self.refusals})")
        old, core = self.core, self._new_core()
        if self.isr:
            core.apply_metadata(old.state)
        self.driver.replace_core(core)
        if hold_ms:
            self._hold = asyncio.get_running_loop().call_later(hold_ms / 1000, self._release)
            self._held_as = core.role
        else:
            self._schedule()

    @property
    def refused_hold_ms(self) -> int:
        """How long the core waits after this many refusals in a row (0 after the first)."""
        if self._refusals_in_a_row < 2:
            return 0
        replication = self.replication
        doubled = replication.tick_ms << min(self._refusals_in_a_row - 1, 30)
        return min(doubled, replication.refused_records_hold_ms_max)

    def _release(self) -> None:
        self._hold = None
        self._schedule()

    def _end_hold(self) -> None:
        if self._hold is not None:
            self._hold.cancel()
            self._release()

    def took(self, message: messages.Message) -> None:
        """A peer's message was stepped into the core: run it soon. One about an
        election (a vote or pre-vote asked for, a leadership handed over) ends a
        refusal's hold at once: a held replica must not hold back an election."""
        if isinstance(message, (messages.Vote, messages.TimeoutNow)):
            self._end_hold()
        self._schedule()

    def _learn_addresses(self) -> None:
        """Addresses named by the group's membership changes (a node added later)."""
        for membership in getattr(self.core, "memberships", ()):
            for name, address in membership.addresses.items():
                if name != self.node_id:
                    self.broker.learn_address(name, address)

    # --- requests -----------------------------------------------------------------------

    def _spawn(self, coroutine: Any) -> asyncio.Task[None]:
        self._tasks.add(task := asyncio.create_task(coroutine))
        task.add_done_callback(self._tasks.discard)
        return task

    async def _answer(self, frame: Frame, writer: Connection) -> None:
        try:
            header, payload = await self._request(frame.header.get("kind"), frame)
        except errors.MqlogError as error:
            header, payload = self._error_header(error), b""
        except Exception as error:  # a bug: the client is answered, not left waiting
            self.note(f"a {frame.header.get('kind')!r} request failed: {error!r}")
            header, payload = {"kind": "error", "error": type(error).__name__,
                               "message": str(error)}, b""
        header["id"] = frame.header.get("id")
        await writer.answer(encode_frame(header, payload))

    def _error_header(self, error: errors.MqlogError) -> dict[str, Any]:
        if isinstance(error, errors.StoreClosed):  # (a client retries NodeUnavailable)
            error = errors.NodeUnavailable(
                f"node {self.node_id}'s replica of group {self.name} is closing (the node "
                "stops, or the group left it): the request's outcome is unknown; retry it "
                "(with the same producer id and sequence it is stored once)")
        return error_answer(error, self.broker.peers.get)

    async def _answer_produces(self, frames: list[Frame], writer: Connection) -> None:
        """Produce requests that arrived together are stored, made durable, replicated
        and answered together — one flush wait, one proposal, one socket write (the
        shape of pebble's commit pipeline) — each with its own status or error. The
        group closing meanwhile (its tasks cancelled) answers them NodeUnavailable."""
        try:
            answers = await self._produce_answers(frames)
        except asyncio.CancelledError:
            self.refuse_closing(frames, writer)
            raise
        if answers:
            await writer.answer(b"".join([encode_frame(header) for _, header in answers]))

    def refuse_closing(self, frames: list[Frame], writer: Connection) -> None:
        """Answer produce requests that this closing group (dropped, or its broker
        stopping) will not finish: NodeUnavailable, their outcome unknown (a retry with
        the same producer sequence is stored once). Written now: nothing is awaited in a
        cancelled task."""
        if not writer.is_closing():
            header = self._error_header(errors.StoreClosed("closing"))
            writer.write(b"".join(encode_frame({**header, "id": frame.header.get("id")})
                                  for frame in frames))

    async def _produce_answers(self, frames: list[Frame]) -> list[tuple[Frame, dict]]:
        """``_answer_produces``'s answers: (frame, header) of each request answered."""
        answers, stored = [], []
        try:
            self.driver.check_writable()  # (once: nothing below can make it step down)
        except errors.MqlogError as error:
            answers = [(frame, self._error_header(error)) for frame in frames]
            frames = []
        for frame in frames:
            try:  # (an ISR leader raises NotEnoughReplicas: nothing is stored)
                producer = _producer_tag(frame.header)  # (read once: InvalidArgument)
                if self._stored_already(producer):
                    refused = PutStatus.PUT_OK
                else:
                    self._in_order(frame.header, producer)  # (SequenceGap: none stored)
                    refused = self.core.may_accept(_acks(frame.header))
            except errors.MqlogError as error:
                answers.append((frame, self._error_header(error)))
                continue
            if refused is not PutStatus.PUT_OK:  # decided before storing: nothing stored
                answers.append((frame, {"kind": "produced", "status": refused.value,
                                        "position": -1, "offset": -1, "count": 0,
                                        "store_timestamp": -1, "size": 0}))
                continue
            try:
                stored.append((frame, *self._store_request(frame.header, frame.payload,
                                                           producer)))
            except errors.MqlogError as error:
                answers.append((frame, self._error_header(error)))
        if stored:
            self._schedule()  # followers get the records while this node's flush runs
            answers += await self._settle(stored)
        # acks=0: a stored write is not answered (the client does not wait for it); a
        # refusal or an error is, so the client learns that its leader moved.
        answers = [(frame, header) for frame, header in answers
                   if header["kind"] != "produced" or ACKS.get(frame.header.get("acks")) != "0"]
        for frame, header in answers:
            header["id"] = frame.header.get("id")
        return answers

    def _stored_already(self, producer: ProducerTag | None) -> bool:
        """An idempotent retry of a write this leader has: it is not refused before
        storing (NotEnoughReplicas would say "nothing was stored", a lie); its answer is
        the layer's verdict on the stored copy (NOT_ENOUGH_REPLICAS_AFTER_APPEND while
        the ISR is short)."""
        return producer is not None and self.driver.producers.lookup(*producer) is not None

    def _in_order(self, header: dict[str, Any], producer: ProducerTag | None) -> None:
        """A pipelined producer's request names the sequence it sent before (``previous``):
        SequenceGap (nothing stored) unless this leader stored that one — so a request
        refused (NotLeader, NotEnoughReplicas) or lost is never overtaken by the next
        one, and the producer's records stay in the order it sent them (Kafka's
        OutOfOrderSequence). That request itself, not just a later one: an acks=0 send
        takes a sequence too. A producer this leader does not know is refused too: the
        client sends the request again without ``previous`` once nothing is pending
        before it. Read in order, so a request stored just before counts. With
        ``previous_count`` (that request's records), a copy of it cut inside (a new
        leader's, PartiallyStored to its retry) counts as not stored: the records sent
        after it would otherwise land between its first records and its rest."""
        previous = header.get("previous")
        if previous is None:
            return
        if producer is None or not isinstance(previous, int) or isinstance(previous, bool) \
                or not 0 <= previous < producer[1]:
            raise errors.InvalidArgument("previous must be an int below the request's "
                                         "sequence, and needs producer_id and sequence")
        count = header.get("previous_count")
        if count is not None and (type(count) is not int or count < 1):
            raise errors.InvalidArgument("previous_count must be the previous request's "
                                         "record count, an int >= 1")
        producer_id, sequence, epoch = producer
        try:  # (that one itself: an acks=0 send may have raised the newest past it)
            found = self.driver.producers.lookup(producer_id, previous, epoch)
        except errors.OutOfOrderSequence:
            return  # (older than the sequences kept: stored long before)
        if found is not None and found.count < (count or 0):
            raise errors.SequenceGap(  # (a copy cut inside it: its rest goes first)
                f"producer {producer_id!r} sent sequence {sequence} after {previous}, of "
                f"which this leader holds {found.count} of {count} records: nothing was "
                "stored; the earlier request's rest goes first")
        if found is None:  # (a new life has stored nothing: its first request names none)
            newest = self.driver.producers.newest(producer_id, epoch)
            raise errors.SequenceGap(
                f"producer {producer_id!r} sent sequence {sequence} after {previous}, "
                f"which this leader has not stored (its newest: {newest}): nothing was "
                "stored; send the earlier request first, then this one again")

    async def _settle(self, stored: list[tuple[Frame, Stored, str, int]],
                      ) -> list[tuple[Frame, dict]]:
        """Wait for the flush and (for acks=replicated) the layer's rule, for all at once.
        The proposals go in before anything is awaited, while this node is surely still
        the leader that stored the records: a verdict cannot be missed by stepping down.
        A request stored in part (PARTIAL) is proposed on its own, and its answer is the
        driver's (driver.py: PartiallyStored only once the verdict committed its
        records); this node only makes it a header."""
        end = max(item.end for _, item, _, _ in stored)
        replicated = [item.end for _, item, acks, _ in stored if acks == "replicated"]
        decision = self._propose(functools.partial(self.driver.propose, end=max(replicated))) \
            if replicated else None
        cuts = {index: self._propose(functools.partial(
            self.driver.propose_write, stored=item, sent=_record_count(frame.header),
            producer=_producer_tag(frame.header)))
            for index, (frame, item, acks, _) in enumerate(stored) if acks == PARTIAL}
        durable = await self.store.flushed_async(end)
        flushed = self.store.flushed_position
        decided = await decision if isinstance(decision, asyncio.Future) else decision
        answers = []
        for index, (frame, item, acks, stamp) in enumerate(stored):
            status = PutStatus.PUT_OK if durable or flushed >= item.end else \
                PutStatus.FLUSH_DISK_TIMEOUT
            if acks in ("replicated", PARTIAL) and status is PutStatus.PUT_OK:
                answer = decided if acks == "replicated" else await _settled(cuts[index])
                if isinstance(answer, errors.MqlogError):  # (PartiallyStored too)
                    answers.append((frame, self._error_header(answer)))
                    continue
                assert answer is not None
                status = answer
            answers.append((frame, {"kind": "produced", "status": status.value,
                                    "position": item.position, "offset": item.offset,
                                    "count": item.count, "store_timestamp": stamp,
                                    "size": item.end - item.position}))
        return answers

    def _propose(self, propose: Callable[[Any], None]) -> asyncio.Future[Answer] | \
            errors.MqlogError:
        """``propose(request)`` through the driver; the future has its answer (the layer's
        verdict, or the driver's refusal of a write stored in part), or the error if this
        node takes no writes now."""
        try:
            self.driver.check_writable()  # (it may have stepped down since they were stored)
        except errors.MqlogError as error:
            return error
        request = self._new_request()
        future = self._waiting[request]
        try:
            propose(request)
        except BaseException as error:
            self._waiting.pop(request)
            if isinstance(error, errors.MqlogError):
                return error
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
        if kind in ("promote", "follow") and (self.raft or self.isr):
            raise errors.InvalidArgument(f"{kind} is an operator command of master-slave "
                                         "groups; a Raft group elects its leader (use "
                                         "transfer to move leadership), the controller "
                                         "names an ISR partition's")
        if kind in ("promote", "follow", "membership") and self.spec.topic_id:
            raise errors.InvalidArgument(_CONTROLLER_DECIDES[kind].format(group=self.name))
        if kind == "promote":
            return self._promote(frame.header), b""
        if kind == "follow":
            return self._follow(frame.header), b""
        if kind == "transfer":
            return self._transfer(frame.header), b""
        if kind == "membership":
            return await self._change_membership(frame.header), b""
        raise errors.RemoteProtocolError(f"unknown request kind {kind!r}")

    def _check_served(self, header: dict[str, Any]) -> None:
        """A group that names its partitions serves those only: a write to another would
        be acknowledged and stored where no reader of that partition looks."""
        served = self.spec.partitions
        wanted = (header.get("topic"), header.get("queue_id", 0))
        if served and wanted not in served:
            raise errors.InvalidArgument(
                f"group {self.name} serves {', '.join(f'{t}/{q}' for t, q in served)}, not "
                f"{wanted[0]!r} queue {wanted[1]!r}: send it to the group of that "
                "partition (or name no group: the broker routes it)")

    def _store_request(self, header: dict[str, Any], payload: bytes,
                       producer: ProducerTag | None) -> tuple[Stored, str, int]:
        """Store one produce request's records (or find them: an idempotent retry);
        where they went, what the client waits for, and their store timestamp. (The
        caller checked that this node leads, and read ``producer``, the request's tag.)"""
        self._check_served(header)
        bodies = split_bodies(payload, header.get("sizes"))  # (RemoteProtocolError)
        if not bodies:
            raise errors.InvalidArgument("a produce request needs at least one body")
        acks = _acks(header)
        # (the store checks every field's type)
        stored = self.driver.write(header.get("topic"), bodies, header.get("queue_id", 0),
                                   header.get("key"), header.get("tags"), producer)
        return stored, PARTIAL if is_cut(stored, len(bodies)) else acks, \
            self._store_timestamp(stored)

    def _store_timestamp(self, stored: Stored) -> int:
        """The store time of ``stored``'s records (the store's put result's; one per
        request), else, a copy an idempotent retry found in the log, read from its first
        record; -1 if it cannot be read."""
        if stored.store_timestamp >= 0:
            return stored.store_timestamp
        try:
            raw = self.store.read_raw(stored.position, 1)  # (its first record, checked)
        except errors.MqlogError:
            return -1
        if len(raw) < RECORD_HEADER.size:
            return -1
        return int(RecordHeader._make(RECORD_HEADER.unpack_from(raw)).store_timestamp)

    def _fetch(self, frame: Frame) -> tuple[dict[str, Any], bytes]:
        # An ISR follower serves what is below its high watermark (KIP-392's follower
        # fetching): its store's committed position, the leader's HW capped at its end.
        # Not a fetch meant for the leader (``leader_only``, as Kafka's consumer fetch
        # without a preferred replica): sent here by a stale view, it would read fewer
        # records than were acknowledged, or none, without a word.
        if frame.header.get("leader_only") is True and not self.core.is_master:
            self.core.check_master()  # (NotLeader naming the leader, when it knows it)
            raise errors.NotMaster(f"node {self.node_id} does not lead {self.name}")
        if not self.core.is_master and not self.spec.slave_read_enable and not self.isr:
            if self.raft:
                self.core.check_master()  # (NotLeader naming the leader, when it knows it)
            raise errors.NotMaster(f"node {self.node_id} is a slave and slave_read_enable "
                                   "is off; fetch from the master")
        header = frame.header
        self._check_served(header)
        topic: Any = header.get("topic")  # (the store checks its type)
        records = self.store.get(topic, header.get("queue_id", 0),
                                 header.get("offset", 0), header.get("max_count", 32),
                                 header.get("max_bytes", 1 << 20))
        next_offset = records[-1].offset + 1 if records else header.get("offset", 0)
        return ({"kind": "records", "count": len(records), "next_offset": next_offset,
                 "committed": self.store.committed_position},
                b"".join(record.raw for record in records))

    def _promote(self, header: dict[str, Any]) -> dict[str, Any]:
        """Operator command: this slave becomes master of ``slaves`` in a new epoch."""
        role, slaves = header.get("role", "SYNC_MASTER"), tuple(header.get("slaves", ()))
        if role not in ("ASYNC_MASTER", "SYNC_MASTER") or not all(
                isinstance(name, str) and name in self.peers for name in slaves):
            raise errors.InvalidArgument("promote needs role ASYNC_MASTER or SYNC_MASTER and "
                                         "slaves named in this node's [node.peers]")
        epoch = header.get("epoch", 0)
        if type(epoch) is not int or not 0 <= epoch < messages.NUMBER_LIMIT:
            raise errors.InvalidArgument(f"epoch must be an int in [0, 2**62), got "
                                         f"{errors.shown(epoch)}")
        self.core.promote(role, slaves, epoch)
        self._schedule()
        return {"kind": "promoted", "role": role, "epoch": self.core.epoch}

    def change_role(self, header: dict[str, Any]) -> dict[str, Any]:
        """The operator's ``promote`` or ``follow`` (``header["kind"]``) from inside the
        process: a broker's cluster agent carries out the controller's decisions so."""
        return self._promote(header) if header["kind"] == "promote" else self._follow(header)

    def _follow(self, header: dict[str, Any]) -> dict[str, Any]:
        """Operator command: this node becomes a slave of ``master`` (after a promotion
        elsewhere); a fresh core says Hello and is truncated if it diverged."""
        master = header.get("master")
        if type(master) is not str or master not in self.peers or master == self.node_id:
            raise errors.InvalidArgument(f"follow needs a master named in [node.peers], got "
                                         f"{errors.shown(master)}")
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
        assert isinstance(status, PutStatus)  # (a membership change is never a write)
        return {"kind": "membership", "status": status.value, "voters": list(voters),
                "learners": list(learners)}

    def metadata(self) -> dict[str, Any]:
        peers = self.peers
        queued, dropped = self.broker.send_counters(peers)
        return {"kind": "metadata", "node_id": self.node_id, "group": self.name,
                "epoch": self.core.epoch, "log_start": self.store.first_segment_base(),
                "peers": peers, "send_queued": queued, "send_dropped": dropped,
                "peer_records_refused": self.refusals,
                "peer_records_refused_in_a_row": self._refusals_in_a_row, **self.core.status()}


# A produce's ``acks`` as the client may name it (Kafka's vocabulary, or mqlog's older
# words) -> the node's: "replicated" (the layer's rule; Kafka's acks=all), "master" (the
# leader stored it; acks=1), "0" (acks=0: stored like acks=1, never answered unless
# refused — the client does not wait).
ACKS = {"replicated": "replicated", "all": "replicated", "-1": "replicated", -1: "replicated",
        "master": "master", "1": "master", 1: "master", "0": "0", 0: "0"}


# A request stored in part (a retry whose copy here holds only its first records, cut
# inside the request on the replica that led before; or a batch the store cut): proposed
# through the driver's propose_write whatever its acks, which answers it (driver.py).
PARTIAL = "partial"


def error_answer(error: errors.MqlogError,
                 address_of: Callable[[str], str | None]) -> dict[str, Any]:
    """The error answer a broker sends for ``error`` (client.error_of reads it back as the
    same typed error): its class and message, and what a client acts on — a NotLeader's
    leader and that leader's address (the error's own, else ``address_of(leader)``: the
    broker's address book), a PartiallyStored's count, an OffsetOutOfRange's bounds."""
    header: dict[str, Any] = {"kind": "error", "error": type(error).__name__,
                              "message": str(error)}
    if isinstance(error, errors.PartiallyStored):
        header["count"] = error.count
        header["position"], header["offset"] = error.position, error.offset
    if isinstance(error, errors.OffsetOutOfRange):  # (a consumer resets from these)
        header["min_offset"], header["max_offset"] = error.min_offset, error.max_offset
    if isinstance(error, errors.NotLeader) and error.leader:
        header["leader"] = error.leader
        header["leader_address"] = error.leader_address or address_of(error.leader)
    return header


def acks_of(value: Any) -> str:
    """The node's name for a produce's ``acks`` (InvalidArgument for anything else)."""
    if type(value) in (str, int) and value in ACKS:  # (not True, not 1.0: they hash as 1)
        return ACKS[value]
    raise errors.InvalidArgument(f"acks must be 'all' (or -1, 'replicated'), '1' (or 1, "
                                 f"'master') or '0' (or 0), got {value!r}")


def _isr_test_break() -> str:
    test_break = os.environ.get(ISR_TEST_BREAK_VARIABLE, "")
    if test_break not in ("", *TEST_BREAKS):
        raise errors.ConfigError(f"{ISR_TEST_BREAK_VARIABLE}={test_break!r} names no break "
                                 f"of the ISR core ({', '.join(TEST_BREAKS)}); unset it")
    return test_break


def _acks(header: dict[str, Any]) -> str:
    return acks_of(header.get("acks", "replicated"))


def _names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(name, str) and name for name in value)


def _producer_tag(header: dict[str, Any]) -> ProducerTag | None:
    """An idempotent produce's (producer_id, sequence, producer_epoch); the epoch is 0
    when left out (the clients of before epochs)."""
    producer_id, sequence = header.get("producer_id"), header.get("sequence")
    epoch = header.get("producer_epoch", 0)
    if producer_id is None and sequence is None and "producer_epoch" not in header:
        return None
    return check_producer_tag(producer_id, sequence, epoch)


def check_producer_tag(producer_id: Any, sequence: Any, epoch: Any) -> ProducerTag:
    """An idempotent produce's tag, checked (the node's, and every client's before it
    sends: msgpack cannot even carry an int of 2**64 and more)."""
    if not isinstance(producer_id, str) or not producer_id or " " in producer_id or \
            not _count(sequence) or not _count(epoch):
        raise errors.InvalidArgument(
            "an idempotent produce needs producer_id, a non-empty string without spaces, "
            "sequence, an int in [0, 2**63), and (optional) producer_epoch, an int in "
            "[0, 2**63) (mqlog.new_producer_epoch() makes one); got "
            f"producer_id={errors.shown(producer_id)}, sequence={errors.shown(sequence)}, "
            f"producer_epoch={errors.shown(epoch)}")
    return producer_id, sequence, epoch


def _count(value: Any) -> TypeGuard[int]:
    """A sequence or an epoch: an int64 (Kafka's are signed too), not negative. One at the
    top of msgpack's uint64 would outlast every real one: an epoch there fences every
    later client of its producer id (the wall clock in microseconds is far below)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63


def _record_count(header: dict[str, Any]) -> int:
    """How many records a produce request carries (its ``sizes``; 0 if malformed: the
    store refuses it later with the reason)."""
    sizes = header.get("sizes")
    return len(sizes) if isinstance(sizes, list) else 0


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
        listening = asyncio.create_task(ready.wait())
        # serve() may fail before it listens (the port is taken): then ready is never set,
        # and waiting on it alone would hang even through SIGTERM
        await asyncio.wait({serving, listening}, return_when=asyncio.FIRST_COMPLETED)
        if not ready.is_set():
            listening.cancel()
            await serving  # raises what stopped it (CannotListen...)
            return
        print(banner(), flush=True)
        with contextlib.suppress(asyncio.CancelledError):
            await serving

    asyncio.run(main())


async def _settled(decision: asyncio.Future[Answer] | errors.MqlogError) -> Answer | \
        errors.MqlogError:
    """A proposal's answer, or the error that kept it from being proposed."""
    return await decision if isinstance(decision, asyncio.Future) else decision
