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
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from mqlog.errors import RemoteProtocolError
from mqlog.replication.wire import Frame, encode_frame


@dataclass(frozen=True)
class Message:
    kind: ClassVar[str] = ""
    src: str
    dst: str
    epoch: int  # the sender's epoch (the highest it has seen)


@dataclass(frozen=True)
class Hello(Message):
    kind: ClassVar[str] = "hello"
    position: int  # the slave's written position
    last_epoch: int  # epoch of the record that ends there (-1: empty log)


@dataclass(frozen=True)
class Append(Message):
    kind: ClassVar[str] = "append"
    position: int
    payload: bytes = field(default=b"", repr=False)


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


KINDS: dict[str, type[Message]] = {cls.kind: cls for cls in (Hello, Append, Report, Truncate)}
_TYPES = {"str": str, "int": int, "bytes": bytes}


def encode(message: Message) -> bytes:
    """The frame that carries ``message``."""
    header: dict[str, Any] = {"kind": message.kind}
    payload = b""
    for item in dataclasses.fields(message):
        if item.name == "payload":
            payload = message.payload  # type: ignore[attr-defined]
        else:
            header[item.name] = getattr(message, item.name)
    return encode_frame(header, payload)


def decode(frame: Frame) -> Message:
    """The message a frame carries; RemoteProtocolError if it is not a valid one."""
    header = dict(frame.header)
    cls = KINDS.get(header.pop("kind", None))  # type: ignore[arg-type]
    if cls is None:
        raise RemoteProtocolError(f"unknown message kind {frame.header.get('kind')!r}")
    names = {item.name: item.type for item in dataclasses.fields(cls)}
    if "payload" in names:
        header["payload"] = frame.payload
    if set(header) != set(names):
        raise RemoteProtocolError(f"{cls.kind} message has fields {sorted(header)}, "
                                  f"expected {sorted(names)}")
    for name, value in header.items():
        wanted = _TYPES[str(names[name])]
        if not isinstance(value, wanted) or isinstance(value, bool):
            raise RemoteProtocolError(f"{cls.kind}.{name} must be {wanted.__name__}")
    return cls(**header)
