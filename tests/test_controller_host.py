"""A broker's way to the controllers (controller/host.py's BrokerAgent and SocketIo, and
local_controller.ask) when one of them does not answer.

A paused controller (SIGSTOP) still accepts connections and never answers, so every call
to it costs a whole call timeout. The agent asks each controller at most once per
request, a NotLeader's hint next, and one that left a call unanswered last (and not again
in that round); its calls wait a share of the session (``call_timeout_s``). So with the
controller leader paused, a broker's heartbeat reaches the new leader well within the
session the new leader gives it: checked on a virtual clock (the call order), and over
real sockets through ``join_cluster`` (the timeout), with fake controllers that answer
from a script and a paused one that reads requests and never answers. Also: a committed
record the fold refuses (a topic named "." from before that rule) is skipped by the
agent as by the controllers, and ``local_controller.ask`` asks a follower's hint next."""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import random
import socketserver
import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from mqlog import errors
from mqlog.client import Client
from mqlog.config import StoreConfig
from mqlog.replication import hardstate, local_controller
from mqlog.replication.controller import host, records
from mqlog.replication.controller.config import ControllerConfig
from mqlog.replication.local import wait_until
from mqlog.replication.wire import Frame, FrameDecoder, encode_frame
from tests import inprocess
from tests.processes import change_metadata, wait_live_brokers
from tests.test_controller_sim import Host  # (records what it hosts: no real group)

SESSION_MS, HEARTBEAT_MS = 9_000, 1_800  # the review's settings (a default-like session)
WAIT_S = 30.0  # for a fake cluster to get where a test starts from (never reached if well)
POLL_S = 0.05  # a FakeController's serve_forever checks for shutdown this often


def _addresses(count: int) -> dict[str, str]:
    return {f"c{index}": f"10.0.0.{index}:7000" for index in range(1, count + 1)}


def _config(voters: dict[str, str], **settings: int) -> ControllerConfig:
    return ControllerConfig(voters=voters, **{"broker_session_timeout_ms": SESSION_MS,
                                              "broker_heartbeat_interval_ms": HEARTBEAT_MS,
                                              **settings}).validate()


ANSWERS: dict[str, dict[str, Any]] = {
    "register_broker": {"broker_epoch": 1}, "broker_heartbeat": {"fenced": False},
    "metadata_since": {"records": [], "position": 0}}


# --- the call order, on a virtual clock --------------------------------------------------


class ClockIo:
    """An AgentIo on a virtual clock (ms): ``script(now, name, header)`` gives (delay,
    answer, error) for each request; answers and timers run when ``run_until`` reaches
    their time. ``asked``: (round, controller, kind, time) of each request, in order."""

    def __init__(self, voters: dict[str, str], script: Any) -> None:
        self.names = {address: name for name, address in voters.items()}
        self.script, self.now, self.agent = script, 0, None
        self.asked: list[tuple[int, str, str, int]] = []
        self.notes: list[str] = []
        self._queue: list[tuple[int, int, Any]] = []
        self._seq = 0

    def request(self, address: str, header: dict[str, Any], done: Any) -> None:
        name = self.names[address]
        self.asked.append((self.agent.rounds, name, header["kind"], self.now))
        delay, answer, error = self.script(self.now, name, header)
        self._at(self.now + delay, lambda: done(answer, error))

    def call_later(self, delay_ms: int, callback: Any) -> None:
        self._at(self.now + delay_ms, callback)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def _at(self, when: int, callback: Any) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (when, self._seq, callback))

    def run_until(self, end: int) -> None:
        while self._queue and self._queue[0][0] <= end:
            self.now, _, callback = heapq.heappop(self._queue)
            callback()


def _run(voters: dict[str, str], script: Any, seed: int, end_ms: int) -> ClockIo:
    io = ClockIo(voters, script)
    agent = host.BrokerAgent(Host(), _config(voters), io, rng=random.Random(seed))
    io.agent = agent
    agent.start()
    io.run_until(end_ms)
    return io


PAUSE_MS, ELECTED_MS = 10_000, 13_000  # c1 (the leader) pauses; c3 is elected
CALL_MS = 1_000  # the modelled call timeout: a paused controller's call fails after it


