"""Raft partitions' leaders reported back (mqlog/replication/controller/leaders.py): the
table's rule (the higher term wins, whatever the order reports arrive in), the
controller leader's heartbeats taking reports and answering what a broker has not seen,
the overlay that ``mqlog topics describe`` and ``cluster_metadata`` show, and garbage."""

from __future__ import annotations

import random
from typing import Any

import pytest

from mqlog.errors import InvalidArgument, NotLeader
from mqlog.replication.controller.leaders import LeaderTable, leaders_from, leads_from
from mqlog.replication.controller.records import (
    CreateTopic,
    FenceBroker,
    RegisterBroker,
    UnfenceBroker,
)
from mqlog.replication.controller.state import ClusterMetadata, fold
from tests.test_controller_service import OneNode, _cluster


def _state() -> ClusterMetadata:
    brokers = ("b1", "b2", "b3")
    return fold([*(RegisterBroker(name, 1, f"h:{name}") for name in brokers),
                 *(UnfenceBroker(name, 1) for name in brokers),
                 CreateTopic("r", "raft", (("b1", "b2", "b3"), ("b2", "b3", "b1"))),
                 CreateTopic("i", "isr", (("b1", "b2"),))])


def test_the_higher_term_wins_in_any_order(seed: int) -> None:
    rng = random.Random(seed)
    reports = [("r", partition, f"b{rng.randint(1, 3)}", rng.randint(0, 6))
               for partition in (0, 1) for _ in range(12)]
    # one leader per term and partition, as Raft gives: the reports are consistent
    leader_of = {(topic, partition, term): leader for topic, partition, leader, term in reports}
    reports = [(t, p, leader_of[(t, p, term)], term) for t, p, _, term in reports]
    expected = {p: max((term, leader) for t, q, leader, term in reports if q == p)
                for p in (0, 1)}
    for _ in range(20):
        rng.shuffle(reports)
        table = LeaderTable()
        for report in reports + reports[:5]:  # (a report taken twice changes nothing)
            table.merge(*report)
        got = {p: tuple(reversed(table.get("r", p) or ("", -1))) for p in (0, 1)}
        assert got == expected, f"seed {seed}"
        assert table.conflicts == 0


def test_an_equal_term_naming_another_broker_is_ignored_and_counted() -> None:
    table = LeaderTable()
    assert table.merge("r", 0, "b1", 4)
    assert not table.merge("r", 0, "b2", 4)
    assert table.get("r", 0) == ("b1", 4) and table.conflicts == 1
    assert not table.merge("r", 0, "b2", 3)
    assert table.merge("r", 0, "b2", 5) and table.get("r", 0) == ("b2", 5)


def test_reports_of_partitions_a_broker_does_not_replicate_are_ignored() -> None:
    state, table = _state(), LeaderTable()
    assert table.report(state, "b1", {("r", 0): 2, ("r", 1): 3, ("i", 0): 9, ("gone", 0): 1,
                                      ("r", 7): 1}) == 2
    three = fold([RegisterBroker("b4", 1, "h:4")], state)
    assert table.report(three, "b4", {("r", 0): 9}) == 0
    assert table.entries() == [["r", 0, "b1", 2], ["r", 1, "b1", 3]]


def test_the_overlay_shows_reported_leaders_and_no_fenced_one() -> None:
    state, table = _state(), LeaderTable()
    table.report(state, "b2", {("r", 0): 5})
    shown = table.overlay(state)
    assert shown.topics["r"].partitions[0].leader == "b2"
    assert shown.topics["r"].partitions[0].leader_epoch == 5
    assert shown.topics["r"].partitions[1] == state.topics["r"].partitions[1]  # unreported
    assert shown.topics["i"] == state.topics["i"]
    fenced = state.apply(FenceBroker("b2", 1))
    gone = table.overlay(fenced).topics["r"].partitions[0]
    assert (gone.leader, gone.leader_epoch) == ("", 5)
    assert state.topics["r"].partitions[0].leader == "b1"  # (the state itself is unchanged)


