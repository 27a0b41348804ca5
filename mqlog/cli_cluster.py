"""``mqlog produce --bootstrap`` and ``mqlog consume --bootstrap``: the same two commands
against a cluster's topics instead of a store directory (Kafka's console producer and
consumer).

Theory of operation
-------------------
``--bootstrap HOST:PORT[,...]`` names brokers (processes with the broker role: they
answer the metadata a client needs, as Kafka's bootstrap.servers do); one
``mqlog.ClusterClient`` does the rest: it finds each partition's leader, follows it when
it moves, and sends a write whose outcome is unknown again with the same producer
sequence, so a line is stored once. A partition is the cluster's word for a store's
queue: ``--queue N`` names partition N.

* produce: each line of stdin (or --file) is one record; without ``--queue`` the
  partition is chosen as a Kafka producer chooses it (murmur2 of the key, round-robin
  without one). ``--batch N`` sends N lines of one partition per request. ``--acks``
  is Kafka's (all, 1, 0). The summary names each partition's offsets.
* consume: every partition of the topic (or ``--queue N``), each from ``--from-offset``
  (default 0) to its committed end, from its leader.
* ``--timeout-s`` bounds each call's moving on (ClusterClient's retry_timeout_s): a
  topic the metadata does not show, a leader that does not come back, is one error line
  after it.
* What only a store has (a consumer group's offsets, times, tags filters, --follow,
  --config, --sync, properties) is refused with a usage error that says so, before
  anything is sent.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from mqlog import errors
from mqlog.cluster_client import ClusterClient, ProducedRecord

FETCH_COUNT_MAX = 1024  # records asked of one fetch
FETCH_SIZE_BYTES_MAX = 4 << 20  # bytes asked of one fetch (a bigger record still comes)

ACKS = ("all", "1", "0")
CLUSTER_ONLY = ("acks", "timeout_s")
STORE_ONLY_PRODUCE = ("config_file", "sync", "properties")
STORE_ONLY_CONSUME = ("config_file", "from_time", "group", "commit", "tags", "follow",
                      "timeout_ms", "poll_ms")


def check_target(ctx: click.Context, data_dir: Any, bootstrap: str | None,
                 store_only: Iterable[str], cluster_only: Iterable[str]) -> None:
    """Exactly one of DATA_DIR and --bootstrap, and no option the other one owns."""
    if (data_dir is None) == (bootstrap is None):
        raise click.UsageError("give DATA_DIR (a store directory) or --bootstrap "
                               "HOST:PORT[,...] (a cluster's brokers), one of the two")
    wrong = store_only if bootstrap is not None else cluster_only
    given = [name for name in wrong
             if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT]
    if given:
        flags = ", ".join("--" + _flag(name) for name in given)
        where = ("a store directory, not with --bootstrap" if bootstrap is not None
                 else "--bootstrap (a cluster), not with DATA_DIR")
        raise click.UsageError(f"{flags}: only for {where}")


def _flag(name: str) -> str:
    return {"config_file": "config", "properties": "property", "count_max": "max"}.get(
        name, name).replace("_", "-")


class Tally:
    """Offsets each partition got, for the summary line."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.count = 0
        self.offsets: dict[int, list[int]] = {}  # partition -> [first, last]

    def add(self, sent: ProducedRecord, count: int) -> None:
        self.count += count
        first, last = sent.offset, sent.offset + count - 1
        if sent.offset < 0:  # acks=0: nothing known but the partition
            first = last = -1
        seen = self.offsets.setdefault(sent.partition, [first, last])
        seen[1] = last

    def as_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "count": self.count,
                "partitions": {str(partition): {"first_offset": first, "last_offset": last}
                               for partition, (first, last) in sorted(self.offsets.items())}}

    def summary(self) -> str:
        parts = [f"partition {partition}: " + (f"offsets {first}..{last}" if first >= 0
                                               else "sent (acks=0)")
                 for partition, (first, last) in sorted(self.offsets.items())]
        noun = "record" if self.count == 1 else "records"
        return f"produced {self.count} {noun} to {self.topic!r}: " + (", ".join(parts) or
                                                                       "nothing to send")


