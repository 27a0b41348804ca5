"""The broker agent (controller/host.py) over an IO that answers at once from a script, and
a host that fails on purpose: one group's hosting failing with an exception that is not
an MqlogError (an OSError from opening its store on a full disk) skips that group, with
a note, and the next round hosts it; the agent's rounds go on (a broker whose rounds
stopped would stop heartbeating and be fenced for good)."""

from __future__ import annotations

import errno
import random
from typing import Any

import pytest

from mqlog import errors
from mqlog.replication.controller import host, records, state
from mqlog.replication.controller.config import ControllerConfig
from tests.test_controller_sim import Host

CONFIG = ControllerConfig(voters={"c1": "127.0.0.1:7001"}).validate()
ADDRESS = "127.0.0.1:9001"


class Io:
    """Answers from ``script(header)`` delivered by ``run_due``; timers kept, not run."""

    def __init__(self, script: Any) -> None:
        self.script, self.pending, self.timers, self.notes = script, [], [], []

    def request(self, address: str, header: dict[str, Any], done: Any) -> None:
        self.pending.append((done, self.script(header)))

    def call_later(self, delay_ms: int, callback: Any) -> None:
        self.timers.append(callback)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def run_due(self) -> None:
        while self.pending:
            done, answer = self.pending.pop(0)
            done(answer, None)

    def next_round(self) -> None:
        self.timers.pop(0)()
        self.run_due()


class FailingHost(Host):
    """A GroupHost whose ensure_group raises ``failure`` for the groups in ``failing``."""

    address = ADDRESS

    def __init__(self, failure: BaseException, failing: set[str]) -> None:
        super().__init__()
        self.failure, self.failing = failure, failing
        self.deleted: list[str] = []  # groups dropped with their data

    def ensure_group(self, spec: Any) -> None:
        if spec.name in self.failing:
            raise self.failure
        super().ensure_group(spec)

    def drop_group(self, name: str, delete_data: bool = False) -> None:
        super().drop_group(name)
        self.deleted.extend([name] if delete_data else [])


def _metadata() -> list[list[Any]]:
    """b1 registered and a Raft topic of two partitions on it, as a pull answers."""
    found, end = [], 0
    for item in (records.RegisterBroker("b1", 1, ADDRESS),
                 records.CreateTopic("t", "raft", (("b1",), ("b1",)))):
        end += 100
        found.append([end, records.encode(item)])
    return found


def _script(header: dict[str, Any]) -> dict[str, Any]:
    kind = header["kind"]
    if kind == "register_broker":
        return {"broker_epoch": 1}
    if kind == "broker_heartbeat":
        return {"fenced": False, "position": 0}
    if header["position"] == 0:
        return {"records": _metadata(), "position": 200}
    return {"records": [], "position": header["position"]}


def test_a_full_disk_hosting_one_group_skips_it_and_the_next_round_hosts_it() -> None:
    io = Io(_script)
    failing = FailingHost(OSError(errno.ENOSPC, "No space left on device"), {"t-0"})
    agent = host.BrokerAgent(failing, CONFIG, io, rng=random.Random(1))
    agent.start()
    io.run_due()
    assert agent.rounds == 1 and len(io.timers) == 1  # (the agent goes on)
    assert set(failing.groups) == {"t-1"} and agent.hosted == {"t-1"}
    assert agent.hosting_failures == 1
    assert any("cannot host t-0 now" in note and "No space left" in note
               for note in io.notes), io.notes
    failing.failing = set()  # (space freed)
    io.next_round()
    assert agent.rounds == 2 and set(failing.groups) == {"t-0", "t-1"}
    assert agent.hosted == {"t-0", "t-1"} and agent.hosting_failures == 1


def test_an_unexpected_exception_in_a_round_ends_the_round_not_the_agent() -> None:
    io = Io(_script)
    agent = host.BrokerAgent(FailingHost(OSError("x"), set()), CONFIG, io,
                             rng=random.Random(1))

    def broken(answer: dict[str, Any]) -> None:
        raise RuntimeError("a bug in the fold")
    agent.fold = broken  # type: ignore[method-assign]
    agent.start()
    io.run_due()
    assert agent.rounds == 1 and len(io.timers) == 1
    assert any("a bug in the fold" in note and "next round" in note for note in io.notes)
    io.next_round()
    assert agent.rounds == 2 and len(io.timers) == 1


