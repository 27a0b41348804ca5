"""Hosting the controller in a broker process, and a broker's side of the cluster.

``host_controller(broker)`` runs when a broker's ``process_roles`` has "controller": it
hosts the controller's Raft group (``__controller``, voters = the ``[controller] voters``
table, whose ids are broker ids) through ``broker.ensure_group``, puts a ``Controller``
(service.py) over that group's store and driver, calls it after every driver run and
every tick, and serves its requests (``register_broker``, ``broker_heartbeat``,
``create_topic``, ``delete_topic``, ``describe_cluster``, ``metadata_since``,
``alter_partitions``, ``elect_preferred``: ``mqlog topics rebalance`` of ISR topics)
through ``dispatch``. A change is answered once its record is committed and folded on
the leader; if the leader loses its leadership (or ``broker_session_timeout_ms`` passes) first, the
answer is NodeUnavailable: the outcome is unknown. A follower asked what only the leader
answers says NotLeader, naming the leader and its address (node.py's ``error_answer``).

``join_cluster(broker)`` runs in a broker (role "broker", alone or combined) that knows
the controller quorum (the ``[controller] voters`` table): the broker's ``BrokerAgent``
registers (a new broker epoch per process life), heartbeats every
``broker_heartbeat_interval_ms``, pulls the committed metadata since the position it has
(records, or a snapshot when it is too far behind), and hosts the Raft group of every
``raft``-layer partition the metadata assigns to it (group ``TOPIC-PARTITION``, serving
(topic, partition)); a deleted topic's groups are dropped. An ``isr``-layer partition is
hosted the same way, and each pull hands its core the controller's newest state for it
(leader, epochs, ISR, ELR); its leader's AlterPartition requests go with the next round
(``alter_partitions``, after the heartbeat), whose pull brings the decision back.

Master-slave partitions (``master_slave``-layer topics: RocketMQ 5's controller mode) are
hosted the same way, as a SYNC_MASTER of the other replicas on the partition's leader
and as its slaves elsewhere (``master_slave_spec``). Their roles then change in place, not
through a new spec: each round the agent makes a hosted group's core what the metadata
says (``apply_role``: the leader promoted in its leader epoch, the others following it,
through the operator's promote/follow paths). Each heartbeat reports every hosted
partition's (epoch of its last record, log end), and for each group this broker masters
in the metadata, its sync state set (the slaves its core counts in sync) with the
partition epoch of the view: the controller keeps the set in the metadata and elects
from it (decisions.py).
The controller's leader balancing asks Raft leaders for transfers in heartbeat answers
(``transfers``: [topic, partition, target]); the agent hands each to ``on_transfer``
(join_cluster: the hosted group's core transfers its leadership). A broker whose partition
stores the last life left open says so in its first registration (``unclean_shutdown``,
KIP-966: ``unclean_stores``), and the controller takes it out of every ELR. So does one
whose ``data_dir`` holds no sign of an earlier life (``fresh_data_dir``: no
``MEMBER_FILE``, written once a registration is answered): wiped, or a new disk, it holds
none of what the metadata says its replicas hold, and it was elected from an ELR with an
empty log (a hostile review: every acknowledged record lost, an intact ELR member's
too). The controller counts it only for a broker it knows (a first start has nothing).
A registration refused for good ends the agent's rounds and goes to ``on_fatal``
(join_cluster: the broker stops, ``mqlog node`` exits 1 with the refusal's line): one by
controllers of another cluster_id (``InconsistentClusterId``) at once, and, for a life
that never registered, ``DuplicateBrokerRegistration`` once it has lasted longer than a
restart's old session could hold the id (``BrokerAgent._registration_refused``).
Clients ask any broker ``cluster_metadata`` (the agent's view: topics, partitions,
replicas, brokers and their addresses) and route by partition.

One agent, driven by real or simulated IO. ``BrokerAgent`` does no IO of its own, as the
replication Driver does none: it asks an ``AgentIo`` to send a request to a controller
and call back with the answer (never from inside ``request``), and to call it back after
a delay (its only timer), and it hosts groups through a ``GroupHost``. A round is one
chain of requests, one at a time (register if it has no epoch, heartbeat, pull), then
the fold, the hosting, and a timer for the next round. A request goes first to the
controller that last answered a change, then to the others in a random order, a
NotLeader's hint next; each controller is asked once, and one that left a call
unanswered (down, or paused: it still accepts connections) goes last and is not asked
again in that round. With calls that wait ``call_timeout_s`` (a share of the session), a
paused leader cannot keep a broker's heartbeats from the new leader until the broker's
session ends. The hosting builds and compares every assigned group's spec only when the
fold moved the view (or the last pass left a group to try again); an idle cluster's
round re-applies what does not follow from the view (master-slave roles, ISR states) and
nothing else. An error ends the round early (and a refused heartbeat that says "register
again" drops the epoch). An unexpected exception (an OSError from opening a group's
store on a full disk, say) ends the round, or when it is one group's hosting, skips that
group, with a note (one the host raised is said as this broker's fault, HostFailed, never
as a malformed answer of a controller): never the agent, whose rounds keep the broker's
every other membership alive; the next round tries again. ``join_cluster`` gives it ``SocketIo``
(requests over TCP on a thread, timers on the broker's loop, cancelled when the broker
stops) and ``BrokerGroups`` (the broker's ensure_group and drop_group); the simulator
(mqlog/sim/controller.py) gives it a simulated IO and a host that records what it was
asked to host. A process life is one agent: a new life starts a new agent, which never
sees the answers of the previous one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

from mqlog import errors
from mqlog.client import Client
from mqlog.config import (
    MEMBER_FILE,
    STRAYS_DIRECTORY,
    GroupSpec,
    ReplicationConfig,
    StoreConfig,
)
from mqlog.engine.checkpoint import write_atomically
from mqlog.engine.files import set_aside
from mqlog.replication import hardstate
from mqlog.replication.controller import records
from mqlog.replication.controller.config import CONTROLLER_GROUP, ControllerConfig
from mqlog.replication.controller.leaders import LeaderTable, leaders_from, leads_from
from mqlog.replication.controller.service import Controller, Proposal
from mqlog.replication.controller.state import ClusterMetadata
from mqlog.replication.isr.core import AlterPartition, PartitionState

# A deliberately broken controller (service.py's and decisions.py's TEST_BREAKS), for tests
# of real processes: the variable names the break.
TEST_BREAK_VARIABLE = "MQLOG_CONTROLLER_TEST_BREAK"
KINDS = ("register_broker", "broker_heartbeat", "create_topic", "delete_topic",
         "describe_cluster", "metadata_since", "alter_partitions", "elect_preferred")
_STORE: dict[str, Any] = dict(segment_size_bytes=64 << 20, message_size_bytes_max=8 << 20,
              flush_mode="sync")
# How long a broker's call to a controller waits for the answer (call_timeout_s): a share of
# the session, so that a paused controller (which still accepts connections, and never
# answers) cannot keep a broker's heartbeats from the others until its session ends
CALL_TIMEOUT_S = 5.0  # the longest wait, whatever the session
CALL_TIMEOUT_MIN_S = 0.05  # the shortest: below a loaded machine's round trip, none answers
ROUND_SHARE = 0.5  # of the session left after one heartbeat interval: one round's waiting
MALFORMED = "the round ends; the next one asks again (check the controllers' versions)"
# A life refused DuplicateBrokerRegistration this many sessions long, never registered,
# stops: no restart's old session holds its id that long (BrokerAgent._registration_refused)
DUPLICATE_WAIT_SESSIONS = 4
HOST_FAULT = "this broker's fault"  # what a HostFailed note says (the simulator looks)


class HostFailed(Exception):
    """A GroupHost call (or a callback into the broker) raised what no host should: a
    bug of this broker, said as such — never as a malformed answer of the controller
    whose answer it was acting on. The original exception is ``__cause__``."""

    def __str__(self) -> str:
        return f"this broker failed ({self.__cause__!r}: {HOST_FAULT}, not a " \
            "controller's answer); the next round tries again"

Answer = Callable[[dict[str, Any] | None, errors.MqlogError | None], None]


def _reports_from(value: Any, state: ClusterMetadata | None = None) -> dict[Any, Any]:
    """[[topic, partition, epoch, position(, topic id)], ...] -> {(topic, partition):
    (epoch, position)} (the controller checks the values' types). A report whose topic id
    is not that of ``state``'s topic of the name is left out: the log end of a deleted
    topic's partition the broker still hosts, not of the one created again."""
    if value is None:
        return {}
    if not isinstance(value, list) or not all(
            isinstance(item, list) and len(item) in (4, 5) for item in value):
        raise errors.InvalidArgument("reports must be a list of [topic, partition, epoch, "
                                     "position] (and maybe a topic id)")
    found = {}
    for item in value:
        if state is None or len(item) == 4 or not state.other_topic(item[0], item[4]):
            found[(item[0], item[1])] = (item[2], item[3])
    return found


def _seen(value: Any) -> tuple[Any, Any]:
    """A heartbeat's ``leaders_seen``: [token, seq] (anything else: seen nothing)."""
    return (value[0], value[1]) if isinstance(value, list) and len(value) == 2 else ("", 0)


def _sync_states_from(value: Any) -> dict[Any, Any]:
    """[[topic, partition, partition_epoch, [broker, ...]], ...] -> {(topic, partition):
    (partition_epoch, brokers)} (the controller checks the values' types)."""
    if value is None:
        return {}
    if not isinstance(value, list) or not all(
            isinstance(item, list) and len(item) == 4 for item in value):
        raise errors.InvalidArgument("sync_states must be a list of [topic, partition, "
                                     "partition_epoch, [broker, ...]]")
    return {(item[0], item[1]): (item[2], item[3]) for item in value}


def _config(broker: Any) -> ControllerConfig:
    return ControllerConfig.from_table(dict(getattr(broker.config, "controller", {}) or {}))


def call_timeout_s(config: ControllerConfig) -> float:
    """How long one of a broker's controller calls waits for its answer. A round asks
    each controller at most once per request, and none again once it left a call
    unanswered (BrokerAgent._ask), so a round waits at most one timeout per voter: kept
    within ROUND_SHARE of what the session leaves after a heartbeat interval. A round
    that waited on a paused leader then still ends, and the next one's heartbeat reaches
    the new leader, well within the session the new leader gives every broker (between
    CALL_TIMEOUT_MIN_S and CALL_TIMEOUT_S whatever the settings)."""
    spare_s = (config.broker_session_timeout_ms - config.broker_heartbeat_interval_ms) / 1000
    share_s = spare_s * ROUND_SHARE / max(1, len(config.voters))
    return min(CALL_TIMEOUT_S, max(CALL_TIMEOUT_MIN_S, share_s))


def dispatch(controller: Controller, header: dict[str, Any],
             cluster_id: str) -> dict[str, Any] | Proposal:
    """A controller request: a read's answer at once, or a change's Proposal (answered once
    it is folded: ``controller.wait``). Bad arguments raise typed errors (a missing one is
    None, refused typed); so does a registration from a broker of another ``cluster_id``.
    Used by the broker's service and by the simulator alike."""
    arg: Callable[..., Any] = header.get
    kind = arg("kind")
    if kind == "register_broker":
        check_cluster_id(header, cluster_id)
    if kind == "describe_cluster":
        return controller.describe(bool(arg("require_leader")))
    if kind == "metadata_since":
        return controller.metadata_since(arg("position"))
    if kind == "register_broker":
        return controller.register_broker(arg("broker_id"), arg("address"), arg("rack", ""),
                                          arg("incarnation", ""),
                                          arg("unclean_shutdown", False),
                                          arg("groups_max", 0),
                                          fresh_data_dir=arg("fresh_data_dir", False))
    if kind == "broker_heartbeat":
        return controller.heartbeat(arg("broker_id"), arg("broker_epoch"),
                                    _reports_from(arg("reports"), controller.working),
                                    leads_from(arg("leads"), controller.working),
                                    _seen(arg("leaders_seen")),
                                    sync_states=_sync_states_from(arg("sync_states")))
    if kind == "create_topic":
        return controller.create_topic(arg("name"), arg("partitions"),
                                       arg("replication_factor"), arg("layer", "raft"),
                                       arg("config"))
    if kind == "delete_topic":
        return controller.delete_topic(arg("name"))
    if kind == "alter_partitions":
        return controller.alter_partitions(arg("broker_id"), arg("broker_epoch"), arg("items"))
    if kind == "elect_preferred":
        return controller.elect_preferred(arg("topics"))
    raise errors.InvalidArgument(f"unknown controller request kind {kind!r}; the kinds are "
                                 f"{', '.join(KINDS)}")


def check_cluster_id(header: dict[str, Any], cluster_id: str) -> None:
    """A broker registers with the controllers of its own cluster only (Kafka's
    cluster.id): one of another cluster was placed replicas its peers refuse, and the
    metadata it pulled lacked every topic its stores held."""
    theirs = header.get("cluster_id") or ""
    if theirs != cluster_id:  # (typed: the broker stops, as asking again cannot help)
        raise errors.InconsistentClusterId(
            f"broker {header.get('broker_id')!r} is of cluster_id {theirs!r}, these "
            f"controllers of {cluster_id!r}: give it the controllers of its own cluster in "
            "[controller] voters, or the cluster_id of this one")


def host_controller(broker: Any) -> Controller:
    """Host the controller group in ``broker`` and serve its requests (see the docstring)."""
    config = _config(broker)
    if broker.broker_id not in config.voters:
        raise errors.ConfigError(f"[controller] voters {sorted(config.voters)} must name this "
                                 f"process ({broker.broker_id}): a controller is a voter")
    spec = GroupSpec.raft(CONTROLLER_GROUP, dict(config.voters), store=StoreConfig(**_STORE))
    replica = broker.ensure_group(spec)
    controller = Controller(config, replica.store, replica.driver,
                            tick_ms=spec.replication.tick_ms, rng=random.Random(),
                            note=lambda text: print(f"controller: {text}", flush=True),
                            test_break=os.environ.get(TEST_BREAK_VARIABLE, ""))
    replica.on_run(controller.after_run)
    replica.on_tick(controller.tick)
    timeout_s = config.broker_session_timeout_ms / 1000

    async def settled(proposal: Proposal) -> dict[str, Any]:
        replica.schedule()
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        def finish(ok: bool) -> None:
            if not future.done():
                future.set_result(ok)
        controller.wait(proposal, finish)
        try:
            ok = await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            ok = False
        if not ok:
            raise errors.NodeUnavailable(
                "the controller lost its leadership (or took too long) before the change "
                "committed: its outcome is unknown; describe the cluster, then retry")
        return proposal.answer

    async def handle(header: dict[str, Any], payload: bytes) -> tuple[dict[str, Any], bytes]:
        outcome = dispatch(controller, header, broker.config.cluster_id)
        # (NotLeader: the broker's error answer names the leader and its address:
        # node.error_answer)
        if isinstance(outcome, Proposal):
            return await settled(outcome), b""
        return outcome, b""

    broker.add_service(KINDS, handle)
    return controller


# --- a broker's side: register, heartbeat, pull, host what is assigned -----------------------


class AgentIo(Protocol):
    """What a BrokerAgent asks of the world (real sockets and timers, or the simulator's)."""

    def request(self, address: str, header: dict[str, Any], done: Answer) -> None:
        """Send ``header`` to the controller at ``address``; later (never from inside this
        call) ``done(answer, None)`` or ``done(None, error)`` with a typed MqlogError."""

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once ``delay_ms`` have passed."""

    def note(self, text: str) -> None:
        """Tell an operator (a log line)."""


class GroupHost(Protocol):
    """The groups a BrokerAgent hosts: the broker's, or the simulator's record of them."""

    broker_id: str
    address: str  # where this broker listens (registered with the controller)

    def ensure_group(self, spec: Any) -> None:
        """Host ``spec``'s group (idempotent); InvalidArgument if it cannot."""

    def drop_group(self, name: str, delete_data: bool = False) -> None:
        """Stop hosting group ``name`` (and delete its store if ``delete_data``)."""

    def reports(self) -> list[list[Any]]:
        """[topic, partition, epoch, written position] of each partition group hosted (a
        master-slave group's epoch: its last record's, what a failover compares), and its
        topic id when it has one (_reports_from)."""

    def role(self, name: str) -> dict[str, Any] | None:
        """A hosted master-slave group's core: {"role", "master", "epoch", "promotable",
        "in_sync"} (in_sync: the slaves a master counts in sync); None if there is none."""

    def change_role(self, name: str, header: dict[str, Any]) -> None:
        """The operator's promote or follow (``header["kind"]``) on a hosted group."""

    def leads(self) -> list[list[Any]]:
        """[topic, partition, term] of each Raft partition group this broker leads now, and
        its topic id when it has one (leaders.leads_from)."""

    def set_strays_aside(self, is_stray: Callable[[str, int], bool]) -> Iterable[str]:
        """Move the partition stores that no group hosts and that ``is_stray(name,
        topic id)`` says no topic of the metadata has out of the way (never deleted:
        ``STRAYS_DIRECTORY``); their names, each as it is moved."""

    def follow_registrations(self, addresses: dict[str, str]) -> None:
        """Where each broker registered it listens (broker id -> host:port, the view's):
        dial it there from now on, unless the configuration says where (an operator's
        address wins: a proxy, a NAT)."""


class BrokerAgent:
    """One broker's membership in the cluster, for one process life (see the module
    docstring)."""

    def __init__(self, host: GroupHost, config: ControllerConfig, io: AgentIo,
                 rng: random.Random | None = None, incarnation: str = "",
                 store: StoreConfig | None = None) -> None:
        self.host, self.config, self.io = host, config, io
        # the store settings of every group it hosts (the broker's [store] table)
        self.store = store if store is not None else StoreConfig()
        # this process life's name (KIP-631's incarnation id): a retried registration of
        # the same life is answered with the epoch it got, not a new one
        self.incarnation = incarnation or uuid.uuid4().hex
        self.rng = rng if rng is not None else random.Random()
        self.view = ClusterMetadata()
        self.position = 0
        self.epoch: int | None = None
        self.hosted: set[str] = set()  # groups this agent opened
        self._topic_ids: dict[str, int] = {}  # hosted group -> its spec's topic id
        self._deleted_topics: set[str] = set()  # DeleteTopic folded since the last pass
        # Where this life's registration ends in the metadata log (the controller's
        # answer); once the view reaches it, stores of deleted topics are swept, once
        self._registered_position: int | None = None
        self._strays_swept = False
        self._followed: dict[str, str] = {}  # the registered addresses the host was told
        # The view of the last hosting pass that did all it wanted (host_assigned), and
        # the layer of each group that pass wanted, in its order
        self._hosted_view: ClusterMetadata | None = None
        self._hosted_layers: dict[str, str] = {}
        self._troubled = False  # this pass noted a group it could not host (or spec)
        self.hosting_failures = 0  # ensure_group calls that failed unexpectedly (retried)
        self.rounds = 0  # rounds finished (with or without an error)
        self.leaders = LeaderTable()  # Raft partitions' leaders, reported (leaders.py)
        self._leaders_seen: list[Any] = ["", 0]  # the controller's token, seq last seen
        self._leader: str | None = None  # the address that last answered a change
        self._addresses = list(config.voters.values())
        # Controllers whose last call went unanswered (NodeUnavailable: down, paused, cut
        # off): asked last until one answers again; and those of this round, not asked again
        # in it (each would cost a call timeout: _ask)
        self._silent: set[str] = set()
        self._silent_this_round: set[str] = set()
        # ISR partitions: each hosted one's newest state goes to ``on_partition(group,
        # state)``; its leader's AlterPartition waits in ``alters`` for the next round
        # (after the heartbeat, before the pull that brings the decision back), and a
        # refusal goes to ``on_alter_refused(group, why, stale)``. join_cluster sets both.
        self.on_partition: Callable[[str, PartitionState], None] | None = None
        self.on_alter_refused: Callable[[str, str, bool], None] | None = None
        # Raft partitions: a transfer the controller asks for goes to on_transfer(group,
        # target) (join_cluster sets it; the simulator hosts no real groups)
        self.on_transfer: Callable[[str, str], None] | None = None
        self.alters: dict[str, AlterPartition] = {}
        self._isr_groups: dict[str, tuple[str, int]] = {}
        # KIP-966: the previous life did not close its stores cleanly (join_cluster looks
        # before any partition is opened); the first registration says so. And a data_dir
        # with no sign of an earlier life (fresh_data_dir); on_registered marks it then.
        self.unclean_shutdown = False
        self.fresh_data_dir = False
        self.on_registered: Callable[[], bool] | None = None  # (True: marked)
        self._unmarked = False  # registered fresh, MEMBER_FILE not written yet
        # A registration refused for good goes to on_fatal(error), and the rounds end
        # (join_cluster: the broker stops, status 1); without it (the simulator) the
        # agent asks again each round, as for any refusal. _registration_refused says when.
        self.on_fatal: Callable[[errors.MqlogError], None] | None = None
        self.registered_once = False  # this life has had a broker epoch
        self.duplicate_refusals = 0  # DuplicateBrokerRegistration answers since then
        # controllers whose last answer was InconsistentClusterId: one misconfigured
        # controller is passed over; all of them, and the broker is the stranger
        self._foreign: set[str] = set()
        self.stopped = False  # on_fatal was called: no more rounds

    def start(self) -> None:
        """Begin the first round now; each round schedules the next."""
        self._round()

    # --- one round: register?, heartbeat, pull, fold, host --------------------------------

    def _round(self) -> None:
        self._silent_this_round = set()
        self._mark_member()
        if self.epoch is None:
            header: dict[str, Any] = {
                "kind": "register_broker", "broker_id": self.host.broker_id,
                "address": self.host.address, "incarnation": self.incarnation,
                "rack": getattr(self.host, "rack", ""),
                "cluster_id": getattr(self.host, "cluster_id", ""),
                "groups_max": getattr(self.host, "groups_max", 0)}
            if self.unclean_shutdown:
                header["unclean_shutdown"] = True
            if self.fresh_data_dir:
                header["fresh_data_dir"] = True
            self._ask(header, True, self._registered)
            return
        try:
            self._heartbeat()
        except HostFailed as failure:  # (outside an answer's callback: ended here)
            self._end_round(errors.NodeUnavailable(f"broker_heartbeat: {failure}"))

    def _registered(self, answer: dict[str, Any]) -> None:
        self.epoch = answer["broker_epoch"]
        self.registered_once, self.duplicate_refusals = True, 0
        position = answer.get("metadata_position")
        if type(position) is int:  # (a controller of before says none: nothing is swept)
            self._registered_position = position
        self.unclean_shutdown = False  # (said once: this life's stores are its own now)
        self._unmarked = self.fresh_data_dir and self.on_registered is not None
        self.fresh_data_dir = False  # (said once: later registrations of this life are not)
        self._mark_member()
        self._heartbeat()

    def _mark_member(self) -> None:
        """The data_dir is a member's now (MEMBER_FILE): written after the first
        registration of a fresh one, and again each round until it is (a full disk):
        without it the next start is taken for a wiped data_dir's (data_lost)."""
        if self._unmarked and self.on_registered is not None and self.on_registered():
            self._unmarked = False

    def _heartbeat(self) -> None:
        with self._hosting():
            leads, reports, sync_states = \
                self.host.leads(), self.host.reports(), self._sync_states()
        self._ask({"kind": "broker_heartbeat", "broker_id": self.host.broker_id,
                   "broker_epoch": self.epoch, "reports": reports,
                   "leads": leads, "leaders_seen": self._leaders_seen,
                   "sync_states": sync_states}, True,
                  lambda answer: self._heartbeaten(answer, leads))

    def _heartbeaten(self, answer: dict[str, Any], leads: list[list[Any]]) -> None:
        self.took_leaders(answer, leads)
        self.transfer(answer.get("transfers"))
        self._alter()

    def transfer(self, transfers: Any) -> None:
        """The Raft leadership transfers the controller asks of this broker (its leader
        balancing): each goes to ``on_transfer(group, target)``; one that fails (this
        broker no longer leads, say) is noted: the next check asks again if needed."""
        if transfers is None:
            return
        if not isinstance(transfers, list) or not all(
                isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)
                and isinstance(item[1], int) and isinstance(item[2], str)
                for item in transfers):
            raise errors.RemoteProtocolError(f"transfers must be a list of [topic, "
                                             f"partition, target], got {transfers!r}")
        for topic, partition, target in transfers:
            group = f"{topic}-{partition}"
            if self.on_transfer is None or group not in self.hosted:
                continue
            try:
                with self._hosting():
                    self.on_transfer(group, target)
            except errors.MqlogError as error:
                self.io.note(f"broker {self.host.broker_id}: {group}: no transfer to "
                             f"{target}: {error}")
                continue
            self.io.note(f"broker {self.host.broker_id}: {group}: leadership to {target} "
                         "(leader balancing)")

    def took_leaders(self, answer: dict[str, Any], leads: list[list[Any]]) -> None:
        """Merge the heartbeat answer's leaders, and this broker's own (fresher)."""
        changes = answer.get("leaders")
        if isinstance(changes, dict):
            self.leaders.merge_all(leaders_from(changes.get("leaders")))
            self._leaders_seen = [changes.get("token", ""), changes.get("seq", 0)]
        for (topic, partition), term in leads_from(leads, self.view).items():
            self.leaders.merge(topic, partition, self.host.broker_id, term)

    def request_alter(self, group: str, request: AlterPartition) -> None:
        """An ISR leader's AlterPartition: sent with the next round (the newest per group)."""
        if group in self._isr_groups:
            self.alters[group] = request

    def _alter(self) -> None:
        sent = [(group, request) for group, request in self.alters.items()
                if group in self._isr_groups]
        self.alters = {}
        if not sent:
            self._pull()
            return
        items = [[*self._isr_groups[group], request.epoch, request.partition_epoch,
                  list(request.isr), *_topic_id_item(self._topic_ids.get(group, 0))]
                 for group, request in sent]
        self._ask({"kind": "alter_partitions", "broker_id": self.host.broker_id,
                   "broker_epoch": self.epoch, "items": items}, True,
                  lambda answer: self._altered(sent, answer))

    def _altered(self, sent: list[tuple[str, AlterPartition]], answer: dict[str, Any]) -> None:
        # A refusal not marked stale said the request was not applied; an unmarked answer
        # is taken as stale (the leader then waits for the metadata: never unsafe).
        stale = answer.get("stale")
        if not isinstance(stale, list) or len(stale) != len(sent):
            stale = [True] * len(sent)
        for (group, _request), why, moved in zip(sent, answer["results"], stale, strict=True):
            if why and self.on_alter_refused is not None:
                with self._hosting():
                    self.on_alter_refused(group, why, moved is not False)
        self._pull()

    def _pull(self) -> None:
        self._ask({"kind": "metadata_since", "position": self.position}, False,
                  self._pulled)

    def _pulled(self, answer: dict[str, Any]) -> None:
        self.fold(answer)
        with self._hosting():
            self._follow_registrations()
            self.host_assigned()
            self._sweep_strays()
        self._end_round(None)

    def _follow_registrations(self) -> None:
        """Tell the host where the view's brokers listen when that changed (a broker
        registered again at another address): every broker dials a moved one at its new
        address, not only those that host a group with it (their specs name it: they
        learn it then). Before, a broker that knew the old address from an earlier group
        dialed it there for every group assigned later."""
        registered = {name: info.address for name, info in self.view.brokers.items()}
        if registered != self._followed:
            self.host.follow_registrations(registered)
            self._followed = registered

    def _sweep_strays(self) -> None:
        """Once this life's view reaches its registration (every topic created before it
        is in the view, deleted or not since), set aside the stores under the broker's
        data directory that no topic of the view has: a topic deleted while this broker
        was away (KIP-516's stray logs). Kept in place, such a store stayed for ever, and
        its abort marker made every later start of the broker unclean (out of every ELR).
        Set aside, never deleted (Kafka 3.7 renames its strays too): a view that lacks a
        topic may also be metadata that is not this cluster's (controllers whose data
        directories were lost, or another cluster's named by mistake), and deleting then
        lost every partition a broker held. Never before the registration: a new life's
        first views may come from a controller that lags, and a topic missing from them
        is not a deleted one."""
        if self._strays_swept or self._registered_position is None or \
                self.position < self._registered_position:
            return
        for name in self.host.set_strays_aside(self._is_stray):
            self.io.note(f"broker {self.host.broker_id}: set the store {name} aside in "
                         f"{STRAYS_DIRECTORY}/ of its data directory: no topic of the "
                         "metadata has it (its topic was deleted while this broker was "
                         "away, or these controllers' metadata is not this cluster's); "
                         "delete it once sure, or move it back")
        self._strays_swept = True  # (not if a move failed, a full disk's say: the round
        # ends, and the next one sweeps what is left)

    def _is_stray(self, name: str, topic_id: int) -> bool:
        """Whether a store ``name`` (TOPIC-PARTITION) of topic id ``topic_id`` that no
        group hosts belongs to no topic of the view."""
        topic, _, partition = name.rpartition("-")
        if name in self.hosted or not partition.isdigit():
            return False
        info = self.view.topics.get(topic)
        return info is None or info.topic_id != topic_id

    def duplicate_refusals_max(self) -> int:
        """How many DuplicateBrokerRegistration answers a life that never registered takes
        before it gives up (``_registration_refused``): enough that they span at least
        DUPLICATE_WAIT_SESSIONS sessions, a round being at least a heartbeat interval."""
        config = self.config
        return -(-DUPLICATE_WAIT_SESSIONS * config.broker_session_timeout_ms //
                 config.broker_heartbeat_interval_ms) + 1

    def _registration_refused(self, address: str, error: errors.MqlogError) -> None:
        """A registration refused in a way that asking again may never mend.

        InconsistentClusterId from every controller (they are another cluster's): nothing
        this process can wait for changes it, so ``on_fatal`` at once — Kafka's broker
        does not start with another cluster's id (InconsistentClusterIdException). From
        some of them only, the others are asked (``_try``): one controller misconfigured
        (which cannot join its quorum either) stopped brokers that asked it first.

        DuplicateBrokerRegistration (another life at another address holds this broker
        id, its session alive): either a second process with this id (a copied config),
        which stays refused for as long as that one lives; or this very broker restarted
        at a new address within its last life's session, which is taken once that session
        ends (service.py's register_broker) — at most a session after that life's last
        heartbeat, which came before this life began, later by as much as a loaded
        controller's ticks run late, and a session again after each controller leader
        change (a new leader gives every broker a whole session). So a life that never
        registered asks again each round, said at the 1st, 2nd, 4th, ... refusal, and
        stops (``on_fatal``) once refused ``duplicate_refusals_max()`` times, over
        DUPLICATE_WAIT_SESSIONS sessions: no restart's old session holds the id that
        long. This is Kafka's rule too: a broker retries its registration and shuts down
        if the first one has not succeeded within initial.broker.registration.timeout.ms;
        the wait is counted in sessions, which is what a restart's refusal lasts. A life
        that registered before (fenced, then its id taken meanwhile) never stops on its
        own: it has served, and may host partitions; it asks again, said as rarely."""
        name = self.host.broker_id
        if isinstance(error, errors.InconsistentClusterId):
            if self.on_fatal is None:
                self._end_round(error)
                return
            self._give_up(errors.InconsistentClusterId(
                f"broker {name} cannot join the cluster of its [controller] voters: the "
                f"controller at {address} refused its registration: {error}"))
            return
        self.duplicate_refusals = count = self.duplicate_refusals + 1
        most = self.duplicate_refusals_max()
        interval_ms = self.config.broker_heartbeat_interval_ms
        if self.on_fatal is not None and not self.registered_once and count >= most:
            waited_s = (count - 1) * interval_ms / 1000
            self._give_up(errors.DuplicateBrokerRegistration(
                f"broker {name} cannot join its cluster: its registration was refused "
                f"{count} times over at least {waited_s:g} s ({DUPLICATE_WAIT_SESSIONS} "
                "broker sessions: no earlier life of this broker, restarted at a new "
                f"address, holds its id that long, so another live process does): {error}"))
            return
        said: errors.MqlogError | None = None
        if count & (count - 1) == 0:  # (the 1st, 2nd, 4th, ...: a refusal a round is no flood)
            then = "; asking again each round"
            if self.on_fatal is not None and not self.registered_once:
                then = (f"; asking again every {interval_ms} ms, and stopping at refusal "
                        f"{most}, {DUPLICATE_WAIT_SESSIONS} sessions from the first: this "
                        "broker restarted at a new address is taken sooner, once its last "
                        "life's session ends")
            said = errors.DuplicateBrokerRegistration(
                f"{error} (refused {count} time{'s' if count > 1 else ''}{then})")
        self._end_round(said)

    def _give_up(self, error: errors.MqlogError) -> None:
        """The registration cannot succeed: said, the rounds end, ``on_fatal(error)``."""
        assert self.on_fatal is not None
        self.io.note(f"broker {self.host.broker_id}: cluster: stopping: {error}")
        self.stopped = True
        self.rounds += 1
        self.on_fatal(error)

    def _end_round(self, error: errors.MqlogError | None) -> None:
        if error is not None:
            self.io.note(f"broker {self.host.broker_id}: cluster: {error}")
            if "register again" in str(error):
                self.epoch = None
        self.rounds += 1
        self.io.call_later(self.config.broker_heartbeat_interval_ms, self._round)

    def fold(self, answer: dict[str, Any]) -> None:
        """Fold a pull's answer into the view: its snapshot, if any, replaces the view;
        each record applies, or is skipped with a note if the fold refuses it (as every
        controller's fold skips it: the views stay the controllers')."""
        if "snapshot" in answer:
            self.view = ClusterMetadata().apply(records.decode(answer["snapshot"]),
                                                answer["position"])
        for end, body in answer["records"]:
            record = records.decode(body)
            try:
                self.view = self.view.apply(record, end)
            except errors.MetadataChangeRefused as error:
                # (committed, yet it does not apply: one from before a rule, a topic named
                # "." say. The controllers' fold skips it, and so does this one, alike)
                self.io.note(f"broker {self.host.broker_id}: skipped the committed "
                             f"metadata record ending at {end}: {error}")
                continue
            if isinstance(record, records.DeleteTopic):  # (created again in the same pull,
                self._deleted_topics.add(record.name)     # it is in the view: see below)
        self.position = answer["position"]
        self.leaders.prune(self.view)

    def assigned(self) -> dict[str, GroupSpec]:
        """group name -> GroupSpec of each Raft, ISR or master-slave partition the view
        assigns here (a master-slave one as it would be hosted first: master_slave_spec)."""
        wanted: dict[str, GroupSpec] = {}
        self._isr_groups = {}
        isr = self.config.isr_settings()
        for topic, index, part in self._partitions(("raft", "isr", "master_slave")):
            name = f"{topic.name}-{index}"
            members = {member: self.view.brokers[member].address for member in part.replicas}
            try:
                if topic.layer == "raft":
                    wanted[name] = GroupSpec.raft(name, members, store=self.store,
                                                  partitions=((topic.name, index),),
                                                  topic_id=topic.topic_id)
                elif topic.layer == "isr":  # (the topic's own min.insync, if it has one)
                    wanted[name] = GroupSpec.isr(name, members, store=self.store, partitions=(
                        (topic.name, index),), topic_id=topic.topic_id,
                        **{**isr, "min_insync_replicas": topic.min_insync_replicas or
                           isr["min_insync_replicas"]})
                    self._isr_groups[name] = (topic.name, index)
                else:
                    wanted[name] = master_slave_spec(name, (topic.name, index), part,
                                                     members, self.host.broker_id, self.store,
                                                     topic_id=topic.topic_id)
            except errors.ConfigError as error:  # (say, a replica registered a bad
                # address: the other partitions are still hosted)
                self._troubled = True
                self.io.note(f"broker {self.host.broker_id}: cannot host {name}: {error}")
        return wanted

    def host_assigned(self) -> None:
        """ensure_group each partition assigned here (an ISR one is handed its state); drop
        those no longer assigned; make the master-slave groups hosted already what the
        metadata says (apply_role). The specs are a function of the view alone: when the
        fold left the view as it was at the last pass that hosted everything it wanted
        (no hosting failed, no spec refused, nothing failed to drop), nothing is built or
        compared again, and only what does not follow from the view is redone — each
        hosted group's role made the metadata's (a master-slave core's role changes on
        its own), each ISR group handed its state again — as a full pass would."""
        if self.view is self._hosted_view:
            self._refresh_hosted()
            return
        self._hosted_view, self._troubled = None, False
        self._drop_deleted()
        wanted = self.assigned()
        self._drop_replaced(wanted)
        self._hosted_layers = {name: spec.replication.layer for name, spec in wanted.items()}
        for name, spec in wanted.items():
            if name in self.hosted and spec.replication.layer == "master_slave":
                self._apply_role(name)
            elif self._host(name, spec):
                self._hand_state(name)
        for name in sorted(self.hosted - set(wanted)):
            # (a group unwanted for another reason than its topic's deletion, say its spec
            # could not be built this round, keeps its store)
            topic = name.rpartition("-")[0]
            self.host.drop_group(name, delete_data=topic not in self.view.topics)
            self._unhost(name)
        if not self._troubled:
            self._hosted_view = self.view

    def _drop_deleted(self) -> None:
        """A deleted topic's partitions leave no store behind, so that one created again
        under its name starts empty, as Kafka's does (the old store reopened brought the
        deleted records back, and an ISR one's leader epochs refused every write). Those
        whose DeleteTopic this agent folded go first, even when the same pull created
        the topic again (``topics delete t; topics create t``); a deletion a snapshot
        hid is seen by the topic's absence (host_assigned)."""
        for name in sorted(self.hosted):
            if name.rpartition("-")[0] in self._deleted_topics:
                self._drop_with_data(name)
        self._deleted_topics.clear()

    def _drop_replaced(self, wanted: dict[str, GroupSpec]) -> None:
        """Hosted partitions of a topic deleted and created again that the fold did not
        show deleted (a snapshot hid the DeleteTopic): their topic id differs (KIP-516)."""
        for name in sorted(self.hosted & set(wanted)):
            if self._topic_ids.get(name, 0) != wanted[name].topic_id:
                self._drop_with_data(name)

    def _drop_with_data(self, name: str) -> None:
        self.host.drop_group(name, delete_data=True)
        self._unhost(name)

    def _unhost(self, name: str) -> None:
        self.hosted.discard(name)
        self._topic_ids.pop(name, None)

    def _refresh_hosted(self) -> None:
        """What a full pass does to the groups it hosts already (in the same order)."""
        for name, layer in self._hosted_layers.items():
            if layer == "master_slave":
                self._apply_role(name)
            else:
                self._hand_state(name)

    def _host(self, name: str, spec: Any) -> bool:
        """ensure_group ``spec``; False (noted, retried next round) if that failed."""
        try:
            self.host.ensure_group(spec)
        except errors.InvalidArgument as error:  # (a replica moved: not handled yet)
            self._troubled = True
            self.io.note(f"broker {self.host.broker_id}: cannot host {name}: {error}")
            return False
        except Exception as error:  # (an OSError opening its store: a full disk, say.
            # One group's trouble must not end the agent, which keeps every other
            # group's membership alive: skip it, the next round tries again)
            self._troubled = True
            self.hosting_failures += 1
            self.io.note(f"broker {self.host.broker_id}: cannot host {name} now "
                         f"({error!r}); the next round tries again")
            return False
        self.hosted.add(name)
        self._topic_ids[name] = spec.topic_id
        return True

    def _hand_state(self, name: str) -> None:
        """A hosted ISR group gets the view's state of its partition (its core ignores a
        state it has: one of the same partition epoch)."""
        where = self._isr_groups.get(name)
        if where is not None and self.on_partition is not None:
            topic, index = where
            self.on_partition(name, PartitionState.of(self.view.topics[topic].partitions[index]))

    def _partitions(self, layers: tuple[str, ...]) -> list[tuple[Any, int, Any]]:
        """(topic, index, partition) of each partition of ``layers`` replicated here."""
        return [(topic, index, part) for topic in self.view.topics.values()
                if topic.layer in layers for index, part in enumerate(topic.partitions)
                if self.host.broker_id in part.replicas]

    def _apply_role(self, name: str) -> None:
        topic, _, index = name.rpartition("-")
        header = apply_role(self.host.role(name), self.view.partition(topic, int(index)),
                            self.host.broker_id)
        if header is not None:
            self.io.note(f"broker {self.host.broker_id}: {name}: {header}")
            self.host.change_role(name, header)

    def _sync_states(self) -> list[list[Any]]:
        """[topic, partition, partition epoch of the view, in-sync slaves] of each
        master-slave group this broker masters in the view, in the view's leader epoch
        (decisions.sync_state_change)."""
        found = []
        for topic, index, part in self._partitions(("master_slave",)):
            status = self.host.role(f"{topic.name}-{index}")
            if part.leader == self.host.broker_id and status is not None and \
                    status["in_sync"] is not None and status["epoch"] >= part.leader_epoch:
                found.append([topic.name, index, part.partition_epoch,
                              list(status["in_sync"])])
        return found

    @staticmethod
    @contextlib.contextmanager
    def _hosting() -> Iterator[None]:
        """Around the agent's calls into its host: a typed MqlogError is the host's
        answer (a refusal) and goes on as it is; anything else is HostFailed."""
        try:
            yield
        except errors.MqlogError:
            raise
        except Exception as failure:
            raise HostFailed() from failure

    # --- asking the controllers: the leader first, then each in a random order -----------
    # A paused controller still accepts connections and never answers: every call to it
    # costs a whole call timeout (call_timeout_s). So each request asks a controller at
    # most once, a NotLeader's hint next, and one that left a call unanswered goes last
    # (and is not asked again this round): a round cannot outlast a share of the session.

    def _ask(self, header: dict[str, Any], leader: bool,
             then: Callable[[dict[str, Any]], None]) -> None:
        self._try(header, leader, then, self._order(leader), {})

    def _order(self, leader: bool) -> list[str]:
        """The controllers to ask, each once: for a change the one that last answered one
        (the leader, as far as this agent knows), then the others in a random order
        (spreading the reads), those whose last call went unanswered last of all, and
        none that left a call unanswered in this round."""
        shuffled = self.rng.sample(self._addresses, len(self._addresses))
        first = [self._leader] if leader and self._leader and \
            self._leader not in self._silent else []
        rest = [address for address in shuffled if address not in first]
        order = first + [address for address in rest if address not in self._silent] + \
            [address for address in rest if address in self._silent]
        return [address for address in order if address not in self._silent_this_round]

    def _hinted(self, hint: str, order: list[str], failures: dict[str, str]) -> list[str]:
        """``order`` with a NotLeader's hint (the leader's address) asked next, unless it
        was asked already or left its last call unanswered: followers name a paused
        leader until they elect another, and it stays last."""
        if hint in failures or hint in self._silent:
            return order
        return [hint] + [address for address in order if address != hint]

    def _try(self, header: dict[str, Any], leader: bool,
             then: Callable[[dict[str, Any]], None], order: list[str],
             failures: dict[str, str]) -> None:
        if not order:
            self._end_round(errors.NodeUnavailable("no controller answered: " + "; ".join(
                f"{address}: {why}" for address, why in failures.items())))
            return
        address, rest = order[0], order[1:]

        def answered(answer: dict[str, Any] | None, error: errors.MqlogError | None) -> None:
            if isinstance(error, errors.NodeUnavailable):
                self._silent.add(address)
                self._silent_this_round.add(address)
            else:
                self._silent.discard(address)
            if isinstance(error, (errors.NotLeader, errors.NodeUnavailable,
                                  errors.RemoteError)):
                failures[address] = str(error)
                following = rest
                if isinstance(error, errors.NotLeader) and error.leader_address:
                    self._leader = error.leader_address
                    following = self._hinted(error.leader_address, rest, failures)
                self._try(header, leader, then, following, failures)
                return
            if isinstance(error, errors.InconsistentClusterId):
                self._foreign.add(address)  # (another cluster's, by its own cluster_id)
                if not self._foreign.issuperset(self._addresses):
                    failures[address] = str(error)
                    self._try(header, leader, then, rest, failures)
                    return
            else:
                self._foreign.discard(address)
            if header["kind"] == "register_broker" and isinstance(
                    error, (errors.InconsistentClusterId, errors.DuplicateBrokerRegistration)):
                self._registration_refused(address, error)
                return
            if error is not None or answer is None:
                self._end_round(error)
                return
            if leader:
                self._leader = address
            try:
                then(answer)
            except errors.MqlogError as failure:  # (a fold or a hosting that failed)
                self._end_round(failure)
            except HostFailed as failure:  # (before the shapes below: not the answer's)
                self._end_round(errors.NodeUnavailable(f"{header['kind']}: {failure}"))
            except (KeyError, TypeError, ValueError, AttributeError) as bad:
                self._end_round(errors.RemoteProtocolError(
                    f"{address} answered {header['kind']} with a malformed answer "
                    f"({bad!r}): {MALFORMED}"))
            except Exception as failure:  # (an OSError, say: this round ends, not the
                # agent — a broker whose rounds stopped would be fenced for good)
                self._end_round(errors.NodeUnavailable(
                    f"{header['kind']} failed here ({failure!r}); the next round tries "
                    "again"))

        self.io.request(address, header, answered)

    def describe(self) -> dict[str, Any]:
        """The ``cluster_metadata`` answer: this life's view, once it pulled one. Before
        its first pull brought anything (position 0) it knows nothing of the cluster, and
        an empty answer would read as "no topic, no broker": NodeUnavailable, so a
        client asks another broker (the simulator's readers caught the empty answers)."""
        if self.position == 0:
            raise errors.NodeUnavailable(
                f"broker {self.host.broker_id} has not pulled the cluster's metadata from "
                "the controllers yet: ask another broker, or retry soon")
        return {"snapshot": records.encode(self.view.snapshot()), "position": self.position,
                "leaders": self.leaders.entries()}


