"""Simulated metadata readers: clients that read the cluster's metadata as real clients
do, through the production code, and the checkers of what they read (controller.py and
isr.py run them).

The readers. Two are producers' clients: each refreshes (``READ_PROBABILITY`` per tick)
as ``ClusterClient.metadata`` does, asking ``cluster_metadata`` of the brokers in the
client's own order (the broker it is connected to first, then those its view knows, then
its bootstrap: every broker), the next one when one fails. Two are operators running
``mqlog topics describe``: each asks ``describe_cluster`` of a controller drawn at random.
A request travels the simulated network as the brokers' requests do (delayed, dropped;
a node that is down refuses at once, one that dies meanwhile never answers and the
reader times out). At a controller it goes through ``dispatch`` (host.py: the broker
service's own code, so ``Controller.describe`` answers with its ``caught_up`` rule); at a
broker, through its agent's ``describe`` (what join_cluster's ``cluster_metadata``
handler answers). Every answer goes to the reader's ``ClusterClient`` — the real one,
whose connections hand over what the simulator delivered (``SimClusterClient``) — so its
own ``metadata`` decodes it (``metadata_from``), keeps the newer of two states, merges the
reported Raft leaders by term (``LeaderTable``), lays them over the state, and drops a
connection that failed, exactly as a producer's client does.

Readers draw from a random generator of their own (seeded from the seed), never from
the simulation's: adding them changes no other choice of a run, so every seed's faults
and workload are what they were without them.

Checkers. The first two check each answer when the node gives it, in the order it gives
them (a controller is caught up only once it has folded a commit its leader made in its
own term: --break caught_up_on_leader_known, the rule it had before, fails them):
* monotonic reads per node: no answer shows a state (a position in the controller's log)
  older than one the same node answered before — a broker within one process life (a
  new life starts its view over), a controller across its restarts too, unless its
  crash took that position from its log (a power loss takes what was not flushed);
* never an empty state once the cluster has one: no answer shows no broker and no
  topic once a registration was acknowledged ``EMPTY_GRACE_TICKS`` before (the most a
  caught-up follower can lag: see there);
* liveness (``unsettled``, once the cluster healed): every reader's view equals the
  controller leader's committed state (a producer's only while some broker is up to
  ask), and every partition's leader in it is a live, unfenced broker that hosts the
  partition's group — and, where the simulator runs the groups' cores (``leads``), the
  one that serves it. Where no cores run, only the leaders the controller decides (ISR
  partitions) are held to that.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from typing import Any

from mqlog.cluster_client import ClusterClient, metadata_from
from mqlog.errors import MqlogError, NodeUnavailable
from mqlog.replication.controller.state import ClusterMetadata
from mqlog.sim.harness import SIM_CLUSTER_ID

READERS = 4  # two producers' ClusterClients, two operators describing
READ_PROBABILITY = 0.3  # per tick, per reader not waiting for an answer: it asks
# A follower that says it is caught up may lag its leader, but not for long: it hears the
# commit with the leader's next Entries (every few ticks), or it stops knowing a leader
# once its election timeout passes without one (15..30 ticks here; delays add up to 8 a
# hop). So an empty state is a violation once a registration was acknowledged this long
# before: no lag explains it.
EMPTY_GRACE_TICKS = 100


class SimClusterClient(ClusterClient):
    """A ClusterClient whose connections hand over the answers the simulator delivers:
    ``take`` runs the client's own ``metadata`` refresh on one (decode, keep the newer
    state, merge the leaders, overlay; a failure drops that connection), and
    ``addresses`` is the client's own order of asking (the brokers it is connected to
    first, then those its view knows, then its bootstrap). It opens no socket."""

    def __init__(self, name: str, bootstrap: list[str]) -> None:
        super().__init__(bootstrap, producer_id=name,
                         metadata_max_age_ms=1 << 50)  # (the view only changes in take)
        self._delivered: tuple[dict[str, Any] | None, MqlogError | None] = (None, None)
        self._only = ""  # the address whose answer ``take`` hands over

    def addresses(self) -> list[str]:
        """Where the client's next refresh asks, in its order."""
        return ClusterClient._metadata_addresses(self)

    def take(self, address: str, answer: dict[str, Any] | None,
             error: MqlogError | None) -> ClusterMetadata | None:
        """Refresh from what ``address`` answered; the view, or None if it failed."""
        self._delivered, self._only = (answer, error), address
        self._fetched_at = -math.inf  # (no back-off: the simulator decides when to ask)
        try:
            return self.metadata(refresh=True)
        except NodeUnavailable:
            return None
        finally:  # (``view`` reads what the answers left, asking no one)
            self._fetched_at = time.monotonic()
            self._only = ""

    def view(self) -> ClusterMetadata | None:
        """The view the answers left (None before the first)."""
        if self.refreshes == 0:
            return None
        return self.metadata()

    # --- the connections: the delivered answer ------------------------------------------

    def _metadata_addresses(self) -> list[str]:
        return [self._only] if self._only else []

    def _connection(self, address: str, group: str | None = None) -> Any:
        self._connections.setdefault(address, self)  # type: ignore[arg-type]
        # (connected: asked first next time)
        return self

    def call(self, header: dict[str, Any], payload: bytes = b"",
             timeout_s: float | None = None) -> tuple[dict[str, Any], bytes]:
        del payload, timeout_s  # (the simulated network's time, not a socket's)
        answer, error = self._delivered
        if error is not None:
            raise error
        if answer is None:
            raise NodeUnavailable(f"{self._only} gave no answer")
        return answer, b""

    def _drop(self, address: str) -> None:
        self._connections.pop(address, None)