def test_stores_left_open_are_found_and_said_once_at_registration(tmp_path: Any) -> None:
    for name, marked in (("t-0", True), ("t-1", False), ("__controller", True)):
        (tmp_path / name).mkdir()
        if marked:
            (tmp_path / name / "abort").touch()
    (tmp_path / "stray-file").touch()
    assert host.unclean_stores(tmp_path) == ["t-0"]
    assert host.unclean_stores(tmp_path, skip={"t-0"}) == []  # (open: the config's own)
    assert host.unclean_stores(tmp_path / "missing") == []
    asked: list[dict[str, Any]] = []

    def script(header: dict[str, Any]) -> dict[str, Any]:
        asked.append(header)
        return _script(header)
    io = Io(script)
    agent = host.BrokerAgent(FailingHost(OSError("x"), set()), CONFIG, io,
                             rng=random.Random(1))
    agent.unclean_shutdown = True
    agent.start()
    io.run_due()
    agent.epoch = None  # (told to register again, within the same life)
    io.next_round()
    registrations = [header for header in asked if header["kind"] == "register_broker"]
    assert [header.get("unclean_shutdown") for header in registrations] == [True, None]


def test_transfers_asked_by_the_controller_go_to_on_transfer_and_garbage_is_typed() -> None:
    answers = iter([[["t", 0, "b2"], ["t", 1, "b3"], ["gone", 0, "b2"]], 7])

    def script(header: dict[str, Any]) -> dict[str, Any]:
        if header["kind"] == "broker_heartbeat":
            return {"fenced": False, "position": 0, "transfers": next(answers)}
        return _script(header)
    io = Io(script)
    agent = host.BrokerAgent(FailingHost(OSError("x"), set()), CONFIG, io,
                             rng=random.Random(1))
    asked: list[tuple[str, str]] = []

    def on_transfer(group: str, target: str) -> None:
        if group == "t-1":
            raise errors.NotLeader("b1 does not lead t-1 now")
        asked.append((group, target))
    agent.on_transfer = on_transfer
    agent.hosted = {"t-0", "t-1"}  # (as if a round had hosted them: gone-0 is not)
    agent.start()
    io.run_due()
    assert asked == [("t-0", "b2")] and agent.rounds == 1
    assert any("t-1: no transfer to b3" in note for note in io.notes), io.notes
    io.next_round()  # garbage transfers: the round ends typed, the agent goes on
    assert agent.rounds == 2 and len(io.timers) == 1
    assert any("transfers must be a list" in note for note in io.notes), io.notes


def test_cluster_metadata_is_refused_until_the_first_pull_brings_something() -> None:
    """A new process life knows nothing of the cluster until a pull folds something: its
    cluster_metadata answer is NodeUnavailable (a client asks another broker), never an
    empty state that reads as "no such topic" (the simulator's readers caught those)."""
    pulls: list[dict[str, Any]] = [{"records": [], "position": 0}]  # (a controller behind)

    def script(header: dict[str, Any]) -> dict[str, Any]:
        return _script(header) if header["kind"] != "metadata_since" else pulls[0]
    io = Io(script)
    agent = host.BrokerAgent(FailingHost(OSError(), set()), CONFIG, io, rng=random.Random(2))
    with pytest.raises(errors.NodeUnavailable, match="has not pulled the cluster's metadata"):
        agent.describe()
    agent.start()
    io.run_due()
    assert agent.rounds == 1
    with pytest.raises(errors.NodeUnavailable):  # (an empty pull: still nothing known)
        agent.describe()
    pulls[0] = {"records": _metadata(), "position": 200}
    io.next_round()
    answer = agent.describe()
    assert answer["position"] == 200 and records.decode(answer["snapshot"]).topics


# --- a round whose fold moved nothing (issue 17: an idle partition costs nothing) -------------


class RecordingHost(FailingHost):
    """FailingHost that counts ensure_group calls and reports master-slave roles: each
    group a SLAVE that may be promoted (its core's own state, not the metadata's)."""

    def __init__(self) -> None:
        super().__init__(OSError("x"), set())
        self.ensured = 0
        self.changed: list[tuple[str, str]] = []

    def ensure_group(self, spec: Any) -> None:
        self.ensured += 1
        super().ensure_group(spec)

    def role(self, name: str) -> dict[str, Any] | None:
        if name not in self.groups or self.groups[name].replication.layer != "master_slave":
            return None
        return {"role": "SLAVE", "master": "b2", "epoch": 0, "promotable": True,
                "in_sync": None}

    def change_role(self, name: str, header: dict[str, Any]) -> None:
        self.changed.append((name, header["kind"]))