def test_changes_since_gives_what_a_broker_lacks() -> None:
    table = LeaderTable("c1:3")
    table.merge("r", 0, "b1", 2)
    first = table.changes_since("", 0)
    assert first == {"token": "c1:3", "seq": 1, "leaders": [["r", 0, "b1", 2]]}
    assert table.changes_since("c1:3", 1)["leaders"] == []
    table.merge("r", 1, "b2", 2)
    assert table.changes_since("c1:3", 1)["leaders"] == [["r", 1, "b2", 2]]
    for token, seq in (("c2:4", 2), ("c1:3", 99), ("c1:3", "1"), (None, None)):
        assert len(table.changes_since(token, seq)["leaders"]) == 2  # another table: all
    broker = LeaderTable()
    broker.merge_all(leaders_from(table.changes_since("", 0)["leaders"]))
    assert broker.entries() == table.entries()


@pytest.mark.parametrize("bad", [3, [["r", 0]], [["r", -1, 1]], [[1, 0, 1]], [["r", 0, True]],
                                 [["r", 0, 1 << 64]]])
def test_garbage_leads_are_typed(bad: Any) -> None:
    with pytest.raises(InvalidArgument):
        leads_from(bad)


@pytest.mark.parametrize("bad", [{}, [["r", 0, "b1"]], [["r", 0, 1, 1]], [["r", "0", "b", 1]]])
def test_garbage_leaders_are_typed(bad: Any) -> None:
    with pytest.raises(InvalidArgument):
        leaders_from(bad)


def test_heartbeats_report_leaders_to_the_controller_leader(tmp_path: Any) -> None:
    one = OneNode(tmp_path / "c0")
    try:
        epochs = _cluster(one)
        controller = one.controller
        one.call(controller.create_topic("r", 2, 3, "raft"))
        answer = one.call(controller.heartbeat("b1", epochs["b1"], leads={("r", 0): 3}))
        token = answer["leaders"]["token"]
        assert answer["leaders"]["leaders"] == [["r", 0, "b1", 3]]
        seen = (token, answer["leaders"]["seq"])
        answer = one.call(controller.heartbeat("b2", epochs["b2"], leads={("r", 0): 4},
                                               seen=seen))
        assert answer["leaders"]["leaders"] == [["r", 0, "b2", 4]]
        assert controller.describe()["leaders"] == [["r", 0, "b2", 4]]
        assert controller.describe(require_leader=True)["leaders"] == [["r", 0, "b2", 4]]
        with pytest.raises(InvalidArgument):
            controller.heartbeat("b1", epochs["b1"], leads={("r", 0): -1})
        with pytest.raises(InvalidArgument):
            controller.heartbeat("b1", epochs["b1"], leads=[["r", 0, 1]])
        one.call(controller.delete_topic("r"))
        assert controller.describe()["leaders"] == []  # a deleted topic's leaders go
    finally:
        one.store.close()


def test_describe_from_a_controller_that_does_not_lead(tmp_path: Any) -> None:
    one = OneNode(tmp_path / "c0")
    try:
        with pytest.raises(NotLeader):
            one.controller.describe(require_leader=True)
    finally:
        one.store.close()


def test_a_retried_registration_of_one_process_life_keeps_its_epoch(tmp_path: Any) -> None:
    """KIP-631: the same incarnation is answered with the epoch it has, no record; a new
    life (another incarnation, or none said) gets a new epoch."""
    one = OneNode(tmp_path / "c0")
    try:
        controller = one.lead()
        first = one.call(controller.register_broker("b1", "h:1", "", "life-1"))
        end = controller.store.written_position
        again = one.call(controller.register_broker("b1", "h:1", "", "life-1"))
        # (the same epoch; no metadata position: see test_controller_service)
        assert again == {"broker_epoch": first["broker_epoch"]}
        assert controller.store.written_position == end
        assert controller.committed.brokers["b1"].incarnation == "life-1"
        moved = one.call(controller.register_broker("b1", "h:9", "", "life-1"))
        assert moved["broker_epoch"] == first["broker_epoch"] + 1  # (not a retry: moved)
        later = one.call(controller.register_broker("b1", "h:9", "", "life-2"))
        assert later["broker_epoch"] == moved["broker_epoch"] + 1
        unsaid = one.call(controller.register_broker("b1", "h:9"))
        assert unsaid["broker_epoch"] == later["broker_epoch"] + 1
        with pytest.raises(InvalidArgument):
            controller.register_broker("b1", "h:9", "", None)  # type: ignore[arg-type]
    finally:
        one.store.close()


