"""The ISR core's single decisions, stepped directly over an in-memory log (as
tests/test_cores.py does for the other layers), and the controller's ISR decisions
(isr/decisions.py) under Hypothesis. The datadriven scripts (tests/data/isr) show whole
exchanges."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqlog import errors
from mqlog.config import ReplicationConfig
from mqlog.replication import hardstate
from mqlog.replication.isr import AlterPartition, IsrCore, PartitionState
from mqlog.replication.isr.core import answer_error
from mqlog.replication.isr.decisions import decide_alter_partition, elect_leader
from mqlog.replication.messages import Fetch, FetchReply
from mqlog.results import PutStatus
from tests.test_cores import FakeLog

REPLICAS = ("n1", "n2", "n3")


def _core(name: str, log: FakeLog, state: PartitionState | None = None,
          **overrides: Any) -> IsrCore:
    config = ReplicationConfig(layer="isr", node_id=name, replicas=REPLICAS,
                               tick_ms=10, replica_lag_time_ms=100, fetch_wait_ms_max=40,
                               retransmit_ticks=2, **overrides)
    core = IsrCore(config, log)
    if state is not None:
        core.apply_metadata(state)
        log.carry_out(ready := core.ready())
        core.advance(ready)
    return core


def _state(leader: str = "n1", epoch: int = 1, partition_epoch: int = 1,
           isr: tuple[str, ...] = REPLICAS) -> PartitionState:
    return PartitionState(leader, epoch, partition_epoch, isr, (), REPLICAS)


def _sent(core: IsrCore) -> list[Any]:
    ready = core.ready()
    return ready.messages + ready.messages_after_persist


def test_a_follower_drops_answers_to_fetches_it_no_longer_waits_for():
    log = FakeLog(100, ((1, 0),))
    follower = _core("n2", log, _state())
    for _ in range(6 + 1):  # the fetch's answer is late: it asks again
        follower.tick()
    fetches = [m for m in _sent(follower) if isinstance(m, Fetch)]
    assert [m.fetch_id for m in fetches] == [2]
    stale = FetchReply("n1", "n2", 1, 1, 100, 1, 300, 0, -1, -1, "", -1, -1,
                       payload=bytes(50))
    follower.step(stale)
    assert follower.ready().appends == []


def test_a_saved_high_watermark_is_taken_up_to_the_log_end_when_leading(tmp_path):
    """A restarted replica that leads first takes the high watermark it saved, never past
    its log's end (a torn tail cut by recovery), and commits to it; one that follows
    drops it (an unclean election may have cut what it counted: its leader says). Until
    either, the node keeps saving it. The saved file comes back as written; a damaged or
    missing one is 0, with a word for the operator when damaged (never an error)."""
    log = FakeLog(300, ((1, 0),))
    config = ReplicationConfig(layer="isr", node_id="n2", replicas=REPLICAS)
    for saved, expected in ((120, 120), (500, 300), (0, 0)):
        core = IsrCore(config, log, high_watermark=saved)
        assert core.hw == 0 and core.high_watermark_to_save == expected
        core.apply_metadata(_state(leader="n2", epoch=2))  # (a new leader epoch)
        assert core.hw == expected and core.ready().commit_to == (expected or None)
        follower = IsrCore(config, log, high_watermark=saved)
        follower.apply_metadata(_state(leader="n1"))
        assert follower.hw == 0 and follower.high_watermark_to_save == 0
        assert follower.ready().commit_to is None
    assert hardstate.load_high_watermark(tmp_path) == (0, "")
    hardstate.save_high_watermark(tmp_path, 4_096)
    assert hardstate.load_high_watermark(tmp_path) == (4_096, "")
    path = tmp_path / hardstate.HIGH_WATERMARK_FILE_NAME
    path.write_text(path.read_text().replace("4096", "9096"))  # (its CRC no longer fits)
    value, trouble = hardstate.load_high_watermark(tmp_path)
    assert value == 0 and "ignored its saved high watermark" in trouble, trouble


def test_only_replicas_of_this_cluster_are_heard():
    leader = _core("n1", FakeLog(), _state(), cluster_id="blue")
    leader.step(Fetch("x9", "n1", 1, 1, 0, -1, cluster_id="blue"))
    leader.step(Fetch("n2", "n1", 1, 1, 0, -1, cluster_id="red"))
    assert leader.ignored == 2 and leader.followers["n2"].log_end == -1
    assert not _sent(leader)


def test_a_stale_leader_epoch_is_fenced_and_the_follower_backs_off():
    leader = _core("n1", FakeLog(), _state(epoch=3))
    leader.step(Fetch("n2", "n1", 2, 7, 0, -1))
    (reply,) = _sent(leader)
    assert reply.error == "FENCED_LEADER_EPOCH" and reply.fetch_id == 7
    follower = _core("n2", FakeLog(), _state(epoch=3))
    follower.step(FetchReply("n1", "n2", 3, 1, 0, -1, 0, 0, -1, -1, "UNKNOWN_LEADER_EPOCH",
                             -1, -1))
    assert not [m for m in _sent(follower) if isinstance(m, Fetch)]
    follower.tick()
    follower.tick()
    assert [m.fetch_id for m in _sent(follower) if isinstance(m, Fetch)] == [2]


def test_a_fetch_before_the_log_start_starts_the_follower_over():
    log = FakeLog(5000, ((1, 0), (2, 3000)))
    log.first_segment_base = lambda: 4096  # type: ignore[method-assign]
    leader = _core("n1", log, _state(epoch=3))
    leader.step(Fetch("n2", "n1", 3, 1, 100, 1))
    (reply,) = _sent(leader)
    assert (reply.error, reply.log_start, reply.start_epoch, reply.start_epoch_start) == (
        "OFFSET_OUT_OF_RANGE", 4096, 2, 3000)
    follower = _core("n2", FakeLog(100, ((1, 0),)), _state(epoch=3))
    follower.step(reply)
    ready = follower.ready()
    assert ready.reset_log == (4096, [(2, 3000)]) and ready.commit_to == 4096
    assert [(m.position, m.last_epoch) for m in ready.messages] == [(4096, 2)]


def test_a_fetch_whose_records_retention_takes_during_the_read_starts_the_follower_over():
    """Retention (the store's own thread) lets the segment go between the leader's check
    of its log start and its read: the follower is answered OFFSET_OUT_OF_RANGE with the
    new log start at once (INVALID_POSITION before, and a retransmit later the reset)."""
    log = FakeLog(5000, ((1, 0), (2, 3000)))
    leader = _core("n1", log, _state(epoch=3))

    def read_as_retention_runs(position: int, limit: int) -> bytes:
        log.first_segment_base = lambda: 4096  # type: ignore[method-assign]
        raise errors.InvalidPosition(f"position {position} went away while it was read")

    log.read_for_send = read_as_retention_runs  # type: ignore[method-assign]
    leader.step(Fetch("n2", "n1", 3, 1, 100, 1))
    (reply,) = _sent(leader)
    assert (reply.error, reply.log_start, reply.start_epoch, reply.start_epoch_start) == (
        "OFFSET_OUT_OF_RANGE", 4096, 2, 3000)


def test_a_damaged_record_is_answered_corrupt_message_and_reported_once():
    """The leader's copy of the record at 150 fails its CRC: a fetch from 0 gets the 150
    bytes before it; one from 150 CORRUPT_MESSAGE (the follower backs off and asks again),
    with one event per follower however often it asks."""
    log = FakeLog(300, ((1, 0),))
    leader = _core("n1", log, _state(epoch=2))
    read = log.read_for_send

    def damaged(position: int, limit: int) -> bytes:
        if position <= 150 < position + limit:  # (the store reads no record past limit)
            raise errors.CorruptRecord(150, "CRC32C mismatch")
        return read(position, limit)

    log.read_for_send = damaged  # type: ignore[method-assign]
    leader.step(Fetch("n2", "n1", 2, 1, 0, -1))
    ready = leader.ready()
    assert [(m.error, len(m.payload)) for m in ready.messages] == [("", 150)]
    leader.advance(ready)
    events = []
    for fetch_id in (2, 3):
        leader.step(Fetch("n2", "n1", 2, fetch_id, 150, 1))
        ready = leader.ready()
        assert [(m.error, m.fetch_id, len(m.payload)) for m in ready.messages] == [
            ("CORRUPT_MESSAGE", fetch_id, 0)]
        events += ready.events
        leader.advance(ready)
    assert len([event for event in events if "cannot send n2" in event]) == 1, events
    follower = _core("n2", FakeLog(), _state(epoch=2))  # (its first fetch's id is 1)
    follower.step(dataclasses.replace(ready.messages[0], fetch_id=1))
    assert not [m for m in _sent(follower) if isinstance(m, Fetch)]
    follower.tick()
    follower.tick()  # (retransmit_ticks: its backoff)
    assert [m.fetch_id for m in _sent(follower) if isinstance(m, Fetch)] == [2]


def test_acks_one_is_taken_below_min_insync_and_acks_all_is_not():
    leader = _core("n1", FakeLog(), _state(isr=("n1",)), min_insync_replicas=2)
    assert leader.may_accept("master") is PutStatus.PUT_OK
    with pytest.raises(errors.NotEnoughReplicas, match="nothing was stored"):
        leader.may_accept("replicated")
    follower = _core("n2", FakeLog(), _state())
    with pytest.raises(errors.NotLeader) as raised:
        follower.may_accept("master")
    assert raised.value.leader == "n1"


def test_a_flushed_ack_waits_for_the_leaders_own_flush():
    log = FakeLog()
    leader = _core("n1", log, _state(isr=("n1",)), replica_ack="flushed")
    log.written_position = 200  # stored, not flushed
    leader.propose("p1", 200)
    ready = leader.ready()
    assert ready.must_sync and ready.resolved == []
    leader.advance(ready)
    log.flushed_position = 200
    assert leader.ready().resolved == [("p1", PutStatus.PUT_OK)]


def test_a_new_leader_waits_for_each_isr_follower_to_fetch_in_its_epoch():
    log = FakeLog(300, ((1, 0),))
    leader = _core("n1", log, _state(epoch=2, isr=("n1", "n2")))
    leader.propose("p1", 300)
    assert leader.ready().resolved == [] and leader.hw == 0
    leader.step(Fetch("n2", "n1", 2, 1, 300, 1))
    assert leader.ready().resolved == [("p1", PutStatus.PUT_OK)] and leader.hw == 300


def test_followers_held_at_one_position_are_answered_from_one_read():
    """Both followers wait at the same position: one read of the log answers both (a read
    is a copy of up to fetch_bytes_max bytes); one at another position gets its own."""
    log = FakeLog(300, ((1, 0),))
    leader = _core("n1", log, _state(epoch=2))
    reads = []
    read = log.read_for_send
    log.read_for_send = lambda position, size: reads.append(position) or read(position, size)
    leader.step(Fetch("n2", "n1", 2, 1, 0, -1))
    leader.step(Fetch("n3", "n1", 2, 1, 0, -1))
    replies = [m for m in _sent(leader) if isinstance(m, FetchReply)]
    assert [(m.dst, m.position, len(m.payload)) for m in replies] == [("n2", 0, 300),
                                                                      ("n3", 0, 300)]
    assert reads == [0]
    leader.advance(leader.ready())
    log.written_position = 500
    leader.step(Fetch("n2", "n1", 2, 2, 300, 1))
    leader.step(Fetch("n3", "n1", 2, 2, 200, 1))
    replies = [m for m in _sent(leader) if isinstance(m, FetchReply)]
    assert [(m.dst, m.position, len(m.payload)) for m in replies] == [("n2", 300, 200),
                                                                      ("n3", 200, 100)]
    assert reads == [0, 300, 200]  # (n3's answer ends where leader epoch 2 starts)



def test_a_fetch_held_for_fetch_bytes_min_is_answered_once_an_acks_all_write_waits():
    """fetch_bytes_min batches what followers get of acks=1 writes; a held fetch that
    would carry records an acks=all write waits for is answered at once (its answer, then
    the follower's next fetch, moves the high watermark)."""
    log = FakeLog(300, ((1, 0),))
    leader = _core("n1", log, _state(epoch=2), fetch_bytes_min=1 << 20)
    leader.step(Fetch("n2", "n1", 2, 1, 300, 1))
    leader.step(Fetch("n3", "n1", 2, 1, 300, 1))
    leader.advance(leader.ready())
    log.written_position = 400  # an acks=1 write: the fetches wait for more
    assert not _sent(leader)
    leader.advance(leader.ready())
    log.written_position = 450
    leader.propose("p1", 450)  # an acks=all write
    replies = [m for m in _sent(leader) if isinstance(m, FetchReply)]
    assert [(m.dst, m.position, len(m.payload)) for m in replies] == [("n2", 300, 150),
                                                                      ("n3", 300, 150)]
    leader.advance(leader.ready())
    leader.step(Fetch("n2", "n1", 2, 2, 450, 2))
    leader.step(Fetch("n3", "n1", 2, 2, 450, 2))
    ready = leader.ready()
    assert ready.resolved == [("p1", PutStatus.PUT_OK)] and leader.hw == 450
    leader.advance(ready)
    log.written_position = 500  # acks=1 again: held
    assert not [m for m in _sent(leader) if isinstance(m, FetchReply)]


def test_a_held_fetch_is_answered_for_the_furthest_write_waiting_not_the_last_proposed():
    """An idempotent retry proposes its stored copy's end, which may lie before a newer
    write's: a fetch held short of the newer one is answered at once all the same."""
    log = FakeLog(400, ((1, 0),))
    leader = _core("n1", log, _state(epoch=2), fetch_bytes_min=1 << 20)
    leader.step(Fetch("n2", "n1", 2, 1, 400, 2))
    leader.advance(leader.ready())
    log.written_position = 500
    leader.propose("new", 500)
    leader.propose("retry", 300)  # (stored long ago, below the fetch: proposed last)
    replies = [m for m in _sent(leader) if isinstance(m, FetchReply)]
    assert [(m.dst, m.position, len(m.payload)) for m in replies] == [("n2", 400, 100)]


def test_a_proposal_that_moves_no_log_still_makes_has_ready_say_yes():
    """An idempotent retry proposes its stored copy without writing: the log did not
    move, but a fetch held for min bytes is now to be answered, so has_ready() must not
    let the driver skip that run (its promise: False only when ready() is empty)."""
    log = FakeLog(400, ((1, 0),))
    leader = _core("n1", log, _state(epoch=2), fetch_bytes_min=1 << 20)
    leader.step(Fetch("n2", "n1", 2, 1, 300, 1))
    leader.advance(leader.ready())  # (held: 100 bytes, below min bytes)
    assert not leader.has_ready()
    leader.propose("retry", 350)  # (stored before; the log did not move)
    assert leader.has_ready()
    replies = [m for m in _sent(leader) if isinstance(m, FetchReply)]
    assert [(m.dst, m.position, len(m.payload)) for m in replies] == [("n2", 300, 100)]

def test_an_idempotent_retry_is_answered_once_its_own_end_is_committed():
    """A retry proposes its stored copy's end, before a newer write's still waiting: it
    is answered when the high watermark passes that end, not once the newer one is."""
    log = FakeLog(500, ((1, 0),))
    leader = _core("n1", log, _state(epoch=2, isr=("n1", "n2")))
    leader.propose("new", 500)
    leader.propose("retry", 300)  # (stored long ago, not committed yet)
    leader.step(Fetch("n2", "n1", 2, 1, 400, 1))
    ready = leader.ready()
    assert ready.resolved == [("retry", PutStatus.PUT_OK)] and leader.hw == 400
    leader.advance(ready)
    leader.step(Fetch("n2", "n1", 2, 2, 500, 1))
    assert leader.ready().resolved == [("new", PutStatus.PUT_OK)]


def test_losing_leadership_answers_waiting_writes_request_timed_out():
    log = FakeLog(300, ((1, 0),))
    leader = _core("n1", log, _state(epoch=2))
    leader.propose("p1", 300)
    leader.apply_metadata(_state(leader="n2", epoch=3, partition_epoch=2))
    ready = leader.ready()
    assert ready.resolved == [("p1", PutStatus.REQUEST_TIMED_OUT)]
    assert [(m.dst, m.position) for m in ready.messages] == [("n2", 300)]
    assert isinstance(answer_error(PutStatus.REQUEST_TIMED_OUT), errors.RequestTimedOut)
    assert answer_error(PutStatus.PUT_OK) is None


def test_a_restarted_leader_does_not_lead_an_epoch_its_log_has_records_of():
    """A leader that restarts before the controller saw it may have lost records its
    followers hold; leading the same leader epoch again would truncate them there. It
    waits for a new leader epoch (the controller moves leadership on re-registration)."""
    log = FakeLog(300, ((1, 0), (2, 100)))
    restarted = _core("n1", log)
    restarted.apply_metadata(_state(epoch=2))
    ready = restarted.ready()
    assert not restarted.is_master and ready.set_epoch is None
    assert "ignores metadata naming it leader in epoch 2" in " ".join(ready.events)
    restarted.apply_metadata(_state(epoch=3, partition_epoch=2))
    assert restarted.is_master and restarted.ready().set_epoch == 3


def test_stale_metadata_changes_nothing():
    leader = _core("n1", FakeLog(), _state(epoch=2, partition_epoch=5))
    leader.apply_metadata(_state(leader="n2", epoch=1, partition_epoch=4))
    leader.apply_metadata(_state(leader="n2", epoch=3, partition_epoch=5))
    assert leader.is_master and leader.state.partition_epoch == 5


# --- the controller's decisions ------------------------------------------------------------


def test_alter_partition_is_refused_unless_it_comes_from_the_leader_in_its_epochs():
    state = _state(epoch=4, partition_epoch=9)
    good = AlterPartition("n1", "controller", 4, 9, ("n1", "n2"))
    assert decide_alter_partition(state, good, 2).isr == ("n1", "n2")
    for request in (AlterPartition("n2", "controller", 4, 9, ("n1", "n2")),
                    AlterPartition("n1", "controller", 3, 9, ("n1", "n2")),
                    AlterPartition("n1", "controller", 4, 8, ("n1", "n2")),
                    AlterPartition("n1", "controller", 4, 9, ("n2", "n3")),
                    AlterPartition("n1", "controller", 4, 9, ("n1", "n9"))):
        with pytest.raises(errors.MetadataChangeRefused):
            decide_alter_partition(state, request, 2)
    with pytest.raises(errors.MetadataChangeRefused, match="fenced"):
        decide_alter_partition(_state(epoch=4, partition_epoch=9, isr=("n1",)), good, 2,
                               live={"n1"})


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(0, 2**32), st.integers(1, 3), st.booleans())
def test_controller_decisions_keep_the_isr_and_elr_rules(seed, min_isr, unclean):
    """Random shrinks, expands and failovers: the leader is in the ISR (or there is none),
    ISR and ELR never overlap, the ELR is empty while the ISR has min_isr members, the
    epochs only grow, and an election never passes over a live ISR or ELR member."""
    rng = random.Random(seed)
    state = _state(partition_epoch=1)
    for _ in range(30):
        live = {name for name in REPLICAS if rng.random() < 0.7}
        before = state
        if state.leader in live and rng.random() < 0.6:
            others = [name for name in REPLICAS if name != state.leader and rng.random() < 0.5]
            isr = tuple(name for name in REPLICAS if name == state.leader or name in others)
            try:
                state = decide_alter_partition(state, AlterPartition(
                    state.leader, "controller", state.leader_epoch, state.partition_epoch,
                    isr), min_isr, live)
            except errors.MetadataChangeRefused:
                assert set(isr) - set(before.isr) - live, (seed, before, isr, live)
                continue
        else:
            state, how = elect_leader(state, live - {state.leader}, min_isr, unclean)
            if how in ("elr", "unclean", "none"):
                assert not set(before.isr) & (live - {before.leader}), (seed, before)
            if how in ("unclean", "none"):
                assert not set(before.elr) & (live - {before.leader}), (seed, before)
            assert how != "unclean" or unclean
        assert state.partition_epoch > before.partition_epoch
        assert state.leader_epoch >= before.leader_epoch
        assert state.leader == "" or state.leader in state.isr, (seed, state)
        assert not set(state.isr) & set(state.elr), (seed, state)
        assert len(state.isr) < min_isr or not state.elr, (seed, state)


def test_isr_config_limits_are_checked_together():
    base = dict(layer="isr", node_id="n1", replicas=REPLICAS)
    ReplicationConfig(**base).validate()  # type: ignore[arg-type]
    for overrides, message in (({"replicas": ("n2", "n3")}, "must be one of"),
                               ({"fetch_wait_ms_max": 30_000}, "idle follower"),
                               ({"replica_ack": "synced"}, "replica_ack"),
                               ({"fetch_bytes_min": 0}, "positive")):
        with pytest.raises(errors.ConfigError, match=message):
            ReplicationConfig(**{**base, **overrides}).validate()  # type: ignore[arg-type]
    # (more than the replicas is allowed, as Kafka allows it: acks=all is then refused
    # by the core, NotEnoughReplicas saying why; tests/test_isr_min_insync.py)
    ReplicationConfig(**{**base, "min_insync_replicas": 4}).validate()  # type: ignore[arg-type]
