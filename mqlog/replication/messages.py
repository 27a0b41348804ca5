"""Replication messages: frozen dataclasses (h11's events), carried one per frame.

A message's fields go in the frame header (with ``kind``); ``payload`` — raw log bytes —
in the frame payload. ``decode`` checks the kind, the field names and their types, so a
core only ever sees well-formed messages; anything else is a RemoteProtocolError.

Master-slave (RocketMQ HA, with epochs added so divergence is found):

* ``Hello`` slave→master on (re)connect: where the slave's log ends and the epoch of its
  last record; the master answers with ``Truncate`` if the slave diverged, else streams.
* ``Append`` master→slave: raw records that go at ``position`` (the slave's end).
* ``Report`` slave→master: the slave's written and flushed positions (the ack).
* ``Truncate`` master→slave: cut the log back to where epoch ``last_epoch`` ends (the
  newest both have: ``position`` in the master's log, maybe sooner in the slave's),
  then say Hello again.
* ``Pull`` master→slave, from a master that restarted: "does your log extend mine, which
  ends at ``position`` with ``last_epoch``? send me up to ``max_bytes`` from there".
* ``Pulled`` the answer (any node answers; only the master's own slave sends records):
  where its log ends (``end``, ``last_epoch``), whether its record ending at
  ``position`` has the epoch asked (``agrees``: then its log extends the master's), and
  the raw records from ``position`` (``payload``; ``payload_epoch`` is the epoch of the
  record that ends it, -1 if none).

Raft (etcd raft's messages, with positions for indexes and epochs for terms):

* ``Vote`` a (pre-)candidate asks for a vote: where its log ends and that record's
  epoch; ``pre_vote`` asks "would you?" without anyone changing term; ``transfer`` marks
  a leadership transfer, which voters grant even while they hear from a leader.
* ``VoteReply`` yes or no.
* ``Entries`` (AppendEntries) raw records that follow ``prev_position`` (whose record has
  ``prev_epoch``); every record in one payload has ``entries_epoch``; ``commit`` is the
  leader's committed position; ``memberships`` describes the membership-change records
  among the payload's (position, voters, learners, addresses). An empty payload is a
  heartbeat and a probe.
* ``EntriesReply`` success: the log agrees with the leader's up to ``match`` (durable,
  when followers ack flushed data). Failure: the log agrees at most up to
  ``hint_position``, the end of its newest epoch not newer than ``prev_epoch``
  (``hint_epoch``) — one round trip per diverged epoch, as in KIP-279.
* ``TimeoutNow`` leadership transfer: campaign now.
* ``LogReset`` (InstallSnapshot, for a log) the follower needs records the leader's
  retention let go: start the log over, empty, at the leader's log start ``position``;
  the record that ends there has ``last_epoch``, which starts at ``last_epoch_start``;
  ``memberships`` are the changes in force there. Answered by an ``EntriesReply``.

ISR (Kafka's fetch protocol, KIP-101/279/320; isr/core.py):

* ``Fetch`` follower→leader: send me the records from ``position`` (my log's end), whose
  record ending there has ``last_epoch``; ``epoch`` is the leader epoch the follower
  knows; ``fetch_id`` numbers its fetches (one in flight; an answer to another is stale).
* ``FetchReply`` raw records of one epoch (``records_epoch``) that go at ``position``,
  the leader's ``high_watermark`` and ``log_start``; or ``diverging_epoch`` /
  ``diverging_end`` (>= 0 when the follower's log went past the leader's for that
  epoch: truncate there and fetch again); or an ``error`` (FENCED_LEADER_EPOCH,
  UNKNOWN_LEADER_EPOCH, NOT_LEADER, INVALID_POSITION: not a record boundary of the
  leader's log, CORRUPT_MESSAGE: the leader's copy of a record there is damaged (fetch
  again after a backoff), OFFSET_OUT_OF_RANGE: the fetch is before the
  leader's log start, whose record ends with ``start_epoch``, begun at
  ``start_epoch_start``: start the log over there).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from mqlog.engine.files import FileExtent
from mqlog.errors import RemoteProtocolError
from mqlog.replication.wire import (
    WRITTEN_APART_BYTES,
    Frame,
    encode_frame,
    encode_frame_head,
    encode_frame_head_of,
)


@dataclass(frozen=True)
class Message:
    kind: ClassVar[str] = ""
    src: str
    dst: str
    epoch: int  # the sender's epoch (the highest it has seen)
    # The sender's group (``cluster_id`` of its config): a core drops, and counts, a
    # message from another cluster, whatever its epoch or sender name.
    cluster_id: str = field(default="", kw_only=True)


@dataclass(frozen=True)
class Hello(Message):
    kind: ClassVar[str] = "hello"
    position: int  # the slave's written position
    last_epoch: int  # epoch of the record that ends there (-1: empty log)


@dataclass(frozen=True)
class Append(Message):
    kind: ClassVar[str] = "append"
    position: int
    payload: bytes | FileExtent = field(default=b"", repr=False)  # (FetchReply's says)


@dataclass(frozen=True)
class Report(Message):
    kind: ClassVar[str] = "report"
    written: int
    flushed: int


@dataclass(frozen=True)
class Truncate(Message):
    kind: ClassVar[str] = "truncate"
    position: int  # where the master's ``last_epoch`` ends
    last_epoch: int  # the newest epoch both logs have (-1: none)


@dataclass(frozen=True)
class Pull(Message):
    kind: ClassVar[str] = "pull"
    position: int  # the master's log end
    last_epoch: int  # epoch of the master's record ending there (-1: none)
    max_bytes: int  # 0: only say where your log ends


@dataclass(frozen=True)
class Pulled(Message):
    kind: ClassVar[str] = "pulled"
    position: int  # the position asked about (the payload starts there)
    agrees: bool  # the record ending at ``position`` has the epoch asked
    end: int  # the answering node's written position
    last_epoch: int  # epoch of its record ending at ``end`` (-1: none)
    payload_epoch: int  # epoch of the record ending the payload (-1: no payload)
    payload: bytes = field(default=b"", repr=False)


@dataclass(frozen=True)
class Vote(Message):
    kind: ClassVar[str] = "vote"
    position: int  # the candidate's log end
    last_epoch: int  # epoch of the record that ends there (-1: empty log)
    pre_vote: bool
    transfer: bool


@dataclass(frozen=True)
class VoteReply(Message):
    kind: ClassVar[str] = "vote_reply"
    granted: bool
    pre_vote: bool


@dataclass(frozen=True)
class Entries(Message):
    kind: ClassVar[str] = "entries"
    prev_position: int
    prev_epoch: int  # epoch of the record ending at prev_position (-1: none)
    entries_epoch: int  # epoch of every record in the payload (-1: no records)
    commit: int
    memberships: bytes = b""  # msgpack: the membership changes among the payload's records
    payload: bytes | FileExtent = field(default=b"", repr=False)  # (FetchReply's says)


@dataclass(frozen=True)
class EntriesReply(Message):
    kind: ClassVar[str] = "entries_reply"
    success: bool
    match: int
    hint_position: int
    hint_epoch: int


@dataclass(frozen=True)
class TimeoutNow(Message):
    kind: ClassVar[str] = "timeout_now"


@dataclass(frozen=True)
class LogReset(Message):
    kind: ClassVar[str] = "log_reset"
    position: int  # the leader's log start
    last_epoch: int  # epoch of the record that ends there (-1: none)
    last_epoch_start: int  # where that epoch starts, before ``position`` (-1: none)
    commit: int
    memberships: bytes = b""  # msgpack: the membership changes before ``position``

    def epoch_starts(self) -> list[tuple[int, int]]:
        """The epoch starts the reset log begins with (what ``Store.reset`` takes)."""
        return [(self.last_epoch, self.last_epoch_start)] if self.last_epoch >= 0 else []


@dataclass(frozen=True)
class Fetch(Message):
    kind: ClassVar[str] = "replica_fetch"  # ("fetch" is a client request)
    fetch_id: int
    position: int  # the follower's log end: send from here
    last_epoch: int  # epoch of the record that ends there (-1: none)


@dataclass(frozen=True)
class FetchReply(Message):
    kind: ClassVar[str] = "replica_fetch_reply"
    fetch_id: int
    position: int  # where the payload goes (the fetch's position)
    records_epoch: int  # epoch of every record in the payload (-1: none)
    high_watermark: int
    log_start: int
    diverging_epoch: int  # -1, or the newest epoch of the leader's <= the fetch's last_epoch
    diverging_end: int  # -1, or where that epoch ends in the leader's log
    error: str  # "" or a Kafka error name (see the module docstring)
    start_epoch: int  # OFFSET_OUT_OF_RANGE: epoch of the record ending at log_start
    start_epoch_start: int  # ... and where that epoch starts (-1: none)
    # bytes; on the leader, a large answer's records may be a FileExtent of the log's
    # segment file, sent from there (encode_pieces, Connection.write_frames)
    payload: bytes | FileExtent = field(default=b"", repr=False)


KINDS: dict[str, type[Message]] = {cls.kind: cls for cls in (
    Hello, Append, Report, Truncate, Pull, Pulled, Vote, VoteReply, Entries, EntriesReply,
    TimeoutNow, LogReset, Fetch, FetchReply)}
_TYPES = {"str": str, "int": int, "bytes": bytes, "bool": bool,
          "bytes | FileExtent": bytes}  # (received, a payload is bytes)
# The most a message's int field may carry (a term, an epoch, a position, a count), either
# sign: far above any real one, and room for every +1 a life adds to one before it is
# encoded again (a peer's term of 2**64 - 1 was adopted, and its next campaign could not
# be encoded nor its hard state read back: the node failed at every start).
NUMBER_LIMIT = 1 << 62
_FIELD_TYPES = {cls: {item.name: _TYPES[str(item.type)] for item in dataclasses.fields(cls)}
                for cls in KINDS.values()}  # message class -> {field: exact type}
# message class -> its header fields in order (all but the payload); filled on first use
_HEADER_FIELDS: dict[type[Message], tuple[str, ...]] = {}


def _header_fields(cls: type[Message]) -> tuple[str, ...]:
    names = _HEADER_FIELDS.get(cls)
    if names is None:
        names = _HEADER_FIELDS[cls] = tuple(item.name for item in dataclasses.fields(cls)
                                            if item.name != "payload")
    return names


def encode(message: Message, group: str = "", topic_id: int = 0) -> bytes:
    """The frame that carries ``message``; ``group`` names the replica group it is for
    (a broker's header key ``group``; left out, the receiving broker's default group),
    ``topic_id`` the group's topic id (left out when 0: a group of a config)."""
    return b"".join(piece if isinstance(piece, bytes) else piece.read()
                    for piece in encode_pieces(message, group, topic_id))


