"""The ISR core: Kafka's per-partition replication as a sans-IO state machine (DESIGN §5.3).

Who leads is not this core's decision. The controller decides the partition's leader,
leader epoch, partition epoch, ISR and ELR (``PartitionState``); the host hands each new
decision to ``apply_metadata``. A replica that the state names as leader stamps its
records with the leader epoch (``Ready.set_epoch``: Kafka writes no no-op) and serves
writes; the other replicas fetch from it.

Followers pull (KIP-101/279/320 in one round trip). A follower has one ``Fetch`` in
flight: its log end and the epoch of the record ending there. The leader checks that
pair against its own epochs: if the follower's last epoch is not in the leader's log, or
the follower's log goes past where that epoch ends in the leader's, the answer names the
leader's newest epoch not newer than it and where it ends (``diverging_epoch``,
``diverging_end``); the follower truncates to the sooner of that end and the end of its
own newest epoch not newer than it — by leader epoch, never to the high watermark
(KIP-101's bug) — and fetches again: one round trip per diverged epoch (KIP-279). A
follower that does not have the leader's epoch truncates to the end of its own newest
epoch older than it only (the epochs after that one are in no leader's log) and asks
again from there: the leader's end of that epoch may lie before the end it named. A
fetch before the leader's log start is answered OFFSET_OUT_OF_RANGE: the follower starts
its log over, empty, at the leader's log start. Otherwise the leader answers with raw
records of one epoch from the fetch position (at most ``fetch_bytes_max``), its high
watermark and its log start. A fetch that would get fewer than ``fetch_bytes_min`` bytes
waits at the leader (long poll) until there are enough or ``fetch_wait_ms_max`` passed,
so an idle partition costs one round trip per wait. A follower's fetch position is its
ack: with ``replica_ack = "flushed"`` a follower sends its next Fetch only once what it
appended is durable. A fetch not answered within the wait plus ``retransmit_ticks`` is
sent again (a new ``fetch_id``: the old answer, should it come, is dropped); an error
answer (a fenced or unknown leader epoch, not the leader) is retried after
``retransmit_ticks``, while the host brings newer metadata.

High watermark. The leader's is the lowest log end among the ISR members (its own
counted written or flushed, per ``replica_ack``), and it advances only while the ISR
has at least ``min_insync_replicas`` members (KIP-966's strict min ISR: a record
committed with fewer could be lost with them). While an AlterPartition is pending, the
lowest end is taken over the ISR and the members it would add or remove (Kafka's
maximal ISR). A new leader knows no follower's end until each fetched in its epoch, so
its high watermark waits for them; it never moves back. A follower's high watermark is
the leader's, capped at its own end. Both are the store's committed position: readers
see nothing above it.

ISR changes. A follower in the ISR that has not caught up with the leader's end for
``replica_lag_time_ms`` (Kafka's lastCaughtUpTime rule: caught up at a fetch that
reached the leader's end, or one that reached the end the leader had at the previous
fetch) is shrunk out; a follower outside it joins when its fetch reaches the high
watermark and the start of the current leader epoch. Either becomes one
``AlterPartition`` (the new ISR with the partition epoch it was computed from), sent in
the Ready's messages to ``CONTROLLER`` for the host to pass on. One is pending at a
time, sent again after ``alter_partition_retry_ms``; any newer metadata settles it (the
controller decided, maybe otherwise: a request made from a stale partition epoch is
refused there), and ``alter_partition_refused`` lets the host say it was refused (a
refusal for a moved epoch keeps it pending until the metadata comes: it may have been
applied).

Produce (acks). ``may_accept("replicated")`` (acks=all) raises NotEnoughReplicas while
the ISR is smaller than ``min_insync_replicas``: nothing is stored. ``propose(id, end)``
waits until the high watermark reaches ``end`` (PUT_OK); if the ISR shrinks below the
minimum meanwhile it answers NOT_ENOUGH_REPLICAS_AFTER_APPEND, after
``sync_timeout_ticks`` REQUEST_TIMED_OUT, and when this leader loses its leadership
REQUEST_TIMED_OUT as well — each stored, and it may still commit: an idempotent retry
(the driver's producer table) settles it. acks=1 and acks=0 are never proposed: the
leader's own write is their answer.

Only the partition's replicas of this ``cluster_id`` are heard; the rest is counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from mqlog.config import ReplicationConfig
from mqlog.engine.files import FileExtent
from mqlog.errors import (
    MqlogError,
    NotEnoughReplicas,
    NotEnoughReplicasAfterAppend,
    NotLeader,
    RequestTimedOut,
)
from mqlog.replication.core import (
    UNSEEN,
    LogView,
    PeerMessages,
    PeerReads,
    Proposals,
    Ready,
    Unsendable,
    epoch_ending_at,
    log_positions,
)
from mqlog.replication.epochs import EpochMirror
from mqlog.replication.messages import Fetch, FetchReply, Message
from mqlog.results import PutStatus

TEST_BREAKS = ("truncate_to_hw", "hw_below_min_isr", "hw_all_replicas",
               "forget_stale_alter")
LEADER, FOLLOWER, OFFLINE = "LEADER", "FOLLOWER", "OFFLINE"
CONTROLLER = "controller"  # AlterPartition's destination: the host passes it on
FAR_PAST = -(1 << 62)
ACKS_ALL = ("replicated", "all", "-1")
ACKS_LEADER = ("master", "1", "0")


@dataclass(frozen=True)
class PartitionState:
    """The controller's decision for one partition (a PartitionChange's fields)."""

    leader: str  # "": none
    leader_epoch: int
    partition_epoch: int
    isr: tuple[str, ...]
    elr: tuple[str, ...] = ()
    replicas: tuple[str, ...] = ()

    @classmethod
    def of(cls, info: Any) -> PartitionState:
        """From anything with these fields (the controller's PartitionInfo)."""
        return cls(info.leader, info.leader_epoch, info.partition_epoch, tuple(info.isr),
                   tuple(info.elr), tuple(info.replicas))


@dataclass(frozen=True)
class AlterPartition(Message):
    """Leader → controller: make ``isr`` the ISR; computed from ``partition_epoch``
    (``epoch`` is the leader epoch). Never on the peer wire: the host sends it on."""

    kind: ClassVar[str] = "alter_partition"
    partition_epoch: int
    isr: tuple[str, ...]


@dataclass
class Replica:
    """What a leader knows of one follower in its leader epoch."""

    log_end: int = -1  # where its log agrees with the leader's (-1: not fetched yet)
    caught_up_tick: int = FAR_PAST
    fetch_tick: int = FAR_PAST
    fetch_leader_end: int = -1  # the leader's end at its previous fetch
    waiting: Fetch | None = None  # a fetch held for the long poll
    deadline_tick: int = 0
    answer_now: bool = False


@dataclass
class PendingAlter:
    request: AlterPartition
    sent_tick: int


def answer_error(status: PutStatus) -> Exception | None:
    """The typed error a client raises for an acks=all answer (None: PUT_OK)."""
    if status is PutStatus.NOT_ENOUGH_REPLICAS_AFTER_APPEND:
        return NotEnoughReplicasAfterAppend(
            "the write is stored but the ISR shrank below min_insync_replicas before it "
            "was committed; it may still commit: retry with the same producer sequence")
    if status is PutStatus.REQUEST_TIMED_OUT:
        return RequestTimedOut("the write is stored but was not committed in time (or the "
                               "leader changed); it may still commit: retry with the same "
                               "producer sequence")
    return None


class IsrCore(EpochMirror, PeerMessages):
    """One replica of an ISR partition; see the module docstring."""

    def __init__(self, config: ReplicationConfig, log: LogView, *,
                 metadata: PartitionState | None = None, high_watermark: int = 0,
                 test_break: str = "") -> None:
        assert config.layer == "isr"
        assert test_break in ("", *TEST_BREAKS)
        # test_break: a deliberately broken core, so tests show the checkers catch it
        # ("truncate_to_hw": a follower cuts its log to its high watermark when it starts
        # following, as Kafka did before KIP-101; "hw_below_min_isr": the high watermark
        # advances with fewer than min_insync_replicas in the ISR; "hw_all_replicas":
        # the high watermark is the lowest end among the replicas it hears from, ISR or
        # not, instead of among the ISR members: a silent ISR member is not waited for;
        # "forget_stale_alter": a refusal for a moved epoch drops the pending request, so
        # the high watermark may pass a follower whose joining the controller accepted).
        self._test_break = test_break
        self.config = config.validate()
        self.log = log
        self.node_id = config.node_id
        self.replicas_config = config.replicas
        self.state = PartitionState("", -1, -1, ())
        self.role = OFFLINE
        self.tick_count = 0
        self._end = log.written_position  # the log's end, pending appends counted
        self.hw = 0  # learnt again from the leader after a restart, or (leading) below:
        # The high watermark this replica saved before the restart (the node's), capped at
        # its log's end: taken if it leads before it follows (the last ISR member
        # restarted: readers see the committed records at once, whatever the ISR's size
        # now). A follower drops it: an unclean election may have cut what it counted,
        # and its leader's answers say where the high watermark is, after truncating.
        self._saved_hw = min(high_watermark, self._end)
        self._epochs = list(log.epoch_starts())
        self._epoch_start_offset = 0  # a leader's end when its leader epoch began
        self.followers: dict[str, Replica] = {}
        self._reads = PeerReads(log, self.node_id, self.config.retransmit_ticks)
        self._waiting = Proposals()
        self._pending: PendingAlter | None = None
        self._fetch_id = 0
        self._fetch_sent_tick: int | None = None  # None: no fetch in flight
        self._fetch_due_tick = 0
        self._ready = Ready()
        self._seen = UNSEEN  # a leader's log_positions at its last ready()
        self.ignored = 0
        self._ignored_from: set[str] = set()
        self._lag_ticks = config.ticks(config.replica_lag_time_ms)
        self._wait_ticks = config.ticks(config.fetch_wait_ms_max)
        self._alter_retry_ticks = config.ticks(config.alter_partition_retry_ms)
        if metadata is not None:
            self.apply_metadata(metadata)

    # --- what drivers, hosts and operators use -------------------------------------------

    @property
    def epoch(self) -> int:
        """The leader epoch this replica knows (the driver serves writes in it)."""
        return self.state.leader_epoch

    @property
    def high_watermark_to_save(self) -> int:
        """What the node saves as this replica's high watermark: a restart's saved one
        too, while it is neither taken (leading) nor dropped (following)."""
        return max(self.hw, self._saved_hw)

    @property
    def is_master(self) -> bool:
        return self.role == LEADER

    @property
    def leader(self) -> str:
        return self.state.leader

    @property
    def isr(self) -> tuple[str, ...]:
        return self.state.isr

    @property
    def replicas(self) -> tuple[str, ...]:
        return self.state.replicas or self.replicas_config

    def tick(self) -> None:
        self.tick_count += 1
        if self.role == LEADER:
            self._leader_tick()
        elif self.role == FOLLOWER:
            self._follower_tick()

    def step(self, message: Message) -> None:
        if not self._admits(message):
            return
        if isinstance(message, Fetch):
            self._on_fetch(message)
        elif isinstance(message, FetchReply):
            self._on_fetch_reply(message)

    def check_master(self) -> None:
        """Raise NotLeader unless this replica leads its partition now."""
        if self.role != LEADER:
            leader = self.state.leader
            raise NotLeader(f"node {self.node_id} does not lead this partition in leader "
                            f"epoch {self.state.leader_epoch}; " +
                            (f"the leader is {leader}" if leader else
                             "the controller has named no leader yet: retry soon"),
                            leader=leader or None)

    def may_accept(self, acks: str = "replicated") -> PutStatus:
        """Ask before storing a write: NotLeader unless this replica leads;
        NotEnoughReplicas for acks=all while the ISR is smaller than
        min_insync_replicas (nothing is stored: a retry is safe); else PUT_OK."""
        self.check_master()
        assert acks in ACKS_ALL + ACKS_LEADER, acks
        minimum = self.config.min_insync_replicas
        if acks in ACKS_ALL and len(self.replicas) < minimum:
            raise NotEnoughReplicas(
                f"the partition has {len(self.replicas)} replica(s), fewer than "
                f"min_insync_replicas={minimum}: acks=all can never succeed here and nothing "
                "was stored (nor do acks=1 writes become visible to readers: KIP-966's "
                "strict min ISR); write with acks=1, or create the topic with "
                f"--min-insync-replicas {len(self.replicas)} (or more replicas)")
        if acks in ACKS_ALL and len(self.state.isr) < minimum:
            raise NotEnoughReplicas(
                f"partition ISR {list(self.state.isr)} has fewer than min_insync_replicas="
                f"{self.config.min_insync_replicas} members: nothing was stored; retry "
                "once the lagging replicas are back in the ISR, or write with acks=1")
        return PutStatus.PUT_OK

    def propose(self, request_id: Any, end: int) -> None:
        """An acks=all write ending at ``end`` was stored: answer once it is committed."""
        self.check_master()
        if end <= self.hw:
            self._ready.resolved.append((request_id, PutStatus.PUT_OK))
            return
        if len(self.state.isr) < self.config.min_insync_replicas:
            self._ready.resolved.append((request_id,
                                         PutStatus.NOT_ENOUGH_REPLICAS_AFTER_APPEND))
            return
        self._waiting.add(request_id, end, self.tick_count + self.config.sync_timeout_ticks)
        self._seen = UNSEEN  # (a fetch held for min bytes may be answered now: _answer_fetches)
        if self.config.replica_ack == "flushed" and self.log.flushed_position < end:
            self._ready.must_sync = True  # the leader's own copy counts once durable

    def ready(self) -> Ready:
        if self.role == LEADER:
            seen = log_positions(self.log)  # (first: see log_positions)
            self._refresh_from_log()
            self._maybe_advance_hw()
            self._answer_fetches()
            self._seen = seen
        return self._ready

    def has_ready(self) -> bool:
        """Whether ``ready()`` may return a non-empty Ready. A follower (or a replica
        without a role) only adds to its pending Ready as it ticks and steps, so exactly
        when that is not empty. A leader builds it in ready() from its log's written and
        flushed positions (its own writes go to the store directly: the high watermark,
        the held fetches that now have bytes to send) and from what its ticks mark (a
        held fetch whose wait is over); when none of them moved since its last ready(),
        and its ticks added nothing, that ready() would find nothing new: an idle
        partition's leader is not run every tick. Steps, new metadata and proposals
        change what ready() computes from too: a driver runs after each step, and
        apply_metadata and propose (a held fetch an acks=all write now waits for) make
        the next has_ready() say yes. (A driver may skip a run that would find
        nothing: node.py after a tick.)"""
        if self._ready:
            return True
        if self.role != LEADER:
            return False
        return log_positions(self.log) != self._seen or \
            any(progress.answer_now for progress in self.followers.values())

    def advance(self, ready: Ready) -> None:
        assert ready is self._ready, "advance() takes the Ready that ready() returned"
        self._ready = Ready()
        # The store carried it out: it is the truth again (a leader's log also grew).
        self._end = self.log.written_position
        self._epochs = self.log.epoch_starts()

    def apply_metadata(self, state: PartitionState) -> None:
        """The controller's newest decision for this partition (stale ones are ignored)."""
        current = self.state
        if state.partition_epoch <= current.partition_epoch or \
                state.leader_epoch < current.leader_epoch:
            return
        written = max((epoch for epoch, _ in self.log.epoch_starts()), default=-1)
        if state.leader == self.node_id and (state.leader_epoch, current.leader) != (
                current.leader_epoch, self.node_id) and (
                state.leader_epoch < self.log.epoch or state.leader_epoch <= written):
            # Its log has records of that leader epoch already: it led it in an earlier
            # life (a restart the controller has not seen yet), and may have lost records
            # its followers hold; leading it again would truncate them. The controller
            # moves leadership on the re-registration, to a new leader epoch.
            self._ready.events.append(
                f"{self.node_id} ignores metadata naming it leader in epoch "
                f"{state.leader_epoch}: its log has records of epoch {max(written, 0)} "
                f"(epoch {self.log.epoch}) already")
            return
        new_leadership = (state.leader, state.leader_epoch) != (current.leader,
                                                               current.leader_epoch)
        self.state = state
        self._pending = None  # whatever was asked, the controller has decided
        self._seen = UNSEEN  # (what ready() computes from moved: has_ready says yes)
        if new_leadership:
            self._change_role()
        elif self.role == LEADER:
            self._isr_changed(current.isr)

    def alter_partition_refused(self, reason: str, stale: bool = False) -> None:
        """The controller refused the pending AlterPartition. Refused as not applied: decide
        again next tick. Refused as ``stale`` (an epoch moved): an earlier copy of it may be
        what moved the epoch, its ISR in force once the metadata arrives — so it stays
        pending, counted in the high watermark (the maximal ISR), until that metadata
        settles it (Kafka's INVALID_UPDATE_VERSION; dropping it let the high watermark
        pass a joining follower that the arriving metadata then put in the ISR)."""
        if self._pending is not None:
            self._ready.events.append(f"{self.node_id}'s AlterPartition was refused: {reason}"
                                      + ("; waits for the newer metadata" if stale else ""))
            if not stale or self._test_break == "forget_stale_alter":
                self._pending = None

    def invariants(self) -> None:
        """Assert what must hold between steps (the simulator checks after each one)."""
        assert 0 <= self.hw <= self._end, (self.hw, self._end)
        assert self.role != LEADER or self.node_id in self.state.isr or \
            self.state.isr == (), self.state
        assert [s for _, s in self._epochs] == sorted(s for _, s in self._epochs)
        if self._pending is not None:
            assert self.node_id in self._pending.request.isr
        for progress in self.followers.values():
            assert progress.log_end <= self._end, (progress, self._end)

    def status(self) -> dict[str, Any]:
        return {"layer": "isr", "role": self.role, "leader": self.state.leader,
                "leader_epoch": self.state.leader_epoch,
                "partition_epoch": self.state.partition_epoch, "isr": list(self.state.isr),
                "elr": list(self.state.elr), "high_watermark": self.hw,
                "written": self.log.written_position, "flushed": self.log.flushed_position,
                "ignored": self.ignored,
                "pending_isr": list(self._pending.request.isr) if self._pending else None,
                "followers": {name: progress.log_end
                              for name, progress in self.followers.items()}}

    # --- roles ------------------------------------------------------------------------------

    def _change_role(self) -> None:
        state, was = self.state, self.role
        if was == LEADER:
            # (stored here; their fate is the new leader's)
            self._waiting.resolve_all(self._ready.resolved, PutStatus.REQUEST_TIMED_OUT)
            self.followers = {}
        self._fetch_sent_tick = None
        self._drop_pending_fetches()  # (a follower's, to its old leader)
        if state.leader == self.node_id:
            self._become_leader()
        elif state.leader and self.node_id in self.replicas:
            self.role = FOLLOWER
            self._saved_hw = 0
            self._ready.events.append(f"{self.node_id} follows {state.leader} in leader epoch "
                                      f"{state.leader_epoch}")
            if self._test_break == "truncate_to_hw" and self.hw < self._end:
                self._truncate(self.hw, "its high watermark (KIP-101's bug)")
            self._send_fetch()
        else:
            self.role = OFFLINE
            self._ready.events.append(f"{self.node_id} has no leader to follow in leader "
                                      f"epoch {state.leader_epoch}")

    def _become_leader(self) -> None:
        state = self.state
        self.role, self._seen = LEADER, UNSEEN
        if state.leader_epoch > self.log.epoch:
            self._ready.set_epoch = state.leader_epoch
        self._epoch_start_offset = self._end
        if self._saved_hw > self.hw:  # (saved before a restart: see __init__)
            self.hw = self._ready.commit_to = self._saved_hw
        self._saved_hw = 0
        self.followers = {name: Replica(caught_up_tick=self.tick_count if name in state.isr
                                        else FAR_PAST)
                          for name in self.replicas if name != self.node_id}
        self._reads.clear()
        self._ready.events.append(f"{self.node_id} leads leader epoch {state.leader_epoch} "
                                  f"from position {self._end}, ISR {list(state.isr)}")

    def _isr_changed(self, before: tuple[str, ...]) -> None:
        """The controller changed this leader's ISR (its request, or a fenced broker)."""
        isr, minimum = self.state.isr, self.config.min_insync_replicas
        if isr == before:
            return
        self._ready.events.append(f"{self.node_id}: ISR {list(before)} -> {list(isr)} "
                                  f"(partition epoch {self.state.partition_epoch})")
        if len(isr) < minimum <= len(before):
            self._waiting.resolve_all(self._ready.resolved,
                                      PutStatus.NOT_ENOUGH_REPLICAS_AFTER_APPEND)
        for name in isr:  # a member just added counts as caught up from now
            progress = self.followers.get(name)
            if progress is not None and name not in before:
                progress.caught_up_tick = max(progress.caught_up_tick, self.tick_count)

    # --- leader -------------------------------------------------------------------------------

    def _leader_tick(self) -> None:
        for progress in self.followers.values():
            if progress.waiting is not None and self.tick_count >= progress.deadline_tick:
                progress.answer_now = True
        self._waiting.expire(self.tick_count, self._ready.resolved,
                             PutStatus.REQUEST_TIMED_OUT)
        pending = self._pending
        if pending is not None and self.tick_count - pending.sent_tick >= \
                self._alter_retry_ticks:
            pending.sent_tick = self.tick_count
            self._send(pending.request)  # lost, or the controller is electing: again
        if pending is None:
            self._maybe_shrink()

    def _maybe_shrink(self) -> None:
        laggards = [name for name in self.state.isr if name in self.followers and
                    self.tick_count - self.followers[name].caught_up_tick > self._lag_ticks]
        if laggards:
            self._ready.events.append(f"{self.node_id}: {laggards} not caught up for "
                                      f"{self._lag_ticks} ticks: shrink the ISR")
            self._alter(tuple(name for name in self.state.isr if name not in laggards))

    def _maybe_expand(self, name: str, progress: Replica) -> None:
        if self._pending is not None or name in self.state.isr:
            return
        if progress.log_end >= self.hw and progress.log_end >= self._epoch_start_offset:
            self._ready.events.append(f"{self.node_id}: {name} caught up to the high "
                                      f"watermark {self.hw}: expand the ISR")
            self._alter(tuple(replica for replica in self.replicas
                              if replica in self.state.isr or replica == name))

    def _alter(self, isr: tuple[str, ...]) -> None:
        request = AlterPartition(self.node_id, CONTROLLER, self.state.leader_epoch,
                                 self.state.partition_epoch, isr)
        self._pending = PendingAlter(request, self.tick_count)
        self._send(request)

    def _refresh_from_log(self) -> None:
        """A leader's log grows by its own writes, which go to the store directly: read
        its end there — unless this Ready still changes the log (a follower that has just
        been made leader: its mirror counts what is pending, and it serves no write
        before that Ready is carried out)."""
        ready = self._ready
        if not (ready.appends or ready.truncate_to is not None or ready.reset_log):
            self._end = self.log.written_position
            self._epochs = self.log.epoch_starts()

    def _on_fetch(self, fetch: Fetch) -> None:
        if self.role == LEADER:
            self._refresh_from_log()
        error = self._fetch_error(fetch)
        if error:
            self._reply(fetch, error=error)
            return
        log_start = self.log.first_segment_base()
        if fetch.position < log_start:
            self._reply(fetch, error="OFFSET_OUT_OF_RANGE")
            return
        diverging = self._diverging(fetch)
        if diverging is not None:
            self._reply(fetch, diverging=diverging)
            return
        progress = self.followers[fetch.src]
        self._fetched(progress, fetch.position)
        self._maybe_expand(fetch.src, progress)
        progress.waiting = fetch
        progress.deadline_tick = self.tick_count + self._wait_ticks
        progress.answer_now = False

    def _fetch_error(self, fetch: Fetch) -> str:
        if self.role != LEADER or fetch.src not in self.followers:
            return "NOT_LEADER"
        if fetch.epoch < self.state.leader_epoch:
            return "FENCED_LEADER_EPOCH"
        if fetch.epoch > self.state.leader_epoch:
            return "UNKNOWN_LEADER_EPOCH"
        return ""

    def _diverging(self, fetch: Fetch) -> tuple[int, int] | None:
        """(epoch, end) if the follower's log went past the leader's for its last epoch."""
        if fetch.last_epoch < 0:
            return None if fetch.position <= self.log.first_segment_base() else (-1, 0)
        epoch = self._newest_epoch_up_to(fetch.last_epoch)
        end = self._end_of_epoch(epoch) if epoch >= 0 else 0
        if epoch != fetch.last_epoch or end < fetch.position:
            return epoch, end
        return None

    def _fetched(self, progress: Replica, position: int) -> None:
        """Kafka's lastCaughtUpTime: caught up if the fetch reached the leader's end now,
        or the end the leader had at the follower's previous fetch."""
        leader_end = self._end
        if position >= leader_end:
            progress.caught_up_tick = max(progress.caught_up_tick, self.tick_count)
        elif position >= progress.fetch_leader_end:
            progress.caught_up_tick = max(progress.caught_up_tick, progress.fetch_tick)
        progress.fetch_leader_end, progress.fetch_tick = leader_end, self.tick_count
        progress.log_end = position

    def _answer_fetches(self) -> None:
        """Answer each held fetch that has enough bytes to send, or waited long enough, or
        would carry records an acks=all write waits for (the high watermark needs this
        follower's next fetch: fetch_bytes_min batches acks=1's replication, never delays
        acks=all's). Followers held at one position get the bytes of one read (the log does
        not change within this call): caught-up followers wait at the same end, and each
        read checks up to fetch_bytes_max bytes (and copies them, unless it is large
        enough to be sent from the log's file: Store.read_for_send)."""
        reads: dict[tuple[int, int], bytes | FileExtent] = {}
        awaited = self._waiting.furthest_end()
        for progress in self.followers.values():
            fetch = progress.waiting
            if fetch is None:
                continue
            available = self._end - fetch.position
            if available >= self.config.fetch_bytes_min or progress.answer_now or \
                    available > 0 and fetch.position < awaited:
                progress.waiting, progress.answer_now = None, False
                self._reply(fetch, reads=reads)

    def _reply(self, fetch: Fetch, *, error: str = "",
               diverging: tuple[int, int] = (-1, -1),
               reads: dict[tuple[int, int], bytes | FileExtent] | None = None) -> None:
        """Answer ``fetch``; ``reads``: (position, limit) -> the bytes read there already
        (filled with this read). Records read to be sent (``read_for_send``): a large
        answer's may be a FileExtent, sent from the log's file."""
        data: bytes | FileExtent = b""
        records_epoch, start_epoch, start_epoch_start = -1, -1, -1
        if not error and diverging[1] < 0 and fetch.position < self._end:
            data, error = self._records_for(fetch, reads)
            records_epoch = self._epoch_from(fetch.position) if not error else -1
        log_start = self.log.first_segment_base()  # (after the read: retention may run)
        if error == "OFFSET_OUT_OF_RANGE":
            start_epoch, start_epoch_start = epoch_ending_at(self._epochs, log_start)
        self._send(FetchReply(self.node_id, fetch.src, self.state.leader_epoch,
                              fetch.fetch_id, fetch.position, records_epoch, self.hw,
                              log_start, diverging[0], diverging[1], error, start_epoch,
                              start_epoch_start, payload=data))

    def _records_for(self, fetch: Fetch, reads: dict[tuple[int, int], bytes | FileExtent]
                     | None) -> tuple[bytes | FileExtent, str]:
        """The records a fetch gets, or the error it is answered: OFFSET_OUT_OF_RANGE when
        retention let them go since ``_on_fetch`` checked, CORRUPT_MESSAGE when this log's
        copy is damaged there (PeerReads; the follower fetches again after its backoff)."""
        key = (fetch.position, min(self.config.fetch_bytes_max,
                                   self._epoch_range_end(fetch.position) - fetch.position))
        data = reads.get(key) if reads is not None else None
        if data is None:
            try:
                found = self._reads.read(fetch.src, *key, self.tick_count, self._ready.events)
            except MqlogError as failure:  # no record starts there: a peer's bug
                self._ready.events.append(f"{self.node_id} cannot answer {fetch.src}'s "
                                          f"fetch at {fetch.position}: {failure}")
                return b"", "INVALID_POSITION"
            if found is Unsendable.GONE:
                return b"", "OFFSET_OUT_OF_RANGE"
            if isinstance(found, Unsendable):
                return b"", "CORRUPT_MESSAGE"
            data = found
            if reads is not None:
                reads[key] = data
        return data, ""

    def _maybe_advance_hw(self) -> None:
        """The lowest end among the (maximal) ISR, while the ISR is large enough."""
        if len(self.state.isr) < self.config.min_insync_replicas and \
                self._test_break != "hw_below_min_isr":
            return
        members = set(self.state.isr) | set(self._pending.request.isr if self._pending
                                            else ())
        if self._test_break == "hw_all_replicas":
            members = {self.node_id} | {name for name, progress in self.followers.items()
                                        if progress.log_end >= 0}
        own = self.log.flushed_position if self.config.replica_ack == "flushed" else \
            self._end
        ends = [min(own, self._end) if name == self.node_id else
                self.followers[name].log_end if name in self.followers else -1
                for name in members]
        candidate = min(ends)
        if candidate > self.hw:
            self.hw = self._ready.commit_to = candidate
            self._waiting.commit(candidate, self._ready.resolved)

    # --- follower --------------------------------------------------------------------------

    def _follower_tick(self) -> None:
        if self._fetch_sent_tick is None:
            if self.tick_count >= self._fetch_due_tick:
                self._send_fetch()
        elif self.tick_count - self._fetch_sent_tick >= \
                self._wait_ticks + self.config.retransmit_ticks:
            self._send_fetch()  # lost, or its answer was: ask again

    def _send_fetch(self) -> None:
        """One Fetch from this log's end. With replica_ack = "flushed" it is an ack of
        durable bytes, so it waits for the flush of what it follows."""
        self._fetch_id += 1
        self._fetch_sent_tick = self.tick_count
        ready = self._ready
        self._drop_pending_fetches()
        fetch = self._stamp(Fetch(self.node_id, self.state.leader, self.state.leader_epoch,
                                  self._fetch_id, self._end, self._epoch_at(self._end)))
        if self.config.replica_ack == "flushed" and (
                ready.appends or self.log.flushed_position < self._end):
            ready.must_sync = True
            ready.messages_after_persist.append(fetch)
        else:
            ready.messages.append(fetch)

    def _drop_pending_fetches(self) -> None:
        for outbox in (self._ready.messages, self._ready.messages_after_persist):
            outbox[:] = [message for message in outbox if not isinstance(message, Fetch)]

    def _on_fetch_reply(self, reply: FetchReply) -> None:
        if self.role != FOLLOWER or reply.src != self.state.leader or \
                reply.fetch_id != self._fetch_id or self._fetch_sent_tick is None:
            return  # an answer to an older fetch, or from an older leader
        self._fetch_sent_tick = None
        if reply.error == "OFFSET_OUT_OF_RANGE":
            return self._start_over(reply)
        if reply.error:
            self._fetch_due_tick = self.tick_count + self.config.retransmit_ticks
            return
        if reply.diverging_end >= 0:
            shared = self._newest_epoch_up_to(reply.diverging_epoch)
            own = self._end_of_epoch(shared) if shared >= 0 else self.log.first_segment_base()
            if shared == reply.diverging_epoch:
                target = min(reply.diverging_end, own, self._end)
                why = f"where leader epoch {shared} ends in {reply.src}'s log"
            else:  # (the leader's end of epoch ``shared`` may lie sooner: the next round)
                target = min(own, self._end)
                why = (f"the end of its epoch {shared} ({reply.src}'s log has none of its "
                       "later epochs)")
            if target < self.log.first_segment_base():
                return self._start_over(reply)
            self._truncate(target, why)
        elif reply.position != self._end:
            pass  # (a truncation moved this log since the fetch: fetch again from its end)
        elif reply.payload:
            assert isinstance(reply.payload, bytes)  # (received: decoded from its frame)
            self._ready.appends.append((self._end, reply.payload))
            if not self._epochs or self._epochs[-1][0] != reply.records_epoch:
                self._epochs.append((reply.records_epoch, self._end))
            self._end += len(reply.payload)
        hw = min(reply.high_watermark, self._end)
        if hw > self.hw:
            self.hw = self._ready.commit_to = hw
        self._send_fetch()

    def _start_over(self, reply: FetchReply) -> None:
        """The leader's log starts past this log's end: start over, empty, there."""
        position = reply.log_start
        epochs = [(reply.start_epoch, reply.start_epoch_start)] if reply.start_epoch >= 0 \
            else []
        self._ready.start_log_over(position, epochs)
        self._ready.events.append(f"{self.node_id} started its log over at {position}, its "
                                  f"leader {reply.src}'s log start")
        self._epochs, self._end = list(epochs), position
        self.hw = self._ready.commit_to = position  # (only committed records are let go)
        self._send_fetch()

    def _truncate(self, position: int, why: str) -> None:
        if position >= self._end:
            return
        self._ready.events.append(f"{self.node_id} truncated [{position}, {self._end}) to "
                                  f"{why}")
        pending, self._ready.appends = self._ready.appends, []
        for start, data in pending:
            if start < position:
                self._ready.appends.append((start, data[:position - start]))
        if position < self.log.written_position:
            current = self._ready.truncate_to
            self._ready.truncate_to = position if current is None else min(current, position)
        self._epochs = [(epoch, start) for epoch, start in self._epochs if start < position]
        self._end = position
        if self.hw > position:  # only an unclean election (or a broken core) does this
            self._ready.events.append(f"{self.node_id} lost [{position}, {self.hw}) below "
                                      "its high watermark: committed records are gone")
            self.hw = self._ready.commit_to = position

    # --- both ---------------------------------------------------------------------------------

    def _admits(self, message: Message) -> bool:
        if message.cluster_id != self.config.cluster_id:
            why = f"another cluster ({message.cluster_id!r})"
        elif message.src in self.replicas and message.src != self.node_id:
            return True
        else:
            why = "a node that is not a replica of this partition"
        return self._ignore(message, why)

    def _send(self, message: Message) -> None:
        self._ready.messages.append(self._stamp(message))
