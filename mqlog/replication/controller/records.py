"""The controller's metadata records (KRaft's idea: the cluster's metadata is a log of
records, and its state is what folding them gives; state.py folds them).

Each record is one mqlog record in the controller's store, on topic ``__cluster_metadata``
queue 0, its tags the record's type; its body is a msgpack map (docs/FORMAT.md, "Metadata
records")::

    {"v": 1, "type": "PartitionChange", "topic": "orders", "partition": 3, ...}

``v`` is the body's format version: a reader refuses a version it does not know (a newer
mqlog wrote it) instead of guessing. Every field is required and typed; a body that is not
exactly one of the records below is ``InvalidMetadataRecord`` — the decoder never lets a
malformed value reach the fold.

The records (Kafka's names where Kafka has one):

* RegisterBroker — a broker (re)joins with a new, larger broker epoch; it starts fenced.
  Its ``incarnation`` names the process life (Kafka's incarnation id, KIP-631): the
  controller answers a retried registration of the same life with the epoch it has.
  ``unclean_shutdown``: its last life did not close its stores cleanly (KIP-966), so it
  leaves every ELR it is not the last eligible replica of (it may have lost what it
  acknowledged, with replica_ack "written": decisions.leave_elr). ``data_lost``: its
  data_dir held no sign of its earlier life (wiped or replaced; ``unclean_shutdown`` is set
  too): its replicas hold nothing, so it leaves even an ELR it is the last eligible
  replica of — the partition then waits for a replica with the data, or an unclean
  election that reports what it loses. ``groups_max``: the
  most groups the controller may have it host (its groups_max less its config file's
  groups); topics are placed within it (0: a broker that did not say).
* FenceBroker / UnfenceBroker — a broker missed its session (or came back), named with
  the broker epoch the decision was made for: a decision about an older registration is
  stale.
* CreateTopic — a topic, its layer and its replica assignment (Kafka writes a TopicRecord
  and a PartitionRecord per partition; one record here keeps a create atomic), and an
  ISR topic's own ``min_insync_replicas`` (Kafka's topic config; left out, and 0 once
  decoded, when the topic takes the cluster's ``[controller]`` value).
* DeleteTopic.
* PartitionChange — a partition's new replicas, leader (``""``: none), leader epoch, ISR,
  ELR; ``partition_epoch`` is the epoch it creates (the partition's current epoch + 1),
  so a change computed from a stale view is refused (KIP-497's partition epoch). An
  unclean election's change also says what may be lost (``unclean``: the leader epoch,
  the new leader's log end, the largest log end the controller knew of another
  replica); the partition keeps it, shown by ``topics describe``, until the next one.
* Snapshot — the whole state at this point of the log: a controller that trims its log
  writes one first, and a reader folding from it needs nothing before it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import msgpack

from mqlog.errors import InvalidMetadataRecord

METADATA_TOPIC = "__cluster_metadata"
RECORD_VERSION = 1
LAYERS = ("isr", "raft", "master_slave")
_INT64 = (-(1 << 63), (1 << 63) - 1)


@dataclass(frozen=True)
class BrokerInfo:
    broker_id: str
    broker_epoch: int
    address: str
    rack: str
    fenced: bool
    incarnation: str = ""  # the process life that registered (KIP-631); "": not said
    # this registration followed an unclean shutdown (KIP-966): until it is unfenced, its
    # fences never put it in an ELR (its log may lack what it acknowledged)
    unclean_shutdown: bool = False
    groups_max: int = 0  # the most groups it may be given (see above); 0: not said
    # ... and its data_dir held nothing of its earlier life (wiped, replaced): until it is
    # unfenced, it leaves even an ELR it is the last eligible replica of
    data_lost: bool = False


@dataclass(frozen=True)
class PartitionInfo:
    replicas: tuple[str, ...]
    leader: str  # "" when the partition has no leader
    leader_epoch: int
    partition_epoch: int
    isr: tuple[str, ...]
    elr: tuple[str, ...]
    # the last unclean election: (leader epoch it began, the new leader's log end, the
    # largest log end another replica reported): [end, largest) may be lost; (): none
    unclean: tuple[int, ...] = ()


@dataclass(frozen=True)
class TopicInfo:
    name: str
    layer: str
    partitions: tuple[PartitionInfo, ...]
    min_insync_replicas: int = 0  # an ISR topic's own; 0: the [controller] value
    topic_id: int = 0  # its CreateTopic's (KIP-516); 0: a topic created before ids


@dataclass(frozen=True)
class RegisterBroker:
    broker_id: str
    broker_epoch: int
    address: str
    rack: str = ""
    incarnation: str = ""  # one per process life: a retried registration is known by it
    unclean_shutdown: bool = False  # the broker's stores were not closed cleanly (KIP-966)
    groups_max: int = 0  # the most groups the broker may be given; 0: not said
    data_lost: bool = False  # its data_dir held nothing of its earlier life (then unclean too)


@dataclass(frozen=True)
class FenceBroker:
    broker_id: str
    broker_epoch: int


@dataclass(frozen=True)
class UnfenceBroker:
    broker_id: str
    broker_epoch: int


@dataclass(frozen=True)
class CreateTopic:
    name: str
    layer: str
    assignment: tuple[tuple[str, ...], ...]  # the replicas of each partition, in order
    min_insync_replicas: int = 0  # an ISR topic's own (1..RF); 0: the [controller] value
    # Random, never 0 (Kafka's topic id, KIP-516): tells this topic's partitions from
    # those of a deleted one of the same name, in peer messages and in a broker's stores
    topic_id: int = 0


@dataclass(frozen=True)
class DeleteTopic:
    name: str


@dataclass(frozen=True)
class PartitionChange:
    topic: str
    partition: int
    partition_epoch: int  # the epoch this change creates: the current one + 1
    replicas: tuple[str, ...]
    leader: str
    leader_epoch: int
    isr: tuple[str, ...]
    elr: tuple[str, ...]
    layer: str
    unclean: tuple[int, ...] = ()  # set by an unclean election (PartitionInfo.unclean)


@dataclass(frozen=True)
class Snapshot:
    brokers: tuple[BrokerInfo, ...]
    topics: tuple[TopicInfo, ...]


Record = (RegisterBroker | FenceBroker | UnfenceBroker | CreateTopic | DeleteTopic
          | PartitionChange | Snapshot)
RECORD_TYPES: dict[str, type] = {cls.__name__: cls for cls in (
    RegisterBroker, FenceBroker, UnfenceBroker, CreateTopic, DeleteTopic, PartitionChange,
    Snapshot)}


# --- encoding ------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """Dataclasses to maps, tuples to lists: what msgpack stores."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {item.name: _plain(getattr(value, item.name))
                for item in dataclasses.fields(value) if not _left_out(item, value)}
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value


