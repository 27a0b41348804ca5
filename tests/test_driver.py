"""The driver (mqlog/replication/driver.py) on its own: what it must never do whatever the
core asks — take writes before a term started, ack bytes before their flush completed,
retry a Ready that failed — with real stores and cores and an Io whose flushes complete
only when a test says so."""

from __future__ import annotations

import random
from typing import Any

import pytest

import mqlog
from mqlog.config import ReplicationConfig
from mqlog.errors import InvalidPosition, NotLeader, PartiallyStored, StoreFailed
from mqlog.replication.core import PeerReads, Unsendable
from mqlog.replication.driver import Driver
from mqlog.replication.master_slave import MasterSlaveCore
from mqlog.replication.messages import (
    Entries,
    EntriesReply,
    Hello,
    Message,
    Vote,
    VoteReply,
)
from mqlog.replication.raft import RaftCore
from mqlog.results import PutStatus
from tests.conftest import SMALL

STORE = dict(SMALL, committed_follows="external", background_threads=False,
             segment_prepare_ahead=False, flush_interval_ms=3_600_000)
RAFT = dict(layer="raft", voters=("n1", "n2", "n3"), election_timeout_ticks=10,
            heartbeat_ticks=2, retransmit_ticks=4, sync_timeout_ticks=20,
            append_bytes_max=600, inflight_bytes_max=1200, frame_size_bytes_max=8192,
            pre_vote=False, check_quorum=False)


class HeldIo:
    """Sends into a list; flushes wait in a list until ``complete_flushes``."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.sent: list[Message] = []
        self.flushes: list[Any] = []
        self.answers: list[tuple[Any, PutStatus]] = []
        self.failures: list[BaseException] = []
        self.refusals: list[BaseException] = []
        self.notes: list[str] = []
        self.hard_state: Any = None

    def send(self, messages: list[Message]) -> None:
        self.sent += messages

    def save_hard_state(self, state: Any) -> None:
        self.hard_state = state

    def start_flush(self, done: Any) -> None:
        self.flushes.append(done)

    def complete_flushes(self) -> None:
        flushes, self.flushes = self.flushes, []
        self.store.flush()
        for done in flushes:
            done(True)

    def answer(self, request: Any, status: PutStatus) -> None:
        self.answers.append((request, status))

    def note(self, event: str) -> None:
        self.notes.append(event)

    def failed(self, error: BaseException) -> None:
        self.failures.append(error)

    def refused(self, error: BaseException) -> None:
        self.refusals.append(error)


def _replica(tmp_path, impl, name: str) -> tuple[Any, RaftCore, Driver, HeldIo]:
    store = mqlog.open(tmp_path / name, implementation=impl, clock_ms=lambda: 1_000, **STORE)
    core = RaftCore(ReplicationConfig(node_id=name, **RAFT), store,  # type: ignore[arg-type]
                    rng=random.Random(name))
    io = HeldIo(store)
    return store, core, Driver(store, core, io), io


def _elect(driver: Driver, io: HeldIo) -> None:
    """n1 campaigns and steps both granted votes; its Ready is not carried out yet."""
    core = driver.core
    for _ in range(40):
        driver.tick()
        if core.role == "CANDIDATE":
            break
    driver.run()
    io.complete_flushes()
    votes = [message for message in io.sent if isinstance(message, Vote)]
    assert votes, "n1 did not campaign"
    for voter in ("n2", "n3"):
        driver.step(VoteReply(voter, "n1", core.term, True, False))
    assert core.is_master


def test_a_new_leader_refuses_writes_until_its_term_started(tmp_path, impl):
    """Finding 1: the role flips inside step(); the epoch, the no-op and the producer
    table come with the next Ready. A write in between must get NotLeader — before the
    fix it was stored under the previous epoch."""
    store, core, driver, io = _replica(tmp_path, impl, "n1")
    try:
        store.put("t", b"old")  # a record of an earlier epoch, as a follower holds
        _elect(driver, io)
        with pytest.raises(NotLeader, match="has not started it yet"):
            driver.check_writable()
        assert not driver.serving
        driver.run()  # the epoch, the no-op: the term starts
        driver.check_writable()
        stored = driver.write("t", [b"new"], producer=("p", 1, 0))
        assert store.epoch_at(stored.end) == core.term
        assert driver.producers.lookup("p", 1, 0) == stored
    finally:
        store.close()


def test_a_follower_acks_repeated_unflushed_bytes_only_after_the_flush(tmp_path, impl):
    """Finding 2: an Entries that repeats bytes written but still being flushed asked for
    no sync, so its ack went out at once."""
    store, core, driver, io = _replica(tmp_path, impl, "n2")
    try:
        leader_store = mqlog.open(tmp_path / "leader", implementation=impl,
                                  clock_ms=lambda: 1_000, **STORE)
        leader_store.set_epoch(1)
        end = leader_store.put("t", b"x" * 100).end_position
        payload = leader_store.read_raw(0, end)
        leader_store.close()
        entries = Entries("n1", "n2", 1, 0, -1, 1, 0, b"", payload)
        driver.step(entries)
        driver.run()
        assert store.written_position == end and store.flushed_position < end
        assert not [message for message in io.sent if isinstance(message, EntriesReply)]
        driver.step(entries)  # a retransmit, while the first flush is still running
        driver.run()
        assert not [message for message in io.sent if isinstance(message, EntriesReply)], \
            "acked bytes that are not flushed"
        io.complete_flushes()
        acks = [message for message in io.sent if isinstance(message, EntriesReply)]
        assert acks and all(ack.match == end for ack in acks)
        assert store.flushed_position == end
    finally:
        store.close()


class _RefusingStore:
    """A store whose appends fail (a disk that went bad, a bug in the core)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.appends = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def append_raw(self, position: int, data: bytes) -> int:
        self.appends += 1
        raise OSError(5, f"Input/output error at {position}")


