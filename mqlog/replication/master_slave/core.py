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
node's config (``hard_state=`` here). A master that starts over a log it wrote before
takes no writes until ``in_sync_slaves_min`` of its slaves (one, for an ASYNC_MASTER)
said Hello in its epoch or older: while it was down another node may have been promoted,
and its slaves, now following that one, never talk to it. An operator can vouch for it
with ``promote`` (a new epoch). A message from a higher epoch fences a master: another
node was promoted.

Group identity. Only members are heard: a master hears Hello and Report from its slaves,
a slave Append, Truncate and LogReset from its master, and only with this config's
``cluster_id``. Anything else is dropped and counted (``status()["ignored"]``): a stray
node's higher epoch fences no one.

Retention. A slave whose log ends before the master's log start (records retention let
go) cannot be sent them: the master sends ``LogReset``, the slave starts its log over,
empty, at the master's log start (``Store.reset``) and says Hello from there.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass
from typing import Any

from mqlog.config import ReplicationConfig
from mqlog.errors import InvalidArgument, NotMaster
from mqlog.replication.core import LogView, Ready, epoch_ending_at
from mqlog.replication.hardstate import RoleState
from mqlog.replication.messages import Append, Hello, LogReset, Message, Report, Truncate
from mqlog.results import PutStatus

TEST_BREAKS = ("ack_early", "skip_truncate", "ack_on_timeout")


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
class Proposal:
    request_id: Any
    end: int
    deadline_tick: int


