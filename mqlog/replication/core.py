"""What every replication core shares: the Ready it hands its driver, and the log it reads.

A core is sans-IO (etcd raft's RawNode shape, DESIGN §5): it owns no socket, clock,
thread or file. A driver calls ``tick()`` every ``tick_ms``, ``step(message)`` for each
message that arrives, ``propose(...)`` after the engine stored a write, then takes
``ready()``, carries it out in order — save the hard state (Raft's term and vote, synced),
reset, truncate, append, set the epoch, append a no-op control record if asked, sync if asked,
set the committed position, send ``messages``, send ``messages_after_persist`` — and
calls ``advance(ready)``. One driver does that for every layer: driver.py. Every core
also answers ``has_ready()``: False only when ``ready()`` would return an empty Ready (a
leader, which builds its Ready in ready() from its own log, says True when that log or
its flushed position moved since its last ready(), or something is in flight), so a
node may skip the run after a tick that left nothing to do (node.py; tests/
test_broker_ticks.py checks the promise after every tick of the simulator's seeds).

A core reads its own store through ``LogView`` (reading is deterministic and cheap, as
etcd raft reads its Storage); it never writes to it: every change to the log is in a
Ready, so a simulator can apply it, delay it, or lose it in a crash.
"""

from __future__ import annotations

import dataclasses
import enum
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Protocol

from mqlog.engine.files import FileExtent
from mqlog.errors import CorruptRecord, InvalidPosition
from mqlog.replication.messages import Message
from mqlog.results import PutStatus


class LogView(Protocol):
    """The read side of a store that a core needs (mqlog.Store provides it)."""

    @property
    def written_position(self) -> int: ...
    @property
    def flushed_position(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    def epoch_starts(self) -> list[tuple[int, int]]: ...
    def epoch_at(self, position: int) -> int | None: ...
    def read_raw(self, position: int, max_bytes: int) -> bytes: ...
    def read_for_send(self, position: int, max_bytes: int) -> bytes | FileExtent: ...
    def is_record_start(self, position: int) -> bool: ...  # (a damaged header's too)
    def first_segment_base(self) -> int: ...  # the log's start (retention moves it)


@dataclass
class Ready:
    """What the driver must do now, in this order (see the module docstring)."""

    hard_state: Any = None  # Raft's HardState (term, vote, memberships): save and sync first
    # start the log over, empty, at this position with these epoch starts (a follower
    # behind its leader's log start): before anything else is done to the log
    reset_log: tuple[int, list[tuple[int, int]]] | None = None
    truncate_to: int | None = None  # cut the log here first (a slave that diverged)
    appends: list[tuple[int, bytes]] = field(default_factory=list)  # raw records, in order
    set_epoch: int | None = None  # stamp later records with this epoch (a promotion)
    append_noop: bool = False  # append an empty control record (a new Raft leader's)
    must_sync: bool = False  # flush the log before sending messages_after_persist
    commit_to: int | None = None  # the committed position moved here
    messages: list[Message] = field(default_factory=list)
    messages_after_persist: list[Message] = field(default_factory=list)
    resolved: list[tuple[Any, PutStatus]] = field(default_factory=list)  # proposals decided
    events: list[str] = field(default_factory=list)  # news for the operator's log

    def start_log_over(self, position: int, epoch_starts: list[tuple[int, int]]) -> None:
        """Reset the log: whatever this Ready meant to truncate or append is moot — a
        leadership's epoch stamp and no-op too. A Raft candidate paused with its votes on
        the way won its old term and then took a newer leader's LogReset in one Ready
        (ISR seed 28100259): its stamp of the old term, carried out after the reset, was
        below the reset's epochs (InvalidArgument: the replica stopped), and its no-op
        would have followed the leader's records in an older term."""
        self.reset_log, self.truncate_to, self.appends = (position, epoch_starts), None, []
        self.set_epoch, self.append_noop = None, False

    def __bool__(self) -> bool:
        return bool(self.hard_state is not None or self.reset_log is not None
                    or self.truncate_to is not None
                    or self.appends or self.set_epoch is not None or self.append_noop
                    or self.must_sync or self.commit_to is not None or self.messages
                    or self.messages_after_persist or self.resolved or self.events)


@dataclass
class Proposal:
    request_id: Any
    end: int
    deadline_tick: int


class Proposals:
    """The writes a leader stored and waits to see replicated (its core's ``propose``):
    each is answered PUT_OK once the committed position reaches its end, or with the
    layer's timeout status at its deadline. Deadlines come in proposal order (each is the
    proposal's tick plus one timeout); ends need not: an idempotent retry proposes its
    stored copy's end, which may lie before a newer write's, and is answered as soon as
    that end is committed, not once the newer write's is. Answers go into a Ready's
    ``resolved`` list as (request id, status)."""

    def __init__(self) -> None:
        self._queue: deque[Proposal] = deque()
        self._in_end_order = True  # each end >= the one before: commits pop the front

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Proposal]:
        return iter(self._queue)

    def add(self, request_id: Any, end: int, deadline_tick: int) -> None:
        queue = self._queue
        if queue and end < queue[-1].end:
            self._in_end_order = False
        queue.append(Proposal(request_id, end, deadline_tick))

    def commit(self, position: int, resolved: list[tuple[Any, PutStatus]]) -> None:
        """Answer PUT_OK every write that ends at or before ``position``."""
        queue = self._queue
        if self._in_end_order:
            while queue and queue[0].end <= position:
                resolved.append((queue.popleft().request_id, PutStatus.PUT_OK))
            return
        resolved += [(proposal.request_id, PutStatus.PUT_OK) for proposal in queue
                     if proposal.end <= position]
        self._queue = queue = deque(proposal for proposal in queue if proposal.end > position)
        self._in_end_order = all(a.end <= b.end for a, b in pairwise(queue))

    def expire(self, tick: int, resolved: list[tuple[Any, PutStatus]],
               status: PutStatus) -> None:
        """Answer ``status`` every write whose deadline is ``tick`` or earlier."""
        queue = self._queue
        while queue and queue[0].deadline_tick <= tick:
            resolved.append((queue.popleft().request_id, status))
        if not queue:
            self._in_end_order = True

    def resolve_all(self, resolved: list[tuple[Any, PutStatus]], status: PutStatus) -> None:
        """Answer every write ``status`` (the leader lost its role or its quorum)."""
        resolved += [(proposal.request_id, status) for proposal in self._queue]
        self._queue.clear()
        self._in_end_order = True

    def furthest_end(self) -> int:
        """The furthest end a write waits for (-1: none waits)."""
        if self._in_end_order:
            return self._queue[-1].end if self._queue else -1
        return max(proposal.end for proposal in self._queue)


