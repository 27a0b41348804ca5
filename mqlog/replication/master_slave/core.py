"""The master-slave core: RocketMQ HA as a sans-IO state machine, with epochs.

Roles are fixed by configuration (ASYNC_MASTER, SYNC_MASTER, SLAVE); only an operator
changes them (``promote``). The whole store is replicated as bytes at identical
positions (DESIGN §5).

Slave. On start and after every Truncate it sends ``Hello(position, last_epoch)``: where
its log ends and the epoch of the record ending there. Each ``Append`` that starts
exactly at its end is handed to the driver to append (the store checks every record's
CRC and position); once appended — and flushed, when ``slave_ack = "flushed"`` — it
sends ``Report(written, flushed)``. An Append anywhere else is dropped: the master
resends from the last ack after ``retransmit_ticks``. It reports at least every
``heartbeat_ticks``, and re-sends Hello when its master has said nothing for
``slave_timeout_ticks``. It refuses proposals (NotMaster).

Master. A Hello is checked against the master's epochs (Kafka's leader-epoch rule, both
steps of KIP-279): the logs agree up to where the newest epoch both have ends. If the
slave's last epoch is not in the master's log, or the slave holds more than that (it
was a master once, or kept what the master lost), it is told to ``Truncate`` back to
that epoch's end — the master's, or the slave's own if sooner — and says Hello again;
the dropped range is reported as an event. Otherwise the master streams from the
slave's end: Appends of at most ``append_bytes_max``, at most ``inflight_bytes_max``
unacknowledged per slave, and from the last ack again after ``retransmit_ticks``
without progress. Unflushed bytes are sent too, as in RocketMQ. A SYNC_MASTER sends as
soon as it has something; an ASYNC_MASTER once per tick, batching (RocketMQ's HA
service also transfers in rounds). A slave is in sync while it was heard from within
``slave_timeout_ticks`` and is at most ``slave_gap_bytes_max`` behind. A Report counts
only if it is no older than the Hello that matched the slave (a slave stamps its
messages with the newest epoch it has seen, and a Truncate teaches it this master's):
one sent before may describe a log the slave has truncated since, and would ack records
it no longer holds. A slave drops the Reports still pending when it is told to truncate,
and sends nothing about its log until the truncation is carried out.

Proposals. Before a driver stores a write it asks ``may_accept(acks)``: NotMaster on a
node that takes no writes now, SLAVE_NOT_AVAILABLE on a SYNC_MASTER with fewer than
``in_sync_slaves_min`` slaves in sync (Kafka's NotEnoughReplicas: nothing is stored, so
a retry is safe), else PUT_OK. After the engine stored a write ending at ``end``,
``propose(id, end)``: an ASYNC_MASTER resolves it PUT_OK at once; a SYNC_MASTER
resolves it PUT_OK when ``in_sync_slaves_min`` slaves acked ``end`` (SLAVE_NOT_AVAILABLE
if they are not in sync any more) and FLUSH_SLAVE_TIMEOUT after
``sync_timeout_ticks`` — never a silent success.

Failover without two masters. Roles change only by an operator: ``promote`` (a slave
becomes a master in a new epoch) and ``follow`` (a node becomes a slave of another).
Each puts the role, epoch, master and slaves in ``Ready.hard_state`` (a ``RoleState``),
which the driver saves beside the store; on a restart the saved state wins over the
node's config (``hard_state=`` here). A message from a higher epoch fences a master:
another node was promoted. A promoted master answers a message of its old master (an
older epoch: ``promote --force`` beside a live master) with a Report in its own epoch,
as a Raft node answers a stale leader with its term: the old master is fenced at its
next Append instead of taking writes with the slaves left to it until an operator acts.

A master restarts in a new epoch, after catching up (issue 13). It never serves in an
epoch of an earlier life: with async flush (the default) a SYNC_MASTER acknowledges a
write once slaves have it, not once its own disk does, so a power loss may take records
it acknowledged, which slaves still hold; serving on in the same epoch would have it
tell them to truncate acknowledged records, or write new ones at their positions under
the same epoch. So a master over a log it wrote before (a ``Recovery``):

0. takes the next epoch for its messages (stamped in its store only when it serves): a
   slave that adopts it drops what the master's earlier life still has in flight;
1. asks every slave, ``Pull(position, last_epoch, 0)``, where its log ends and whether
   it extends the master's (its record ending at ``position`` has ``last_epoch``: two
   logs that hold a record in the same epoch agree up to it), every ``retransmit_ticks``
   until answered; a slave that answers it is behind, or holds another history, is
   served at once as if it had said Hello (streamed to, or told to truncate);
2. waits for ``n - k + 1`` of its ``n`` slaves (``k = in_sync_slaves_min``; at least
   ``k``): every record it acknowledged is on ``k`` slaves, so any ``n - k + 1`` of them
   hold it. An ASYNC_MASTER promised nothing of its slaves: it waits for all of them for
   ``slave_timeout_ticks`` (to lose the least), then for one;
3. pulls the records it lacks from the answer that extends its log the furthest (the
   newest last epoch, then the longest), ``append_bytes_max`` at a time, from the next
   such slave if that one stops short (a crash); the driver appends them, so the store
   checks every record's CRC and position;
4. then begins a new epoch (``Ready.set_epoch``: durable in the store before the driver
   takes a write) and serves; the slaves that were ahead are served as their answers
   said (those of another history truncated, by epoch).

Until then it answers NotMaster naming what it waits for. ``restart_unclean_after_ticks``
(0: never) lets it stop waiting: it serves with the slaves it heard and reports what only
the others may hold as lost (``restart_report``, an event); an operator's ``promote`` of a
waiting master does the same at once. A fresh store (no record, no epoch, no saved role)
begins epoch 1 at once, so even a master that loses every record keeps an epoch to move
past. Any node answers a Pull: one that does not follow the asker (it was promoted, or
follows the promoted node) answers ``position = -1`` in its own epoch, and a master that
gets such an answer from one of its slaves missed a promotion while it was down: it is
fenced.

Group identity. Only members are heard: a master hears Hello and Report from its slaves,
a slave Append, Truncate and LogReset from its master, and only with this config's
``cluster_id``. Anything else is dropped and counted (``status()["ignored"]``): a stray
node's higher epoch fences no one.

Retention. A slave whose log ends before the master's log start (records retention let
go) cannot be sent them: the master sends ``LogReset``, the slave starts its log over,
empty, at the master's log start (``Store.reset``) and says Hello from there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mqlog.config import ReplicationConfig
from mqlog.errors import InvalidArgument, MqlogError, NotMaster
from mqlog.replication.core import (
    LogView,
    PeerMessages,
    PeerReads,
    Proposals,
    Ready,
    Unsendable,
    epoch_ending_at,
)
from mqlog.replication.hardstate import RoleState
from mqlog.replication.messages import (
    Append,
    Hello,
    LogReset,
    Message,
    Pull,
    Pulled,
    Report,
    Truncate,
)
from mqlog.results import PutStatus

TEST_BREAKS = ("ack_early", "skip_truncate", "ack_on_timeout", "restart_same_epoch")


@dataclass
class SlaveProgress:
    """What a master knows of one slave."""

    matched: bool = False  # its Hello was accepted: Appends may flow
    acked: int = 0  # the position its ack counts up to (written or flushed)
    written: int = 0
    sent: int = 0  # the end of what was sent to it
    heard_tick: int = -(1 << 62)
    progress_tick: int = 0  # last tick its ack moved
    hello_epoch: int = -1  # the epoch of the Hello that matched it: older Reports are stale


@dataclass
class Recovery:
    """A restarted master learning from its slaves before it serves (module docstring)."""

    position: int  # its log's end at the start: every probe asks whether a slave extends it
    last_epoch: int  # the epoch of its record ending there (-1: none)
    needed: int  # answers to wait for (fewer only after restart_unclean_after_ticks)
    started_tick: int
    answers: dict[str, Pulled] = field(default_factory=dict)  # each slave's probe answer
    asked_tick: dict[str, int] = field(default_factory=dict)  # when each was last asked
    source: str = ""  # the slave it pulls from now
    pulled_from: list[str] = field(default_factory=list)  # every slave it pulled from
    exhausted: set[str] = field(default_factory=set)  # slaves with nothing more for it
    pull_epoch: int = -1  # the epoch of its record ending at its end, pulls counted
    unclean: bool = False  # it stopped waiting (restart_unclean_after_ticks)


@dataclass(frozen=True)
class RestartReport:
    """What a restarted master's catch-up did (``core.restart_report``; also an event)."""

    restarted_at: int  # its log's end after the restart
    caught_up_to: int  # its log's end when it began its new epoch
    pulled_from: tuple[str, ...]  # the slaves whose records it took
    heard: tuple[str, ...]  # the slaves that told it where their logs end
    unheard: tuple[str, ...]  # the others
    epoch: int  # the epoch it began
    unclean: bool  # it served without hearing every slave it needed: records acknowledged
    # past ``caught_up_to`` that only ``unheard`` hold are lost (truncated when they return)


