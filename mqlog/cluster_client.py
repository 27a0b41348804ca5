"""``mqlog.ClusterClient``: produce to and fetch from a cluster's topics the way a Kafka
client does — from a few bootstrap addresses, without knowing where partitions live.

Theory of operation.

* Metadata. Any broker answers ``cluster_metadata``: the cluster's metadata as its agent
  pulled it from the controller (topics, partitions, replicas, brokers and their
  addresses), with the Raft partitions' leaders as their brokers reported them
  (mqlog/replication/controller/leaders.py). The client asks the bootstrap addresses and
  every broker it has learned of, the first that answers wins, and keeps the answer for
  ``metadata_max_age_ms`` (Kafka's metadata.max.age.ms) or until a failure says it is
  stale. Refreshes are at most one per ``retry_backoff_ms`` (Kafka's retry.backoff.ms),
  so a dead leader costs no storm of metadata requests.
* Partitioning. With a key, Kafka's murmur2 partitioner (mqlog/partitioner.py), so keys
  land where a Kafka producer puts them; without one, round-robin per topic; or the
  caller names the partition.
* Sending. A partition of a Raft topic is the replica group ``TOPIC-PARTITION``; the
  write goes to the broker the metadata says leads it, over one connection per broker
  (each request names its group). NotLeader naming the leader: go there. NotLeader
  without one, UnknownGroup (a broker that has not pulled the partition yet), a broken
  connection: refresh the metadata and go to the leader it shows, or — when that is the
  broker that just failed, or one that refused this request already — the partition's
  next replica not tried yet (round the replicas, never back and forth between two),
  after ``retry_backoff_ms`` (an election takes time). A write whose outcome is unknown
  (the connection broke, the majority did not answer in time) is sent again with the
  same producer id and sequence, so the leader that has it answers with its first place
  instead of storing it twice
  (idempotence.py; Kafka's idempotent producer: one producer id, a sequence per
  partition). All of it within ``retry_timeout_s`` (Kafka's delivery.timeout.ms), plus at
  most one attempt's ``timeout_s``: an attempt under way at the deadline is waited for, as
  Kafka lets an in-flight request reach its request.timeout.ms (keep ``retry_timeout_s``
  at least ``timeout_s``, as Kafka asks of delivery.timeout.ms); after it, a typed
  error: NodeUnavailable (outcome unknown: retrying the same call is safe only through
  this client, which keeps the sequence), UnknownTopic (the metadata never showed the
  topic), InvalidArgument (a partition the topic does not have). A metadata refresh that
  no broker answers on the way is one more failed attempt (the last view seen says where
  to go next), never the request's outcome: only the deadline ends a request.
* Refused before anything is sent: a topic that is not a non-empty str, a bytes key that
  is not UTF-8 (keys are stored as text) — InvalidArgument; a request larger than
  ``frame_size_bytes_max`` (the brokers' largest frame, 16 MiB by default; a broker
  drops such a frame's connection unread) — MessageTooLarge; any call after ``close()``
  — ClientClosed (a closed client opens no connection); bootstrap addresses that are all
  controllers' or standalone nodes' — NotABroker, at once (a node that refuses
  ``cluster_metadata`` — UnknownGroup, or "unknown request kind" from its default group —
  is asked ``broker_metadata``, which every node answers: its process_roles without
  "broker" make it a controller; with "broker", a node that serves no cluster (a
  master-slave or Raft node of docs/REPLICATION.md: a cluster's broker registers
  ``cluster_metadata`` before it serves anything). Neither turns into a cluster's
  broker, so there is nothing to wait for: a standalone node was asked until
  retry_timeout_s, then called "no broker answered ...: unknown request kind").
* Producer epochs. Each client is one life of its producer id, with its own producer
  epoch (``new_producer_epoch``: the wall clock, so a client made anew with the same
  explicit ``producer_id`` — a restarted process — has a higher one, and its sequences,
  which start over at 1, are not taken for the earlier life's). A leader that has
  records of a higher epoch refuses the client's requests with ProducerFenced, nothing
  stored: another client with the same id started later. It is raised (never retried)
  from ``result``, and from every later ``send`` and ``flush``: a fenced client sends
  nothing new, and what waited to be sent again fails with it.
* Every layer. A partition of any layer is the group ``TOPIC-PARTITION`` on its
  replicas' brokers: an ISR partition's leader is the controller's (in the metadata), a
  master-slave partition's the master the controller promoted (a slave answers NotMaster:
  refresh), a Raft partition's the one reported.
* acks (Kafka's words; docs/CLUSTER.md has the table). "all" waits for the layer's rule
  (on an ISR partition: the high watermark). NotEnoughReplicas (nothing stored) is the
  caller's to decide on, raised at once — unless an earlier attempt of the same write may
  have stored it, when "nothing stored" does not hold and it is retried. An attempt
  that failed before the request left (no connection to the broker could be made, or
  the send failed: a broker takes a whole frame or nothing) stored nothing, and does not
  count as one that may have. A master-slave partition's master with too few slaves in
  sync answers SLAVE_NOT_AVAILABLE before storing (position -1; its NotEnoughReplicas):
  sent again after ``retry_backoff_ms`` while its slaves may join (a new partition, a
  promotion: they catch up in a moment), SlaveNotAvailable (a NotEnoughReplicas) at
  once when the metadata shows the brokers of its other replicas fenced, or at
  ``retry_timeout_s``; and a request that no attempt can have stored ends, at its
  deadline, in an error that says nothing was stored — never "outcome unknown". The ISR answers
  NOT_ENOUGH_REPLICAS_AFTER_APPEND and REQUEST_TIMED_OUT mean stored, may still commit:
  sent again with the same sequence within ``retry_timeout_s``, then raised as their
  typed errors. "1": the leader stored it. "0": handed to the leader's connection, not
  answered (Client.send_only); a refusal read later refreshes the metadata.
* Results. A ``ProducedRecord`` has the partition, status, position and offset, and the
  leader's ``store_timestamp`` and ``size`` (a store's PutResult's: the store time in
  ms of the request's records, the bytes they take); -1 for those when not known
  (acks=0, a broker that does not send them, a request whose first records a cut copy
  holds).
* Reading. ``fetch`` reads a partition from its leader (Raft followers do not serve
  reads), with the same moving on; on ISR partitions ``replica=`` reads from a follower
  (KIP-392: a named broker, or "nearest", the client's rack) up to that follower's high
  watermark, and from the leader if it cannot serve.

* Pipelining (Kafka's max.in.flight.requests.per.connection with idempotence).
  ``send``/``send_batch`` return at once with a ``PendingProduce``; up to
  ``max_in_flight_requests`` requests per partition (5, Kafka's default) are in flight,
  and ``produce`` is ``send(...).result()``. Order and exactly-once storage hold as with
  one in flight: each request after the first still undecided names that one's sequence
  (``previous``), and a leader that has not stored it refuses the request with
  SequenceGap, nothing stored (node.py; Kafka's OutOfOrderSequence). So when a request
  is refused (NotLeader, NotEnoughReplicas) or lost with its connection, the ones sent
  behind it are refused too, and all go again in sequence order, each with its own
  sequence (a retry of one stored already is answered with its first place). A request
  that waits for a back-off holds back the ones after it. A request with nothing
  undecided before it names none: a leader that does not know the producer (it never
  wrote there, or beyond the leader's ``idempotence_window_bytes``) takes it. acks=0
  sends are not pipelined: they go at once, as before, and may pass undecided ones.
  A request whose copy on a new leader was cut inside it by the failover (refused
  PartiallyStored once that copy is committed) has its rest sent as a new request, at
  the head, and the ones behind it again after it, each with a new sequence
  (``_send_the_rest``): a request names its predecessor's record count too
  (``previous_count``), so a leader holding the cut copy refuses those behind it.

Threads may share a client, as Kafka's producer (its requests move on only inside its
calls: ``send``, ``result``, ``flush``): each call holds the client's lock, so calls from
several threads take turns, and a thread waiting in ``result`` moves every thread's
requests on. (Before the lock, two threads calling at the same time could fail with an
untyped ValueError, or hang.) ``close`` does not wait its turn: it wakes a thread waiting
for answers (a byte down a pipe that every wait watches), which lets the lock go, and
then decides what is undecided.
"""

