"""``mqlog.GroupClient``: write to a replica group (Raft, or master-slave) without
knowing its leader, and without storing a write twice when a retry follows a failover.

* It sends to the node it believes leads. A ``NotLeader`` answer names the leader (and
  its address) when the node knows it: the client goes there; when no leader is known
  (an election is under way) it tries the next node after ``retry_backoff_ms``.
  A master-slave node that is not (or not yet) a master answers NotMaster: the next.
  A broker that hosts no such group (yet: a restarted broker hosts a cluster's groups only
  once it has pulled the metadata) answers UnknownGroup: the next; only when every node
  in a row says so is it the caller's mistake, raised as UnknownGroup.
* A write whose outcome is unknown — the connection broke, the node stepped down, the
  majority did not answer in time (FLUSH_SLAVE_TIMEOUT), the node's disk did not flush
  in time (FLUSH_DISK_TIMEOUT: the record is stored and may still commit) — or that was
  refused before anything was stored (SLAVE_NOT_AVAILABLE), or that an ISR leader stored
  but could not commit yet (NOT_ENOUGH_REPLICAS_AFTER_APPEND, REQUEST_TIMED_OUT) is sent
  again, with the same producer id and sequence, until ``retry_timeout_s`` has passed;
  then the last of those is raised as its typed error (NodeUnavailable if none came) —
  unless no attempt can have stored it (each was refused before storing, or never
  reached a node): then SlaveNotAvailable if a master's SLAVE_NOT_AVAILABLE was the last
  answer (a NotEnoughReplicas: nothing stored, a retry is safe), else NodeUnavailable
  saying nothing was stored; never "outcome unknown" when every answer said nothing was
  stored. (A SLAVE_NOT_AVAILABLE with a position is a write stored whose slaves left the
  sync state meanwhile: stored, may still commit.) NotEnoughReplicas (an ISR below
  min.insync: nothing stored) is raised at once, unless an earlier attempt of the same
  write was stored: then it is retried too. A master-slave group's SLAVE_NOT_AVAILABLE
  is retried, as slaves join a master in a moment (a promotion, a start). The leader answers a
  retry of a stored write with the first write's place (idempotence.py), so every write
  is stored once, wherever leadership went meanwhile.
* Each client is one life of its producer id: its producer epoch (idempotence.py's
  ``new_producer_epoch``, the wall clock) is higher than any earlier client's with the
  same id, so a restarted process may reuse an explicit ``producer_id`` and start its
  sequences over. A leader with records of a newer life refuses this one's requests
  with ProducerFenced (nothing stored): raised at once, and by every later call (a
  fenced client sends nothing more).
* One thread at a time; one request in flight (use several clients, each with its own
  producer id, for more).
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from mqlog import errors
from mqlog.client import Client, check_positive, produce_request, put_result
from mqlog.replication.idempotence import new_producer_epoch
from mqlog.replication.node import check_producer_tag
from mqlog.results import PutResult, PutStatus

# Sent again: the outcome is unknown (stored, maybe committed later), or nothing was stored.
# The ISR layer's two (Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND, REQUEST_TIMED_OUT) are
# "stored, may still commit": the same producer sequence makes the retry safe.
STORED_UNDECIDED = (PutStatus.NOT_ENOUGH_REPLICAS_AFTER_APPEND, PutStatus.REQUEST_TIMED_OUT)
RETRIED = (PutStatus.FLUSH_SLAVE_TIMEOUT, PutStatus.FLUSH_DISK_TIMEOUT,
           PutStatus.SLAVE_NOT_AVAILABLE, *STORED_UNDECIDED)


def nothing_stored(answer: dict[str, Any]) -> bool:
    """Whether a produce answer says nothing was stored: a SYNC_MASTER's SLAVE_NOT_AVAILABLE
    given before storing (position -1; node.py). The same status with a position is a
    write stored whose slaves left the sync state before they had it: it may still
    commit (a retry with its producer sequence is answered by that copy's fate)."""
    position = answer.get("position")
    return answer.get("status") == PutStatus.SLAVE_NOT_AVAILABLE.value and (
        not isinstance(position, int) or position < 0)


def not_stored(status: PutStatus | None, where: str, retry_timeout_s: float,
               failures: list[str]) -> errors.MqlogError:
    """The typed error for a write still undecided at its deadline that no attempt can
    have stored (each was refused before storing, or not sent): a retry, or producing it
    anew, is safe. SlaveNotAvailable when the last answer was a master's
    SLAVE_NOT_AVAILABLE, else NodeUnavailable saying nothing was stored."""
    tail = "; ".join(failures[-3:])
    if status is PutStatus.SLAVE_NOT_AVAILABLE:
        return errors.SlaveNotAvailable(
            f"{where}: its master had fewer slaves in sync than in_sync_slaves_min until "
            f"retry_timeout_s={retry_timeout_s} (SLAVE_NOT_AVAILABLE): nothing was stored "
            "(every attempt was refused before storing), so a retry is safe once its "
            "slaves are back in sync (start their nodes; `mqlog cluster status` shows "
            "them), or write with acks=1 (the master alone, lost if it fails): " + tail)
    return errors.NodeUnavailable(
        f"{where}: no leader took the write within retry_timeout_s={retry_timeout_s}; "
        "nothing was stored (every attempt was refused before storing, or could not be "
        "sent), so a retry is safe: " + tail)


def undecided(status: PutStatus | None, producer: str, sequence: int,
              retry_timeout_s: float, failures: list[str]) -> errors.MqlogError:
    """The typed error for a write still undecided at its deadline: the ISR statuses as
    their own errors (stored, may still commit), anything else NodeUnavailable."""
    tail = (f"; it may still commit: retry with the idempotent producer (this client sent "
            f"it again as producer {producer!r} sequence {sequence} for retry_timeout_s="
            f"{retry_timeout_s}; producing it anew may store it twice): "
            + "; ".join(failures[-3:]))
    if status is PutStatus.NOT_ENOUGH_REPLICAS_AFTER_APPEND:
        return errors.NotEnoughReplicasAfterAppend(
            "the write is stored, but the partition's ISR stayed below min_insync_replicas"
            + tail)
    if status is PutStatus.REQUEST_TIMED_OUT:
        return errors.RequestTimedOut("the write is stored, but was not committed in time "
                                      "(or its leader changed)" + tail)
    return errors.NodeUnavailable(
        f"no leader decided the write within retry_timeout_s={retry_timeout_s}; its outcome "
        f"is unknown (a retry with producer {producer!r} and sequence {sequence} is safe): "
        + "; ".join(failures[-3:]))


class GroupClient:
    def __init__(self, addresses: list[str], *, producer_id: str | None = None,
                 retry_timeout_s: float = 15.0, retry_backoff_ms: int = 50,
                 timeout_s: float = 5.0, group: str | None = None) -> None:
        if not addresses or isinstance(addresses, str) or \
                not all(isinstance(address, str) for address in addresses):
            raise errors.InvalidArgument(f"a GroupClient needs a list of node addresses "
                                         f"(host:port), got {addresses!r}")
        for name, value in (("retry_timeout_s", retry_timeout_s), ("timeout_s", timeout_s),
                            ("retry_backoff_ms", retry_backoff_ms)):
            check_positive(name, value)
        self.addresses = list(addresses)
        self.producer_id = producer_id or f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.producer_epoch = new_producer_epoch()  # this client's life of producer_id
        check_producer_tag(self.producer_id, 0, self.producer_epoch)  # (a bad id: typed)
        self.fenced: errors.ProducerFenced | None = None  # a newer life took producer_id
        self.retry_timeout_s = retry_timeout_s
        self.retry_backoff_ms = retry_backoff_ms
        self.timeout_s = timeout_s
        self.group = group  # the replica group on each broker (None: the default group)
        self.sequence = 0  # the last sequence used
        self.retries = 0  # requests sent again (for figures and tests)
        self._client: Client | None = None
        self._turn = 0

    def produce(self, topic: str, body: bytes, queue_id: int = 0, key: str | None = None,
                tags: str | None = None) -> PutResult:
        """Store one record once, on whichever node leads; PUT_OK means committed."""
        return self.produce_batch(topic, [body], queue_id, key, tags)

    def produce_batch(self, topic: str, bodies: list[bytes], queue_id: int = 0,
                      key: str | None = None, tags: str | None = None) -> PutResult:
        if self.fenced is not None:
            raise self.fenced
        producer = (self.producer_id, self.sequence + 1, self.producer_epoch)
        request = produce_request(topic, bodies, queue_id, key, tags, "replicated", producer)
        self.sequence += 1  # (taken once the request is made: a refused one takes none)
        try:
            answer = self._until_decided(*request)
        except errors.ProducerFenced as error:
            self.fenced = error
            raise
        return put_result(answer)

    def metadata(self) -> dict[str, Any]:
        return self._client_now(time.monotonic() + self.retry_timeout_s).metadata()

    def _until_decided(self, header: dict[str, Any], payload: bytes) -> dict[str, Any]:
        deadline = time.monotonic() + self.retry_timeout_s
        failures: list[str] = []
        unknown = 0  # nodes in a row that host no such group
        last: PutStatus | None = None  # the last undecided answer
        maybe_stored = False  # an earlier attempt may have stored it
        while True:
            try:
                client = self._client_now(deadline)
            except errors.NodeUnavailable as error:  # none reachable in time: nothing sent
                failures.append(str(error))
                raise self._gave_up(last, maybe_stored, failures) from error
            try:
                answer = client.call(dict(header), payload)[0]
                unknown = 0
                last = status = PutStatus(answer["status"])
                if status not in RETRIED:
                    return answer
                maybe_stored = maybe_stored or not nothing_stored(answer)
                failures.append(f"{self._client_address()}: {answer['status']}")
                if status in (PutStatus.SLAVE_NOT_AVAILABLE,  # replicas must catch up first
                              PutStatus.NOT_ENOUGH_REPLICAS_AFTER_APPEND):
                    time.sleep(self.retry_backoff_ms / 1000)  # a back-off, not a sync
            except errors.NotEnoughReplicas as error:  # nothing stored by this request...
                if not maybe_stored:
                    raise
                failures.append(f"{self._client_address()}: {error}")  # ...an earlier one
                time.sleep(self.retry_backoff_ms / 1000)  # a back-off: the ISR must grow
            except errors.NotMaster as error:  # (NotLeader too, which may name the leader)
                unknown = 0
                failures.append(f"{self._client_address()}: not the leader")
                self._move_to(getattr(error, "leader_address", None))
            except errors.UnknownGroup as error:
                unknown += 1
                if unknown >= len(self.addresses):
                    raise
                failures.append(f"{self._client_address()}: {error}")
                self._move_to(None)
            except errors.NodeUnavailable as error:
                maybe_stored, last = True, None
                failures.append(str(error))
                self._move_to(None)
            if time.monotonic() >= deadline:
                raise self._gave_up(last, maybe_stored, failures)
            self.retries += 1

    def _gave_up(self, last: PutStatus | None, maybe_stored: bool,
                 failures: list[str]) -> errors.MqlogError:
        """The error of a write undecided at its deadline: "nothing stored" when no
        attempt can have stored it, else its outcome is unknown (``undecided``)."""
        if not maybe_stored and last not in STORED_UNDECIDED:
            return not_stored(last, f"sequence {self.sequence} of producer "
                              f"{self.producer_id!r}", self.retry_timeout_s, failures)
        return undecided(last, self.producer_id, self.sequence, self.retry_timeout_s,
                         failures)

    def _client_now(self, deadline: float) -> Client:
        """A connection to the node in turn, or to the next one that answers; the last
        NodeUnavailable once ``deadline`` (time.monotonic) has passed without one."""
        while self._client is None:
            address = self.addresses[self._turn % len(self.addresses)]
            try:
                self._client = Client(address, timeout_s=self.timeout_s, group=self.group)
            except errors.NodeUnavailable:
                self._turn += 1
                if time.monotonic() >= deadline:
                    raise
                time.sleep(self.retry_backoff_ms / 1000)  # a back-off, not a synchronisation
        return self._client

    def _client_address(self) -> str:
        return self._client.address if self._client else "?"

    def _move_to(self, address: str | None) -> None:
        """Drop the connection; next time use ``address`` (the leader's) or the next node."""
        if self._client is not None:
            self._client.close()
            self._client = None
        if address is not None and address not in self.addresses:
            self.addresses.append(address)  # a member added since this client started
        if address in self.addresses:
            self._turn = self.addresses.index(address)
        else:
            self._turn += 1
            time.sleep(self.retry_backoff_ms / 1000)  # an election takes time: back off

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> GroupClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