def test_a_ready_that_fails_stops_the_replica_once_and_loudly(tmp_path, impl):
    """Finding 6: a failed Ready was never advanced and re-raised forever. Now the replica
    stops: the Io hears it once, waiting requests get an answer, nothing runs again and
    writes are refused (StoreFailed: restart the node, recovery runs)."""
    store, core, driver, io = _replica(tmp_path, impl, "n2")
    refusing = _RefusingStore(store)
    driver.store = refusing
    try:
        driver.step(Entries("n1", "n2", 1, 0, -1, 1, 0, b"", b"garbage" * 20))
        driver.run()
        assert len(io.failures) == 1 and isinstance(io.failures[0], OSError)
        for _ in range(5):
            driver.tick()
            driver.step(Entries("n1", "n2", 1, 0, -1, 1, 0, b"", b"garbage" * 20))
            assert not driver.run()
        assert refusing.appends == 1 and len(io.failures) == 1
        with pytest.raises(StoreFailed, match="restart the node"):
            driver.check_writable()
    finally:
        store.close()


def _run_as_retention_races(store: Any, driver: Driver, io: HeldIo) -> list[tuple[str, str]]:
    """Run the driver once, its store's next read_for_send finding that retention ran
    between the core's check of its log start and the read (the store's maintenance
    thread runs it any time); what the run sent, (kind, to). The replica goes on."""
    real = store.read_for_send

    def racing(position: int, limit: int) -> Any:
        store.read_for_send = real
        store.trim_front(store.committed_position)
        return real(position, limit)

    store.read_for_send = racing
    io.sent.clear()
    driver.run()
    assert store.first_segment_base() > 0, "retention let nothing go"
    assert io.failures == [] and driver.failure is None
    return [(type(message).__name__, message.dst) for message in io.sent]


def test_a_raft_leader_whose_read_meets_retention_resets_the_follower(tmp_path, impl):
    """A segment let go between the leader's log-start check and its read: the follower
    gets the LogReset it would have got a moment later, in this run (the read's
    InvalidPosition escaped from ready() into the loop's callback before)."""
    store, core, driver, io = _replica(tmp_path, impl, "n1")
    try:
        _elect(driver, io)
        driver.run()
        io.complete_flushes()
        for index in range(60):  # three 64 KiB segments
            driver.write("t", [bytes([index]) * 3000])
        end = store.written_position
        driver.propose(("client", 1), end)
        for _ in range(2):
            driver.run()
            io.complete_flushes()
        driver.step(EntriesReply("n3", "n1", core.term, True, end, -1, -1))
        driver.run()
        assert store.committed_position == end and len(store.segments()) > 1
        driver.step(EntriesReply("n2", "n1", core.term, False, 0, 0, -1))  # n2 lost it all
        assert _run_as_retention_races(store, driver, io) == [("LogReset", "n2")]
    finally:
        store.close()


def test_a_master_whose_read_meets_retention_resets_the_slave(tmp_path, impl):
    """The master-slave twin of the test above: ``_pump`` resets the slave."""
    store = mqlog.open(tmp_path / "m", implementation=impl, clock_ms=lambda: 1_000,
                       **STORE)
    config = ReplicationConfig(node_id="m", role="SYNC_MASTER", slaves=("s",),
                               heartbeat_ticks=3, slave_timeout_ticks=10)
    core = MasterSlaveCore(config, store)
    io = HeldIo(store)
    driver = Driver(store, core, io)
    try:
        driver.run()
        for index in range(60):  # three 64 KiB segments
            driver.write("t", [bytes([index]) * 3000])
        store.flush()
        store.set_committed_position(store.written_position)
        driver.step(Hello("s", "m", core.epoch, 0, -1))  # the slave starts from nothing
        assert _run_as_retention_races(store, driver, io) == [("LogReset", "s")]
    finally:
        store.close()