# --- the real world: sockets, the broker's loop, the broker's groups -------------------------


class SocketIo:
    """An AgentIo over TCP (each request on a thread, waiting ``timeout_s`` for its
    answer) and the broker's loop (timers are broker tasks: cancelled, with the requests
    in flight, when the broker stops)."""

    def __init__(self, broker: Any, timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.broker = broker
        self.timeout_s = timeout_s  # each call's (join_cluster: call_timeout_s)

    def request(self, address: str, header: dict[str, Any], done: Answer) -> None:
        async def call() -> None:
            try:
                answer = await asyncio.to_thread(_call, address, header, self.timeout_s)
            except errors.MqlogError as error:
                done(None, error)
                return
            done(answer, None)
        self.broker.spawn(call())

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> None:
        async def later() -> None:
            await asyncio.sleep(delay_ms / 1000)
            callback()
        self.broker.spawn(later())

    def note(self, text: str) -> None:
        print(text, flush=True)


class BrokerGroups:
    """A GroupHost over a real broker's groups."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.broker_id: str = broker.broker_id
        self.address: str = broker.config.listen
        self.rack: str = broker.config.rack
        self.cluster_id: str = broker.config.cluster_id
        # what it registers: the groups the controller may have it host, its groups_max
        # less its config file's groups (placement knows nothing of those; config.py
        # leaves room for one at least on a cluster broker)
        self.groups_max: int = broker.config.groups_max - len(broker.config.groups)

    def ensure_group(self, spec: Any) -> None:
        self.broker.ensure_group(spec)

    def drop_group(self, name: str, delete_data: bool = False) -> None:
        self.broker.drop_group(name, delete_data)

    def set_strays_aside(self, is_stray: Callable[[str, int], bool]) -> Iterator[str]:
        """The data directory's partition stores (those with a topic id: never the
        controller's, nor a config's groups) that no group of the broker hosts and that
        ``is_stray`` says no topic has, moved into ``STRAYS_DIRECTORY`` as
        NAME.TOPIC_ID (a start scans no store there: none is unclean), each name given
        as it is moved (a move that fails raises after those). A topic-id file that
        cannot be read leaves its store alone."""
        root = Path(self.broker.config.data_dir)
        for child in sorted(root.iterdir()) if root.is_dir() else []:
            name = child.name
            if not child.is_dir() or name in self.broker.groups or name == CONTROLLER_GROUP:
                continue
            try:
                topic_id = hardstate.load_topic_id(child)
            except (errors.CorruptStore, OSError):
                continue
            if topic_id is not None and is_stray(name, topic_id):
                set_aside(child, root / STRAYS_DIRECTORY, f"{name}.{topic_id}")
                yield name

    def follow_registrations(self, addresses: dict[str, str]) -> None:
        self.broker.follow_registrations(addresses)

    def reports(self) -> list[list[Any]]:
        found = []
        for node in self.broker.groups.values():
            store, epoch = node.store, node.store.epoch
            if node.spec.replication.layer == "master_slave":
                last = store.epoch_at(store.written_position)
                epoch = 0 if last is None else last  # (an empty log: (0, 0), behind all)
            for topic, partition in node.spec.partitions:
                found.append([topic, partition, epoch, store.written_position,
                              *_topic_id_item(node.spec.topic_id)])
        return found

    def leads(self) -> list[list[Any]]:
        found = []
        for node in self.broker.groups.values():
            status = node.core.status()
            if status.get("layer") == "raft" and status.get("role") == "LEADER":
                found += [[topic, partition, status["term"], *_topic_id_item(node.spec.topic_id)]
                          for topic, partition in node.spec.partitions]
        return found

    def role(self, name: str) -> dict[str, Any] | None:
        node = self.broker.groups.get(name)
        if node is None or node.spec.replication.layer != "master_slave":
            return None
        core = node.core
        return {"role": core.role, "master": core.config.master, "epoch": core.epoch,
                "promotable": core.promotable,
                "in_sync": core.in_sync_slaves() if core.is_master else None}

    def change_role(self, name: str, header: dict[str, Any]) -> None:
        self.broker.groups[name].change_role(header)


def _topic_id_item(topic_id: int) -> list[int]:
    """What a report, lead or AlterPartition item about a partition ends with: its topic
    id, if it has one (ClusterMetadata.other_topic; a group from before ids, or of a
    config, adds none)."""
    return [topic_id] if topic_id else []


def master_slave_spec(name: str, partition: tuple[str, int], part: records.PartitionInfo,
                      members: dict[str, str], broker_id: str,
                      store: StoreConfig | None = None, topic_id: int = 0) -> GroupSpec:
    """The spec of a master-slave partition as ``broker_id`` first hosts it: its role is
    the metadata's (the leader: SYNC_MASTER of the other replicas, a write acknowledged
    once one slave has it, RocketMQ's default; the others: slaves of the leader). A
    restarted broker's saved role state wins over it (node.py), and ``apply_role`` makes
    the group what the metadata says from then on."""
    others = tuple(member for member in part.replicas if member != broker_id)
    if part.leader == broker_id:
        replication = ReplicationConfig(layer="master_slave", cluster_id=name,
                                        node_id=broker_id, slaves=others,
                                        role="SYNC_MASTER" if others else "ASYNC_MASTER")
    else:  # a slave (of the first other replica if the partition has no leader: it waits)
        replication = ReplicationConfig(layer="master_slave", cluster_id=name,
                                        node_id=broker_id, role="SLAVE",
                                        master=part.leader or others[0])
    return GroupSpec(name, replication, dict(members), store or StoreConfig(),
                     partitions=(partition,), topic_id=topic_id).validate()


def apply_role(status: dict[str, Any] | None, part: records.PartitionInfo,
               broker_id: str) -> dict[str, Any] | None:
    """The promote or follow request that makes a hosted master-slave group's core (its
    ``status``: GroupHost.role) what the metadata's ``part`` says, or None. The leader is
    promoted in the partition's leader epoch (the core takes one above every epoch it
    saw, if more); a master, or a slave of another node, follows the leader (a diverged
    tail is truncated by epoch when its Hello is answered)."""
    if status is None or not part.leader:
        return None  # (no master now: the controller waits for a slave it may promote)
    if part.leader == broker_id:
        if status["role"] in ("ASYNC_MASTER", "SYNC_MASTER") or not status["promotable"]:
            return None
        return {"kind": "promote", "role": "SYNC_MASTER", "epoch": part.leader_epoch,
                "slaves": [member for member in part.replicas if member != broker_id]}
    if status["role"] != "SLAVE" or status["master"] != part.leader:
        return {"kind": "follow", "master": part.leader}
    return None


def mark_member(path: Path, broker_id: str, cluster_id: str) -> bool:
    """Write ``MEMBER_FILE`` (the broker and cluster it was registered as), durably;
    whether it was. A failure is said, not raised, and tried again each round: should
    the broker stop first, its next start is taken for a wiped data_dir's."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, f"mqlog-member {broker_id} {cluster_id}\n".encode())
    except (OSError, errors.MqlogError) as error:
        print(f"broker {broker_id}: cannot write {path} ({error}); trying again each "
              "round (a restart before it is written is taken for a wiped data_dir's)",
              flush=True)
        return False
    return True


