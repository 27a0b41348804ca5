"""The Raft core, driven by datadriven scripts (tests/data/raft/*.txt) over real stores:
each node is an mqlog.Store in a temporary directory and a RaftCore with its own seeded
RNG; a test network holds the messages between them (each one through the real wire
codec) until a script delivers or drops them.

Each node runs the one driver (mqlog/replication/driver.py) that nodes and the simulator
run, over an Io that queues messages on the test network, "syncs" the hard state the
moment it is saved and flushes the store at once when asked; what a ``process`` prints
is the driver's own description of what it did. Stores have no background threads, so
a store is durable exactly up to where a Ready last asked to sync it — and ``crash``
cuts it back to that, as a power loss would.

Commands (nodes are named; ``[...]`` is optional):

    add n1 n2 n3 [learners=n4] [pre_vote=true] [check_quorum=true] [ack=flushed]
    add n4 voters=n1,n2,n3 learners=n4   a node joining a running group: its bootstrap
                           config lists the voters and itself as a learner
    campaign n1            tick n1 until its election timer fires; print the ticks
    tick [n1 ...] [n=K]    tick the nodes (every running node if none is named)
    put n1 [count=K] [size=B]  store records on n1 and propose them, as a node does
                           (more than 10: the first and the last are printed)
    process [n1 ...]       carry out each node's Ready and print what it did
    deliver [to ...] [from=a,b] [kind=entries,...]  deliver the queued messages (those
                           across a partition or to a node that is down are lost)
    drop [to ...] [from=a,b] [kind=...]  lose them
    stabilize              process and deliver until nothing happens
    run [n1 ...] n=K       K times: tick, stabilize; print only the changes of state
    crash n1 / restart n1  lose what was not synced, close; reopen with the hard state
    partition n1 [n2 ...]  cut the named nodes off from the others; heal
    transfer n1 n2         n1 hands leadership to n2
    membership n1 voters=a,b,c [learners=d]  change the group's configuration through
                           leader n1 as a node does: check it, store its control record,
                           use it, propose its end (printed: the record and the proposal)
    status [n1 ...]        role, term, vote, leader, commit, written, durable (+ progress)
    members [n1 ...]       each node's configuration now: voters, learners, and where in
                           its log that configuration's record is (or "bootstrap")
    log [n1 ...]           every record: position, epoch (e), "/noop" for a leader's no-op,
                           "/membership" for a membership change
    compare n1 n2 ...      byte-identical logs (from the latest log start among them),
                           or where they first differ
    retain n1 [n2 ...]     retention: every segment wholly below the commit and the flush
                           goes; print where the log starts now
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

import mqlog
from mqlog.config import ReplicationConfig
from mqlog.ext.fallback import ATTR_CONTROL, BLANK_MAGIC, HEADER
from mqlog.replication import messages as wire_messages
from mqlog.replication.core import Ready
from mqlog.replication.driver import Driver, describe_hard_state, describe_message
from mqlog.replication.messages import (
    EntriesReply,
    LogReset,
    Message,
    Vote,
)
from mqlog.replication.raft import RaftCore
from mqlog.replication.raft.core import LEADER
from mqlog.replication.wire import Frame, FrameDecoder
from tests import datadriven, scripted
from tests.conftest import SMALL

SCRIPTS = sorted((Path(__file__).parent / "data" / "raft").glob("*.txt"))
TICK_SETTINGS = dict(election_timeout_ticks=10, heartbeat_ticks=2, retransmit_ticks=4,
                     sync_timeout_ticks=20, append_bytes_max=600, inflight_bytes_max=1200,
                     frame_size_bytes_max=8192)
# Retention runs only when a script says ``retain`` (and then lets go of every segment it
# may: below the commit and the flush).
STORE_SETTINGS = dict(SMALL, committed_follows="external", flush_interval_ms=3_600_000,
                      retention_ms=-1, retention_bytes=0, background_threads=False,
                      segment_prepare_ahead=False, segment_preallocate=False,
                      retention_check_interval_ms=3_600_000)
MEMBERSHIP_MAGIC = b"MQCFG1"  # a membership change's control record body starts so
_STATE_CHANGES = ("save hard state", "reset log", "truncate", "set epoch", "append no-op",
                  "commit to", "resolved", "event")


class Interaction(scripted.Interaction):
    """The nodes, their stores and the network of one script."""

    def __init__(self, root: Path, impl: str, test_break: str = "") -> None:
        super().__init__(root, impl)
        self.test_break = test_break
        self.cores: dict[str, RaftCore] = {}
        self.hard_states: dict[str, Any] = {}  # saved (synced) by a Ready; None: never
        self.starts: dict[str, int] = {}  # how often each node started (seeds its RNG)
        self.cut: set[str] = set()  # a partition: these nodes on one side, the rest

    # --- nodes -------------------------------------------------------------------------

    def do_add(self, args: list[str], kwargs: dict[str, str]) -> str:
        learners = tuple(_names(kwargs.get("learners", "")))
        voters = tuple(_names(kwargs["voters"])) if "voters" in kwargs else \
            tuple(name for name in args if name not in learners)
        flags = {key: kwargs.get(key, "false") == "true" for key in ("pre_vote", "check_quorum")}
        for name in args:
            self.configs[name] = ReplicationConfig(
                layer="raft", node_id=name, voters=voters, learners=learners,
                follower_ack=kwargs.get("ack", "flushed"),  # type: ignore[arg-type]
                **flags, **TICK_SETTINGS)  # type: ignore[arg-type]
            self.hard_states[name] = None
            self._start(name)
        return self._flush_ready(list(args))

    def _start(self, name: str) -> None:
        self.stores[name] = mqlog.open(self.root / name, implementation=self.impl,
                                       clock_ms=lambda: 1_000, **STORE_SETTINGS)
        self.starts[name] = self.starts.get(name, 0) + 1
        saved = self.hard_states[name]
        self.cores[name] = RaftCore(self.configs[name], self.stores[name],
                                    rng=random.Random(f"{name}/{self.starts[name]}"),
                                    test_break=self.test_break,
                                    **({} if saved is None else {"hard_state": saved}))
        self.drivers[name] = Driver(self.stores[name], self.cores[name],
                                    scripted.ScriptIo(self, name), describe=True)

    def do_crash(self, args: list[str], kwargs: dict[str, str]) -> str:
        """A power loss: what no Ready synced is gone, and so is the core's memory."""
        lines = []
        for name in args:
            durable, written = self._lose_power(name)
            lost = f"lost [{durable}, {written})" if written > durable else "lost nothing"
            lines.append(f"{name}: crashed, {lost}; hard state {_hard(self.hard_states[name])}")
        return "\n".join(lines)

    def do_restart(self, args: list[str], kwargs: dict[str, str]) -> str:
        lines = []
        for name in args:
            self._start(name)
            core = self.cores[name]
            lines.append(f"{name}: restarted with hard state {_hard(self.hard_states[name])}, "
                         f"log ends at {self.stores[name].written_position}: "
                         f"term={core.term} vote={core.vote or '-'}")
            lines += [line for line in [self._flush_ready([name])] if line]
        return "\n".join(lines)

    # --- time and clients ----------------------------------------------------------------

    def do_tick(self, args: list[str], kwargs: dict[str, str]) -> str:
        for _ in range(int(kwargs.get("n", 1))):
            for name in args or self._up():
                self.cores[name].tick()
        return ""

    def do_campaign(self, args: list[str], kwargs: dict[str, str]) -> str:
        """Tick the node until its election timer fires (it sends a Vote), as a follower
        that hears no leader would; the ticks it took come from its seeded RNG."""
        name = args[0]
        core = self.cores[name]
        assert core.role != LEADER, f"{name} leads already"
        before = len(_votes(core.ready()))
        limit = 2 * core.config.election_timeout_ticks + 1
        for ticks in range(1, limit + 1):
            core.tick()
            votes = _votes(core.ready())
            if len(votes) > before:
                vote = votes[-1]
                what = f"pre-vote for term {vote.epoch}" if vote.pre_vote else \
                    f"vote in term {vote.epoch}"
                return f"{name}: election timeout after {ticks} ticks: asks a {what}"
        raise AssertionError(f"{name} did not campaign in {limit} ticks")

    def do_put(self, args: list[str], kwargs: dict[str, str]) -> str:
        name, lines = args[0], []
        driver = self.drivers[name]
        count, first = int(kwargs.get("count", 1)), self.proposals + 1
        for _ in range(count):
            driver.check_writable()  # as a node does before it stores a client's write
            stored = driver.write("t", [b"x" * int(kwargs.get("size", 100))])
            self.proposals += 1
            driver.propose(f"p{self.proposals}", stored.end)
            lines.append(f"p{self.proposals}: stored [{stored.position}, {stored.end})")
        if count > 10:  # in short: the first, the last
            lines = [f"p{first}..p{self.proposals}: stored [{lines[0].split('[')[1][:-1]}"
                     f" ... {lines[-1].split('[')[1]}"]
        return "\n".join(lines)

    def do_transfer(self, args: list[str], kwargs: dict[str, str]) -> str:
        self.cores[args[0]].transfer_leadership(args[1])
        return ""

    def do_membership(self, args: list[str], kwargs: dict[str, str]) -> str:
        """An operator's change of configuration, carried out by the driver as on a node:
        the leader checks it, the driver appends its control record and tells the core
        where it is, then proposes its end (resolved once the change commits)."""
        name = args[0]
        store = self.stores[name]
        end, size = self.drivers[name].change_membership(
            f"p{self.proposals + 1}", tuple(_names(kwargs["voters"])),
            tuple(_names(kwargs.get("learners", ""))), {})
        self.proposals += 1
        # The record's start as the store has it (a blank may pad the segment before it).
        start = next(position for position, size, *_ in _records(store)
                     if position + size == end)
        assert start == end - size, (start, end, size)
        return f"p{self.proposals}: stored membership [{start}, {end})"

    # --- the network -------------------------------------------------------------------

    def _selected(self, args: list[str], kwargs: dict[str, str]) -> list[Message]:
        sources, kinds = _names(kwargs.get("from", "")), _names(kwargs.get("kind", ""))
        return [message for message in self.network
                if (not args or message.dst in args) and
                (not sources or message.src in sources) and
                (not kinds or message.kind in kinds)]

    def do_deliver(self, args: list[str], kwargs: dict[str, str]) -> str:
        """Deliver queued messages through the wire codec, in the order they were sent."""
        wanted = self._selected(args, kwargs)
        self.network = [message for message in self.network if message not in wanted]
        lines = []
        for message in wanted:
            if message.dst not in self.cores:
                lines.append(f"dropped {describe_message(message)} ({message.dst} is down)")
            elif (message.src in self.cut) != (message.dst in self.cut):
                lines.append(f"dropped {describe_message(message)} (partitioned)")
            else:
                lines.append(describe_message(message))
                config = self.configs[message.dst]
                self.cores[message.dst].step(_through_the_wire(message, config))
        return "\n".join(lines)

    def do_drop(self, args: list[str], kwargs: dict[str, str]) -> str:
        dropped = self._selected(args, kwargs)
        self.network = [message for message in self.network if message not in dropped]
        return "\n".join(f"dropped {describe_message(message)}" for message in dropped)

    def do_run(self, args: list[str], kwargs: dict[str, str]) -> str:
        """K rounds of: tick the nodes (every running node if none is named), then
        stabilize. Only what changes state is printed (hard state, truncations, no-ops,
        commits, resolved proposals, events), after the round's number."""
        lines = []
        for round_number in range(1, int(kwargs.get("n", 1)) + 1):
            self.do_tick(args, {})
            for line in self.do_stabilize([], {}).splitlines():
                _name, _, what = line.partition(": ")
                if what.startswith(_STATE_CHANGES):
                    lines.append(f"tick {round_number}: {line}")
        return "\n".join(lines)

    def do_partition(self, args: list[str], kwargs: dict[str, str]) -> str:
        self.cut = set(args)
        return ""

    def do_heal(self, args: list[str], kwargs: dict[str, str]) -> str:
        self.cut = set()
        return ""

    # --- looking -------------------------------------------------------------------------

    def do_status(self, args: list[str], kwargs: dict[str, str]) -> str:
        lines = []
        for name in args or sorted(self.configs):
            if name not in self.cores:
                lines.append(f"{name}: down")
                continue
            core, store = self.cores[name], self.stores[name]
            lines.append(f"{name}: {core.role} term={core.term} vote={core.vote or '-'} "
                         f"leader={core.leader or '-'} commit={core.commit} "
                         f"written={store.written_position} durable={store.flushed_position}")
            for peer, progress in sorted(core.peers.items()):
                state = " probing" if progress.probing else ""
                lines.append(f"  {peer}: match={progress.match} next={progress.next}{state}")
        return "\n".join(lines)

    def do_members(self, args: list[str], kwargs: dict[str, str]) -> str:
        lines = []
        for name in args or sorted(self.configs):
            if name not in self.cores:
                lines.append(f"{name}: down")
                continue
            core = self.cores[name]
            position = core.membership.position
            lines.append(f"{name}: voters={','.join(core.voters)} "
                         f"learners={','.join(core.learners) or '-'} "
                         + ("(bootstrap)" if position < 0 else f"(record at {position})"))
        return "\n".join(lines)

    def do_log(self, args: list[str], kwargs: dict[str, str]) -> str:
        lines = []
        for name in args or self._up():
            store = self.stores[name]
            records = " ".join(f"{position}:e{epoch}{control}"
                               for position, _size, epoch, control in _records(store))
            lines.append(f"{name}: {records or '(empty)'} end={store.written_position} "
                         f"committed={store.committed_position}")
        return "\n".join(lines)

    def do_compare(self, args: list[str], kwargs: dict[str, str]) -> str:
        """Whether the named nodes' logs are byte-identical (from the latest log start
        among them), or where they first differ."""
        first = args[0]
        common = max(self.stores[name].first_segment_base() for name in args)
        reference = _image(self.stores[first], common)
        lines = []
        for name in args[1:]:
            image = _image(self.stores[name], common)
            if image == reference:
                continue
            at = common + next((index for index, (a, b) in enumerate(
                zip(reference, image, strict=False)) if a != b), min(len(reference), len(image)))
            record = max((position for position, *_ in _records(self.stores[first])
                          if position <= at), default=0)
            lines.append(f"{first} and {name} differ from the record at {record} ({first} "
                         f"ends at {common + len(reference)}, {name} at {common + len(image)})")
        return "\n".join(lines) or f"identical: {common + len(reference)} bytes" + (
            f" (from {common})" if common else "")

    def do_retain(self, args: list[str], kwargs: dict[str, str]) -> str:
        lines = []
        for name in args:
            report = self.stores[name].apply_retention()
            lines.append(f"{name}: log starts at {report.log_start}")
        return "\n".join(lines)

    # --- carrying out a Ready ------------------------------------------------------------

    def do_process(self, args: list[str], kwargs: dict[str, str]) -> str:
        return self._flush_ready(args or self._up())

    def _flush_ready(self, names: list[str]) -> str:
        lines = []
        for name in names:
            driver = self.drivers[name]
            driver.run()
            lines += [f"{name}: {line}" for line in driver.described]
        return "\n".join(lines)