def encode_pieces(message: Message, group: str = "", topic_id: int = 0
                  ) -> tuple[bytes | FileExtent, ...]:
    """``encode``'s frame in the pieces a broker writes: the frame, or its head and then
    a payload of ``WRITTEN_APART_BYTES`` or more, which is not copied (a fetch answer's
    records go to two followers: two heads, one payload), or a FileExtent payload, whose
    size and CRC the head counts and which is sent from its file. (Every fetch and its
    answer is coded here: the field names are looked up once per class, not with
    ``dataclasses.fields`` per message.)"""
    header: dict[str, Any] = {"kind": message.kind}
    if group:
        header["group"] = group
    if topic_id:
        header["topic_id"] = topic_id
    values = message.__dict__
    for name in _header_fields(type(message)):
        header[name] = values[name]
    payload = values.get("payload", b"")
    if type(payload) is FileExtent:
        return encode_frame_head_of(header, payload.size, payload.crc), payload
    if len(payload) < WRITTEN_APART_BYTES or type(payload) is not bytes:  # (immutable only:
        return (encode_frame(header, payload),)  # the head's CRC counts it as it is now)
    return encode_frame_head(header, payload), payload


def decode(frame: Frame) -> Message:
    """The message a frame carries; RemoteProtocolError if it is not a valid one."""
    header = dict(frame.header)
    if type(header.pop("group", "")) is not str:  # the broker's routing, not the core's
        raise RemoteProtocolError("a message's group must be a string")
    if type(header.pop("topic_id", 0)) is not int:
        raise RemoteProtocolError("a message's topic_id must be an int")
    cls = KINDS.get(header.pop("kind", None))  # type: ignore[arg-type]
    if cls is None:
        raise RemoteProtocolError(f"unknown message kind {frame.header.get('kind')!r}")
    types = _FIELD_TYPES[cls]
    if "payload" in types:
        header["payload"] = frame.payload
    if header.keys() != types.keys():
        raise RemoteProtocolError(f"{cls.kind} message has fields {sorted(header)}, "
                                  f"expected {sorted(types)}")
    for name, value in header.items():
        if type(value) is not types[name]:  # exact: a bool is not an int here
            raise RemoteProtocolError(f"{cls.kind}.{name} must be {types[name].__name__}")
        if type(value) is int and not -NUMBER_LIMIT <= value < NUMBER_LIMIT:
            raise RemoteProtocolError(f"{cls.kind}.{name} = {value} is out of range "
                                      f"(|value| < 2**62)")
    # Every field is there and checked: the object __init__ would make, without its
    # frozen per-field setattr (a FetchReply has 14 fields; this is the fetch path).
    message = object.__new__(cls)
    message.__dict__.update(header)
    return message
