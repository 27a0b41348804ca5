"""Requests of several records, cut short by the simulated store, and the checker of the
PartiallyStored rule (the Raft and ISR simulators').

The rule (driver.py's ``propose_write``, the one code path every layer and node.py run):
a request whose records are stored in part — the store cut the batch, or a retry found a
copy cut inside the request on the replica that led before — is answered PartiallyStored
(naming ``count``, the records stored: "these are stored, send the rest as a new
request") only after the layer's verdict committed them and a record of the answering
leader's own epoch after them (then no later leader holds the rest of the request); any
other verdict is answered as it is (the outcome is unknown: the client retries the
whole request).

The workload. On some seeds (``BATCH_SEED_SHARE``, drawn apart from the seed's generator,
like lives.py's restarts: a seed without batches runs as it did before them; with
``--no-batches``, none has them: a seed found before them runs as it did) the client
sends requests of 1..``RECORDS_MAX`` records, and the store a driver writes through
(``BatchLimitedStore``) stores only the first few records of some batches
(``CUT_PROBABILITY``): a batch limit, a disk full mid-batch (the engine's put_batch
stores all or refuses; the driver's rule covers a store that cuts, and the cuts here
make partly stored requests common). The rest of the run cuts
copies too: a follower's copy ends where an Entries or a fetch ended, at a record, and a
leader change makes that copy the one a retry finds. A client told PartiallyStored(k)
sends the request's other records again as a new request (a new sequence).

The checker (``PartialChecker``). For each request the client was answered — PUT_OK for
all of its n records, or PartiallyStored(k) — let m be n or k. The invariant:

* at the moment of a PartiallyStored(k) answer, the answering replica has committed the
  k records (its committed position covers them: the verdict came first), and they are
  the first k records of the request, where its producer table says;
* in the committed log, the records tagged with that request's (producer id, epoch,
  sequence) are exactly its first m records, in order, once — never one more: a record
  the client was told was not stored is never committed under the request's tag (the
  client sent it again under a new one: it would be stored twice), and never one less
  (a record the client was told was stored is never lost). A layer whose promise allows
  a loss (ISR's acks=1, a power loss under replica_ack = "written") says so per request
  (``may_lose``): then a shorter run is no violation, a longer one still is.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from mqlog import format as fmt
from mqlog.errors import PartiallyStored
from mqlog.replication.idempotence import ProducerTag, Stored, producer_tags
from mqlog.results import PutStatus

BATCH_SEED_SHARE = 0.5  # seeds whose client sends requests of several records
RECORDS_MAX = 4  # records in one request, on those seeds
CUT_PROBABILITY = 0.25  # a batch the store stores only in part, on those seeds


@contextlib.contextmanager
def single_records() -> Iterator[None]:
    """Runs of the workload of before batches (``--no-batches``): no seed draws them, so
    a seed found then runs as it did."""
    global BATCH_SEED_SHARE
    share, BATCH_SEED_SHARE = BATCH_SEED_SHARE, 0.0
    try:
        yield
    finally:
        BATCH_SEED_SHARE = share


class Batches:
    """How many records each request has, and where the store cuts a batch (drawn from
    a generator of the seed's own, not the seed's)."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(f"{seed}/batches")
        self.on = self._rng.random() < BATCH_SEED_SHARE

    def records(self) -> int:
        """The number of records of the client's next request."""
        return self._rng.randint(1, RECORDS_MAX) if self.on else 1

    def limit(self, count: int) -> int:
        """How many of a batch of ``count`` records the store stores (the first ones)."""
        if count > 1 and self._rng.random() < CUT_PROBABILITY:
            return self._rng.randint(1, count - 1)
        return count

    @property
    def batch_limit(self) -> Callable[[int], int] | None:
        """What the simulated stores impose (None on seeds without batches)."""
        return self.limit if self.on else None