class Reader:
    """One client reading the metadata (see the module docstring): a producer's
    ClusterClient (``cluster_metadata`` from the brokers, in the client's own order), or
    an operator's ``mqlog topics describe`` (``describe_cluster`` from a controller drawn
    at random), whose answers go to a ClusterClient too."""

    def __init__(self, readers: Readers, name: str, operator: bool) -> None:
        self.readers, self.name, self.operator = readers, name, operator
        self.client = SimClusterClient(name, [readers.address(name) for name in
                                              sorted(readers.sim.brokers)])
        self.asking = False
        self.closed = False  # (a reader's life never ends; the harness's timers ask it)

    def maybe_read(self) -> None:
        readers = self.readers
        if self.asking or readers.rng.random() >= READ_PROBABILITY:
            return
        self.asking = True
        if self.operator:
            names = sorted(readers.sim.nodes)
            target = names[readers.rng.randrange(len(names))]

            def done(answer: dict[str, Any] | None, error: MqlogError | None) -> None:
                self.asking = False
                self.client.take(target, answer, error)
            readers.ask(self, "controller", target, done)
        else:
            self._walk(self.client.addresses(), 0)

    def _walk(self, order: list[str], index: int) -> None:
        """Ask ``order[index]``; on a failure the next one, as ``metadata`` does."""
        if index == len(order):
            self.asking = False  # (none answered: the client's NodeUnavailable)
            return
        address = order[index]

        def done(answer: dict[str, Any] | None, error: MqlogError | None) -> None:
            if self.client.take(address, answer, error) is not None:
                self.asking = False
            else:
                self._walk(order, index + 1)
        self.readers.ask(self, "broker", self.readers.broker_at(address), done)