class MasterSlaveCore:
    """One node of a master-slave group; see the module docstring."""

    def __init__(self, config: ReplicationConfig, log: LogView, *,
                 hard_state: RoleState | None = None, test_break: str = "") -> None:
        assert test_break in ("", *TEST_BREAKS)
        # test_break: a deliberately broken core, so tests can show the simulator's
        # checkers catch it ("ack_early": a SYNC_MASTER acks before any slave has the
        # write; "skip_truncate": a diverged slave is streamed to as if it agreed;
        # "ack_on_timeout": a SYNC_MASTER answers PUT_OK when its slaves time out).
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
        # A master over a log it wrote before waits to hear from its slaves (see above).
        self._writable = not self.slaves or log.written_position == 0
        self._heard: set[str] = set()
        self.ignored = 0  # messages dropped: another cluster, or not a member
        self._ignored_from: set[str] = set()
        self._waiting: deque[Proposal] = deque()
        self._ready = Ready()
        self._expected_end = log.written_position  # a slave's end, pending appends counted
        self._master_heard_tick = 0
        self._pump_due = True  # an ASYNC_MASTER sends Appends once per tick
        if self.role == "SLAVE":
            self._send_hello()

    @property
    def is_master(self) -> bool:
        return self.role in ("ASYNC_MASTER", "SYNC_MASTER")

    # --- the driver's interface -----------------------------------------------------

    def tick(self) -> None:
        self.tick_count += 1
        self._pump_due = True
        if self.is_master:
            self._expire_proposals()
        elif self.role == "SLAVE":
            self._slave_tick()

    def step(self, message: Message) -> None:
        if not self._admits(message):
            return
        if message.epoch > self.epoch:
            self._see_epoch(message.epoch)
        if self.is_master and isinstance(message, Hello | Report):
            progress = self.slaves[message.src]
            progress.heard_tick = self.tick_count
            self._heard_from(message.src)
            if isinstance(message, Hello):
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
        if not self._writable:
            raise NotMaster(f"node {self.node_id} is a {self.role} that restarted and takes "
                            f"no writes until it has heard from its slaves "
                            f"({', '.join(self.slaves)}): another node may have been promoted "
                            "while it was down. Retry soon; if its slaves are gone for good, "
                            "an operator can vouch for it with `mqlog cluster promote`")

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
        return self.role == "SLAVE" or (self.is_master and not self._writable)

    def propose(self, request_id: Any, end: int) -> None:
        """A write ending at ``end`` was stored; resolve it by the role's rule."""
        self.check_master()
        if self.role == "ASYNC_MASTER" or self._test_break == "ack_early":
            self._ready.resolved.append((request_id, PutStatus.PUT_OK))
        elif len(self._in_sync()) < self.config.in_sync_slaves_min:
            self._ready.resolved.append((request_id, PutStatus.SLAVE_NOT_AVAILABLE))
        else:
            self._waiting.append(Proposal(request_id, end,
                                          self.tick_count + self.config.sync_timeout_ticks))
            self._resolve_acked()

    def ready(self) -> Ready:
        """What to do now. A master builds its Appends here, not on each proposal or
        ack, so writes that arrived together travel together: a SYNC_MASTER at once (its
        writers wait), an ASYNC_MASTER once per tick (nobody waits; one Append then
        carries a tick's worth of records, which costs the slaves far less)."""
        if self.role == "SYNC_MASTER" or (self.is_master and self._pump_due):
            self._pump()
            self._pump_due = False
        return self._ready

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
        self.epoch = max(self.epoch + 1, epoch)
        self._writable = True
        self._drop_pending_log_changes()
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
        for proposal in self._waiting:
            self._ready.resolved.append((proposal.request_id, PutStatus.FLUSH_SLAVE_TIMEOUT))
        self._waiting.clear()
        self.config = self.config.replace(role="SLAVE", master=master, slaves=())
        self.role, self.slaves = "SLAVE", {}
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
                "accepts_writes": self.is_master and self._writable, "ignored": self.ignored,
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

    def _in_sync(self) -> list[SlaveProgress]:
        written = self.log.written_position
        return [progress for progress in self.slaves.values()
                if progress.matched and self._heard_lately(progress)
                and written - progress.acked <= self.config.slave_gap_bytes_max]

    def _heard_lately(self, progress: SlaveProgress) -> bool:
        return self.tick_count - progress.heard_tick <= self.config.slave_timeout_ticks

    def _resolve_acked(self) -> None:
        acks = sorted((progress.acked for progress in self._in_sync()), reverse=True)
        if len(acks) < self.config.in_sync_slaves_min:
            return
        replicated = acks[self.config.in_sync_slaves_min - 1]
        while self._waiting and self._waiting[0].end <= replicated:
            self._ready.resolved.append((self._waiting.popleft().request_id,
                                         PutStatus.PUT_OK))

    def _expire_proposals(self) -> None:
        while self._waiting and self._waiting[0].deadline_tick <= self.tick_count:
            self._ready.resolved.append((self._waiting.popleft().request_id,
                                         PutStatus.PUT_OK if self._test_break ==
                                         "ack_on_timeout" else PutStatus.FLUSH_SLAVE_TIMEOUT))

    def _pump(self) -> None:
        """Send each matched slave what it lacks, within the in-flight window."""
        config, written = self.config, self.log.written_position
        for name, progress in self.slaves.items():
            if not progress.matched or not self._heard_lately(progress):
                continue
            if progress.sent < self.log.first_segment_base():  # retention ran meanwhile
                self._reset(name, progress)
                continue
            if self.tick_count - progress.progress_tick >= config.retransmit_ticks and \
                    progress.sent > progress.written:
                progress.sent = progress.written  # lost in flight: resend from the ack
                progress.progress_tick = self.tick_count
            while progress.sent < written and \
                    progress.sent - progress.written < config.inflight_bytes_max:
                data = self.log.read_raw(progress.sent, config.append_bytes_max)
                if not data:
                    break
                self._send(Append(self.node_id, name, self.epoch, progress.sent, data))
                progress.sent += len(data)

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

    def _see_epoch(self, epoch: int) -> None:
        if self.is_master:
            self._ready.events.append(f"{self.node_id} fenced: epoch {epoch} is newer than "
                                      f"its {self.epoch}; another node was promoted")
            for proposal in self._waiting:
                self._ready.resolved.append((proposal.request_id,
                                             PutStatus.FLUSH_SLAVE_TIMEOUT))
            self._waiting.clear()
            self.role = "FENCED"
        self.epoch = epoch

    def _admits(self, message: Message) -> bool:
        """Only members are heard (see the module docstring); the rest is counted."""
        if message.cluster_id != self.config.cluster_id:
            why = f"another cluster ({message.cluster_id!r})"
        elif self.is_master and isinstance(message, Hello | Report):
            if message.src in self.slaves:
                return True
            why = "a node that is not its slave"
        elif self.role == "SLAVE" and isinstance(message, Append | Truncate | LogReset):
            if message.src == self.config.master:
                return True
            why = "a node that is not its master"
        else:
            why = f"a node, as a {self.role}"
        self.ignored += 1
        if message.src not in self._ignored_from:  # one event per sender, not a flood
            self._ignored_from.add(message.src)
            self._ready.events.append(f"{self.node_id} ignores {message.kind} (epoch "
                                      f"{message.epoch}) from {message.src}: {why}")
        return False

    def _heard_from(self, slave: str) -> None:
        """A master waiting after a restart takes writes once enough slaves spoke."""
        if self._writable:
            return
        self._heard.add(slave)
        needed = min(len(self.slaves), max(1, self.config.in_sync_slaves_min))
        if len(self._heard) >= needed:
            self._writable = True
            self._ready.events.append(f"{self.node_id} heard from {sorted(self._heard)} in "
                                      f"epoch {self.epoch}: it takes writes")

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

    def _stamp(self, message: Message) -> Message:
        cluster_id = self.config.cluster_id
        return dataclasses.replace(message, cluster_id=cluster_id) if cluster_id else message


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
