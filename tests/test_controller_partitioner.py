"""Kafka's default partitioner (murmur2) and replica assignment, against Kafka's facts."""

from __future__ import annotations

import collections
import random
import subprocess
import sys

import pytest

from mqlog.errors import InvalidArgument, MetadataChangeRefused
from mqlog.partitioner import RoundRobin, choose_partition, murmur2, partition_for_key
from mqlog.replication.controller import records
from mqlog.replication.controller.decisions import assign_replicas, place_replicas
from mqlog.replication.controller.state import ClusterMetadata

# Kafka's UtilsTest.testMurmur2, and librdkafka's rdmurmur2 cases ("kafka").
KAFKA_VECTORS = {
    "21": -973932308, "foobar": -790332482, "a-little-bit-long-string": -985981536,
    "a-little-bit-longer-string": -1486304829,
    "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, "abc": 479470107,
    "1": -1993445489, "12": 126087238, "123": -267702483, "1234": -1614185708,
    "12345": -1188365604, "kafka": -798503068,
}


@pytest.mark.parametrize("text", sorted(KAFKA_VECTORS))
def test_murmur2_matches_kafka(text: str) -> None:
    assert murmur2(text.encode()) == KAFKA_VECTORS[text]


def test_partition_is_the_positive_hash_modulo_the_count() -> None:
    # toPositive masks the sign bit (it is not abs): -973932308 & 0x7fffffff = 1173551340
    assert partition_for_key("21", 1 << 31) == 1173551340
    assert partition_for_key("21", 6) == 1173551340 % 6
    assert partition_for_key(b"foobar", 7) == (-790332482 & 0x7FFFFFFF) % 7
    assert partition_for_key("foobar", 7) == partition_for_key(bytearray(b"foobar"), 7)
    assert partition_for_key("", 5) == (murmur2(b"") & 0x7FFFFFFF) % 5


@pytest.mark.parametrize("bad", [0, -1, True, 2.0, "3"])
def test_a_bad_partition_count_is_refused(bad: object) -> None:
    with pytest.raises(InvalidArgument, match="partitions"):
        partition_for_key("k", bad)  # type: ignore[arg-type]


def test_a_bad_key_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="surrogate"):
        partition_for_key("\ud800", 3)
    with pytest.raises(InvalidArgument, match="str or bytes"):
        partition_for_key(12, 3)  # type: ignore[arg-type]


def test_no_key_goes_round_robin_per_topic() -> None:
    turns = RoundRobin()
    assert [choose_partition(None, "a", 3, turns) for _ in range(5)] == [0, 1, 2, 0, 1]
    assert choose_partition(None, "b", 3, turns) == 0
    assert choose_partition("21", "a", 6, turns) == 1173551340 % 6


def test_the_partitioner_loads_no_asyncio() -> None:
    code = "import sys, mqlog.partitioner; print('asyncio' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"


# --- replica assignment ----------------------------------------------------------------


class _Zero(random.Random):
    def randrange(self, *args: object, **kwargs: object) -> int:  # type: ignore[override]
        return 0


def test_kafka_assignment_example() -> None:
    """The example in the comment of Kafka's AdminUtils.assignReplicasToBrokers: 5
    brokers, 10 partitions, RF 3, start index and shift 0."""
    brokers = ["b0", "b1", "b2", "b3", "b4"]
    table = {0: "012", 1: "123", 2: "234", 3: "340", 4: "401",
             5: "023", 6: "134", 7: "240", 8: "301", 9: "412"}
    assignment = assign_replicas(brokers, 10, 3, _Zero())
    assert {p: "".join(name[1] for name in replicas) for p, replicas in
            enumerate(assignment)} == table


def test_assignment_follows_kafkas_rule(rng: random.Random) -> None:
    brokers = ["b0", "b1", "b2", "b3", "b4"]
    assignment = assign_replicas(brokers, 10, 3, rng)
    leaders = [replicas[0] for replicas in assignment]
    first = brokers.index(leaders[0])
    assert leaders == [brokers[(first + index) % 5] for index in range(10)]
    for replicas in assignment:
        assert len(set(replicas)) == 3
    # the follower shift grows after every 5 partitions: partition p and p + 5 share a
    # leader but not the same first follower
    assert assignment[0][0] == assignment[5][0] and assignment[0][1] != assignment[5][1]