def test_a_retry_before_the_registration_commits_waits_for_it(tmp_path: Any) -> None:
    one = OneNode(tmp_path / "c0")
    try:
        controller = one.lead()
        first = controller.register_broker("b1", "h:1", "", "life-1")
        retry = controller.register_broker("b1", "h:1", "", "life-1")
        assert retry.end == first.end is not None
        assert retry.answer == {"broker_epoch": first.answer["broker_epoch"]}
    finally:
        one.store.close()


def test_records_written_before_incarnation_still_decode() -> None:
    import msgpack

    from mqlog.errors import InvalidMetadataRecord
    from mqlog.replication.controller import records

    old = msgpack.packb({"v": 1, "type": "RegisterBroker", "broker_id": "b1",
                         "broker_epoch": 1, "address": "h:1", "rack": ""})
    assert records.decode(old) == RegisterBroker("b1", 1, "h:1", "", "")
    without_rack = msgpack.packb({"v": 1, "type": "RegisterBroker", "broker_id": "b1",
                                  "broker_epoch": 1, "address": "h:1"})
    with pytest.raises(InvalidMetadataRecord, match="missing \\['rack'\\]"):
        records.decode(without_rack)
    record = RegisterBroker("b1", 2, "h:1", "r", "life")
    assert records.decode(records.encode(record)) == record


def test_the_agent_reports_its_leads_and_keeps_the_leaders_it_is_told() -> None:
    from mqlog.replication.controller import host, records
    from tests.test_controller_sim import CONFIG, Host, ScriptedIo

    class Leading(Host):
        def leads(self) -> list[list[Any]]:
            return [["r", 1, 7]]

    told: list[Any] = [{"token": "c1:2", "seq": 4, "leaders": [["r", 0, "b2", 3]]}]
    sent: list[dict[str, Any]] = []

    def script(address: str, header: dict[str, Any]) -> dict[str, Any]:
        if header["kind"] == "register_broker":
            sent.append(header)
            return {"broker_epoch": 1}
        if header["kind"] == "broker_heartbeat":
            sent.append(header)
            return {"fenced": False, "position": 0, "leaders": told[0]}
        snapshot = records.encode(_state().snapshot())  # (topic r, replicated on b1)
        return {"snapshot": snapshot, "position": 100, "records": []}
    io = ScriptedIo(script)
    agent = host.BrokerAgent(Leading(), CONFIG, io, rng=random.Random(5))
    agent.start()
    io.run_due()
    assert sent[0]["incarnation"] == agent.incarnation and len(agent.incarnation) == 32
    assert sent[1]["leads"] == [["r", 1, 7]] and sent[1]["leaders_seen"] == ["", 0]
    assert agent.leaders.entries() == [["r", 0, "b2", 3], ["r", 1, "b1", 7]]
    assert agent.describe()["leaders"] == agent.leaders.entries()
    told[0] = {"token": "c1:2", "seq": 5, "leaders": [["r", 0, "b2"]]}  # garbage
    io.timers.pop()[1]()
    io.run_due()
    assert sent[2]["leaders_seen"] == ["c1:2", 4]
    assert agent.rounds == 2 and any("leader is [topic" in note for note in io.notes)
    assert agent.leaders.entries() == [["r", 0, "b2", 3], ["r", 1, "b1", 7]]


def test_a_lead_of_a_deleted_topics_partition_is_left_out() -> None:
    """A broker that still leads the Raft partition of a topic deleted since (it folds
    the deletion at its next pull) reported it, in its old term, as leading the topic
    created again under the name: the controller's table named it leader, clients went
    there, and the new leader's lower terms were ignored. A lead carries its topic id
    now; one of another id is left out (one without an id, of a group of before ids,
    counts as before)."""
    state = fold([RegisterBroker("b1", 1, "h:b1"),
                  CreateTopic("r", "raft", (("b1",), ("b1",)), topic_id=41)])
    leads = [["r", 0, 7, 33], ["r", 1, 2, 41], ["gone", 0, 1, 5]]
    assert leads_from(leads, state) == {("r", 1): 2, ("gone", 0): 1}
    assert leads_from([["r", 0, 7]], state) == {("r", 0): 7}
    assert leads_from(leads) == {("r", 0): 7, ("r", 1): 2, ("gone", 0): 1}  # (no state)
