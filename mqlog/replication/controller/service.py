"""The controller service: one controller replica's metadata, over its Raft replica.

The controller quorum is a Raft group of mqlog's own (the Raft core, run by the one
driver, over an ordinary store: DESIGN §5.2). Its records are metadata records
(records.py) on topic ``__cluster_metadata``. This class owns no I/O: its host (a broker
with role "controller", or the simulator) runs the group's driver and calls, on the
loop's thread only:

* ``after_run()`` after every driver run: it folds the newly committed records into
  ``committed`` (a ``ClusterMetadata``: state.py) and answers the requests whose records
  are now folded (or fails them if this controller stopped leading: their fate is then
  unknown, as any Raft proposal's);
* ``tick()`` every tick: the leader fences a broker whose last heartbeat is older than
  ``broker_session_timeout_ms`` (counted in the leader's own ticks: no clock is
  compared across machines; a new leader gives every broker a fresh session, as Kafka's
  does), and writes a snapshot every ``snapshot_interval_bytes`` of log;
* the requests (``register_broker``, ``heartbeat``, ``create_topic``, ``delete_topic``,
  ``alter_partitions``: ISR leaders' AlterPartition, decided by isr/decisions.py)
  on the leader: checked against ``working`` — the committed state plus this leader's own
  records still in flight — turned into records, written through the driver and proposed;
  they return a ``Proposal`` whose answer is final once ``wait`` calls back with True;
* the reads (``describe``, ``metadata_since``) on any controller: what it has folded.

Serving. A new leader serves requests only once it has folded its log up to where its
term began (every record of earlier terms is committed by then, and ``working`` starts
from a state that includes them): Kafka's controller does the same before it acts.

Rebuilt on start, trimmed after a snapshot. A ``Snapshot`` record holds the whole state;
folding may begin at one. On start (and whenever a Raft LogReset started this replica's
log over past what it had folded) the controller folds from the log's start if the log was
never trimmed, else from the first snapshot record in it. Once a snapshot record is
folded, the log's segments wholly before the one that holds it are deleted
(``Store.trim_front``), so the log always starts at or before a snapshot; a follower that
the leader's trimmed log left behind gets the log from its start (Raft's LogReset) and so
the snapshot with it.

Skipped records. The leader proposes only records that apply, so a committed record that
does not decode or does not apply means a bug: every controller skips it alike (the
fold stays deterministic), counts it in ``skipped`` and says so through ``note``.
"""

from __future__ import annotations

import difflib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from mqlog.errors import (
    ControllerBusy,
    DuplicateBrokerRegistration,
    InvalidArgument,
    InvalidMetadataRecord,
    MessageTooLarge,
    MetadataChangeRefused,
    MqlogError,
    NodeUnavailable,
    NotLeader,
    StaleAlterPartition,
)
from mqlog.format import BLANK, BLANK_MAGIC, RECORD_HEADER, RECORD_HEADER_SIZE, RecordHeader
from mqlog.replication.controller import records
from mqlog.replication.controller.config import ControllerConfig
from mqlog.replication.controller.decisions import TEST_BREAKS as DECISION_BREAKS
from mqlog.replication.controller.decisions import (
    fence_changes,
    imbalanced,
    isr_change,
    place_replicas,
    sync_state_change,
    unfence_changes,
)
from mqlog.replication.controller.leaders import Key, LeaderTable
from mqlog.replication.controller.records import (
    LAYERS,
    METADATA_TOPIC,
    CreateTopic,
    DeleteTopic,
    FenceBroker,
    PartitionChange,
    Record,
    RegisterBroker,
    Snapshot,
    UnfenceBroker,
)
from mqlog.replication.controller.state import ClusterMetadata
from mqlog.replication.isr.core import AlterPartition, PartitionState
from mqlog.replication.isr.decisions import decide_alter_partition, elect_preferred

# Deliberately broken controllers, so the simulator shows its checkers catch them:
# "stale_working": a new leader checks requests against the state it had before it folded
# its log (records that do not apply reach the log); "keep_leaders": fencing a broker
# leaves its leaderships where they were. (The simulator catches each of these; the
# decisions' own breaks, DECISION_BREAKS, are caught by the datadriven scripts and the
# master-slave failover test of real processes.)
TEST_BREAKS = ("stale_working", "keep_leaders")


@dataclass(frozen=True)
class Proposal:
    """A request's answer, final once the log is folded up to ``end`` (None: at once)."""

    end: int | None
    answer: dict[str, Any]


@dataclass
class _Waiter:
    end: int
    term: int
    done: Callable[[bool], None]


@dataclass(frozen=True)
class _Entry:
    start: int
    end: int
    control: bool
    topic: str
    tags: str
    body: bytes