def _damage(store: Any, position: int, size: int = 1) -> None:
    """Flip ``size`` bytes at ``position`` (in the first segment) in its file, as a bad
    disk write would (the store's mapping sees the file's pages)."""
    with open(store.paths.commitlog / f"{0:020d}", "r+b") as file:
        file.seek(position)
        damaged = bytes(byte ^ 0xFF for byte in file.read(size))
        file.seek(position)
        file.write(damaged)


def _sent_to(io: HeldIo, name: str) -> list[tuple[str, int]]:
    return [(type(message).__name__, len(message.payload)) for message in io.sent
            if message.dst == name]


def _reads_of(store: Any) -> list[int]:
    """The positions the store's read_for_send is asked for from now on."""
    asked: list[int] = []
    real = store.read_for_send
    store.read_for_send = lambda position, limit: asked.append(position) or real(position,
                                                                                  limit)
    return asked


def _leader_of_records(tmp_path, impl, count: int) -> tuple[Any, RaftCore, Driver, HeldIo,
                                                               list[int]]:
    """n1 leading with ``count`` records of 200 bytes stored, none sent yet; their
    positions."""
    store, core, driver, io = _replica(tmp_path, impl, "n1")
    _elect(driver, io)
    driver.run()
    io.complete_flushes()
    positions = [driver.write("t", [bytes([index]) * 200]).position for index in range(count)]
    return store, core, driver, io, positions


def _raft_ticks(driver: Driver, io: HeldIo, ticks: int, acks: Any = None) -> None:
    """Tick and run n1 ``ticks`` times; ``acks(message)``: n1 steps its answer, if any."""
    for _ in range(ticks):
        sent = len(io.sent)
        driver.tick()
        driver.run()
        io.complete_flushes()
        for message in io.sent[sent:]:
            answer = acks(message) if acks is not None else None
            if answer is not None:
                driver.step(answer)
    assert io.failures == [] and driver.failure is None


@pytest.mark.parametrize("header", [False, True])
def test_a_raft_leader_with_a_damaged_record_still_leads_its_group(tmp_path, impl, header):
    """A committed record of the leader's log fails its CRC where n2 needs it. Before,
    ready() raised CorruptRecord on every other run, and those runs sent nothing, not even
    n3's heartbeats. Now n3 hears its leader as ever; n2, probed, gets its probe without
    records at each heartbeat (it hears its leader too); the log is read again only every
    retransmit_ticks; the operator hears of the damage once; no one is asked to lead.
    ``header``: the record's size is garbled, and n1's first read is from it: no record
    starts there, says the store, but the records before reach it (is_record_start)."""
    store, core, driver, io, positions = _leader_of_records(tmp_path, impl, 10)
    try:
        end = store.written_position
        driver.propose(("client", 1), end)
        driver.run()
        io.complete_flushes()
        driver.step(EntriesReply("n3", "n1", core.term, True, end, -1, -1))
        driver.run()
        assert store.committed_position == end
        damaged = positions[3]
        _damage(store, damaged + (0 if header else 100), 4 if header else 1)
        # n2's log ends where the damaged record starts (its hint): n1 probes it there
        driver.step(EntriesReply("n2", "n1", core.term, False, 0, damaged, core.term))
        io.sent.clear()
        reads = _reads_of(store)
        ticks = 4 * RAFT["retransmit_ticks"]
        _raft_ticks(driver, io, ticks)
        beats = ticks // RAFT["heartbeat_ticks"]
        assert _sent_to(io, "n2") == [("Entries", 0)] * (beats + 1)  # (+ the first probe)
        assert _sent_to(io, "n3") == [("Entries", 0)] * beats
        assert 4 <= len(reads) <= 5 and set(reads) == {damaged}, reads
        damage = [note for note in io.notes if "cannot send n2" in note]
        assert len(damage) == 1 and "mqlog repair" in damage[0], io.notes
        assert not [note for note in io.notes if "hands leadership" in note]
    finally:
        store.close()


def _acks_of(name: str, term: int) -> Any:
    """A follower ``name`` that appends and acks every Entries sent to it."""
    def ack(message: Any) -> Any:
        if message.dst == name and isinstance(message, Entries):
            return EntriesReply(name, "n1", term, True,
                                message.prev_position + len(message.payload), -1, -1)
        return None
    return ack


