"""The Store: one directory holding a commit log, its consume queues and checkpoint.

A Store wires three parts together and orchestrates what is rare:

* the log core (``mqlog.ext``: C or its Python twin) holds the mapped files and runs
  the hot paths — put, put_batch, get, the recovery scan;
* the files (``files.py``): the core calls back here when it needs a new segment or a
  new consume-queue file, and the Store creates, maps and later deletes them;
* the flush service (``flush.py``): group commit or interval flushing, checkpoints.

Write path (DESIGN §4): ``put`` is the core's own method when nothing needs to be
waited for (async flush), so an embedded put costs one C call. With sync flush the
Store's ``put`` calls the core, then waits for the group commit that covers the record
and turns a missed deadline into FLUSH_DISK_TIMEOUT.

Committed position: readers never see records past it. Standalone it follows the
written position (async) or the flushed one (sync); a replication layer sets
``committed_follows = "external"`` and moves it itself.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from mqlog import ext
from mqlog.config import (
    MEMBER_FILE,
    PAGE_SIZE,
    RECORD_HEADER_SIZE,
    STRAYS_DIRECTORY,
    StoreConfig,
)
from mqlog.engine import checkpoint as cp
from mqlog.engine import consumequeue as cq
from mqlog.engine import queries
from mqlog.engine.control import control_bytes
from mqlog.engine.files import (
    FILE_EXTENT_BYTES_MIN,
    SYNC_ZERO_WRITE_BYTES,
    ZERO_WRITE_BYTES,
    FileExtent,
    LockFile,
    LockHeld,
    MappedFile,
    SegmentAllocator,
    file_name,
    fsync_directory,
    make_directory,
    numbered_files,
    typed_errors,
)
from mqlog.engine.fileset import FileSet
from mqlog.engine.flush import FlushService
from mqlog.engine.index import KeyIndex
from mqlog.engine.maintenance import Maintenance
from mqlog.engine.offsets import ConsumerOffsets
from mqlog.engine.recovery import RecoveryReport, recover
from mqlog.engine.retention import RetentionReport, plan_log_start
from mqlog.engine.snapshot import open_snapshot
from mqlog.errors import (
    DiskFull,
    FlushFailed,
    InvalidArgument,
    InvalidPosition,
    InvalidQueueId,
    InvalidTopic,
    MessageTooLarge,
    MqlogError,
    NotAStoreDirectory,
    ReplicaDataRejected,
    StoreClosed,
    StoreFailed,
    StoreLocked,
    StoreNotFound,
    StoreReadOnly,
    TooManyOpenFiles,
    shown,
)
from mqlog.ext import libc
from mqlog.results import PullResult, PutResult, PutStatus

_TOPIC_CHARS = re.compile(r"[A-Za-z0-9._%|-]+")  # (fullmatch: "$" let a final newline in)

# Every Store of this process that is open (or opening): a child forked meanwhile closes
# their lock descriptors and marks them unusable (_after_fork_in_child, at the bottom).
_OPEN_STORES: weakref.WeakSet[Store] = weakref.WeakSet()


@dataclass(frozen=True)
class StorePaths:
    root: Path

    @property
    def commitlog(self) -> Path:
        return self.root / "commitlog"

    @property
    def consumequeue(self) -> Path:
        return self.root / "consumequeue"

    @property
    def lock(self) -> Path:
        return self.root / "lock"

    @property
    def abort(self) -> Path:
        return self.root / "abort"

    @property
    def checkpoint(self) -> Path:
        return self.root / "checkpoint"

    @property
    def flushed(self) -> Path:
        return self.root / "flushed"

    @property
    def epochs(self) -> Path:
        return self.root / "epochs"

    @property
    def changes(self) -> Path:
        return self.root / "changes"

    @property
    def meta(self) -> Path:
        return self.root / "meta.json"

    @property
    def queues(self) -> Path:
        return self.root / "queues"

    @property
    def index(self) -> Path:
        return self.root / "index"

    @property
    def consumer_offsets(self) -> Path:
        return self.root / "consumer_offsets"

    def queue_dir(self, topic: str, queue_id: int) -> Path:
        return self.consumequeue / topic / str(queue_id)


# What a directory may hold for a store to be created in it (docs/FORMAT.md, "A store
# directory"): the store's own files (StorePaths; ``repair/`` is mqlog repair's), and
# what mqlog puts there before the store's first open or beside it: a replicated node's
# hard state, an ISR replica's high watermark and a controller-assigned partition's topic
# id (replication/hardstate.py; the topic id is written before the store is created), a
# broker's data_dir lock and, in a cluster broker's data_dir, its registration's mark and
# stray stores (config.py). Each may have a ``.tmp`` twin left by a crash mid-replace; a
# file system's ``lost+found`` is no one's. (The engine imports nothing above it: the
# tests check these names against hardstate.py's.)
STORE_NAMES = frozenset({
    "lock", "abort", "checkpoint", "flushed", "epochs", "changes", "meta.json", "queues",
    "consumer_offsets", "commitlog", "consumequeue", "index", "repair"})
BESIDE_STORE_NAMES = frozenset({
    "raft-state", "master-slave-state", "topic-id", "high-watermark", "broker.lock",
    MEMBER_FILE, STRAYS_DIRECTORY, "lost+found"})


def check_store_directory(root: Path) -> None:
    """Refuse (NotAStoreDirectory) to create or open a store for writing in ``root`` when
    it lies inside another store, or holds files that are neither a store's nor what
    mqlog puts beside one (``STORE_NAMES``, ``BESIDE_STORE_NAMES``), or a ``commitlog/``
    with files but no ``meta.json`` (another system's log: its recovery would cut
    another format's bytes as a torn tail). A missing or empty directory, and a store
    (``meta.json`` beside ``commitlog/``, or an empty ``commitlog/``: its first open cut
    short before ``meta.json``), pass; nothing is written either way."""
    for above in root.resolve().parents:  # (a link into a store is inside it)
        if (above / "meta.json").is_file() and (above / "commitlog").is_dir():
            raise NotAStoreDirectory(
                f"{root} lies inside the store {above}: a store cannot hold another store; "
                f"name a directory outside {above} (or {above} itself, to open that store)",
                inside=str(above))
    if not root.is_dir():
        return
    commitlog = root / "commitlog"
    if commitlog.is_dir():
        if (root / "meta.json").is_file() or not any(commitlog.iterdir()):
            return
        raise NotAStoreDirectory(
            f"{root} holds a commitlog/ with files but no meta.json: not an mqlog store "
            "(another system's log?), and opening it would cut its files as a torn tail; "
            "name a new or empty directory. (If it is an mqlog store whose meta.json was "
            "lost, put back meta.json from a replica of it first.)", names=["commitlog"])
    known = STORE_NAMES | BESIDE_STORE_NAMES
    strangers = sorted(name for name in os.listdir(root) if name not in known and not (
        name.endswith(".tmp") and name[:-4] in known))
    if strangers:
        shown_names = ", ".join(strangers[:3]) + (f" and {len(strangers) - 3} more"
                                                  if len(strangers) > 3 else "")
        raise NotAStoreDirectory(
            f"{root} is not an mqlog store and is not empty (it holds {shown_names}): a "
            "store is created only in a new or empty directory, so that its files are "
            "not mixed with others; name a new or empty directory (or the store's own, "
            "if you meant an existing store)", names=strangers)


def open(path: str | os.PathLike[str], config: StoreConfig | None = None, *,  # noqa: A001
         implementation: str | None = None, clock_ms: Any = None, read_only: bool = False,
         **overrides: Any) -> Store:
    """Open (creating if needed) the store in directory ``path``.

    A store is created in a new or empty directory only (or one holding no more than
    what mqlog puts beside a store: a node's hard state, a partition's topic id); any
    other directory, or one inside a store, is refused with NotAStoreDirectory.

    ``config`` defaults to ``StoreConfig()``; keyword ``overrides`` replace single fields
    (``mqlog.open("data", flush_mode="sync")``). ``implementation`` picks the core
    ("cython" or "python"; default: the live one, see ``mqlog.IMPLEMENTATION``);
    ``clock_ms`` replaces the wall clock for store timestamps (tests). ``read_only``
    opens an existing store as a snapshot, beside a writer if need be (snapshot.py).
    """
    config = (config or StoreConfig()).replace(**overrides) if overrides else \
        (config or StoreConfig()).validate()
    return Store(Path(path), config, implementation=implementation, clock_ms=clock_ms,
                 read_only=read_only)


class Store:
    """An open store. Use it as a context manager, or call ``close()``."""

    def __init__(self, path: Path, config: StoreConfig, *, implementation: str | None = None,
                 clock_ms: Any = None, read_only: bool = False) -> None:
        self.config = config
        self._sync_flush = config.flush_mode == "sync"  # (put_async's one look)
        self.paths = StorePaths(path)
        self.core_module: ModuleType = ext.load(implementation)
        self.implementation: str = self.core_module.IMPLEMENTATION
        self._queues_saved: list[tuple[str, int, int, int]] | None = None
        self._names_unsynced: set[int] = set()  # segments made since commitlog/ was synced
        self._commitlog_fd = -1  # commitlog/, open for _sync_log's fsync (writable stores)
        self._flushed_file: cp.FlushedPosition | None = None  # saved after log syncs
        self._changes: cp.ChangeCount | None = None  # (writable stores)
        self._snapshot_changes: int | None = None  # (read-only ones: the count at open)
        self._retired: list[MappedFile] = []  # deleted by retention, unmapped next pass
        self._write_failure: StoreFailed | None = None  # a batch's pwrite failed (EIO)
        self._clock_ms = clock_ms
        self._closed = False
        self._closed_reason: str | None = None  # (abandon's: what calls raise after it)
        self._owner_pid = os.getpid()
        self._forked_from: int | None = None  # (in a forked child: the parent's pid)
        self.read_only = read_only
        self.recovery_report: RecoveryReport  # what opening found (set by either open)
        self._lock: LockFile | None = None
        _OPEN_STORES.add(self)  # (before the lock: a fork from here on lets the child drop it)
        try:
            if not read_only:
                check_store_directory(path)  # (before the lock file: nothing written)
                self._take_lock()
            self._open_snapshot() if read_only else self._open(clock_ms)
        except BaseException as error:
            _OPEN_STORES.discard(self)
            self._release_files()
            self._release_lock()
            if isinstance(error, DiskFull) and not read_only:
                raise DiskFull(f"cannot open store {path} for writing: {error} (opening "
                               "writes the checkpoint and its companions anew). To read "
                               "it meanwhile, open it with read_only=True") from error
            raise

    def _open_snapshot(self) -> None:
        if not self.paths.meta.is_file():
            raise StoreNotFound(f"{self.paths.root} is not an mqlog store (it has no "
                                "meta.json); check the path")
        cp.check_meta(self.paths.meta)
        self._snapshot_changes = cp.read_changes(self.paths.changes)  # (before any look)
        self.core = self.core_module.LogCore(
            segment_size_bytes=self.config.segment_size_bytes,
            message_size_bytes_max=self.config.message_size_bytes_max,
            key_size_bytes_max=self.config.key_size_bytes_max,
            tags_size_bytes_max=self.config.tags_size_bytes_max,
            batch_count_max=self.config.batch_count_max,
            new_segment=_refuse, new_queue_file=_refuse,
            verify_crc_on_read=self.config.verify_crc_on_read, read_only=True)
        self.files = FileSet(self.paths, self.config, self.core)
        self.core.fence(self._read_only_error())
        self.recovery_report = open_snapshot(self.files)
        self._offsets = ConsumerOffsets(self.paths.consumer_offsets,
                                        self.config.group_name_length_max)

    def _read_only_error(self) -> StoreReadOnly:
        return StoreReadOnly(f"store {self.paths.root} is open read-only; open it without "
                             "read_only=True to write")

    def _check_writable(self) -> None:
        self._check_open()
        if self.read_only:
            raise self._read_only_error()

    def _open(self, clock_ms: Any) -> None:
        config, paths = self.config, self.paths
        make_directory(paths.commitlog)
        self._commitlog_fd = os.open(paths.commitlog, os.O_RDONLY | os.O_DIRECTORY)
        make_directory(paths.consumequeue)
        cp.check_meta(paths.meta)
        # A sync-flush log writes its batches with pwrite, and its pages are mapped in
        # ahead of the writer write-protected: every sync write-protects each page stored
        # into through the mapping again, a TLB flush per page, an interrupt to each core
        # the process runs on (docs/BENCHMARKS.md, sixteenth session). An async log syncs
        # a page once, and stores into pages mapped writable faster than pwrite copies.
        sync = config.flush_mode == "sync"
        warm = libc.MADV_POPULATE_READ if sync else libc.MADV_POPULATE_WRITE
        self._allocator = SegmentAllocator(
            paths.commitlog, config.segment_size_bytes,
            step_bytes=config.segment_allocate_step_bytes,
            ahead_bytes_max=(config.segment_prepare_ahead_bytes_max
                             if config.segment_preallocate else 0),
            warm=warm if config.segment_preallocate else 0,
            next_ahead=config.segment_prepare_ahead,
            headroom_bytes=config.disk_headroom_bytes,
            # (small page-cache folios, so a sync writes back little more than it must)
            zero_write_bytes=SYNC_ZERO_WRITE_BYTES if sync else ZERO_WRITE_BYTES)
        self.core = self.core_module.LogCore(
            segment_size_bytes=config.segment_size_bytes,
            message_size_bytes_max=config.message_size_bytes_max,
            key_size_bytes_max=config.key_size_bytes_max,
            tags_size_bytes_max=config.tags_size_bytes_max,
            batch_count_max=config.batch_count_max,
            new_segment=self._new_segment, new_queue_file=self._new_queue_file,
            clock_ms=clock_ms, verify_crc_on_read=config.verify_crc_on_read,
            prepare_queue=self._prepare_queue, prepare_segment=self._prepare_segment,
            write_segment=self._write_segment, stage_batches=sync)
        self.files = FileSet(paths, config, self.core)
        self._changes = cp.ChangeCount(paths.changes)
        with self._changes.changing():  # (it may cut a torn tail, drop queue entries)
            self.recovery_report = recover(self.files)
        end = self.recovery_report.end_position
        self.key_index = KeyIndex(paths.index, self.core, self.core_module, config)
        index_files = len(numbered_files(paths.index))
        self.key_index.open(self.files.first_segment_base(), end,
                            crashed=not self.recovery_report.clean)
        if self.key_index.resumes_at < self.recovery_report.scanned_from:
            # The scan noted the keyed records it read (the core's last_keyed_end), but
            # not those before it: the indexer reads all of that stretch.
            self.core.last_keyed_end = end
        self.recovery_report.note_index(index_files, self.key_index.file_count)
        self._offsets = ConsumerOffsets(paths.consumer_offsets, config.group_name_length_max)
        self._sync_all_queues()
        self._sync_log(self.first_segment_base(), end)
        self._open_flushed_file(end)
        self._save_epochs()
        self._save_queues(force=True)
        self._write_checkpoint(end, end)
        paths.abort.touch()
        fsync_directory(paths.root)
        rule = config.commit_rule
        self.core.commit_follows_written = rule == "written"
        # Under replication the layer decides what is committed; until it does, nothing.
        self.core.committed_position = 0 if rule == "external" else end
        self._flusher = FlushService(
            config, written=lambda: self.core.written_position, sync_log=self._sync_log,
            checkpoint=self._checkpoint, on_flushed=self._on_flushed,
            on_failure=self._on_flush_failure, flushed_position=end,
            group=self.core_module.GroupCommit)
        self._flusher.start()
        self._maintenance = Maintenance(config, self.key_index,
                                        lambda: self.apply_retention())
        if config.background_threads:
            self._maintenance.start()
        self._allocator.start(end)
        if config.flush_mode == "async":
            self.put = self.core.put  # type: ignore[method-assign]  # one C call
            self.put_batch = self.core.put_batch  # type: ignore[method-assign]

    def _open_flushed_file(self, end: int) -> None:
        """Start the flushed-position file at ``end`` (durable: just synced), or remove
        an old one when saving is off (a truncation would not lower it)."""
        interval = self.config.flushed_position_save_interval_ms
        if interval < 0:
            if self.paths.flushed.exists():
                self.paths.flushed.unlink()
                fsync_directory(self.paths.root)
            return
        self._flushed_file = cp.FlushedPosition(self.paths.flushed, end, interval,
                                                threaded=self.config.background_threads)

    def _take_lock(self) -> None:
        self.paths.root.mkdir(parents=True, exist_ok=True)
        try:
            self._lock = LockFile.take(self.paths.lock)
        except LockHeld as held:
            raise StoreLocked(f"store {self.paths.root} is open in another process (pid "
                              f"{held.holder}) or another Store object; close that one "
                              "first") from None

    # --- the public API ------------------------------------------------------------------

    def put(self, topic: str, body: Any, queue_id: int = 0, key: str | None = None,
            tags: str | None = None, properties: dict | None = None,
            born_timestamp: int | None = None) -> PutResult:
        """Store one record; with sync flush, return once it is durable.

        Returns PutResult(status, position, offset, store_timestamp, size). The status is
        PUT_OK, or FLUSH_DISK_TIMEOUT if the flush did not finish within
        ``flush_sync_timeout_ms`` (the record is stored, but not known to be durable).
        """
        if self._closed:  # (a forked child's copy must not reach the core: see _forked)
            raise self._closed_error()
        result = self.core.put(topic, body, queue_id, key, tags, properties, born_timestamp)
        if not self._flusher.wait_flushed(result.position + result.size):
            return result._replace(status=PutStatus.FLUSH_DISK_TIMEOUT)
        return result

    def put_batch(self, topic: str, bodies: Any, queue_id: int = 0, key: str | None = None,
                  tags: str | None = None, properties: dict | None = None,
                  born_timestamp: int | None = None) -> Any:
        """Store many records in one queue in one call; see ``put``. They share the key,
        tags and properties; ``born_timestamp`` is one for all, or a list of one per
        body (a replay keeps each record's)."""
        if self._closed:
            raise self._closed_error()
        result = self.core.put_batch(topic, bodies, queue_id, key, tags, properties,
                                     born_timestamp)
        if not self._flusher.wait_flushed(result.end_position):
            return result._replace(status=PutStatus.FLUSH_DISK_TIMEOUT)
        return result

    async def put_async(self, topic: str, body: Any, queue_id: int = 0,
                        key: str | None = None, tags: str | None = None,
                        properties: dict | None = None,
                        born_timestamp: int | None = None) -> PutResult:
        """``put`` for asyncio: with sync flush, awaits the group commit instead of blocking."""
        if self._closed:
            raise self._closed_error()
        result = self.core.put(topic, body, queue_id, key, tags, properties, born_timestamp)
        if self._sync_flush:  # (one future awaited, no coroutine of ours: flush.py)
            future = self._flusher.durable_future(result.position + result.size)
            if future is not None and not self._flusher.outcome(await future):
                return result._replace(status=PutStatus.FLUSH_DISK_TIMEOUT)
        return result

    async def put_batch_async(self, topic: str, bodies: Any, queue_id: int = 0,
                              key: str | None = None, tags: str | None = None,
                              properties: dict | None = None,
                              born_timestamp: int | None = None) -> Any:
        """``put_batch`` for asyncio; see ``put_async``."""
        if self._closed:
            raise self._closed_error()
        result = self.core.put_batch(topic, bodies, queue_id, key, tags, properties,
                                     born_timestamp)
        if self.config.flush_mode == "sync" and not await self._flusher.wait_flushed_async(
                result.end_position):
            return result._replace(status=PutStatus.FLUSH_DISK_TIMEOUT)
        return result

    def put_nowait(self, topic: str, bodies: Any, queue_id: int = 0, key: str | None = None,
                   tags: str | None = None, properties: dict | None = None) -> Any:
        """Store records in one queue without waiting for the flush, whatever the flush
        mode: a caller that writes many (a node answering many requests at once) then
        awaits ``flushed_async`` once for the last. One body: a PutResult; a list: a
        BatchPutResult."""
        if self._closed:
            raise self._closed_error()
        if isinstance(bodies, list):
            return self.core.put_batch(topic, bodies, queue_id, key, tags, properties, None)
        return self.core.put(topic, bodies, queue_id, key, tags, properties, None)

    async def flush_async(self) -> int:
        """``flush`` for asyncio: return once everything written when called is durable
        (that position); FlushFailed if the flush does not finish within
        ``flush_sync_timeout_ms``."""
        self._check_writable()
        target = self.core.written_position
        if not await self._flusher.wait_flushed_async(target):
            raise FlushFailed(f"the flush to position {target} did not finish within "
                              f"flush_sync_timeout_ms={self.config.flush_sync_timeout_ms}")
        return target

    async def flushed_async(self, end_position: int) -> bool:
        """With sync flush: wait until the log is durable up to ``end_position``; False
        after ``flush_sync_timeout_ms`` (FLUSH_DISK_TIMEOUT). With async flush: True. A
        read-only store: True, whatever its flush mode (it writes nothing, so nothing of
        it waits for a flush: its ``flushed_position`` is all it shows)."""
        self._check_open()
        if not isinstance(end_position, int) or isinstance(end_position, bool):
            raise InvalidArgument(f"end_position must be an int, got {shown(end_position)}")
        if self.read_only or self.config.flush_mode != "sync":
            return True
        return await self._flusher.wait_flushed_async(end_position)

    def get(self, topic: str, queue_id: int = 0, offset: int = 0, max_count: int = 32,
            max_bytes: int = 1 << 20, tags: str | None = None) -> list:
        """Committed records of one queue from ``offset``, in order.

        Returns at most ``max_count`` records and stops before ``max_bytes`` would be
        exceeded, but always returns the next record if one is visible. An offset below
        the queue's minimum or past its end raises OffsetOutOfRange. ``tags`` filters
        with a subscription expression (``"TagA || TagB"``, ``"*"``); a filtered read
        examines at most ``pull_scan_count_max`` entries, so use ``pull`` to continue.
        A damaged record ends the answer before it (Kafka's fetch): the records before it
        are returned, and the read that starts at it raises CorruptRecord naming its
        position. A record ``mqlog repair`` could not save reads back with ``lost`` true.
        """
        if tags is not None:
            return self.pull(topic, queue_id, offset, max_count, max_bytes, tags).records
        self._check_read(topic, queue_id, offset, max_count, max_bytes)
        return self.core.get(topic, queue_id, offset, max_count, max_bytes)

    def pull(self, topic: str, queue_id: int = 0, offset: int = 0, max_count: int = 32,
             max_bytes: int = 1 << 20, tags: str | None = None) -> PullResult:
        """``get`` for consumers: the records (filtered by ``tags``, as ``get``) and the
        offset to pull from next, which moves past filtered-out records too."""
        self._check_read(topic, queue_id, offset, max_count, max_bytes)
        names = queries.parse_subscription(tags, self.config.subscription_tags_max)
        for name in names or ():
            self.core_module.check_text("a tag of the subscription", name)  # (as put)
        hashes = () if names is None else tuple(self.core_module.tag_hash(name)
                                                for name in names)
        records, next_offset = self.core.pull(topic, queue_id, offset, max_count, max_bytes,
                                              hashes, self.config.pull_scan_count_max)
        if names is not None:
            records = [record for record in records if record.tags in names]
        return PullResult(records, next_offset, self.min_offset(topic, queue_id),
                          self.max_offset(topic, queue_id))

    def _check_read(self, topic: Any, queue_id: Any, offset: Any, max_count: Any,
                    max_bytes: Any) -> None:
        self._check_queue_read(topic, queue_id)
        for name, value in (("max_count", max_count), ("max_bytes", max_bytes)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidArgument(f"{name} must be an int, got {shown(value)}")
        if not 1 <= max_count <= self.config.read_count_max:
            raise InvalidArgument(f"max_count must be in 1..{self.config.read_count_max}")
        if not 1 <= max_bytes <= self.config.read_size_bytes_max:
            raise InvalidArgument(f"max_bytes must be in 1..{self.config.read_size_bytes_max}")
        if not isinstance(offset, int) or isinstance(offset, bool):
            raise InvalidArgument(f"offset must be an int, got {shown(offset)}")

    def query(self, topic: str, key: str, begin_ts: int | None = None,
              end_ts: int | None = None, max_count: int = 64) -> list:
        """Records of ``topic`` whose key is exactly ``key``, newest first, optionally
        only those stored in [begin_ts, end_ts] (milliseconds)."""
        self._check_open()
        if not isinstance(key, str) or not key:
            raise InvalidArgument(f"key must be a non-empty str, got {shown(key)}")
        if not isinstance(topic, str):
            raise InvalidArgument(f"topic must be a str, got {shown(topic)}")
        self.core_module.check_text("topic", topic)  # (as put, read-only stores too)
        self.core_module.check_text("key", key)
        begin = queries.check_timestamp("begin_ts", begin_ts, queries.TIME_MIN)
        end = queries.check_timestamp("end_ts", end_ts, queries.TIME_MAX)
        count = self._check_query_count(max_count)
        if self.read_only:
            return queries.query_by_scan(self.files, topic, key, begin, end, count)
        return queries.query_by_key(self.files, self.key_index, topic, key, begin, end, count)

    def query_by_time(self, topic: str, begin_ts: int, end_ts: int,
                      max_count: int = 64) -> list:
        """Records of ``topic`` stored in [begin_ts, end_ts] (milliseconds), oldest first."""
        self._check_open()
        return queries.query_by_time(
            self.files, topic, queries.check_timestamp("begin_ts", begin_ts, queries.TIME_MIN),
            queries.check_timestamp("end_ts", end_ts, queries.TIME_MAX),
            self._check_query_count(max_count))

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first offset of the queue whose store timestamp is at least
        ``timestamp_ms`` (Kafka's offsetsForTimes); the max offset if none is."""
        self._check_queue_read(topic, queue_id)
        return queries.offset_for_timestamp(self.files, topic, queue_id, timestamp_ms)

    def _check_query_count(self, max_count: Any) -> int:
        if not isinstance(max_count, int) or not 1 <= max_count <= self.config.query_count_max:
            raise InvalidArgument(f"max_count must be in 1..{self.config.query_count_max}")
        return max_count

    # --- consumer groups -------------------------------------------------------------

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Record that ``group`` will next read ``offset`` of the queue; durable on return."""
        self.commit_offsets(group, {(topic, queue_id): offset})

    def commit_offsets(self, group: str, offsets: dict[tuple[str, int], int]) -> None:
        """``commit_offset`` for many queues at once, in one atomic write."""
        self._check_writable()
        if not isinstance(offsets, dict):
            raise InvalidArgument(f"offsets must be a dict {{(topic, queue id): offset}}, "
                                  f"got {type(offsets).__name__}")
        for key in offsets:
            if not isinstance(key, tuple) or len(key) != 2:
                raise InvalidArgument(f"offsets keys must be (topic, queue id), got {key!r}")
            self._check_committed_queue(*key)
        for (topic, queue_id), offset in offsets.items():
            high = self.max_offset(topic, queue_id)
            if not isinstance(offset, int) or isinstance(offset, bool) or \
                    not 0 <= offset <= high:
                raise InvalidArgument(f"cannot commit offset {offset!r} for {topic!r}/"
                                      f"{queue_id}: it must be an int in [0, {high}]")
        self._offsets.commit(group, offsets)

    def committed_offset(self, group: str, topic: str, queue_id: int = 0) -> int | None:
        """The offset ``group`` committed for the queue, or None if it never did."""
        self._check_queue_read(topic, queue_id)
        self._offsets.check_group(group)
        return self._offsets.get(group, topic, queue_id)

    def lag(self, group: str, topic: str | None = None) -> dict[tuple[str, int], int]:
        """Records each queue holds past ``group``'s committed offset: the queues the
        group committed, and every queue of ``topic`` if one is named (an uncommitted
        queue's lag counts from its minimum offset)."""
        self._check_open()
        self._offsets.check_group(group)
        committed = self._offsets.of_group(group)
        wanted = set(committed) | {queue for queue in self.queues() if queue[0] == topic}
        return {(name, queue_id): self.max_offset(name, queue_id) - committed.get(
            (name, queue_id), self.min_offset(name, queue_id)) for name, queue_id in
            sorted(wanted)}

    def groups(self) -> list[str]:
        """Every consumer group that committed an offset."""
        self._check_open()
        return self._offsets.groups()

    # --- retention -------------------------------------------------------------------

    def apply_retention(self, now_ms: int | None = None) -> RetentionReport:
        """Delete the segments retention_ms / retention_bytes let go (see retention.py).

        Runs by itself every ``retention_check_interval_ms``; ``now_ms`` replaces the
        clock (the store's ``clock_ms``, else the wall clock)."""
        self._check_writable()
        if now_ms is not None and (not isinstance(now_ms, int) or isinstance(now_ms, bool)):
            raise InvalidArgument(f"now_ms must be an int (milliseconds) or None, got "
                                  f"{now_ms!r}")
        if now_ms is None:
            now_ms = self._clock_ms() if self._clock_ms is not None else _now_ms()
        return self._trim_to(lambda: plan_log_start(
            self.files, now_ms, min(self.committed_position, self.flushed_position)))

    def trim_front(self, position: int) -> RetentionReport:
        """Delete the segments wholly before ``position``, never past what is committed and
        flushed: a state machine whose snapshot covers the log up to there (the
        controller's) needs nothing before it."""
        self._check_writable()
        if not isinstance(position, int) or isinstance(position, bool) or position < 0:
            raise InvalidArgument(f"position must be a non-negative int, got {position!r}")

        def plan() -> int:
            limit = min(position, self.committed_position, self.flushed_position)
            bases = [base for base in self.core.segment_bases() if base <= limit]
            return max(bases[-1] if bases else 0, self.first_segment_base())
        return self._trim_to(plan)

    def _trim_to(self, plan: Callable[[], int]) -> RetentionReport:
        retired, self._retired = self._retired, []
        for mapped in retired:
            mapped.close()
        with self._flusher.paused(), self.key_index.lock:
            before = self.first_segment_base()
            start = plan()
            if start == before:
                return RetentionReport(before)
            with self._changing():
                dropped, _files = self.core.trim_front(start, self._delete_front)
                self.key_index.trim_front(start)
                self._save_queues(force=True)
                self._save_epochs()
        return RetentionReport(start, dropped, start - before)

    def _delete_front(self, dropped_segments: list[int],
                      dropped_files: list[tuple[str, int, int]]) -> None:
        """Unlink what retention dropped (under the core's write lock); keep the mappings
        until the next pass. Segments go first: a crash between the two leaves queue
        entries of missing records, which opening drops, never records without entries."""
        for base in dropped_segments:
            mapped = self.files.forget_segment(base)
            mapped.path.unlink()
            self._retired.append(mapped)
        for topic, queue_id, base_offset in dropped_files:
            victim = self.files.forget_queue_file(topic, queue_id, base_offset)
            victim.path.unlink()
            self._retired.append(victim)
        fsync_directory(self.paths.commitlog)

    def read_record(self, position: int) -> Any:
        """The committed record that starts at commit-log ``position``."""
        self._check_open()
        return self.core.read_record(position)

    def min_offset(self, topic: str, queue_id: int = 0) -> int:
        """The lowest offset still stored in the queue (0 for a queue never written)."""
        self._check_queue_read(topic, queue_id)
        offsets = self.core.queue_offsets(topic, queue_id)
        return 0 if offsets is None else offsets[0]

    def max_offset(self, topic: str, queue_id: int = 0) -> int:
        """One past the last committed offset: the offset the next visible record gets."""
        self._check_queue_read(topic, queue_id)
        return self.core.committed_end_offset(topic, queue_id)

    def queues(self) -> list[tuple[str, int]]:
        """Every (topic, queue id) with a consume queue, sorted."""
        self._check_open()
        return sorted(self.core.queue_ids())

    def run_chores(self) -> None:
        """What the maintenance thread does every ``index_interval_ms`` (the indexer) now,
        from the caller: for ``background_threads = False`` (retention runs when the
        caller calls ``apply_retention``)."""
        self._check_writable()
        self._maintenance.run_once(retention=False)

    def flush(self) -> None:
        """Make everything written so far durable before returning."""
        self._check_writable()
        self._flusher.flush_now()

    @property
    def maintenance_error(self) -> BaseException | None:
        """What the last pass of the background chores (indexer, retention) failed with,
        if it failed; they keep running and retry (maintenance.py). None when read-only."""
        return None if self.read_only else self._maintenance.error

    @property
    def closed(self) -> bool:
        """True once ``close`` or ``abandon`` was called (and in a process forked while
        the store was open: the store is its parent's)."""
        return self._closed

    @property
    def checkpoint_error(self) -> BaseException | None:
        """Why the last checkpoint could not be written (DiskFull, TooManyOpenFiles), if
        it could not: it is postponed, never fatal (flush.py); None once one succeeds."""
        return None if self.read_only else self._flusher.checkpoint_error

    @property
    def checkpointed_position(self) -> int:
        """The log position the last checkpoint covers: a crash recovers by scanning from
        there. A checkpoint runs every ``checkpoint_interval_ms`` while the log grows."""
        return self.core.committed_position if self.read_only else \
            self._flusher.checkpointed_position

    @property
    def written_position(self) -> int:
        return self.core.written_position

    @property
    def flushed_position(self) -> int:
        return self.core.committed_position if self.read_only else \
            self._flusher.flushed_position

    @property
    def committed_position(self) -> int:
        return self.core.committed_position

    @property
    def flush_count(self) -> int:
        return 0 if self.read_only else self._flusher.flush_count

    # --- what replication needs (DESIGN §4) --------------------------------------------

    def read_raw(self, position: int, max_bytes: int) -> bytes:
        """Raw bytes of whole records from ``position`` up to the written position: as
        many as fit in ``max_bytes`` (at least one), never crossing a segment. Every
        record in the answer is checked (CRC32C included): a damaged one raises
        CorruptRecord naming it, so a read of the records before it stops there
        (``max_bytes`` = its position - ``position``: the record past the answer is not
        read)."""
        self._check_open()
        return self.core.read_raw(position, max_bytes)

    def is_record_start(self, position: int) -> bool:
        """Whether a record (or the log's end) starts at ``position``: its header says so,
        or, when that header is damaged, the records from its segment's start end there
        (a walk of their headers: for telling damage from a wrong position, not for
        every read). ``truncate`` takes such a position."""
        self._check_open()
        try:
            self.core.check_boundary(position)
        except InvalidPosition:
            return False
        return True

    def read_for_send(self, position: int, max_bytes: int) -> bytes | FileExtent:
        """``read_raw``'s answer — with at least ``FILE_EXTENT_BYTES_MIN`` bytes to read,
        as a FileExtent of the segment file, to be sent from there (sendfile: not copied;
        the records' CRCs checked on the mapping). The same bytes, the same errors."""
        self._check_open()
        core = self.core
        if min(max_bytes, core.written_position - position) >= FILE_EXTENT_BYTES_MIN:
            extent = core.raw_extent(position, max_bytes)
            if extent is not None:
                base, offset, file_size, zeros, crc = extent
                # (retention let the segment go since, or no descriptor is left: read_raw
                # answers what it finds, a typed error or the bytes)
                with contextlib.suppress(KeyError, OSError):
                    return FileExtent(self.files.segment_file(base).path, offset, file_size,
                                      zeros, crc)
        return core.read_raw(position, max_bytes)

    def append_raw(self, position: int, data: Any) -> int:
        """Append records received from another replica at the same position."""
        self._check_writable()
        return self.core.append_raw(position, data)  # (its keyed records noted in the core)

    def append_control(self, body: bytes = b"") -> int:
        """Append a control record (no queue sees it: a Raft leader's no-op) in the current
        epoch; return the position just past it."""
        self._check_writable()
        if RECORD_HEADER_SIZE + len(body) > self.config.message_size_bytes_max:
            raise MessageTooLarge(f"a control record of {len(body)} bytes exceeds "
                                  f"message_size_bytes_max={self.config.message_size_bytes_max}")
        core = self.core
        while True:  # another thread may write first: then place it after that write
            written, bases = core.written_position, core.segment_bases()
            segment_end = self.files.files_end() if bases else None
            if segment_end is not None and written >= segment_end:
                segment_end = None
            now = max(self._clock_ms() if self._clock_ms else _now_ms(),
                      core.last_store_timestamp)
            _position, data = control_bytes(written, segment_end, core.epoch, now, body)
            try:
                return self.append_raw(written, data)
            except ReplicaDataRejected:
                if core.written_position == written:
                    raise

    def truncate(self, position: int) -> None:
        """Cut the log (and every queue) back to ``position``, a record boundary.

        Other threads may keep writing: they continue from ``position`` afterwards.
        """
        self._check_writable()
        with self._flusher.paused(), self.key_index.lock, self._changing():
            self._truncate(position)

    def _truncate(self, position: int) -> None:
        """Call with the key index's lock held: the indexer must not run between the
        index's cut and the log's (it would index records about to go)."""
        self.core.check_boundary(position)
        self.key_index.truncate(position)
        # The saved flushed position and the checkpoint go first: a crash from here on
        # recovers from <= position and expects no record past it.
        self._lower_flushed(position)
        start = min(position, self._checkpoint_position())
        self._write_checkpoint(start)
        self.core.truncate(position, self._delete_dropped)
        self._flusher.reset(position, start)
        self.files.lower_queue_flushed()
        self._save_epochs()
        # The manifest's next offsets are too high now: the next checkpoint rewrites it
        # (until then a read-only open walks the log past each cut queue's end).
        self._queues_saved = None

    def reset(self, position: int, epoch_starts: list[tuple[int, int]]) -> None:
        """Start the log over, empty, at ``position``: a replica too far behind its
        leader, whose log now begins past this one's end (Kafka's truncateFullyAndStartAt,
        Raft's InstallSnapshot for a log). Every record, queue and key-index entry goes;
        ``epoch_starts`` (each start before ``position``) are the leader's epochs there,
        so this log knows the epoch of the record that ends at its start; the committed
        position is ``position`` (a leader lets only committed records go). Consumer
        offsets stay.

        For a replica's store, which only its replication driver writes: no other thread
        may write meanwhile. A crash part way leaves a shorter log, or an empty one, that
        the leader resets again."""
        self._check_writable()
        if not isinstance(position, int) or position < 0 or \
                any(start >= position for _epoch, start in epoch_starts):
            raise InvalidArgument(f"reset needs a position >= 0 and epoch starts before it, "
                                  f"got {position} and {epoch_starts}")
        # In this order, so that a crash never pairs the new epochs with old records. The
        # key index's lock is held throughout: an indexer running while the log has no
        # segment would start an index file at position 0.
        with self._flusher.paused(), self.key_index.lock, self._changing():
            self._lower_flushed(position)
            bases = self.core.segment_bases()
            if bases:
                self._truncate(bases[0])  # queues, key index, epochs: the log is empty
                self.files.drop_segments_from(bases[0])
                fsync_directory(self.paths.commitlog)
            self.files.drop_all_queues()
            self.key_index.trim_front(position)
            self._allocator.discard()
            self.core.restore(position)
            self.core.committed_position = position
            self.core.epoch_starts = list(epoch_starts)
            self.core.epoch = max([self.core.epoch, *(epoch for epoch, _ in epoch_starts)])
            self._save_epochs()
            self._allocator.start(position)
            self._new_segment(position)  # the log's start, kept across a restart
            fsync_directory(self.paths.commitlog)
            if self._flushed_file is not None:
                self._flushed_file.save_now(position)
            self._flusher.start_over(position)
            self._save_queues(force=True)
            self._write_checkpoint(position)

    @property
    def change_count(self) -> int | None:
        """How many changes that cut records (truncations, resets, retention, writable
        opens) the store had seen: now, or for a read-only snapshot when it was opened
        (odd: one was under way). None: not known (no ``changes`` file yet)."""
        return self._snapshot_changes if self.read_only else \
            self._changes.count if self._changes is not None else None

    def _changing(self) -> contextlib.AbstractContextManager[None]:
        """Around a change that cuts records or queue entries: readers in other processes
        tell it from damage by the change count (checkpoint.py)."""
        assert self._changes is not None
        return self._changes.changing()

    def _lower_flushed(self, position: int) -> None:
        if self._flushed_file is not None:
            self._flushed_file.lower(position)

    def _delete_dropped(self, dropped_segments: list[int],
                        dropped_files: list[tuple[str, int, int]]) -> None:
        """Delete what a truncation dropped, under the core's write lock: a writer that
        rolls right after must not meet an old file of the same name."""
        self._allocator.discard()
        for base in dropped_segments:
            self.files.forget_segment(base).remove()
        for topic, queue_id, base_offset in dropped_files:
            self.files.forget_queue_file(topic, queue_id, base_offset).remove()

    @property
    def epoch(self) -> int:
        return self.core.epoch

    def set_epoch(self, epoch: int) -> None:
        """Stamp later records with ``epoch``; epochs never go backwards."""
        self._check_writable()
        if not isinstance(epoch, int) or epoch < self.core.epoch:
            raise InvalidArgument(f"epoch must be an int >= the current {self.core.epoch}")
        if epoch == self.core.epoch:
            return
        # Saved at once, before any record carries it: a master promoted into this epoch
        # must still be in it after a restart (Kafka writes its leader-epoch checkpoint
        # the same way). The epoch's start is noted when its first record is written.
        with self._flusher.paused():
            self.core.epoch = epoch
            self._save_epochs()

    def epoch_starts(self) -> list[tuple[int, int]]:
        """(epoch, first position) of every epoch in the log, ascending."""
        self._check_open()
        return list(self.core.epoch_starts)

    def epoch_at(self, position: int) -> int | None:
        """The epoch of the record that ends at ``position`` (None at the log's start)."""
        self._check_open()
        found = None
        for epoch, start in self.core.epoch_starts:
            if start >= position:
                break
            found = epoch
        return found

    def set_committed_position(self, position: int) -> None:
        """Move the committed position (replication layers, committed_follows=external)."""
        self._check_writable()
        if not 0 <= position <= self.core.written_position:
            raise InvalidPosition(f"committed position {position} must lie in "
                                  f"[0, {self.core.written_position}]")
        self.core.committed_position = position

    # --- closing -------------------------------------------------------------------------

    def close(self) -> None:
        """Flush everything, write a clean checkpoint, and release the files."""
        if self._closed:
            return
        self._closed = True
        _OPEN_STORES.discard(self)
        if self.read_only:
            self._release_files()
            return
        self.core.fence(StoreClosed(f"store {self.paths.root} is closed; open it again"))
        self._maintenance.stop()
        self._allocator.close()  # nothing backs blocks ahead while close needs room
        try:
            self._flusher.stop()
        except FlushFailed:
            pass  # (inline flushes) kept as the flusher's error: raised once files are let go
        failed: MqlogError | None = self._flusher.error or self._write_failure
        if failed is None:
            try:
                self._close_cleanly()
            except (DiskFull, TooManyOpenFiles) as error:
                failed = error  # the log is durable; the abort marker stays: reopen recovers
            except OSError as error:  # EIO from a save or an fsync: the same, said typed
                failed = FlushFailed(
                    f"closing store {self.paths.root} failed ({error}); the commit log is "
                    f"durable up to position {self._flusher.flushed_position}, but the "
                    "close was not clean. Reopen the store to recover.")
                failed.__cause__ = error
        self._release_files()
        self._release_lock()
        if failed is not None:
            raise failed

    def _close_cleanly(self) -> None:
        with typed_errors(f"cannot close {self.paths.root} cleanly"):
            with self.key_index.lock:
                try:
                    self.key_index.catch_up()
                    self.key_index.close()
                except (DiskFull, TooManyOpenFiles):
                    self.key_index.close_unsealed()  # derived data: the next open rebuilds
            end = self.core.written_position
            self._sync_all_queues()
            flushed = self._flushed_file
            if flushed is not None and end == self._flusher.flushed_position:
                flushed.save_now(end)  # the last one, due or not
            self._save_epochs()
            self._save_queues(force=True)
            self._write_checkpoint(end, end)
            self.paths.abort.unlink(missing_ok=True)
            fsync_directory(self.paths.root)

    def abandon(self, reason: str) -> None:
        """Leave the store as a crash or a power loss would: no flush, no checkpoint, no
        clean close (the simulator's disk model, crash tests). Calls fail with
        StoreClosed(``reason``), sync waiters with FlushFailed; the background threads
        end (a sync under way finishes first), the files are unmapped (written pages
        stay in the page cache) and the lock is released."""
        if self._closed:
            return
        self.core.fence(StoreClosed(reason))
        self._closed_reason = reason
        self._closed = True
        _OPEN_STORES.discard(self)
        if not self.read_only:
            self._maintenance.stop()
            self._allocator.close()
            self._flusher.abandon(reason)
            if self._flushed_file is not None:
                self._flushed_file.stop()
        self._release_files()
        self._release_lock()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"written={self.core.written_position}"
        return f"<mqlog.Store {str(self.paths.root)!r} {self.implementation} {state}>"

    def _check_open(self) -> None:
        if self._closed:
            raise self._closed_error()

    def _closed_error(self) -> StoreClosed:
        if self._forked_from is not None:
            return StoreClosed(
                f"store {self.paths.root} was opened by process {self._forked_from}, which "
                f"forked this one ({os.getpid()}): the store belongs to the parent, and this "
                "copy of it is closed here (its lock, files and threads are the parent's). "
                "Open the store in this process itself (mqlog.open) once the parent has "
                "closed it, or open a read-only snapshot (read_only=True) beside it")
        if self._closed_reason is not None:
            return StoreClosed(self._closed_reason)
        return StoreClosed(f"store {self.paths.root} is closed; open it again")

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.release()

    def _forked(self) -> None:
        """In a child forked while this store was open (called by _after_fork_in_child,
        with the child's only thread): mark the store closed here without touching it
        (its lock file's copy the child closes itself: files.LockFile). Whatever the parent's
        threads held at the fork (the core's locks, the flusher's) stays held in the
        child forever, so this neither takes a lock nor calls the core; nor does close()
        afterwards (the store is closed), which must not checkpoint or unlink the parent's
        files. Every call of the store then raises StoreClosed, puts included (their
        fast path, the core's own put, is unbound here)."""
        self._forked_from = self._owner_pid  # (its lock file: files.LockFile forgets it)
        self._closed = True
        self.__dict__.pop("put", None)  # (async flush: the core's methods, bound at open)
        self.__dict__.pop("put_batch", None)

    def _release_files(self) -> None:
        if self._commitlog_fd >= 0:
            os.close(self._commitlog_fd)
            self._commitlog_fd = -1
        if self._flushed_file is not None:
            self._flushed_file.close()
        if self._changes is not None:
            self._changes.close()
        if hasattr(self, "_allocator"):
            self._allocator.close()
        if hasattr(self, "key_index"):
            self.key_index.close_unsealed()
        for mapped in self._retired:
            mapped.close()
        self._retired.clear()
        if hasattr(self, "files"):
            self.files.release()
        elif hasattr(self, "core"):
            self.core.release()

    # --- callbacks from the core (called under its write lock) -------------------------

    def _new_segment(self, base: int) -> None:
        last = self.files.last_segment_file()
        if last is not None:  # (written to no more: its write_records descriptor goes)
            last.end_writes()
        mapped = self._allocator.take(base)
        self._names_unsynced.add(base)  # _sync_log syncs commitlog/ before acking in it
        self.files.attach_segment(base, mapped)

    def _prepare_segment(self, base: int, end: int) -> int:
        """Back the last segment with blocks up to at least position ``end`` (called
        under the core's write lock before it writes past what is backed); DiskFull or
        TooManyOpenFiles if it cannot be, with nothing written."""
        mapped = self.files.segment_file(base)
        if mapped.prepared is None:  # opened, not made here: it holds data up to the end
            mapped.mark_held(self.core.written_position - base)
        return self._allocator.ensure(mapped, base, end)

    def _write_segment(self, base: int, offset: int, data: Any) -> None:
        """Write records into segment ``base`` with pwrite: a sync store's put_batch, or a
        replica's records (append_raw). Called under the core's write lock, before it
        publishes them; ``data`` is valid only during the call. DiskFull or
        TooManyOpenFiles change nothing; any other failure (EIO) fences the store as a
        failed flush does, and close() leaves it for recovery (no clean checkpoint): the
        device is failing, and what it holds is recovery's to say."""
        mapped = self.files.segment_file(base)
        try:
            if mapped.prepared is None:  # opened, not made here: it holds data up to here
                mapped.mark_held(offset)
            mapped.write_records(offset, data)
        except MqlogError:
            raise
        except OSError as error:
            failure = StoreFailed(f"store {self.paths.root} stopped accepting writes: "
                                  f"writing the commit log failed ({error}); nothing of "
                                  "this write was stored. Reopen the store to recover.")
            failure.__cause__ = error  # (kept for close(), which raises it again)
            self._write_failure = failure
            self.core.fence(failure)
            raise failure from error

    def _new_queue_file(self, topic: str, queue_id: int, base_offset: int) -> None:
        key, first = (topic, queue_id), base_offset
        new = not self.files.has_queue(key)
        if new:
            per_file = self.config.consume_queue_entries_per_file
            self._validate_queue(topic, queue_id)
            make_directory(self.paths.queue_dir(topic, queue_id), parents=True)
            first, base_offset = base_offset, base_offset - base_offset % per_file
        else:  # a queue's files keep the size it began with (the core counts entries by
            # it): a store reopened with another consume_queue_entries_per_file changes
            # new queues only
            per_file = self.files.last_queue_file(key).size // cq.ENTRY_SIZE
        path = self.paths.queue_dir(topic, queue_id) / file_name(base_offset)
        mapped = MappedFile.create(path, per_file * cq.ENTRY_SIZE)
        try:
            if new and first > base_offset:
                mapped.write_at(0, cq.TOMBSTONE * (first - base_offset))
            # Only now is a new queue added: a failure leaves no queue, nor a file.
            self.files.add_queue_file(key, base_offset, mapped, first if new else None)
        except BaseException:
            mapped.remove()
            raise

    def _prepare_queue(self, topic: str, queue_id: int, offset: int) -> int:
        """Back the next pages of a queue's last file with written (zero) blocks, from the
        first page boundary at or after ``offset``'s entry (the bytes before it are in
        use); return the offset up to which entries are backed. Called under the core's
        write lock when the entries reach what is backed. A file's prefill grows with it:
        as much as its entries take already (a page at first), at most
        ``consume_queue_prefill_bytes``; so a queue of a few entries holds a page, and a
        new store's first puts into many queues do not fault in 64 KiB of fresh pages
        each before their sync can start (issue 14, tenth session)."""
        mapped = self.files.last_queue_file((topic, queue_id))
        base = int(mapped.path.name)
        at = (offset - base) * cq.ENTRY_SIZE
        page, start = at // PAGE_SIZE * PAGE_SIZE, -(-at // PAGE_SIZE) * PAGE_SIZE
        # Entries before ``at`` may share its page (tombstones, a cut: files.py), and that
        # page may be partly a hole: hold it, or the entry's write fault is a SIGBUS.
        mapped.hold(page, start)
        grow = min(self.config.consume_queue_prefill_bytes, max(PAGE_SIZE, start))
        end = min(mapped.size, start + grow)
        try:
            mapped.back(start, end)
        except DiskFull:
            end = min(mapped.size, start + PAGE_SIZE)  # a nearly full disk: one page
            mapped.back(start, end)
        return base + end // cq.ENTRY_SIZE

    def _check_queue_read(self, topic: Any, queue_id: Any) -> None:
        """A (topic, queue id) a read names: typed, as put's (a queue never written reads
        as empty; a queue id below 0, or a topic that is no str, is a caller's mistake:
        both cores answered it, each its own way, empty or 0)."""
        self._check_open()
        if not isinstance(topic, str):
            raise InvalidTopic(f"topic must be str, got {type(topic).__name__}")
        if not isinstance(queue_id, int) or isinstance(queue_id, bool) or queue_id < 0:
            raise InvalidQueueId(f"queue_id must be a non-negative int, got {shown(queue_id)}")

    def _check_committed_queue(self, topic: Any, queue_id: Any) -> None:
        """A queue a commit names, checked as put checks it (the offsets file holds its
        name): a queue that exists is accepted whatever the limits now (a store reopened
        with a lower queue_id_max or topic_length_max keeps its queues, and put still
        writes them); a new one must fit them, as put's new queue must."""
        self._check_queue_read(topic, queue_id)
        try:
            self._validate_queue(topic, queue_id)
        except (InvalidTopic, InvalidQueueId):
            if self.core.queue_offsets(topic, queue_id) is None:
                raise

    def _validate_queue(self, topic: str, queue_id: int) -> None:
        if not topic or len(topic) > self.config.topic_length_max:
            raise InvalidTopic(f"topic must have 1..{self.config.topic_length_max} characters,"
                               f" got {len(topic)}")
        if topic in (".", "..") or not _TOPIC_CHARS.fullmatch(topic):
            raise InvalidTopic(f"topic {topic!r} may use only letters, digits and . _ - % | "
                               "(it names a directory), and may not be '.' or '..'")
        if queue_id > self.config.queue_id_max:
            raise InvalidQueueId(f"queue_id {queue_id} exceeds queue_id_max="
                                 f"{self.config.queue_id_max}")

    # --- the log's extent ---------------------------------------------------------------

    def first_segment_base(self) -> int:
        """The log's first position (retention moves it forward)."""
        self._check_open()
        return self.files.first_segment_base()

    def segments(self) -> list[tuple[int, int]]:
        """(base position, size in bytes) of every segment file, ascending."""
        self._check_open()
        return self.files.segments()

    # --- flushing --------------------------------------------------------------------------

    def _sync_log(self, start: int, end: int) -> None:
        self.files.sync_segments(start, end)
        # Durability covers names too (DESIGN §4): a segment made (renamed from *.tmp)
        # since the last sync of commitlog/ has its entry synced before any record in
        # it counts as flushed; recovery deletes *.tmp, and a lost name loses records.
        named = [base for base in list(self._names_unsynced) if base < end]
        if named:
            os.fsync(self._commitlog_fd)  # (held open: EMFILE cannot stop a flush)
            self._names_unsynced.difference_update(named)
        if self._flushed_file is not None:  # after the sync: it never claims a torn byte
            self._flushed_file.note(end)

    def _sync_all_queues(self) -> None:
        self.files.sync_all_queues()

    def _write_checkpoint(self, log_position: int, log_end: int | None = None) -> None:
        """The checkpoint file: recovery scans from ``log_position`` (a clean close:
        the log ends at ``log_end``), and no record's store timestamp will be below the
        newest one's so far, which it carries (a clock set back between two lives of the
        store would else stamp records older than those before them, and the lookups by
        time, which rely on the order, would miss records)."""
        cp.write_checkpoint(self.paths.checkpoint, cp.Checkpoint(
            log_position, log_position if log_end is None else log_end,
            self.core.last_store_timestamp))

    def _checkpoint(self, log_position: int) -> None:
        self._sync_all_queues()
        self._save_epochs()
        self._save_queues(force=False)
        self._write_checkpoint(log_position)
        if self.config.page_cache_window_bytes:  # (the log is synced up to log_position)
            self.files.drop_cached_below(log_position - self.config.page_cache_window_bytes)

    def _checkpoint_position(self) -> int:
        checkpoint = cp.read_checkpoint(self.paths.checkpoint)
        return checkpoint.log_position if checkpoint else 0

    def _save_epochs(self) -> None:
        current = list(self.core.epoch_starts)
        if self.core.epoch > (current[-1][0] if current else 0):
            current.append((self.core.epoch, self.core.written_position))  # no record yet
        if current != self.files.epochs_saved:
            cp.write_epochs(self.paths.epochs, current)
            self.files.epochs_saved = current

    def _save_queues(self, force: bool) -> None:
        """Rewrite the queue manifest when a queue appeared, its minimum moved or it began
        a new file (or always, at open and close, when the next offsets must be exact
        too): its next offsets then reach into every queue's last file, so a read-only
        open notices a lost one (queuecheck.py)."""
        current = []
        for topic, queue_id in sorted(self.core.queue_ids()):
            offsets = self.core.queue_offsets(topic, queue_id)
            current.append((topic, queue_id, offsets[0], offsets[1]))
        per_file = self.config.consume_queue_entries_per_file
        shape = [(topic, queue_id, low, (high - 1) // per_file)
                 for topic, queue_id, low, high in current]
        if force or shape != self._queues_saved:
            cp.write_queues(self.paths.queues, current)
            self._queues_saved = shape

    def _on_flushed(self, position: int) -> None:
        if self.config.commit_rule == "flushed":
            self.core.committed_position = max(self.core.committed_position, position)

    def _on_flush_failure(self, failure: FlushFailed) -> None:
        self.core.fence(StoreFailed(f"store {self.paths.root} stopped accepting writes: "
                                    f"{failure}"))


def _after_fork_in_child() -> None:
    """A child process forked while stores were open does not share them (their threads
    did not survive the fork): each lets go of its copy (Store._forked). Iterates a copy
    of the set; nothing here waits for a lock."""
    for store in list(_OPEN_STORES):
        store._forked()
    _OPEN_STORES.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _refuse(*_arguments: object) -> None:
    raise AssertionError("a read-only store's core asked for a new file")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