class Controller:
    """One controller replica's metadata service; see the module docstring."""

    def __init__(self, config: ControllerConfig, store: Any, driver: Any, *, tick_ms: int,
                 rng: random.Random, note: Callable[[str], None] = lambda text: None,
                 test_break: str = "") -> None:
        self._test_break = test_break if test_break in (*TEST_BREAKS, *DECISION_BREAKS) \
            else ""
        self.config = config.validate()
        self.store, self.driver, self.rng, self.note = store, driver, rng, note
        self.session_ticks = config.session_ticks(tick_ms)
        self.balance_ticks = config.balance_ticks(tick_ms)
        self.committed = ClusterMetadata()
        self.working = self.committed
        self.applied_to = 0  # the committed log is folded up to here
        self.fold_start = 0  # where this replica's fold began (a snapshot after a trim)
        self.skipped = 0
        self.ticks = 0
        self._pending: list[tuple[int, Record]] = []  # this leader's records in flight
        self._waiters: list[_Waiter] = []
        self._lead_term = -1  # the term this controller leads (and has begun), else -1
        self._lead_from = 0  # it serves once its fold reached here (its term's start)
        self._sessions: dict[str, int] = {}  # broker -> leader tick of its last heartbeat
        self._reported: dict[tuple[str, int], dict[str, tuple[int, int]]] = {}
        self.leaders = LeaderTable()  # Raft partitions' leaders, as reported (leaders.py)
        self._registered_at: dict[str, int] = {}  # broker -> where its registration ends
        # (topic, partition) -> broker -> the tick its report came; broker -> the tick
        # this leader fenced it (or began leading): a promotion takes only later reports
        self._reported_tick: dict[tuple[str, int], dict[str, int]] = {}
        self._fenced_tick: dict[str, int] = {}
        self._lead_tick = 0
        self._balanced_tick = 0  # the leader imbalance was last checked at this tick
        # Raft partitions' transfers to ask of their leaders' brokers, in their next
        # heartbeat answers: broker -> (topic, partition) -> target (leader balancing)
        self._transfers: dict[str, dict[Key, str]] = {}
        self.sync_states_stale = 0  # sync state set reports that changed nothing: stale
        self._snapshot_end = 0  # where the newest snapshot record in the log ends
        self._reports_seen = 0  # heartbeats that carried reports (fence_changes reads them)
        # (working, reports seen, term) when _finish_fences last found nothing to do
        self._fences_settled: tuple[ClusterMetadata, int, int] | None = None
        self._proposals = 0
        self._snapshot_folded: int | None = None  # a snapshot record folded: trim before it
        self.rebuilding = False  # the log was trimmed: nothing folds before its first snapshot
        self._caught_up_with: tuple[str, int] | None = None  # (leader, term) it caught up to
        self._rebuild()

    # --- driven by the host --------------------------------------------------------------

    def after_run(self) -> None:
        """After every driver run: follow leadership, fold what committed, answer."""
        core = self.driver.core
        leading = bool(self.driver.serving)
        if leading and self._lead_term != core.term:
            self._lose_lead()
            self._lead_term, self._lead_from = core.term, self.store.written_position
            self._sessions = {name: self.ticks for name in self.committed.brokers}
            self.leaders.token = f"{core.node_id}:{core.term}"  # (brokers get every entry)
            self._lead_tick = self._balanced_tick = self.ticks
            self.note(f"controller {core.node_id} leads term {core.term}")
        elif not leading and self._lead_term != -1:
            self._lose_lead()
        before = self.applied_to
        self._refresh()
        if (self.applied_to != before or not self._pending) and \
                self._test_break != "stale_working":
            self._pending = [item for item in self._pending if item[0] > self.applied_to]
            self._recompute_working()
        if self.applied_to != before:
            self.leaders.prune(self.committed)
        ready = [waiter for waiter in self._waiters if waiter.end <= self.applied_to]
        self._waiters = [waiter for waiter in self._waiters if waiter.end > self.applied_to]
        for waiter in ready:
            waiter.done(True)

    def tick(self) -> None:
        self.ticks += 1
        if not self.serving:
            return
        try:
            for name in self.working.live_brokers():
                heard = self._sessions.setdefault(name, self.ticks)
                if self.ticks - heard > self.session_ticks:
                    self.note(f"broker {name} missed its session: fenced")
                    self._fence(name)
            self._finish_fences()
            if self.config.auto_leader_rebalance_enable and \
                    self.ticks - self._balanced_tick >= self.balance_ticks:
                self._balanced_tick = self.ticks
                self._balance()
            if self.store.written_position - self._snapshot_end > \
                    self.config.snapshot_interval_bytes:
                self._snapshot()
        except MqlogError as error:  # (a full disk, say: the next tick tries again)
            self.note(f"controller tick: {error}")

    def _snapshot(self) -> None:
        try:
            self._propose([self.working.snapshot()])
        except MessageTooLarge as error:  # the log keeps growing, untrimmed, until the
            # state shrinks or the limit grows: say so, and retry an interval later
            self._snapshot_end = self.store.written_position
            self.note(f"the controller's snapshot does not fit one record ({error}): its "
                      "log is not trimmed; raise message_size_bytes_max of its store")

    def wait(self, proposal: Proposal, done: Callable[[bool], None]) -> None:
        """Call ``done(True)`` once ``proposal`` is folded, ``done(False)`` if this
        controller stops leading first (the outcome is then unknown: retry)."""
        if proposal.end is None or proposal.end <= self.applied_to:
            done(True)
            return
        self._waiters.append(_Waiter(proposal.end, self._lead_term, done))

    def stop(self) -> None:
        """Its replica went away (a crash, a shutdown): what waited has an unknown fate."""
        self._lose_lead()

    @property
    def caught_up(self) -> bool:
        """Whether its fold is worth reading: it leads, or it has folded up to the commit
        its leader announced since it began following it, and is not rebuilding. (A
        restarted controller knows nothing committed until a leader tells it, and knowing
        the leader is not enough: its first Entries may be refused, the commit unmoved.)
        Once reached, it stays caught up while it follows that leader: a later
        announcement it has not folded yet is a moment's lag, not an old state."""
        core = self.driver.core
        if self.rebuilding:
            return False
        if self.serving:
            return True
        if not core.leader or core.leader == core.node_id:
            return False
        following = (core.leader, core.term)
        if self._caught_up_with != following:
            announced = core.leader_commit
            if announced < 0 or self.applied_to < announced:
                return False
            self._caught_up_with = following
        return True

    @property
    def serving(self) -> bool:
        """Whether this controller leads and takes requests now."""
        return self._lead_term != -1 and self.applied_to >= self._lead_from and \
            bool(self.driver.serving)

    # --- requests (the leader) ------------------------------------------------------------

    def register_broker(self, broker_id: str, address: str, rack: str = "",
                        incarnation: str = "", unclean_shutdown: Any = False,
                        groups_max: Any = 0, *, fresh_data_dir: Any = False) -> Proposal:
        """A broker (re)joins: a new broker epoch, unless ``incarnation`` (its process
        life) is the one registered already — a retry whose answer was lost — which is
        answered with the epoch it has (KIP-631), no record written. After an unclean
        shutdown (KIP-966) it leaves the ELRs, with the registration (leave_elr).
        ``groups_max``: the most groups the broker hosts (0: not said), which
        ``create_topic`` places replicas within. ``fresh_data_dir``: its data_dir holds no
        sign of an earlier life (host.py's MEMBER_FILE): for a broker known here, wiped
        or replaced, so registered as after an unclean shutdown and with ``data_lost``
        (out of every ELR, even one it is the last eligible replica of: its replicas hold
        nothing); for a new one, nothing."""
        _check_text(broker_id=broker_id, address=address, rack=rack, incarnation=incarnation)
        _check_address(broker_id, address)
        for name, flag in (("unclean_shutdown", unclean_shutdown),
                           ("fresh_data_dir", fresh_data_dir)):
            if not isinstance(flag, bool):
                raise InvalidArgument(f"{name} must be true or false, got {flag!r}")
        if not isinstance(groups_max, int) or isinstance(groups_max, bool) or \
                not 0 <= groups_max < 1 << 31:
            raise InvalidArgument(f"groups_max must be a count (0: not said), got "
                                  f"{groups_max!r}")
        self._check_serving()
        known = self.working.brokers.get(broker_id)
        data_lost = fresh_data_dir and known is not None  # (a new broker's is empty anyway)
        unclean_shutdown = unclean_shutdown or data_lost
        if known is not None and incarnation and known.incarnation == incarnation and \
                (known.address, known.rack, known.groups_max) == (address, rack, groups_max):
            self._sessions[broker_id] = self.ticks
            # (no metadata_position: where this life's registration ends may be past what
            # this controller noted, another leader having written it; a broker told too
            # low a position would take a lagging view for complete and delete stores of
            # live topics. It sweeps none in this life.)
            return Proposal(self._registered_at.get(broker_id),
                            {"broker_epoch": known.broker_epoch})
        if known is not None and self._held_by_another(known, address, incarnation):
            raise DuplicateBrokerRegistration(
                f"broker {broker_id} is registered by another live process, at "
                f"{known.address}, whose session has not ended: give each broker its own "
                f"broker_id (a broker that moved to {address} is taken once that session "
                f"ends, broker_session_timeout_ms={self.config.broker_session_timeout_ms})")
        if known is None and len(self.working.brokers) >= self.config.brokers_max:
            raise MetadataChangeRefused(f"{len(self.working.brokers)} brokers registered, "
                                        f"brokers_max={self.config.brokers_max}")
        epoch = 1 if known is None else known.broker_epoch + 1
        register = RegisterBroker(broker_id, epoch, address, rack, incarnation,
                                  unclean_shutdown, groups_max, data_lost)
        # A fenced broker's changes, as _finish_fences makes them, but in the same batch:
        # after an unclean shutdown, out of every ELR before its first heartbeat can
        # unfence it; and whenever its last life was not fenced yet (it restarted within
        # its session), that life's ISR leaderships end now: a leader that lost what it
        # had not flushed must not lead the same leader epoch again from a shorter log,
        # which followers that fetched the lost records would not notice (their epochs
        # match). (A master-slave failover waits for reports made after the fence, and
        # its core never serves a restarted master's old epoch; Raft elects on its own.)
        last_life_live = known is not None and not known.fenced
        changes = fence_changes(self.working.apply(register), broker_id,
                                self.config.auto_failover, self._reported,
                                **self._rules(broker_id)) \
            if unclean_shutdown or last_life_live else []
        if not unclean_shutdown:
            changes = [change for change in changes if change.layer == "isr"]
        if unclean_shutdown:
            self.note(f"broker {broker_id} registers after an unclean shutdown: out of "
                      f"every ELR ({len(changes)} partition changes)")
        end = self._propose([register, *changes])
        self._registered_at[broker_id] = end
        self._sessions[broker_id] = self.ticks
        self._fenced_tick[broker_id] = self.ticks  # (its last life is over: as a fence)
        # (where the registration ends in the metadata log: a broker whose view reaches it
        # knows every topic created before, so a store of its last life that no topic has
        # is a deleted topic's: host.py's BrokerAgent._sweep_strays)
        return Proposal(end, {"broker_epoch": epoch, "metadata_position": end})

    def _held_by_another(self, known: Any, address: str, incarnation: str) -> bool:
        """Whether a registration at ``address`` of process life ``incarnation`` would take
        a broker id another live process holds: another life, at another address, not
        fenced, its session alive. A restart keeps its address (two live processes cannot
        listen on one), so it re-registers at once and ends its last life's leaderships;
        a second process with the same id is refused, not let fence the first in turn."""
        heard = self._sessions.get(known.broker_id)
        return not known.fenced and known.incarnation != incarnation and \
            known.address != address and heard is not None and \
            self.ticks - heard <= self.session_ticks

    def heartbeat(self, broker_id: str, broker_epoch: int,
                  reports: dict[tuple[str, int], tuple[int, int]] | None = None,
                  leads: dict[Key, int] | None = None,
                  seen: tuple[Any, Any] = ("", 0),
                  sync_states: dict[tuple[str, int], tuple[int, tuple[str, ...]]] | None = None,
                  ) -> Proposal:
        """A broker is alive at ``broker_epoch``; ``reports`` gives (epoch, position) of its
        replicas' logs, for master-slave failover; ``leads`` the Raft partitions it leads
        (-> term); ``sync_states`` the sync state set of each master-slave group it
        masters, as (the partition epoch its view holds, the slaves its core counts in
        sync). A fenced broker is unfenced. The answer carries the reported leaders the
        broker has not seen (``seen``: the token and seq of its last answer)."""
        _check_text(broker_id=broker_id)
        _check_int("broker_epoch", broker_epoch)
        reports = _check_reports(reports)
        leads = _check_leads(leads)
        sync_states = _check_sync_states(sync_states)
        self._check_serving()
        known = self.working.brokers.get(broker_id)
        if known is None or known.broker_epoch != broker_epoch:
            raise MetadataChangeRefused(
                f"broker {broker_id} heartbeats at broker epoch {broker_epoch}, but "
                + ("it is not registered" if known is None else
                   f"its registration is at epoch {known.broker_epoch}")
                + ": register again")
        self._sessions[broker_id] = self.ticks
        for where, report in (reports or {}).items():
            self._reported.setdefault(where, {})[broker_id] = report
            self._reported_tick.setdefault(where, {})[broker_id] = self.ticks
        if reports:
            self._reports_seen += 1
        self.leaders.report(self.working, broker_id, leads)
        changes: list[Record] = []
        if known.fenced:  # (and the leaderless ISR partitions it may lead elect it)
            unfence = UnfenceBroker(broker_id, broker_epoch)
            changes = [unfence, *unfence_changes(self.working.apply(unfence), broker_id,
                                                 reported=self._reported,
                                                 **self._isr_rules())]
        for (topic, index), (partition_epoch, in_sync) in sorted(sync_states.items()):
            change = sync_state_change(self.working, broker_id, topic, index,
                                       partition_epoch, in_sync)
            if change is None:
                self.sync_states_stale += 1
            else:
                changes.append(change)
        end = self._propose(changes) if changes else None
        self._note_unclean(changes)
        answer = {"fenced": False, "position": self.applied_to,
                  "leaders": self.leaders.changes_since(*seen)}
        transfers = self._transfers.pop(broker_id, {})
        if transfers:  # (asked once: the next check asks again if it is still needed)
            answer["transfers"] = [[topic, partition, target] for (topic, partition), target
                                   in sorted(transfers.items())]
        return Proposal(end, answer)

    def alter_partitions(self, broker_id: str, broker_epoch: int,
                         items: Any) -> Proposal:
        """ISR leaders' AlterPartition requests: ``items`` is a list of [topic, partition,
        leader_epoch, partition_epoch, isr]. Each is decided on its own (isr/decisions.py:
        one computed from a stale epoch is refused); the answer lists, per item, "" or why
        it was refused, and is final once the accepted changes are folded; ``stale`` says,
        per item, whether the refusal was for a moved epoch (an earlier copy of the request
        may be what moved it: the leader waits for the metadata, see StaleAlterPartition)."""
        _check_text(broker_id=broker_id)
        _check_int("broker_epoch", broker_epoch)
        self._check_serving()
        known = self.working.brokers.get(broker_id)
        if known is None or known.broker_epoch != broker_epoch or known.fenced:
            raise MetadataChangeRefused(f"broker {broker_id} at broker epoch {broker_epoch} "
                                        "is not a registered, unfenced broker: register again")
        if not isinstance(items, list) or len(items) > self.config.partitions_max:
            raise InvalidArgument("items must be a list of [topic, partition, leader_epoch, "
                                  "partition_epoch, isr]")
        changes, results, stale, working = [], [], [], self.working
        for item in items:
            try:
                change = self._alter_partition(broker_id, item, working)
                working = working.apply(change)  # (two items for one partition: one goes)
            except MetadataChangeRefused as error:
                results.append(str(error))
                stale.append(isinstance(error, StaleAlterPartition))
                continue
            changes.append(change)
            results.append("")
            stale.append(False)
        end = self._propose(changes) if changes else None
        return Proposal(end, {"results": results, "stale": stale})

    def _alter_partition(self, broker_id: str, item: Any, working: ClusterMetadata) -> Any:
        if not (isinstance(item, list) and len(item) in (5, 6) and isinstance(item[0], str)
                and all(isinstance(value, int) and not isinstance(value, bool)
                        for value in (*item[1:4], *item[5:])) and isinstance(item[4], list)
                and all(isinstance(name, str) for name in item[4])):
            raise InvalidArgument(f"an AlterPartition item is [topic, partition, "
                                  f"leader_epoch, partition_epoch, [isr...]] and maybe a "
                                  f"topic id, got {item!r}")
        topic, partition, leader_epoch, partition_epoch, isr = item[:5]
        info = working.topics.get(topic)
        if info is None or info.layer != "isr" or not 0 <= partition < len(info.partitions):
            raise MetadataChangeRefused(f"{topic}/{partition} is no ISR partition")
        if len(item) == 6 and working.other_topic(topic, item[5]):
            # (the leader of a deleted topic's partition, until it folds the deletion: its
            # epochs may equal those of the partition of the topic created again)
            raise StaleAlterPartition(f"{topic}/{partition} is of topic id {info.topic_id}, "
                                      f"not {item[5]}: the topic was deleted and created "
                                      "again")
        current = PartitionState.of(info.partitions[partition])
        request = AlterPartition(broker_id, "controller", leader_epoch, partition_epoch,
                                 tuple(isr))
        live = {name for name, broker in working.brokers.items() if not broker.fenced}
        decided = decide_alter_partition(
            current, request, info.min_insync_replicas or self.config.min_insync_replicas,
            live)
        return isr_change(topic, partition, decided)

    def create_topic(self, name: str, partitions: int, replication_factor: int,
                     layer: str = "raft", topic_config: Any = None) -> Proposal:
        """A new topic, its replicas placed as Kafka places them; ``topic_config`` holds
        its own settings (TOPIC_CONFIG: an ISR topic's ``min_insync_replicas``, 1..its
        replication factor; without it, the [controller] value applies)."""
        _check_text(name=name, layer=layer)
        min_insync = _topic_config(topic_config, replication_factor, layer)
        self._check_serving()
        config = self.config
        if not isinstance(partitions, int) or not 1 <= partitions <= config.partitions_max:
            raise InvalidArgument(f"partitions must be 1..{config.partitions_max} "
                                  f"(partitions_max), got {partitions!r}")
        if not isinstance(replication_factor, int) or \
                not 1 <= replication_factor <= config.replication_factor_max:
            raise InvalidArgument(f"replication factor must be 1.."
                                  f"{config.replication_factor_max} (replication_factor_max),"
                                  f" got {replication_factor!r}")
        if layer not in LAYERS:
            raise InvalidArgument(f"layer must be one of {', '.join(LAYERS)}, got {layer!r}")
        if len(self.working.topics) >= config.topics_max:
            raise MetadataChangeRefused(f"{config.topics_max} topics exist (topics_max)")
        if name in self.working.topics:
            raise MetadataChangeRefused(f"topic {name!r} exists already (delete it first)")
        assignment = place_replicas(self.working, partitions, replication_factor, self.rng,
                                    self._groups_hosted())
        record = CreateTopic(name, layer, assignment, min_insync,
                             topic_id=self.rng.getrandbits(63) | 1)
        return Proposal(self._propose([record]), {"assignment": assignment})

    def _groups_hosted(self) -> dict[str, int]:
        """Groups a broker hosts besides its topics' partitions: the controller's own on a
        combined broker (a voter id that is a broker id)."""
        return {name: 1 for name in self.config.voters if name in self.working.brokers}

    def delete_topic(self, name: str) -> Proposal:
        _check_text(name=name)
        self._check_serving()
        return Proposal(self._propose([DeleteTopic(name)]), {})

    # --- reads (any controller) ------------------------------------------------------------

    def describe(self, require_leader: bool = False) -> dict[str, Any]:
        """The folded state, as a snapshot body (and where it stands in the log), and the
        Raft partitions' reported leaders (only the leader's are fresh: ``require_leader``
        makes any other controller answer NotLeader)."""
        if require_leader:
            self._check_serving()
        if not self.caught_up:
            raise NodeUnavailable(f"controller {self.driver.core.node_id} may be behind (it "
                                  "knows no leader yet, or is rebuilding its state from its "
                                  "log): ask another, or retry soon")
        return {"snapshot": records.encode(self.committed.snapshot()),
                "position": self.applied_to, "leader": self.driver.core.leader or None,
                "leaders": self.leaders.entries()}

    def metadata_since(self, position: int) -> dict[str, Any]:
        """The committed records after ``position`` (at most ``pull_bytes_max`` of log), or
        a snapshot when ``position`` lies before what this controller folded."""
        if not isinstance(position, int) or isinstance(position, bool) or position < 0:
            raise InvalidArgument(f"position must be a non-negative int, got {position!r}")
        if position > self.applied_to or not self.caught_up:  # (behind: nothing to give)
            return {"records": [], "position": position}
        if position < max(self.fold_start, self.store.first_segment_base()):  # (trimmed)
            return {**self.describe(), "records": []}
        found: list[list[Any]] = []
        stop = position
        for entry in self._entries(position, self.applied_to):
            if entry.end - position > self.config.pull_bytes_max and found:
                break
            stop = entry.end
            if not entry.control and entry.topic == METADATA_TOPIC:
                found.append([entry.end, entry.body])
        return {"records": found, "position": stop}

    # --- inside: proposing ---------------------------------------------------------------

    def _check_serving(self) -> None:
        if self.serving:
            return
        core = self.driver.core
        leader = core.leader if core.leader != core.node_id else None
        raise NotLeader(f"controller {core.node_id} does not lead the controller quorum now"
                        + (f"; ask {leader}" if leader else "; retry soon"), leader=leader,
                        leader_address=self.config.voters.get(leader or ""))

    def _propose(self, items: list[Record]) -> int:
        """Check, write and propose ``items``; return where the last ends."""
        if len(self._waiters) >= self.config.requests_waiting_max:
            raise ControllerBusy(f"{len(self._waiters)} controller requests wait for their "
                                 "commit (requests_waiting_max); nothing of this one was "
                                 "proposed: retry soon")
        working = self.working
        for item in items:
            working = working.apply(item)  # (raises before anything is written)
        self.driver.check_writable()
        end = self.store.written_position
        for item in items:  # (a failed write, DiskFull say, leaves the earlier ones proposed)
            stored = self.driver.write(METADATA_TOPIC, [records.encode(item)],
                                       tags=type(item).__name__)
            self._proposals += 1
            self.driver.propose(("controller", self._proposals), stored.end)
            self._pending.append((stored.end, item))
            self.working = self.working.apply(item)
            if isinstance(item, Snapshot):
                self._snapshot_end = stored.end
            end = stored.end
        return end

    def elect_preferred(self, names: Any = None) -> Proposal:
        """Preferred-leader election of the ISR partitions of topics ``names`` (all if
        None): each whose preferred replica is live, in the ISR and not leading is handed
        to it (``mqlog topics rebalance``; Raft partitions are moved by a transfer their
        leader is asked for). The answer lists [topic, partition, "" or why not] for each
        ISR partition."""
        if names is not None and not (isinstance(names, list) and all(
                isinstance(name, str) for name in names)):
            raise InvalidArgument(f"topics must be a list of names, got {names!r}")
        self._check_serving()
        missing = [name for name in names or () if name not in self.working.topics]
        if missing:
            raise MetadataChangeRefused(f"no topic {', '.join(missing)} (`mqlog topics "
                                        "list` shows the topics there are)")
        live, results = set(self.working.live_brokers()), []
        changes: list[Record] = []
        for name in sorted(names or self.working.topics):
            topic = self.working.topics[name]
            for index, part in enumerate(topic.partitions):
                if topic.layer != "isr":
                    continue
                try:
                    decided = elect_preferred(PartitionState.of(part), live)
                except MetadataChangeRefused as error:
                    results.append([name, index, str(error)])
                    continue
                changes.append(isr_change(name, index, decided))
                results.append([name, index, ""])
        end = self._propose(changes) if changes else None
        return Proposal(end, {"results": results})

    def _balance(self) -> None:
        """One leader imbalance check (decisions.imbalanced): ISR partitions are handed
        back by a PartitionChange now, Raft ones by transfers asked in heartbeats."""
        state = self.leaders.overlay(self.working)
        live, changes = set(state.live_brokers()), list[Record]()
        for move in imbalanced(state, self.config.leader_imbalance_per_broker_percentage):
            if move.layer == "raft":
                self._transfers.setdefault(move.leader, {})[
                    (move.topic, move.partition)] = move.preferred
                continue
            part = self.working.topics[move.topic].partitions[move.partition]
            changes.append(isr_change(move.topic, move.partition,
                                      elect_preferred(PartitionState.of(part), live)))
        if changes or self._transfers:
            self.note(f"leader balancing: {len(changes)} ISR partitions back to their "
                      f"preferred leaders, transfers asked of {sorted(self._transfers)}")
        if changes:
            self._propose(changes)

    def _note_unclean(self, changes: list[Any]) -> None:
        """The event of each unclean election in ``changes`` (KIP-966: say what may be lost)."""
        for change in changes:
            if isinstance(change, PartitionChange) and change.unclean:
                epoch, have, knew = change.unclean
                self.note(f"unclean election: {change.topic}/{change.partition} led by "
                          f"{change.leader} in leader epoch {epoch} from its log end {have}; "
                          f"another replica reported {knew}: records in [{have}, {knew}) "
                          "may be lost")

    def _fence(self, broker_id: str) -> None:
        info = self.working.brokers[broker_id]
        fence = FenceBroker(broker_id, info.broker_epoch)
        after = self.working.apply(fence)
        self._fenced_tick[broker_id] = self.ticks
        changes = fence_changes(after, broker_id, self.config.auto_failover, self._reported,
                                **self._rules(broker_id))
        if self._test_break == "keep_leaders":
            changes = []
        self._propose([fence, *changes])
        self._note_unclean(changes)

    def _isr_rules(self) -> dict[str, Any]:
        return {"min_insync_replicas": self.config.min_insync_replicas,
                "unclean": self.config.unclean_leader_election}

    def _rules(self, broker_id: str) -> dict[str, Any]:
        """fence_changes' keyword arguments for fencing ``broker_id``."""
        return {**self._isr_rules(), "test_break": self._test_break,
                "fresh": self._fresh(broker_id)}

    def _fresh(self, broker_id: str) -> dict[tuple[str, int], set[str]]:
        """Who reported after this leader fenced ``broker_id`` (or, if another did, after
        this one began leading): a slave's log stops growing once its master is gone, and
        only a report sent since says how far it got."""
        since = self._fenced_tick.get(broker_id, self._lead_tick)
        return {where: {name for name, tick in ticks.items() if tick > since}
                for where, ticks in self._reported_tick.items()}

    def _finish_fences(self) -> None:
        """Make the changes a fence calls for that are not in the log: a fence and its
        partition changes are separate records, and a leader that failed (or met a full
        disk) between them left a committed fence whose partitions a fenced broker still
        leads. fence_changes is empty once they are made, but each is a scan of every
        partition: a scan that found nothing is not made again until its inputs move (the
        state, by identity: it is immutable; the reports, which fresh heartbeats bring; the
        term), so an idle leader with a broker down long makes none (1000 partitions and
        one fenced broker cost 2 ms a tick, 20% of a core at 100 ticks a second)."""
        if self._test_break == "keep_leaders":
            return
        inputs = (self.working, self._reports_seen, self._lead_term)
        settled = self._fences_settled
        if settled is not None and settled[0] is inputs[0] and settled[1:] == inputs[1:]:
            return
        for name, info in sorted(self.working.brokers.items()):
            if info.fenced:
                changes = fence_changes(self.working, name, self.config.auto_failover,
                                        self._reported, **self._rules(name))
                if changes:
                    self.note(f"fenced broker {name}: {len(changes)} partition changes "
                              "are not in the log yet (or waited for fresh reports); "
                              "proposing them")
                    self._propose(list(changes))
                    self._note_unclean(changes)
        if self.working is inputs[0]:  # (nothing proposed, nothing raised: settled)
            self._fences_settled = inputs

    def _lose_lead(self) -> None:
        """This controller stopped leading: what it proposed may or may not commit."""
        self._lead_term = -1
        self._transfers = {}
        self._pending = []
        self.working = self.committed
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.done(False)

    def _recompute_working(self) -> None:
        working = self.committed
        for _end, item in self._pending:
            try:
                working = working.apply(item)
            except MetadataChangeRefused:
                continue
        self.working = working

    # --- inside: folding the committed log ---------------------------------------------------

    def _rebuild(self) -> None:
        """Fold from the log's start, or from its first snapshot if it was trimmed."""
        self.committed, self.working = ClusterMetadata(), ClusterMetadata()
        base = self.store.first_segment_base()
        self.applied_to = self.fold_start = base
        self._snapshot_end = base
        self._caught_up_with = None
        self.rebuilding = base > 0
        self._refresh()

    def _refresh(self) -> None:
        end = self.store.committed_position
        if self.applied_to < self.store.first_segment_base():
            self._rebuild()  # (a LogReset started the log over past the fold: restart)
            return
        if end <= self.applied_to:
            return
        for entry in self._entries(self.applied_to, end):
            if self.rebuilding and entry.tags != "Snapshot":
                self.applied_to = self.fold_start = entry.end  # (before the first snapshot)
                continue
            self.rebuilding = False
            self._fold(entry)
            self.applied_to = entry.end
        self._maybe_trim()

    def _fold(self, entry: _Entry) -> None:
        if entry.control:
            return
        try:
            if entry.topic != METADATA_TOPIC:
                raise InvalidMetadataRecord(f"a record of topic {entry.topic!r}")
            record = records.decode(entry.body)
            self.committed = self.committed.apply(record, entry.end)
        except (InvalidMetadataRecord, MetadataChangeRefused) as error:
            self.skipped += 1
            self.note(f"controller skipped the committed record [{entry.start}, "
                      f"{entry.end}): {error}")
            return
        if isinstance(record, Snapshot):
            self._snapshot_end = max(self._snapshot_end, entry.end)
            self._snapshot_folded = entry.start

    def _maybe_trim(self) -> None:
        """Delete the segments wholly before the newest folded snapshot."""
        folded = self._snapshot_folded
        if folded is None or self.store.read_only:
            return
        self._snapshot_folded = None
        if folded > self.store.first_segment_base():
            self.store.trim_front(folded)

    def _entries(self, start: int, end: int) -> Iterator[_Entry]:
        """The records in [start, end) of the log, in order (blanks skipped)."""
        position = start
        while position < end:
            data = self.store.read_raw(position, self.config.pull_bytes_max)
            if not data:
                return
            offset = 0
            while offset < len(data) and position + offset < end:
                size, magic = BLANK.unpack_from(data, offset)
                if magic == BLANK_MAGIC:
                    offset += size
                    continue
                entry = _entry(data, offset, position + offset)
                if entry.end > end:
                    return
                yield entry
                offset += size
            position += offset