@pytest.mark.parametrize("count,partitions,factor", [(3, 6, 3), (5, 17, 2), (4, 4, 1),
                                                     (1, 3, 1), (6, 60, 3)])
def test_assignment_balances_leaders_and_replicas(count: int, partitions: int,
                                                  factor: int, rng: random.Random) -> None:
    brokers = [f"b{index}" for index in range(count)]
    assignment = assign_replicas(brokers, partitions, factor, rng)
    leads = collections.Counter(replicas[0] for replicas in assignment)
    holds = collections.Counter(name for replicas in assignment for name in replicas)
    assert max(leads.values()) - min(leads.get(name, 0) for name in brokers) <= 1
    assert max(holds.values()) - min(holds.get(name, 0) for name in brokers) <= factor
    assert all(len(set(replicas)) == factor for replicas in assignment)


def test_assignment_is_a_function_of_the_seed() -> None:
    brokers = ["x", "y", "z"]
    assert assign_replicas(brokers, 9, 2, random.Random(5)) == \
        assign_replicas(list(reversed(brokers)), 9, 2, random.Random(5))


def test_assignment_refuses_what_cannot_be_placed() -> None:
    with pytest.raises(MetadataChangeRefused, match="2 are live"):
        assign_replicas(["a", "b"], 3, 3, random.Random(0))
    with pytest.raises(MetadataChangeRefused, match="at least one partition"):
        assign_replicas(["a", "b"], 0, 1, random.Random(0))


def _cluster(groups_max: dict[str, int], topics: tuple[records.CreateTopic, ...] = ()
             ) -> ClusterMetadata:
    """Live brokers with these groups_max (0: not said), and ``topics``."""
    items: list[records.Record] = []
    for name, most in groups_max.items():
        items += [records.RegisterBroker(name, 1, f"127.0.0.1:{9000 + len(items)}",
                                         groups_max=most),
                  records.UnfenceBroker(name, 1)]
    state = ClusterMetadata()
    for item in (*items, *topics):
        state = state.apply(item)
    return state


def test_placement_keeps_within_each_brokers_groups_max() -> None:
    """A broker that said its groups_max gets no replica past it: a full one is left out
    (the topic goes to the others), a topic that cannot fit is refused naming the broker
    — hosted, the group would have failed there, and its partition would never have had
    that replica. A broker that did not say (0, a broker of before) takes any number."""
    hosting = records.CreateTopic("old", "isr", (("a", "b"), ("a", "c")))
    state = _cluster({"a": 2, "b": 0, "c": 0}, (hosting,))
    assignment = place_replicas(state, 6, 2, random.Random(3))
    assert all("a" not in replicas for replicas in assignment), assignment
    with pytest.raises(MetadataChangeRefused, match="a host their groups_max"):
        place_replicas(state, 1, 3, random.Random(3))
    roomy = _cluster({"a": 4, "b": 0, "c": 0}, (hosting,))
    with pytest.raises(MetadataChangeRefused, match="on broker a, which has room for 2"):
        place_replicas(roomy, 6, 3, random.Random(3))
    assert place_replicas(roomy, 2, 3, random.Random(3))  # (one replica each: it fits)
    # the controller's own group counts on a combined broker
    with pytest.raises(MetadataChangeRefused, match="on broker a, which has room for 1"):
        place_replicas(roomy, 2, 3, random.Random(3), {"a": 1})
    unsaid = _cluster({"a": 0, "b": 0})
    assert place_replicas(unsaid, 8, 2, random.Random(3)) == \
        assign_replicas(["a", "b"], 8, 2, random.Random(3))


def test_a_registration_keeps_the_brokers_groups_max() -> None:
    """groups_max goes in the RegisterBroker record (left out at 0: a record byte for byte
    what an older mqlog wrote) and into the broker's facts; a negative one is refused."""
    said = records.RegisterBroker("a", 1, "127.0.0.1:9000", groups_max=12)
    assert records.decode(records.encode(said)) == said
    unsaid = records.RegisterBroker("a", 1, "127.0.0.1:9000")
    assert b"groups_max" not in records.encode(unsaid)
    assert _cluster({"a": 12}).brokers["a"].groups_max == 12
    with pytest.raises(MetadataChangeRefused, match="not a count"):
        ClusterMetadata().apply(records.RegisterBroker("a", 1, "127.0.0.1:9000",
                                                       groups_max=-1))
