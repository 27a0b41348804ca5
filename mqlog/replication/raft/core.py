"""The Raft core: one store per replica group, replicated by a majority (DLedger's model,
held to the Raft paper's rules), as a sans-IO state machine.

Words. A term is an epoch: every record carries the term of the leader that wrote it,
and a log is identified by (position, epoch) — the position where it ends and the epoch
of the record that ends there — where the paper has (index, term). Records at the same
position with the same epoch are the same bytes (one leader per term wrote them once),
which is the paper's Log Matching property on bytes.

Durable state. ``(term, vote)`` is the hard state; a change goes out in ``Ready.hard_state``
and the driver saves and syncs it before it sends anything after it, so no node answers
twice in one term. The log is the store itself. The core reads it through ``LogView``
and keeps a mirror of its epoch starts and its end that includes appends still on their
way to the store (in a Ready not yet carried out), so every decision sees the log the
messages it sends will describe.

Elections. A follower that hears no leader for a randomized timeout (from the seeded
RNG, in [election_timeout_ticks, 2x)) first asks a pre-vote ("would you vote for me in
term + 1?") when ``pre_vote`` is on, so a node cut off and rejoining does not disrupt a
working group, then campaigns: term + 1, a vote for itself, ``Vote`` to every voter. A
voter grants one vote per term, to a candidate whose (last epoch, position) is at least
its own. With ``check_quorum`` a voter that heard a leader within the minimum election
timeout ignores campaigns (a leader lease), and a leader that has not heard from a
majority within it steps down. Leadership transfer catches the target up, then sends
``TimeoutNow``: it campaigns at once, and voters grant it despite the lease.

Replication. The new leader stamps its term (``set_epoch``) and appends a no-op control
record: records of earlier terms commit only through a record of the current term
(Raft §5.4.2, the figure-8 rule), and the no-op makes that happen without a client
write. ``Entries`` carry raw log bytes after (prev_position, prev_epoch), never more
than one epoch per message, at most ``append_bytes_max`` each and
``inflight_bytes_max`` unacknowledged per follower (pipelined). A follower accepts them
only if its log has prev_epoch's record ending at prev_position; it skips what it
already has (same position, same epoch), truncates a conflicting suffix through the
engine and appends the rest; the store checks every record's CRC and position. It acks
(``match``) once the bytes are flushed when ``follower_ack = "flushed"`` (the default;
DLedger acks before the disk). A refusal names where the follower's log agrees at most
(the end of its newest epoch not newer than prev_epoch), so the leader skips a whole
diverged epoch per round trip. After ``retransmit_ticks`` without progress the leader
resends from the last ack; heartbeats every ``heartbeat_ticks`` carry the commit. A
follower that needs records the leader's retention let go gets ``LogReset`` instead
(Raft's InstallSnapshot, where a log's snapshot is its start): it starts its log over,
empty, at the leader's log start, knowing the epoch of the record that ends there.

Membership. The group's configuration (voters, learners, their addresses) changes one
voter at a time (the Raft thesis's single-server changes): a leader writes the change as
a control record and uses it at once, as does every node that appends it, committed or
not; a truncated change is undone. Each node keeps where its log's changes are in its
hard state. A new voter must first be a learner that has caught up to the commit; the
next change waits until the last one is committed; a leader removed from the voters
steps down once its removal commits. A node votes whatever its own configuration says
(the candidate's decides whether the vote counts: a learner may not know yet that it was
made a voter), and a voter that a change not yet known committed removes still
campaigns: the others may still count on it, and its log may be the only freshest one.

Commit. The committed position is the largest position a majority of voters holds
(the leader's own counted by the same ack rule) that ends a record of the current term.
Proposals resolve PUT_OK once committed, FLUSH_SLAVE_TIMEOUT after
``sync_timeout_ticks`` or when the leader steps down (their fate is then unknown: an
idempotent retry settles it). Readers on every node see only committed records.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, TypeGuard

import msgpack

from mqlog.config import RECORD_HEADER_SIZE, ReplicationConfig
from mqlog.engine.files import FileExtent
from mqlog.errors import InvalidArgument, MembershipChangeRefused, NotLeader
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
from mqlog.replication.hardstate import HardState, Membership
from mqlog.replication.messages import (
    Entries,
    EntriesReply,
    LogReset,
    Message,
    TimeoutNow,
    Vote,
    VoteReply,
)
from mqlog.results import PutStatus

TEST_BREAKS = ("commit_old_term", "vote_twice", "truncate_stale", "short_quorum",
               "merge_acks")
FOLLOWER, PRE_CANDIDATE, CANDIDATE, LEADER, LEARNER = (
    "FOLLOWER", "PRE_CANDIDATE", "CANDIDATE", "LEADER", "LEARNER")


@dataclass
class Progress:
    """What a leader knows of one follower (or learner)."""

    match: int = 0  # its log agrees with the leader's up to here (acked)
    next: int = 0  # the next Entries starts here
    probing: bool = True  # ``next`` is a guess: one Entries at a time until it is confirmed
    probe_sent: bool = False
    progress_tick: int = 0  # when ``match`` last moved (or the probe was re-sent)
    active: bool = False  # heard from since the last quorum check
    heard_tick: int = -(1 << 62)  # when it last answered (never, yet)


class RaftCore(EpochMirror, PeerMessages):
    """One member of a Raft group; see the module docstring."""

    EPOCH_WORD = "term"  # (a Raft message's epoch is its term)

    def __init__(self, config: ReplicationConfig, log: LogView, *,
                 rng: random.Random | None = None, hard_state: HardState | None = None,
                 test_break: str = "") -> None:
        assert config.layer == "raft"
        assert test_break in ("", *TEST_BREAKS)
        # test_break: a deliberately broken core, so tests can show the checkers catch it
        # ("commit_old_term": commit by counting replicas alone, without §5.4.2's rule;
        # "vote_twice": grant every vote request, forgetting the vote already cast;
        # "truncate_stale": a follower cuts its log at the end of every stale Entries;
        # "short_quorum": commit what one fewer than a majority holds; "merge_acks": a
        # follower merges its acks whatever leader and term they answer).
        self._test_break = test_break
        self.config = config.validate()
        self.log = log
        self.rng = rng or random.Random(0)
        self.node_id = config.node_id
        self._epochs = list(log.epoch_starts())  # (epoch, start): the log's, plus pending
        self._end = log.written_position  # the log's end, pending appends included
        saved = hard_state or HardState()
        self.term = max(saved.term, log.epoch, self._epoch_at(self._end))
        self.vote = saved.vote if self.term == saved.term else ""
        self.bootstrap = Membership(-1, config.voters, config.learners)
        # Changes past the log's end were lost with it (a crash before the flush).
        self.memberships = [item for item in saved.memberships if item.position < self._end]
        self.role = FOLLOWER if self.node_id in self.voters else LEARNER
        self.leader = ""
        self.commit = 0  # learnt again from the leader after a restart
        # (leader, term, commit) of the last Entries heard, refused ones too: the commit
        # that leader announced, which this node's own may not have reached yet.
        self._announced: tuple[str, int, int] = ("", -1, -1)
        self.tick_count = 0
        self._elapsed = 0  # ticks since the leader was last heard (or the campaign began)
        self._timeout = self._random_timeout()
        self._votes: dict[str, bool] = {}
        self.peers: dict[str, Progress] = {}
        self._waiting = Proposals()
        self._transfer_to = ""
        self._transfer_deadline = 0
        self._heartbeat_elapsed = 0
        # (start, limit, the bytes: a FileExtent of them for a large read, sent from the file)
        self._last_read: tuple[int, int, bytes | FileExtent] = (-1, -1, b"")
        self._reads = PeerReads(log, self.node_id, config.retransmit_ticks)
        self._handed_over_tick = -(1 << 62)  # when damage last made it hand leadership over
        self._ready = Ready()
        self._seen = UNSEEN  # a leader's log_positions at its last ready()
        self.ignored = 0  # messages dropped: another cluster, or not a member
        self._ignored_from: set[str] = set()
        if self.term > saved.term or len(self.memberships) < len(saved.memberships):
            self._save_hard_state(self.term, self.vote)  # what the log says wins

    # --- what drivers and operators use -------------------------------------------------

    @property
    def epoch(self) -> int:
        return self.term

    @property
    def is_master(self) -> bool:
        return self.role == LEADER

    @property
    def leader_commit(self) -> int:
        """The commit the current leader last announced to this follower, once it covers
        the term's first record (-1 before). A follower that knows a leader may know
        nothing committed (a restarted node whose first Entries was refused), and a new
        leader's own commit lags the true one until its first record commits (§5.4.2: a
        restarted leader announces 0): a reader that serves what it has applied must
        wait until that reaches this."""
        leader, term, commit = self._announced
        if (leader, term) != (self.leader, self.term) or not leader:
            return -1
        start = self._term_start()
        return commit if start is not None and commit > start else -1

    @property
    def membership(self) -> Membership:
        """The newest configuration in this node's log (committed or not)."""
        return self.memberships[-1] if self.memberships else self.bootstrap

    @property
    def voters(self) -> tuple[str, ...]:
        return self.membership.voters

    @property
    def learners(self) -> tuple[str, ...]:
        return self.membership.learners

    @property
    def members(self) -> tuple[str, ...]:
        return self.voters + self.learners

    @property
    def quorum(self) -> int:
        return len(self.voters) // 2 + 1

    def tick(self) -> None:
        self.tick_count += 1
        self._elapsed += 1
        if self.role == LEADER:
            self._leader_tick()
        elif self._elapsed >= self._timeout and self._electable():
            self._campaign(pre_vote=self.config.pre_vote)

    def step(self, message: Message) -> None:
        if not self._admits(message):
            return
        if isinstance(message, Vote):
            self._on_vote(message)
        elif message.epoch < self.term:
            # A deposed leader (or one this node's term outran: it campaigned, crashed,
            # and leases keep its votes unanswered): tell it the term, whichever way it
            # tries to replicate, or it never learns it and this node never rejoins
            # (seed 920000008: LogResets went unanswered forever).
            if isinstance(message, Entries):
                self._send(EntriesReply(self.node_id, message.src, self.term, False, 0,
                                        message.prev_position, message.prev_epoch))
            elif isinstance(message, LogReset):
                self._send(EntriesReply(self.node_id, message.src, self.term, False, 0,
                                        message.position, message.last_epoch))
        else:
            if message.epoch > self.term and not (isinstance(message, VoteReply)
                                                   and message.pre_vote and message.granted):
                self._become_follower(message.epoch, "")
            self._dispatch(message)

    def check_master(self) -> None:
        """Raise NotLeader unless this node takes writes now (drivers ask first)."""
        if self.role != LEADER:
            raise NotLeader(f"node {self.node_id} is a {self.role.lower()} in term "
                            f"{self.term}; " + (f"the leader is {self.leader}" if self.leader
                                                else "no leader is known yet: retry soon"),
                            leader=self.leader or None)
        if self._transfer_to:
            raise NotLeader(f"node {self.node_id} is handing leadership to "
                            f"{self._transfer_to}; retry there", leader=self._transfer_to)

    def may_accept(self, acks: str = "replicated") -> PutStatus:
        """Ask before storing a write (as of every core): NotLeader unless this node
        takes writes now; else PUT_OK (a Raft leader stores, then waits for a majority)."""
        self.check_master()
        return PutStatus.PUT_OK

    def propose(self, request_id: Any, end: int) -> None:
        """A write ending at ``end`` was stored: resolve it once a majority has it."""
        self.check_master()
        if end <= self.commit:  # committed already (a retry, or acks outran the caller)
            self._ready.resolved.append((request_id, PutStatus.PUT_OK))
            return
        self._waiting.add(request_id, end, self.tick_count + self.config.sync_timeout_ticks)
        if self.config.follower_ack == "flushed" and self.log.flushed_position < end:
            self._ready.must_sync = True  # the leader's copy counts only once durable

    def transfer_leadership(self, target: str) -> None:
        """Hand leadership to voter ``target``: catch it up, then tell it to campaign."""
        self.check_master()
        if target not in self.voters or target == self.node_id:
            raise InvalidArgument(f"transfer needs another voter of the current membership "
                                  f"{list(self.voters)} as target, got {target!r}")
        self._transfer_to = target
        self._transfer_deadline = self.tick_count + self.config.election_timeout_ticks
        self._ready.events.append(f"{self.node_id} hands leadership to {target}")
        self._maybe_timeout_now()

    def ready(self) -> Ready:
        if self.role == LEADER:
            seen = log_positions(self.log)  # (first: see log_positions)
            if isinstance(self._last_read[2], FileExtent):
                # Kept for this run only: it is sent from the file, and its CRC, taken at
                # the read, must still describe it (a record damaged since would go out
                # under the old CRC, and its frame be refused, again and again).
                self._last_read = (-1, -1, b"")
            self._refresh_from_log()
            self._maybe_commit()
            self._pump()
            self._seen = seen
        return self._ready

    def has_ready(self) -> bool:
        """Whether ``ready()`` may return a non-empty Ready. Any role but leader only adds
        to its pending Ready as it ticks and steps, so exactly when that is not empty. A
        leader builds it in ready() from its log's written and flushed positions (its own
        writes go to the store directly: commits, Entries) and from its followers'
        progress, which only steps move — except in flight: Entries unacknowledged (the
        retransmit clock runs on ticks), a follower short of the log, a probe to send (a
        probe sent waits for its answer or the next heartbeat, which re-arms it: a dead
        follower does not make its leader run every tick), a follower whose next record
        is damaged in this log before its retry is due (PeerReads.waiting: nor does it).
        When neither position moved since its last ready(), nothing is in flight and its
        ticks added nothing (heartbeats do, every ``heartbeat_ticks``), that ready() would
        find nothing new. (A driver may skip a run that would find nothing: node.py after
        a tick.)"""
        if self._ready:
            return True
        if self.role != LEADER:
            return False
        end, tick = self._end, self.tick_count
        return log_positions(self.log) != self._seen or any(
            not progress.probe_sent if progress.probing else
            progress.next != progress.match or
            progress.next < end and not self._reads.waiting(name, progress.next, tick)
            for name, progress in self.peers.items())

    def advance(self, ready: Ready) -> None:
        assert ready is self._ready, "advance() takes the Ready that ready() returned"
        self._ready = Ready()

    def invariants(self) -> None:
        """Assert what must hold between steps (the simulator checks after each one)."""
        assert 0 <= self.commit <= self._end, (self.commit, self._end)
        assert self.role != LEADER or (self.leader == self.node_id and not self._votes)
        assert [start for _, start in self._epochs] == sorted(start for _, start in
                                                              self._epochs)
        assert [epoch for epoch, _ in self._epochs] == sorted(epoch for epoch, _ in
                                                              self._epochs)
        assert all(epoch <= self.term for epoch, _ in self._epochs)
        assert [item.position for item in self.memberships] == sorted(
            item.position for item in self.memberships)
        for name, progress in self.peers.items():
            assert name in self.members and progress.match <= progress.next <= self._end, \
                (name, progress, self._end)

    def status(self) -> dict[str, Any]:
        return {"layer": "raft", "role": self.role, "term": self.term, "leader": self.leader,
                "commit": self.commit, "written": self.log.written_position,
                "flushed": self.log.flushed_position, "voters": list(self.voters),
                "learners": list(self.learners), "ignored": self.ignored,
                "match": {name: progress.match for name, progress in self.peers.items()}}

    def _admits(self, message: Message) -> bool:
        """Messages of another cluster, or from a node that is not a member, are dropped
        and counted (``status()["ignored"]``): a stray node's term moves no one. Entries
        are the exception: a node far behind may not have the change that made its
        leader a member yet, and the log-matching check guards what it takes from them;
        a LogReset (which empties the log) only if its configuration names its sender."""
        if message.cluster_id != self.config.cluster_id:
            why = f"another cluster ({message.cluster_id!r})"
        elif message.src in self.members or isinstance(message, Entries) or (
                isinstance(message, LogReset) and message.src in _reset_members(message)):
            return True
        else:
            why = "a node that is not a member"
        return self._ignore(message, why)

    # --- roles ----------------------------------------------------------------------------

    def _dispatch(self, message: Message) -> None:
        if isinstance(message, Entries):
            self._on_entries(message)
        elif isinstance(message, LogReset):
            self._on_log_reset(message)
        elif isinstance(message, EntriesReply) and self.role == LEADER:
            self._on_entries_reply(message)
        elif isinstance(message, VoteReply):
            self._on_vote_reply(message)
        elif isinstance(message, TimeoutNow) and self.role == FOLLOWER:
            self._ready.events.append(f"{self.node_id} campaigns at once: {message.src} "
                                      "hands leadership over")
            self._campaign(pre_vote=False, transfer=True)

    def _become_follower(self, term: int, leader: str) -> None:
        if self.role == LEADER:
            self._step_down(f"term {term} began")
        if term != self.term:
            self._save_hard_state(term, "")
        self.role = FOLLOWER if self.node_id in self.voters else LEARNER
        self.leader = leader
        self._votes = {}

    def _step_down(self, why: str) -> None:
        self._ready.events.append(f"{self.node_id} steps down in term {self.term}: {why}")
        # (stored here; whether they commit is unknown now)
        self._waiting.resolve_all(self._ready.resolved, PutStatus.FLUSH_SLAVE_TIMEOUT)
        self.peers = {}
        self._transfer_to = ""
        self.role = FOLLOWER if self.node_id in self.voters else LEARNER
        self.leader = ""
        # The log grew by the leader's own writes; the mirror learns them now. A no-op
        # not handed to the driver yet is dropped (no term of ours will count on it).
        self._ready.append_noop = False
        self._refresh_from_log()

    def _campaign(self, *, pre_vote: bool, transfer: bool = False) -> None:
        self._elapsed, self._timeout = 0, self._random_timeout()
        if not self._electable():
            return
        if pre_vote:
            self.role = PRE_CANDIDATE
        else:
            self.role = CANDIDATE
            self._save_hard_state(self.term + 1, self.node_id)
            self._ready.events.append(f"{self.node_id} campaigns in term {self.term}")
        self.leader = ""
        self._votes = {self.node_id: True}
        if self._won():
            return self._on_won(pre_vote)
        term = self.term + 1 if pre_vote else self.term
        for name in self.voters:
            if name != self.node_id:
                self._send(Vote(self.node_id, name, term, self._end,
                                self._epoch_at(self._end), pre_vote, transfer))

    def _on_vote(self, vote: Vote) -> None:
        lease = (self.config.check_quorum and self.leader != "" and not vote.transfer
                 and self._elapsed < self.config.election_timeout_ticks)
        if vote.epoch > self.term and lease:
            return  # a leader is alive: this campaign would only disrupt it
        if vote.epoch < self.term:
            self._send(VoteReply(self.node_id, vote.src, self.term, False, vote.pre_vote))
            return
        if vote.epoch > self.term and not vote.pre_vote:
            self._become_follower(vote.epoch, "")
        fresh = (vote.last_epoch, vote.position) >= (self._epoch_at(self._end), self._end)
        if vote.pre_vote:
            free = vote.epoch > self.term or (not self.leader and self.vote in ("", vote.src))
        else:
            free = self.vote in ("", vote.src) or self._test_break == "vote_twice"
        # Whether this node is a voter in its own newest configuration does not matter
        # (Raft thesis §4.1, etcd's learners): that configuration may not be committed,
        # and the candidate's, where this node may still vote, is the one that counts
        # its reply. Refusing deadlocks a group whose uncommitted change reached only
        # the node it demotes (seed 900001249). One vote per term still holds.
        granted = free and fresh
        if granted and not vote.pre_vote:
            self._save_hard_state(self.term, vote.src)
            self._elapsed = 0
        self._send(VoteReply(self.node_id, vote.src, vote.epoch if granted else self.term,
                             granted, vote.pre_vote))

    def _on_vote_reply(self, reply: VoteReply) -> None:
        wanted = PRE_CANDIDATE if reply.pre_vote else CANDIDATE
        if self.role != wanted or reply.src not in self.voters:
            return
        self._votes[reply.src] = reply.granted
        if self._won():
            self._on_won(reply.pre_vote)
        elif sum(not granted for granted in self._votes.values()) >= self.quorum:
            self._become_follower(self.term, "")

    def _won(self) -> bool:
        """A majority of the voters of this node's newest configuration (its own vote
        counts only if it is one of them)."""
        voters = self.voters
        return sum(granted for name, granted in self._votes.items()
                   if name in voters) >= self.quorum

    def _electable(self) -> bool:
        """A voter of its newest configuration campaigns; so does a node that change
        removes while the change is not known to be committed, if it was a voter before
        it: the others may not have the change yet and still count on it, and its log,
        which has the change, may be the freshest (then it alone can win: seed
        900001249; ScyllaDB's Raft does the same). It wins by the new configuration's
        voters, leads, and steps down once its removal commits, as a removed leader does."""
        if self.node_id in self.voters:
            return True
        if not self.memberships or self.memberships[-1].position < self.commit:
            return False
        previous = self.memberships[-2] if len(self.memberships) > 1 else self.bootstrap
        return self.node_id in previous.voters

    def _on_won(self, pre_vote: bool) -> None:
        if pre_vote:
            self._campaign(pre_vote=False)
        else:
            self._become_leader()

    def _become_leader(self) -> None:
        self.role, self.leader, self._votes = LEADER, self.node_id, {}
        self._seen = UNSEEN
        # The check-quorum clock starts now: the campaign's ticks (up to twice the
        # election timeout) are not silence from followers it never led.
        self._heartbeat_elapsed = self._elapsed = 0
        self.peers = {}
        self._reads.clear()
        self._track_members()
        self._ready.set_epoch = self.term
        self._ready.append_noop = True  # commits the earlier terms' records (§5.4.2)
        self._ready.must_sync = True
        self._ready.events.append(f"{self.node_id} leads term {self.term} from position "
                                  f"{self._end}")

    def _save_hard_state(self, term: int, vote: str) -> None:
        assert term >= self.term
        self.term, self.vote = term, vote
        self._ready.hard_state = HardState(term, vote, tuple(self.memberships))

    def _random_timeout(self) -> int:
        base = self.config.election_timeout_ticks
        return base + self.rng.randrange(base)

    # --- leader -----------------------------------------------------------------------------

    def _leader_tick(self) -> None:
        self._heartbeat_elapsed += 1
        if self._heartbeat_elapsed >= self.config.heartbeat_ticks:
            self._heartbeat_elapsed = 0
            self._heartbeat()
        if self.config.check_quorum and self._elapsed >= self.config.election_timeout_ticks:
            self._elapsed = 0
            active = (self.node_id in self.voters) + sum(
                self.peers[name].active for name in self.voters if name != self.node_id)
            for progress in self.peers.values():
                progress.active = False
            if active < self.quorum:
                return self._step_down(f"heard from {active} of {len(self.voters)} voters "
                                       "lately, fewer than a majority")
        if self._transfer_to and self.tick_count >= self._transfer_deadline:
            self._ready.events.append(f"{self.node_id} gave up handing leadership to "
                                      f"{self._transfer_to}")
            self._transfer_to = ""
        self._waiting.expire(self.tick_count, self._ready.resolved,
                             PutStatus.FLUSH_SLAVE_TIMEOUT)

    def _heartbeat(self) -> None:
        """An empty Entries to each follower: the commit, and a probe if one is due."""
        for name, progress in self.peers.items():
            if progress.probing:
                progress.probe_sent = False  # the last probe may be lost: the pump resends
            else:
                self._send(self._entries(name, progress.match, b""))

    def _pump(self) -> None:
        """Send each follower what it lacks, within its in-flight window."""
        config = self.config
        for name, progress in self.peers.items():
            if progress.probing:  # one probe at a time; heartbeats re-arm a lost one
                if not progress.probe_sent:
                    progress.probe_sent = True
                    self._send_from(name, progress, probe=True)
                continue
            if progress.next > progress.match and \
                    self.tick_count - progress.progress_tick >= config.retransmit_ticks:
                progress.next = progress.match  # lost in flight: resend from the ack
                progress.progress_tick = self.tick_count
            while progress.next < self._end and \
                    progress.next - progress.match < config.inflight_bytes_max:
                if not self._send_from(name, progress):
                    break

    def _send_from(self, name: str, progress: Progress, probe: bool = False) -> bool:
        """One Entries from ``progress.next`` (or a LogReset if retention let those
        records go); a probe leaves ``next`` where it was (the reply confirms or moves
        it). False if this log's copy is damaged there (PeerReads): a probe then goes
        without records, so that the follower still hears its leader (heartbeats skip a
        follower being probed); leadership is handed over if the record cannot commit."""
        start = progress.next
        data: bytes | FileExtent | Unsendable = Unsendable.GONE
        if start >= self.log.first_segment_base():
            limit = min(self.config.append_bytes_max, self._epoch_range_end(start) - start)
            data = self._read(name, start, limit) if limit > 0 else b""
        if data is Unsendable.GONE:  # retention let those records go: it starts over
            log_start = self.log.first_segment_base()
            self._send(self._log_reset(name, log_start))
            if not probe:
                progress.next = log_start
            return True
        if isinstance(data, Unsendable):
            if probe:
                self._send(self._entries(name, start, b""))
            if data is Unsendable.DAMAGED:
                self._hand_over_past_damage(self._reads.damaged_at(name))
            return False
        self._send(self._entries(name, start, data))
        if start == progress.match:  # nothing was in flight: the retransmit clock starts now
            progress.progress_tick = self.tick_count
        if not probe:
            progress.next = start + len(data)
        return True

    def _read(self, name: str, start: int, limit: int) -> bytes | FileExtent | Unsendable:
        """The log's bytes for an Entries to ``name`` (PeerReads); followers in step ask
        for the same range one after the other, so the last read is kept: a copy while
        this node leads (a leader's log never changes below its end), a FileExtent for
        one run (``ready``)."""
        if self._last_read[:2] != (start, limit):
            data = self._reads.read(name, start, limit, self.tick_count, self._ready.events)
            if isinstance(data, Unsendable):
                return data
            self._last_read = (start, limit, data)
        return self._last_read[2]

    def _hand_over_past_damage(self, position: int | None) -> None:
        """This log's copy of the record at ``position`` is damaged. Committed, a majority
        has it. If not, and a majority (this log counted if it votes) has not got it yet,
        it can never commit from here, nor can any later write: another voter must lead.
        The most up-to-date one is told to campaign now, as in a transfer, at most once
        per election timeout (one target at a time: two campaigning at once split the
        vote). A new leader without the record truncates this log's tail to its own."""
        others = [name for name in self.voters if name != self.node_id]
        if position is None or position < self.commit or not others or \
                self.tick_count - self._handed_over_tick < self.config.election_timeout_ticks:
            return
        holders = (self.node_id in self.voters) + sum(self.peers[name].match > position
                                                      for name in others)
        if holders >= self.quorum:
            return
        self._handed_over_tick = self.tick_count
        target = max(others, key=lambda name: self.peers[name].match)
        self._ready.events.append(f"{self.node_id} hands leadership to {target}: its copy "
                                  f"of the record at {position}, not committed, is damaged")
        self._send(TimeoutNow(self.node_id, target, self.term))

    def _entries(self, name: str, start: int, data: bytes | FileExtent) -> Entries:
        changes = [item.to_json() for item in self.memberships
                   if start <= item.position < start + len(data)]
        return Entries(self.node_id, name, self.term, start, self._epoch_at(start),
                       self._epoch_from(start) if data else -1, self.commit,
                       msgpack.packb(changes) if changes else b"", data)

    def _log_reset(self, name: str, log_start: int) -> LogReset:
        epoch, epoch_start = epoch_ending_at(self._epochs, log_start)
        changes = [item.to_json() for item in self.memberships if item.position < log_start]
        self._ready.events.append(f"{self.node_id} resets {name}'s log to its log start "
                                  f"{log_start}: the records before are gone")
        return LogReset(self.node_id, name, self.term, log_start, epoch, epoch_start,
                        self.commit, msgpack.packb(changes) if changes else b"")

    def _on_entries_reply(self, reply: EntriesReply) -> None:
        progress = self.peers.get(reply.src)
        if progress is None:
            return
        progress.active, progress.heard_tick = True, self.tick_count
        if reply.success:
            if reply.match > progress.match:
                progress.match = reply.match
                progress.progress_tick = self.tick_count
            progress.next = max(progress.next, progress.match)
            progress.probing = progress.probe_sent = False
            self._maybe_commit()
            self._maybe_timeout_now()
            return
        # Where the logs agree at most: the end of the newest epoch both have — the
        # sooner of the two ends if the follower's hint is of that epoch; if it is of an
        # epoch this log lacks, its position means nothing here (it may even fall inside
        # one of this log's records), and this log's end of the shared epoch is the bound.
        shared = self._newest_epoch_up_to(reply.hint_epoch)
        agreed = 0 if shared < 0 else self._end_of_epoch(shared)
        if shared == reply.hint_epoch:
            agreed = min(agreed, reply.hint_position)
        if agreed < progress.match:
            # It no longer has bytes it acked (unflushed ones lost in a crash, or an ack
            # that outlived a truncation): believe the refusal, and repair from there.
            # The commit never moves back; only this follower's share in the next is.
            self._ready.events.append(f"{reply.src} lacks bytes it acked: it agrees up to "
                                      f"{agreed}, not {progress.match}; repairing")
            progress.match = agreed
        progress.next = agreed
        progress.probing, progress.probe_sent = True, False
        progress.progress_tick = self.tick_count

    def _maybe_commit(self) -> None:
        """Commit the largest position a majority holds, if it ends a current-term record."""
        own = self.log.flushed_position if self.config.follower_ack == "flushed" else self._end
        matches = sorted([min(own, self._end) if name == self.node_id else
                          self.peers[name].match for name in self.voters], reverse=True)
        candidate = matches[self.quorum - 1 - (self._test_break == "short_quorum"
                                               and self.quorum > 1)]
        term_start = self._term_start()
        current_term = term_start is not None and candidate > term_start  # §5.4.2
        if candidate > self.commit and (current_term or self._test_break == "commit_old_term"):
            self.commit = self._ready.commit_to = candidate
            self._waiting.commit(candidate, self._ready.resolved)
            if self._removed_and_committed():
                self._step_down("its removal from the voters is committed")

    def _maybe_timeout_now(self) -> None:
        target = self._transfer_to
        if target and target not in self.voters:  # a membership change removed it
            self._ready.events.append(f"{self.node_id} gave up handing leadership to "
                                      f"{target}: it is no longer a voter")
            self._transfer_to = ""
        elif target and self.peers[target].match >= self._end:
            self._send(TimeoutNow(self.node_id, target, self.term))

    def _refresh_from_log(self) -> None:
        """A leader's log changes only by its own writes: the store is the truth."""
        self._end = self.log.written_position
        self._epochs = self.log.epoch_starts()

    # --- membership -------------------------------------------------------------------------

    def membership_record(self, voters: tuple[str, ...], learners: tuple[str, ...],
                          addresses: dict[str, str]) -> tuple[Membership, bytes]:
        """Check a change of configuration; return it and the body of its control record
        (the driver appends the record, then calls ``membership_stored``)."""
        self.check_master()
        current = self.membership
        if not self._committed_in_term():
            # Ongaro's fix to single-server changes: a change made before the new leader's
            # term commits anything can join a majority with an older uncommitted change
            # and erase committed records.
            raise MembershipChangeRefused("this leader has not committed a record of its "
                                          "term yet; retry in a moment")
        if self.memberships and current.position >= self.commit:
            raise MembershipChangeRefused("the last membership change is not committed yet; "
                                          "retry once it is")
        if not voters or len(set(voters)) != len(voters) or set(voters) & set(learners):
            raise MembershipChangeRefused("voters must be a non-empty list of distinct ids, "
                                          "none of them also a learner")
        changed = set(voters) ^ set(current.voters)
        if len(changed) > 1:
            raise MembershipChangeRefused(f"{sorted(changed)} would change at once; add or "
                                          "remove one voter per change")
        for name in set(voters) - set(current.voters):
            progress = self.peers.get(name)
            if name not in current.learners or progress is None or \
                    progress.match < self.commit:
                raise MembershipChangeRefused(
                    f"{name} must first be a learner that has caught up (its log reaches "
                    f"the commit, {self.commit}): add it as a learner, then promote it")
        self._check_live_majority(voters)
        known = {**current.addresses, **addresses}
        membership = Membership(-1, tuple(voters), tuple(learners),
                                {name: known[name] for name in voters + learners if name in known})
        body = b"MQCFG1" + msgpack.packb(membership.to_json()[1:])
        return membership, body

    def _check_live_majority(self, voters: tuple[str, ...]) -> None:
        """Refuse a change whose voters have no live majority (etcd's strict reconfig
        check): this leader and the voters that answered it within an election timeout.
        Removing a live voter while another is down left two of three up and no leader
        for good: the change could not commit, and no one could be elected (helper-42)."""
        recent = self.tick_count - self.config.election_timeout_ticks
        live = [name for name in voters if name == self.node_id or (
            name in self.peers and self.peers[name].heard_tick >= recent)]
        if len(live) <= len(voters) // 2:
            raise MembershipChangeRefused(
                f"voters {list(voters)} would have {len(live)} live ({live}), fewer than a "
                f"majority: bring the others back (or wait until they answer), then retry")

    def membership_stored(self, membership: Membership, end: int, body_size: int) -> None:
        """The leader's driver appended the change's control record, ending at ``end``."""
        assert self.role == LEADER
        position = end - RECORD_HEADER_SIZE - body_size
        self.memberships.append(Membership(position, membership.voters, membership.learners,
                                           membership.addresses))
        self._ready.events.append(f"{self.node_id} changes the membership at {position}: "
                                  f"voters {list(membership.voters)}, learners "
                                  f"{list(membership.learners)}")
        self._membership_changed()

    def _adopt(self, packed: bytes, start: int) -> None:
        """A follower uses the membership changes it just appended, at once."""
        if not packed:
            return
        known = {item.position for item in self.memberships}
        adopted = [Membership.from_json(item) for item in msgpack.unpackb(packed)]
        fresh = [item for item in adopted if item.position not in known and
                 start <= item.position < self._end]
        if fresh:
            self.memberships = sorted(self.memberships + fresh, key=lambda m: m.position)
            self._membership_changed()

    def _membership_changed(self) -> None:
        self._save_hard_state(self.term, self.vote)
        if self.role == LEADER:
            self._track_members()
        elif self.role in (FOLLOWER, LEARNER):
            self.role = FOLLOWER if self.node_id in self.voters else LEARNER

    def _track_members(self) -> None:
        """A leader's progress entries: one per member but itself."""
        self.peers = {name: self.peers.get(name) or Progress(next=self._end,
                                                             progress_tick=self.tick_count)
                      for name in self.members if name != self.node_id}

    def _committed_in_term(self) -> bool:
        term_start = self._term_start()
        return term_start is not None and self.commit > term_start

    def _term_start(self) -> int | None:
        """Where this term's first record (a leader's no-op) starts; None before it is in."""
        return next((start for epoch, start in self._epochs if epoch == self.term), None)

    def _removed_and_committed(self) -> bool:
        return self.node_id not in self.voters and bool(self.memberships) and \
            self.memberships[-1].position < self.commit

    # --- follower ---------------------------------------------------------------------------

    def _on_entries(self, entries: Entries) -> None:
        self.role = FOLLOWER if self.node_id in self.voters else LEARNER
        self.leader, self._elapsed, self._votes = entries.src, 0, {}
        self._announced = (entries.src, self.term, max(entries.commit, self.leader_commit))
        prev = entries.prev_position
        if prev < self._log_start():
            # Bytes below this log's start (a LogReset, or its own retention, let them
            # go): an Entries sent before the reset and delivered after it. They cannot
            # be compared here, and must not cut what the log holds.
            self._ready.events.append(f"{self.node_id} got entries from {prev}, below its "
                                      f"log start: it asks {entries.src} to compare there")
            return self._agree_at_start(entries.src)
        if prev > self._end or self._epoch_at(prev) != entries.prev_epoch:
            return self._refuse(entries)
        end = prev + len(entries.payload)
        if entries.payload:
            assert isinstance(entries.payload, bytes)  # (received: decoded from its frame)
            self._accept(prev, entries.payload, entries.entries_epoch)
            self._adopt(entries.memberships, prev)
        commit = min(entries.commit, end)
        if commit > self.commit:
            self.commit = self._ready.commit_to = commit
        # (Bytes written but still being flushed — an Entries repeating them — need the
        # flush too before their ack goes.)
        if self.config.follower_ack == "flushed" and (self._ready.appends or
                                                      self.log.flushed_position < end):
            self._ready.must_sync = True
        outbox = self._ready.messages_after_persist if self._ready.must_sync else \
            self._ready.messages
        # Only the highest ack to this leader in this term needs to go; an ack answers
        # one leader in one term, and never speaks for another (whose log may differ).
        merge_all = self._test_break == "merge_acks"
        acks = [message.match for message in outbox
                if _same_ack(message, entries.src, self.term, merge_all)]
        outbox[:] = [message for message in outbox
                     if not _same_ack(message, entries.src, self.term, merge_all)]
        outbox.append(self._stamp(EntriesReply(self.node_id, entries.src, self.term, True,
                                               max([end, *acks]), 0, 0)))

    def _on_log_reset(self, reset: LogReset) -> None:
        """Start over at the leader's log start, unless this log already reaches it."""
        self.role = FOLLOWER if self.node_id in self.voters else LEARNER
        self.leader, self._elapsed, self._votes = reset.src, 0, {}
        position = reset.position
        if position < self._log_start():
            # Its own retention went further: it cannot compare logs below its start.
            return self._agree_at_start(reset.src)
        if position > self._end or self._epoch_at(position) != reset.last_epoch:
            assert self.commit <= position, "committed records always match the leader's"
            epochs = reset.epoch_starts()
            ready = self._ready
            ready.start_log_over(position, epochs)
            for outbox in (ready.messages, ready.messages_after_persist):  # acks of bytes
                outbox[:] = [message for message in outbox  # the reset throws away
                             if not isinstance(message, EntriesReply)]
            self._epochs, self._end = list(epochs), position
            self.memberships = [Membership.from_json(item) for item in
                                (msgpack.unpackb(reset.memberships) if reset.memberships
                                 else [])]
            self._membership_changed()
            ready.must_sync = True
            ready.events.append(f"{self.node_id} started its log over at {position}, its "
                                f"leader {reset.src}'s log start")
        elif self.config.follower_ack == "flushed" and self.log.flushed_position < position:
            self._ready.must_sync = True
        if position > self.commit:
            self.commit = self._ready.commit_to = position
        self._send(EntriesReply(self.node_id, reset.src, self.term, True, position, 0, 0))

    def _refuse(self, entries: Entries) -> None:
        """Where this log agrees with the leader's at most: the end of its newest epoch not
        newer than prev_epoch (no sooner than that epoch's records it has), and never
        below its start."""
        epoch = self._newest_epoch_up_to(entries.prev_epoch)
        agreed = min(self._end_of_epoch(epoch) if epoch >= 0 else 0, entries.prev_position,
                     self._end)
        if agreed < self._log_start():
            return self._agree_at_start(entries.src)
        self._send(EntriesReply(self.node_id, entries.src, self.term, False, 0, agreed, epoch))

    def _agree_at_start(self, leader: str) -> None:
        """Tell ``leader`` to compare logs at this log's start: nothing below it is here,
        and what it holds must not be dropped (the record ending at its start was
        committed when retention or a LogReset let the rest go, so the logs agree
        there)."""
        start = self._log_start()
        self._send(EntriesReply(self.node_id, leader, self.term, False, 0, start,
                                self._epoch_at(start)))

    def _log_start(self) -> int:
        """Where this log starts: a LogReset taken but not yet carried out counts."""
        pending = self._ready.reset_log
        return pending[0] if pending is not None else self.log.first_segment_base()

    def _accept(self, position: int, data: bytes, epoch: int) -> None:
        """Skip what this log already has (same position, same epoch: the same bytes),
        truncate a conflicting suffix, append the rest."""
        end = position + len(data)
        have = position
        if self._end > position and self._epoch_from(position) == epoch:
            have = min(self._end, self._epoch_range_end(position))
        if have >= end:
            if self._test_break == "truncate_stale" and end < self._end:
                self._truncate(end)
                self.commit = min(self.commit, end)
            return
        if have < self._end:
            assert have >= self.commit, f"would truncate committed bytes at {have}"
            self._ready.events.append(f"{self.node_id} truncated [{have}, {self._end}) that "
                                      f"its leader {self.leader} does not have")
            self._truncate(have)
        self._ready.appends.append((have, data[have - position:]))
        if not self._epochs or self._epochs[-1][0] != epoch:
            self._epochs.append((epoch, have))
        self._end = end

    def _truncate(self, position: int) -> None:
        """Cut the mirror, the appends still pending, (below them) the store, and the
        acks still pending that speak of bytes past the cut: they would tell a leader
        this log matches bytes it no longer has."""
        for outbox in (self._ready.messages, self._ready.messages_after_persist):
            outbox[:] = [message for message in outbox
                         if not (isinstance(message, EntriesReply) and message.success
                                 and message.match > position)]
        pending, self._ready.appends = self._ready.appends, []
        for start, data in pending:
            if start < position:
                self._ready.appends.append((start, data[:position - start]))
        if position < self.log.written_position:
            current = self._ready.truncate_to
            self._ready.truncate_to = position if current is None else min(current, position)
        self._epochs = [(epoch, start) for epoch, start in self._epochs if start < position]
        self._end = position
        if self.memberships and self.memberships[-1].position >= position:
            self.memberships = [item for item in self.memberships if item.position < position]
            self._ready.events.append(f"{self.node_id} undid a membership change the "
                                      "truncation removed")
            self._membership_changed()

    # --- sending (the log mirror's questions: epochs.py) ------------------------------------

    def _send(self, message: Message) -> None:
        """Answers wait for what this Ready persists; a leader's Entries need not (they
        carry bytes already in its log, and its own copy counts only once flushed)."""
        ready = self._ready
        persisting = (ready.hard_state is not None or ready.must_sync) and \
            not isinstance(message, Entries)
        (ready.messages_after_persist if persisting else ready.messages).append(
            self._stamp(message))


def _same_ack(message: Message, leader: str, term: int,
              any_leader: bool = False) -> TypeGuard[EntriesReply]:
    """A successful ack to ``leader`` in ``term`` (acks to it merge; no others do)."""
    return isinstance(message, EntriesReply) and message.success and \
        (any_leader or (message.dst == leader and message.epoch == term))


def _reset_members(reset: LogReset) -> set[str]:
    """The members named by the newest configuration a LogReset carries."""
    if not reset.memberships:
        return set()
    newest = Membership.from_json(msgpack.unpackb(reset.memberships)[-1])
    return set(newest.voters + newest.learners)
