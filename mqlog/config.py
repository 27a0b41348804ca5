"""Frozen, validated configuration (DESIGN §7: every limit is a named value, units last).

``StoreConfig`` holds everything one store needs. ``StoreConfig.validate()`` checks the
values together and raises ``ConfigError`` naming the field and what to do; ``load``
reads a TOML file (the ``[store]`` table). Anything that must stay the same for a store's
lifetime (the record format) is not configuration; segment and consume-queue file sizes
are read back from the files, so changing them only affects files created afterwards.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mqlog import format as fmt
from mqlog.errors import ConfigError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

RECORD_HEADER_SIZE = fmt.RECORD_HEADER_SIZE  # docs/FORMAT.md (a test checks the cores)
BLANK_SIZE_MIN = 8
PAGE_SIZE = 4096

FlushMode = Literal["async", "sync"]
CommitMode = Literal["auto", "written", "flushed", "external"]


@dataclass(frozen=True)
class StoreConfig:
    # --- commit log ---------------------------------------------------------------
    segment_size_bytes: int = 1 * GiB
    # Segments are sparse files backed with blocks in steps just ahead of the writer
    # (files.py): a store costs what it holds, and a full disk is a DiskFull, not a SIGBUS.
    segment_allocate_step_bytes: int = 1 * MiB
    # A background thread backs and maps pages ahead of the writer, as far as it writes
    # in 100 ms and at most this far (segment_preallocate=False: only the step it needs).
    segment_prepare_ahead_bytes_max: int = 64 * MiB
    segment_preallocate: bool = True  # back and map pages ahead on a background thread
    # Nothing backs blocks ahead of need (segments, key-index steps) once fewer bytes than
    # this would stay free: the room a full disk gives back goes to writes and close().
    disk_headroom_bytes: int = 4 * MiB
    segment_prepare_ahead: bool = True  # make the next segment before the writer needs it
    # > 0: after each checkpoint, the log's pages more than this far behind it are
    # dropped from memory (madvise + posix_fadvise DONTNEED: they are synced and stay on
    # disk; a reader that goes back reads them from the disk again), so a store's page
    # cache stays bounded as its log grows and new writes reuse memory that was freed
    # instead of taking memory never used (on a VM that hands freed memory back to its
    # host that costs ~7x the CPU: docs/BENCHMARKS.md). PostgreSQL does the same with
    # its WAL. 0 (the default, as Kafka and RocketMQ do): the kernel decides.
    page_cache_window_bytes: int = 0
    message_size_bytes_max: int = 4 * MiB  # whole record, header included
    key_size_bytes_max: int = 1 * KiB
    tags_size_bytes_max: int = 255
    topic_length_max: int = 127
    queue_id_max: int = 65_535
    batch_count_max: int = 65_536
    # --- consume queues -----------------------------------------------------------
    consume_queue_entries_per_file: int = 300_000  # RocketMQ's figure: 6,000,000 bytes
    # Written ahead of a queue's end with pwrite: a write fault on a hole of a shared
    # mapping costs milliseconds here, which thousands of queues would pay on every page.
    # A file's first prefill is a page; each later one as large as its entries so far,
    # at most this (a queue of a few entries holds a page)
    consume_queue_prefill_bytes: int = 64 * KiB
    # --- flush --------------------------------------------------------------------
    # "sync": every put returns once durable (group commit); its batches are written
    # with pwrite, not through the mapping (files.py says why). "async": flushed in the
    # background every flush_interval_ms.
    flush_mode: FlushMode = "async"
    flush_interval_ms: int = 500
    flush_pages_min: int = 4  # async: an interval flush waits for this many dirty pages
    flush_thorough_interval_ms: int = 10_000  # async: flush whatever is dirty this often
    flush_sync_timeout_ms: int = 5_000  # sync: past this a put reports FLUSH_DISK_TIMEOUT
    # sync: covered waiters are woken by threads going to sleep (flush.py); when none
    # has gone to sleep for this long (its writers stopped), the flush thread wakes one
    flush_sync_handoff_stall_us: int = 1_000
    checkpoint_interval_ms: int = 1_000
    # The flushed position is saved (file ``flushed``, an fdatasync of its own, on a
    # thread of its own) after log syncs at most this often, so that recovery refuses to
    # cut acknowledged records (checkpoint.py): damage in what was acknowledged in the
    # last interval is cut as a torn tail (and reported). 0: as soon as a sync ends (a
    # second device flush per group commit: 0.89x the durable put_batch rate of 50 ms,
    # docs/BENCHMARKS.md); -1: never (a damaged tail past the last checkpoint is cut).
    flushed_position_save_interval_ms: int = 50
    # False: no flush or maintenance thread; the owner flushes (``flush``) and runs the
    # chores (``run_chores``) itself, on its own clock (a deterministic simulator).
    background_threads: bool = True
    # --- readers ------------------------------------------------------------------
    committed_follows: CommitMode = "auto"  # auto: written (async) or flushed (sync)
    verify_crc_on_read: bool = True
    read_count_max: int = 65_536  # max_count accepted by get()
    read_size_bytes_max: int = 64 * MiB  # max_bytes accepted by get() and read_raw()
    subscription_tags_max: int = 64  # tags one filter expression ("A || B") may name
    pull_scan_count_max: int = 100_000  # entries one filtered pull may examine
    query_count_max: int = 4_096  # max_count accepted by query() and query_by_time()
    # --- key index ----------------------------------------------------------------
    index_slots_per_file: int = 1 << 20  # hash buckets (4 bytes each)
    index_entries_per_file: int = 1 << 22  # keyed records per file (32 bytes each)
    index_key_hash_bits: int = 64  # fewer bits force hash collisions (tests)
    index_allocate_step_bytes: int = 1 * MiB  # entries are backed in steps of this
    index_interval_ms: int = 200  # the indexer follows the committed position this often
    index_batch_count_max: int = 65_536  # records indexed per core call (bounds GIL holds)
    # --- retention (Kafka's log.retention.ms / .bytes; -1 keeps everything) -----------
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1
    retention_check_interval_ms: int = 300_000
    # --- consumer groups ----------------------------------------------------------
    group_name_length_max: int = 255

    def validate(self) -> StoreConfig:
        """Check every value and their combinations; return self so calls chain."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type in ("int",) and (not isinstance(value, int) or isinstance(value, bool)):
                raise ConfigError(f"{field.name} must be an integer, got {value!r}")
            if field.type in ("bool",) and not isinstance(value, bool):
                raise ConfigError(f"{field.name} must be true or false, got {value!r}")
        _require_positive(self, "message_size_bytes_max", "key_size_bytes_max",
                          "tags_size_bytes_max", "topic_length_max", "batch_count_max",
                          "consume_queue_entries_per_file", "flush_interval_ms",
                          "flush_pages_min", "flush_thorough_interval_ms",
                          "flush_sync_timeout_ms", "checkpoint_interval_ms",
                          "read_count_max", "read_size_bytes_max", "subscription_tags_max",
                          "pull_scan_count_max", "query_count_max", "index_slots_per_file",
                          "index_entries_per_file", "index_interval_ms",
                          "index_batch_count_max", "retention_check_interval_ms",
                          "group_name_length_max")
        _require_positive(self, "flush_sync_handoff_stall_us")
        if self.segment_size_bytes % PAGE_SIZE or self.segment_size_bytes < 16 * PAGE_SIZE:
            raise ConfigError(
                f"segment_size_bytes={self.segment_size_bytes} must be a multiple of "
                f"{PAGE_SIZE} and at least {16 * PAGE_SIZE}")
        if self.segment_size_bytes > (1 << 32) - PAGE_SIZE:
            raise ConfigError("segment_size_bytes must stay below 4 GiB (record sizes are u32)")
        if self.message_size_bytes_max + BLANK_SIZE_MIN > self.segment_size_bytes:
            raise ConfigError(
                f"message_size_bytes_max={self.message_size_bytes_max} must leave room for "
                f"a blank record in a segment of {self.segment_size_bytes} bytes; "
                "raise segment_size_bytes or lower message_size_bytes_max")
        if self.message_size_bytes_max < RECORD_HEADER_SIZE + 1:
            raise ConfigError(
                f"message_size_bytes_max must exceed the {RECORD_HEADER_SIZE}-byte header")
        for name, cap in (("key_size_bytes_max", 0xFFFF), ("tags_size_bytes_max", 0xFFFF),
                          ("topic_length_max", 255), ("queue_id_max", 0xFFFF_FFFF)):
            if getattr(self, name) > cap:
                raise ConfigError(f"{name} must be at most {cap} (a field of the record header)")
        for name in ("segment_allocate_step_bytes", "index_allocate_step_bytes",
                     "segment_prepare_ahead_bytes_max"):
            value = getattr(self, name)
            if value % PAGE_SIZE or value < (0 if name.endswith("_max") else PAGE_SIZE):
                raise ConfigError(f"{name}={value} must be a multiple of {PAGE_SIZE}"
                                  + ("" if name.endswith("_max") else " and at least that"))
        if self.flushed_position_save_interval_ms < -1:
            raise ConfigError("flushed_position_save_interval_ms must be -1 (never), 0 "
                              "(after every log sync) or a positive interval, got "
                              f"{self.flushed_position_save_interval_ms}")
        if self.page_cache_window_bytes < 0:
            raise ConfigError(f"page_cache_window_bytes must be 0 (keep every page) or "
                              f"more, got {self.page_cache_window_bytes}")
        if self.disk_headroom_bytes < 0:
            raise ConfigError(f"disk_headroom_bytes must be 0 or more, got "
                              f"{self.disk_headroom_bytes}")
        if self.consume_queue_prefill_bytes <= 0 or self.consume_queue_prefill_bytes % PAGE_SIZE:
            raise ConfigError(f"consume_queue_prefill_bytes must be a positive multiple of "
                              f"{PAGE_SIZE}")
        if self.subscription_tags_max > 256:
            raise ConfigError("subscription_tags_max must be at most 256")
        for name in ("index_slots_per_file", "index_entries_per_file"):
            if getattr(self, name) >= 1 << 31:
                raise ConfigError(f"{name} must stay below 2**31 (entries are numbered in u32)")
        if not 1 <= self.index_key_hash_bits <= 64:
            raise ConfigError("index_key_hash_bits must be in 1..64")
        for name in ("retention_ms", "retention_bytes"):
            if getattr(self, name) < -1:
                raise ConfigError(f"{name} must be -1 (keep everything) or at least 0")
        if self.queue_id_max < 0:
            raise ConfigError("queue_id_max must be at least 0")
        if self.flush_mode not in ("async", "sync"):
            raise ConfigError(f"flush_mode must be 'async' or 'sync', got {self.flush_mode!r}")
        if self.committed_follows not in ("auto", "written", "flushed", "external"):
            raise ConfigError("committed_follows must be 'auto', 'written', 'flushed' or "
                              f"'external', got {self.committed_follows!r}")
        return self

    @property
    def commit_rule(self) -> str:
        """What the committed position follows once 'auto' is resolved."""
        if self.committed_follows != "auto":
            return self.committed_follows
        return "flushed" if self.flush_mode == "sync" else "written"

    def replace(self, **overrides: Any) -> StoreConfig:
        """A copy with some fields changed, validated; unknown names are a ConfigError."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            import difflib

            guesses = {name: difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
                       for name in unknown}
            if all(guesses.values()):  # typos: the nearest names say it best
                raise ConfigError("unknown store setting(s) " + ", ".join(
                    f"{name!r} (did you mean {guesses[name][0]!r}?)" for name in unknown))
            raise ConfigError(f"unknown store setting(s) {', '.join(unknown)}; "
                              f"known settings: {', '.join(sorted(known))}")
        return dataclasses.replace(self, **overrides).validate()


Role = Literal["ASYNC_MASTER", "SYNC_MASTER", "SLAVE"]


@dataclass(frozen=True)
class ReplicationConfig:
    """One node's place in a replica group, and the limits of its replication core.

    Time is in ticks (``tick_ms`` each): the cores never read a clock (DESIGN §5).
    """

    layer: Literal["master_slave", "raft", "isr"] = "master_slave"
    cluster_id: str = ""  # the group's name: messages carrying another one are dropped
    node_id: str = "node-1"
    role: Role = "ASYNC_MASTER"
    master: str = ""  # a slave's master
    slaves: tuple[str, ...] = ()  # a master's slaves
    in_sync_slaves_min: int = 1  # SYNC_MASTER: slaves that must have a record to ack it
    slave_ack: Literal["written", "flushed"] = "written"  # what a slave's ack counts
    tick_ms: int = 10
    heartbeat_ticks: int = 10  # a slave reports at least this often
    slave_timeout_ticks: int = 300  # a slave not heard from for this long is down
    sync_timeout_ticks: int = 300  # SYNC_MASTER: past this, FLUSH_SLAVE_TIMEOUT (3 s)
    retransmit_ticks: int = 20  # resend from the last ack when a slave makes no progress
    append_bytes_max: int = 1 * MiB  # log bytes per Append message
    inflight_bytes_max: int = 8 * MiB  # sent but unacknowledged, per slave
    slave_gap_bytes_max: int = 256 * MiB  # a slave further behind is not in sync
    # A master that restarts over its log first learns from its slaves where their logs
    # end and catches up from the one ahead (docs/REPLICATION.md). 0: it waits for the
    # slaves it needs as long as it takes (no acknowledged write lost); N: after N ticks
    # it serves with those it heard, and reports what the others alone may hold as lost.
    restart_unclean_after_ticks: int = 0
    frame_size_bytes_max: int = 16 * MiB
    # Bytes queued toward one peer that is slow to read; past this, messages to it are
    # dropped (the cores resend what a peer lacks) instead of growing memory.
    peer_send_bytes_max: int = 32 * MiB
    # A peer's records the store refused (garbage, or a lasting mismatch): the group's core
    # starts over from its store at once the first time, then after 2, 4, 8... ticks while
    # the refusals go on with nothing stored between them, waiting at most this long.
    refused_records_hold_ms_max: int = 5_000
    # Raft (layer = "raft"); heartbeat_ticks, sync_timeout_ticks, retransmit_ticks,
    # append_bytes_max and inflight_bytes_max above apply to it too.
    voters: tuple[str, ...] = ()  # the group's voting members, this node included
    learners: tuple[str, ...] = ()  # members that replicate but neither vote nor count
    election_timeout_ticks: int = 30  # randomized in [this, 2 * this) per election
    pre_vote: bool = True  # ask "would you vote for me?" before raising the term
    check_quorum: bool = True  # a leader that stops hearing a majority steps down
    follower_ack: Literal["flushed", "written"] = "flushed"  # what a follower's ack counts
    idempotence_window_bytes: int = 16 * MiB  # log tail scanned for producer ids
    idempotence_sequences_max: int = 1024  # remembered results per producer id
    # ISR (layer = "isr", Kafka's; mqlog/replication/isr/core.py). sync_timeout_ticks is a
    # produce's deadline there (REQUEST_TIMED_OUT), retransmit_ticks a fetch's backoff.
    replicas: tuple[str, ...] = ()  # the partition's replicas, this node included
    min_insync_replicas: int = 1  # the high watermark advances only with this many in ISR
    replica_lag_time_ms: int = 30_000  # a follower not caught up for this long leaves ISR
    fetch_wait_ms_max: int = 500  # a follower's fetch waits at most this for new records
    fetch_bytes_min: int = 1  # ... or until this many bytes are there to send
    fetch_bytes_max: int = 1 * MiB  # log bytes one fetch answer carries at most
    replica_ack: Literal["written", "flushed"] = "written"  # what a follower's fetch acks
    alter_partition_retry_ms: int = 1_000  # an unanswered AlterPartition is sent again
    # a replica saves its high watermark this often when it moved (and when it closes):
    # Kafka's replica.high.watermark.checkpoint.interval.ms
    high_watermark_save_interval_ms: int = 5_000

    def validate(self) -> ReplicationConfig:
        _require_positive(self, "in_sync_slaves_min", "tick_ms", "heartbeat_ticks",
                          "slave_timeout_ticks", "sync_timeout_ticks", "retransmit_ticks",
                          "append_bytes_max", "inflight_bytes_max", "slave_gap_bytes_max",
                          "frame_size_bytes_max", "peer_send_bytes_max",
                          "refused_records_hold_ms_max")
        if self.layer == "raft":
            return self._validate_raft()
        if self.layer == "isr":
            return self._validate_isr()
        if self.layer != "master_slave":
            raise ConfigError(f"layer must be 'master_slave', 'raft' or 'isr', got "
                              f"{self.layer!r}")
        if self.role not in ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE"):
            raise ConfigError(f"role must be ASYNC_MASTER, SYNC_MASTER or SLAVE, got "
                              f"{self.role!r}")
        if self.role == "SLAVE" and not self.master:
            raise ConfigError("a SLAVE needs `master`, the node id of its master")
        if self.restart_unclean_after_ticks < 0:
            raise ConfigError("restart_unclean_after_ticks must be 0 (wait for the slaves) "
                              f"or a number of ticks, got {self.restart_unclean_after_ticks}")
        if self.role == "SYNC_MASTER" and self.in_sync_slaves_min > len(self.slaves):
            raise ConfigError(f"in_sync_slaves_min={self.in_sync_slaves_min} exceeds the "
                              f"{len(self.slaves)} slaves configured; a SYNC_MASTER would "
                              "never ack")
        if self.append_bytes_max + 4096 > self.frame_size_bytes_max:
            raise ConfigError("append_bytes_max must leave 4 KiB of frame_size_bytes_max for "
                              "the frame header")
        if self.slave_ack not in ("written", "flushed"):
            raise ConfigError(f"slave_ack must be 'written' or 'flushed', got "
                              f"{self.slave_ack!r}")
        return self

    def _validate_raft(self) -> ReplicationConfig:
        _require_positive(self, "election_timeout_ticks", "idempotence_window_bytes",
                          "idempotence_sequences_max")
        if self.node_id not in self.voters + self.learners:
            raise ConfigError(f"node {self.node_id!r} must be one of voters {self.voters} or "
                              f"learners {self.learners}")
        if set(self.voters) & set(self.learners) or len(set(self.voters)) != len(self.voters):
            raise ConfigError("a node is a voter or a learner, once")
        if self.election_timeout_ticks <= self.heartbeat_ticks:
            raise ConfigError(f"election_timeout_ticks={self.election_timeout_ticks} must "
                              f"exceed heartbeat_ticks={self.heartbeat_ticks}, or followers "
                              "campaign against a live leader")
        if self.follower_ack not in ("written", "flushed"):
            raise ConfigError(f"follower_ack must be 'written' or 'flushed', got "
                              f"{self.follower_ack!r}")
        if self.append_bytes_max + 4096 > self.frame_size_bytes_max:
            raise ConfigError("append_bytes_max must leave 4 KiB of frame_size_bytes_max for "
                              "the frame header")
        return self

    def _validate_isr(self) -> ReplicationConfig:
        _require_positive(self, "min_insync_replicas", "replica_lag_time_ms",
                          "fetch_wait_ms_max", "fetch_bytes_min", "fetch_bytes_max",
                          "alter_partition_retry_ms", "high_watermark_save_interval_ms",
                          "idempotence_window_bytes",
                          "idempotence_sequences_max")
        if self.node_id not in self.replicas or len(set(self.replicas)) != len(self.replicas):
            raise ConfigError(f"node {self.node_id!r} must be one of the partition's distinct "
                              f"replicas {self.replicas}")
        # (min_insync_replicas above the replicas is allowed, as Kafka allows it: the group
        # is hosted, acks=all is refused NotEnoughReplicas saying why, acks=1 is taken)
        if self.replica_lag_time_ms <= self.fetch_wait_ms_max + self.tick_ms:
            raise ConfigError(f"replica_lag_time_ms={self.replica_lag_time_ms} must exceed "
                              f"fetch_wait_ms_max={self.fetch_wait_ms_max} (plus a tick): an "
                              "idle follower waiting on its fetch would leave the ISR")
        if self.fetch_bytes_max + 4096 > self.frame_size_bytes_max:
            raise ConfigError("fetch_bytes_max must leave 4 KiB of frame_size_bytes_max for "
                              "the frame header")
        if self.replica_ack not in ("written", "flushed"):
            raise ConfigError(f"replica_ack must be 'written' or 'flushed', got "
                              f"{self.replica_ack!r}")
        return self

    def ticks(self, milliseconds: int) -> int:
        """A duration in whole ticks, rounded up (cores count ticks, never read clocks)."""
        return max(1, -(-milliseconds // self.tick_ms))

    def replace(self, **overrides: Any) -> ReplicationConfig:
        return dataclasses.replace(self, **overrides).validate()


def _check_hosted_store(store: StoreConfig, where: str, layer: str | None) -> None:
    """Store settings that a store a broker hosts cannot work with; ``layer``: the
    group's, None for a cluster member's [store] (any layer may be assigned)."""
    if not store.background_threads:
        raise ConfigError(f"{where} background_threads = false: nothing in a broker runs a "
                          "store's flushes, checkpoints and retention in their place (only "
                          "an embedding program can); remove it")
    if store.committed_follows == "external" and layer in ("master_slave", None):
        raise ConfigError(f"{where} committed_follows = 'external' would leave every write "
                          "of a master-slave group unreadable (its readers see what is "
                          "written or flushed; Raft and ISR groups move it themselves); use "
                          "'auto', 'written' or 'flushed'")


def _require_positive(config: Any, *names: str, where: str = "") -> None:
    for name in names:
        if getattr(config, name) <= 0:
            raise ConfigError(f"{where + ' ' if where else ''}{name} must be positive, got "
                              f"{getattr(config, name)}")


def load(path: str | Path) -> StoreConfig:
    """Read a StoreConfig from the ``[store]`` table of a TOML file."""
    try:
        with open(path, "rb") as file:
            document = tomllib.load(file)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from None
    except OSError as error:
        raise ConfigError(f"cannot read config file {path}: {error.strerror}") from None
    unknown = sorted(set(document) - set(_TOP_TABLES))
    if unknown:  # (a [Store] or a bare key would leave every setting at its default)
        raise ConfigError(f"{path}: unknown table(s) or key(s) {', '.join(unknown)} at the "
                          "top: a store's settings go in a [store] table (a node config's "
                          f"tables are {', '.join(_TOP_TABLES)})")
    table = document.get("store", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [store] must be a table")
    return StoreConfig().replace(**table)


# --- node (broker) configs: ``mqlog node --config node.toml`` ------------------------------
#
# A node.toml has a ``[node]`` table (the broker: id, listen, data_dir, peers...), an optional
# ``[store]`` table (every group's store settings) and optional ``[groups.NAME]`` tables (the
# replica groups the broker hosts, each with replication keys and its own ``store`` table).
# Without ``[groups]``, the replication keys of ``[node]`` describe its one group (the
# single-group node of before, whose store is data_dir itself). docs/CLUSTER.md lists the keys.

DEFAULT_GROUP = "default"  # the one group of a config without [groups]
STRAYS_DIRECTORY = "strays"  # a cluster broker's data_dir: stray stores set aside (host.py)
MEMBER_FILE = "cluster-member"  # ... and the mark of its registration (host.py)
DATA_DIR_LOCK_FILE = "broker.lock"  # a broker's data_dir: its lock (broker.py; not "lock",
# which a single-group broker's store, the data_dir itself, holds)
PROCESS_ROLES = ("broker", "controller")


@dataclass(frozen=True)
class GroupSpec:
    """One replica group a broker hosts: its name, its core's configuration, where its
    members (other brokers) listen, and its store. ``replication.node_id`` is the hosting
    broker's id (a broker replaces it with its own when it opens the group)."""

    name: str
    replication: ReplicationConfig
    addresses: dict[str, str] = dataclasses.field(default_factory=dict)  # member -> host:port
    store: StoreConfig = dataclasses.field(default_factory=StoreConfig)
    store_dir: Path | None = None  # None: the broker's data_dir / name
    # (topic, queue_id) this group serves: a client request naming no group goes by these
    partitions: tuple[tuple[str, int], ...] = ()
    slave_read_enable: bool = False
    registry_group: str = ""  # the group's name in route registries ("": name)
    topics: dict[str, int] = dataclasses.field(default_factory=dict)  # registered topics
    group_name_length_max: int = 200  # a directory name, with room for suffixes
    # The topic id of the partition it holds (KIP-516; 0: none, a group of a config): its
    # peer messages and its store directory carry it, so the replicas of a deleted topic
    # and of one created again under its name never take each other's records
    topic_id: int = 0

    @classmethod
    def raft(cls, name: str, voters: dict[str, str], *, learners: dict[str, str] | None = None,
             store: StoreConfig | None = None, partitions: tuple[tuple[str, int], ...] = (),
             topic_id: int = 0, **replication: Any) -> GroupSpec:
        """A Raft group over the brokers in ``voters`` (broker id -> host:port); what the
        controller hands a broker ("host partition P with voters A, B, C")."""
        learners = dict(learners or {})
        config = ReplicationConfig(layer="raft", node_id=next(iter(voters), ""),
                                   voters=tuple(voters), learners=tuple(learners),
                                   **replication)
        return cls(name, config, {**voters, **learners}, store or StoreConfig(),
                   partitions=tuple(partitions), topic_id=topic_id).validate()

    @classmethod
    def isr(cls, name: str, replicas: dict[str, str], *, store: StoreConfig | None = None,
            partitions: tuple[tuple[str, int], ...] = (), topic_id: int = 0,
            **replication: Any) -> GroupSpec:
        """An ISR partition over the brokers in ``replicas`` (broker id -> host:port); its
        leader and ISR come from the controller, later (IsrCore.apply_metadata)."""
        config = ReplicationConfig(layer="isr", node_id=next(iter(replicas), ""),
                                   replicas=tuple(replicas), **replication)
        return cls(name, config, dict(replicas), store or StoreConfig(),
                   partitions=tuple(partitions), topic_id=topic_id).validate()

    @property
    def members(self) -> tuple[str, ...]:
        """Every broker holding a replica of this group, this one included."""
        replication = self.replication
        if replication.layer == "raft":
            return replication.voters + replication.learners
        if replication.layer == "isr":
            return replication.replicas
        names = (replication.node_id, replication.master, *replication.slaves)
        return tuple(name for name in dict.fromkeys(names) if name)

    def for_broker(self, broker_id: str) -> GroupSpec:
        """This spec as broker ``broker_id`` hosts it."""
        return dataclasses.replace(
            self, replication=self.replication.replace(node_id=broker_id)).validate()

    def validate(self) -> GroupSpec:
        name = self.name
        if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or \
                "\0" in name or len(name) > self.group_name_length_max:
            raise ConfigError(f"group name {name!r} must be a non-empty directory name of at "
                              f"most {self.group_name_length_max} characters, without '/'")
        if name in (STRAYS_DIRECTORY, MEMBER_FILE, DATA_DIR_LOCK_FILE):
            raise ConfigError(f"group name {name!r} is taken: a broker keeps its stray "
                              "stores, its registration's mark or its lock by that name in "
                              "its data_dir; name it otherwise")
        self.replication.validate()
        self.store.validate()
        _check_hosted_store(self.store, f"group {self.name!r}: [store]",
                            self.replication.layer)
        if self.store.message_size_bytes_max + _FRAME_HEADER_ROOM > \
                self.replication.frame_size_bytes_max:
            raise ConfigError(f"group {name!r}: [store] message_size_bytes_max="
                              f"{self.store.message_size_bytes_max} must leave 4 KiB of "
                              f"frame_size_bytes_max={self.replication.frame_size_bytes_max} "
                              "([node]): a larger record could be stored and never sent")
        for member, address in self.addresses.items():
            if not isinstance(member, str) or not isinstance(address, str) or \
                    not _is_address(address):
                raise ConfigError(f"group {name!r}: member {member!r} needs an address "
                                  f"host:port, got {address!r}")
        for item in self.partitions:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                    and type(item[1]) is int and item[1] >= 0):
                raise ConfigError(f"group {name!r}: partitions must be [topic, queue_id] "
                                  f"pairs, got {item!r}")
        return self


