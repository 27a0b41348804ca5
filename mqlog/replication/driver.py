"""The driver: the only code that carries out a core's Ready (DESIGN §5.1), for every layer.

A ``Driver`` owns one replica: its store, its core, its producer table and the requests
waiting for an answer. It does no I/O of its own and knows no layer by name: it asks an
``Io`` to send messages, save the hard state, flush the log and answer clients. The node
(node.py) gives it an asyncio Io over TCP; the simulator (mqlog/sim) a simulated network
and disk; the datadriven tests one that records what happened, and print
``driver.described`` (what the driver did, etcd's DescribeReady) for every layer alike.

Inputs. ``tick()``, ``step(message)`` (every message that arrived, before the next Ready:
several per Ready is the normal case), ``write(...)`` (a client's records, stored once
``check_writable()`` said this replica takes writes) and ``propose(request, end)``.
Then ``run()`` carries out the core's Ready, in the order its docstring states:

1. save the hard state (the Io returns once it is durable);
2. the log: reset, truncate, append, set the epoch, append the no-op;
3. if the Ready must sync: start a flush (the Io reports its completion, now or later);
4. move the committed position; send ``messages``;
5. send ``messages_after_persist`` once that flush completed — and never if the log was
   truncated or reset meanwhile (they may speak of bytes that are gone; the peer asks
   again), nor if the flush failed;
6. answer the proposals the Ready resolved; log its events; ``advance``.

Serving writes. A core that has just become master (a Raft leader, a promoted master)
reports ``is_master`` at once, but its term starts only when the Ready that stamps its
epoch (and appends a Raft leader's no-op) is carried out. Until then, and until the
producer table is rebuilt from the log, ``check_writable`` answers NotLeader: a write
taken earlier would be stored under the previous epoch and checked against a stale
producer table (issue 13, finding 1).

Partly stored writes. A client's request whose records are stored only in part — an
idempotent retry found a copy cut inside the request on the replica that led before (a
fetch or an Entries ends at a record, not at a request), or the store cut the batch (a
batch limit, a disk full mid-batch: the engine's put_batch stores all or refuses today,
the simulators' store cuts some) — is proposed with ``propose_write`` like any other, and
waits for the layer's verdict whatever its acks: the records stored may still be lost
with this leader, and a client told "these are stored, send the rest" would never send
them again. Only a verdict that committed them, and a record of this replica's epoch
after them (``_epoch_record_start``: the rest of the request may sit on the replica that led
before, and be committed when it leads again; the driver appends an empty control record
if the epoch has none yet), becomes the answer PartiallyStored
(idempotence.partially_stored, carrying the count stored); any other
verdict is answered as it is (the outcome is unknown: the client retries the whole
request, and finds the same copy). This is the one place the rule lives: the node
(node.py) turns the answer into its wire header, the simulators (mqlog/sim/partial.py)
check it under leader changes, and ``--break partial_early`` answers before the verdict.

Failure. A Ready that cannot be carried out (a disk error, a hard state that cannot be
saved) leaves the replica's memory and its disk disagreeing in ways nobody can tell. The
driver then stops for good: it records the error, tells the Io (``failed``: the node
logs it loudly and exits, so a restart runs the engine's recovery), answers every
waiting request FLUSH_SLAVE_TIMEOUT (its fate is unknown), and refuses everything after
(StoreFailed). It never retries the same Ready. One refusal is not a failure: records
from a peer that the store refuses (ReplicaDataRejected: it checks every record before
it writes any, so nothing of them is stored, and what the Ready did before them is
whole) are a peer's garbage or a bug, and the Io is asked for a new core over the store
(``refused``: what a restart would make of it) instead of stopping every group of the
broker for one peer's bytes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

from mqlog.config import RECORD_HEADER_SIZE
from mqlog.errors import NotLeader, PartiallyStored, ReplicaDataRejected, StoreFailed
from mqlog.replication.core import Ready
from mqlog.replication.idempotence import (
    ProducerTable,
    ProducerTag,
    Stored,
    partially_stored,
    producer_properties,
)
from mqlog.replication.messages import (
    Entries,
    EntriesReply,
    Fetch,
    FetchReply,
    LogReset,
    Message,
    TimeoutNow,
    Vote,
    VoteReply,
)
from mqlog.results import PutStatus

TEST_BREAKS = ("serve_early", "ack_before_flush", "vote_not_saved", "term_not_saved",
               "partial_early")

# What a proposal is answered with: the layer's verdict, or (a write stored in part, whose
# stored records that verdict committed) the refusal that names how many are stored.
Answer = PutStatus | PartiallyStored


@dataclasses.dataclass(frozen=True, slots=True)
class Cut:
    """A request stored in part: its producer tag, where its records went, how many the
    client sent."""

    producer: ProducerTag
    stored: Stored
    sent: int


def is_cut(stored: Stored, sent: int) -> bool:
    """Whether a request of ``sent`` records is stored in part (``write``'s answer)."""
    return stored.count < sent


class Io(Protocol):
    """What a driver asks of the world around it."""

    def send(self, messages: list[Message]) -> None:
        """Send these, in order (a lost message is the core's business)."""

    def save_hard_state(self, state: Any) -> None:
        """Save the core's hard state; return once it is durable."""

    def start_flush(self, done: Callable[[bool], None]) -> None:
        """Flush the store's log up to its written position; call ``done(ok)`` once that
        is durable (``ok`` False: the flush failed) — at once, or later."""

    def answer(self, request: Any, status: Answer) -> None:
        """A proposal was decided (a PartiallyStored only for ``propose_write``'s cut
        requests)."""

    def note(self, event: str) -> None:
        """News for the operator's log."""

    def failed(self, error: BaseException) -> None:
        """The replica stopped: a Ready could not be carried out."""

    def refused(self, error: ReplicaDataRejected) -> None:
        """A peer's records the store refused, nothing of them stored: give the driver a
        new core over the store (``replace_core``), as a restart would."""


class _PeerDataRefused(Exception):
    """The store refused a Ready's append of a peer's records (ReplicaDataRejected: it
    checks them all before it writes any, and changed nothing)."""

    def __init__(self, error: ReplicaDataRejected) -> None:
        super().__init__(str(error))
        self.error = error


class Driver:
    """One replica and the loop around its core; see the module docstring."""

    def __init__(self, store: Any, core: Any, io: Io, *, window_bytes: int = 16 << 20,
                 sequences_max: int = 1024, describe: bool = False,
                 test_break: str = "") -> None:
        # test_break: a deliberately broken driver, so the simulator can show its checkers
        # catch it (one of TEST_BREAKS: "serve_early": take writes before the term
        # started; "ack_before_flush": send what waits for a flush without waiting;
        # "vote_not_saved": save a vote for another node as no vote; "term_not_saved":
        # save nothing of a candidate's new term and self-vote; "partial_early": answer
        # a write stored in part PartiallyStored at once, before the verdict). Others
        # are ignored.
        self._test_break = test_break
        self.store, self.core, self.io = store, core, io
        self.producers = ProducerTable(sequences_max)
        self.window_bytes = window_bytes
        self.waiting: set[Any] = set()  # proposals not yet answered
        self.cuts: dict[Any, Cut] = {}  # the waiting proposals of writes stored in part
        self.failure: BaseException | None = None
        self.describe = describe
        self.described: list[str] = []  # what the last run() did (describe=True)
        self._serving_epoch = -1  # the epoch whose start is in the log, table rebuilt
        self.truncations = 0  # a flush's held messages are void once this moved
        self._running = False
        self._early: list[list[Message]] = []  # flushed during run(): sent in order
        self.flushes_started = 0

    # --- inputs ------------------------------------------------------------------------

    def tick(self) -> None:
        if self.failure is None:
            self.core.tick()

    def step(self, message: Message) -> None:
        if self.failure is None:
            self.core.step(message)

    def check_writable(self) -> None:
        """Raise NotMaster/NotLeader (or StoreFailed) unless this replica takes writes now."""
        if self.failure is not None:
            raise StoreFailed(f"this replica stopped after a failure: {self.failure}; "
                              "restart the node (recovery runs) and retry")
        core = self.core
        core.check_master()
        if self._serving_epoch != core.epoch and self._test_break != "serve_early":
            raise NotLeader(f"node {core.node_id} leads epoch {core.epoch} but has not "
                            "started it yet (its first record is not in its log): retry "
                            "in a moment", leader=core.node_id)

    def write(self, topic: Any, bodies: list[bytes], queue_id: Any = 0, key: Any = None,
              tags: Any = None, producer: ProducerTag | None = None) -> Stored:
        """Store one request's records (or find them: an idempotent retry of a write
        this replica has; ``producer`` is (id, sequence, epoch)). The caller checked
        ``check_writable`` since its last ``run``. A copy found may hold fewer records
        than ``bodies`` (cut inside the request on the replica that led before): the
        caller must not answer it as stored: ``propose_write`` answers it. So would a new
        write's, were the store to store a batch's first records only (the engine's
        put_batch stores all or refuses; the simulators' store cuts some)."""
        properties = None
        if producer is not None:
            found = self.producers.lookup(*producer)
            if found is not None:
                return found
            properties = producer_properties(*producer)
        store = self.store
        if len(bodies) == 1:
            one = store.put_nowait(topic, bodies[0], queue_id, key, tags, properties)
            stored = Stored(one.position, one.position + one.size, one.offset, 1,
                            one.store_timestamp)
        else:
            many = store.put_nowait(topic, bodies, queue_id, key, tags, properties)
            stored = Stored(many.position, many.end_position, many.offset, many.count,
                            many.store_timestamp)
        if producer is not None:
            self.producers.note(*producer, stored)
        return stored

    def propose(self, request: Any, end: int) -> None:
        """Everything up to ``end`` is stored: answer ``request`` with the layer's verdict."""
        self.core.propose(request, end)
        self.waiting.add(request)

    def propose_write(self, request: Any, stored: Stored, sent: int,
                      producer: ProducerTag | None) -> None:
        """A client's write of ``sent`` records went where ``stored`` says (``write``'s
        answer): answer ``request`` with the layer's verdict on it — or, stored in part
        (``is_cut``), PartiallyStored once that verdict committed its records, never
        before (the module docstring). A write stored in part is an idempotent
        producer's: only its tag lets the client send the rest once."""
        if not is_cut(stored, sent):
            return self.propose(request, stored.end)
        assert producer is not None, "a write stored in part needs its producer tag"
        cut = Cut(producer, stored, sent)
        if self._test_break == "partial_early":
            return self.io.answer(request, _refusal(cut))
        self.propose(request, max(stored.end, self._epoch_record_start() + 1))
        self.cuts[request] = cut

    def _epoch_record_start(self) -> int:
        """Where this replica's epoch's first record starts (appending one, an empty
        control record, if the epoch has none yet): a copy stored in part is answered
        PartiallyStored only once the commit passes the copy and this record. A copy cut
        on the replica that led before may hold the rest of its request on another
        replica, in an older epoch, past where this log's copy ends; it is dead only
        once a record of the current epoch after the copy is committed (Raft's §5.4.2:
        no later leader lacks that record; ISR: every member fetched it from this
        leader, cutting what diverged). Committed in an older epoch is not enough (raft
        seed 7400001690: the rest was committed by a later leader, and the client had
        sent it again). A Raft leader's epoch always holds a record (its no-op); an ISR
        or master-slave leader's holds none before its first write, so the driver
        appends one then, as Raft's no-op (waiting for a client's write instead, which
        may never come, left retries of the copy waiting for good: ISR seed
        7700000028)."""
        epoch = self.store.epoch
        start = next((start for started, start in self.store.epoch_starts()
                      if started == epoch), None)
        if start is None:  # an ISR or master-slave leader before its first write
            start = self.store.written_position
            self.store.append_control()  # (as a Raft leader's no-op)
        return start

    def change_membership(self, request: Any, voters: tuple[str, ...],
                          learners: tuple[str, ...], addresses: dict[str, str]) -> tuple[int, int]:
        """An operator's change of a group's configuration (a core that has one): the core
        checks it, its control record is stored, then proposed as ``request`` (answered
        once the change commits). Returns the record's end and size."""
        core = self.core
        membership, body = core.membership_record(voters, learners, addresses)
        end = self.store.append_control(body)
        core.membership_stored(membership, end, len(body))
        self.propose(request, end)
        return end, RECORD_HEADER_SIZE + len(body)

    def abandon_waiting(self) -> None:
        """This replica stopped leading (an operator's ``follow``): what waited here was
        stored here, and its fate on the new master is unknown."""
        self._answer_all(PutStatus.FLUSH_SLAVE_TIMEOUT)

    def replace_core(self, core: Any) -> None:
        """A new core over the same store: what waited on the old one has an unknown fate."""
        self.abandon_waiting()
        self.core, self._serving_epoch = core, -1

    # --- carrying out a Ready ------------------------------------------------------------

    def run(self) -> bool:
        """Carry out the core's Ready; False if there was nothing to do (or it stopped)."""
        self.described = []
        if self.failure is not None:
            return False
        ready = self.core.ready()
        if ready:
            self._running = True
            try:
                self._carry_out(ready)
            except _PeerDataRefused as refused:  # the store is whole: a new core from it
                self._early = []
                self.io.refused(refused.error)
                return True
            except Exception as error:  # whatever it was, memory and disk now disagree
                self._fail(error)
                return True
            finally:
                self._running = False
        self.core.advance(ready)
        self._maybe_serve()
        for request, status in ready.resolved:
            self._answer(request, status)
        return bool(ready)

    def _carry_out(self, ready: Ready) -> None:
        store, lines = self.store, self.described if self.describe else None
        if ready.hard_state is not None:
            self._save_hard_state(ready.hard_state)
            if lines is not None:
                lines.append(f"save hard state {describe_hard_state(ready.hard_state)}")
        if ready.reset_log is not None or ready.truncate_to is not None:
            self.truncations += 1
        self._change_log(ready, lines)
        held = ready.must_sync and self._test_break != "ack_before_flush"
        if ready.must_sync:
            if lines is not None:
                lines.append(f"sync to {store.written_position}")
            self._flush_then_send(list(ready.messages_after_persist) if held else [])
        if ready.commit_to is not None:
            store.set_committed_position(min(ready.commit_to, store.written_position))
            if lines is not None:
                lines.append(f"commit to {ready.commit_to}")
        self._send("send", ready.messages)
        if not held:
            self._send("send after persist", ready.messages_after_persist)
        for batch in self._early:  # flushes that completed during the run
            self._send("send after persist", batch)
        self._early = []
        if lines is not None:
            lines += [f"resolved {request} {status.value}" for request, status in ready.resolved]
            lines += [f"event: {event}" for event in ready.events]
        for event in ready.events:
            self.io.note(event)

    def _save_hard_state(self, state: Any) -> None:
        vote = getattr(state, "vote", "")
        if self._test_break == "term_not_saved" and vote == self.core.node_id:
            return
        if self._test_break == "vote_not_saved" and vote not in ("", self.core.node_id):
            state = dataclasses.replace(state, vote="")
        self.io.save_hard_state(state)

    def _change_log(self, ready: Ready, lines: list[str] | None) -> None:
        """Reset, truncate, append, set the epoch, append the no-op: in this order."""
        store = self.store
        if ready.reset_log is not None:
            store.reset(*ready.reset_log)
        if ready.truncate_to is not None:
            store.truncate(ready.truncate_to)
        for position, data in ready.appends:
            try:
                store.append_raw(position, data)
            except ReplicaDataRejected as error:  # (a peer's garbage, or a bug: the
                # store changed nothing, and what came before in this Ready is done)
                raise _PeerDataRefused(error) from error
        if ready.set_epoch is not None:
            store.set_epoch(ready.set_epoch)
        noop_start = store.written_position
        if ready.append_noop:
            store.append_control()
        if lines is None:
            return
        if ready.reset_log is not None:
            lines.append(f"reset log to {ready.reset_log[0]} epochs {ready.reset_log[1]}")
        if ready.truncate_to is not None:
            lines.append(f"truncate to {ready.truncate_to}")
        lines += [f"append [{position}, {position + len(data)})"
                  for position, data in ready.appends]
        if ready.set_epoch is not None:
            lines.append(f"set epoch {ready.set_epoch}")
        if ready.append_noop:
            lines.append(f"append no-op [{noop_start}, {store.written_position})")

    def _flush_then_send(self, held: list[Message]) -> None:
        truncations = self.truncations
        self.flushes_started += 1

        def done(ok: bool) -> None:
            if not ok:
                self.io.note("a flush failed; the acks that waited for it are withheld")
            elif truncations == self.truncations and self.failure is None and held:
                if self._running:
                    self._early.append(held)
                else:
                    self.io.send(held)

        self.io.start_flush(done)

    def _send(self, label: str, messages: list[Message]) -> None:
        if messages:
            self.io.send(messages)
            if self.describe:
                self.described.append(f"{label}: {summarize(messages)}")

    @property
    def serving(self) -> bool:
        """Whether this replica has started its term as master (takes writes)."""
        return self.failure is None and self.core.is_master and \
            self._serving_epoch == self.core.epoch

    def _maybe_serve(self) -> None:
        """A master whose epoch is now stamped in its store has started its term: rebuild
        the producer table from its log, then take writes."""
        core = self.core
        if core.is_master and self._serving_epoch != core.epoch and \
                self.store.epoch == core.epoch:
            self.producers.rebuild(self.store, self.window_bytes)
            self._serving_epoch = core.epoch
        elif not core.is_master:
            self._serving_epoch = -1

    def _answer(self, request: Any, status: PutStatus) -> None:
        """The layer's verdict on ``request``; a write stored in part whose records it
        committed is refused: PartiallyStored, naming how many are stored. A request
        answered already (``abandon_waiting``: the core still resolves it) is not
        answered again."""
        if request not in self.waiting:
            return
        self.waiting.discard(request)
        cut = self.cuts.pop(request, None)
        if cut is not None and status is PutStatus.PUT_OK:
            self.io.answer(request, _refusal(cut))
        else:
            self.io.answer(request, status)

    def _answer_all(self, status: PutStatus) -> None:
        """Not PUT_OK: a write stored in part gets it as any other (its fate unknown)."""
        waiting, self.waiting = self.waiting, set()
        self.cuts = {}
        for request in waiting:
            self.io.answer(request, status)

    def _fail(self, error: BaseException) -> None:
        self.failure = error
        self._early = []
        self.io.note(f"a Ready could not be carried out; this replica stops: {error!r}")
        self._answer_all(PutStatus.FLUSH_SLAVE_TIMEOUT)
        self.io.failed(error)


def _refusal(cut: Cut) -> PartiallyStored:
    producer_id, sequence, _epoch = cut.producer
    return partially_stored(producer_id, sequence, cut.stored, cut.sent)


# --- describing what a driver did (the datadriven tests print it) ------------------------


def describe_hard_state(state: Any) -> str:
    """Raft's: term=T vote=V (and the membership changes the log holds, if any); another
    layer's: its fields, name=value."""
    if not hasattr(state, "term"):
        return " ".join(f"{item.name}={getattr(state, item.name)}"
                        for item in dataclasses.fields(state))
    text = f"term={state.term} vote={state.vote or '-'}"
    for change in getattr(state, "memberships", ()):
        text += f" membership@{change.position}={','.join(change.voters)}"
        text += f"+{','.join(change.learners)}" if change.learners else ""
    return text


def summarize(messages: list[Message]) -> str:
    """"entries->n2 x3, vote->n3": kind and destination, counted, in order of appearance."""
    counts: dict[str, int] = {}
    for message in messages:
        key = f"{message.kind}->{message.dst}"
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(key + (f" x{count}" if count > 1 else "") for key, count in counts.items())


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _describe_fetch(message: Fetch | FetchReply) -> str:
    """The ISR layer's fetch and its answer, as the datadriven tests print them."""
    head = f"{message.src}->{message.dst} {message.kind} epoch={message.epoch} " \
        f"fetch={message.fetch_id}"
    if isinstance(message, Fetch):
        return head + f" position={message.position} last_epoch={message.last_epoch}"
    if message.error:
        start = f" log_start={message.log_start} start_epoch={message.start_epoch}" \
            if message.error == "OFFSET_OUT_OF_RANGE" else ""
        return head + f" error={message.error}{start}"
    if message.diverging_end >= 0:
        return head + (f" diverging=(epoch {message.diverging_epoch} ends at "
                       f"{message.diverging_end}) hw={message.high_watermark}")
    records = f" [{message.position}, {message.position + len(message.payload)}) " \
        f"e{message.records_epoch}" if message.payload else f" empty at {message.position}"
    return head + records + f" hw={message.high_watermark}"


def describe_message(message: Message) -> str:
    """One message, as the datadriven tests print it."""
    head = f"{message.src}->{message.dst} {message.kind} term={message.epoch}"
    if isinstance(message, Vote):
        tail = (f" position={message.position} last_epoch={message.last_epoch} "
                f"pre_vote={_flag(message.pre_vote)}")
        return head + tail + (" transfer=true" if message.transfer else "")
    if isinstance(message, VoteReply):
        return head + f" granted={_flag(message.granted)} pre_vote={_flag(message.pre_vote)}"
    if isinstance(message, Entries):
        epoch = f" epoch={message.entries_epoch}" if message.entries_epoch >= 0 else ""
        changes = " with membership changes" if message.memberships else ""
        return head + (f" prev=({message.prev_position},{message.prev_epoch}){epoch} "
                       f"bytes={len(message.payload)} commit={message.commit}{changes}")
    if isinstance(message, EntriesReply):
        if message.success:
            return head + f" ok match={message.match}"
        return head + f" refused hint=({message.hint_position},{message.hint_epoch})"
    if isinstance(message, LogReset):
        changes = " with membership changes" if message.memberships else ""
        return head + (f" start=({message.position},{message.last_epoch}) epoch_start="
                       f"{message.last_epoch_start} commit={message.commit}{changes}")
    if isinstance(message, TimeoutNow):
        return head
    if isinstance(message, Fetch | FetchReply):
        return _describe_fetch(message)
    fields = {key: value for key, value in vars(message).items()
              if key not in ("src", "dst", "payload", "cluster_id")}
    text = " ".join(f"{key}={value}" for key, value in fields.items())
    payload = getattr(message, "payload", None)
    if payload is not None:
        text += f" bytes={len(payload)}"
    return f"{message.src}->{message.dst} {message.kind} {text}"
