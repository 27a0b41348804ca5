"""ClusterMetadata as data: datadriven scripts (tests/data/controller/*.txt, records in,
``describe`` out), and Hypothesis on the fold (prefix then rest = whole; snapshot, then
restore = same state) and on the record codec (round trip; garbage is a typed error)."""

from __future__ import annotations

import random
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqlog.errors import InvalidMetadataRecord, MetadataChangeRefused
from mqlog.replication.controller import records
from mqlog.replication.controller.decisions import (
    assign_replicas,
    fence_changes,
    imbalanced,
    isr_change,
    sync_state_change,
    unfence_changes,
)
from mqlog.replication.controller.leaders import LeaderTable
from mqlog.replication.controller.records import (
    CreateTopic,
    DeleteTopic,
    FenceBroker,
    PartitionChange,
    RegisterBroker,
    UnfenceBroker,
)
from mqlog.replication.controller.state import ClusterMetadata, fold
from mqlog.replication.isr.core import PartitionState
from mqlog.replication.isr.decisions import elect_preferred
from tests.datadriven import run_file

DATA = Path(__file__).parent / "data" / "controller"


def _names(text: str) -> tuple[str, ...]:
    return tuple(name for name in text.split(",") if name and name != "-")


def _reported(text: str) -> dict:
    """"t/0:b2=1@100,b3=1@90;t/1:..." -> {(t, 0): {b2: (1, 100), b3: (1, 90)}}."""
    reported: dict = {}
    for group in filter(None, text.split(";")):
        where, replicas = group.split(":")
        topic, index = where.split("/")
        reported[(topic, int(index))] = {
            name: tuple(int(part) for part in value.split("@"))
            for name, value in (item.split("=") for item in replicas.split(","))}
    return reported