UNSEEN = (-1, -1)  # log_positions of no ready() yet: a leader's has_ready() says yes


def log_positions(log: LogView) -> tuple[int, int]:
    """(written, flushed): what a leader's ready() builds from beside its messages. It
    reads them first and keeps them; has_ready() compares them with the log's now (a
    flush thread may move them during ready(): a later move makes it say yes)."""
    return log.written_position, log.flushed_position


def epoch_ending_at(epoch_starts: list[tuple[int, int]], position: int) -> tuple[int, int]:
    """(epoch, start) of the epoch of the record that ends at ``position``: what a
    LogReset tells a replica that starts its log over there ((-1, -1): none)."""
    before = [(epoch, start) for epoch, start in epoch_starts if start < position]
    return before[-1] if before else (-1, -1)


class Unsendable(enum.Enum):
    """Why a leader's read for a peer (``PeerReads.read``) found no records to send."""

    GONE = "retention let them go"  # the caller starts the peer over at the log's start
    DAMAGED = "this log's copy is damaged there"  # the read met it now (reported once)
    WAITING = "damaged there when last read"  # not read again before ``retry_ticks``


class PeerReads:
    """A leader's reads of its own log for its peers (``read_for_send``), and the two ways
    such a read finds nothing to send.

    * Retention (the store's maintenance thread) lets the log's front go at any time, so
      also between a caller's check of the log start and its read: GONE, and the caller
      starts the peer over at the new start in this run, as its next run would have.
    * A record of this log is damaged (CorruptRecord): the records before it are sent,
      and a read from it answers DAMAGED. The damage stays until an operator repairs the
      store or retention lets the segment go, so a read from there for that peer answers
      WAITING for ``retry_ticks`` without reading, and the operator hears of it once per
      peer and damaged position while this node leads, not once a run. The leader serves
      its other peers meanwhile (a damaged record once stalled the whole group: ready()
      raised on every other run).

    A read from a record whose header is damaged raises InvalidPosition, as from a
    position inside a record: it is DAMAGED too where an earlier read met that record, or
    where the records before it reach it (``is_record_start``). Any other InvalidPosition
    is a caller's bug (a position that starts no record) and is raised as itself. That
    check walks the headers from the segment's start, with the GIL held (140 ms for a
    full segment of 1 GiB), so a position of the log found to start no record is
    remembered (``INSIDE_KEPT_MAX`` of them), not walked to again each time a peer with
    that bug asks: a leader's log only grows while it leads (``clear`` forgets them when
    it leads anew), and a position past its end is not remembered (the log may reach
    it)."""

    INSIDE_KEPT_MAX = 1024  # positions remembered to start no record (then forgotten)

    def __init__(self, log: LogView, node_id: str, retry_ticks: int) -> None:
        self._log, self._node_id, self._retry_ticks = log, node_id, retry_ticks
        self._failed: dict[str, tuple[int, int]] = {}  # peer -> (damaged position, when)
        self._reported: set[tuple[str, int]] = set()  # (peer, damaged position)
        self._damaged: set[int] = set()  # records found damaged (where records start)
        self._inside: set[int] = set()  # positions of the log found to start no record

    def read(self, peer: str, position: int, limit: int, tick: int,
             events: list[str]) -> bytes | FileExtent | Unsendable:
        """The records for ``peer`` from ``position`` (at most ``limit`` bytes)."""
        if self.waiting(peer, position, tick):
            return Unsendable.WAITING
        try:
            return self._read(position, limit)
        except InvalidPosition as problem:
            damaged = self._is_record_start(position)
            if position < self._log.first_segment_base():
                return Unsendable.GONE
            if not damaged:
                raise
            self._damaged.add(position)
            damage = CorruptRecord(position, f"its header is damaged ({problem})")
        except CorruptRecord as found:
            damage = found
        self._failed[peer] = (position, tick)
        if (peer, position) not in self._reported:
            self._reported.add((peer, position))
            events.append(f"{self._node_id} cannot send {peer} the records from "
                          f"{position}: {damage}")
        return Unsendable.DAMAGED

    def _is_record_start(self, position: int) -> bool:
        """``is_record_start``, learned once per position of the log (class docstring)."""
        if position in self._damaged:
            return True
        if position in self._inside:
            return False
        if self._log.is_record_start(position):
            return True
        if position < self._log.written_position:
            if len(self._inside) >= self.INSIDE_KEPT_MAX:
                self._inside.clear()
            self._inside.add(position)
        return False

    def _read(self, position: int, limit: int) -> bytes | FileExtent:
        """The records from ``position``; those before a damaged one, if any (whole: the
        next read starts at it). CorruptRecord if the first is damaged."""
        try:
            return self._log.read_for_send(position, limit)
        except CorruptRecord as damage:
            self._damaged.add(damage.position)
            if damage.position == position:
                raise
            return self._log.read_for_send(position, damage.position - position)

    def waiting(self, peer: str, position: int, tick: int) -> bool:
        """Whether a read for ``peer`` from ``position`` answers WAITING now: a core's
        has_ready() leaves such a peer out (it would run every tick and send nothing)."""
        failed = self._failed.get(peer)
        return failed is not None and failed[0] == position and \
            tick - failed[1] < self._retry_ticks

    def damaged_at(self, peer: str) -> int | None:
        """The damaged record the last failed read for ``peer`` met, if any."""
        failed = self._failed.get(peer)
        return None if failed is None else failed[0]

    def clear(self) -> None:
        """This node leads anew: every peer's damage is news again, and what was learned
        of this log may be stale (as a follower, its tail may have been cut since)."""
        self._failed.clear()
        self._reported.clear()
        self._damaged.clear()
        self._inside.clear()


class PeerMessages:
    """What every core does with its peers' messages beyond its protocol: stamp its own
    with the cluster id, and count (and report once per sender) the ones it ignores."""

    EPOCH_WORD = "epoch"  # what the layer calls a message's epoch in its events
    node_id: str
    config: Any
    ignored: int
    _ignored_from: set[str]
    _ready: Ready

    def _stamp(self, message: Message) -> Message:
        cluster_id = self.config.cluster_id
        return dataclasses.replace(message, cluster_id=cluster_id) if cluster_id else message

    def _ignore(self, message: Message, why: str) -> bool:
        """Count ``message`` as ignored (one event per sender, not a flood); False."""
        self.ignored += 1
        if message.src not in self._ignored_from:
            self._ignored_from.add(message.src)
            self._ready.events.append(f"{self.node_id} ignores {message.kind} "
                                      f"({self.EPOCH_WORD} {message.epoch}) from "
                                      f"{message.src}: {why}")
        return False