@dataclass(frozen=True)
class BrokerConfig:
    """One broker process: where it listens, where its groups' stores live, the brokers it
    talks to, and the groups it hosts from the start (more come and go at runtime)."""

    broker_id: str
    listen: str
    data_dir: Path
    peers: dict[str, str] = dataclasses.field(default_factory=dict)  # broker id -> host:port
    cluster_id: str = ""  # a peer connection from another cluster is refused
    process_roles: tuple[str, ...] = ("broker",)  # Kafka's process.roles
    default_group: str = ""  # a request or message naming no group goes here ("": refused)
    groups: tuple[GroupSpec, ...] = ()
    # [store]: the settings of every group it hosts that has none of its own (the groups
    # a controller assigns it, and the default of each [groups.NAME.store])
    store: StoreConfig = dataclasses.field(default_factory=StoreConfig)
    registries: tuple[str, ...] = ()  # route registries ("host:port"), master-slave's
    register_interval_ms: int = 1_000
    frame_size_bytes_max: int = 16 * MiB  # any frame a connection accepts
    # Bytes queued toward one peer broker slow to read; past this its messages are dropped
    # (counted; the cores resend what a peer lacks) instead of growing memory.
    peer_send_bytes_max: int = 32 * MiB
    # A peer is dialed at most once per interval (down, or refusing this broker).
    peer_redial_interval_ms: int = 100
    # Requests of one client connection being handled at once (stored, read, waiting to
    # be answered or for the client to read its answer); past it the broker reads no more
    # of that connection until one is done (Kafka handles one a connection): what a client
    # that never reads can make a broker hold is this many answers.
    client_requests_in_progress_max: int = 256
    # Connections open at once, peers' included (Kafka's max.connections); one accepted
    # past it is closed at once. Capped at run time to half the process's descriptor
    # limit: idle connections that took every descriptor left none for a new segment
    # file, and the broker stopped.
    connections_max: int = 4_096
    groups_max: int = 4_096  # replica groups one broker hosts
    rack: str = ""  # Kafka's broker.rack: registered; "nearest" follower reads match it
    controller: dict[str, Any] = dataclasses.field(default_factory=dict)  # [controller]
    source: str = "<config>"  # where it was read from (errors name it)

    def group_dir(self, spec: GroupSpec) -> Path:
        return spec.store_dir if spec.store_dir is not None else self.data_dir / spec.name

    def validate(self) -> BrokerConfig:
        where = f"{self.source}: [node]"
        if not isinstance(self.broker_id, str) or not self.broker_id:
            raise ConfigError(f"{where} id must be a non-empty string")
        for name, address in ((self.broker_id, self.listen), *self.peers.items()):
            if not isinstance(address, str) or not _is_address(address):
                raise ConfigError(f"{where} the address of {name!r} must be host:port, got "
                                  f"{address!r}")
        if not self.process_roles or not set(self.process_roles) <= set(PROCESS_ROLES):
            raise ConfigError(f"{where} process_roles must be 'broker', 'controller' or "
                              f"'broker,controller', got {','.join(self.process_roles)!r}")
        _require_positive(self, "register_interval_ms", "frame_size_bytes_max",
                          "peer_send_bytes_max", "peer_redial_interval_ms", "groups_max",
                          "client_requests_in_progress_max", "connections_max", where=where)
        if len(self.groups) > self.groups_max:
            raise ConfigError(f"{where} {len(self.groups)} groups exceed groups_max="
                              f"{self.groups_max}")
        names = [spec.name for spec in self.groups]
        if len(set(names)) != len(names):
            raise ConfigError(f"{self.source}: a group name appears twice: {names}")
        if self.default_group and self.default_group not in names:
            raise ConfigError(f"{where} default_group {self.default_group!r} is not one of "
                              f"the groups {names}")
        for spec in self.groups:
            self._check_members(spec)
        if self.controller and "broker" in self.process_roles:  # (assigned partitions)
            _check_hosted_store(self.store, f"{self.source}: [store]", None)
            if len(self.groups) >= self.groups_max:  # (it registers the difference)
                raise ConfigError(f"{where} its {len(self.groups)} [groups.*] fill "
                                  f"groups_max={self.groups_max}: the controller could "
                                  "place no partition here; raise groups_max or host fewer "
                                  "groups from the config file")
            defaults = ReplicationConfig()
            fetch_max = self.controller.get("replica_fetch_max_bytes", defaults.fetch_bytes_max)
            largest = max(self.store.message_size_bytes_max, defaults.append_bytes_max,
                          fetch_max if isinstance(fetch_max, int) else 0)
            if largest + _FRAME_HEADER_ROOM > self.frame_size_bytes_max:
                raise ConfigError(f"{where} frame_size_bytes_max={self.frame_size_bytes_max} "
                                  f"must exceed by 4 KiB the largest message the partitions "
                                  f"assigned here send ({largest} bytes: [store] "
                                  "message_size_bytes_max, or a replication batch)")
        return self

    def _check_members(self, spec: GroupSpec) -> None:
        if spec.replication.node_id != self.broker_id:
            raise ConfigError(f"{self.source}: group {spec.name!r} is this broker's "
                              f"({self.broker_id!r}) replica, not {spec.replication.node_id!r}")
        for member in spec.members:
            if member != self.broker_id and member not in self.peers and \
                    member not in spec.addresses:
                raise ConfigError(f"{self.source}: group {spec.name!r} names {member!r}, "
                                  "which is not in [node.peers]; add its host:port there")

    @classmethod
    def load(cls, path: str | Path) -> BrokerConfig:
        """From a TOML file (see the comment above GroupSpec and docs/CLUSTER.md)."""
        source = str(path)
        try:
            document = tomllib.loads(Path(path).read_text())
        except OSError as error:
            raise ConfigError(f"cannot read node config {source}: {error.strerror}") from None
        except tomllib.TOMLDecodeError as error:
            raise ConfigError(f"{source}: not valid TOML: {error}") from None
        return _broker_from_document(document, source)