class Script:
    """The datadriven handler: each command makes a record (or several), sends it through
    the codec, and applies it to the state; a refusal prints why and changes nothing."""

    def __init__(self) -> None:
        self.state = ClusterMetadata()
        self.position = 0

    def __call__(self, command: str, args: list[str], kw: dict[str, str]) -> str:
        if command == "describe":
            return self.state.describe()
        if command == "snapshot":
            body = records.encode(self.state.snapshot())
            restored = fold([(records.decode(body), self.state.position)])
            assert restored == self.state, (restored.describe(), self.state.describe())
            return f"restored the same state from a snapshot of {len(body)} bytes"
        if command == "rebalance":
            return self._rebalance(kw)
        if command == "decode":
            try:
                return repr(records.decode(bytes.fromhex(kw["hex"])))
            except InvalidMetadataRecord as error:
                return f"invalid: {error}"
        try:
            return "\n".join(self._apply(item) for item in self._records(command, kw))
        except MetadataChangeRefused as error:
            return f"refused: {error}"

    def _records(self, command: str, kw: dict[str, str]) -> list:
        epoch = int(kw.get("epoch", "0"))
        if command == "register":
            return [RegisterBroker(kw["id"], epoch, kw.get("address", "h:" + kw["id"]),
                                   kw.get("rack", ""),
                                   unclean_shutdown=kw.get("unclean_shutdown") == "true",
                                   data_lost=kw.get("data_lost") == "true")]
        if command in ("fence", "unfence"):
            cls = FenceBroker if command == "fence" else UnfenceBroker
            return [cls(kw["id"], epoch)]
        if command == "create":
            assignment = tuple(_names(part) for part in kw["assignment"].split(";"))
            return [CreateTopic(kw["name"], kw.get("layer", "isr"), assignment)]
        if command == "assign":
            assignment = assign_replicas(self.state.live_brokers(), int(kw["partitions"]),
                                         int(kw["rf"]), random.Random(int(kw["seed"])))
            return [CreateTopic(kw["name"], kw.get("layer", "raft"), assignment)]
        if command == "delete":
            return [DeleteTopic(kw["name"])]
        if command == "change":
            return [PartitionChange(kw["topic"], int(kw["partition"]), epoch,
                                    _names(kw["replicas"]), kw.get("leader", ""),
                                    int(kw["leader_epoch"]), _names(kw["isr"]),
                                    _names(kw.get("elr", "")), kw.get("layer", "isr"),
                                    tuple(int(part) for part in
                                          filter(None, kw.get("unclean", "").split(","))))]
        if command == "fence-changes":
            fresh = None if "fresh" not in kw else {
                where: set(_names(kw["fresh"])) for where in _reported(kw["reported"])}
            return fence_changes(self.state, kw["id"], kw.get("auto_failover") == "true",
                                 _reported(kw.get("reported", "")),
                                 test_break=kw.get("break", ""), fresh=fresh,
                                 min_insync_replicas=int(kw.get("min_insync", "1")),
                                 unclean=kw.get("unclean") == "true")
        if command == "unfence-changes":
            return unfence_changes(self.state, kw["id"],
                                   min_insync_replicas=int(kw.get("min_insync", "1")),
                                   unclean=kw.get("unclean") == "true",
                                   reported=_reported(kw.get("reported", "")))
        if command == "elect-preferred":
            part = PartitionState.of(self.state.partition(kw["topic"], int(kw["partition"])))
            decided = elect_preferred(part, set(self.state.live_brokers()))
            return [isr_change(kw["topic"], int(kw["partition"]), decided)]
        if command == "sync-state":
            change = sync_state_change(self.state, kw["id"], kw["topic"],
                                       int(kw["partition"]), epoch, _names(kw["in_sync"]))
            return [] if change is None else [change]
        raise AssertionError(f"unknown command {command}")

    def _rebalance(self, kw: dict[str, str]) -> str:
        """One leader imbalance check: Raft leaders as reported (``leaders=r/0:b2@3,...``)
        laid over the state; ISR moves applied, Raft moves printed as transfers."""
        table = LeaderTable()
        for item in filter(None, kw.get("leaders", "").split(",")):
            where, leader = item.split(":")
            name, term = leader.split("@")
            table.merge(where.split("/")[0], int(where.split("/")[1]), name, int(term))
        moves = imbalanced(table.overlay(self.state), int(kw.get("percentage", "10")))
        lines = []
        for move in moves:
            if move.layer == "raft":
                lines.append(f"transfer {move.topic}/{move.partition} {move.leader} -> "
                             f"{move.preferred} (asked of {move.leader})")
                continue
            part = PartitionState.of(self.state.partition(move.topic, move.partition))
            decided = elect_preferred(part, set(self.state.live_brokers()))
            lines.append(self._apply(isr_change(move.topic, move.partition, decided)))
        return "\n".join(lines) or "balanced"

    def _apply(self, record: records.Record) -> str:
        body = records.encode(record)
        decoded = records.decode(body)
        assert decoded == record
        self.position += 100 + len(body)
        self.state = self.state.apply(decoded, self.position)
        if isinstance(record, PartitionChange):
            return (f"ok PartitionChange {record.topic}/{record.partition} epoch="
                    f"{record.partition_epoch} leader={record.leader or '-'} leader_epoch="
                    f"{record.leader_epoch} isr={','.join(record.isr) or '-'}"
                    + (f" unclean={list(record.unclean)}" if record.unclean else ""))
        return f"ok {type(record).__name__}"


@pytest.mark.parametrize("path", sorted(DATA.glob("*.txt")), ids=lambda path: path.stem)
def test_datadriven(path: Path) -> None:
    run_file(path, Script())


# --- Hypothesis: the fold --------------------------------------------------------------

_BROKERS = ("b1", "b2", "b3", "b4")
_TOPICS = ("t1", "t2")


@st.composite
def _record(draw: st.DrawFn) -> records.Record:
    broker = draw(st.sampled_from(_BROKERS))
    epoch = draw(st.integers(0, 3))
    names = st.lists(st.sampled_from(_BROKERS), min_size=1, max_size=3, unique=True)
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return RegisterBroker(broker, epoch, f"127.0.0.1:{9000 + epoch}")
    if kind in (1, 2):
        return (FenceBroker if kind == 1 else UnfenceBroker)(broker, epoch)
    topic = draw(st.sampled_from(_TOPICS))
    if kind == 3:
        parts = draw(st.lists(names, min_size=1, max_size=3))
        return CreateTopic(topic, draw(st.sampled_from(["isr", "raft"])),
                           tuple(tuple(part) for part in parts))
    if kind == 4:
        return DeleteTopic(topic)
    isr = tuple(draw(names))
    return PartitionChange(topic, draw(st.integers(0, 2)), draw(st.integers(0, 3)), isr,
                           draw(st.sampled_from(["", *isr])), draw(st.integers(0, 3)), isr, (),
                           draw(st.sampled_from(["isr", "raft"])))