def test_a_follower_gets_every_record_before_a_damaged_one(tmp_path, impl):
    """The records before the damaged one are sent, though a read window holds both (a
    hostile review: n2 stayed up to ~100 KB short of the damage, and the event named a
    position it had not reached)."""
    store, core, driver, io, positions = _leader_of_records(tmp_path, impl, 10)
    try:
        damaged = positions[6]
        _damage(store, damaged + 100)
        _raft_ticks(driver, io, 4 * RAFT["retransmit_ticks"], _acks_of("n2", core.term))
        assert core.peers["n2"].match == damaged
        (event,) = [note for note in io.notes if "cannot send n2" in note]
        assert f"from {damaged}:" in event and f"position {damaged}:" in event, event
    finally:
        store.close()


def test_a_follower_gets_every_record_before_one_whose_header_is_damaged(tmp_path, impl):
    """The damaged record's size is zeroed: a read from it is refused as no record
    (InvalidPosition), which PeerReads knows to be that damage, met by the read before;
    nothing escapes ready(), and n2 gets every record before it (a hostile review: the
    group stalled again, and the read of the records before it failed too)."""
    store, core, driver, io, positions = _leader_of_records(tmp_path, impl, 10)
    try:
        damaged = positions[6]
        with open(store.paths.commitlog / f"{0:020d}", "r+b") as file:
            file.seek(damaged)
            file.write(bytes(4))
        _raft_ticks(driver, io, 4 * RAFT["retransmit_ticks"], _acks_of("n2", core.term))
        assert core.peers["n2"].match == damaged
        (event,) = [note for note in io.notes if "cannot send n2" in note]
        assert f"from {damaged}:" in event, event
    finally:
        store.close()


def test_a_follower_that_stops_acking_before_a_damaged_record_is_reported_once(tmp_path,
                                                                               impl):
    """n2 acks its first Entries only: every retransmit reads the healthy records after
    its ack again, then meets the damage again. The operator hears of it once, not once
    per retransmit (a hostile review counted 15 events in 60 ticks)."""
    store, core, driver, io, positions = _leader_of_records(tmp_path, impl, 10)
    try:
        _damage(store, positions[2] + 100)  # (within n2's in-flight window)
        first: list[int] = []

        def first_ack_only(message: Any) -> Any:
            if message.dst != "n2" or not isinstance(message, Entries) or first:
                return None
            first.append(message.prev_position + len(message.payload))
            return EntriesReply("n2", "n1", core.term, True, first[0], -1, -1)

        _raft_ticks(driver, io, 15 * RAFT["retransmit_ticks"], first_ack_only)
        assert first and len(io.notes) > 1, io.notes
        assert len([note for note in io.notes if "cannot send n2" in note]) == 1, io.notes
    finally:
        store.close()


def test_a_follower_stuck_at_a_damaged_record_does_not_make_its_leader_run_every_tick(
        tmp_path, impl):
    """n2 has every record before the damaged one, n3 all of them (committed): after each
    run n1 has nothing to do until its next heartbeat or retry (has_ready is False), though
    n2's log ends short of n1's. Before, has_ready said yes after every run, and the node
    ran its driver every tick, sending nothing."""
    store, core, driver, io, positions = _leader_of_records(tmp_path, impl, 10)
    try:
        driver.step(EntriesReply("n3", "n1", core.term, True, store.written_position, -1, -1))
        driver.run()
        damaged = positions[6]
        _damage(store, damaged + 100)
        acks = _acks_of("n2", core.term)
        _raft_ticks(driver, io, 2 * RAFT["retransmit_ticks"], acks)
        assert core.peers["n2"].match == damaged and core.peers["n2"].next == damaged
        reads, busy = _reads_of(store), []
        for _ in range(6 * RAFT["retransmit_ticks"]):
            sent = len(io.sent)
            driver.tick()
            driver.run()
            for answer in filter(None, map(acks, io.sent[sent:])):
                driver.step(answer)
                driver.run()
            busy.append(core.has_ready())
        assert core.peers["n2"].match == damaged and core.peers["n2"].next == damaged
        assert not any(busy), busy
        assert 5 <= reads.count(damaged) <= 7, reads  # (still read again when due)
    finally:
        store.close()


def _master_of_records(tmp_path, impl, role: str, slaves: tuple[str, ...], records: int = 10
                       ) -> tuple[Any, Driver, HeldIo, list[int]]:
    """Master m (``role``) of ``slaves`` with ``records`` records of 200 bytes; their
    positions."""
    store = mqlog.open(tmp_path / "m", implementation=impl, clock_ms=lambda: 1_000,
                       **STORE)
    config = ReplicationConfig(node_id="m", role=role, slaves=slaves, retransmit_ticks=4)
    io = HeldIo(store)
    driver = Driver(store, MasterSlaveCore(config, store), io)
    driver.run()
    return store, driver, io, [driver.write("t", [bytes([index]) * 200]).position
                               for index in range(records)]