def _check_text(**values: Any) -> None:
    for name, value in values.items():
        if not isinstance(value, str):
            raise InvalidArgument(f"{name} must be a str, got {type(value).__name__}")


TOPIC_CONFIG = ("min_insync_replicas",)  # the settings a topic may have of its own


def _topic_config(value: Any, replication_factor: Any, layer: str) -> int:
    """A create_topic's topic config ({name: value}), checked: its min_insync_replicas
    (0 when not given: the [controller] value applies)."""
    if value is None:
        return 0
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise InvalidArgument(f"a topic config maps names to values, got {value!r}")
    for key in value:
        if key not in TOPIC_CONFIG:
            close = difflib.get_close_matches(key, TOPIC_CONFIG, n=1)
            raise InvalidArgument(f"unknown topic config {key!r}" + (
                f"; did you mean {close[0]!r}?" if close else
                f"; a topic may set {', '.join(TOPIC_CONFIG)}"))
    found = value.get("min_insync_replicas")
    if found is None:
        return 0
    if layer != "isr":
        raise InvalidArgument(f"min_insync_replicas is a setting of isr topics, not of "
                              f"{layer!r} ones")
    factor = replication_factor if isinstance(replication_factor, int) else 0
    if not isinstance(found, int) or isinstance(found, bool) or not 1 <= found <= factor:
        raise InvalidArgument(f"min_insync_replicas must be 1..{factor} (the replication "
                              f"factor), got {found!r}")
    return found