def unclean_stores(data_dir: Any, skip: set[str] | None = None) -> list[str]:
    """The partition stores under ``data_dir`` that the last life left open (their abort
    marker, engine/files.py, is still there: recovery will scan them, and with
    replica_ack "written" they may have lost acknowledged records). Call before any
    partition is opened (an open store has its marker): the controller's store and the
    groups in ``skip`` (those the broker's config hosts, open already) are not looked at."""
    root, skip = Path(data_dir), {CONTROLLER_GROUP, *(skip or ())}
    if not root.is_dir():
        return []
    return sorted(child.name for child in root.iterdir()
                  if child.is_dir() and child.name not in skip
                  and (child / "abort").exists())


def _call(address: str, header: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    with Client(address, timeout_s=timeout_s) as client:
        return client.call(dict(header))[0]


def attach_isr(agent: BrokerAgent, broker: Any) -> None:
    """Join ``agent`` and ``broker``'s ISR groups both ways: the controller's newest state
    for a hosted partition goes to its core, a refused AlterPartition back to it, and a
    leader's AlterPartition (``broker.alter_partition``) to the agent's next round. The
    simulator's brokers (sim/brokers.py) are joined by this same code."""

    def on_partition(name: str, state: PartitionState) -> None:
        node = broker.groups.get(name)
        if node is not None:
            node.core.apply_metadata(state)
            node.schedule()

    def on_alter_refused(name: str, why: str, stale: bool) -> None:
        node = broker.groups.get(name)
        if node is not None:
            node.core.alter_partition_refused(why, stale)

    agent.on_partition, agent.on_alter_refused = on_partition, on_alter_refused
    broker.alter_partition = lambda node, request: agent.request_alter(node.name, request)


def attach_transfers(agent: BrokerAgent, broker: Any) -> None:
    """Leader balancing's Raft moves: a transfer the controller asks for in a heartbeat
    answer goes to the hosted group's core (the simulator's brokers are joined by this
    same code)."""

    def on_transfer(name: str, target: str) -> None:
        node = broker.groups.get(name)
        if node is not None and node.spec.replication.layer == "raft":
            node.core.transfer_leadership(target)
            node.schedule()

    agent.on_transfer = on_transfer


def join_cluster(broker: Any) -> BrokerAgent:
    """Start ``broker``'s agent (see the module docstring); call on its loop."""
    config = _config(broker)
    agent = BrokerAgent(BrokerGroups(broker), config,
                        SocketIo(broker, call_timeout_s(config)), store=broker.config.store)
    left_open = unclean_stores(broker.config.data_dir, skip=set(broker.groups))
    agent.unclean_shutdown = bool(left_open)
    if left_open:
        print(f"broker {broker.broker_id}: stores not closed cleanly: "
              f"{', '.join(left_open)}; the controller takes this broker out of every "
              "ELR (KIP-966)", flush=True)
    member_file = Path(broker.config.data_dir) / MEMBER_FILE
    agent.fresh_data_dir = not member_file.exists()
    if agent.fresh_data_dir:
        print(f"broker {broker.broker_id}: {member_file} is missing (a first start, or a "
              "wiped data_dir): if the cluster knew this broker, its controller takes it "
              "out of every ISR and ELR", flush=True)
        agent.on_registered = lambda: mark_member(member_file, broker.broker_id,
                                                  broker.config.cluster_id)
    attach_isr(agent, broker)
    attach_transfers(agent, broker)
    agent.on_fatal = broker.cannot_run  # (refused for good: it stops, status 1)

    async def handle(header: dict[str, Any], payload: bytes) -> tuple[dict[str, Any], bytes]:
        return agent.describe(), b""

    broker.add_service(("cluster_metadata",), handle)
    agent.start()
    return agent