from __future__ import annotations

import functools
import os
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from mqlog import errors
from mqlog.client import Client, answer_facts, check_positive, error_of, produce_request, readable
from mqlog.ext import wire as codec
from mqlog.group_client import RETRIED, STORED_UNDECIDED, not_stored, nothing_stored, undecided
from mqlog.partitioner import RoundRobin, choose_partition
from mqlog.replication.controller import records
from mqlog.replication.controller.leaders import LeaderTable, leaders_from
from mqlog.replication.controller.records import Snapshot
from mqlog.replication.controller.state import ClusterMetadata
from mqlog.replication.idempotence import new_producer_epoch
from mqlog.replication.node import acks_of, check_producer_tag
from mqlog.results import PutStatus


@dataclass(frozen=True)
class ProducedRecord:
    """Where a record went (Kafka's RecordMetadata): its partition and place, and (as a
    store's PutResult) the store time in ms of the request's records and the bytes they
    take in the commit log. -1: not known (acks=0; a broker older than those fields; a
    request whose first records a failover's cut copy holds, its rest stored apart)."""

    topic: str
    partition: int
    status: PutStatus
    position: int
    offset: int
    store_timestamp: int = -1
    size: int = -1


# A pipelined request names its predecessor (node.py's SequenceGap), which the leader
# finds in its producer table while it remembers it: idempotence_sequences_max (1024 by
# default) sequences per producer. A window far below that keeps every predecessor there.
IN_FLIGHT_REQUESTS_MAX = 100
# The brokers' largest frame by default (config.py's frame_size_bytes_max): a broker closes
# a connection that announces a larger one, unread.
FRAME_SIZE_BYTES_MAX = 16 << 20
# What a request's header gains once sent: its id, its group, and the sequence before it
# (``previous``, an int64 at its largest) with that request's record count
_STAMP_PROBE = {"id": 1 << 62, "previous": 1 << 62, "previous_count": 1 << 31}


@dataclass
class _Attempts:
    """What the attempts of one request so far tell (a produce's or a fetch's)."""

    maybe_stored: bool = False  # an earlier attempt may have stored it
    last: PutStatus | None = None  # the last undecided answer (stored, may still commit)
    failures: list[str] = field(default_factory=list)
    # Brokers that refused it without naming a leader: go round the replicas
    tried: set[str] = field(default_factory=set)


@dataclass(eq=False)
class _Produce:
    """One produce request, from ``send_batch`` until decided."""

    topic: str
    partition: int
    header: dict[str, Any]
    payload: bytes
    sequence: int
    deadline: float  # (monotonic) retry_timeout_s after it was made
    address: str | None = None  # the broker whose answer it waits for (None: not sent)
    sent_at: float = 0.0
    next_address: str | None = None  # where it goes next (None: the leader shown then)
    not_before: float = 0.0  # (monotonic) the end of its back-off
    attempts: _Attempts = field(default_factory=_Attempts)
    # (position, offset) of its first record, stored by a copy cut inside it: the rest
    # went again (_send_the_rest)
    first: tuple[int, int] | None = None
    outcome: ProducedRecord | None = None
    error: errors.MqlogError | None = None


class PendingProduce:
    """A produce request sent and maybe not answered yet (Kafka's send() future)."""

    def __init__(self, client: ClusterClient, request: _Produce) -> None:
        self._client, self._request = client, request

    @property
    def sequence(self) -> int:
        return self._request.sequence

    def done(self) -> bool:
        """Whether its outcome is known (without waiting or reading the connections)."""
        return self._request.outcome is not None or self._request.error is not None

    def result(self) -> ProducedRecord:
        """Wait for the outcome (the client's other requests move on meanwhile); raise
        the request's typed error if it failed (``produce``'s errors)."""
        request, client = self._request, self._client
        with client._lock:
            while not self.done() and not client._closed:
                assert request in client._pipelines.get(
                    (request.topic, request.partition), ()), "an undecided request was lost"
                client._pump(wait=True)
        if not self.done():  # closed from another thread: close() decides it
            client._closed_all.wait()
        if self._request.error is not None:
            raise self._request.error
        assert self._request.outcome is not None
        return self._request.outcome