def _is_address(address: str) -> bool:
    host, _, port = address.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


# [node] keys of the broker itself, with their kinds (see _check_kinds)
_BROKER_KEYS = {"id": "str", "listen": "str", "data_dir": "str", "peers": "addresses",
                "cluster_id": "str", "process_roles": "roles", "default_group": "str",
                "registries": "strs", "register_interval_ms": "int",
                "frame_size_bytes_max": "int", "peer_send_bytes_max": "int",
                "peer_redial_interval_ms": "int", "groups_max": "int", "rack": "str",
                "client_requests_in_progress_max": "int", "connections_max": "int"}
# keys of a group (in [node] without [groups], else in [groups.NAME]; there [node] holds
# defaults for every group)
_GROUP_KEYS = {"slave_read_enable": "bool", "group": "str", "topics": "counts",
               "partitions": "partitions", "store_dir": "str"}
_TOP_TABLES = ("node", "store", "groups", "controller")
_FRAME_HEADER_ROOM = 4096  # a frame's room for its header beside the log bytes it carries
# Broker keys that are replication keys too: in [node] they are both. A group may name its
# own cluster_id; not its own frame or send limit, which are its broker's connections'.
_SHARED_KEYS = ("cluster_id", "frame_size_bytes_max", "peer_send_bytes_max")
_BROKER_WIDE_KEYS = ("frame_size_bytes_max", "peer_send_bytes_max")