def _names(text: str) -> list[str]:
    return [name for name in text.split(",") if name]


def _hard(state: Any) -> str:
    return "term=0 vote=-" if state is None else describe_hard_state(state)


def _votes(ready: Ready) -> list[Vote]:
    return [message for message in ready.messages + ready.messages_after_persist
            if isinstance(message, Vote)]


def _through_the_wire(message: Message, config: ReplicationConfig) -> Message:
    data = wire_messages.encode(message)
    assert len(data) <= config.frame_size_bytes_max, f"{len(data)}-byte frame"
    decoder = FrameDecoder(config.frame_size_bytes_max)
    decoder.feed(data)
    frame = decoder.next_frame()
    assert isinstance(frame, Frame) and decoder.buffered_size == 0
    decoded = wire_messages.decode(frame)
    assert decoded == message
    return decoded


def _image(store: mqlog.Store, start: int | None = None) -> bytes:
    """The log's bytes from ``start`` (its log start if None) to its end."""
    position = store.first_segment_base() if start is None else start
    chunks, end, begin = [], store.written_position, position
    while position < end:
        data = store.read_raw(position, end - position)
        assert data, f"nothing to read at {position}"
        chunks.append(data)
        position += len(data)
    return b"".join(chunks)[:max(0, end - begin)]