def _check_address(broker_id: str, address: str) -> None:
    """A broker's address is HOST:PORT (what its replicas and clients connect to): one
    that is not would be refused by every broker asked to host a partition with it."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65_535 or \
            any(char.isspace() for char in address):
        raise InvalidArgument(f"broker {broker_id} registers the address {address!r}, which "
                              "is not HOST:PORT (a port 1..65535): fix [node] listen in its "
                              "config")


def _check_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 63:
        raise InvalidArgument(f"{name} must be a non-negative int, got {value!r}")


def _check_reports(reports: Any) -> dict[tuple[str, int], tuple[int, int]]:
    """A heartbeat's reports: {(topic, partition): (epoch, position)} (lists accepted:
    msgpack has no tuples)."""
    if reports is None:
        return {}
    if not isinstance(reports, dict):
        raise InvalidArgument(f"reports must be a map, got {type(reports).__name__}")
    checked = {}
    for where, report in reports.items():
        if not (isinstance(where, tuple | list) and len(where) == 2
                and isinstance(where[0], str) and isinstance(report, tuple | list)
                and len(report) == 2):
            raise InvalidArgument(f"a report is (topic, partition): (epoch, position), got "
                                  f"{where!r}: {report!r}")
        for name, value in (("partition", where[1]), ("epoch", report[0]),
                            ("position", report[1])):
            _check_int(name, value)
        checked[(where[0], where[1])] = (report[0], report[1])
    return checked


def _check_leads(leads: Any) -> dict[Key, int]:
    """A heartbeat's leads: {(topic, partition): term}."""
    if leads is None:
        return {}
    if not isinstance(leads, dict) or not all(
            isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], str)
            for key in leads):
        raise InvalidArgument(f"leads must map (topic, partition) to a term, got {leads!r}")
    for (_, partition), term in leads.items():
        _check_int("partition", partition)
        _check_int("term", term)
    return dict(leads)


