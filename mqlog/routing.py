"""``mqlog.Producer``: produce to a topic whose queues are spread over master-slave
groups, finding them through the route registry, and going around a group that is down.

RocketMQ's client behaviour, as its documentation describes it:

* A topic's route (from any registry) lists each group that serves it, its queue count,
  its master and its slaves. Routes are cached for ``route_refresh_ms``.
* An unordered send takes the next (group, queue) in turn among groups whose master is
  known and not in back-off. If the send fails because the master is unreachable or is
  no longer master, the group backs off for ``failover_backoff_ms``, the route is
  fetched again, and the send is retried on another group's queue — once per group.
* An ordered send names its queue (``queue=(group, queue_id)``): it never moves, so it
  fails when that group's master is down (ordering would break otherwise).
* Reads keep working while a master is down: ``fetch`` asks the group's master, then
  its slaves (which serve reads with ``slave_read_enable``).

The outcome of a send whose connection broke is unknown (it may have been stored); a
retry can therefore store a record twice, as in RocketMQ and Kafka without idempotence.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from mqlog import errors
from mqlog.client import Client
from mqlog.results import PutResult

_FAILOVER_ERRORS = (errors.NodeUnavailable, errors.NotMaster)


@dataclass(frozen=True)
class SendResult:
    group: str
    queue_id: int
    result: PutResult


class Producer:
    def __init__(self, registries: str | list[str], *, route_refresh_ms: int = 1_000,
                 failover_backoff_ms: int = 3_000, timeout_s: float = 10.0) -> None:
        self.registries = [registries] if isinstance(registries, str) else list(registries)
        self.route_refresh_ms = route_refresh_ms
        self.failover_backoff_ms = failover_backoff_ms
        self.timeout_s = timeout_s
        self._routes: dict[str, tuple[float, list[dict[str, Any]]]] = {}
        self._backoff_until: dict[str, float] = {}
        self._clients: dict[str, Client] = {}
        self._turn = 0

    # --- sending ---------------------------------------------------------------------

    def send(self, topic: str, body: bytes, key: str | None = None, tags: str | None = None,
             queue: tuple[str, int] | None = None) -> SendResult:
        """Store one record on some group's master (or on ``queue``'s, if given)."""
        if queue is not None:
            group = self._group(topic, queue[0])
            if group["master"] is None:
                raise errors.NodeUnavailable(f"group {queue[0]} has no master now; an "
                                             "ordered send waits for it to come back")
            return SendResult(queue[0], queue[1], self._client(group["master"]).produce(
                topic, body, queue[1], key, tags))
        failures = []
        for group, queue_id in self._candidates(topic):
            try:
                result = self._client(group["master"]).produce(topic, body, queue_id, key,
                                                               tags)
                return SendResult(group["group"], queue_id, result)
            except _FAILOVER_ERRORS as error:
                failures.append(f"{group['group']}: {error}")
                self._backoff_until[group["group"]] = \
                    time.monotonic() + self.failover_backoff_ms / 1000
                self._drop_client(group["master"])
                self._routes.pop(topic, None)
        raise errors.NodeUnavailable(f"no group could take a record of {topic!r}: "
                                     + ("; ".join(failures) or "no group serves it"))

    def _candidates(self, topic: str) -> list[tuple[dict[str, Any], int]]:
        """One (group, queue id) per usable group, starting at the next in turn."""
        now = time.monotonic()
        groups = [group for group in self.route(topic) if group["master"] is not None
                  and group["queues"] > 0 and self._backoff_until.get(group["group"], 0) <= now]
        self._turn += 1
        ordered = groups[self._turn % len(groups):] + groups[:self._turn % len(groups)] \
            if groups else []
        return [(group, self._turn // max(1, len(groups)) % group["queues"])
                for group in ordered]

    # --- reading -----------------------------------------------------------------------

    def fetch(self, topic: str, group: str, queue_id: int = 0, offset: int = 0,
              max_count: int = 32) -> list:
        """Records of one queue of ``group``: from its master, else from a slave."""
        route = self._group(topic, group)
        failures = []
        for address in filter(None, [route["master"], *route["slaves"]]):
            try:
                return self._client(address).fetch(topic, queue_id, offset, max_count)
            except _FAILOVER_ERRORS as error:
                failures.append(f"{address}: {error}")
                self._drop_client(address)
        raise errors.NodeUnavailable(f"no node of group {group} could serve the fetch: "
                                     + "; ".join(failures))

    # --- routes and connections ----------------------------------------------------------

    def route(self, topic: str) -> list[dict[str, Any]]:
        cached = self._routes.get(topic)
        if cached is not None and time.monotonic() < cached[0]:
            return cached[1]
        failures = []
        for address in self.registries:
            try:
                with Client(address, timeout_s=self.timeout_s) as registry:
                    groups = registry.call({"kind": "route", "topic": topic})[0]["groups"]
                self._routes[topic] = (time.monotonic() + self.route_refresh_ms / 1000,
                                       groups)
                return groups
            except errors.MqlogError as error:
                failures.append(f"{address}: {error}")
        raise errors.NodeUnavailable("no route registry answered: " + "; ".join(failures))

    def _group(self, topic: str, name: str) -> dict[str, Any]:
        for group in self.route(topic):
            if group["group"] == name:
                return group
        raise errors.InvalidArgument(f"group {name!r} does not serve topic {topic!r} (or "
                                     "has not registered)")

    def _client(self, address: str) -> Client:
        client = self._clients.get(address)
        if client is None:
            client = self._clients[address] = Client(address, timeout_s=self.timeout_s)
        return client

    def _drop_client(self, address: str) -> None:
        client = self._clients.pop(address, None)
        if client is not None:
            client.close()

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
