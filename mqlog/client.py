"""``mqlog.Client``: talk to a node (``mqlog node``) over TCP.

A blocking client, one connection per Client, safe for one thread at a time. Requests
and responses are wire frames (docs/FORMAT.md); the node's protocol is in
mqlog/replication/node.py. A node's typed error comes back as the same class from
``mqlog.errors`` (NotMaster, InvalidTopic, ...), with the node's message.

    with mqlog.Client("127.0.0.1:7001") as client:
        result = client.produce("orders", b"...", key="order-17")
        if result.status is PutStatus.PUT_OK: ...
        records = client.fetch("orders", 0, offset=0, max_count=100)
"""

from __future__ import annotations

import math
import select
import socket
from collections import deque
from typing import Any, TypeGuard

from mqlog import errors, ext
from mqlog.replication.node import acks_of, check_producer_tag, split_address
from mqlog.replication.wire import Frame, FrameDecoder, encode_frame
from mqlog.results import PutResult, PutStatus

ANSWERS_KEPT = 100  # acks=0 refusals kept for the caller to look at (the newest)



def readable(fds: list[int], timeout_s: float) -> list[int]:
    """Those of ``fds`` that can be read without blocking, waiting at most ``timeout_s``
    for one. ``poll``, not ``select``: select refuses a descriptor numbered 1024 or more,
    which any process holding that many files has (a ValueError, after a request was
    sent: an untyped error for a write that may be stored)."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return [fd for fd, _events in poller.poll(max(0, math.ceil(timeout_s * 1000)))]

class Client:
    def __init__(self, address: str, timeout_s: float = 30.0,
                 frame_size_bytes_max: int = 64 << 20, group: str | None = None) -> None:
        check_positive("timeout_s", timeout_s)
        self.address, self.timeout_s = address, timeout_s
        self.group = group  # the broker's replica group every request names (None: default)
        host, port = split_address(address)
        try:
            self._socket = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as error:
            raise errors.NodeUnavailable(f"cannot reach the node at {address}: "
                                         f"{error.strerror or error}") from None
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._decoder = FrameDecoder(frame_size_bytes_max)
        self._next_id = 0
        self._core = ext.load()
        # Answers to acks=0 writes (sent without waiting): only refusals and errors come
        # back; the newest ANSWERS_KEPT are kept here, ``refused`` counts them all.
        self.refusals: deque[errors.MqlogError | str] = deque(maxlen=ANSWERS_KEPT)
        self.refused = 0
        # Requests sent with ``send_request`` and not answered yet; their answers, when a
        # ``call`` reads them first, wait in ``_answered`` for ``take_answers``.
        self.outstanding: set[int] = set()
        self._answered: deque[Frame] = deque()

    def produce(self, topic: str, body: bytes, queue_id: int = 0, key: str | None = None,
                tags: str | None = None, acks: str | int = "replicated",
                producer: tuple[str, int] | tuple[str, int, int] | None = None,
                ) -> PutResult:
        """Store one record on the master (the leader). ``acks="all"`` (-1; mqlog's
        older word "replicated", the default) answers by the layer's rule (a SYNC_MASTER
        waits for its slaves, a Raft leader for a majority, an ISR leader for its ISR);
        ``acks="1"`` (1, "master") once the leader stored it; ``acks="0"`` (0) sends it
        and returns at once, PUT_OK with position and offset -1: nothing is known of its
        fate (a refusal comes back later and lands in ``refusals``; Kafka's acks=0).
        ``producer=(producer_id, sequence, epoch)`` makes it idempotent (on every
        replicated layer): a retry with the same triple is answered with the first write's
        place, not stored again. ``epoch`` is the life of ``producer_id``: take one
        ``mqlog.new_producer_epoch()`` per life (per process that writes with that id),
        never one per connection; a lower epoch than one stored is refused with
        ProducerFenced. A pair (id, sequence) is epoch 0, the form of before epochs: a
        process restarted with the same id and pairs would have its new sequences taken
        for the old ones. A SYNC_MASTER with too few slaves in sync answers
        SLAVE_NOT_AVAILABLE with position -1: nothing was stored, a retry is safe.
        The PutResult's ``store_timestamp`` and ``size`` are the node's (its store's put
        result: the store time in ms, the bytes in its commit log); -1 when the node
        did not say (an older node) or nothing is known (acks=0)."""
        return self.produce_batch(topic, [body], queue_id, key, tags, acks, producer)

    def produce_batch(self, topic: str, bodies: list[bytes], queue_id: int = 0,
                      key: str | None = None, tags: str | None = None,
                      acks: str | int = "replicated",
                      producer: tuple[str, int] | tuple[str, int, int] | None = None,
                ) -> PutResult:
        """``produce`` for many records of one queue in one request."""
        request = produce_request(topic, bodies, queue_id, key, tags, acks, producer)
        if request[0].get("acks") == "0":
            self.send_only(*request)
            return PutResult(PutStatus.PUT_OK, -1, -1, -1, -1)
        return put_result(self.call(*request)[0])

    def send_only(self, header: dict[str, Any], payload: bytes = b"") -> None:
        """Send a request that is not answered unless refused (a produce with acks=0);
        answers already here to earlier ones are taken in first (``refusals``)."""
        self._stamp(header)
        try:
            self._take_waiting_answers()
            self._socket.sendall(encode_frame(header, payload))
        except OSError as error:
            raise self._lost(error) from None

    def send_request(self, header: dict[str, Any], payload: bytes = b"") -> int:
        """Send a request without waiting for its answer (several may be in flight);
        returns its id. Its answer comes from ``take_answers``: take them while sending
        many, as a broker reads no more of a connection whose answers wait unread or that
        has ``client_requests_in_progress_max`` requests in progress (docs/CLUSTER.md,
        Connections), and this call then blocks up to the timeout."""
        self._stamp(header)
        try:
            self._socket.sendall(encode_frame(header, payload))
        except OSError as error:
            raise self._lost(error) from None
        self.outstanding.add(self._next_id)
        return self._next_id

    def take_answers(self, wait: bool) -> list[Frame]:
        """Answers to ``send_request``'s requests that are here (with ``wait``: read the
        socket once first — call it when ``fileno()`` is readable, or it waits up to the
        timeout). NodeUnavailable if the connection broke or timed out."""
        try:
            while isinstance(frame := self._decoder.next_frame(), Frame):
                self._note_earlier(frame)
            if wait and not self._answered:
                self._read_some()
        except OSError as error:
            raise self._lost(error) from None
        answers, self._answered = list(self._answered), deque()
        return answers

    def fileno(self) -> int:
        return self._socket.fileno()

    def fetch(self, topic: str, queue_id: int = 0, offset: int = 0, max_count: int = 32,
              max_bytes: int = 1 << 20, leader_only: bool = False) -> list:
        """Records of one queue from ``offset``, each checked by its CRC on arrival.
        ``leader_only``: a replica that does not lead refuses (NotLeader, naming the
        leader it knows) instead of serving what is below its own high watermark."""
        for name, value in (("queue_id", queue_id), ("offset", offset),
                            ("max_count", max_count), ("max_bytes", max_bytes)):
            check_wire_int(name, value)
        request = {"kind": "fetch", "topic": topic, "queue_id": queue_id, "offset": offset,
                   "max_count": max_count, "max_bytes": max_bytes}
        if leader_only:
            request["leader_only"] = True
        header, payload = self.call(request)
        records, at = [], 0
        for _ in range(header["count"]):
            size = int.from_bytes(payload[at:at + 4], "little")
            record = self._core.Record(payload[at:at + size])
            if self._core.crc32c(payload[at + 12:at + size]) != \
                    int.from_bytes(payload[at + 8:at + 12], "little"):
                raise errors.CorruptRecord(record.position, "CRC32C mismatch in transit")
            records.append(record)
            at += size
        return records

    def metadata(self) -> dict[str, Any]:
        return self.call({"kind": "metadata"})[0]

    def promote(self, role: str = "SYNC_MASTER", slaves: tuple[str, ...] = (),
                epoch: int = 0) -> dict:
        """Operator command: make this node (a slave) the master of ``slaves``, in
        ``epoch`` if given (above every node's), else one above its own."""
        return self.call({"kind": "promote", "role": role, "slaves": list(slaves),
                          "epoch": epoch})[0]

    def follow(self, master: str) -> dict:
        """Operator command: make this node a slave of ``master``."""
        return self.call({"kind": "follow", "master": master})[0]

    def transfer(self, target: str) -> dict:
        """Operator command: this Raft leader hands leadership to voter ``target``."""
        return self.call({"kind": "transfer", "target": target})[0]

    def change_membership(self, voters: list[str], learners: tuple[str, ...] | list[str] = (),
                          addresses: dict[str, str] | None = None) -> dict:
        """Operator command: this Raft leader changes the group to ``voters`` and
        ``learners`` (one voter added or removed per change; a new voter must first be a
        caught-up learner); ``addresses`` names new members' host:port."""
        return self.call({"kind": "membership", "voters": list(voters),
                          "learners": list(learners), "addresses": dict(addresses or {})})[0]

    def close(self) -> None:
        self._socket.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def call(self, header: dict[str, Any], payload: bytes = b"",
             timeout_s: float | None = None) -> tuple[dict, bytes]:
        """Send one request frame and return the answer (header, payload); a node's
        error comes back raised as its mqlog.errors class. ``timeout_s``: this call's
        own, shorter than the connection's (a caller's deadline nearer than it)."""
        self._stamp(header)
        if timeout_s is not None:
            self._socket.settimeout(max(0.001, min(timeout_s, self.timeout_s)))
        try:
            self._socket.sendall(encode_frame(header, payload))
            frame = self._receive()
            while frame.header.get("id") != self._next_id:
                self._note_earlier(frame)  # (an acks=0 write's refusal)
                frame = self._receive()
        except OSError as error:
            raise self._lost(error) from None
        finally:
            if timeout_s is not None:
                self._socket.settimeout(self.timeout_s)
        if frame.header.get("kind") == "error":
            raise error_of(frame.header)
        return frame.header, frame.payload

    def _stamp(self, header: dict[str, Any]) -> None:
        """The next request id, and this connection's group unless the header names one."""
        self._next_id += 1
        header["id"] = self._next_id
        if self.group is not None:
            header.setdefault("group", self.group)

    def _lost(self, error: OSError) -> errors.NodeUnavailable:
        return errors.NodeUnavailable(f"lost the connection to {self.address}: "
                                      f"{error.strerror or error}")

    def _note_earlier(self, frame: Frame) -> None:
        """An answer to an earlier request: a ``send_request``'s (kept for
        ``take_answers``), or an acks=0 write's refusal (a call reads its own answer
        before it returns; or the late answer of a call that timed out, kept the same
        way); an id never sent, or one still to come, is garbage."""
        answered = frame.header.get("id")
        if isinstance(answered, int) and answered in self.outstanding:  # see take_answers
            self.outstanding.discard(answered)
            self._answered.append(frame)
            return
        if not isinstance(answered, int) or not 0 < answered < self._next_id:
            raise errors.RemoteProtocolError("a response answered another request")
        self.refused += 1
        self.refusals.append(error_of(frame.header) if frame.header.get("kind") == "error"
                             else str(frame.header.get("status")))

    def _take_waiting_answers(self) -> None:
        """Read, without waiting, the answers already on the socket (acks=0 refusals)."""
        while readable([self._socket.fileno()], 0):
            self._read_some()

    def _read_some(self) -> None:
        """What one read of the socket brings, each frame an earlier request's answer."""
        data = self._socket.recv(1 << 16)
        if not data:
            raise ConnectionResetError(0, "the node closed the connection")
        self._decoder.feed(data)
        while isinstance(frame := self._decoder.next_frame(), Frame):
            self._note_earlier(frame)

    def _receive(self) -> Frame:
        while not isinstance(frame := self._decoder.next_frame(), Frame):
            data = self._socket.recv(1 << 16)
            if not data:
                raise ConnectionResetError(0, "the node closed the connection")
            self._decoder.feed(data)
        return frame


def produce_request(topic: str, bodies: list[bytes], queue_id: int = 0,
                    key: str | None = None, tags: str | None = None,
                    acks: str | int = "replicated",
                    producer: tuple[str, int] | tuple[str, int, int] | None = None,
                    ) -> tuple[dict[str, Any], bytes]:
    """The header and payload of a produce request (docs/FORMAT.md); fields left at
    their defaults (no key, no tags, acks "replicated") are left out. ``acks`` in Kafka's
    words or mqlog's (InvalidArgument for anything else) goes as the node's word."""
    check_wire_int("queue_id", queue_id)
    payload = _joined(bodies)
    header: dict[str, Any] = {"kind": "produce", "topic": topic, "queue_id": queue_id,
                              "sizes": [len(body) for body in bodies]}
    if key is not None:
        header["key"] = key
    if tags is not None:
        header["tags"] = tags
    acks = acks_of(acks)
    if acks != "replicated":
        header["acks"] = acks
    if producer is not None:
        producer_id, sequence, epoch = _producer(producer)
        header["producer_id"], header["sequence"] = producer_id, sequence
        if epoch:  # (epoch 0, the form of before, left out)
            header["producer_epoch"] = epoch
    return header, payload


def _joined(bodies: Any) -> bytes:
    """The bodies, one after the other, if ``bodies`` is a list or tuple of bytes-like
    bodies, else InvalidArgument (a str, or one bytes object where a list belongs, was an
    untyped TypeError). The join checks each body's type itself, in C: a check per body
    in Python cost the client 0.13 us a record, a third of its CPU."""
    if not isinstance(bodies, list | tuple):
        raise errors.InvalidArgument(f"bodies must be a list of bytes, got "
                                     f"{type(bodies).__name__}")
    try:
        return b"".join(bodies)
    except TypeError as error:  # (names the first body it could not take)
        raise errors.InvalidArgument(f"bodies must be bytes (encode text first; a "
                                     f"memoryview must be contiguous): {error}") from None


def check_wire_int(name: str, value: Any) -> None:
    """An int a request carries: a non-negative int64 (msgpack cannot carry one of 2**64
    or more: that was an untyped OverflowError)."""
    if not _is_int(value) or not 0 <= value < 1 << 63:
        raise errors.InvalidArgument(f"{name} must be an int from 0 to 2**63 - 1, got "
                                     f"{value!r}")


def check_positive(name: str, value: Any) -> None:
    """A time or an interval: a finite number above 0 (nan and inf passed ``> 0`` checks
    and then failed untyped, or waited forever)."""
    if not isinstance(value, int | float) or isinstance(value, bool) or \
            not math.isfinite(value) or value <= 0:
        raise errors.InvalidArgument(f"{name} must be a finite number above 0, got {value!r}")


def _producer(producer: Any) -> tuple[str, int, int]:
    """A produce's (producer_id, sequence[, epoch]), checked as the node checks it, before
    anything is sent (an int msgpack cannot carry was an untyped OverflowError)."""
    if not isinstance(producer, tuple | list) or len(producer) not in (2, 3):
        raise errors.InvalidArgument(f"producer must be (producer_id, sequence) or "
                                     f"(producer_id, sequence, epoch), got {producer!r}")
    epoch = producer[2] if len(producer) == 3 else 0
    return check_producer_tag(producer[0], producer[1], epoch)


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def put_result(header: dict[str, Any]) -> PutResult:
    """A node's produce answer as a PutResult: its status and place, its store time (ms)
    and size in bytes — -1 for those two when the node did not send them (one older than
    the fields: it sent status, position, offset and count only)."""
    return PutResult(PutStatus(header["status"]), header["position"], header["offset"],
                     *answer_facts(header))


def answer_facts(header: dict[str, Any]) -> tuple[int, int]:
    """(store_timestamp, size) of a produce answer; -1 for each the node did not send."""
    stamp, size = header.get("store_timestamp"), header.get("size")
    return (stamp if _is_int(stamp) else -1), (size if _is_int(size) else -1)


def error_of(header: dict[str, Any]) -> errors.MqlogError:
    """The typed error a node's error answer stands for (its mqlog.errors class)."""
    cls = getattr(errors, str(header.get("error")), None)
    message = str(header.get("message"))
    if cls is errors.NotLeader:
        return errors.NotLeader(message, leader=header.get("leader"),
                                leader_address=header.get("leader_address"))
    if cls is errors.PartiallyStored:  # (-1: an older node that did not say where)
        count, position, offset = (header.get(name) for name in ("count", "position",
                                                                  "offset"))
        return errors.PartiallyStored(message, count if _is_int(count) else 0,
                                      position if _is_int(position) else -1,
                                      offset if _is_int(offset) else -1)
    if cls is errors.OffsetOutOfRange:  # (-1: an older node that did not say)
        low, high = (header.get(name) for name in ("min_offset", "max_offset"))
        return errors.OffsetOutOfRange(message, min_offset=low if _is_int(low) else -1,
                                       max_offset=high if _is_int(high) else -1)
    if isinstance(cls, type) and issubclass(cls, errors.MqlogError):
        try:
            return cls(message)
        except TypeError:  # an error class that needs more than a message
            pass
    return errors.RemoteError(f"{header.get('error')}: {message}")