def _records(store: mqlog.Store) -> list[tuple[int, int, int, str]]:
    """(position, size, epoch, kind) of every record in the log; kind is "" for a record,
    "/noop" for an empty control record (a leader's no-op), "/membership" for a membership
    change's, "/control" for another."""
    start = store.first_segment_base()
    data, at, records = _image(store, start), 0, []
    while at < len(data):
        size, magic = int.from_bytes(data[at:at + 4], "little"), \
            int.from_bytes(data[at + 4:at + 8], "little")
        if magic != BLANK_MAGIC:
            fields = HEADER.unpack_from(data, at)
            assert fields[9] == start + at, f"record at {start + at} says {fields[9]}"
            kind = "" if not fields[3] & ATTR_CONTROL else "/noop" if not fields[6] else \
                "/membership" if MEMBERSHIP_MAGIC in data[at:at + size] else "/control"
            records.append((start + at, size, fields[7], kind))
        at += size
    return records


@pytest.mark.parametrize("script", SCRIPTS, ids=[path.stem for path in SCRIPTS])
def test_raft_script(script, tmp_path, impl):
    scripted.run_script(script, Interaction(tmp_path, impl))


FIGURE8 = Path(__file__).parent / "data" / "raft" / "figure8.txt"
FIGURE8_KEY = "# Here the commit must stay put"