def _left_out(item: dataclasses.Field, value: Any) -> bool:
    """A field added after the first version, at its default, is not written: a record
    that does not use it is byte for byte what an older mqlog wrote (and reads)."""
    return item.default is not dataclasses.MISSING and item.name not in _FIRST_FIELDS and \
        getattr(value, item.name) == item.default


def encode(record: Record) -> bytes:
    """The body of the mqlog record that stores ``record``."""
    body = {"v": RECORD_VERSION, "type": type(record).__name__, **_plain(record)}
    return msgpack.packb(body, use_bin_type=True)


# --- decoding: every value is checked, nothing malformed gets through ------------------


def decode(body: bytes) -> Record:
    """The record stored in ``body``; InvalidMetadataRecord if it is not one."""
    try:
        value = msgpack.unpackb(bytes(body), raw=False, strict_map_key=True,
                                use_list=True)
    except Exception as error:  # msgpack raises several types for garbage
        raise InvalidMetadataRecord(f"not a metadata record (msgpack: {error}); the "
                                    "controller's log is damaged there") from None
    if not isinstance(value, dict):
        raise InvalidMetadataRecord(f"a metadata record is a map, got {_kind(value)}")
    version, name = value.pop("v", None), value.pop("type", None)
    if version != RECORD_VERSION:
        raise InvalidMetadataRecord(
            f"metadata record version {version!r} is not {RECORD_VERSION}, the only one "
            "this mqlog reads: a newer mqlog wrote it (upgrade this controller)")
    cls = RECORD_TYPES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise InvalidMetadataRecord(f"unknown metadata record type {name!r}")
    return _build(cls, value, name)


def _build(cls: type, value: dict[str, Any], where: str) -> Any:
    fields = {item.name: item for item in dataclasses.fields(cls)}
    # (a field added later has a default: records written before it lack it)
    required = {name for name, item in fields.items()
                if item.default is dataclasses.MISSING or item.name in _FIRST_FIELDS}
    if not required <= set(value) <= set(fields):
        missing, extra = sorted(required - set(value)), sorted(set(value) - set(fields))
        raise InvalidMetadataRecord(f"{where}: fields missing {missing}, unexpected {extra}")
    return cls(**{name: _field(fields[name].type, value[name], f"{where}.{name}")
                  for name in fields if name in value})


# Fields with a default that were there from the first version: still required.
_FIRST_FIELDS = frozenset({"rack"})


_NESTED = {"BrokerInfo": BrokerInfo, "PartitionInfo": PartitionInfo, "TopicInfo": TopicInfo}


def _field(kind: Any, value: Any, where: str) -> Any:
    """Check one field against its annotation (a string: ``from __future__``)."""
    if kind == "str":
        if isinstance(value, str):
            return value
    elif kind == "int":
        if isinstance(value, int) and not isinstance(value, bool) and \
                _INT64[0] <= value <= _INT64[1]:
            return value
    elif kind == "bool":
        if isinstance(value, bool):
            return value
    elif kind.startswith("tuple[") and isinstance(value, list):
        inner = kind[len("tuple["):-len(", ...]")]
        return tuple(_field(inner, item, f"{where}[{index}]")
                     for index, item in enumerate(value))
    elif kind in _NESTED and isinstance(value, dict):
        return _build(_NESTED[kind], value, where)
    raise InvalidMetadataRecord(f"{where} must be {kind}, got {_kind(value)}")


def _kind(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"