def _paused_leader(now: int, name: str, header: dict[str, Any]) -> tuple[int, Any, Any]:
    """c1 leads, then pauses (its calls fail after CALL_MS, as a client's timeout); until
    c3 is elected the others name c1 as the leader, then c3."""
    if name == "c1" and now >= PAUSE_MS:
        return CALL_MS, None, errors.NodeUnavailable("lost the connection: timed out")
    leader = "c1" if now < ELECTED_MS else "c3"
    if name != leader and header["kind"] != "metadata_since":  # (any one answers reads)
        return 1, None, errors.NotLeader("not me", leader=leader,
                                         leader_address=_addresses(3)[leader])
    return 1, ANSWERS[header["kind"]], None


@pytest.mark.parametrize("seed", range(8))
def test_a_paused_leader_is_asked_once_a_round_and_last_once_it_went_silent(seed: int):
    io = _run(_addresses(3), _paused_leader, seed, ELECTED_MS + 4 * SESSION_MS)
    asked = Counter((round_, name, kind) for round_, name, kind, _ in io.asked)
    assert max(asked.values()) == 1, [item for item, count in asked.items() if count > 1]
    went_silent = min(round_ for round_, name, _, now in io.asked
                      if name == "c1" and now >= PAUSE_MS)
    by_round: dict[int, list[tuple[str, int]]] = {}
    for round_, name, _, now in io.asked:
        by_round.setdefault(round_, []).append((name, now))
    later = {round_: asks for round_, asks in by_round.items() if round_ > went_silent}
    assert len(later) > 10, "the rounds went on"
    for round_, asks in later.items():  # (each costs a call timeout: once, and last)
        names = [name for name, _ in asks]
        assert names.count("c1") <= 1 and names[0] != "c1", (round_, names)
        if asks[0][1] >= ELECTED_MS:  # (c3 leads: the paused c1 is not waited on at all)
            assert "c1" not in names, (round_, names)