def test_figure8_catches_a_core_that_commits_old_terms(tmp_path, impl):
    """With §5.4.2's rule broken (a leader commits whatever a majority holds), figure8.txt
    must fail, and first at its key step: n1, leading term 3, commits X (term 1) at 245
    as soon as a majority holds it."""
    text = FIGURE8.read_text()
    marker = next(number for number, line in enumerate(text.splitlines())
                  if line.startswith(FIGURE8_KEY))
    cases = datadriven.parse(text)
    key = next(index for index, case in enumerate(cases) if case.line_number > marker)
    assert (cases[key].command, cases[key].args) == ("process", ["n1"])
    outputs = scripted.outputs(cases[:key + 1],
                               Interaction(tmp_path, impl, test_break="commit_old_term"))
    assert outputs[:key] == [case.expected for case in cases[:key]]
    assert "commit to" not in cases[key].expected
    assert "n1: commit to 245" in outputs[key].splitlines(), outputs[key]


def test_a_reset_to_before_a_followers_own_log_start_is_answered_with_that_start(
        tmp_path, impl):
    """A follower whose own retention went further than its leader's cannot compare logs
    below its start: it must not drop the committed records it holds, but answer with
    where its log starts (and that record's epoch), so the leader compares there."""
    interaction = Interaction(tmp_path, impl)
    try:
        steps = "add n1 n2 n3; campaign n1; run n=3" + "; put n1 count=20 size=3000; run n=2" * 3
        for step in (steps + "; retain n2").split("; "):
            case = datadriven.parse(f"{step}\n----\n")[0]
            interaction.handle(case.command, case.args, case.kwargs)
        follower, store = interaction.cores["n2"], interaction.stores["n2"]
        own_start, end = store.first_segment_base(), store.written_position
        assert own_start > 0
        follower.step(LogReset("n1", "n2", follower.term, own_start // 2, 1, 0,
                               follower.commit))
        ready = follower.ready()
        assert ready.reset_log is None and not ready.appends
        assert ready.messages == [EntriesReply("n2", "n1", follower.term, False, 0, own_start,
                                               store.epoch_at(own_start))]
        follower.advance(ready)
        assert (store.first_segment_base(), store.written_position) == (own_start, end)
    finally:
        interaction.close()