def test_a_sync_master_does_not_run_every_tick_for_a_slave_stuck_at_damage(tmp_path, impl):
    """The master-slave twin: a SYNC_MASTER pumps at every run, and slave s stops at the
    damaged record: has_ready must not say yes after each run (it did)."""
    store, driver, io, positions = _master_of_records(tmp_path, impl, "SYNC_MASTER", ("s",))
    try:
        _damage(store, positions[3] + 100)
        driver.step(Hello("s", "m", driver.core.epoch, 0, -1))
        busy = []
        for _ in range(12):
            driver.tick()
            driver.run()
            busy.append(driver.core.has_ready())
        sent = [message for message in io.sent if message.dst == "s"]
        assert max(message.position + len(message.payload) for message in sent) == \
            positions[3]
        assert not any(busy), busy
    finally:
        store.close()


def test_a_master_resends_on_its_own_clock_while_a_later_record_waits_for_its_retry(
        tmp_path, impl):
    """The two clocks apart: slave s never acks the records m sent it at tick 0, and the
    record after them, written later, is damaged, so m's first read of it (tick 3) waits
    for its retry at tick 7. The resend of the records before it is due at tick 4
    (retransmit_ticks after the ack last moved), and a node runs its driver only when
    has_ready says so: it must say yes then (it waited for the damage's retry)."""
    store, driver, io, _ = _master_of_records(tmp_path, impl, "SYNC_MASTER", ("s",), 3)
    core = driver.core
    try:
        driver.step(Hello("s", "m", core.epoch, 0, -1))
        driver.run()  # (lost on the way: s never acks it)
        assert [message.position for message in io.sent if message.dst == "s"] == [0]

        def tick_as_a_node_does() -> None:
            driver.tick()
            if core.has_ready():
                driver.run()

        while core.tick_count < 2:
            tick_as_a_node_does()
        damaged = driver.write("t", [b"d" * 200]).position
        _damage(store, damaged + 100)
        io.sent.clear()
        resent_at = None
        while resent_at is None and core.tick_count < 10:
            tick_as_a_node_does()
            if any(message.dst == "s" and message.position == 0 for message in io.sent):
                resent_at = core.tick_count
        assert resent_at == core.config.retransmit_ticks, resent_at
        assert all(message.position < damaged for message in io.sent if message.dst == "s")
    finally:
        store.close()


@pytest.mark.parametrize("majority_has_it", [False, True])
def test_a_raft_leader_whose_uncommitted_record_is_damaged_hands_leadership_over(
        tmp_path, impl, majority_has_it):
    """The damaged record is not committed, and no follower has it: it can never commit
    from here, nor can any write after it; the most up-to-date follower (n3) is told to
    campaign (TimeoutNow), so that a leader without it takes over (a hostile review: every
    write timed out, for good). If n3 has it already, n3 and n1 commit it: no hand-over."""
    store, core, driver, io, positions = _leader_of_records(tmp_path, impl, 10)
    try:
        acked = {"n2": positions[2], "n3": positions[8 if majority_has_it else 4]}
        for name, match in acked.items():
            driver.step(EntriesReply(name, "n1", core.term, True, match, -1, -1))
        _damage(store, positions[6] + 100)
        io.sent.clear()
        _raft_ticks(driver, io, 2 * RAFT["retransmit_ticks"])
        handed = [message.dst for message in io.sent if type(message).__name__ == "TimeoutNow"]
        if majority_has_it:
            assert handed == [] and core.commit >= positions[6], (handed, core.commit)
        else:
            assert handed == ["n3"] and core.commit < positions[6], handed  # (once:
            # one target per election timeout, though both followers' reads fail)
            print(f"n1 handed leadership to n3: {len(handed)} TimeoutNow; commit "
                  f"{core.commit}, damage at {positions[6]}")
    finally:
        store.close()


def test_a_master_with_a_damaged_record_still_serves_its_other_slaves(tmp_path, impl):
    """The master-slave twin: slave s needs the damaged record, slave t does not; t gets
    the new records, s those before the damaged one; the log is read there for s every
    retransmit_ticks, and the operator hears once (ready() raised before)."""
    store, driver, io, positions = _master_of_records(tmp_path, impl, "ASYNC_MASTER",
                                                      ("s", "t"))
    try:
        old_end, damaged = store.written_position, positions[3]
        _damage(store, damaged + 100)
        epoch = driver.core.epoch
        driver.step(Hello("s", "m", epoch, 0, -1))  # s starts from nothing
        driver.step(Hello("t", "m", epoch, old_end, epoch))  # t has it all
        reads = _reads_of(store)
        for round_ in range(12):
            driver.write("t", [bytes([round_]) * 200])
            driver.tick()
            driver.run()
        assert io.failures == [] and driver.failure is None
        to_s = [message for message in io.sent if message.dst == "s"]
        assert to_s and to_s[0].position == 0
        assert max(message.position + len(message.payload) for message in to_s) == damaged
        appends = [message for message in io.sent if message.dst == "t"]
        assert appends and appends[0].position == old_end
        assert max(message.position + len(message.payload) for message in appends) == \
            store.written_position  # (some twice: t never acks, so they are resent)
        assert len([note for note in io.notes if "cannot send s" in note]) == 1, io.notes
        assert reads.count(damaged) == 3, reads  # (ticks 0, 4 and 8 of 12)
    finally:
        store.close()