class MasterSlaveCore(PeerMessages):
    """One node of a master-slave group; see the module docstring."""

    def __init__(self, config: ReplicationConfig, log: LogView, *,
                 hard_state: RoleState | None = None, test_break: str = "") -> None:
        assert test_break in ("", *TEST_BREAKS)
        # test_break: a deliberately broken core, so tests can show the simulator's
        # checkers catch it ("ack_early": a SYNC_MASTER acks before any slave has the
        # write; "skip_truncate": a diverged slave is streamed to as if it agreed;
        # "ack_on_timeout": a SYNC_MASTER answers PUT_OK when its slaves time out;
        # "restart_same_epoch": a restarted master serves at once, in its old epoch).
        self._test_break = test_break
        self.config = config.validate()
        if hard_state is not None:  # what an operator made of it last wins over the file
            self.config = self.config.replace(role=hard_state.role, master=hard_state.master,
                                              slaves=hard_state.slaves)
        self.log = log
        self.node_id = config.node_id
        self.role: str = self.config.role  # or FENCED, once a newer epoch is seen
        self.epoch = max(log.epoch, hard_state.epoch if hard_state else 0)
        self.tick_count = 0
        self.slaves = {name: SlaveProgress() for name in self.config.slaves}
        self.ignored = 0  # messages dropped: another cluster, or not a member
        self._ignored_from: set[str] = set()
        self._waiting = Proposals()
        self._reads = PeerReads(log, self.node_id, self.config.retransmit_ticks)
        self._ready = Ready()
        # This log's end with the appends still in a Ready: a slave's, or a restarted
        # master's as it pulls.
        self._expected_end = log.written_position
        self._master_heard_tick = 0
        self._pump_due = True  # an ASYNC_MASTER sends Appends once per tick
        self._recovery: Recovery | None = None
        self.restart_report: RestartReport | None = None
        if self.role == "SLAVE":
            self._send_hello()
        elif self.is_master:
            self._start_as_master(fresh=hard_state is None and log.written_position == 0
                                  and log.epoch == 0 and not log.epoch_starts())

    def _start_as_master(self, fresh: bool) -> None:
        """A master never serves in an epoch of an earlier life: its unflushed records
        may be gone, and slaves may hold them. A fresh store (nothing written, no epoch)
        begins epoch 1 at once (so that even a store that loses every record in a power
        loss keeps its epoch); a master with slaves over an older store first catches
        up from them (Recovery), one without slaves begins its next epoch at once."""
        if self._test_break == "restart_same_epoch" and not fresh:
            return
        if fresh or not self.slaves:
            self._begin_epoch()
            return
        position = self.log.written_position
        # Its messages carry the epoch it will begin (stamped in its store only when it
        # serves): a slave that adopts it drops what this master's earlier life still
        # has in flight (an Append arriving after the slave said where its log ends
        # would grow it past what the master learned: seed 3257).
        self.epoch += 1
        self._recovery = Recovery(position, self._epoch_before(position), self._needed(),
                                  self.tick_count, pull_epoch=self._epoch_before(position))
        self._ready.events.append(f"{self.node_id} restarted as {self.role} with its log "
                                  f"ending at {position}: it asks its slaves where theirs "
                                  f"end before it begins epoch {self.epoch}")
        for name in self.slaves:
            self._probe(name)

    @property
    def is_master(self) -> bool:
        return self.role in ("ASYNC_MASTER", "SYNC_MASTER")

    # --- the driver's interface -----------------------------------------------------

    def tick(self) -> None:
        self.tick_count += 1
        self._pump_due = True
        if self.is_master:
            self._expire_proposals()
            if self._recovery is not None:
                self._recovery_tick(self._recovery)
        elif self.role == "SLAVE":
            self._slave_tick()

    def step(self, message: Message) -> None:
        if isinstance(message, Pull):
            return self._on_pull(message)  # (any node answers; a Pull fences no one)
        if self._from_stale_master(message):
            self._tell_epoch(message.src)
            self._ignore(message, f"its master before this node's promotion: told epoch "
                                  f"{self.epoch}")
            return
        if not self._admits(message):
            return
        if message.epoch > self.epoch:
            self._see_epoch(message.epoch)
        if self.is_master and isinstance(message, Hello | Report | Pulled):
            progress = self.slaves[message.src]
            progress.heard_tick = self.tick_count
            if isinstance(message, Pulled):
                self._on_pulled(message)
            elif self._recovery is not None and isinstance(message, Hello):
                self._reprobe(message.src)  # it restarted: what it said before is stale
            elif isinstance(message, Hello):
                self._on_hello(message, progress)
            else:
                self._on_report(message, progress)
        elif self.role == "SLAVE" and isinstance(message, Append | Truncate | LogReset):
            if message.epoch < self.epoch:
                return  # a stale master: its epoch was superseded
            self._master_heard_tick = self.tick_count
            if isinstance(message, Append):
                self._on_append(message)
            elif isinstance(message, Truncate):
                self._on_truncate(message)
            else:
                self._on_log_reset(message)

    def check_master(self) -> None:
        """Raise NotMaster unless this node takes writes (drivers ask before storing)."""
        if not self.is_master:
            raise NotMaster(f"node {self.node_id} is a {self.role.lower()}, not a master; "
                            f"send writes to {self.config.master or 'the master'}")
        if self._recovery is not None:
            waiting = self.waiting_for
            until = f"heard from its slaves ({', '.join(waiting)})" if waiting else \
                "caught up from its slaves"
            raise NotMaster(f"node {self.node_id} is a {self.role} that restarted and takes "
                            f"no writes until it has {until}: they may hold acknowledged "
                            "records it lost, and another node may have been promoted while "
                            "it was down. Retry soon; if its slaves are gone for good, an "
                            "operator can vouch for it with `mqlog cluster promote` (what "
                            "only they hold is then lost)")

    def may_accept(self, acks: str = "replicated") -> PutStatus:
        """Ask before storing a write: NotMaster if this node takes none now;
        SLAVE_NOT_AVAILABLE if it is a SYNC_MASTER with too few slaves in sync for a
        replica-waiting write (answer that, store nothing: a retry is safe); else PUT_OK."""
        self.check_master()
        if acks == "replicated" and self.role == "SYNC_MASTER" and \
                len(self._in_sync()) < self.config.in_sync_slaves_min:
            return PutStatus.SLAVE_NOT_AVAILABLE
        return PutStatus.PUT_OK

    @property
    def promotable(self) -> bool:
        """A slave, or a master that waits to hear from its slaves, can be promoted."""
        return self.role == "SLAVE" or (self.is_master and self._recovery is not None)

    @property
    def waiting_for(self) -> list[str]:
        """The slaves a restarted master still waits for: those not heard yet (any of
        them will do, until it heard enough), then the one it pulls records from."""
        recovery = self._recovery
        if recovery is None:
            return []
        if len(recovery.answers) >= recovery.needed:
            return [recovery.source] if recovery.source else []
        return sorted(set(self.slaves) - set(recovery.answers))

    def propose(self, request_id: Any, end: int) -> None:
        """A write ending at ``end`` was stored; resolve it by the role's rule."""
        self.check_master()
        if self.role == "ASYNC_MASTER" or self._test_break == "ack_early":
            self._ready.resolved.append((request_id, PutStatus.PUT_OK))
        elif len(self._in_sync()) < self.config.in_sync_slaves_min:
            self._ready.resolved.append((request_id, PutStatus.SLAVE_NOT_AVAILABLE))
        else:
            self._waiting.add(request_id, end,
                              self.tick_count + self.config.sync_timeout_ticks)
            self._resolve_acked()

    def ready(self) -> Ready:
        """What to do now. A master builds its Appends here, not on each proposal or
        ack, so writes that arrived together travel together: a SYNC_MASTER at once (its
        writers wait), an ASYNC_MASTER once per tick (nobody waits; one Append then
        carries a tick's worth of records, which costs the slaves far less)."""
        if self._recovery is not None:
            self._advance_recovery(self._recovery)
        if self.role == "SYNC_MASTER" or (self.is_master and self._pump_due):
            self._pump()
            self._pump_due = False
        return self._ready

    def has_ready(self) -> bool:
        """Whether ``ready()`` may return a non-empty Ready: a slave only adds to its
        pending Ready as it ticks and steps, so exactly when that is not empty; a master
        builds its Appends in ready(), so also when its pump would send a slave something
        (``_lacks``) but for a slave whose next record is damaged in this log before its
        retry is due (PeerReads.waiting: a SYNC_MASTER would run every tick and send
        nothing), and a restarted master's recovery always. (A driver may skip a run that
        would find nothing: node.py after a tick. An idle master's run is skipped.)"""
        if self._recovery is not None or self._ready:
            return True
        if not self.is_master or not (self.role == "SYNC_MASTER" or self._pump_due):
            return False
        written, start = self.log.written_position, self.log.first_segment_base()
        return any(self._lacks(progress, written, start) and (
            self._resend_due(progress) or
            not self._reads.waiting(name, progress.sent, self.tick_count))
            for name, progress in self.slaves.items())

    def advance(self, ready: Ready) -> None:
        assert ready is self._ready, "advance() takes the Ready that ready() returned"
        self._ready = Ready()

    def promote(self, role: str = "SYNC_MASTER", slaves: tuple[str, ...] = (),
                epoch: int = 0) -> None:
        """Operator command: this slave (or a master waiting to hear from its slaves,
        which the operator vouches for) becomes a master of ``slaves``, in a new epoch:
        ``epoch`` if given (the operator knows every node's; it must exceed them all, or
        two masters could share one), else one above the newest this node has seen."""
        if role not in ("ASYNC_MASTER", "SYNC_MASTER") or not self.promotable or \
                self.node_id in slaves:
            raise InvalidArgument(f"node {self.node_id} is a {self.role}: only a slave (or a "
                                  "master waiting for its slaves) can be promoted, to "
                                  "ASYNC_MASTER or SYNC_MASTER of other nodes")
        self.config = self.config.replace(role=role, slaves=tuple(slaves), master="")
        self.role = role
        self.slaves = {name: SlaveProgress() for name in slaves}
        self._reads.clear()
        # (a waiting master's epoch is one it has not begun: nobody wrote in it)
        self.epoch = max(self.epoch + (0 if self._recovery else 1), epoch)
        self._drop_pending_log_changes()
        if self._recovery is not None:  # the operator vouches for a waiting master
            self._report_restart(self._recovery, unclean=True)
            self._recovery = None
        self._ready.set_epoch = self.epoch
        self._ready.hard_state = RoleState(role, self.epoch, "", tuple(slaves))
        self._ready.events.append(f"{self.node_id} promoted to {role} in epoch {self.epoch}")

    def follow(self, master: str) -> None:
        """Operator command: this node becomes a slave of ``master`` (after a promotion
        elsewhere) and says Hello; it is truncated if it diverged. Writes waiting here
        resolve FLUSH_SLAVE_TIMEOUT: they are stored, their fate on the new master is
        unknown (an idempotent retry settles it)."""
        if not master or master == self.node_id:
            raise InvalidArgument(f"follow needs another node as master, got {master!r}")
        self._waiting.resolve_all(self._ready.resolved, PutStatus.FLUSH_SLAVE_TIMEOUT)
        self.config = self.config.replace(role="SLAVE", master=master, slaves=())
        if self._recovery is not None:
            self.epoch -= 1  # the epoch it was about to begin: it never did
        self.role, self.slaves, self._recovery = "SLAVE", {}, None
        self._drop_pending_log_changes()
        self._ready.hard_state = RoleState("SLAVE", self.epoch, master, ())
        self._ready.events.append(f"{self.node_id} follows {master} in epoch {self.epoch}")
        self._master_heard_tick = self.tick_count
        self._send_hello()

    def status(self) -> dict[str, Any]:
        """What ``mqlog cluster status`` shows of this node."""
        return {"layer": "master_slave", "role": self.role, "leader": self.config.master
                if self.role == "SLAVE" else (self.node_id if self.is_master else ""),
                "written": self.log.written_position, "flushed": self.log.flushed_position,
                "last_epoch": self._epoch_before(self.log.written_position),
                "accepts_writes": self.is_master and self._recovery is None,
                "recovering": self._recovery is not None, "ignored": self.ignored,
                "slaves": {name: progress.acked for name, progress in self.slaves.items()
                           if progress.matched}}

    # --- master -------------------------------------------------------------------------

    def _on_hello(self, hello: Hello, progress: SlaveProgress) -> None:
        """Kafka's leader-epoch rule: the logs agree up to the end, in this log, of the
        newest epoch both have. If the slave's last epoch is not in this log, or it holds
        more than that, it must cut back (to the smaller of the two ends of that epoch:
        it works out its own) and say Hello again. A log that ends before this log's
        start (retention let those records go) starts over at it."""
        if hello.position < self.log.first_segment_base():
            return self._reset(hello.src, progress)
        shared = self._newest_epoch_up_to(hello.last_epoch)
        agreed = min(self._end_of_epoch(shared), self.log.written_position)
        diverged = hello.position > agreed or (hello.last_epoch >= 0 and
                                               shared != hello.last_epoch)
        if diverged and self._test_break != "skip_truncate":
            progress.matched = False
            self._send(Truncate(self.node_id, hello.src, self.epoch, agreed, shared))
            self._ready.events.append(f"{hello.src} diverged after epoch {shared}: it "
                                      f"keeps at most [.., {agreed}) of [.., {hello.position})")
            return
        progress.matched = True
        progress.hello_epoch = hello.epoch
        progress.sent = progress.written = hello.position
        # A Hello says where the slave's log ends, not what it flushed: with acks that
        # count flushed bytes it counts only once a Report says so.
        progress.acked = hello.position if self.config.slave_ack == "written" else \
            min(progress.acked, hello.position)
        progress.progress_tick = self.tick_count

    def _on_report(self, report: Report, progress: SlaveProgress) -> None:
        """A Report sent before the Hello that matched the slave (in an older epoch: a
        slave told to truncate learns this master's epoch first) may describe a log it
        has truncated since, and would ack records it no longer holds: it counts for
        nothing. Nor does one beyond this log's end."""
        if not progress.matched or report.epoch < progress.hello_epoch or \
                report.written > self.log.written_position:
            return
        acked = report.flushed if self.config.slave_ack == "flushed" else report.written
        if acked > progress.acked:
            progress.progress_tick = self.tick_count
        progress.written, progress.acked = report.written, max(progress.acked, acked)
        self._resolve_acked()

    # --- a restarted master catches up from its slaves ------------------------------------

    def _needed(self) -> int:
        """How many slaves a restarted master must hear from. A SYNC_MASTER acknowledged a
        record once ``k = in_sync_slaves_min`` slaves had it, so any ``n - k + 1`` of its
        ``n`` slaves include one that holds it; and at least ``k`` (as before: a node
        promoted while it was down took writes only with ``k`` slaves of its own). An
        ASYNC_MASTER promised nothing of its slaves: it asks all, to lose the least, and
        after ``slave_timeout_ticks`` goes on with one (``_recovery_tick``)."""
        count = len(self.slaves)
        if self.role == "ASYNC_MASTER":
            return count
        k = min(max(1, self.config.in_sync_slaves_min), count)
        return max(count - k + 1, k)

    def _probe(self, name: str) -> None:
        recovery = self._recovery
        assert recovery is not None
        recovery.asked_tick[name] = self.tick_count
        self._send(Pull(self.node_id, name, self.epoch, recovery.position,
                        recovery.last_epoch, 0))

    def _reprobe(self, name: str) -> None:
        """A slave said Hello while this master recovers: it restarted, and may have lost
        what it told before. Ask again (and pull from someone else meanwhile)."""
        recovery = self._recovery
        assert recovery is not None
        recovery.answers.pop(name, None)
        recovery.exhausted.discard(name)
        self.slaves[name].matched = False
        if recovery.source == name:
            recovery.source = ""
        self._probe(name)

    def _pull(self, recovery: Recovery) -> None:
        recovery.asked_tick[recovery.source] = self.tick_count
        self._send(Pull(self.node_id, recovery.source, self.epoch, self._expected_end,
                        recovery.pull_epoch, self.config.append_bytes_max))

    def _recovery_tick(self, recovery: Recovery) -> None:
        """Ask again, every ``retransmit_ticks``, the source for its records and every
        other slave not yet served for where its log ends (an answer may be lost, a log
        may change in a slave's crash, and a slave that hears nothing from its master
        says Hello, as after a restart); stop waiting after the unclean limit."""
        config = self.config
        for name, progress in self.slaves.items():
            if self.tick_count - recovery.asked_tick.get(name, 0) < config.retransmit_ticks:
                continue
            if name == recovery.source:
                self._pull(recovery)
            elif not progress.matched:
                self._probe(name)
        waited = self.tick_count - recovery.started_tick
        if self.role == "ASYNC_MASTER" and recovery.needed > 1 and \
                waited >= config.slave_timeout_ticks:
            recovery.needed = 1
        limit = config.restart_unclean_after_ticks
        if limit and waited >= limit and \
                len(recovery.answers) < recovery.needed:
            self._ready.events.append(
                f"{self.node_id} stops waiting for {self.waiting_for} after "
                f"restart_unclean_after_ticks={limit}: it serves with what it has")
            recovery.needed, recovery.unclean = len(recovery.answers), True

    def _on_pulled(self, pulled: Pulled) -> None:
        """A slave's answer: where its log ends, whether it extends this one, records."""
        recovery = self._recovery
        if recovery is not None and pulled.position < 0:
            # One of its slaves follows another master: a node was promoted while this
            # one was down (its epoch, if newer, fenced this one already).
            return self._see_epoch(self.epoch, f"{pulled.src} follows another master")
        if recovery is None:
            return  # a late answer
        if pulled.src == recovery.source and pulled.position == self._expected_end and \
                recovery.answers.get(pulled.src) is not None:
            self._take_pulled(pulled, recovery)
        elif pulled.position == recovery.position and pulled.src != recovery.source:
            recovery.answers[pulled.src] = pulled  # (the newest answer wins)
            if not _ahead(pulled):  # nothing to learn from it: serve it as its Hello said
                self._as_hello(pulled)
        self._advance_recovery(recovery)

    def _take_pulled(self, pulled: Pulled, recovery: Recovery) -> None:
        """Append the source's records where this log ends (the driver's append checks
        every record's CRC and position); ask for the next piece at once."""
        if not pulled.payload:
            if not _ahead(pulled):  # nothing more here (it may have restarted since); else
                recovery.exhausted.add(pulled.src)  # a probe's answer, late: no news
                recovery.source = ""
            return
        self._ready.appends.append((pulled.position, pulled.payload))
        self._expected_end += len(pulled.payload)
        recovery.pull_epoch = pulled.payload_epoch
        if pulled.src not in recovery.pulled_from:
            recovery.pulled_from.append(pulled.src)
        if self._expected_end < pulled.end:
            self._pull(recovery)
        else:
            recovery.exhausted.add(pulled.src)
            recovery.source = ""

    def _advance_recovery(self, recovery: Recovery) -> None:
        """Once it heard enough slaves: pull from the one whose log extends this one the
        furthest (the newest last epoch, then the longest: it holds every acknowledged
        record any of them holds), then from the next if that one stops short; then,
        its pulled records in its log, begin a new epoch and serve."""
        if recovery.source or len(recovery.answers) < recovery.needed:
            return
        ahead = [answer for answer in recovery.answers.values() if _ahead(answer)
                 and answer.end > self._expected_end and answer.src not in recovery.exhausted]
        if ahead:
            recovery.source = max(ahead, key=lambda a: (a.last_epoch, a.end, a.src)).src
            self._pull(recovery)
        elif not self._ready.appends and self._expected_end == self.log.written_position:
            self._finish_recovery(recovery)

    def _finish_recovery(self, recovery: Recovery) -> None:
        """Begin a new epoch (stamped in the store before any write is taken), then treat
        the slaves that were ahead as if they said Hello now: they hold at most this log
        now, or records of another history, which they are told to truncate."""
        self._recovery = None
        self._ready.set_epoch = self.epoch
        self._report_restart(recovery, recovery.unclean)
        for answer in recovery.answers.values():
            if _ahead(answer):
                self._as_hello(answer)

    def _report_restart(self, recovery: Recovery, unclean: bool) -> None:
        heard = tuple(sorted(recovery.answers))
        unheard = tuple(sorted(set(self.slaves) - set(heard)))
        report = self.restart_report = RestartReport(
            recovery.position, self._expected_end, tuple(recovery.pulled_from), heard,
            unheard, self.epoch, unclean)
        pulled = f", caught up to {report.caught_up_to} from " \
            f"{', '.join(report.pulled_from)}" if report.pulled_from else ""
        self._ready.events.append(f"{self.node_id} restarted at {report.restarted_at}{pulled}; "
                                  f"heard {list(heard)}; begins epoch {report.epoch}")
        if unclean and unheard:
            self._ready.events.append(
                f"{self.node_id} serves without hearing from {list(unheard)}: records "
                f"acknowledged after position {report.caught_up_to} that only they hold are "
                "lost (they are truncated when they return)")

    def _begin_epoch(self) -> None:
        self.epoch += 1
        self._ready.set_epoch = self.epoch

    def _as_hello(self, answer: Pulled) -> None:
        self._on_hello(Hello(answer.src, self.node_id, answer.epoch, answer.end,
                             answer.last_epoch), self.slaves[answer.src])

    def _end_of_epoch(self, epoch: int) -> int:
        return _end_of_epoch(self.log, epoch)

    def _newest_epoch_up_to(self, epoch: int) -> int:
        """The newest epoch of this log that is not newer than ``epoch`` (-1: none)."""
        found = -1
        for started_epoch, _ in self.log.epoch_starts():
            if started_epoch > epoch:
                break
            found = started_epoch
        return found

    def in_sync_slaves(self) -> tuple[str, ...]:
        """The slaves in sync now (its sync state set, less the master itself)."""
        written = self.log.written_position
        return tuple(name for name, progress in self.slaves.items()
                     if progress.matched and self._heard_lately(progress)
                     and written - progress.acked <= self.config.slave_gap_bytes_max)

    def _in_sync(self) -> list[SlaveProgress]:
        return [self.slaves[name] for name in self.in_sync_slaves()]

    def _heard_lately(self, progress: SlaveProgress) -> bool:
        return self.tick_count - progress.heard_tick <= self.config.slave_timeout_ticks

    def _resolve_acked(self) -> None:
        acks = sorted((progress.acked for progress in self._in_sync()), reverse=True)
        if len(acks) < self.config.in_sync_slaves_min:
            return
        replicated = acks[self.config.in_sync_slaves_min - 1]
        self._waiting.commit(replicated, self._ready.resolved)

    def _expire_proposals(self) -> None:
        self._waiting.expire(self.tick_count, self._ready.resolved,
                             PutStatus.PUT_OK if self._test_break == "ack_on_timeout"
                             else PutStatus.FLUSH_SLAVE_TIMEOUT)

    def _lacks(self, progress: SlaveProgress, written: int, start: int) -> bool:
        """Whether ``_pump`` sends this slave something now (log ``written`` up to there,
        begun at ``start``): a reset, a resend from its ack, or records in the window."""
        return progress.matched and self._heard_lately(progress) and (
            progress.sent < start or self._resend_due(progress) or
            progress.sent < written and
            progress.sent - progress.written < self.config.inflight_bytes_max)

    def _resend_due(self, progress: SlaveProgress) -> bool:
        """Sent past its ack and no ack moved for ``retransmit_ticks``: lost in flight."""
        return self.tick_count - progress.progress_tick >= self.config.retransmit_ticks and \
            progress.sent > progress.written

    def _pump(self) -> None:
        """Send each matched slave what it lacks, within the in-flight window."""
        config, written = self.config, self.log.written_position
        for name, progress in self.slaves.items():
            if not progress.matched or not self._heard_lately(progress):
                continue
            if progress.sent < self.log.first_segment_base():  # retention ran meanwhile
                self._reset(name, progress)
                continue
            if self._resend_due(progress):
                progress.sent = progress.written  # lost in flight: resend from the ack
                progress.progress_tick = self.tick_count
            while progress.sent < written and \
                    progress.sent - progress.written < config.inflight_bytes_max:
                if not self._send_from(name, progress):
                    break

    def _send_from(self, name: str, progress: SlaveProgress) -> bool:
        """One Append from ``progress.sent`` (or a LogReset if retention let those records
        go since ``_pump`` checked); False if none: nothing to send, or this log's copy
        is damaged there (PeerReads: the slave gets nothing)."""
        data = self._reads.read(name, progress.sent, self.config.append_bytes_max,
                                self.tick_count, self._ready.events)
        if data is Unsendable.GONE:
            self._reset(name, progress)
            return False
        if isinstance(data, Unsendable) or not data:
            return False
        self._send(Append(self.node_id, name, self.epoch, progress.sent, data))
        progress.sent += len(data)
        return True

    def _reset(self, name: str, progress: SlaveProgress) -> None:
        """Tell a slave whose log ends before this log's start to start over there."""
        log_start = self.log.first_segment_base()
        epoch, epoch_start = epoch_ending_at(self.log.epoch_starts(), log_start)
        progress.matched = False  # until its Hello from the new start
        self._send(LogReset(self.node_id, name, self.epoch, log_start, epoch, epoch_start,
                            log_start))
        self._ready.events.append(f"{self.node_id} resets {name}'s log to its log start "
                                  f"{log_start}: the records before are gone")

    # --- slave --------------------------------------------------------------------------

    def _slave_tick(self) -> None:
        config = self.config
        if self._ready.truncate_to is not None or self._ready.reset_log is not None:
            return  # the log is about to change: a report or Hello now would describe the
            # old one (under the new epoch), and the Hello after the change is on its way
        if self.tick_count - self._master_heard_tick >= config.slave_timeout_ticks:
            self._master_heard_tick = self.tick_count
            self._send_hello()  # the master may have restarted: start over
        elif self.tick_count % config.heartbeat_ticks == 0:
            self._report_now()

    def _send_hello(self) -> None:
        position = self._expected_end = self.log.written_position
        last_epoch = self.log.epoch_at(position)
        self._send(Hello(self.node_id, self.config.master, self.epoch, position,
                         -1 if last_epoch is None else last_epoch))

    def _on_append(self, append: Append) -> None:
        if append.position != self._expected_end:
            return  # lost, duplicated or reordered: the master resends from the last ack
        assert isinstance(append.payload, bytes)  # (received: decoded from its frame)
        self._ready.appends.append((append.position, append.payload))
        self._expected_end += len(append.payload)
        self._ready.must_sync = self._ready.must_sync or self.config.slave_ack == "flushed"
        flushed = self._expected_end if self.config.slave_ack == "flushed" else \
            self.log.flushed_position
        report = Report(self.node_id, self.config.master, self.epoch, self._expected_end,
                        flushed)
        outbox = self._ready.messages_after_persist  # only the newest ack needs to go
        outbox[:] = [message for message in outbox if not isinstance(message, Report)]
        outbox.append(self._stamp(report))

    def _on_truncate(self, truncate: Truncate) -> None:
        """Cut back to where the master's epoch ``truncate.last_epoch`` ends, or where it
        ends in this log if sooner (then the records after it are of an epoch the
        master never had), and say Hello again."""
        own_end = 0 if truncate.last_epoch < 0 else \
            _end_of_epoch(self.log, truncate.last_epoch)
        target = min(truncate.position, own_end, self._expected_end)
        if target < self._expected_end:
            self._ready.truncate_to = target
            self._ready.appends.clear()
            self._drop_pending_reports()  # they speak of bytes past the cut
            self._ready.events.append(f"{self.node_id} truncated [{target}, "
                                      f"{self._expected_end}) that its master does not have")
            self._expected_end = target
        self._hello_after_truncate(target)

    def _on_log_reset(self, reset: LogReset) -> None:
        """Start the log over, empty, at the master's log start; say Hello from there."""
        ready = self._ready
        ready.start_log_over(reset.position, reset.epoch_starts())
        self._drop_pending_reports()
        ready.events.append(f"{self.node_id} started its log over at {reset.position}, "
                            f"its master {reset.src}'s log start")
        self._expected_end = reset.position
        ready.messages_after_persist[:] = [self._stamp(
            Hello(self.node_id, self.config.master, self.epoch, reset.position,
                  reset.last_epoch))]

    def _on_pull(self, pull: Pull) -> None:
        """Tell whoever asks where this log ends; a restarted master that is this slave's
        own (in its epoch or newer) also gets the records after ``position`` when the
        record ending there has the epoch it named (then this log extends its log: two
        logs agree up to a record both hold in the same epoch). Anyone else gets
        ``position = -1`` and this node's epoch, which fences a master that missed a
        promotion."""
        if pull.cluster_id != self.config.cluster_id:
            self.ignored += 1
            return
        mine = self.role == "SLAVE" and pull.src == self.config.master and \
            pull.epoch >= self.epoch
        if mine:
            self._master_heard_tick = self.tick_count
            self.epoch = pull.epoch
            ready = self._ready
            if ready.truncate_to is not None or ready.reset_log is not None or ready.appends:
                return  # the log is about to change: the master asks again
        log, position = self.log, pull.position if mine else -1
        end = log.written_position
        agrees = mine and log.first_segment_base() <= position <= end and \
            self._epoch_before(position) == pull.last_epoch
        payload = b""
        if agrees and pull.max_bytes > 0 and position < end:
            try:
                payload = log.read_raw(position, min(pull.max_bytes,
                                                     self.config.append_bytes_max))
            except MqlogError:  # not a record boundary here: this log is another history
                agrees = False
        self._send(Pulled(self.node_id, pull.src, self.epoch, position, agrees, end,
                          self._epoch_before(end),
                          self._epoch_before(position + len(payload)) if payload else -1,
                          payload))

    def _hello_after_truncate(self, position: int) -> None:
        epoch = self._epoch_before(position)
        self._ready.messages_after_persist.append(self._stamp(
            Hello(self.node_id, self.config.master, self.epoch, position, epoch)))

    def _epoch_before(self, position: int) -> int:
        found = self.log.epoch_at(position)
        return -1 if found is None else found

    def _report_now(self) -> None:
        """A heartbeat: what is in the log now (appends still in a Ready do not count)."""
        self._send(Report(self.node_id, self.config.master, self.epoch,
                          self.log.written_position, self.log.flushed_position))

    # --- both ---------------------------------------------------------------------------

    def _see_epoch(self, epoch: int, why: str = "") -> None:
        if self.is_master:
            why = why or f"epoch {epoch} is newer than its {self.epoch}"
            self._ready.events.append(f"{self.node_id} fenced: {why}; another node was "
                                      "promoted")
            self._waiting.resolve_all(self._ready.resolved, PutStatus.FLUSH_SLAVE_TIMEOUT)
            self.role, self._recovery = "FENCED", None
        self.epoch = epoch

    def _admits(self, message: Message) -> bool:
        """Only members are heard (see the module docstring); the rest is counted."""
        if message.cluster_id != self.config.cluster_id:
            why = f"another cluster ({message.cluster_id!r})"
        elif self.is_master and isinstance(message, Hello | Report | Pulled):
            if message.src in self.slaves:
                return True
            why = "a node that is not its slave"
        elif self.role == "SLAVE" and isinstance(message, Append | Truncate | LogReset):
            if message.src == self.config.master:
                return True
            why = "a node that is not its master"
        else:
            why = f"a node, as a {self.role}"
        return self._ignore(message, why)

    def _from_stale_master(self, message: Message) -> bool:
        """A master's message from a member that was its master before this one was
        promoted (``promote --force`` beside a live master): older epoch, master's kind."""
        return self.is_master and isinstance(message, Append | Truncate | LogReset) and \
            message.src in self.slaves and message.epoch < self.epoch and \
            message.cluster_id == self.config.cluster_id

    def _tell_epoch(self, stale_master: str) -> None:
        """Answer a stale master with this node's epoch, as a Raft node answers a stale
        leader with its term: a Report, which that master hears from a slave of its own,
        and its newer epoch fences it (it took writes that no slave of the new master
        holds, until an operator told it to follow)."""
        self._send(Report(self.node_id, stale_master, self.epoch, self.log.written_position,
                          self.log.flushed_position))

    def _drop_pending_log_changes(self) -> None:
        """A role change drops the appends not yet carried out and the acks of them."""
        self._ready.appends.clear()
        self._drop_pending_reports()
        self._expected_end = self.log.written_position

    def _drop_pending_reports(self) -> None:
        ready = self._ready
        for outbox in (ready.messages, ready.messages_after_persist):
            outbox[:] = [message for message in outbox if not isinstance(message, Report)]

    def _send(self, message: Message) -> None:
        self._ready.messages.append(self._stamp(message))