def _close_fds(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


def group_of(topic: str, partition: int) -> str:
    """The replica group that serves a Raft topic's partition on its brokers."""
    return f"{topic}-{partition}"


def check_topic(topic: Any) -> None:
    """InvalidArgument for a topic that is not a non-empty str: looked up in the
    metadata, it was waited for until retry_timeout_s and then called unknown."""
    if not isinstance(topic, str) or not topic:
        raise errors.InvalidArgument(f"topic must be a non-empty string, got {topic!r}")


def text_of_key(key: Any) -> Any:
    """A key as stored (text): bytes decoded from UTF-8, InvalidArgument if they are not
    UTF-8 (decoded with replacement, the bytes keys ff and fe were stored as one key)."""
    if not isinstance(key, bytes):
        return key  # (str or None; anything else is refused where it is used)
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError as error:
        raise errors.InvalidArgument(f"a bytes key must be UTF-8 (keys are stored as "
                                     f"text): {key[:32]!r} is not ({error.reason}); "
                                     "pass its text, or encode it, e.g. in hex") from None


def metadata_from(answer: dict[str, Any]) -> tuple[ClusterMetadata, list[Any]]:
    """A ``cluster_metadata`` (or ``describe_cluster``) answer: the folded state and the
    reported leaders (``LeaderTable.overlay`` lays them over it)."""
    try:
        snapshot = records.decode(answer["snapshot"])
        position = answer["position"]
        leaders = leaders_from(answer.get("leaders"))
        if not isinstance(snapshot, Snapshot) or not isinstance(position, int):
            raise TypeError("its snapshot is not a Snapshot record, or its position no int")
        return ClusterMetadata().apply(snapshot, position), leaders
    except (KeyError, TypeError, errors.InvalidArgument, errors.InvalidMetadataRecord) as error:
        raise errors.RemoteProtocolError(f"a malformed metadata answer: {error!r}") from None


Method = TypeVar("Method", bound=Callable[..., Any])


def _serialized(method: Method) -> Method:
    """The method holds its client's lock (re-entrant: methods call each other)."""
    @functools.wraps(method)
    def locked(self: ClusterClient, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)
    return cast(Method, locked)


class ClusterClient:
    def __init__(self, bootstrap: str | list[str], *, producer_id: str | None = None,
                 retry_timeout_s: float = 30.0, retry_backoff_ms: int = 100,
                 metadata_max_age_ms: int = 5_000, timeout_s: float = 5.0,
                 acks: str | int = "all", client_rack: str = "",
                 max_in_flight_requests: int = 5,
                 frame_size_bytes_max: int = FRAME_SIZE_BYTES_MAX) -> None:
        if not isinstance(bootstrap, str | list | tuple) or not all(
                isinstance(item, str) for item in bootstrap):
            raise errors.InvalidArgument(f"bootstrap must be 'host:port[,...]' or a list of "
                                         f"host:port strings, got {bootstrap!r}")
        addresses = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
        self.bootstrap = [item.strip() for item in addresses if item and item.strip()]
        if not self.bootstrap:
            raise errors.InvalidArgument("a ClusterClient needs at least one bootstrap "
                                         "address host:port")
        for name, value in (("retry_timeout_s", retry_timeout_s), ("timeout_s", timeout_s),
                            ("retry_backoff_ms", retry_backoff_ms),
                            ("metadata_max_age_ms", metadata_max_age_ms)):
            check_positive(name, value)
        if not isinstance(max_in_flight_requests, int) or \
                isinstance(max_in_flight_requests, bool) or \
                not 1 <= max_in_flight_requests <= IN_FLIGHT_REQUESTS_MAX:
            raise errors.InvalidArgument(
                f"max_in_flight_requests must be an int from 1 to {IN_FLIGHT_REQUESTS_MAX} "
                f"(requests in flight per partition), got {max_in_flight_requests!r}")
        if not isinstance(client_rack, str):
            raise errors.InvalidArgument(f"client_rack must be a rack name, got "
                                         f"{client_rack!r}")
        if not isinstance(frame_size_bytes_max, int) or \
                isinstance(frame_size_bytes_max, bool) or frame_size_bytes_max < 1024:
            raise errors.InvalidArgument(
                f"frame_size_bytes_max must be the brokers' (an int of at least 1024 bytes; "
                f"theirs is {FRAME_SIZE_BYTES_MAX} by default), got {frame_size_bytes_max!r}")
        self.frame_size_bytes_max = frame_size_bytes_max  # the brokers' [node] setting
        self.acks = acks_of(acks)  # (InvalidArgument for a word it does not know)
        self.client_rack = client_rack  # Kafka's client.rack: "nearest" follower reads
        self.producer_id = producer_id or f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.producer_epoch = new_producer_epoch()  # this client's life of producer_id
        check_producer_tag(self.producer_id, 0, self.producer_epoch)  # (a bad id: typed)
        self.fenced: errors.ProducerFenced | None = None  # a newer life took producer_id
        self.retry_timeout_s, self.retry_backoff_ms = retry_timeout_s, retry_backoff_ms
        self.metadata_max_age_ms, self.timeout_s = metadata_max_age_ms, timeout_s
        self.retries = 0  # requests sent again (figures, tests)
        self.refreshes = 0  # metadata fetched
        self.refused = 0  # acks=0 sends refused (lost) as far as this client heard
        self._state: ClusterMetadata | None = None  # the newest folded state seen
        self._leaders = LeaderTable()  # every reported leader seen, merged by term
        self._view: ClusterMetadata | None = None  # the state with the leaders over it
        self._fetched_at = -float("inf")
        self._sequences: dict[tuple[str, int], int] = {}  # the last sequence per partition
        self._connections: dict[str, Client] = {}
        self._round_robin = RoundRobin()
        self.max_in_flight_requests = max_in_flight_requests  # Kafka's, per partition
        # Produce requests not decided yet, in sequence order per partition; those sent,
        # by (broker address, request id); those whose connection broke, to decide.
        self._pipelines: dict[tuple[str, int], deque[_Produce]] = {}
        self._sent: dict[tuple[str, Any], _Produce] = {}
        self._broken: list[tuple[_Produce, str]] = []
        self._lock = threading.RLock()  # held by every public call (the docstring)
        self._closed = False  # close() was called: every public call raises ClientClosed
        # close() from another thread wakes a thread waiting for answers (it holds the
        # lock close() needs): a byte down this pipe, which every wait watches too
        self._wakeup_read, self._wakeup_write = os.pipe()
        os.set_blocking(self._wakeup_read, False)
        self._close_pipe = weakref.finalize(self, _close_fds, self._wakeup_read,
                                            self._wakeup_write)  # (at close, or collected)
        self._closed_all = threading.Event()  # close() decided every request

    # --- producing -----------------------------------------------------------------------

    def produce(self, topic: str, body: bytes, key: str | bytes | None = None,
                partition: int | None = None, tags: str | None = None,
                acks: str | int | None = None) -> ProducedRecord:
        """Store one record once, on its partition's leader. With acks "all" (the
        client's ``acks`` unless given here) PUT_OK means committed; "1": the leader
        stored it; "0": sent, nothing known (position and offset -1)."""
        return self.produce_batch(topic, [body], key, partition, tags, acks)

    def produce_batch(self, topic: str, bodies: list[bytes], key: str | bytes | None = None,
                      partition: int | None = None, tags: str | None = None,
                      acks: str | int | None = None) -> ProducedRecord:
        """``produce`` for many records of one partition in one request."""
        return self.send_batch(topic, bodies, key, partition, tags, acks).result()

    def send(self, topic: str, body: bytes, key: str | bytes | None = None,
             partition: int | None = None, tags: str | None = None,
             acks: str | int | None = None) -> PendingProduce:
        """``produce`` without waiting for the answer (Kafka's ``send``): see
        ``send_batch``."""
        return self.send_batch(topic, [body], key, partition, tags, acks)

    @_serialized
    def send_batch(self, topic: str, bodies: list[bytes], key: str | bytes | None = None,
                   partition: int | None = None, tags: str | None = None,
                   acks: str | int | None = None) -> PendingProduce:
        """Send one request of records to a partition's leader and return without its
        answer: ``result()`` of what it returns waits for it (``flush`` for all). Up to
        ``max_in_flight_requests`` per partition are in flight; one more waits for the
        oldest's answer first. Their records are stored in the order sent (see the
        module docstring), each request once. It blocks (as Kafka's send does, up to
        max.block.ms) only to learn the topic's partitions when the metadata it holds is
        older than ``metadata_max_age_ms``: while no broker answers, up to
        ``retry_timeout_s``, then NodeUnavailable, the request not sent. Refused at
        once, nothing sent, with InvalidArgument: a topic that is not a non-empty str, a
        bytes key that is not UTF-8 (keys are stored as text); with MessageTooLarge: a
        request larger than ``frame_size_bytes_max``; with ClientClosed after
        ``close()``."""
        self._check_open()
        acks = self.acks if acks is None else acks_of(acks)
        if self.fenced is not None:
            raise self.fenced
        check_topic(topic)
        text_key = text_of_key(key)
        deadline = time.monotonic() + self.retry_timeout_s
        count = self._partition_count(topic, deadline)
        if partition is None:
            partition = choose_partition(key, topic, count, self._round_robin)
        self._check_partition(topic, partition, count)
        sequence = self._sequences.get((topic, partition), 0) + 1
        header, payload = produce_request(topic, bodies, partition, text_key, tags, acks,
                                          (self.producer_id, sequence, self.producer_epoch))
        self._check_frame_size(header, payload, group_of(topic, partition))
        self._sequences[(topic, partition)] = sequence  # (a refused request takes none)
        request = _Produce(topic, partition, header, payload, sequence, deadline)
        if acks == "0":
            self._send_only(topic, partition, header, payload, deadline)
            request.outcome = ProducedRecord(topic, partition, PutStatus.PUT_OK, -1, -1)
            return PendingProduce(self, request)
        while len(self._pipelines.get((topic, partition), ())) >= self.max_in_flight_requests:
            self._check_open()  # (closed from another thread meanwhile)
            self._pump(wait=True)  # (a partition's pipeline goes once it is empty)
        self._pipelines.setdefault((topic, partition), deque()).append(request)
        self._pump(wait=False)  # (sends it; takes in the answers already here)
        return PendingProduce(self, request)

    def _check_frame_size(self, header: dict[str, Any], payload: bytes, group: str) -> None:
        """MessageTooLarge, nothing sent, for a request larger than the brokers'
        ``frame_size_bytes_max``: a broker drops the connection of a frame that large
        unread, which looked like a lost connection, so it went again and again until
        retry_timeout_s and ended as "outcome unknown"."""
        size = codec.PREFIX_SIZE + len(codec.packb({**header, **_STAMP_PROBE, "group": group})) \
            + len(payload)
        if size > self.frame_size_bytes_max:
            raise errors.MessageTooLarge(
                f"a produce request of {size} bytes (bodies: {len(header['sizes'])}, "
                f"{len(payload)} bytes in all; and its header) is larger than "
                f"frame_size_bytes_max={self.frame_size_bytes_max}, the largest frame a "
                "broker takes: nothing was sent; send its bodies in smaller batches (or "
                "set ClusterClient(frame_size_bytes_max=) to the brokers' [node] value)")

    @_serialized
    def flush(self) -> None:
        """Wait until every request sent has its outcome (Kafka's ``flush``); the outcomes
        are in what ``send`` returned (``result()`` raises a failed one's error).
        ProducerFenced once a leader fenced this client (each request has its outcome);
        ClientClosed after ``close()`` (which decided every request)."""
        self._check_open()
        while any(self._pipelines.values()) and not self._closed:
            self._pump(wait=True)
        self._check_open()  # (closed from another thread meanwhile)
        if self.fenced is not None:
            raise self.fenced

    def _send_only(self, topic: str, partition: int, header: dict[str, Any], payload: bytes,
                   deadline: float) -> None:
        """acks=0: hand the request to the leader's connection and go on. Refusals of
        earlier ones read on the way (a leader that moved) refresh the metadata, so the
        next send goes to the new leader; what they refused is lost (acks=0's price)."""
        group, failed = group_of(topic, partition), None
        while True:
            address = self._leader_address(topic, partition, failed)
            connection = self._connection(address, group)
            refused = connection.refused
            try:
                connection.send_only(dict(header), payload)
            except errors.NodeUnavailable as error:
                self._drop(address)
                if time.monotonic() >= deadline:
                    raise errors.NodeUnavailable(
                        f"no leader of {topic!r} partition {partition} took an acks=0 send "
                        f"within retry_timeout_s={self.retry_timeout_s}: {error}") from None
                self.retries, failed = self.retries + 1, address
                continue
            if connection.refused != refused:
                self.refused += connection.refused - refused
                self.fenced = self.fenced or next(
                    (error for error in connection.refusals
                     if isinstance(error, errors.ProducerFenced)), None)
                self._view_or_last(refresh=True)
            return

    @_serialized
    def partitions_for(self, topic: str) -> int:
        """How many partitions ``topic`` has (UnknownTopic if the metadata never shows it
        within retry_timeout_s)."""
        self._check_open()
        check_topic(topic)
        return self._partition_count(topic, time.monotonic() + self.retry_timeout_s)

    # --- reading -------------------------------------------------------------------------

    @_serialized
    def fetch(self, topic: str, partition: int, offset: int = 0, max_count: int = 32,
              max_bytes: int = 1 << 20, replica: str | None = None) -> list:
        """Committed records of one partition from ``offset`` (never past the high
        watermark of the replica read), from its leader — or, with ``replica`` (KIP-392's
        follower fetching, ISR topics), from ``"nearest"`` (a replica in the ISR whose
        broker's rack is ``client_rack``, the leader first; none: the leader) or from
        the broker named. A follower serves up to its own high watermark, which may lag
        the leader's: it answers fewer records, never an uncommitted one. A replica
        that cannot serve (down, not hosting it yet) is passed over for the leader.
        InvalidArgument at once for a topic that is not a non-empty str; ClientClosed
        after ``close()``."""
        self._check_open()
        check_topic(topic)
        deadline = time.monotonic() + self.retry_timeout_s
        self._check_partition(topic, partition, self._partition_count(topic, deadline))
        address = self._replica_address(topic, partition, replica) if replica else None
        if address is not None:
            try:
                return self._connection(address, group_of(topic, partition)).fetch(
                    topic, partition, offset, max_count, max_bytes)
            except (errors.NotMaster, errors.UnknownGroup, errors.NodeUnavailable) as error:
                if isinstance(error, errors.NodeUnavailable):
                    self._drop(address)
                self.retries += 1  # (to the leader, below)
        found: list[list] = []

        def read(client: Client) -> dict[str, Any]:  # (a follower the view still shows as
            # leader would answer below its own high watermark: fewer records, or none)
            found.append(client.fetch(topic, partition, offset, max_count, max_bytes,
                                      leader_only=True))
            return {"status": PutStatus.PUT_OK.value}
        self._until_decided(topic, partition, deadline, "fetch", read)
        return found[-1]

    def _replica_address(self, topic: str, partition: int, replica: str) -> str | None:
        """Where a follower read goes: ``replica`` named, or "nearest" (None: the leader)."""
        view = self.metadata()
        info = view.partition(topic, partition)
        if replica != "nearest":
            if replica not in info.replicas or replica not in view.brokers:
                raise errors.InvalidArgument(
                    f"replica must be 'nearest' or a broker holding {topic!r} partition "
                    f"{partition} (replicas {', '.join(info.replicas)}), not {replica!r}")
            return view.brokers[replica].address
        near = [name for name in (info.leader, *info.isr) if name in view.brokers and
                not view.brokers[name].fenced and self.client_rack and
                view.brokers[name].rack == self.client_rack]
        return view.brokers[near[0]].address if near else None

    # --- metadata --------------------------------------------------------------------------

    @_serialized
    def metadata(self, refresh: bool = False) -> ClusterMetadata:
        """The cluster's metadata (cached ``metadata_max_age_ms``; ``refresh``: ask now).
        NodeUnavailable if no broker answers (a request's attempts use ``_view_or_last``
        instead); ClientClosed after ``close()``."""
        self._check_open()
        age_ms = (time.monotonic() - self._fetched_at) * 1000
        if self._view is not None and not refresh and age_ms < self.metadata_max_age_ms:
            return self._view
        if self._view is not None and age_ms < self.retry_backoff_ms:
            return self._view  # (asked a moment ago: no storm while a leader is down)
        failures, ends = [], time.monotonic() + self.timeout_s
        addresses, controllers, standalone = self._metadata_addresses(), [], []
        for address in addresses:
            left = ends - time.monotonic()  # (a refresh is one attempt: timeout_s in all,
            if left <= 0:  # not each broker's; the documented bound on a request holds)
                failures.append(f"the refresh took timeout_s={self.timeout_s}")
                break
            try:
                answer = self._connection(address).call({"kind": "cluster_metadata"},
                                                        timeout_s=left)[0]
            except (errors.UnknownGroup, errors.RemoteProtocolError) as error:
                # Refused: a node without the cluster_metadata service (a cluster's broker
                # registers it before it serves anything), whose default group answered
                # "unknown request kind", or which has none (UnknownGroup)
                self._drop(address)
                facts = self._node_facts(address, ends)
                if facts is None:  # (it did not say what it is: asked again next time)
                    failures.append(f"{address}: {error}")
                elif "broker" not in facts[0]:
                    controllers.append(address)
                    failures.append(f"{address} is a controller, not a broker")
                else:  # (what it hosts, without its advice to "name a group in the
                    # request": a Client's, not the caller's)
                    standalone.append(address)
                    hosted = f"hosting {', '.join(map(repr, facts[1]))}; " if facts[1] else ""
                    failures.append(f"{address} is not a cluster's broker (a standalone "
                                    f"node: {hosted}no [controller] voters)")
                self._drop(address)
                continue
            except (errors.NodeUnavailable, errors.RemoteError) as error:
                self._drop(address)
                failures.append(f"{address}: {error}")
                continue
            try:
                state, leaders = metadata_from(answer)
            except errors.RemoteProtocolError as error:
                self._drop(address)
                failures.append(f"{address}: {error}")
                continue
            if self._state is None or state.position >= self._state.position:
                self._state = state  # (a broker further behind is not taken over a newer)
            self._leaders.merge_all(leaders)
            self._leaders.prune(self._state)
            self._view = self._leaders.overlay(self._state)
            self._fetched_at = time.monotonic()
            self.refreshes += 1
            return self._view
        if self._view is None and (controllers or standalone) and \
                len(controllers) + len(standalone) == len(addresses):
            raise self._not_brokers(controllers, standalone, failures)
        raise errors.NodeUnavailable(
            "no broker answered cluster_metadata: " + "; ".join(failures)
            + (". Bootstrap names the brokers of a cluster: nodes whose configs have "
               "process_roles broker and [controller] voters" if standalone else ""))

    @staticmethod
    def _not_brokers(controllers: list[str], standalone: list[str],
                     failures: list[str]) -> errors.NotABroker:
        """NotABroker for bootstrap addresses none of which is a cluster's broker: each a
        controller or a standalone node, which never turns into a cluster's broker (a
        broker joins a cluster by its config, [controller] voters, read at its start):
        nothing to wait for, so at once (no request was sent yet)."""
        if not standalone:
            return errors.NotABroker(
                f"bootstrap {','.join(controllers)}: controllers, not brokers (process_roles "
                "without broker); a ClusterClient, as `mqlog produce|consume --bootstrap`, "
                "takes brokers' addresses, not the [controller] voters (`mqlog brokers "
                "--bootstrap CONTROLLERS` lists the brokers); nothing was sent",
                addresses=controllers)
        return errors.NotABroker(
            f"bootstrap {','.join([*controllers, *standalone])}: no cluster's broker: "
            + "; ".join(failures) + ". A ClusterClient, as `mqlog produce|consume "
            "--bootstrap`, takes the brokers of a cluster (docs/CLUSTER.md); a standalone "
            "node's group takes writes from mqlog.Client(ADDRESS) or mqlog.GroupClient("
            "[ADDRESSES]), and `mqlog consume DATA_DIR` (the node's data_dir; DATA_DIR/GROUP "
            "on a node of several groups) reads its store beside it (docs/REPLICATION.md); "
            "nothing was sent",
            addresses=[*controllers, *standalone], standalone=standalone)

    def _node_facts(self, address: str, ends: float) -> tuple[list[str], list[str]] | None:
        """What the node at ``address``, which answered no cluster_metadata, is: the
        process_roles and the groups of its ``broker_metadata`` (every node answers it),
        asked before ``ends``; None if it did not tell."""
        left = ends - time.monotonic()
        if left <= 0:
            return None
        try:
            answer = self._connection(address).call({"kind": "broker_metadata"},
                                                    timeout_s=left)[0]
        except errors.MqlogError:
            return None
        roles, groups = answer.get("process_roles"), answer.get("groups")
        if not isinstance(roles, list) or not roles:
            return None
        return roles, sorted(groups) if isinstance(groups, dict) else []

    def _view_or_last(self, refresh: bool) -> ClusterMetadata:
        """The metadata to choose where a request goes next: ``metadata(refresh)``, or
        when no broker answers, the last view seen. A failed refresh is one more failed
        attempt of the request, not its outcome: it was taken for the request's final
        error, "no broker answered", long before retry_timeout_s and without saying
        that the outcome is unknown — a write the leader had stored was then sent anew
        by its caller and stored twice. Only the deadline ends a request."""
        try:
            return self.metadata(refresh)
        except errors.NodeUnavailable:
            if self._view is None:  # (never seen: no request got this far without one)
                raise
            return self._view

    def _metadata_addresses(self) -> list[str]:
        known = [info.address for _, info in sorted(self._view.brokers.items())
                 if not info.fenced] if self._view is not None else []
        return list(dict.fromkeys([*self._connections, *known, *self.bootstrap]))

    def _partition_count(self, topic: str, deadline: float) -> int:
        view = self._metadata_until(deadline)
        while topic not in view.topics:
            if time.monotonic() >= deadline:
                raise errors.UnknownTopic(
                    f"the cluster's metadata shows no topic {topic!r} (asked until "
                    f"retry_timeout_s={self.retry_timeout_s}): create it with `mqlog topics "
                    "create`, or check the name with `mqlog topics list`")
            time.sleep(self.retry_backoff_ms / 1000)  # a back-off: brokers pull metadata
            view = self._metadata_until(deadline, refresh=True)
        return len(view.topics[topic].partitions)

    def _metadata_until(self, deadline: float, refresh: bool = False) -> ClusterMetadata:
        while True:
            try:
                return self.metadata(refresh)
            except errors.NodeUnavailable as error:
                if time.monotonic() >= deadline:  # (before anything was sent: say so)
                    raise errors.NodeUnavailable(
                        f"{error} (asked until retry_timeout_s={self.retry_timeout_s}); "
                        "the request was not sent") from None
            time.sleep(self.retry_backoff_ms / 1000)  # a back-off: every broker is down

    @staticmethod
    def _check_partition(topic: str, partition: Any, count: int) -> None:
        if not isinstance(partition, int) or isinstance(partition, bool) or \
                not 0 <= partition < count:
            raise errors.InvalidArgument(f"topic {topic!r} has partitions 0..{count - 1}, not "
                                         f"{partition!r}")

    # --- one request until a leader decides it --------------------------------------------

    def _until_decided(self, topic: str, partition: int, deadline: float, what: str,
                       request: Any) -> dict[str, Any]:
        """``request(connection)`` to the partition's leader, sent again (``_judge``)
        until decided or ``deadline``."""
        group = group_of(topic, partition)
        address, attempts = self._leader_address(topic, partition, None), _Attempts()
        while True:
            try:
                outcome: dict[str, Any] | errors.MqlogError = \
                    request(self._connection(address, group))
            except errors.MqlogError as error:
                outcome = error
            verdict = self._judge(topic, partition, address, outcome, attempts)
            if isinstance(verdict, dict):
                return verdict
            if time.monotonic() >= deadline:
                raise self._timed_out(topic, partition, what, attempts, -1)
            self.retries += 1
            time.sleep(verdict[1])  # a back-off, not a sync
            address = verdict[0] or self._leader_address(topic, partition, None)

    def _judge(self, topic: str, partition: int, address: str,
               outcome: dict[str, Any] | errors.MqlogError, attempts: _Attempts,
               sent: bool = True) -> dict[str, Any] | tuple[str | None, float]:
        """One attempt's outcome: the answer if decided, else where to send again (None:
        the leader shown then) and after what back-off in seconds. Raises what is the
        caller's: NotEnoughReplicas when no attempt can have stored it (SlaveNotAvailable
        too, when the partition's slaves are on fenced brokers), any error that is not
        about where the leader is. ``sent`` False: a NodeUnavailable before the request
        left (nothing stored by it)."""
        backoff = self.retry_backoff_ms / 1000
        if isinstance(outcome, dict):
            attempts.last = status = PutStatus(outcome["status"])
            if status not in RETRIED:
                return outcome
            refused = nothing_stored(outcome)  # (SLAVE_NOT_AVAILABLE before storing)
            attempts.maybe_stored = attempts.maybe_stored or not refused
            attempts.failures.append(f"{address}: {status.name}"
                                     + (" (nothing stored)" if refused else ""))
            if refused and not attempts.maybe_stored:
                self._check_slaves_alive(topic, partition, address, attempts)
            if status is PutStatus.REQUEST_TIMED_OUT:  # (the leader may have changed)
                self._view_or_last(refresh=True)
                return None, 0.0
            return address, backoff if status in (  # (its replicas must catch up first)
                PutStatus.SLAVE_NOT_AVAILABLE, PutStatus.NOT_ENOUGH_REPLICAS_AFTER_APPEND) else 0.0
        attempts.failures.append(f"{address}: {outcome}")
        if isinstance(outcome, errors.SequenceGap):  # nothing stored; after the earlier one
            return None, 0.0
        if isinstance(outcome, errors.NotEnoughReplicas):  # nothing stored by this one...
            if not attempts.maybe_stored:
                raise outcome  # (the caller's choice: retry later, or write with acks=1)
            return address, backoff  # ...but an earlier one may have: the ISR must grow
        if isinstance(outcome, errors.NotMaster):  # NotLeader too, which may name the leader
            named = getattr(outcome, "leader_address", None)
            attempts.tried.add(address)
            return named or self._leader_address(topic, partition, address,
                                                 attempts.tried), 0.0
        if isinstance(outcome, errors.UnknownGroup):  # (not pulled there yet, or deleted)
            attempts.tried.add(address)
            return self._leader_address(topic, partition, address, attempts.tried), 0.0
        if isinstance(outcome, errors.NodeUnavailable):
            if sent:  # (its outcome unknown; one never sent tells nothing new)
                attempts.maybe_stored, attempts.last = True, None
            else:
                attempts.failures[-1] += " (not sent)"
            self._drop(address)
            attempts.tried.add(address)
            return self._leader_address(topic, partition, address, attempts.tried), 0.0
        raise outcome

    def _check_slaves_alive(self, topic: str, partition: int, address: str,
                            attempts: _Attempts) -> None:
        """A master at ``address`` refused a write before storing it (SLAVE_NOT_AVAILABLE:
        too few slaves in sync), and no earlier attempt can have stored it. While its
        slaves may still join (a new partition, a promotion: they catch up in a moment)
        it goes again until retry_timeout_s; but when the metadata shows every other
        replica's broker fenced (down: none can come in sync), SlaveNotAvailable at once,
        as NotEnoughReplicas is on an ISR partition (whose ISR the controller shrinks as
        brokers are fenced) — it was sent again for retry_timeout_s, then called "outcome
        unknown"."""
        view = self._view_or_last(refresh=False)  # (cached: metadata_max_age_ms)
        topic_info = view.topics.get(topic)
        if topic_info is None or partition >= len(topic_info.partitions):
            return
        slaves = [name for name in topic_info.partitions[partition].replicas
                  if name not in view.brokers or view.brokers[name].address != address]
        if not slaves or any(name in view.brokers and not view.brokers[name].fenced
                             for name in slaves):
            return
        raise errors.SlaveNotAvailable(
            f"{topic!r} partition {partition}: its master at {address} has fewer slaves in "
            f"sync than in_sync_slaves_min (SLAVE_NOT_AVAILABLE), and the brokers of its "
            f"other replicas ({', '.join(slaves)}) are fenced (down, or cut off from the "
            "controllers): nothing was stored, so a retry is safe once they are back "
            "(`mqlog brokers --bootstrap CONTROLLERS` shows them), or write with acks=1 "
            "(the master alone, lost if it fails): " + "; ".join(attempts.failures[-3:]))

    def _timed_out(self, topic: str, partition: int, what: str, attempts: _Attempts,
                   sequence: int) -> errors.MqlogError:
        if attempts.last in STORED_UNDECIDED:
            return undecided(attempts.last, self.producer_id, sequence, self.retry_timeout_s,
                             attempts.failures)
        if sequence >= 0 and not attempts.maybe_stored:  # (a produce none can have stored)
            return not_stored(attempts.last, f"{topic!r} partition {partition} "
                              f"({what} of producer {self.producer_id!r})",
                              self.retry_timeout_s, attempts.failures)
        unknown = (f"; its outcome is unknown (this client retries it safely, producer "
                   f"{self.producer_id!r})") if sequence >= 0 else ""
        return errors.NodeUnavailable(
            f"no leader of {topic!r} partition {partition} decided the request ({what}) "
            f"within retry_timeout_s={self.retry_timeout_s}{unknown}: "
            + "; ".join(attempts.failures[-3:]))

    # --- produce requests in flight ----------------------------------------------------------

    def _pump(self, wait: bool) -> None:
        """Move every produce request on: decide those whose connection broke, send
        what is due (in order per partition), take in the answers that are here — and
        with ``wait``, if none was, wait for one (or for a back-off's end)."""
        self._decide_broken()
        self._send_due()
        if self._take_answers(self._connections_waited_on(), wait=False) or not wait:
            return
        now = time.monotonic()
        due = [request.not_before for pipeline in self._pipelines.values()
               for request in pipeline if request.address is None]
        sent = list(self._sent.values())
        if not due and not sent:
            return  # (all decided, by _send_due too: waiting timeout_s delayed result())
        timeout = min([self.timeout_s, *(at - now for at in due),
                       *(request.sent_at + self.timeout_s - now for request in sent)])
        sockets = {self._connections[address].fileno(): address
                   for address in self._connections_waited_on()}
        # (a back-off when nothing is in flight; close() from another thread wakes it)
        ready = readable([*sockets, self._wakeup_read], max(0.0, timeout))
        if self._wakeup_read in ready:
            return  # (closed: the caller sees it)
        self._take_answers([sockets[fd] for fd in ready], wait=True)
        now = time.monotonic()
        for request in sent:  # no answer within timeout_s: as if the connection broke
            if request.address is not None and now - request.sent_at >= self.timeout_s:
                self._drop(request.address)

    def _connections_waited_on(self) -> list[str]:
        return [address for address in dict.fromkeys(address for address, _ in self._sent)
                if address in self._connections]

    def _take_answers(self, addresses: list[str], wait: bool) -> int:
        """Decide the requests answered on ``addresses``; how many were."""
        answered = 0
        for address in addresses:
            try:
                connection = self._connections.get(address)  # (a refresh may drop it)
                if connection is None:
                    continue  # (its requests were moved to _broken when it was dropped)
                frames = connection.take_answers(wait)
            except (errors.NodeUnavailable, errors.RemoteProtocolError):
                self._drop(address)  # (garbage too: its requests go again, elsewhere)
                continue
            for frame in frames:
                request = self._sent.pop((address, frame.header.get("id")), None)
                if request is None:
                    continue  # (given up meanwhile)
                answered += 1
                request.address = None
                outcome = error_of(frame.header) if frame.header.get("kind") == "error" \
                    else frame.header
                self._decide(request, address, outcome)
        self._decide_broken()
        return answered

    def _decide_broken(self) -> None:
        while self._broken:
            request, address = self._broken.pop(0)
            request.address = None
            self._decide(request, address, errors.NodeUnavailable(
                f"the connection to {address} broke or did not answer within timeout_s="
                f"{self.timeout_s}"))

    def _decide(self, request: _Produce, address: str,
                outcome: dict[str, Any] | errors.MqlogError, sent: bool = True) -> None:
        """A request's attempt ended: its outcome, or when and where it goes again.
        ``sent`` False: the attempt failed before the request left whole (no connection
        could be made, or the send itself failed), so it stored nothing."""
        try:
            verdict = self._judge(request.topic, request.partition, address, outcome,
                                  request.attempts, sent)
        except errors.PartiallyStored as cut:
            if 0 < cut.count < len(request.header["sizes"]):
                return self._send_the_rest(request, cut)
            return self._finish(request, error=cut)
        except errors.MqlogError as error:
            return self._finish(request, error=error)
        if isinstance(verdict, dict):
            position, offset = request.first or (verdict["position"], verdict["offset"])
            stamp, size = answer_facts(verdict) if request.first is None else (-1, -1)
            return self._finish(request, outcome=ProducedRecord(
                request.topic, request.partition, PutStatus(verdict["status"]),
                position, offset, stamp, size))
        if time.monotonic() >= request.deadline:
            return self._finish(request, error=self._timed_out(
                request.topic, request.partition, f"sequence {request.sequence}",
                request.attempts, request.sequence))
        self.retries += 1
        request.next_address = verdict[0]
        request.not_before = time.monotonic() + verdict[1]
        return None

    def _finish(self, request: _Produce, *, outcome: ProducedRecord | None = None,
                error: errors.MqlogError | None = None) -> None:
        request.outcome, request.error = outcome, error
        if isinstance(error, errors.ProducerFenced):
            self.fenced = self.fenced or error
        pipeline = self._pipelines[(request.topic, request.partition)]
        pipeline.remove(request)
        if not pipeline:
            del self._pipelines[(request.topic, request.partition)]

    def _send_the_rest(self, request: _Produce, cut: errors.PartiallyStored) -> None:
        """A leader holds the first ``cut.count`` records of ``request`` (committed; its
        copy was cut inside the request by a failover): the rest goes as a new request,
        a new sequence, at the head of the partition's requests, and the requests behind
        it go again after it, each with a new sequence too. None of those is stored
        anywhere it can still commit (a leader holding the cut copy refused them, and
        a copy past the cut is on no log that can be committed again: driver.py's
        ``propose_write``), so their old sequences are let go; the request is answered
        once its rest is stored, with the place of its first record. Order holds: the
        records are stored in the order they were sent, each once."""
        sizes = request.header["sizes"]
        if request.first is None and cut.position >= 0:
            request.first = (cut.position, cut.offset)
        request.payload = request.payload[sum(sizes[:cut.count]):]
        request.header = {**request.header, "sizes": sizes[cut.count:]}
        pipeline = self._pipelines[(request.topic, request.partition)]
        for again in list(pipeline)[list(pipeline).index(request):]:
            for key in [key for key, sent in self._sent.items() if sent is again]:
                del self._sent[key]  # (its answer, should it come, is dropped)
            sequence = self._sequences[(again.topic, again.partition)] + 1
            self._sequences[(again.topic, again.partition)] = sequence
            again.sequence, again.header = sequence, {**again.header, "sequence": sequence}
            again.address, again.next_address, again.attempts = None, None, _Attempts()
        self.retries += 1

    def _send_due(self) -> None:
        """Send each request waiting to go whose back-off is over, in sequence order per
        partition: one that must wait holds back those after it. Each names the
        sequence of the request before it still undecided (``previous``): the leader
        refuses it (SequenceGap, nothing stored) unless it has that one — so no request
        overtakes one refused or lost, and records keep the order they were sent in.
        Once fenced, none goes again (a leader that lost the newer life's records with
        a failover would take them): each fails with ProducerFenced."""
        if self.fenced is not None:
            self._fail_unsent(self.fenced)
        for pipeline in list(self._pipelines.values()):
            previous: _Produce | None = None
            for request in list(pipeline):
                if request.address is None and not self._send_one(request, previous):
                    break
                previous = request

    def _fail_unsent(self, fenced: errors.ProducerFenced) -> None:
        for pipeline in list(self._pipelines.values()):
            for request in [request for request in pipeline if request.address is None]:
                earlier = (f"; an earlier attempt of sequence {request.sequence} may have "
                           "stored it") if request.attempts.maybe_stored else \
                    f"; sequence {request.sequence} was not stored"
                self._finish(request, error=errors.ProducerFenced(
                    f"not sent again, this client was fenced: {fenced}{earlier}"))

    def _send_one(self, request: _Produce, previous: _Produce | None) -> bool:
        now = time.monotonic()
        if now < request.not_before or request.outcome or request.error:
            return False
        try:
            address = request.next_address or self._leader_address(
                request.topic, request.partition, None)
        except errors.UnknownTopic as error:
            self._finish(request, error=error)
            return False
        header = dict(request.header)
        if previous is not None:  # (and its records: a copy of it cut inside is not it)
            header["previous"] = previous.sequence
            header["previous_count"] = len(previous.header["sizes"])
        try:  # (failed here, it was not sent: no connection, or not all of its frame
            # left — a broker takes a whole frame or none, and the connection is closed)
            connection = self._connection(address, group_of(request.topic, request.partition))
            request_id = connection.send_request(header, request.payload)
        except errors.NodeUnavailable as error:
            self._drop(address)
            self._decide(request, address, error, sent=False)
            return False
        request.address, request.sent_at, request.next_address = address, now, None
        self._sent[(address, request_id)] = request
        return True

    def _leader_address(self, topic: str, partition: int, failed: str | None,
                        tried: set[str] | None = None) -> str:
        """Where to send: the leader the metadata shows, refreshed if ``failed`` (the
        address that just failed) — unless that one failed, or is in ``tried`` (the
        addresses that refused this request without naming a leader), then the next
        replica not tried yet, after a back-off (an election is under way). Going round
        the replicas, not back and forth: a view that still shows a leader that moved
        must not bounce a request between it and one follower while the third leads.
        Once every replica was tried, ``tried`` starts over. With no broker answering the
        metadata, the last view seen (``_view_or_last``). UnknownTopic when the view has
        the partition no more: its topic was deleted since the request was made (a view
        is never taken from a broker behind the newest seen, so it is not a broker that
        has not heard of the topic yet); a request to it was tried until
        retry_timeout_s, and then said "outcome unknown", though every broker refused it."""
        view = self._view_or_last(refresh=failed is not None)
        info = view.partition(topic, partition) if topic in view.topics and \
            partition < len(view.topics[topic].partitions) else None
        if info is None:
            raise errors.UnknownTopic(
                f"topic {topic!r} partition {partition} is not in the cluster's metadata "
                "any more: the topic was deleted (with whatever it held) while the request "
                "was under way; `mqlog topics list` shows the topics")
        addresses = [view.brokers[name].address for name in info.replicas
                     if name in view.brokers]
        tried = tried if tried is not None else set()
        leader = view.brokers.get(info.leader)
        if leader is not None and leader.address != failed and leader.address not in tried:
            return leader.address
        if failed is not None:
            time.sleep(self.retry_backoff_ms / 1000)  # a back-off: an election takes time
        start = addresses.index(failed) + 1 if failed in addresses else 0
        ring = addresses[start:] + addresses[:start]
        untried = [address for address in ring if address not in tried and address != failed]
        if untried:
            return untried[0]
        tried.clear()  # (all refused: round again, the leader shown first)
        return leader.address if leader is not None else ring[0] if ring else \
            self.bootstrap[0]

    # --- connections --------------------------------------------------------------------------

    def _connection(self, address: str, group: str | None = None) -> Client:
        """One connection per broker address; ``group`` is named on each request."""
        client = self._connections.get(address)
        if client is None:
            self._check_open()  # (a closed client opens none: it leaked its sockets)
            client = self._connections[address] = Client(address, timeout_s=self.timeout_s)
        client.group = group
        return client

    def _check_open(self) -> None:
        if self._closed:
            raise errors.ClientClosed(
                "this ClusterClient was closed (close(), or the end of its with block): it "
                "sends and reads nothing more; make a new ClusterClient")

    def _drop(self, address: str) -> None:
        """Close the connection to ``address``; the requests waiting on it are decided
        as broken (their outcome unknown) at the next ``_pump``."""
        client = self._connections.pop(address, None)
        if client is not None:
            client.close()
        for key in [key for key in self._sent if key[0] == address]:
            self._broken.append((self._sent.pop(key), address))

    def close(self) -> None:
        """Close the connections; requests still undecided fail with NodeUnavailable
        (their outcome unknown). Every later call raises ClientClosed (none reconnects);
        closing again does nothing. From another thread, while one waits in ``result``,
        ``flush`` or ``send``: that wait ends at once (a metadata refresh under way
        within timeout_s), and so does the request (NodeUnavailable); it was waited for
        to its end, up to retry_timeout_s, holding the lock close() needs."""
        if self._closed:
            return
        self._closed = True  # (seen by the waiting thread once it wakes)
        os.write(self._wakeup_write, b"x")
        with self._lock:
            self._close()
            self._close_pipe()
        self._closed_all.set()

    def _close(self) -> None:
        for pipeline in list(self._pipelines.values()):
            for request in list(pipeline):
                self._finish(request, error=errors.NodeUnavailable(
                    f"the client was closed before sequence {request.sequence} to "
                    f"{request.topic!r} partition {request.partition} was decided: its "
                    "outcome is unknown"))
        self._sent.clear()
        self._broken.clear()
        for client in self._connections.values():
            client.close()
        self._connections.clear()

    def __enter__(self) -> ClusterClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