def test_a_raft_leader_being_removed_does_not_count_its_damaged_copy(tmp_path, impl):
    """n1 changed the voters to n2 and n3 and leads until that commits. Its copy of record
    D is damaged, n2 has D, n3 does not: D needs n3, so n1 tells n2 to campaign. It
    counted itself among D's holders before (a hostile review: writes stalled for good)."""
    store, core, driver, io, _ = _leader_of_records(tmp_path, impl, 3)
    try:
        store.flush()
        driver.step(EntriesReply("n2", "n1", core.term, True, store.written_position, -1, -1))
        driver.run()
        assert core.commit == store.written_position
        damaged = driver.write("t", [b"d" * 200]).position  # (not flushed: n1's copy
        # does not count, so n2's ack does not commit it)
        driver.step(EntriesReply("n2", "n1", core.term, True, store.written_position, -1, -1))
        # (n3 answers too, without D: a change to voters of whom half are silent is
        # refused, the strict reconfig check)
        driver.step(EntriesReply("n3", "n1", core.term, True, damaged, -1, -1))
        driver.change_membership(("operator", 1), ("n2", "n3"), (), {})
        assert core.voters == ("n2", "n3") and core.commit <= damaged
        _damage(store, damaged + 100)
        io.sent.clear()
        _raft_ticks(driver, io, 4 * RAFT["retransmit_ticks"], _acks_of("n3", core.term))
        handed = [message.dst for message in io.sent if type(message).__name__ == "TimeoutNow"]
        assert handed and set(handed) == {"n2"} and core.commit <= damaged, (handed,
                                                                            core.commit)
    finally:
        store.close()


def test_peer_reads_raise_a_position_that_starts_no_record(tmp_path, impl):
    """PeerReads answers GONE only for what retention let go: a position inside a record
    is a caller's bug, raised as itself, never a reset of the peer."""
    store = mqlog.open(tmp_path / "s", implementation=impl, clock_ms=lambda: 1_000, **STORE)
    try:
        stored = [store.put("t", bytes([index]) * 3000) for index in range(60)]
        store.flush()
        store.set_committed_position(store.written_position)
        reads, events = PeerReads(store, "n1", 4), []
        with pytest.raises(InvalidPosition):
            reads.read("n2", stored[0].position + 8, 1000, 0, events)
        store.trim_front(store.committed_position)
        assert store.first_segment_base() > stored[1].position
        assert reads.read("n2", stored[1].position, 1000, 0, events) is Unsendable.GONE
        assert events == []
    finally:
        store.close()


def test_peer_reads_forget_what_they_learned_of_the_log_when_cleared(tmp_path, impl):
    """A record whose header is damaged is remembered as a record start (a later read from
    it raises InvalidPosition); once the tail is cut and written anew (a follower's, before
    it leads again), that position may lie inside a record: after clear() a read from it
    is a caller's bug again, not DAMAGED, and its wait is over."""
    store = mqlog.open(tmp_path / "s", implementation=impl, clock_ms=lambda: 1_000, **STORE)
    try:
        positions = [store.put("t", bytes([index]) * 200).position for index in range(10)]
        with open(store.paths.commitlog / f"{0:020d}", "r+b") as file:
            file.seek(positions[6])
            file.write(bytes(4))  # (its size zeroed)
        reads, events = PeerReads(store, "n1", 4), []
        assert reads.read("n2", positions[6], 1000, 0, events) is Unsendable.DAMAGED
        assert reads.waiting("n2", positions[6], 3) and not reads.waiting("n2", positions[6], 4)
        store.truncate(positions[5])
        store.put("t", bytes(500))  # (positions[6] is inside this record now)
        assert reads.read("n2", positions[6], 1000, 9, events) is Unsendable.DAMAGED  # stale
        reads.clear()
        assert not reads.waiting("n2", positions[6], 9)
        with pytest.raises(InvalidPosition):
            reads.read("n2", positions[6], 1000, 9, events)
    finally:
        store.close()