@pytest.mark.parametrize("seed", range(12))
def test_a_not_leader_hint_is_asked_next(seed: int):
    voters = _addresses(5)

    def script(now: int, name: str, header: dict[str, Any]) -> tuple[int, Any, Any]:
        if name != "c5" and header["kind"] != "metadata_since":
            return 1, None, errors.NotLeader("not me", leader="c5",
                                             leader_address=voters["c5"])
        return 1, ANSWERS[header["kind"]], None
    io = _run(voters, script, seed, HEARTBEAT_MS // 2)  # (one round)
    registering = [name for _, name, kind, _ in io.asked if kind == "register_broker"]
    assert registering[-1] == "c5" and len(registering) <= 2, registering
    heartbeat = [name for _, name, kind, _ in io.asked if kind == "broker_heartbeat"]
    assert heartbeat == ["c5"]  # (the registration's answer taught it)


def test_the_call_timeout_keeps_a_rounds_waiting_within_a_share_of_the_session():
    for session_ms, heartbeat_ms, voters in ((9_000, 1_800, 3), (9_000, 2_000, 5),
                                             (1_500, 200, 3), (3_000, 600, 1)):
        config = _config(_addresses(voters), broker_session_timeout_ms=session_ms,
                         broker_heartbeat_interval_ms=heartbeat_ms)
        timeout_s = host.call_timeout_s(config)
        spare_s = (session_ms - heartbeat_ms) / 1000
        assert host.CALL_TIMEOUT_MIN_S <= timeout_s <= host.CALL_TIMEOUT_S
        assert voters * timeout_s <= host.ROUND_SHARE * spare_s + 1e-9, (session_ms, voters)
    long = _config(_addresses(3), broker_session_timeout_ms=600_000)
    assert host.call_timeout_s(long) == host.CALL_TIMEOUT_S  # (a slow answer is no silence)
    tiny = _config(_addresses(5), broker_session_timeout_ms=2, broker_heartbeat_interval_ms=1)
    assert host.call_timeout_s(tiny) == host.CALL_TIMEOUT_MIN_S


# --- the same over real sockets, through join_cluster -------------------------------------


class FakeController(socketserver.ThreadingTCPServer):
    """A controller on 127.0.0.1 answering each request from ``script(name, header)`` (a
    dict, or an MqlogError raised back). While ``paused`` it still accepts connections and
    reads requests, as a SIGSTOPped process's kernel does, and answers none of them.
    ``heard``: an Event set by each request it answers, per kind."""

    daemon_threads, allow_reuse_address = True, True

    def __init__(self, name: str, script: Any) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.name, self.script, self.paused = name, script, False
        self.address = f"127.0.0.1:{self.server_address[1]}"
        self.heard: dict[str, threading.Event] = {kind: threading.Event() for kind in ANSWERS}
        threading.Thread(target=self.serve_forever, args=(POLL_S,), daemon=True).start()

    def answer(self, header: dict[str, Any]) -> dict[str, Any] | None:
        if self.paused:
            return None
        try:
            reply = {**self.script(self.name, header)}
        except errors.MqlogError as error:
            reply = {"kind": "error", "error": type(error).__name__, "message": str(error)}
            if isinstance(error, errors.NotLeader):
                reply.update(leader=error.leader, leader_address=error.leader_address)
        else:
            self.heard[header["kind"]].set()
        return {**reply, "id": header.get("id")}

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        decoder = FrameDecoder(1 << 20)
        while data := self.request.recv(1 << 16):  # (b"": the client closed, or gave up)
            decoder.feed(data)
            while isinstance(frame := decoder.next_frame(), Frame):
                reply = self.server.answer(frame.header)
                if reply is not None:
                    self.request.sendall(encode_frame(reply))


class FakeBroker:
    """What join_cluster uses of a broker: its config, groups (none), services, tasks."""

    def __init__(self, data_dir: Path, voters: dict[str, str], **settings: int) -> None:
        self.broker_id, self.groups, self.tasks = "b1", {}, []
        self.config = SimpleNamespace(
            controller={"voters": voters, "broker_session_timeout_ms": SESSION_MS,
                        "broker_heartbeat_interval_ms": HEARTBEAT_MS, **settings},
            store=StoreConfig(), data_dir=data_dir, listen="127.0.0.1:1", rack="", cluster_id="",
            groups_max=4096, groups=())

    def add_service(self, kinds: Any, handle: Any) -> None:
        pass

    def spawn(self, coroutine: Any) -> None:
        self.tasks.append(asyncio.get_running_loop().create_task(coroutine))

    def cannot_run(self, error: errors.MqlogError) -> None:
        self.exit_error = error  # (a registration refused for good: the broker stops)


@pytest.fixture
def controllers():
    """c1..c3 as FakeControllers; ``state.leader`` leads (the others answer NotLeader
    naming it, but any answers a pull). Closed when the test ends."""
    state = SimpleNamespace(leader="c1", fakes={})

    def script(name: str, header: dict[str, Any]) -> dict[str, Any]:
        if name != state.leader and header["kind"] != "metadata_since":
            raise errors.NotLeader("not me", leader=state.leader,
                                   leader_address=state.fakes[state.leader].address)
        return ANSWERS[header["kind"]]
    state.fakes = {name: FakeController(name, script) for name in ("c1", "c2", "c3")}
    yield state
    for fake in state.fakes.values():
        fake.close()


def test_with_the_leader_paused_a_heartbeat_reaches_the_next_well_within_the_session(
        controllers: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """join_cluster's agent over real sockets: c1 leads, then pauses as c3 is elected (a
    fresh session for every broker starts then). The heartbeat must reach c3 with a
    heartbeat interval of the session to spare; a call that waited the fixed 5 s (longer
    than this whole session) on the paused c1 did not."""
    session_ms, heartbeat_ms = 3_000, 600
    fakes = controllers.fakes
    broker = FakeBroker(tmp_path, {name: fake.address for name, fake in fakes.items()},
                        broker_session_timeout_ms=session_ms,
                        broker_heartbeat_interval_ms=heartbeat_ms)
    monkeypatch.setattr(host, "random", SimpleNamespace(Random=lambda: random.Random(3)))

    async def main() -> float:
        host.join_cluster(broker)
        assert await asyncio.to_thread(fakes["c1"].heard["broker_heartbeat"].wait, WAIT_S)
        fakes["c1"].paused, controllers.leader = True, "c3"
        elected = time.monotonic()
        reached = await asyncio.to_thread(fakes["c3"].heard["broker_heartbeat"].wait,
                                          session_ms / 1000)
        took = time.monotonic() - elected
        for task in broker.tasks:
            task.cancel()
        await asyncio.gather(*broker.tasks, return_exceptions=True)
        assert reached, f"no heartbeat reached the new leader within the session ({took:.1f} s)"
        return took
    took = asyncio.run(main())
    assert took < (session_ms - heartbeat_ms) / 1000, took


# --- a committed record the fold refuses; local_controller.ask ------------------------------


def test_a_committed_record_the_fold_refuses_is_skipped_as_the_controllers_skip_it():
    """A topic named "." committed before that name was refused: every controller skips
    it (service._fold); the agent's fold skips it too, or its every round would end on it
    and it would never pull past it."""
    body = [records.RegisterBroker("b1", 1, Host.address), records.CreateTopic(
        ".", "raft", (("b1",),)), records.CreateTopic("t", "raft", (("b1",),))]
    pulled = {"records": [[100 * (index + 1), records.encode(item)]
                          for index, item in enumerate(body)], "position": 300}
    voters = _addresses(1)

    def script(now: int, name: str, header: dict[str, Any]) -> tuple[int, Any, Any]:
        if header["kind"] == "metadata_since":
            return 1, pulled if header["position"] == 0 else ANSWERS["metadata_since"], None
        return 1, ANSWERS[header["kind"]], None
    io = _run(voters, script, 1, HEARTBEAT_MS // 2)
    agent = io.agent
    assert agent.position == 300 and sorted(agent.view.topics) == ["t"]
    assert agent.host.groups.keys() == {"t-0"}
    assert any("skipped the committed metadata record ending at 200" in note
               and "'.'" in note for note in io.notes), io.notes


def test_local_ask_asks_a_followers_hint_next_and_each_controller_once(
        controllers: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    fakes = controllers.fakes
    header = {"kind": "register_broker"}  # (a change: only the leader answers it)
    assert local_controller.ask([fakes["c2"].address], header) == \
        {**ANSWERS["register_broker"], "id": 1}
    assert fakes["c1"].heard["register_broker"].is_set()
    # c2 and c3 both name c1, which does not answer: asked once, then None
    monkeypatch.setattr(local_controller, "ASK_TIMEOUT_S", 0.2)
    fakes["c1"].paused = True
    asked: list[str] = []
    real = local_controller.Client
    monkeypatch.setattr(local_controller, "Client", lambda address, **options: (
        asked.append(address), real(address, **options))[1])
    assert local_controller.ask([fakes["c2"].address, fakes["c3"].address], header) is None
    assert asked == [fakes[name].address for name in ("c2", "c1", "c3")]


def test_a_real_followers_not_leader_names_the_leader_and_ask_goes_there(
        tmp_path: Path) -> None:
    """Over the broker's service path (an in-process cluster of three controllers and
    three brokers): a follower's NotLeader carries the leader's address back, so
    ``local_controller.ask`` given only a follower reaches the leader."""
    header = {"kind": "describe_cluster", "require_leader": True}
    with inprocess.Cluster(inprocess.configs(tmp_path)) as cluster:
        wait_until(lambda: _leading(cluster) is not None, "a controller leader", WAIT_S)
        leader = _leading(cluster)
        wait_until(lambda: local_controller.ask([cluster.configs[leader].listen], header)
                   is not None, "the controller leader serving", WAIT_S)
        follower = next(name for name in inprocess.CONTROLLERS if name != leader)
        address = cluster.configs[follower].listen
        with Client(address, timeout_s=WAIT_S) as client, \
                pytest.raises(errors.NotLeader) as refused:
            client.call(dict(header))
        assert refused.value.leader_address == cluster.configs[leader].listen
        answer = local_controller.ask([address], header)
        assert answer is not None and answer["leader"] == leader


def _leading(cluster: inprocess.Cluster) -> str | None:
    try:
        return cluster.leader()
    except StopIteration:
        return None


# --- a deleted topic's store on a broker that was away ----------------------------------------


def test_a_store_of_a_topic_deleted_while_its_broker_was_away_is_swept(tmp_path: Path) -> None:
    """b2 is stopped, topic "gone" is deleted, b2 starts again: once its view reaches its
    registration, its store of gone-0 is set aside (KIP-516's stray logs; it stayed for
    ever, and its abort marker made each later start unclean; never deleted: a view that
    lacks a topic may be another cluster's), and its store of "kept" stays."""
    brokers = ("b1", "b2")
    with inprocess.Cluster(inprocess.configs(tmp_path, brokers=brokers,
                                             controllers=("c1",))) as cluster:
        controllers = [cluster.configs["c1"].listen]
        wait_live_brokers(controllers, len(brokers))
        for name in ("gone", "kept"):
            change_metadata(controllers, {"kind": "create_topic", "name": name,
                                          "partitions": 1, "replication_factor": 2,
                                          "layer": "isr"})
        b2 = cluster.threads["b2"].broker
        wait_until(lambda: {"gone-0", "kept-0"} <= set(b2.groups), "b2 hosting both", WAIT_S)
        data_dir = cluster.configs["b2"].data_dir
        cluster.stop("b2")
        change_metadata(controllers, {"kind": "delete_topic", "name": "gone"})
        assert (data_dir / "gone-0").is_dir()  # (b2 was away: nothing deleted it)
        topic_id = hardstate.load_topic_id(data_dir / "gone-0")
        cluster.start("b2")
        wait_until(lambda: not (data_dir / "gone-0").exists(), "gone-0 swept", WAIT_S)
        assert (data_dir / host.STRAYS_DIRECTORY / f"gone-0.{topic_id}" / "topic-id").is_file()
        assert (data_dir / "kept-0").is_dir()
        wait_until(lambda: "kept-0" in cluster.threads["b2"].broker.groups, "kept-0 hosted",
                   WAIT_S)


def test_a_broker_of_another_cluster_is_refused_registration(tmp_path: Path, capsys) -> None:
    """b2's cluster_id is not its controllers': its registration is refused, naming both
    ids, so it is never placed replicas its peers refuse, and never takes that cluster's
    metadata, which lacks every topic of its stores, for its own."""
    configs = inprocess.configs(tmp_path, brokers=("b1", "b2"), controllers=("c1",))
    configs["b2"] = dataclasses.replace(configs["b2"], cluster_id="other").validate()
    said: list[str] = []

    def refused() -> bool:
        said.append(capsys.readouterr().out)
        return "is of cluster_id 'other', these controllers of ''" in "".join(said)
    with inprocess.Cluster(configs) as cluster:
        controllers = [cluster.configs["c1"].listen]
        wait_live_brokers(controllers, 1)
        wait_until(refused, "b2 refused", WAIT_S)
        found = local_controller.state(local_controller.ask(controllers,
                                                            {"kind": "describe_cluster"}))
        assert found is not None and set(found.brokers) == {"b1"}


def test_operator_commands_the_controller_would_undo_are_refused(tmp_path: Path) -> None:
    """On a partition of a topic (the controller assigned it): a master-slave promote or
    follow was carried out, then undone at the broker's next pull (its writes failed
    meanwhile); a Raft membership change left the voters apart from the metadata for
    ever. Both are refused, saying who decides. A config's group still takes them."""
    brokers = ("b1", "b2")
    with inprocess.Cluster(inprocess.configs(tmp_path, brokers=brokers,
                                             controllers=("c1",))) as cluster:
        controllers = [cluster.configs["c1"].listen]
        wait_live_brokers(controllers, len(brokers))
        for name, layer in (("ms", "master_slave"), ("rf", "raft")):
            change_metadata(controllers, {"kind": "create_topic", "name": name,
                                          "partitions": 1, "replication_factor": 2,
                                          "layer": layer})
        b1 = cluster.threads["b1"].broker
        wait_until(lambda: {"ms-0", "rf-0"} <= set(b1.groups), "b1 hosting both", WAIT_S)
        asked = [({"kind": "promote", "group": "ms-0", "role": "SYNC_MASTER",
                   "slaves": ["b2"]}, "names the master of ms-0"),
                 ({"kind": "follow", "group": "ms-0", "master": "b2"},
                  "names the master of ms-0"),
                 ({"kind": "membership", "group": "rf-0", "voters": ["b1"]},
                  "assigns the replicas of rf-0")]
        with Client(cluster.configs["b1"].listen) as client:
            for header, said in asked:
                with pytest.raises(errors.InvalidArgument, match=said):
                    client.call(header)


def _registered_at_300(pulls: Any) -> Any:
    """A controller's answers: the registration ends at 300 in the metadata log, the
    pulls come from ``pulls`` (then none, at 300)."""
    def script(now: int, name: str, header: dict[str, Any]) -> tuple[int, Any, Any]:
        if header["kind"] == "register_broker":
            return 1, {"broker_epoch": 1, "metadata_position": 300}, None
        if header["kind"] == "metadata_since":
            return 1, next(pulls, {"records": [], "position": 300}), None
        return 1, ANSWERS[header["kind"]], None
    return script


def test_stores_are_swept_only_once_the_view_reaches_the_registration() -> None:
    """The registration ended at 300 in the metadata log; the pulls bring the view to 200
    (a lagging controller answering), then 300. Nothing is swept before 300 — a topic
    missing from a view that lags is not a deleted one — and at 300 once, judged by that
    view: a store of a topic it has (same id) stays, one of a topic it lacks goes."""
    first = [records.RegisterBroker("b1", 1, Host.address),
             records.RegisterBroker("b2", 1, "127.0.0.1:9002")]
    then = [records.CreateTopic("kept", "raft", (("b1",),), topic_id=7),
            records.CreateTopic("other", "raft", (("b2",),), topic_id=9)]
    pulls = iter([
        {"records": [[100 + 50 * index, records.encode(item)]
                     for index, item in enumerate(first)], "position": 200},
        {"records": [[250 + 50 * index, records.encode(item)]
                     for index, item in enumerate(then)], "position": 300}])
    voters = _addresses(1)
    judged: list[list[bool]] = []
    stores = [("kept-0", 8), ("other-0", 9), ("other-0", 8), ("gone-0", 7), ("other-x", 9)]

    class Sweeping(Host):
        def set_strays_aside(self, is_stray: Any) -> list[str]:
            judged.append([is_stray(name, topic_id) for name, topic_id in stores])
            return ["gone-0"]

    io = ClockIo(voters, _registered_at_300(pulls))
    agent = host.BrokerAgent(Sweeping(), _config(voters), io, rng=random.Random(1))
    io.agent = agent
    agent.start()
    io.run_until(HEARTBEAT_MS // 2)  # (the first round: the view at 200)
    assert agent.position == 200 and judged == []
    io.run_until(5 * HEARTBEAT_MS)
    assert agent.position == 300 and agent.rounds >= 3
    # (a hosted group's stays, whatever the id; one of a topic the view has with that id
    # stays, hosted here or not; of another id, or of a topic the view lacks, goes; a name
    # that is no TOPIC-PARTITION is left alone) — once, not every round
    assert judged == [[False, False, True, True, False]], judged
    assert any("set the store gone-0 aside" in note for note in io.notes), io.notes


def test_strays_a_failed_move_left_are_swept_at_the_next_round() -> None:
    """A move that fails (a full disk, say) ends the round after the stores moved before
    it are said; the next round sweeps what is left. The sweep was marked done before it
    began, so what a failure left stayed for the rest of the broker's life."""
    register = [records.RegisterBroker("b1", 1, Host.address)]
    pulls = iter([{"records": [[100, records.encode(register[0])]], "position": 300}])
    voters = _addresses(1)
    calls: list[int] = []

    class FailingOnce(Host):
        def set_strays_aside(self, is_stray: Any) -> Any:
            calls.append(len(calls))
            yield "first-0" if len(calls) == 1 else "second-0"
            if len(calls) == 1:
                raise OSError(28, "No space left on device")

    io = ClockIo(voters, _registered_at_300(pulls))
    agent = host.BrokerAgent(FailingOnce(), _config(voters), io, rng=random.Random(1))
    io.agent = agent
    agent.start()
    io.run_until(5 * HEARTBEAT_MS)
    assert agent.rounds >= 3 and calls == [0, 1], calls
    moved = [name for name in ("first-0", "second-0")
             if any(f"set the store {name} aside" in note for note in io.notes)]
    assert moved == ["first-0", "second-0"], io.notes


def test_a_member_mark_that_failed_is_written_again_each_round() -> None:
    """A fresh data_dir is marked a member's once registered (MEMBER_FILE); a write that
    failed (a full disk) was never tried again, and the broker's next start, its data
    intact, was taken for a wiped one's (data_lost: out of even a last ELR). It is tried
    each round until written; registrations after the first never say fresh_data_dir."""
    marks: list[int] = []
    registrations: list[dict[str, Any]] = []

    def script(now: int, name: str, header: dict[str, Any]) -> tuple[int, Any, Any]:
        if header["kind"] == "register_broker":
            registrations.append(dict(header))
        return 1, ANSWERS[header["kind"]], None
    voters = _addresses(1)
    io = ClockIo(voters, script)
    agent = host.BrokerAgent(Host(), _config(voters), io, rng=random.Random(1))
    agent.fresh_data_dir = True
    agent.on_registered = lambda: marks.append(io.now) or len(marks) >= 3
    io.agent = agent
    agent.start()
    io.run_until(8 * HEARTBEAT_MS)
    assert len(marks) == 3 and len(set(marks)) == 3, marks  # (one a round until written)
    assert [header.get("fresh_data_dir") for header in registrations] == [True]


def test_the_host_follows_where_the_view_says_brokers_listen() -> None:
    """Each pull that changes where the view's brokers registered tells the host (every
    broker then dials a moved one at its new address, not only those whose groups name
    it); a pull that changes nothing there tells it nothing."""
    pulls = iter([
        [records.RegisterBroker("b1", 1, Host.address),
         records.RegisterBroker("b2", 1, "127.0.0.1:9002")],
        [records.CreateTopic("t", "raft", (("b1",),), topic_id=7)],
        [records.RegisterBroker("b2", 2, "127.0.0.1:9102")]])
    told: list[dict[str, str]] = []
    position = 0

    class Following(Host):
        def follow_registrations(self, addresses: Any) -> None:
            told.append(dict(addresses))

    def script(now: int, name: str, header: dict[str, Any]) -> tuple[int, Any, Any]:
        nonlocal position
        if header["kind"] == "metadata_since":
            batch = next(pulls, [])
            answer = {"records": [[position + 50 * (index + 1), records.encode(item)]
                                  for index, item in enumerate(batch)],
                      "position": position + 50 * len(batch)}
            position = answer["position"]
            return 1, answer, None
        return 1, ANSWERS[header["kind"]], None
    voters = _addresses(1)
    io = ClockIo(voters, script)
    agent = host.BrokerAgent(Following(), _config(voters), io, rng=random.Random(1))
    io.agent = agent
    agent.start()
    io.run_until(6 * HEARTBEAT_MS)
    assert agent.rounds >= 4, agent.rounds
    assert told == [{"b1": Host.address, "b2": "127.0.0.1:9002"},
                    {"b1": Host.address, "b2": "127.0.0.1:9102"}], told


def test_a_broker_registers_the_room_its_config_groups_leave(tmp_path: Path) -> None:
    """The controller places topics within what a broker registers, and knows nothing of
    the groups its config file hosts: the broker registers its groups_max less those
    (before, it registered the whole groups_max, and a broker with config groups was
    over-assigned: its hosting then refused the last ones)."""
    broker = FakeBroker(tmp_path, {"c1": "127.0.0.1:7101"})
    broker.config.groups_max, broker.config.groups = 10, ("g1", "g2", "g3")
    assert host.BrokerGroups(broker).groups_max == 7