def _ahead(answer: Pulled) -> bool:
    """Whether a slave's answer says its log extends the master's past where it ended."""
    return answer.agrees and answer.end > answer.position


def _end_of_epoch(log: LogView, epoch: int) -> int:
    """Where ``epoch`` ends in ``log``: the start of its first later epoch, else its end."""
    for started_epoch, start in log.epoch_starts():
        if started_epoch > epoch:
            return start
    return log.written_position


def promotion_risks(candidate: dict[str, Any], others: list[dict[str, Any]]) -> list[str]:
    """Why promoting ``candidate`` could lose acknowledged records or split the brain,
    given the ``status()`` (node metadata) of every other node the operator reached.

    With ``in_sync_slaves_min`` below the slave count, a record is acknowledged once
    *some* slaves have it, so the slave to promote is the most up-to-date one: the
    newest last epoch, then the longest log (Raft's "at least as up-to-date"). A node
    that is ahead would be truncated to the candidate's log when it follows it, and
    what it held beyond is lost. A reachable live master means the old master is not
    down: promoting would make two."""
    risks = []
    mine = (candidate.get("last_epoch", -1), candidate["written"])
    name = candidate["node_id"]
    for other in others:
        if other["node_id"] == name:  # (a node may list itself among its peers)
            continue
        if other["role"] in ("ASYNC_MASTER", "SYNC_MASTER"):
            risks.append(f"{other['node_id']} is a live {other['role']} in epoch "
                         f"{other['epoch']}: promoting {name} would make two masters; stop "
                         f"it (or make it follow) first. --force would let both take "
                         "writes until one is fenced, and lose what the other acknowledged")
            continue
        theirs = (other.get("last_epoch", -1), other["written"])
        if theirs <= mine:
            continue
        if theirs[0] == mine[0]:
            lost = f"[{mine[1]}, {theirs[1]}) ({theirs[1] - mine[1]} bytes)"
        else:
            lost = f"its records of epoch {theirs[0]} and any after [.., {mine[1]})"
        risks.append(f"{name} is behind {other['node_id']}: {name}'s log ends at "
                     f"{mine[1]} (last epoch {mine[0]}), {other['node_id']}'s at {theirs[1]} "
                     f"(last epoch {theirs[0]}); {other['node_id']} holds {lost} that {name} "
                     f"lacks and that may have been acknowledged. --force would lose them: "
                     f"{other['node_id']} is truncated to {name}'s log when it follows")
    return risks