class Readers:
    """The readers of one simulation, their network and their checks."""

    def __init__(self, sim: Any, seed: int, count: int = READERS) -> None:
        self.sim = sim
        self.rng = random.Random(f"{seed}/readers")  # (never the simulation's: see above)
        self.readers = [Reader(self, f"r{index}", operator=index >= count // 2)
                        for index in range(count)]
        # node -> (its life, the newest position it answered, the life that answered it)
        self.newest: dict[str, tuple[int, int]] = {}
        self.registered_at: int | None = None  # a registration's answer arrived then
        self.answers = 0

    def tick(self) -> None:
        for reader in self.readers:
            reader.maybe_read()

    @staticmethod
    def address(broker: str) -> str:
        """Broker ``broker``'s address (what its agent registers)."""
        return f"{broker}.sim:9092"

    def broker_at(self, address: str) -> str:
        """The broker at ``address`` ("" for none: the connection is refused)."""
        name = address.partition(".sim:")[0]
        return name if name in self.sim.brokers and self.address(name) == address else ""

    # --- the network (the brokers' requests' rules, with the readers' own draws) -----------

    def ask(self, reader: Reader, kind: str, target: str,
            done: Callable[[dict[str, Any] | None, MqlogError | None], None]) -> None:
        sim, settled = self.sim, [False]

        def give(answer: dict[str, Any] | None, error: MqlogError | None) -> None:
            if not settled[0]:  # (the first of an answer and the client's timeout wins)
                settled[0] = True
                done(answer, error)
        if not self._up(kind, target):
            sim.later(0, reader, lambda: give(None, NodeUnavailable(f"cannot reach {target}")))
            return
        sim.later(sim.call_timeout_ticks, reader, lambda: give(None, NodeUnavailable(
            f"{target} did not answer in time")))
        life = self._life(kind, target)
        if not self._lost():
            sim.later(self._delay(), None, lambda: self._arrive(reader, kind, target, life,
                                                                give))

    def _arrive(self, reader: Reader, kind: str, target: str, life: int,
                give: Callable[[dict[str, Any] | None, MqlogError | None], None]) -> None:
        sim = self.sim
        if not self._up(kind, target) or self._life(kind, target) != life:
            return  # (its connection broke: the reader's timeout answers)
        if self._paused(kind, target):
            sim.later(1, None, lambda: self._arrive(reader, kind, target, life, give))
            return
        answer: dict[str, Any] | None = None
        error: MqlogError | None = None
        try:
            answer = self.answer_of(kind, target)
            self.answers += 1
            self.check_answer(kind, target, answer)  # (in the order the node answers)
        except MqlogError as refused:
            error = refused
        if not self._lost():
            sim.later(self._delay(), reader, lambda: give(answer, error))

    def answer_of(self, kind: str, target: str) -> dict[str, Any]:
        """What the target's own request handler answers now."""
        from mqlog.replication.controller.host import dispatch

        if kind == "controller":
            found = dispatch(self.sim.nodes[target].controller, {"kind": "describe_cluster"},
                             SIM_CLUSTER_ID)
            assert isinstance(found, dict)
            return found
        agent = self.sim.brokers[target].agent
        return dict(agent.describe())  # (join_cluster's cluster_metadata handler)

    def _up(self, kind: str, target: str) -> bool:
        if not target:
            return False  # (an address no broker has)
        if kind == "controller":
            return bool(self.sim.nodes[target].up)
        return bool(self.sim.brokers[target].alive)

    def _life(self, kind: str, target: str) -> int:
        if kind == "controller":
            return int(self.sim.nodes[target].incarnation)
        return int(self.sim.brokers[target].lives)

    def _paused(self, kind: str, target: str) -> bool:
        if kind == "controller":
            return bool(self.sim.nodes[target].paused)
        return bool(self.sim.broker_paused(target))

    def _lost(self) -> bool:
        return self.rng.random() < self.sim.network.options.drop_probability

    def _delay(self) -> int:
        return self.rng.randint(1, self.sim.network.options.delay_ticks_max)

    # --- checkers -------------------------------------------------------------------------

    def registered(self) -> None:
        """A broker's registration was acknowledged: its record is committed."""
        if self.registered_at is None:
            self.registered_at = self.sim.clock[0]

    def check_answer(self, kind: str, target: str, answer: dict[str, Any]) -> None:
        """What ``target`` answers now, against what it answered before."""
        try:
            state, _leaders = metadata_from(answer)
        except MqlogError as error:  # (real nodes: never garbage)
            self.sim.violation(f"{kind} {target} answered malformed metadata: {error}")
            return
        where = f"{kind} {target}"
        settled_at = self.registered_at
        if settled_at is not None and settled_at + EMPTY_GRACE_TICKS < self.sim.clock[0] \
                and not state.brokers and not state.topics:
            self.sim.violation(f"{where} answered an empty cluster state (position "
                               f"{state.position}) after a registration was acknowledged "
                               f"at tick {settled_at}")
        life = self._life(kind, target)
        known = self.newest.get(where)
        # (a broker's new life starts its view over: only the empty check holds for it)
        if known is not None and not (kind == "broker" and known[0] != life) and \
                state.position < known[1]:
            self.sim.violation(
                f"{where} answered a state at position {state.position}, older than the "
                f"one at {known[1]} it answered before"
                + ("" if known[0] == life else " its restart (its log kept that)"))
            return
        self.newest[where] = (life, state.position)

    def crashed(self, node: str, durable: int) -> None:
        """Controller ``node`` lost its power: its log keeps [.., durable) only, so after
        its restart it may answer as far back as that (what it folded past it is gone)."""
        known = self.newest.get(f"controller {node}")
        if known is not None and known[1] > durable:
            self.newest[f"controller {node}"] = (known[0], durable)

    def unsettled(self, state: ClusterMetadata, leads: Callable[[str, str], bool | None]
                  ) -> str:
        """Why the readers have not converged on ``state`` (the controller leader's
        committed one) yet ("" once they have). ``leads(broker, group)``: whether that
        broker's replica of the group serves it (None where the simulator runs no cores)."""
        brokers = any(slot.alive for slot in self.sim.brokers.values())
        for reader in self.readers:
            if not reader.operator and not brokers:
                continue  # (every broker is down: a client reads nothing, and that is fine)
            view = reader.client.view()
            if view is None:
                return f"reader {reader.name} has no view yet"
            if (view.brokers, _unled(view.topics)) != (state.brokers, _unled(state.topics)):
                return f"reader {reader.name}'s view is at {view.position}"
            why = self._leaders_problem(reader.name, view, leads)
            if why:
                return why
        return ""

    def _leaders_problem(self, reader: str, view: ClusterMetadata,
                         leads: Callable[[str, str], bool | None]) -> str:
        """Why a partition's leader in ``view`` is not where its writes go ("" if each
        is). Where no cores run (``leads`` None), only the leaders the controller
        decides (ISR partitions) are held to it: a Raft or master-slave partition's
        leader there is the creation's guess, or a role nobody plays."""
        sim = self.sim
        for topic in view.topics.values():
            for index, part in enumerate(topic.partitions):
                group = f"{topic.name}-{index}"
                cores = any(leads(name, group) is not None for name in sim.brokers)
                if not cores and topic.layer != "isr":
                    continue
                serving = [name for name, slot in sorted(sim.brokers.items())
                           if slot.alive and leads(name, group)]
                slot = sim.brokers.get(part.leader)
                info = view.brokers.get(part.leader)
                if not part.leader:
                    if serving:
                        return f"reader {reader} sees no leader of {group}, led by {serving}"
                elif slot is None or not slot.alive or info is None or info.fenced:
                    return f"reader {reader} sees {group} led by {part.leader}, not live"
                elif group not in sim.hosted(slot):
                    return f"reader {reader} sees {group} led by {part.leader}, not its host"
                elif cores and part.leader not in serving:
                    return (f"reader {reader} sees {group} led by {part.leader}; "
                            f"{serving or 'no broker'} serves it")
        return ""


def _unled(topics: Any) -> dict[str, Any]:
    """``topics`` without the Raft partitions' leaders and epochs (a view shows the
    reported ones laid over the state; the state, what its records say)."""
    from dataclasses import replace

    found = {}
    for name, topic in topics.items():
        if topic.layer == "raft":
            topic = replace(topic, partitions=tuple(
                replace(part, leader="", leader_epoch=0) for part in topic.partitions))
        found[name] = topic
    return found
