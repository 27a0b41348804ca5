"""Typed operating errors, shared by every layer of mqlog.

Two kinds of failure exist (DESIGN §7). Programmer errors inside mqlog are ``assert``s.
Operating errors are the exceptions below: each is named by what went wrong and says
who is to blame and what to do. Errors caused by a bad argument also derive from
``ValueError`` (or ``LookupError`` for offsets), so generic handlers keep working.
Raising any of them leaves everything already stored unchanged.
"""

from __future__ import annotations

SHOWN_CHARS_MAX = 80  # a caller's value in an error message: its repr, cut past this


def shown(value: object) -> str:
    """A caller's value as an error message shows it: its repr, a long one cut (a list of
    a thousand bodies passed where an int belongs must not become the message)."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS_MAX else f"{text[:SHOWN_CHARS_MAX - 3]}..."


class MqlogError(Exception):
    """Base of every operating error mqlog raises."""


# --- the caller passed something wrong -------------------------------------------------


class InvalidArgument(MqlogError, ValueError):
    """An argument is of the wrong type or outside its allowed range."""


class InvalidTopic(InvalidArgument):
    """A topic name that cannot be stored (empty, too long, or not a safe file name)."""


class InvalidQueueId(InvalidArgument):
    """A queue id outside ``0 .. queue_id_max``."""


class MessageTooLarge(InvalidArgument):
    """A record (or one of its fields) exceeds a configured size limit."""


class InvalidPosition(InvalidArgument):
    """A commit-log position that is not the start of a record the caller may see."""


class OffsetOutOfRange(MqlogError, LookupError):
    """A queue offset below the queue's minimum or beyond its end (Kafka's error)."""

    def __init__(self, message: str, *, min_offset: int, max_offset: int) -> None:
        super().__init__(message)
        self.min_offset = min_offset
        self.max_offset = max_offset


class StoreChanged(MqlogError):
    """A read planned from one snapshot of a store found records it was to read deleted
    (retention, a truncation, a replica's reset) or replaced since: its rows could mix
    two histories, so it returns none. Plan the read again (load the DataFrame again)."""


class ConfigError(InvalidArgument):
    """A configuration value, or a combination of them, that mqlog cannot run with."""


class CannotListen(ConfigError):
    """A node cannot listen on its ``listen`` address: another process has the port, or
    the host is not one of this machine's addresses. Nothing was served or changed."""


# --- the store's state forbids the call ------------------------------------------------


class StoreClosed(MqlogError):
    """The store was closed; open it again to use it."""


class ClientClosed(MqlogError):
    """A client was used after its ``close()`` (or its ``with`` block): it opens no
    connection again. Make a new client."""


class StoreLocked(MqlogError):
    """Another process (or another Store in this one) has the store open."""


class DataDirLocked(StoreLocked):
    """Another process (or another ``Broker`` in this one) runs a broker with this
    ``data_dir``: it holds the data_dir's lock file (``broker.lock``) for its life. Two
    processes on one data_dir would open the same stores beside each other; this one
    opened nothing. Stop the other first (the message names its pid), or give this one a
    ``data_dir`` of its own (and, in a cluster, an ``id`` of its own)."""


class StoreNotFound(MqlogError, FileNotFoundError):
    """A read-only open found no store at the path."""


class NotAStoreDirectory(InvalidArgument):
    """An open for writing (``mqlog.open``, ``mqlog produce``) was given a directory it
    will not create a store in: one that holds files that are not a store's (the store's
    files would be put among them), or one inside another store (say its
    ``commitlog/``). Nothing was written. Name a new or empty directory, or the store's
    own directory; ``names`` lists the files that are not a store's (empty when the
    directory is inside the store ``inside``)."""

    def __init__(self, message: str, *, names: list[str] | tuple[str, ...] = (),
                 inside: str | None = None) -> None:
        super().__init__(message)
        self.names = list(names)
        self.inside = inside


class StoreReadOnly(MqlogError):
    """The store was opened read-only, or is a replica that refuses direct writes."""


class StoreFailed(MqlogError):
    """An earlier I/O failure fenced the store: nothing more is written until it is reopened.

    After a failed fsync the page cache may have dropped the dirty pages it could not
    write, so continuing could acknowledge writes that are not on disk. Reopening runs
    recovery, which finds out what really is there.
    """


# --- what is on disk (or arrived from a peer) is wrong ---------------------------------


class CorruptRecord(MqlogError):
    """A record failed its size, magic, position or CRC32C check.

    Reopening does not mend it (a clean open scans nothing, and recovery never deletes
    intact records after damage): the message says to run ``mqlog repair``."""

    def __init__(self, position: int, reason: str) -> None:
        super().__init__(
            f"corrupt record at position {position}: {reason}; the commit log is damaged "
            "there and reopening will not mend it: `mqlog verify STORE_DIR` shows the "
            "damage; with the store closed, `mqlog repair STORE_DIR` replaces the damaged "
            "records with blank fillers and reports what was lost, or `mqlog repair "
            "STORE_DIR --from REPLICA_DIR` copies them from a replica"
        )
        self.position = position
        self.reason = reason


class CorruptStore(MqlogError):
    """A store file (checkpoint, metadata, consume queue) is damaged beyond self-repair."""


class ConsumeQueueMismatch(CorruptStore):
    """Consume-queue files disagree with the commit log; recovery rebuilds them from it."""


class ReplicaDataRejected(InvalidArgument):
    """Raw log bytes offered for appending were not a valid continuation of this log."""

    def __init__(self, position: int, reason: str) -> None:
        super().__init__(f"rejected raw log data at position {position}: {reason}")
        self.position = position
        self.reason = reason


# --- durability ------------------------------------------------------------------------


class FlushFailed(MqlogError):
    """Flushing to disk failed; the writes it covered are not known to be durable."""


class RemoteProtocolError(MqlogError):
    """A peer sent bytes that are not a valid mqlog frame or message: drop the connection."""


class NotMaster(MqlogError):
    """This node is not the master of its replica group (a slave, or a fenced master):
    send writes to the master, or promote this node."""


class NotLeader(NotMaster):
    """This Raft node is not its group's leader (or is handing leadership over): send the
    write to ``leader`` (a node id; ``leader_address`` its address, when known), or retry
    soon if no leader is known yet (an election is under way)."""

    def __init__(self, message: str, *, leader: str | None = None,
                 leader_address: str | None = None) -> None:
        super().__init__(message)
        self.leader = leader
        self.leader_address = leader_address


class NotEnoughReplicas(MqlogError):
    """An acks=all write to an ISR partition whose in-sync replicas are fewer than
    ``min_insync_replicas`` (Kafka's NOT_ENOUGH_REPLICAS): nothing was stored, so a retry
    is safe; it succeeds once lagging replicas catch up and rejoin the ISR (or write with
    acks=1, knowing a leader's failure may lose it)."""


class SlaveNotAvailable(NotEnoughReplicas):
    """An acks=all write to a master-slave group (or partition) whose SYNC_MASTER has fewer
    slaves in sync than ``in_sync_slaves_min`` (its answer SLAVE_NOT_AVAILABLE, position
    -1): nothing was stored, so a retry is safe (it succeeds once enough slaves are back
    in sync), or write with acks=1 (the master alone), knowing the master's failure may
    lose it. The master-slave layer's NotEnoughReplicas: ``except NotEnoughReplicas``
    catches both. A client sends such a write again while slaves may be joining (a new
    topic, a promotion), and raises this once it gives up; ClusterClient at once when the
    metadata shows the brokers of the partition's other replicas fenced."""


class NotEnoughReplicasAfterAppend(MqlogError):
    """An acks=all write was stored by the ISR partition's leader, but the ISR shrank below
    ``min_insync_replicas`` before it was committed (Kafka's
    NOT_ENOUGH_REPLICAS_AFTER_APPEND). It may still commit once the ISR grows back: retry
    with the same producer id and sequence, so it is not stored twice."""


class RequestTimedOut(MqlogError):
    """An acks=all write was stored by the ISR partition's leader but not committed within
    the deadline (Kafka's REQUEST_TIMED_OUT, or the leader lost its leadership meanwhile).
    It may still commit: retry with the same producer id and sequence."""


class MembershipChangeRefused(InvalidArgument):
    """A Raft membership change the group cannot take now: more than one voter changed at
    once, a change still uncommitted, or a new voter that is not a caught-up learner."""


class OutOfOrderSequence(InvalidArgument):
    """An idempotent producer's sequence number is older than the ones this node still
    remembers for it, or skips ahead: the producer must start a new producer id."""


class PartiallyStored(OutOfOrderSequence):
    """An idempotent retry found an earlier copy of its request holding only some of its
    records (the copy a new leader had was cut at a record inside the request: the leader
    that had it all failed before it was acknowledged). Those records are stored once;
    the others are not, and this request is not answered as stored: the ``count`` records
    from the first are (the first at ``position`` and queue ``offset``; -1: not said),
    send the rest as a new request (``ClusterClient`` does, and answers the request once
    the rest is stored)."""

    def __init__(self, message: str, count: int = 0, position: int = -1,
                 offset: int = -1) -> None:
        super().__init__(message)
        self.count, self.position, self.offset = count, position, offset


class SequenceGap(OutOfOrderSequence):
    """An idempotent produce said which sequence came before it (``previous``), and the
    leader has not stored that one: nothing was stored. Kafka's OutOfOrderSequence for a
    pipelined producer: send the earlier request first, then this one again (the
    ClusterClient does, keeping its records in order)."""


class ProducerFenced(MqlogError):
    """An idempotent produce came from an older life of its producer id: the leader has
    stored records of the same ``producer_id`` with a higher ``producer_epoch`` (another
    client with that id started later, or this client's clock went back). Nothing was
    stored; every later request of this client is refused the same way (Kafka's
    ProducerFencedException). Stop this client: a producer id is one live client at a
    time; a client created anew gets a newer epoch."""


class PromotionRefused(InvalidArgument):
    """An operator's promotion that could lose acknowledged records or make two masters:
    another reachable node holds records the candidate lacks, or is a live master.
    Promote the node the message names instead, or pass --force knowing what is lost."""


class UnknownGroup(InvalidArgument):
    """The broker hosts no replica group of that name (or none serves that topic and
    queue, and it has no default group): name a group it hosts (``mqlog cluster status``
    or a ``broker_metadata`` request lists them), or ask the broker that hosts it."""


class NodeUnavailable(MqlogError, ConnectionError):
    """A node could not be reached, or the connection to it broke: the request's outcome
    is unknown; retry it (on another node if this one is down)."""


class RequestOutcomeUnknown(NodeUnavailable):
    """A request that is not safe to repeat (``mqlog topics create`` or ``delete``) was
    sent and its answer never came (the connection broke or timed out, or the node said
    itself that the outcome is unknown): it may have been carried out, or may still be,
    so it was not sent again — a copy could be refused for the first's success, or change
    what someone changed meanwhile. Look (``mqlog topics describe NAME``) before sending
    it again."""


class ControllerBusy(NodeUnavailable):
    """The controller leader holds ``requests_waiting_max`` changes waiting for their
    commit and proposed nothing of this one: it is safe to send again, soon."""


class RemoteError(MqlogError):
    """A node reported an error this client does not know by name."""


# --- the machine's limits ----------------------------------------------------------------


class DiskFull(MqlogError):
    """The file system has no room for the blocks a write needs (ENOSPC, EDQUOT).

    Nothing stored is lost and nothing half-written is published: the call that needed
    the room changed nothing. Reads keep working; free space (or delete old segments
    with retention) and retry the write.
    """


class TooManyOpenFiles(MqlogError):
    """The process ran out of file descriptors (EMFILE, ENFILE) or mappings.

    The call that needed one changed nothing and the store stays usable. Raise the limit
    (``ulimit -n``), or use fewer queues (each consume-queue file is one mapping).
    """


# --- the cluster's metadata (the controller) ---------------------------------------------


class InvalidMetadataRecord(MqlogError):
    """Bytes in the controller's log (or from a peer) that are not a metadata record this
    version can read: damaged, or written by a newer mqlog. Nothing was applied; upgrade
    this controller, or restore its directory from a healthy controller's."""


class UnknownTopic(InvalidArgument):
    """The cluster's metadata shows no such topic (Kafka's UnknownTopicOrPartition): create
    it (`mqlog topics create`) or check its name (`mqlog topics list`)."""


class NotABroker(InvalidArgument):
    """Every address a cluster client was given to find brokers at (its bootstrap:
    ``mqlog produce|consume --bootstrap``, ``ClusterClient``) is a controller's (a node
    whose process_roles lack broker): controllers answer no client's metadata, produce
    or fetch. Name brokers there, not the ``[controller]`` voters (``mqlog brokers
    --bootstrap CONTROLLERS`` lists the brokers' addresses). Nothing was sent.
    ``addresses``: the controllers named. Raised too when the addresses are standalone
    nodes (a master-slave or Raft node of docs/REPLICATION.md, a broker without
    ``[controller] voters``: no cluster's broker, it answers no ``cluster_metadata``), or
    such nodes and controllers: ``addresses`` names them all, ``standalone`` those that
    are standalone nodes. Write to a standalone node with ``mqlog.Client`` or
    ``mqlog.GroupClient``; read its store with ``mqlog consume DATA_DIR``."""

    def __init__(self, message: str, *, addresses: list[str] | tuple[str, ...] = (),
                 standalone: list[str] | tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.addresses = list(addresses)
        self.standalone = list(standalone)


class MetadataChangeRefused(InvalidArgument):
    """A metadata change that does not follow from the cluster's current state (an unknown
    broker or topic, a topic that exists, a stale broker or partition epoch): nothing was
    changed. Describe the cluster again (`mqlog topics describe`) and retry from there."""


class DuplicateBrokerRegistration(MetadataChangeRefused):
    """A broker registers an id that another live process holds: a different process life
    (incarnation), at another address, whose session has not ended (Kafka's
    DuplicateBrokerRegistrationException). Two processes with one broker id would fence
    each other in turn. Give each broker its own ``broker_id``; a broker that really
    moved is taken once the old life's session ends (``broker_session_timeout_ms``)."""


class InconsistentClusterId(ConfigError):
    """A broker asked to register with controllers of another cluster: its ``cluster_id``
    is not theirs (Kafka's InconsistentClusterIdException). Asking again cannot help, so
    ``mqlog node`` stops (status 1): give the broker the controllers of its own cluster in
    ``[controller] voters``, or the cluster_id of theirs."""


class StaleAlterPartition(MetadataChangeRefused):
    """An AlterPartition computed from a leader or partition epoch the controller has moved
    past. It may be a retry of a request the controller accepted already (the accepted copy
    is what moved the epoch), so the leader must not read it as "not applied": it keeps the
    ISR it asked for in its high watermark (the maximal ISR) until the newer metadata
    reaches it, then asks again from there (Kafka's INVALID_UPDATE_VERSION)."""