def produce(bootstrap: str, topic: str, partition: int | None, lines: Iterable[bytes],
            key: str | None, key_separator: bytes | None, tags: str | None, batch: int,
            acks: str, timeout_s: float, as_json: bool) -> None:
    """Send each line as one record (``batch`` lines of one partition per request)."""
    tally = Tally(topic)
    with cluster_client(bootstrap, timeout_s, acks) as cluster:
        chunk: list[bytes] = []
        for line in lines:
            if key_separator is not None:
                found, sep, body = line.partition(key_separator)
                record_key, line = (found.decode("utf-8", "replace"), body) if sep else \
                    (None, line)
                tally.add(cluster.produce(topic, line, record_key, partition, tags), 1)
                continue
            chunk.append(line)
            if len(chunk) >= batch:
                tally.add(cluster.produce_batch(topic, chunk, key, partition, tags), len(chunk))
                chunk = []
        if chunk:
            tally.add(cluster.produce_batch(topic, chunk, key, partition, tags), len(chunk))
    if as_json:
        click.echo(json.dumps(tally.as_dict()))
    else:
        click.echo(tally.summary(), err=True)


def consume(bootstrap: str, topic: str, partition: int | None, from_offset: int | None,
            count_max: int | None, timeout_s: float, write: Callable[[Any], object]) -> None:
    """Print the committed records of each partition (or the one named), in order."""
    left = count_max
    with cluster_client(bootstrap, timeout_s) as cluster:
        partitions = [partition] if partition is not None else \
            range(cluster.partitions_for(topic))
        for index in partitions:
            offset = from_offset or 0
            while left is None or left > 0:
                asked = FETCH_COUNT_MAX if left is None else min(left, FETCH_COUNT_MAX)
                records = cluster.fetch(topic, index, offset, asked, FETCH_SIZE_BYTES_MAX)
                if not records:
                    break
                for record in records:
                    write(record)
                offset = records[-1].offset + 1
                left = None if left is None else left - len(records)


@contextmanager
def cluster_client(bootstrap: str, timeout_s: float, acks: str = "all") -> Iterator[Any]:
    """A ClusterClient that gives up after ``timeout_s``; controllers named instead of
    brokers (the --bootstrap of ``mqlog topics``, a user's first guess: the client's
    NotABroker), or standalone nodes (a master-slave or Raft node, no cluster's broker:
    NotABroker too, at once), are said plainly, in the command's words, with what to use
    instead."""
    try:
        with ClusterClient(bootstrap, acks=acks, retry_timeout_s=timeout_s) as cluster:
            yield cluster
    except errors.NotABroker as error:
        if not error.standalone:
            raise errors.NotABroker(
                f"--bootstrap {bootstrap} names controllers; produce and consume need "
                "brokers (`mqlog brokers --bootstrap CONTROLLERS` lists their addresses, the"
                " [controller] voters are not them)", addresses=error.addresses) from None
        said = [f"{address} is a controller, not a broker" for address in error.addresses
                if address not in error.standalone]
        said += [f"{address} is not a cluster's broker but a standalone node (a "
                 "master-slave or Raft node of docs/REPLICATION.md: no [controller] voters)"
                 for address in error.standalone]
        raise errors.NotABroker(
            f"--bootstrap {bootstrap}: " + "; ".join(said) + ". produce and consume "
            "--bootstrap need a cluster's brokers; a standalone node takes writes from "
            "mqlog.Client(ADDRESS) or mqlog.GroupClient([ADDRESSES]) in Python, and `mqlog "
            "consume DATA_DIR` (the node's data_dir; DATA_DIR/GROUP on a node of several "
            "groups) reads its store beside it",
            addresses=error.addresses, standalone=error.standalone) from None