class BatchLimitedStore:
    """A store as a driver writes through it in the simulators: a put of a batch stores
    its first ``limit(len(bodies))`` records only (the rest are not stored, and the
    result says how many were); everything else is the store's own."""

    def __init__(self, store: Any, limit: Callable[[int], int]) -> None:
        self._store, self._limit = store, limit

    def put_nowait(self, topic: Any, bodies: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(bodies, list) and len(bodies) > 1:
            bodies = bodies[:self._limit(len(bodies))]
        return self._store.put_nowait(topic, bodies, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def bodies_of(name: str, count: int, padding: bytes) -> list[bytes]:
    """The bodies of a request of ``count`` records (one record: its body as before
    batches existed)."""
    if count == 1:
        return [name.encode() + padding]
    return [f"{name}/{index}".encode() + padding for index in range(count)]


def describe(answer: Any) -> str:
    """An answer as a trace line shows it."""
    if isinstance(answer, PartiallyStored):
        return f"PartiallyStored({answer.count})"
    return str(answer.value)


@dataclass
class Told:
    """What the client was told of one request: these records are committed."""

    bodies: list[bytes]
    may_lose: bool  # the layer's promise allows losing them (acks=1, ...)


class PartialChecker:
    """The invariant of the module docstring, over the answers the client got."""

    def __init__(self) -> None:
        self.told: dict[ProducerTag, Told] = {}
        self.partial = 0  # PartiallyStored answers checked

    def answered(self, producer: ProducerTag, bodies: list[bytes], answer: Any,
                 stored: Stored | None, committed: int, may_lose: bool = False) -> str:
        """The client got ``answer`` for its request ``producer`` of ``bodies``; the
        answering replica's table has ``stored`` for it and its committed position is
        ``committed``. Returns the problem ('' if none)."""
        if answer is PutStatus.PUT_OK:
            self.told[producer] = Told(list(bodies), may_lose)
            return ""
        if not isinstance(answer, PartiallyStored):
            return ""  # (the outcome is unknown: the client retries it whole)
        self.partial += 1
        count = answer.count
        self.told[producer] = Told(list(bodies[:count]), may_lose)
        if not 0 < count < len(bodies) or stored is None or stored.count != count:
            return (f"{_name(producer)} answered PartiallyStored({count}) of {len(bodies)} "
                    f"records; its copy there holds {stored.count if stored else 'none'}")
        if committed < stored.end:
            return (f"{_name(producer)} answered PartiallyStored({count}) before its "
                    f"records were committed (they end at {stored.end}, the committed "
                    f"position is {committed})")
        return ""

    def check(self, committed_log: bytes, excused: Callable[[ProducerTag], bool]
              = lambda producer: False) -> list[str]:
        """The committed log (from position 0) against every answer (``excused``: a
        request whose check the layer's promise waives)."""
        found: dict[ProducerTag, list[bytes]] = {}
        for producer, body in committed_records(committed_log):
            if producer in self.told:
                found.setdefault(producer, []).append(body)
        problems = []
        for producer, told in sorted(self.told.items()):
            bodies = found.get(producer, [])
            if bodies == told.bodies or excused(producer):
                continue
            if len(bodies) > len(told.bodies):
                problems.append(f"{_name(producer)}: {len(bodies)} records committed under "
                                f"its tag, the client was told {len(told.bodies)} were "
                                "stored (the others were sent again as a new request)")
            elif bodies != told.bodies[:len(bodies)]:
                problems.append(f"{_name(producer)}: the records committed under its tag "
                                "are not the ones the client sent, in order")
            elif not told.may_lose:
                problems.append(f"{_name(producer)}: the client was told {len(told.bodies)} "
                                f"records were committed; the log has {len(bodies)}")
        return problems


def committed_records(log: bytes) -> Iterator[tuple[ProducerTag, bytes]]:
    """(producer tag, body) of each tagged record of a log read from position 0, in
    order (blanks and control records have none)."""
    at = 0
    while at + fmt.RECORD_HEADER_SIZE <= len(log):
        header = fmt.RecordHeader._make(fmt.RECORD_HEADER.unpack_from(log, at))
        if header.size < fmt.BLANK_SIZE_MIN:  # (no record is this short: not a boundary)
            return
        if header.magic == fmt.RECORD_MAGIC:
            record = log[at:at + header.size]
            for producer, _stored in producer_tags(at, record):
                yield producer, record[header.size - header.body_size:]
        at += header.size


def _name(producer: ProducerTag) -> str:
    producer_id, sequence, epoch = producer
    return f"request {producer_id} e{epoch} s{sequence}"