def test_peer_reads_walk_to_a_position_inside_a_record_once(tmp_path, impl):
    """A peer that asks again and again for a position inside a record (its bug) costs
    one walk of the segment's headers (is_record_start, with the GIL held), not one per
    read; a position past the log's end is asked again (the log may reach it), and
    clear() (this node leads anew) forgets what was learned."""
    store = mqlog.open(tmp_path / "s", implementation=impl, clock_ms=lambda: 1_000, **STORE)
    try:
        positions = [store.put("t", bytes([index]) * 200).position for index in range(10)]
        walks: list[int] = []
        real = store.is_record_start
        store.is_record_start = lambda position: walks.append(position) or real(position)
        reads, events = PeerReads(store, "n1", 4), []
        inside, past = positions[3] + 50, store.written_position + 50
        for tick in range(3):
            for position in (inside, past):
                with pytest.raises(InvalidPosition):
                    reads.read("n2", position, 1000, tick, events)
        assert walks == [inside, past, past, past], walks
        reads.clear()
        with pytest.raises(InvalidPosition):
            reads.read("n2", inside, 1000, 3, events)
        assert walks[-1] == inside and len(walks) == 5, walks
        assert events == []  # (a caller's bug is raised, not reported as damage)
    finally:
        store.close()


def _payload(tmp_path, impl, name: str, epoch: int, count: int) -> bytes:
    """The raw records a leader of ``epoch`` would send: ``count`` puts from position 0."""
    store = mqlog.open(tmp_path / name, implementation=impl, clock_ms=lambda: 1_000, **STORE)
    try:
        store.set_epoch(epoch)
        for index in range(count):
            store.put("t", bytes([index]) * 100)
        return store.read_raw(0, store.written_position)
    finally:
        store.close()


@pytest.mark.parametrize("test_break", ["", "merge_acks"])
def test_acks_to_two_leaders_in_one_ready_never_merge(tmp_path, impl, test_break):
    """Finding 3, as a driver meets it: a follower steps an old leader's Entries (more
    records) and a new leader's heartbeat (its log ends sooner) before one Ready. The ack
    to the new leader must speak of the new leader's log only; the "merge_acks" switch
    (a core that merges every ack) must fail this check."""
    old = _payload(tmp_path, impl, "old", 1, 3)
    first = len(old) // 3  # three equal records: the first ends here
    store, core, driver, io = _replica(tmp_path, impl, "n2")
    core = RaftCore(core.config, store, rng=random.Random(2), test_break=test_break)
    driver = Driver(store, core, io)
    try:
        driver.step(Entries("n1", "n2", 1, 0, -1, 1, 0, b"", old[:first]))
        driver.run()
        io.complete_flushes()
        io.sent.clear()
        driver.step(Entries("n1", "n2", 1, first, 1, 1, 0, b"", old[first:]))
        driver.step(Entries("n3", "n2", 2, first, 1, -1, 0, b"", b""))  # a heartbeat
        driver.run()
        io.complete_flushes()
        to_new = [message.match for message in io.sent
                  if isinstance(message, EntriesReply) and message.dst == "n3"]
        merged = to_new != [first]
        assert merged == (test_break == "merge_acks"), (to_new, first, len(old))
        if merged:
            print(f"--break merge_acks caught: the ack to n3 said {to_new}, its log "
                  f"ends at {first}")
    finally:
        store.close()


def _master(store: Any, io: HeldIo) -> Driver:
    """A master-slave master's driver over ``store``, its first Ready carried out."""
    from mqlog.replication.master_slave import MasterSlaveCore

    core = MasterSlaveCore(ReplicationConfig(node_id="m", role="ASYNC_MASTER"), store)
    driver = Driver(store, core, io)
    driver.run()
    return driver


def test_a_master_whose_store_has_its_epoch_takes_writes_from_the_start(tmp_path, impl):
    """A master-slave master started over a store already in its epoch has nothing to
    start: it takes writes after its first Ready, empty (a node runs one before it
    listens, so a fresh node's first produce is taken)."""
    store = mqlog.open(tmp_path / "m", implementation=impl, **dict(STORE, committed_follows="auto"))
    try:
        driver = _master(store, HeldIo(store))
        driver.check_writable()
        assert driver.serving
    finally:
        store.close()