def _pulls(*batches: list[Any]) -> Any:
    """A script whose pulls bring ``batches`` of records, one per round, then nothing."""
    pending = list(batches)

    def script(header: dict[str, Any]) -> dict[str, Any]:
        if header["kind"] != "metadata_since":
            return _script(header)
        found = pending.pop(0) if pending else []
        return {"records": found, "position": header["position"] + 100 * len(found)}
    return script


def _built(monkeypatch: Any) -> list[str]:
    """The names of the GroupSpecs built from now on (Raft ones: the agent's assigned())."""
    from mqlog.config import GroupSpec

    built: list[str] = []
    raft = GroupSpec.raft

    def counted(name: str, *args: Any, **kwargs: Any) -> Any:
        built.append(name)
        return raft(name, *args, **kwargs)
    monkeypatch.setattr(GroupSpec, "raft", counted)
    return built


def test_a_round_whose_fold_moved_nothing_builds_and_hosts_no_group_spec(monkeypatch) -> None:
    built = _built(monkeypatch)
    more = [[0, records.encode(records.CreateTopic("u", "raft", (("b1",),)))]]
    io = Io(_pulls(_metadata()[:1], _metadata()[1:], [], [], more))
    recording = RecordingHost()
    agent = host.BrokerAgent(recording, CONFIG, io, rng=random.Random(1))
    agent.start()
    io.run_due()  # registered: no topic yet
    io.next_round()  # topic t: its two groups built and hosted
    assert sorted(built) == ["t-0", "t-1"] and recording.ensured == 2
    for _ in range(2):  # nothing new: nothing built, nothing asked of the host
        io.next_round()
    assert len(built) == 2 and recording.ensured == 2 and agent.rounds == 4
    io.next_round()  # topic u: every spec built again (and compared by the host)
    assert sorted(built[2:]) == ["t-0", "t-1", "u-0"] and recording.ensured == 5
    assert set(recording.groups) == agent.hosted == {"t-0", "t-1", "u-0"}


def test_a_round_whose_fold_moved_nothing_still_retries_and_applies_roles() -> None:
    """What does not follow from the view is redone every round: a group whose hosting
    failed is tried again, a master-slave core that is not what the metadata says is
    made so (its role changes on its own, not through the metadata)."""
    ms = [[0, records.encode(item)] for item in (
        records.RegisterBroker("b1", 1, ADDRESS),
        records.CreateTopic("m", "master_slave", (("b1",),)),
        records.CreateTopic("t", "raft", (("b1",),)))]
    io = Io(_pulls(ms))
    recording = RecordingHost()
    recording.failing = {"t-0"}
    agent = host.BrokerAgent(recording, CONFIG, io, rng=random.Random(1))
    agent.start()
    io.run_due()
    assert agent.hosted == {"m-0"} and agent.hosting_failures == 1
    assert recording.changed == []  # (hosted this round, as the metadata says)
    recording.failing = set()
    io.next_round()  # the same view: t-0 tried again, m-0's core made its leader
    assert agent.hosted == {"m-0", "t-0"} and recording.changed == [("m-0", "promote")]
    io.next_round()
    assert recording.changed == [("m-0", "promote")] * 2 and recording.ensured == 3


# --- the broker's [store] table reaches the partitions it is assigned --------------------


def test_the_partitions_a_controller_assigns_take_the_brokers_store_settings() -> None:
    """Every layer's groups open with the broker's [store] settings: before, a broker
    under a controller dropped its [store] table, and a `flush_mode = "sync"` there left
    every partition it hosted flushing asynchronously, without a word."""
    from mqlog.config import StoreConfig

    store = StoreConfig(flush_mode="sync", segment_size_bytes=8 << 20)
    topics = [[0, records.encode(item)] for item in (
        records.RegisterBroker("b1", 1, ADDRESS),
        records.CreateTopic("r", "raft", (("b1",),)),
        records.CreateTopic("i", "isr", (("b1",),)),
        records.CreateTopic("m", "master_slave", (("b1",),)))]
    io = Io(_pulls(topics))
    recording = RecordingHost()
    agent = host.BrokerAgent(recording, CONFIG, io, rng=random.Random(1), store=store)
    agent.start()
    io.run_due()
    assert {name: spec.replication.layer for name, spec in recording.groups.items()} == {
        "r-0": "raft", "i-0": "isr", "m-0": "master_slave"}
    assert all(spec.store == store for spec in recording.groups.values())



