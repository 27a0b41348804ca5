"""The replication cores' safety rules that are simplest to show one message at a time
(issue 13): a core stepped directly over an in-memory log, no store, no network.

The datadriven scripts (tests/data/raft, tests/data/master_slave) show whole exchanges;
these pin single decisions: whom a core hears (group identity), what an ack may claim
after a truncation, when a master may take writes, what a role change saves.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqlog import errors
from mqlog.config import ReplicationConfig
from mqlog.group_client import GroupClient
from mqlog.replication import hardstate
from mqlog.replication.core import Proposals, Ready
from mqlog.replication.hardstate import HardState, Membership, RoleState
from mqlog.replication.master_slave import MasterSlaveCore
from mqlog.replication.messages import (
    Append,
    Entries,
    EntriesReply,
    Hello,
    LogReset,
    Pull,
    Pulled,
    Report,
    Truncate,
    Vote,
    VoteReply,
)
from mqlog.replication.raft import RaftCore
from mqlog.replication.wire import Frame, FrameDecoder, encode_frame
from mqlog.results import PutStatus

NOOP = 72  # a no-op control record's size


class FakeLog:
    """A LogView over nothing: positions and epoch starts only (cores never read bytes
    in these tests but a leader's, which get zeros)."""

    def __init__(self, written: int = 0, epochs: tuple[tuple[int, int], ...] = ()) -> None:
        self.written_position = self.flushed_position = written
        self.starts = list(epochs)

    @property
    def epoch(self) -> int:
        return self.starts[-1][0] if self.starts else 0

    def epoch_starts(self) -> list[tuple[int, int]]:
        return list(self.starts)

    def epoch_at(self, position: int) -> int | None:
        found = None
        for epoch, start in self.starts:
            if start >= position:
                break
            found = epoch
        return found

    def read_raw(self, position: int, max_bytes: int) -> bytes:
        return bytes(min(max_bytes, self.written_position - position))

    def read_for_send(self, position: int, max_bytes: int) -> bytes:
        return self.read_raw(position, max_bytes)

    def first_segment_base(self) -> int:
        return 0

    def is_record_start(self, position: int) -> bool:
        return 0 <= position <= self.written_position

    def carry_out(self, ready: Ready) -> None:
        """What a driver does to the log (all of it synced at once)."""
        if ready.truncate_to is not None:
            self.written_position = ready.truncate_to
            self.starts = [(e, s) for e, s in self.starts if s < ready.truncate_to]
        for position, data in ready.appends:
            assert position == self.written_position
            self.written_position += len(data)
        if ready.set_epoch is not None:
            self.starts.append((ready.set_epoch, self.written_position))
        if ready.append_noop:
            self.written_position += NOOP
        self.flushed_position = self.written_position


def _raft(name: str, log: FakeLog, term: int = 0, **overrides: Any) -> RaftCore:
    config = ReplicationConfig(layer="raft", node_id=name, voters=("n1", "n2", "n3"),
                               election_timeout_ticks=10, heartbeat_ticks=2,
                               pre_vote=False, **overrides)
    return RaftCore(config, log, hard_state=HardState(term, ""))


def _leader(log: FakeLog, term: int = 1, **overrides: Any) -> RaftCore:
    """n1 leading ``term + 1`` over ``log`` (its no-op carried out)."""
    core = _raft("n1", log, term, **overrides)
    while not any(isinstance(m, Vote) for m in core.ready().messages_after_persist):
        core.tick()
    core.step(VoteReply("n2", "n1", core.term, True, False, **_cid(overrides)))
    ready = core.ready()
    assert core.is_master and ready.append_noop
    log.carry_out(ready)
    core.advance(ready)
    return core


def _cid(overrides: dict[str, Any]) -> dict[str, str]:
    return {"cluster_id": overrides["cluster_id"]} if "cluster_id" in overrides else {}


def _acks(ready: Ready) -> list[EntriesReply]:
    return [m for m in ready.messages + ready.messages_after_persist
            if isinstance(m, EntriesReply) and m.success]


# --- Raft: acks (finding 3) ------------------------------------------------------------


def test_a_truncation_voids_the_acks_still_pending_in_the_ready():
    """n3 takes 373 bytes from n1 (term 1) and, before its Ready is carried out, n2's
    term-2 no-op at the same place: the truncation voids the ack to n1 (those bytes are
    gone), and n2 hears only the end of its own no-op."""
    log = FakeLog(NOOP, ((1, 0),))
    follower = _raft("n3", log, term=1)
    follower.step(Entries("n1", "n3", 1, NOOP, 1, 1, NOOP, payload=bytes(373)))
    assert [(m.dst, m.match) for m in _acks(follower.ready())] == [("n1", NOOP + 373)]
    follower.step(Entries("n2", "n3", 2, NOOP, 1, 2, NOOP, payload=bytes(NOOP)))
    ready = follower.ready()
    assert ready.appends == [(NOOP, bytes(NOOP))]
    assert [(m.dst, m.epoch, m.match) for m in _acks(ready)] == [("n2", 2, 2 * NOOP)]


def test_acks_to_two_leaders_are_never_merged():
    """An ack to n1 in term 1 and one to n2 in term 2 queued in one Ready stay two acks,
    each with its own match."""
    log = FakeLog(NOOP, ((1, 0),))
    follower = _raft("n3", log, term=1)
    follower.step(Entries("n1", "n3", 1, NOOP, 1, 1, NOOP, payload=bytes(100)))
    follower.step(Entries("n2", "n3", 2, NOOP, 1, -1, NOOP))
    assert sorted((m.dst, m.epoch, m.match) for m in _acks(follower.ready())) == [
        ("n1", 1, NOOP + 100), ("n2", 2, NOOP)]


def test_a_refusal_below_the_acked_match_drops_next_back_to_repair():
    """A follower that refuses at a position below what it acked no longer has those
    bytes: the leader must believe it and resend from there, not wait at its old match
    (with follower_ack = "flushed" too)."""
    log = FakeLog(445, ((1, 0),))
    leader = _leader(log)
    end = log.written_position
    leader.step(EntriesReply("n2", "n1", leader.term, True, end, 0, 0))
    assert leader.peers["n2"].match == end
    leader.step(EntriesReply("n2", "n1", leader.term, False, 0, NOOP, 1))
    progress = leader.peers["n2"]
    assert (progress.match, progress.next, progress.probing) == (NOOP, NOOP, True)
    sent = [m for m in leader.ready().messages if isinstance(m, Entries) and m.dst == "n2"]
    assert sent and sent[0].prev_position == NOOP
    leader.invariants()


# --- Raft: check-quorum after a late election (finding 8) ------------------------------


def test_a_leader_elected_late_keeps_its_lease_until_followers_could_answer():
    log = FakeLog()
    core = _raft("n1", log, check_quorum=True)
    while not any(isinstance(m, Vote) for m in core.ready().messages_after_persist):
        core.tick()
    for _ in range(9):  # the votes come just before the election timeout fires again
        core.tick()
    core.step(VoteReply("n2", "n1", core.term, True, False))
    assert core.is_master
    core.tick()
    assert core.is_master, core.ready().events


# --- Raft: transfer (finding 9) --------------------------------------------------------


def test_a_transfer_target_is_checked_against_the_current_voters():
    leader = _leader(FakeLog())
    for target in ("n9", "n1"):
        with pytest.raises(errors.InvalidArgument, match="another voter of the current"):
            leader.transfer_leadership(target)
    leader.transfer_leadership("n3")
    leader.memberships.append(Membership(10, ("n1", "n2")))  # n3 removed meanwhile
    leader._membership_changed()
    leader.step(EntriesReply("n2", "n1", leader.term, True, 0, 0, 0))  # no KeyError
    assert "no longer a voter" in " ".join(leader.ready().events)
    leader.check_master()  # it takes writes again


# --- Raft: group identity (finding 4) ---------------------------------------------------


def test_a_stale_log_reset_is_answered_with_the_newer_term():
    """Seed 920000008: a follower whose term outran its leader's (it campaigned, crashed
    right after saving the term; the lease keeps its votes unanswered) ignored the
    leader's LogResets silently, so the leader never learnt the term and the follower
    never rejoined. Like a stale Entries, a stale LogReset is answered with the term."""
    follower = _raft("n2", FakeLog(), term=9)
    follower.step(LogReset("n1", "n2", 8, 4096, 6, 1000, 4096))
    ready = follower.ready()
    replies = [m for m in ready.messages + ready.messages_after_persist
               if isinstance(m, EntriesReply)]
    assert [(m.dst, m.epoch, m.success) for m in replies] == [("n1", 9, False)]
    assert ready.reset_log is None and follower.term == 9


def test_a_log_reset_after_a_won_election_in_one_ready_voids_its_stamp_and_no_op():
    """ISR seed 28100259: a candidate paused with its votes on the way resumed, won its
    old term, and took the newer leader's LogReset, all in one Ready. Its stamp of the old
    term (carried out after the reset, below the reset's epochs) stopped the replica, and
    its no-op would have followed the leader's records in an older term: the reset voids
    both, as it voids the Ready's truncation and appends."""
    candidate = _raft("n2", FakeLog())
    while not any(isinstance(m, Vote) for m in candidate.ready().messages_after_persist):
        candidate.tick()
    won = candidate.term
    candidate.step(VoteReply("n3", "n2", won, True, False))
    assert candidate.is_master  # (its stamp and no-op are in the Ready now)
    candidate.step(LogReset("n1", "n2", won + 1, 4096, won + 1, 1000, 4096))
    ready = candidate.ready()
    assert ready.reset_log == (4096, [(won + 1, 1000)]) and candidate.term == won + 1
    assert ready.set_epoch is None and not ready.append_noop and not candidate.is_master


def test_a_log_reset_from_a_non_member_changes_nothing_and_is_counted():
    log = FakeLog(500, ((1, 0),))
    follower = _raft("n3", log, term=1)
    follower.step(LogReset("x9", "n3", 7, 4096, 6, 4000, 4096))
    ready = follower.ready()
    assert ready.reset_log is None and ready.hard_state is None
    assert follower.term == 1 and follower.ignored == 1
    assert not ready.messages and not ready.messages_after_persist
    assert "ignores log_reset (term 7) from x9" in " ".join(ready.events)


def test_a_log_reset_from_a_leader_its_configuration_names_is_taken():
    """A node far behind may not know the change that made its leader a member; the
    reset carries the configuration that names it."""
    log = FakeLog(500, ((1, 0),))
    follower = _raft("n3", log, term=1)
    changes = msgpack.packb([Membership(100, ("n1", "n3", "n4")).to_json()])
    follower.step(LogReset("n4", "n3", 7, 4096, 6, 4000, 4096, changes))
    assert follower.ready().reset_log == (4096, [(6, 4000)])
    assert follower.term == 7 and follower.ignored == 0


def test_messages_of_another_cluster_are_ignored_whatever_their_term():
    log = FakeLog()
    follower = _raft("n3", log, cluster_id="blue")
    for message in (Vote("n2", "n3", 9, 0, -1, False, False, cluster_id="red"),
                    Entries("n1", "n3", 9, 0, -1, -1, 0, cluster_id="red"),
                    Vote("n2", "n3", 9, 0, -1, False, False)):
        follower.step(message)
    assert follower.term == 0 and follower.ignored == 3 and follower.vote == ""
    follower.step(Vote("n2", "n3", 9, 0, -1, False, False, cluster_id="blue"))
    assert follower.term == 9 and follower.vote == "n2"
    replies = follower.ready().messages_after_persist
    assert [m.cluster_id for m in replies] == ["blue"]  # its answers carry its cluster


# --- master-slave -------------------------------------------------------------------------


def _ms(name: str, log: FakeLog, role: str = "SYNC_MASTER", *,
        hard_state: RoleState | None = None, **overrides: Any) -> MasterSlaveCore:
    links: dict[str, Any] = {"slaves": ("s1", "s2")} if role != "SLAVE" else {"master": "m"}
    config = ReplicationConfig(node_id=name, role=role, **links, **overrides)  # type: ignore
    return MasterSlaveCore(config, log, hard_state=hard_state)


def _caught_up(master: MasterSlaveCore, log: FakeLog) -> MasterSlaveCore:
    """A restarted master whose slaves all answer that their logs end where its own
    does: it begins its next epoch and serves."""
    position, last = log.written_position, log.epoch_at(log.written_position)
    for name in master.slaves:
        master.step(Pulled(name, master.node_id, master.epoch, position, True, position,
                           -1 if last is None else last, -1))
    ready = master.ready()
    assert ready.set_epoch == master.epoch
    log.carry_out(ready)
    master.advance(ready)
    master.check_master()
    return master


def test_only_a_member_with_a_higher_epoch_fences_a_master():
    master = _ms("m", FakeLog(), cluster_id="blue")
    master.step(Hello("x", "m", 5, 0, -1, cluster_id="blue"))  # not its slave
    master.step(Hello("s1", "m", 5, 0, -1, cluster_id="red"))  # another cluster
    master.step(Report("s1", "m", 5, 0, 0))  # no cluster at all
    assert (master.role, master.epoch, master.ignored) == ("SYNC_MASTER", 1, 3)
    master.step(Hello("s1", "m", 5, 0, -1, cluster_id="blue"))
    assert (master.role, master.epoch) == ("FENCED", 5)


def test_a_slave_hears_only_its_master():
    slave = _ms("s1", FakeLog(), role="SLAVE")
    slave.ready()
    slave.step(LogReset("x", "s1", 9, 4096, 3, 4000, 0))
    ready = slave.ready()
    assert ready.reset_log is None and slave.epoch == 0 and slave.ignored == 1


def test_a_sync_master_refuses_before_storing_when_too_few_slaves_are_in_sync():
    master = _ms("m", FakeLog())
    assert master.may_accept() is PutStatus.SLAVE_NOT_AVAILABLE
    assert master.may_accept("master") is PutStatus.PUT_OK
    master.step(Hello("s1", "m", 0, 0, -1))
    assert master.may_accept() is PutStatus.PUT_OK


def test_a_hello_is_no_flushed_ack():
    """With slave_ack = "flushed" a Hello's position (the slave's written end) acks
    nothing: a write ending there waits for a Report of the flushed position."""
    log = FakeLog(500, ((0, 0),))
    master = _caught_up(_ms("m", log, slave_ack="flushed"), log)
    master.step(Hello("s1", "m", 0, 500, 0))
    master.propose("p1", 500)
    assert master.ready().resolved == []
    master.step(Report("s1", "m", 0, 500, 400))
    assert master.ready().resolved == []
    master.step(Report("s1", "m", 0, 500, 500))
    assert master.ready().resolved == [("p1", PutStatus.PUT_OK)]


@pytest.mark.parametrize("role", ["SYNC_MASTER", "ASYNC_MASTER"])
def test_a_master_whose_slaves_have_its_log_has_nothing_ready(role):
    """An idle master's driver run after a tick is skipped (has_ready): it says yes
    while its pump has records to send a slave, and no once both have them."""
    log = FakeLog(500, ((0, 0),))
    master = _caught_up(_ms("m", log, role=role), log)
    for name in ("s1", "s2"):
        master.step(Hello(name, "m", master.epoch, 300, 0))
    master.tick()
    assert master.has_ready()
    ready = master.ready()
    assert sorted((m.dst, m.position) for m in ready.messages) == [("s1", 300), ("s2", 300)]
    master.advance(ready)
    for name in ("s1", "s2"):
        master.step(Report(name, "m", master.epoch, 500, 500))
    master.advance(master.ready())
    master.tick()
    assert not master.has_ready() and not master.ready()
    log.written_position = 600  # a write: a master has records to pump (ASYNC: a tick's)
    master.tick()
    assert master.has_ready()


def test_a_report_from_before_the_masters_epoch_acks_nothing():
    """Seeds 700000798, 700001179, 700001911: a slave's Report of a log it has truncated
    since (sent in an older epoch, delivered late) must not ack the record the master
    wrote at the same position; nor may a Report beyond the master's own log."""
    log = FakeLog(519, ((0, 0), (2, 346)))
    master = _caught_up(_ms("m", log, slave_ack="flushed", hard_state=RoleState(
        "SYNC_MASTER", 2, "", ("s1", "s2"))), log)
    master.step(Hello("s1", "m", 2, 346, 0))
    master.propose("p4", 519)
    master.ready()
    master.step(Report("s1", "m", 1, 519, 519))  # its epoch-1 log, gone since
    master.step(Report("s1", "m", 2, 600, 600))  # more than the master ever had
    assert master.ready().resolved == [] and master.status()["slaves"]["s1"] == 0
    master.step(Report("s1", "m", 2, 519, 519))
    assert master.ready().resolved == [("p4", PutStatus.PUT_OK)]
    # A slave matched by a Hello of an older epoch (it needed no truncation) is heard in
    # that epoch: with nothing to send it, it would never learn the master's.
    log = FakeLog(500, ((0, 0), (1, 500)))
    idle = _caught_up(_ms("m", log, slave_ack="flushed",
                          hard_state=RoleState("SYNC_MASTER", 1, "", ("s1", "s2"))), log)
    idle.step(Hello("s1", "m", 0, 500, 0))
    idle.step(Report("s1", "m", 0, 500, 500))
    assert idle.status()["slaves"]["s1"] == 500


def test_a_slave_says_nothing_of_a_log_it_was_told_to_truncate():
    """Reports built before a Truncate was stepped are dropped with it, and a tick before
    the truncation is carried out sends no heartbeat (nor a Hello) about the old log."""
    log = FakeLog(519, ((0, 0), (1, 346)))
    slave = _ms("s1", log, role="SLAVE", slave_timeout_ticks=4, heartbeat_ticks=2)
    log.carry_out(first := slave.ready())
    slave.advance(first)
    slave.tick()
    slave.tick()  # a heartbeat Report of [.., 519) waits in the Ready
    slave.step(Truncate("m", "s1", 2, 346, 0))
    for _ in range(4):
        slave.tick()  # a heartbeat and a Hello would fall due here
    ready = slave.ready()
    sent = ready.messages + ready.messages_after_persist
    assert ready.truncate_to == 346
    assert [type(m).__name__ for m in sent] == ["Hello"] and sent[0].position == 346, sent


def test_a_restarted_master_catches_up_from_the_slave_ahead_then_begins_an_epoch():
    """Issue 13's last hole: a SYNC_MASTER with async flush comes back shorter than a
    slave that holds records it acknowledged. It asks every slave where its log ends
    (with in_sync_slaves_min = 1 of 2 slaves, it must hear both: either may hold an
    acknowledged record), pulls from the one ahead, and only then, in a new epoch, serves;
    a Hello (not an answer) counts for nothing."""
    log = FakeLog(500, ((1, 0),))
    master = _ms("m", log)
    first = master.ready()
    assert sorted((m.kind, m.dst, m.position, m.last_epoch, m.max_bytes)
                  for m in first.messages) == [("pull", "s1", 500, 1, 0),
                                               ("pull", "s2", 500, 1, 0)]
    log.carry_out(first)
    master.advance(first)
    with pytest.raises(errors.NotMaster, match=r"heard from its slaves \(s1, s2\)"):
        master.may_accept("master")
    assert master.status()["accepts_writes"] is False and master.promotable
    master.step(Hello("s1", "m", 1, 800, 1))
    master.step(Pulled("s1", "m", 1, 500, True, 800, 1, -1))  # ahead: it extends this log
    with pytest.raises(errors.NotMaster, match=r"heard from its slaves \(s2\)"):
        master.check_master()
    master.step(Pulled("s2", "m", 1, 500, True, 600, 1, -1))  # ahead too, less so
    ready = master.ready()
    [pull] = [m for m in ready.messages if isinstance(m, Pull) and m.max_bytes > 0]
    assert (pull.dst, pull.position, master.waiting_for) == ("s1", 500, ["s1"])
    master.advance(ready)
    master.step(Pulled("s1", "m", 1, 500, True, 800, 1, 1, bytes(300)))
    ready = master.ready()
    assert ready.appends == [(500, bytes(300))] and ready.set_epoch is None
    log.carry_out(ready)
    master.advance(ready)
    ready = master.ready()
    assert ready.set_epoch == 2 and not any(isinstance(m, Truncate) for m in ready.messages)
    master.check_master()
    assert master.restart_report is not None and master.restart_report.pulled_from == ("s1",)
    assert (master.restart_report.caught_up_to, master.restart_report.unclean) == (800, False)
    assert sorted(master.status()["slaves"]) == ["s1", "s2"]  # both streamed to from there


def test_a_restarted_master_truncates_only_another_history():
    """A slave whose log does not extend the master's (its record ending there is of
    another epoch) holds nothing the master acknowledged past its end: it is told to
    truncate at once, while the master still waits for the other."""
    log = FakeLog(500, ((1, 0), (3, 400)))
    master = _ms("m", log, hard_state=RoleState("SYNC_MASTER", 3, "", ("s1", "s2")))
    master.advance(master.ready())
    master.step(Pulled("s1", "m", 3, 500, False, 700, 1, -1))  # an epoch-1 tail past 400
    ready = master.ready()
    [truncate] = [m for m in ready.messages if isinstance(m, Truncate)]
    assert (truncate.dst, truncate.position, truncate.last_epoch) == ("s1", 400, 1)
    assert master.waiting_for == ["s2"]


def test_a_restarted_master_that_waits_too_long_serves_and_says_what_may_be_lost():
    log = FakeLog(500, ((1, 0),))
    master = _ms("m", log, restart_unclean_after_ticks=5)
    master.advance(master.ready())
    master.step(Pulled("s2", "m", 1, 500, True, 500, 1, -1))
    for _ in range(5):
        master.tick()
    ready = master.ready()
    assert ready.set_epoch == 2
    report = master.restart_report
    assert report is not None and (report.unclean, report.heard, report.unheard) == (
        True, ("s2",), ("s1",))
    assert any("lost" in event and "['s1']" in event for event in ready.events)


def test_a_restarted_async_master_asks_all_its_slaves_then_goes_on_with_one():
    log = FakeLog(500, ((1, 0),))
    master = _ms("m", log, role="ASYNC_MASTER", slave_timeout_ticks=30)
    master.advance(master.ready())
    master.step(Pulled("s2", "m", 1, 500, True, 500, 1, -1))
    for _ in range(29):
        master.tick()
    assert master.waiting_for == ["s1"] and master.ready().set_epoch is None
    master.tick()
    assert master.ready().set_epoch == 2 and master.restart_report is not None
    assert not master.restart_report.unclean  # (its promise never covered s1's copy)


def test_a_slave_answers_a_pull_with_records_only_for_its_own_master_and_history():
    log = FakeLog(800, ((1, 0),))
    slave = _ms("s1", log, role="SLAVE")
    slave.advance(slave.ready())
    slave.step(Pull("m", "s1", 1, 500, 1, 100))
    [mine] = slave.ready().messages
    assert isinstance(mine, Pulled)
    assert (mine.position, mine.agrees, mine.end, len(mine.payload)) == (500, True, 800, 100)
    slave.advance(slave.ready())
    slave.step(Pull("m", "s1", 1, 500, 0, 100))  # the master's record there is epoch 0
    [other] = slave.ready().messages
    assert (other.agrees, other.payload) == (False, b"")
    slave.advance(slave.ready())
    slave.step(Pull("x", "s1", 9, 500, 1, 100))  # a stranger: where the log ends, no more
    [stranger] = slave.ready().messages
    assert (stranger.dst, stranger.position, stranger.payload, slave.epoch) == ("x", -1, b"", 1)


def test_a_slave_drops_the_appends_of_its_masters_earlier_life_once_asked():
    """Seed 3257: an Append the master sent before its power loss, delivered after the
    slave told the restarted master where its log ends, grew the slave's log past what
    the master learned; the master then wrote its new epoch at those positions. The Pull
    carries the epoch the master will begin: the slave adopts it and drops the old."""
    log = FakeLog(500, ((1, 0),))
    slave = _ms("s1", log, role="SLAVE")
    slave.advance(slave.ready())
    slave.step(Pull("m", "s1", 2, 500, 1, 0))
    slave.advance(slave.ready())
    slave.step(Append("m", "s1", 1, 500, bytes(100)))  # the old life's, late
    assert slave.ready().appends == [] and slave.epoch == 2


def test_a_restarted_master_that_missed_a_promotion_is_fenced_by_the_answer():
    """Its slave follows a node promoted meanwhile: it answers with its newer epoch."""
    log = FakeLog(500, ((1, 0),))
    master = _ms("m", log)
    master.advance(master.ready())
    master.step(Pulled("s1", "m", 2, -1, False, 900, 2, -1))
    assert master.role == "FENCED" and not master.promotable


def test_an_operator_vouches_for_a_waiting_master_with_promote():
    log = FakeLog(500, ((0, 0),))
    master = _ms("m", log, role="ASYNC_MASTER")
    master.promote("ASYNC_MASTER", ("s1", "s2"))
    ready = master.ready()
    assert ready.hard_state == RoleState("ASYNC_MASTER", 1, "", ("s1", "s2"))
    assert ready.set_epoch == 1
    master.check_master()
    with pytest.raises(errors.InvalidArgument):
        master.promote("ASYNC_MASTER", ("s1",))


def test_promote_and_follow_save_the_role_which_wins_on_restart(tmp_path: Path):
    log = FakeLog(500, ((0, 0),))
    slave = _ms("s1", log, role="SLAVE")
    slave.ready()
    slave.promote("SYNC_MASTER", ("s2", "m"))
    saved = slave.ready().hard_state
    assert saved == RoleState("SYNC_MASTER", 1, "", ("s2", "m"))
    hardstate.save(tmp_path, saved)
    restarted = _ms("s1", log, role="SLAVE", hard_state=hardstate.load_role(tmp_path))
    assert (restarted.role, restarted.epoch, tuple(restarted.slaves)) == (
        "SYNC_MASTER", 2, ("s2", "m"))  # (the epoch it begins once caught up)
    old = _ms("m", log)  # the old master, told to follow the new one
    old.advance(old.ready())
    old.follow("s1")
    ready = old.ready()
    assert ready.hard_state == RoleState("SLAVE", 0, "s1", ())
    assert [(m.kind, m.dst) for m in ready.messages] == [("hello", "s1")]
    hardstate.save(tmp_path, ready.hard_state)
    again = _ms("m", log, hard_state=hardstate.load_role(tmp_path))  # its TOML: a master
    assert (again.role, again.config.master) == ("SLAVE", "s1")


def test_a_damaged_role_state_is_an_error_that_says_what_to_do(tmp_path: Path):
    assert hardstate.load_role(tmp_path) is None
    hardstate.save(tmp_path, RoleState("SLAVE", 3, "s1"))
    path = tmp_path / hardstate.ROLE_FILE_NAME
    path.write_text(path.read_text().replace('"epoch":3', '"epoch":4'))
    with pytest.raises(errors.CorruptStore, match="start the node as a SLAVE|restore"):
        hardstate.load_role(tmp_path)
    assert hardstate.load(tmp_path) == HardState()  # the Raft file is another one


# --- GroupClient (finding 9) ----------------------------------------------------------------


def test_group_client_retries_a_flush_disk_timeout_with_the_same_sequence():
    """FLUSH_DISK_TIMEOUT: the record is stored and may still commit. The client sends
    it again with the same producer id and sequence (the node answers a stored one with
    its first place), it does not report the write as failed."""
    answers = [PutStatus.FLUSH_DISK_TIMEOUT, PutStatus.SLAVE_NOT_AVAILABLE, PutStatus.PUT_OK]
    seen: list[tuple[Any, Any]] = []
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        connection, _ = listener.accept()
        decoder = FrameDecoder(1 << 20)
        with connection:
            while answers:
                while not isinstance(frame := decoder.next_frame(), Frame):
                    decoder.feed(connection.recv(1 << 16))
                seen.append((frame.header["producer_id"], frame.header["sequence"]))
                connection.sendall(encode_frame({
                    "kind": "produced", "id": frame.header["id"],
                    "status": answers.pop(0).value, "position": 7, "offset": 0, "count": 1}))

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    with GroupClient([address], producer_id="p", retry_backoff_ms=1) as client:
        result = client.produce("t", b"x")
    server.join(timeout=30)
    listener.close()
    assert result.status is PutStatus.PUT_OK and client.retries == 2
    assert seen == [("p", 1)] * 3



@given(st.lists(st.tuples(st.sampled_from(["add", "commit", "expire"]), st.integers(0, 40)),
                max_size=60))
def test_proposals_answer_each_write_once_when_its_own_end_is_committed(steps):
    """Every layer's leader keeps its waiting writes in Proposals: against a model, each
    write is answered exactly once, PUT_OK at the first commit that reaches its end
    (whatever ends were proposed before it: an idempotent retry's lies behind them), a
    timeout at its deadline otherwise."""
    proposals, model, resolved, expected = Proposals(), {}, [], []
    tick = committed = 0
    for number, (action, value) in enumerate(steps):
        if action == "add":
            proposals.add(number, value, tick + 5)
            model[number] = (value, tick + 5)
        elif action == "commit":
            committed = max(committed, value)
            proposals.commit(committed, resolved)
            done = [key for key, (end, _) in model.items() if end <= committed]
            expected += [(key, PutStatus.PUT_OK) for key in done]
        else:
            tick += value % 4
            proposals.expire(tick, resolved, PutStatus.REQUEST_TIMED_OUT)
            done = [key for key, (_, deadline) in model.items() if deadline <= tick]
            expected += [(key, PutStatus.REQUEST_TIMED_OUT) for key in done]
        for key in done if action != "add" else ():
            del model[key]
        assert sorted(resolved) == sorted(expected)
        assert proposals.furthest_end() == max((end for end, _ in model.values()), default=-1)
    proposals.resolve_all(resolved, PutStatus.FLUSH_SLAVE_TIMEOUT)
    assert sorted(key for key, _ in resolved) == sorted(
        number for number, (action, _) in enumerate(steps) if action == "add")
    assert len(proposals) == 0