def _check_sync_states(states: Any) -> dict[tuple[str, int], tuple[int, tuple[str, ...]]]:
    """A heartbeat's sync state sets: {(topic, partition): (partition epoch, names)}."""
    if states is None:
        return {}
    if not isinstance(states, dict):
        raise InvalidArgument(f"sync_states must be a map, got {type(states).__name__}")
    checked = {}
    for where, state in states.items():
        if not (isinstance(where, tuple | list) and len(where) == 2
                and isinstance(where[0], str) and isinstance(state, tuple | list)
                and len(state) == 2 and isinstance(state[1], tuple | list)
                and all(isinstance(name, str) for name in state[1])):
            raise InvalidArgument(f"a sync state is (topic, partition): (partition epoch, "
                                  f"[broker, ...]), got {where!r}: {state!r}")
        _check_int("partition", where[1])
        _check_int("partition epoch", state[0])
        checked[(where[0], where[1])] = (state[0], tuple(state[1]))
    return checked


def _entry(data: bytes, offset: int, start: int) -> _Entry:
    header = RecordHeader._make(RECORD_HEADER.unpack_from(data, offset))
    at = offset + RECORD_HEADER_SIZE
    topic = data[at:at + header.topic_size].decode("utf-8", "replace")
    at += header.topic_size + header.key_size
    tags = data[at:at + header.tags_size].decode("utf-8", "replace")
    at += header.tags_size + header.properties_size
    return _Entry(start, start + header.size, header.control, topic, tags,
                  bytes(data[at:at + header.body_size]))