def test_isr_partitions_take_the_controller_tables_fetch_settings() -> None:
    """[controller] replica_fetch_* (Kafka's replica.fetch.*) reach every ISR partition's
    core as fetch_wait_ms_max, fetch_bytes_min and fetch_bytes_max."""
    config = ControllerConfig(voters={"c1": "127.0.0.1:7001"}, replica_fetch_min_bytes=65536,
                              replica_fetch_wait_max_ms=200,
                              replica_fetch_max_bytes=2 << 20).validate()
    topics = [[0, records.encode(item)] for item in (
        records.RegisterBroker("b1", 1, ADDRESS), records.CreateTopic("i", "isr", (("b1",),)))]
    io = Io(_pulls(topics))
    recording = RecordingHost()
    host.BrokerAgent(recording, config, io, rng=random.Random(1)).start()
    io.run_due()
    replication = recording.groups["i-0"].replication
    assert (replication.fetch_bytes_min, replication.fetch_wait_ms_max,
            replication.fetch_bytes_max) == (65536, 200, 2 << 20)

def test_a_cluster_members_store_table_is_read_not_dropped(tmp_path: Any) -> None:
    from mqlog.config import BrokerConfig

    path = tmp_path / "b1.toml"
    path.write_text('[node]\nid = "b1"\nlisten = "127.0.0.1:9001"\ndata_dir = "d"\n'
                    '[controller]\nvoters = {c1 = "127.0.0.1:7001"}\n'
                    '[store]\nflush_mode = "sync"\n')
    config = BrokerConfig.load(path)
    assert config.groups == () and config.store.flush_mode == "sync"


def test_a_deleted_topics_partitions_are_dropped_with_their_data_and_no_other() -> None:
    """A topic created again under a deleted one's name must start empty: its brokers
    delete the old partitions' stores (they were reopened: the deleted records came back,
    and an ISR partition refused every write). A group dropped because its spec could not
    be built (a replica registered again with a bad address) keeps its data."""
    created = [[0, records.encode(item)] for item in (
        records.RegisterBroker("b1", 1, ADDRESS),
        records.RegisterBroker("b2", 1, "127.0.0.1:9002"),
        records.CreateTopic("gone", "raft", (("b1",),)),
        records.CreateTopic("pair", "raft", (("b1", "b2"),)))]
    deleted = [[0, records.encode(records.DeleteTopic("gone"))]]
    bad = [[0, records.encode(records.RegisterBroker("b2", 2, "no-port"))]]
    io = Io(_pulls(created, deleted, bad))
    recording = RecordingHost()
    agent = host.BrokerAgent(recording, CONFIG, io, rng=random.Random(1))
    agent.start()
    io.run_due()
    assert agent.hosted == {"gone-0", "pair-0"}
    io.next_round()
    assert agent.hosted == {"pair-0"} and recording.deleted == ["gone-0"]
    io.next_round()
    assert agent.hosted == set() and recording.deleted == ["gone-0"]


def test_a_topic_deleted_and_created_again_in_one_pull_starts_empty() -> None:
    """`topics delete t; topics create t` within one heartbeat: the pull brings both, the
    view after it has the topic, and its group was kept with the deleted topic's store."""
    created = [[0, records.encode(item)] for item in (
        records.RegisterBroker("b1", 1, ADDRESS), records.CreateTopic("t", "raft", (("b1",),)))]
    again = [[0, records.encode(item)] for item in (
        records.DeleteTopic("t"), records.CreateTopic("t", "raft", (("b1",),)))]
    io = Io(_pulls(created, again))
    recording = RecordingHost()
    agent = host.BrokerAgent(recording, CONFIG, io, rng=random.Random(1))
    agent.start()
    io.run_due()
    assert agent.hosted == {"t-0"} and recording.ensured == 1
    io.next_round()
    assert recording.deleted == ["t-0"]
    assert agent.hosted == {"t-0"} and recording.ensured == 2  # hosted anew, empty