def _replication_kinds() -> dict[str, str]:
    kinds = {}
    for item in dataclasses.fields(ReplicationConfig):
        kind = str(item.type)
        kinds[item.name] = ("strs" if "tuple" in kind else "int" if kind == "int" else
                            "bool" if kind == "bool" else "str")
    del kinds["node_id"]  # it is [node] id
    return kinds


def _unknown(key: str, known: Any, where: str) -> ConfigError:
    import difflib

    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else \
        f"; known keys: {', '.join(sorted(known))}"
    source, _, table = where.rpartition(": ")
    return ConfigError(f"{source + ': ' if source else ''}unknown key {key!r} in {table}{hint}")


_KIND_TEXT = {"str": "a string", "int": "an integer", "bool": "true or false",
              "strs": "a list of strings", "addresses": "a table of id = \"host:port\"",
              "roles": "'broker', 'controller' or 'broker,controller'",
              "counts": "a table of topic = queue count",
              "partitions": "a list of [topic, queue_id] pairs"}


def _kind_ok(kind: str, value: Any) -> bool:
    def is_int(item: Any) -> bool:
        return type(item) is int

    if kind in ("str", "roles"):
        return isinstance(value, str)
    if kind == "int":
        return is_int(value)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "strs":
        return isinstance(value, list) and all(isinstance(item, str) for item in value)
    if kind == "addresses":
        return isinstance(value, dict) and all(isinstance(item, str) for item in value.values())
    if kind == "counts":
        return isinstance(value, dict) and all(is_int(item) for item in value.values())
    return isinstance(value, list) and all(  # partitions
        isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and
        is_int(item[1]) for item in value)