def _fold_valid(items: list[records.Record]) -> tuple[ClusterMetadata, list]:
    """Fold what applies (the leader's filter), returning the state and the log."""
    state, log = ClusterMetadata(), []
    for record in items:
        try:
            state.check(record)
        except MetadataChangeRefused:
            continue
        log.append((record, len(log) * 10 + 10))
        state = state.apply(*log[-1])
    return state, log


@settings(max_examples=200, deadline=None)
@given(st.lists(_record(), max_size=40), st.integers(0, 40))
def test_fold_prefix_then_rest_is_the_whole(items: list, cut: int) -> None:
    whole, log = _fold_valid(items)
    assert fold(log) == whole
    assert fold(log[cut:], fold(log[:cut])) == whole


@settings(max_examples=200, deadline=None)
@given(st.lists(_record(), max_size=40), st.integers(0, 40))
def test_snapshot_then_restore_is_the_same_state(items: list, cut: int) -> None:
    whole, log = _fold_valid(items)
    prefix = fold(log[:cut])
    snapshot = records.decode(records.encode(prefix.snapshot()))
    restored = fold([(snapshot, prefix.position)])
    assert restored == prefix
    assert fold(log[cut:], restored) == whole
    assert fold([(snapshot, prefix.position)], prefix) == prefix  # (agrees with its past)


@settings(max_examples=300, deadline=None)
@given(_record())
def test_codec_round_trip(record: records.Record) -> None:
    assert records.decode(records.encode(record)) == record


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_is_a_typed_error(data: bytes) -> None:
    try:
        records.decode(data)
    except InvalidMetadataRecord:
        pass


@settings(max_examples=300, deadline=None)
@given(_record(), st.data())
def test_damaged_fields_are_a_typed_error(record: records.Record, data: st.DataObject) -> None:
    body = msgpack.unpackb(records.encode(record))
    name = data.draw(st.sampled_from(sorted(body)))
    body[name] = data.draw(st.one_of(st.none(), st.booleans(), st.floats(), st.text(max_size=3),
                                     st.integers(-(1 << 63), (1 << 64) - 1), st.lists(st.none())))
    try:
        decoded = records.decode(msgpack.packb(body))
    except InvalidMetadataRecord:
        return
    assert type(decoded) is type(record)  # only a value of the right type got through


def test_a_refusal_changes_nothing() -> None:
    state = fold([RegisterBroker("b1", 1, "h:1")])
    with pytest.raises(MetadataChangeRefused, match="stale registration"):
        state.apply(RegisterBroker("b1", 1, "h:1"))
    assert state == fold([RegisterBroker("b1", 1, "h:1")])
    with pytest.raises(TypeError):
        state.brokers["b2"] = state.brokers["b1"]  # type: ignore[index]


def test_a_topic_min_insync_replicas_is_optional_in_the_record() -> None:
    """Left out at its default (0: the [controller] value), so an older record decodes and
    encodes byte for byte; set, it round-trips and the fold checks it (1..RF, isr only)."""
    plain = CreateTopic("t", "isr", (("b1", "b2"),))
    body = records.encode(plain)
    assert b"min_insync_replicas" not in body
    assert msgpack.unpackb(body) == {"v": 1, "type": "CreateTopic", "name": "t",
                                     "layer": "isr", "assignment": [["b1", "b2"]]}
    own = CreateTopic("t", "isr", (("b1", "b2"),), 2)
    assert records.decode(records.encode(own)) == own
    base = fold([RegisterBroker("b1", 1, "h:1"), RegisterBroker("b2", 1, "h:2")])
    assert base.apply(own).topics["t"].min_insync_replicas == 2
    assert fold([records.decode(records.encode(base.apply(own).snapshot()))]) == \
        base.apply(own).__class__(base.apply(own).brokers, base.apply(own).topics)
    for bad in (CreateTopic("t", "isr", (("b1", "b2"),), 3),
                CreateTopic("t", "raft", (("b1", "b2"),), 1)):
        with pytest.raises(MetadataChangeRefused, match="min_insync_replicas"):
            base.apply(bad)