@pytest.mark.parametrize("test_break", ["", "partial_early"])
def test_a_write_stored_in_part_is_refused_only_after_the_verdict(tmp_path, impl, test_break):
    """The PartiallyStored rule, in the driver for every layer (propose_write): a retry of
    three records finds a copy of one (cut inside the request) and is answered
    PartiallyStored, naming that one, only once a majority has it — a Raft leader's
    uncommitted records may still be lost with it. ``partial_early`` answers at once."""
    store, core, driver, io = _replica(tmp_path, impl, "n1")
    driver = Driver(store, core, io, test_break=test_break)
    try:
        _elect(driver, io)
        driver.run()  # (the term starts)
        driver.write("t", [b"first"], producer=("p", 7, 0))  # (the copy cut inside it)
        found = driver.write("t", [b"first", b"second", b"third"], producer=("p", 7, 0))
        assert (found.count, store.written_position) == (1, found.end)  # (stored once)
        driver.propose_write("retry", found, 3, ("p", 7, 0))
        driver.run()
        io.complete_flushes()
        driver.run()
        if test_break:  # (answered before any follower has the record: caught here)
            assert [type(answer) for _, answer in io.answers] == [PartiallyStored]
            return
        assert io.answers == [], "answered before the verdict"
        driver.step(EntriesReply("n2", "n1", core.term, True, store.written_position, 0, 0))
        driver.run()
        [(request, answer)] = io.answers
        assert request == "retry" and isinstance(answer, PartiallyStored)
        assert answer.count == 1 and "1 of its 3 records" in str(answer)
        assert store.committed_position >= found.end
    finally:
        store.close()


def test_a_copy_cut_in_an_older_epoch_waits_for_a_record_of_this_one(tmp_path, impl):
    """A master-slave master (an ISR leader likewise) whose epoch holds no record yet
    finds a retry's copy cut inside the request, stored in an older epoch: the rest of
    the request may sit on the replica that led then, and be committed if it leads again
    (raft seed 7400001690 showed it for Raft). The driver appends an empty control record
    of this epoch after the copy, as a Raft leader's no-op, and answers PartiallyStored
    only once that is committed."""
    store = mqlog.open(tmp_path / "m", implementation=impl, **dict(STORE, committed_follows="auto"))
    try:
        io = HeldIo(store)
        _master(store, io).write("t", [b"first"], producer=("p", 7, 0))  # (an older epoch's)
        store.set_epoch(store.epoch + 1)
        driver = _master(store, io)
        found = driver.write("t", [b"first", b"second", b"third"], producer=("p", 7, 0))
        assert found.count == 1 and store.written_position == found.end  # (stored once)
        driver.propose_write("retry", found, 3, ("p", 7, 0))
        assert store.epoch_starts()[-1] == (store.epoch, found.end)  # the no-op
        assert store.written_position > found.end
        for _ in range(3):
            driver.run()
            io.complete_flushes()
        [(request, answer)] = io.answers
        assert request == "retry" and isinstance(answer, PartiallyStored) and answer.count == 1
        assert store.committed_position > found.end
    finally:
        store.close()


def test_a_write_stored_in_part_whose_verdict_is_unknown_is_answered_so(tmp_path, impl):
    """A leader that steps down (here: its core replaced) before the verdict answers the
    write stored in part as any other whose fate is unknown, not PartiallyStored."""
    store, core, driver, io = _replica(tmp_path, impl, "n1")
    try:
        _elect(driver, io)
        driver.run()
        driver.write("t", [b"first"], producer=("p", 7, 0))
        found = driver.write("t", [b"first", b"second"], producer=("p", 7, 0))
        driver.propose_write("retry", found, 2, ("p", 7, 0))
        driver.abandon_waiting()
        assert io.answers == [("retry", PutStatus.FLUSH_SLAVE_TIMEOUT)]
        assert driver.cuts == {}
    finally:
        store.close()


def test_a_write_abandoned_by_a_stepping_down_master_is_answered_once(tmp_path):
    """A hostile review: an operator's ``follow`` (node.py) makes the core step down,
    which resolves its waiting proposals in its Ready, and the driver's
    abandon_waiting answered them too: each was answered twice (node.py's futures hid
    it; any other Io saw both)."""
    from mqlog.replication.master_slave import MasterSlaveCore
    from mqlog.replication.messages import Hello

    store = mqlog.open(tmp_path / "m", **dict(STORE, committed_follows="auto"))
    try:
        core = MasterSlaveCore(ReplicationConfig(node_id="m", role="SYNC_MASTER",
                                                 slaves=("s1",), in_sync_slaves_min=1), store)
        io = HeldIo(store)
        driver = Driver(store, core, io)
        driver.run()
        io.complete_flushes()
        driver.run()
        driver.check_writable()
        last = store.epoch_at(store.written_position)
        driver.step(Hello("s1", "m", core.epoch, store.written_position,
                          -1 if last is None else last))
        driver.run()
        assert core.in_sync_slaves() == ("s1",), core.in_sync_slaves()
        stored = driver.write("t", [b"x"])
        driver.propose("w1", stored.end)
        driver.run()
        assert io.answers == [] and len(core._waiting) == 1
        core.follow("s1")  # (what node.py's follow does)
        driver.abandon_waiting()
        driver.run()
        assert io.answers == [("w1", PutStatus.FLUSH_SLAVE_TIMEOUT)], io.answers
    finally:
        store.close()