def _check_kinds(table: Any, kinds: dict[str, str], where: str) -> dict[str, Any]:
    """``table`` with every key known and every value of its kind, or a ConfigError."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    for key, value in table.items():
        if key not in kinds:
            raise _unknown(key, kinds, where)
        if not _kind_ok(kinds[key], value):
            raise ConfigError(f"{where} {key} must be {_KIND_TEXT[kinds[key]]}, got {value!r}")
    return dict(table)


def _store_from(table: Any, base: StoreConfig, where: str) -> StoreConfig:
    known = {item.name: "any" for item in dataclasses.fields(StoreConfig)}
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    for key in table:
        if key not in known:
            raise _unknown(key, known, where)
    try:
        return base.replace(**table)
    except ConfigError as error:
        raise ConfigError(f"{where}: {error}") from None


def _broker_from_document(document: dict[str, Any], source: str) -> BrokerConfig:
    """Validate a node.toml as a whole: every table, key and type, then the values."""
    for key in document:
        if key not in _TOP_TABLES:
            raise _unknown(key, dict.fromkeys(_TOP_TABLES), f"{source} (top-level tables)")
    replication_kinds = _replication_kinds()
    grouped = "groups" in document
    node_kinds = {**_BROKER_KEYS, **replication_kinds,
                  **({} if grouped else _GROUP_KEYS)}
    node = _check_kinds(document.get("node", {}), node_kinds, f"{source}: [node]")
    for key in ("id", "listen", "data_dir"):
        if key not in node:
            raise ConfigError(f"{source}: [node] needs {key!r}")
    store = _store_from(document.get("store", {}), StoreConfig(), f"{source}: [store]")
    broker = {key: node.pop(key) for key in list(node) if key in _BROKER_KEYS}
    broker_id = broker.pop("id")
    replication = {key: node.pop(key) for key in list(node) if key in replication_kinds}
    # keys of both the broker and its groups (_SHARED_KEYS): [node]'s value is the
    # broker's and every group's (a group's sizes are checked against the broker's frame)
    defaults = {**replication, **{key: broker[key] for key in _SHARED_KEYS if key in broker}}
    if grouped:
        tables = document["groups"]
        if not isinstance(tables, dict) or not tables:
            raise ConfigError(f"{source}: [groups] must hold at least one [groups.NAME] table")
        specs = tuple(_group_from(name, table, defaults, store, broker_id, source)
                      for name, table in tables.items())
    elif "controller" in document:  # a cluster member hosts what the controller assigns
        _refuse_group_keys(node, replication, source)
        specs = ()
    else:  # the single-group node of before: its store is data_dir itself (or store_dir)
        node.setdefault("store_dir", broker["data_dir"])
        node["group"] = node.get("group", "") or broker_id  # its name in route registries
        specs = (_group_spec(DEFAULT_GROUP, node, defaults, store, broker_id,
                             f"{source}: [node]"),)
        broker.setdefault("default_group", DEFAULT_GROUP)
    roles = tuple(role.strip() for role in broker.pop("process_roles", "broker").split(","))
    peers = dict(broker.get("peers", {}))
    specs = tuple(dataclasses.replace(spec, addresses={
        **({name: peers[name] for name in spec.members if name in peers and name != broker_id}
           if grouped else peers), **spec.addresses}) for spec in specs)
    controller = document.get("controller", {})
    if not isinstance(controller, dict):
        raise ConfigError(f"{source}: [controller] must be a table")
    if "controller" in document:
        _check_controller(controller, source)
    config = BrokerConfig(broker_id, broker.pop("listen"), Path(broker.pop("data_dir")),
                          dict(broker.pop("peers", {})), process_roles=roles, groups=specs,
                          store=store, registries=tuple(broker.pop("registries", ())),
                          controller=controller, source=source, **broker)
    return config.validate()


def _check_controller(table: dict[str, Any], source: str) -> None:
    """The [controller] table as the process will use it, checked now: before, a broker
    read it only once serving, and one whose ``voters`` key was misspelt served alone."""
    from mqlog.replication.controller.config import ControllerConfig  # (it imports this)

    try:
        config = ControllerConfig.from_table(table)
    except (ConfigError, TypeError) as error:
        raise ConfigError(f"{source}: {error}") from None
    if not config.voters:
        raise ConfigError(f"{source}: [controller] needs voters (each controller's id = "
                          "\"host:port\"): without them this process joins no cluster")


def _refuse_group_keys(node: dict[str, Any], replication: dict[str, Any], source: str) -> None:
    """A cluster member's config without [groups] describes no group of its own (before,
    it got a stray ``default`` group whose store was data_dir itself): keys that would
    describe one are a mistake, said, not ignored."""
    stray = sorted({*node, *replication})
    if stray:
        raise ConfigError(f"{source}: [node] {', '.join(stray)} describe the single group of a "
                          "config without [groups], but a cluster member (a [controller] "
                          "table) hosts only the groups the controller assigns it: remove "
                          "them, or put them in a [groups.NAME] table")


def _group_from(name: str, table: Any, defaults: dict[str, Any], store: StoreConfig,
                broker_id: str, source: str) -> GroupSpec:
    where = f"{source}: [groups.{name}]"
    kinds = {**_replication_kinds(), **_GROUP_KEYS, "store": "table"}
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    store_table = table.get("store", {})
    table = _check_kinds({key: value for key, value in table.items() if key != "store"},
                         {key: kind for key, kind in kinds.items() if kind != "table"}, where)
    group_store = _store_from(store_table, store, f"{where}.store")
    for key in _BROKER_WIDE_KEYS:
        if key in table:
            raise ConfigError(f"{where} {key} is a limit of the broker's connections, which "
                              "carry every group's messages: set it in [node]")
    own = {key: table.pop(key) for key in list(table) if key not in _GROUP_KEYS}
    return _group_spec(name, table, {**defaults, **own}, group_store, broker_id, where)


def _group_spec(name: str, group: dict[str, Any], replication: dict[str, Any],
                store: StoreConfig, broker_id: str, where: str) -> GroupSpec:
    fields: dict[str, Any] = {key: tuple(value) if isinstance(value, list) else value
                              for key, value in replication.items()}
    try:
        config = ReplicationConfig(node_id=broker_id, **fields).validate()
        return GroupSpec(
            name, config, store=store,
            store_dir=Path(group["store_dir"]) if "store_dir" in group else None,
            partitions=tuple((topic, queue) for topic, queue in group.get("partitions", ())),
            slave_read_enable=group.get("slave_read_enable", False),
            registry_group=group.get("group", ""), topics=dict(group.get("topics", {}))
        ).validate()
    except ConfigError as error:
        raise ConfigError(f"{where}: {error}") from None