def test_a_topic_created_again_behind_a_snapshot_starts_empty() -> None:
    """A pull that answers with a snapshot shows no DeleteTopic: the topic is there, with
    another topic id (KIP-516), and its partitions are dropped with their data and hosted
    anew (before ids the agent kept the old store, and then refused the new spec)."""
    broker = records.RegisterBroker("b1", 1, ADDRESS)
    created = [[0, records.encode(item)] for item in (
        broker, records.CreateTopic("t", "raft", (("b1",),), topic_id=3))]
    again = state.fold([broker, records.CreateTopic("t", "raft", (("b1",),), topic_id=8)])
    pulls = _pulls(created)

    def script(header: dict[str, Any]) -> dict[str, Any]:
        if header["kind"] == "metadata_since" and header["position"] >= 200:
            return {"snapshot": records.encode(again.snapshot()), "position": 900,
                    "records": []}
        return pulls(header)
    io = Io(script)
    recording = RecordingHost()
    agent = host.BrokerAgent(recording, CONFIG, io, rng=random.Random(1))
    agent.start()
    io.run_due()
    assert agent.hosted == {"t-0"} and recording.ensured == 1 and recording.deleted == []
    io.next_round()
    assert recording.deleted == ["t-0"]
    assert agent.hosted == {"t-0"} and recording.ensured == 2  # hosted anew, empty


def test_a_log_end_report_of_a_deleted_topics_partition_is_left_out() -> None:
    """A broker still hosting a deleted topic's partition (until its next pull) reported
    its log end as the end of the partition of the topic created again under the name,
    which an election compares (an unclean one says what may be lost from it). A report
    carries its topic id now; one of another id is left out by the controller."""
    now = state.fold([records.RegisterBroker("b1", 1, ADDRESS),
                      records.CreateTopic("t", "isr", (("b1",),), topic_id=41)])
    reports = [["t", 0, 3, 9000, 33], ["t", 0, 0, 10], ["u", 0, 1, 5, 7]]
    assert host._reports_from(reports[:1], now) == {}
    assert host._reports_from(reports[1:], now) == {("t", 0): (0, 10), ("u", 0): (1, 5)}
    assert host._reports_from([["t", 0, 0, 10, 41]], now) == {("t", 0): (0, 10)}
    assert host._reports_from(reports[:1]) == {("t", 0): (3, 9000)}  # (no state)
    with pytest.raises(errors.InvalidArgument, match="maybe a topic id"):
        host._reports_from([["t", 0, 0, 10, 41, 1]], now)


class BuggyHost(FailingHost):
    """A host with a bug: ``follow_registrations`` or ``reports`` raises what no host
    should (a KeyError, an AttributeError) while ``buggy`` names it."""

    def __init__(self) -> None:
        super().__init__(OSError("unused"), set())
        self.buggy = ""

    def follow_registrations(self, addresses: Any) -> None:
        if self.buggy == "follow_registrations":
            raise KeyError("b9")
        super().follow_registrations(addresses)

    def reports(self) -> list[Any]:
        if self.buggy == "reports":
            raise AttributeError("'BuggyHost' object has no attribute 'groups_view'")
        return super().reports()


@pytest.mark.parametrize("buggy, error, rounds_before", [
    ("follow_registrations", "KeyError('b9')", 0),  # acting on a pull's answer
    ("reports", "AttributeError", 0),  # before the heartbeat, in the registration's answer
    ("reports", "AttributeError", 1)])  # before the heartbeat, in a round of its own
def test_a_host_that_raises_is_said_at_fault_not_the_controllers_answer(
        buggy: str, error: str, rounds_before: int) -> None:
    """A host's own exception, acting on an answer or before a request, is this broker's
    fault: before, a KeyError or an AttributeError there was said as "a malformed
    answer" from the controller. The round ends, the agent goes on, and once the host
    works the next round does what that one could not."""
    io, buggy_host = Io(_script), BuggyHost()
    agent = host.BrokerAgent(buggy_host, CONFIG, io, rng=random.Random(1))
    buggy_host.buggy = "" if rounds_before else buggy
    agent.start()
    io.run_due()
    if rounds_before:
        buggy_host.buggy = buggy
        io.next_round()
    assert agent.rounds == rounds_before + 1 and len(io.timers) == 1  # (it goes on)
    assert any(host.HOST_FAULT in note and error in note for note in io.notes), io.notes
    assert not any("malformed" in note for note in io.notes), io.notes
    buggy_host.buggy = ""
    notes = len(io.notes)
    io.next_round()
    assert io.notes[notes:] == [] and agent.hosted == {"t-0", "t-1"}
    assert buggy_host.registered == {"b1": ADDRESS}
