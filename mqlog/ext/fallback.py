"""The pure-Python twin of mqlog's C log core: the executable specification.

``mqlog.ext._core`` (Cython) and this module expose the same classes, the same errors
and write byte-identical files; ``mqlog.ext`` picks one (``MQLOG_PUREPYTHON=1`` forces
this one). Read this module to learn what the core does; read ``_core.pyx`` to see it
done fast.

Theory of operation
-------------------
The core owns the hot state of a store and nothing else: the mapped segments of the
commit log, the mapped consume-queue files, the written and committed positions, the
epoch, and a write lock. It creates no files. When it needs a new segment or a new
consume-queue file it calls back into the engine (``new_segment``, ``new_queue_file``),
which creates and maps the file and hands the buffer back. So the engine decides what
is rare (file names, directory layout, flushing, recovery policy) and the core does
what is frequent (encoding, CRC32C, consume-queue appends, decoding, scanning).

The write path, in order (DESIGN §4): validate the arguments (nothing is touched if
they are bad) → take the write lock → find or create the queue → make room in its
consume-queue file → assign position (rolling to a new segment if the record does not
fit; the old segment's tail gets a blank record), offset and store timestamp → have
the engine back the bytes with allocated blocks if they are not yet (``prepare_segment``,
once per allocation step: a write through a mapping into a hole of a full disk is a
SIGBUS, never an error) → encode the record straight into the mapping → append the
consume-queue entry → advance the written position (and the committed position, when
it follows the written one) → release the lock. A put_batch first makes room for all
of it (``_room_for_batch``): the segment it goes in, and every consume-queue file its
entries go in, opened and backed, so a full disk refuses it before any record is
written, never part way through. Waiting for a flush or for replicas is
the engine's business. Given ``write_segment``, records reach the file with pwrite
instead in two cases, and are then published as record by record (entries, then the
written position):

* with ``stage_batches``, a put_batch that fits in its segment and its consume-queue
  file is encoded into one buffer, which the engine writes into the backed part of the
  segment (``_put_staged``: the engine of a sync-flush store does this, because each
  page stored into through a shared mapping must be write-protected again at every
  sync, a TLB flush per page);
* append_raw writes a replica's records, already encoded, as they came: the part that
  fits in the last segment with one pwrite, which allocates the blocks it needs. No
  zeros are written ahead of them first, as a write through the mapping needs (it must
  never fault on a hole): on a follower that was the larger part of its CPU time.

That is the one departure from DESIGN §4's "encode straight into the mapped segment",
and RocketMQ's own: with its transient store pool, records go into a write buffer that
is then written to the file channel, while readers keep the mapping.

Readers take no lock: they read a queue's end offset and the committed position, which
the writer publishes only after the bytes they cover are in place, and they check every
record's size, magic, position and CRC32C before handing it out, and that it is the
record its consume-queue entry names (topic, queue, offset: else ConsumeQueueMismatch).

Changes that take bytes away (truncate, trim_front, detach_segments_from, drop_queues,
release) first hide what goes (the written and committed positions, the queues' ends),
then drop or zero it, and mark their work in a generation count (odd while under way).
A reader whose read fails compares the count with the one it started with: if the log
changed meanwhile the failure is the change, not damage, and the reader answers as if
it had read after it (a get ends before the records that went, read_raw/read_record
raise InvalidPosition, a released core raises StoreClosed), never CorruptRecord.
"""

from __future__ import annotations

import errno
import heapq
import os
import struct
import threading
import time
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import msgpack
from crc32c import crc32c as _crc32c_impl

from mqlog import format as _fmt
from mqlog.errors import (
    ConsumeQueueMismatch,
    CorruptRecord,
    InvalidArgument,
    InvalidPosition,
    MessageTooLarge,
    OffsetOutOfRange,
    ReplicaDataRejected,
    StoreClosed,
    shown,
)
from mqlog.results import PUT_OK, BatchPutResult, PutResult

IMPLEMENTATION = "python"
# put_batch encodes at most this many bytes for one pwrite (write_segment); a larger
# batch is written record by record through the mapping.
STAGE_BYTES_MAX = 4 << 20

# --- the byte layouts: mqlog/format.py is their one definition (docs/FORMAT.md) ------
# The record: a 72-byte header (HEADER, in RecordHeader's field order), then topic | key
# | tags | properties | body; the CRC32C at [8, 12) covers [CRC_START, size).
HEADER = _fmt.RECORD_HEADER
HEADER_SIZE = _fmt.RECORD_HEADER_SIZE
CRC_START = _fmt.CRC_START
MAGIC = _fmt.RECORD_MAGIC
_MAGIC_BYTES = MAGIC.to_bytes(4, "little")
BLANK_MAGIC = _fmt.BLANK_MAGIC  # pads a segment's tail
BLANK_SIZE_MIN = _fmt.BLANK_SIZE_MIN
BLANK = _fmt.BLANK
CQ_ENTRY = _fmt.CQ_ENTRY  # position u64, size u32, tag hash u64
CQ_ENTRY_SIZE = _fmt.CQ_ENTRY_SIZE
CQ_AT_POSITION, CQ_AT_SIZE, CQ_AT_HASH = _fmt.CQ_AT_POSITION, _fmt.CQ_AT_SIZE, _fmt.CQ_AT_HASH
_U32, _U64 = _fmt.CQ_SIZE, _fmt.CQ_POSITION
ATTR_CONTROL = _fmt.ATTR_CONTROL  # control records (no consume-queue entry)
ATTR_FILLER = _fmt.ATTR_FILLER  # a lost-record filler (`mqlog repair`): Record.lost
_PROPERTIES_DEPTH_MAX = 512  # containers checked for non-str keys this deep (msgpack: 511)
_ZERO_CHUNK = bytes(1 << 20)
# The store timestamp's clock, as the C core's (_records.pxi): the wall clock as of the
# kernel's last tick (Linux's CLOCK_REALTIME_COARSE; the time module has no name for it).
CLOCK_REALTIME_COARSE = getattr(time, "CLOCK_REALTIME_COARSE", 5)

assert HEADER_SIZE == 72 and CQ_ENTRY_SIZE == 20

# Reasons a scan stops (ScanResult.stop_reason).
STOP_END = "end"  # zero bytes: the end of the data
STOP_BLANK = "blank"  # a blank record fills the segment's tail


def crc32c(data: Any, value: int = 0) -> int:
    """CRC32C (Castagnoli) of a bytes-like object, continuing from ``value``."""
    return _crc32c_impl(data, value)


_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3


def tag_hash(tags: str | bytes | None) -> int:
    """The 64-bit FNV-1a hash of a record's tags as stored in its consume-queue entry."""
    if not tags:
        return 0
    data = tags.encode() if isinstance(tags, str) else tags
    value = _FNV_OFFSET
    for byte in data:
        value = ((value ^ byte) * _FNV_PRIME) & 0xFFFF_FFFF_FFFF_FFFF
    return value


_ZEROS = bytes(1 << 20)


def write_zeros(fd: int, start: int, end: int, piece: int) -> None:
    """Write zeros over [start, end) of file ``fd`` with pwrite, ``piece`` bytes (at most
    1 MiB) a write: it allocates the blocks (OSError ENOSPC if it cannot; part of the
    range may be written then). The engine backs files so (engine/files.py)."""
    if not 0 < piece <= len(_ZEROS):
        raise ValueError(f"piece must be 1..{len(_ZEROS)} bytes, got {piece}")
    view = memoryview(_ZEROS)[:piece]
    while start < end:
        written = os.pwrite(fd, view[:min(end - start, piece)], start)
        if written <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        start += written


def key_hash(topic: str, key: str, hash_bits: int = 64) -> int:
    """The key index's hash of (topic, key): FNV-1a 64 of ``topic \\0 key``, keeping the
    low ``hash_bits`` bits (fewer bits force collisions: a test knob)."""
    return _key_hash(topic.encode() + b"\x00" + key.encode(), hash_bits)


def index_chain(index: Any, value: int, begin: int, end: int, resume: Any,
                count_max: int) -> tuple[list[int], Any, str]:
    """Walk the chain of key hash ``value`` in a key-index file, newest first.

    ``index`` is the file's buffer (docs/FORMAT.md, "Key index"). Returns (positions,
    resume, problem): the positions of at most ``count_max`` entries whose hash is
    ``value`` and whose store timestamp lies in [begin, end]; None when the chain ended
    (or reached entries older than ``begin``), else what to pass as ``resume`` to go on;
    and '' or why the chain does not hold together: an entry whose CRC32C fails, a link
    that does not point to an earlier entry of the same bucket at an earlier position
    inside the file's range with a timestamp no newer (the caller rebuilds the file).
    """
    if len(index) < INDEX_HEADER_SIZE:
        return [], None, "shorter than a key-index header"
    header = INDEX_HEADER.unpack_from(index)
    slot_count, entry_count_max, entry_count = header[2], header[3], header[4]
    first_position, end_position = header[6], header[7]
    entries_at = INDEX_HEADER_SIZE + 4 * slot_count
    if slot_count == 0 or entry_count > entry_count_max or \
            len(index) < entries_at + INDEX_ENTRY_SIZE * entry_count_max:
        return [], None, "not a key-index file of the size its header gives"
    bucket = value % slot_count
    if resume is None:
        number = INDEX_SLOT.unpack_from(index, INDEX_HEADER_SIZE + 4 * bucket)[0]
        newer_position, newer_timestamp = end_position, (1 << 63) - 1
        if number > entry_count:
            return [], None, f"slot {bucket} names entry {number} of {entry_count}"
    else:
        number, newer_position, newer_timestamp = resume
        if number > entry_count:
            return [], None, "a resumed walk names no entry"
    found: list[int] = []
    while number:
        if len(found) >= count_max:
            return found, (number, newer_position, newer_timestamp), ""
        at = entries_at + (number - 1) * INDEX_ENTRY_SIZE
        key_hash, position, timestamp, link, crc = INDEX_ENTRY.unpack_from(index, at)
        if crc != crc32c(bytes(index[at:at + INDEX_ENTRY_CRC_AT])):
            return found, None, f"entry {number} fails its CRC32C"
        if link >= number or key_hash % slot_count != bucket or \
                not first_position <= position < newer_position or \
                timestamp > newer_timestamp:
            return found, None, (f"entry {number} (hash {key_hash:#x}, position {position}, "
                                 f"link {link}) does not belong in the chain of slot {bucket}")
        if timestamp < begin:
            break
        if key_hash == value and timestamp <= end:
            found.append(position)
        number, newer_position, newer_timestamp = link, position, timestamp
    return found, None, ""


def _key_hash(data: bytes, hash_bits: int) -> int:
    value = _FNV_OFFSET
    for byte in data:
        value = ((value ^ byte) * _FNV_PRIME) & 0xFFFF_FFFF_FFFF_FFFF
    return value & ((1 << hash_bits) - 1)


# --- the key-index file (mqlog/format.py, docs/FORMAT.md "Key index"): header, u32
# slots, then 32-byte entries whose last u32 is the CRC32C of their first 28 bytes
INDEX_HEADER = _fmt.INDEX_HEADER
INDEX_HEADER_SIZE = _fmt.INDEX_HEADER_SIZE
INDEX_MAGIC = _fmt.INDEX_MAGIC  # key-index file, version 2
INDEX_ENTRY = _fmt.INDEX_ENTRY
INDEX_ENTRY_CRC_AT = _fmt.INDEX_ENTRY_CRC_AT
INDEX_ENTRY_SIZE = _fmt.INDEX_ENTRY_SIZE
INDEX_SLOT = _fmt.INDEX_SLOT

assert INDEX_HEADER_SIZE == 64 and INDEX_ENTRY_SIZE == 32


class Record:
    """One record read back from the log; variable fields decode when first used.

    ``lost`` is true for a lost-record filler: ``mqlog repair`` put it at the offset of a
    record whose bytes were damaged and not copied from a replica (docs/FORMAT.md,
    "Damage"). It keeps the queue's offsets consecutive and holds no data: its body is
    empty or zero bytes, and it has no key, tags or properties."""

    __slots__ = ("raw", "position", "size", "attributes", "queue_id", "epoch", "offset",
                 "born_timestamp", "store_timestamp", "_sizes")

    def __init__(self, raw: bytes) -> None:
        (size, _magic, _crc, self.attributes, topic_size, self.queue_id, body_size,
         self.epoch, self.offset, self.position, self.born_timestamp, self.store_timestamp,
         key_size, tags_size, properties_size) = HEADER.unpack_from(raw)
        self.raw = raw
        self.size = size
        self._sizes = (topic_size, key_size, tags_size, properties_size, body_size)

    def _field(self, index: int) -> bytes:
        start = HEADER_SIZE + sum(self._sizes[:index])
        return self.raw[start:start + self._sizes[index]]

    @property
    def topic(self) -> str:
        return self._field(0).decode()

    @property
    def key(self) -> str | None:
        return self._field(1).decode() if self._sizes[1] else None

    @property
    def tags(self) -> str | None:
        return self._field(2).decode() if self._sizes[2] else None

    @property
    def properties(self) -> dict:
        return msgpack.unpackb(self._field(3)) if self._sizes[3] else {}

    @property
    def body(self) -> bytes:
        return self._field(4)

    @property
    def end_position(self) -> int:
        return self.position + self.size

    @property
    def lost(self) -> bool:
        return bool(self.attributes & ATTR_FILLER)

    def __eq__(self, other: object) -> bool:
        # Records of the C core and of this twin compare equal when their bytes do.
        return type(other).__name__ == "Record" and self.raw == other.raw  # type: ignore

    def __hash__(self) -> int:
        return hash(self.raw)

    def __repr__(self) -> str:
        if self.attributes & ATTR_FILLER:  # (its body is padding, not data)
            return (f"Record(topic={self.topic!r}, queue_id={self.queue_id}, "
                    f"offset={self.offset}, position={self.position}, epoch={self.epoch}, "
                    "lost=True)")
        more = "..." if self._sizes[4] > 32 else ""
        return (f"Record(topic={self.topic!r}, queue_id={self.queue_id}, offset={self.offset}, "
                f"position={self.position}, epoch={self.epoch}, key={self.key!r}, "
                f"tags={self.tags!r}, body={self.body[:32]!r}{more})")


class ScanResult:
    """Where a recovery scan of one segment stopped, and why."""

    __slots__ = ("end_offset", "record_count", "stop_reason", "last_store_timestamp")

    def __init__(self, end_offset: int, record_count: int, stop_reason: str,
                 last_store_timestamp: int) -> None:
        self.end_offset = end_offset
        self.record_count = record_count
        self.stop_reason = stop_reason
        self.last_store_timestamp = last_store_timestamp

    def __repr__(self) -> str:
        return (f"ScanResult(end_offset={self.end_offset}, record_count={self.record_count}, "
                f"stop_reason={self.stop_reason!r})")


class _Segment:
    __slots__ = ("base", "buffer", "size")

    def __init__(self, base: int, buffer: Any) -> None:
        self.base = base
        self.buffer = buffer
        self.size = len(buffer)


class _Queue:
    __slots__ = ("topic", "topic_bytes", "queue_id", "min_offset", "next_offset", "files",
                 "entries_per_file", "ready_end")

    def __init__(self, topic: str, queue_id: int, min_offset: int, next_offset: int) -> None:
        self.topic = topic
        self.topic_bytes = topic.encode()
        self.queue_id = queue_id
        self.min_offset = min_offset
        self.next_offset = next_offset
        self.files: list[tuple[int, Any]] = []  # (base offset, buffer), ascending
        self.entries_per_file = 0
        self.ready_end = 0  # entries below this offset have pages behind them

    def first_at(self, position: int) -> int:
        """The first offset whose record starts at or after ``position`` (next_offset if
        none): a binary search, positions grow with offsets."""
        low, high = self.min_offset, self.next_offset
        while low < high:
            middle = (low + high) // 2
            if self.entry(middle)[0] < position:
                low = middle + 1
            else:
                high = middle
        return low

    def entry(self, offset: int) -> tuple[int, int, int]:
        base, buffer = self._file_for(offset)
        return CQ_ENTRY.unpack_from(buffer, (offset - base) * CQ_ENTRY_SIZE)

    def _file_for(self, offset: int) -> tuple[int, Any]:
        for base, buffer in reversed(self.files):
            if base <= offset:
                return base, buffer
        raise AssertionError(f"no consume-queue file holds offset {offset}")


class LogCore:
    """The hot state of one store; see the module docstring for the protocol."""

    def __init__(self, *, segment_size_bytes: int, message_size_bytes_max: int,
                 key_size_bytes_max: int,
                 tags_size_bytes_max: int, new_segment: Callable[[int], Any],
                 new_queue_file: Callable[[str, int, int], Any],
                 clock_ms: Callable[[], int] | None = None,
                 verify_crc_on_read: bool = True, read_only: bool = False,
                 prepare_queue: Callable[[str, int, int], int] | None = None,
                 prepare_segment: Callable[[int, int], int] | None = None,
                 batch_count_max: int = -1,
                 write_segment: Callable[[int, int, Any], None] | None = None,
                 stage_batches: bool = False) -> None:
        # read_only: the engine maps files read-only and fences writes; the C core then
        # asks for plain buffers instead of writable ones.
        self.read_only = read_only
        self.segment_size_bytes = segment_size_bytes
        self.message_size_bytes_max = message_size_bytes_max
        self.key_size_bytes_max = key_size_bytes_max
        self.tags_size_bytes_max = tags_size_bytes_max
        self.batch_count_max = batch_count_max  # bodies per put_batch (-1: no limit)
        self._new_segment = new_segment
        self._new_queue_file = new_queue_file
        # prepare_queue(topic, queue id, offset) -> offset: the engine backs the pages of
        # the current consume-queue file from ``offset`` on with written blocks (a
        # write fault on a hole in a shared mapping costs milliseconds) and says how far.
        self._prepare_queue = prepare_queue
        # prepare_segment(base, end) -> position: the engine backs the last segment with
        # allocated blocks up to at least ``end`` and says how far. The core never writes
        # through a mapping into a hole: on a full disk that is a SIGBUS, not an error.
        self._prepare_segment = prepare_segment
        self._ready_end = 0  # 0 after any change to the segments: the next write asks
        # write_segment(base, offset, data): the engine writes records into segment
        # ``base`` with pwrite, not through the mapping (None: through the mapping),
        # allocating whatever blocks past the backed part they need; ``data`` is valid
        # only during the call. append_raw's records go this way (no zeros written ahead
        # of them), and with ``stage_batches`` a put_batch's: pages stored into through a
        # shared mapping are write-protected again at every sync, a TLB flush per page
        # (an interrupt to every other core the process runs on); pwrite leaves none.
        self._write_segment = write_segment
        self._stage_batches = stage_batches and write_segment is not None
        # While a staged batch's entries are appended, before the written position covers
        # them: where the batch ends (0 otherwise). Readers take its entries for records
        # yet to come, as they take the one entry _append publishes first.
        self._publishing_end = 0
        self._clock_ms = clock_ms
        self.verify_crc_on_read = verify_crc_on_read
        self._lock = threading.Lock()
        self._segments: list[_Segment] = []
        self._bases: list[int] = []
        self._queues: dict[str, dict[int, _Queue]] = {}
        self.written_position = 0
        self.committed_position = 0
        self.commit_follows_written = True
        self.epoch = 0
        self.epoch_starts: list[tuple[int, int]] = []  # (epoch, first position), ascending
        self.last_store_timestamp = 0
        self.last_keyed_end = 0  # just past the last keyed record seen (the indexer's hint)
        self._fence: BaseException | None = None
        # Every method that unmaps, frees or zeroes (truncate, trim_front, detach,
        # drop_queues, release) makes the generation odd while it works and even again
        # when done: a reader whose record failed a check, or that met a closed mapping,
        # compares it with the one it started with, and if the log changed under it
        # answers as if it had read after the change (a typed "gone" error, never a
        # CorruptRecord for a healthy record that was dropped).
        self._generation = 0
        self._released = False  # release() ran: every read is StoreClosed

    # --- changes readers must notice (see _generation) ---------------------------------

    def _begin_change(self) -> None:
        self._generation += 1 if self._generation % 2 == 0 else 2

    def _end_change(self) -> None:
        self._generation += 1 if self._generation % 2 else 2

    def _changed(self, generation: int) -> bool:
        """Whether the log may have changed since a reader saw ``generation``."""
        return generation % 2 == 1 or self._generation != generation

    def _closed_error(self) -> BaseException:
        if isinstance(self._fence, StoreClosed):
            return self._fence
        return StoreClosed("the store was closed; open it again")

    def _check_released(self) -> None:
        if self._released:
            raise self._closed_error()

    @property
    def generation(self) -> int:
        """Odd while a truncation, trim or release is under way; moves with each."""
        return self._generation

    # --- set-up by the engine -----------------------------------------------------------

    def attach_segment(self, base: int, buffer: Any) -> None:
        """Add the next segment of the log (open, roll, or append_raw)."""
        if self._segments:
            last = self._segments[-1]
            assert base == last.base + last.size, "segments must be contiguous"
        self._segments.append(_Segment(base, buffer))
        self._bases.append(base)
        self._ready_end = 0

    def detach_segments_from(self, position: int) -> list[int]:
        """Forget every segment starting at or after ``position``; return their bases."""
        with self._lock:
            self._begin_change()
            try:
                return self._detach_from(position)
            finally:
                self._end_change()

    def _detach_from(self, position: int) -> list[int]:
        index = bisect_left(self._bases, position)
        dropped = self._bases[index:]
        del self._segments[index:], self._bases[index:]
        self._ready_end = 0
        return dropped

    def segment_bases(self) -> list[int]:
        return list(self._bases)

    def add_queue(self, topic: str, queue_id: int, min_offset: int, next_offset: int,
                  entries_per_file: int) -> None:
        queues = self._queues.setdefault(topic, {})
        assert queue_id not in queues
        queue = _Queue(topic, queue_id, min_offset, next_offset)
        queue.entries_per_file = entries_per_file
        queues[queue_id] = queue

    def attach_queue_file(self, topic: str, queue_id: int, base_offset: int, buffer: Any) -> None:
        queue = self._queues[topic][queue_id]
        assert len(buffer) == queue.entries_per_file * CQ_ENTRY_SIZE
        assert not queue.files or base_offset == queue.files[-1][0] + queue.entries_per_file
        queue.files.append((base_offset, buffer))
        # Entries before a new last file are backed: the files before it were filled, or
        # backed whole by _room_for_entries before it opened this one.
        queue.ready_end = base_offset

    def queue_ids(self) -> list[tuple[str, int]]:
        """Every (topic, queue id), under the write lock: a put may be adding one."""
        with self._lock:
            return [(topic, qid) for topic, queues in self._queues.items() for qid in queues]

    def release(self) -> None:
        """Let go of every mapping (the engine is about to unmap them); every later
        read raises StoreClosed."""
        with self._lock:
            self._begin_change()
            self._released = True
            self._segments.clear()
            self._bases.clear()
            self._ready_end = 0
            self._queues.clear()
            self._end_change()

    def drop_queues(self) -> None:
        """Forget every queue (recovery is about to rebuild them from the log)."""
        with self._lock:
            self._begin_change()
            self._queues.clear()
            self._end_change()

    def committed_end_offset(self, topic: str, queue_id: int) -> int:
        """One past the last offset of the queue whose record is committed."""
        queue = self._queues.get(topic, {}).get(queue_id)
        if queue is None:
            return 0
        low, high = queue.min_offset, queue.next_offset
        if self.committed_position >= self.written_position:
            return high
        while low < high:
            middle = (low + high) // 2
            position, size, _hash = queue.entry(middle)
            if position + size <= self.committed_position:
                low = middle + 1
            else:
                high = middle
        return low

    def queue_offsets(self, topic: str, queue_id: int) -> tuple[int, int] | None:
        """(min offset, next offset) of a queue, or None if it has never been written."""
        queue = self._queues.get(topic, {}).get(queue_id)
        return None if queue is None else (queue.min_offset, queue.next_offset)

    def restore(self, written_position: int) -> None:
        """After open: resume writing at ``written_position`` (must lie in the last segment)."""
        assert not self._segments or (
            self._segments[-1].base <= written_position
            <= self._segments[-1].base + self._segments[-1].size)
        self.written_position = written_position
        self._ready_end = 0

    def fence(self, error: BaseException | None) -> None:
        """Refuse every later write with ``error`` (closed store, failed flush); None lifts it."""
        self._fence = error

    # --- the write path ---------------------------------------------------------------

    def put(self, topic: str, body: Any, queue_id: int = 0, key: str | None = None,
            tags: str | None = None, properties: dict | None = None,
            born_timestamp: int | None = None) -> PutResult:
        """Store one record. See the module docstring for the steps."""
        self._check_fence()
        fields = self._prepare(topic, queue_id, key, tags, properties, born_timestamp)
        body = _as_bytes(body)
        size = self._record_size(fields, len(body))
        with self._lock:
            self._check_fence()
            queue = self._writable_queue(topic, queue_id)
            store_timestamp = self._next_timestamp()
            position = self._append(queue, fields, body, size, store_timestamp)
            return PutResult(PUT_OK, position, queue.next_offset - 1, store_timestamp, size)

    def put_batch(self, topic: str, bodies: Iterable[Any], queue_id: int = 0,
                  key: str | None = None, tags: str | None = None,
                  properties: dict | None = None,
                  born_timestamp: int | None = None) -> BatchPutResult:
        """Store many records in one queue under one lock hold and one store timestamp.
        ``born_timestamp`` may be a list: one per body (a replay keeps each record's)."""
        self._check_fence()
        borns = born_timestamp if type(born_timestamp) is list else None
        fields = self._prepare(topic, queue_id, key, tags, properties,
                               None if borns is not None else born_timestamp)
        try:
            bodies = [_as_bytes(body) for body in bodies]
        except TypeError:
            raise InvalidArgument("bodies must be an iterable of bytes-like objects") from None
        if not bodies:
            raise InvalidArgument("put_batch needs at least one body")
        if 0 <= self.batch_count_max < len(bodies):
            raise InvalidArgument(f"put_batch got {len(bodies)} bodies; at most "
                                  f"batch_count_max={self.batch_count_max}: split the batch")
        if borns is not None:
            _check_borns(borns, len(bodies))
        sizes = [self._record_size(fields, len(body)) for body in bodies]
        with self._lock:
            self._check_fence()
            queue = self._writable_queue(topic, queue_id)
            store_timestamp = self._next_timestamp()
            first_offset = queue.next_offset
            total = sum(sizes)
            self._room_for_batch(queue, len(bodies), total)
            first_position = self.written_position
            if self._put_staged(queue, fields, bodies, sizes, borns, total, store_timestamp):
                return BatchPutResult(PUT_OK, first_position, first_offset, len(bodies),
                                      store_timestamp, self.written_position)
            first_position = -1
            for index, (body, size) in enumerate(zip(bodies, sizes, strict=True)):
                if borns is not None:
                    fields = (*fields[:4], borns[index], fields[5])
                position = self._append(queue, fields, body, size, store_timestamp)
                if first_position < 0:
                    first_position = position
            return BatchPutResult(PUT_OK, first_position, first_offset, len(bodies),
                                  store_timestamp, self.written_position)

    def _room_for_batch(self, queue: _Queue, count: int, total: int) -> None:
        """Before a batch writes anything, room for all of it, so that a full disk
        refuses it whole (a record at a time, the records that fit were written, then
        the next file a full disk refused: DiskFull, with part of the batch stored and
        seen, and back after a crash): the segment it all goes in, backed for all of it
        (the next one opened first when the batch does not fit in the rest of this one;
        a batch larger than a segment goes across segments), and every consume-queue
        file its ``count`` entries go in, opened and backed (_room_for_entries)."""
        if total + BLANK_SIZE_MIN <= self.segment_size_bytes:
            self._ensure_segment()
            segment = self._segments[-1]
            if self.written_position - segment.base + total + BLANK_SIZE_MIN > segment.size:
                segment = self._roll(segment)
            self._ensure_ready(segment, self.written_position + total + BLANK_SIZE_MIN)
        self._room_for_entries(queue, count)

    def _room_for_entries(self, queue: _Queue, count: int) -> None:
        """The consume-queue files of the queue's next ``count`` entries, opened and
        backed: each file backed to its end before the next one is opened, so every file
        before the last is backed whole (attach_queue_file counts on it), and the entries
        of a batch crossing a file's end go in a file before the last (_index)."""
        end = queue.next_offset + count
        self._ensure_queue_room(queue)
        while True:
            file_end = queue.files[-1][0] + queue.entries_per_file
            while self._prepare_queue is not None and min(end, file_end) > queue.ready_end:
                ready = self._prepare_queue(queue.topic, queue.queue_id, queue.ready_end)
                assert ready > queue.ready_end, \
                    f"prepare_queue answered {ready} for entries ready to {queue.ready_end}"
                queue.ready_end = ready
            if end <= file_end:
                return
            self._new_queue_file(queue.topic, queue.queue_id, file_end)

    def _roll(self, segment: _Segment) -> _Segment:
        """Close ``segment`` with a blank (its block backed first) and open the next."""
        self._ensure_ready(segment, self.written_position + BLANK_SIZE_MIN)
        self._write_blank(segment, self.written_position - segment.base)
        self._new_segment(self.written_position)
        return self._segments[-1]

    def _put_staged(self, queue: _Queue, fields: tuple, bodies: list[bytes],
                    sizes: list[int], borns: list | None, total: int,
                    store_timestamp: int) -> bool:
        """put_batch with ``stage_batches``: the records encoded into one buffer and
        written with one pwrite, then published as _append publishes one: the entries
        (no reader, here or in another process, meets an entry whose record is not in the
        file), the keyed end, then the written position (a checkpoint or the key index
        that reads it finds the entries below it). False, with nothing written, when the
        batch crosses the end of its segment (it is larger than one: _room_for_batch gave
        any other a segment of its own) or of its consume-queue file (_room_for_batch
        opened the next one: the queue's last file does not hold its first entry): then
        it goes record by record, through the mapping. ``total``: the records' bytes."""
        write_segment = self._write_segment
        if write_segment is None or not self._stage_batches or total > STAGE_BYTES_MAX or \
                queue.next_offset < queue.files[-1][0]:
            return False
        self._ensure_segment()
        segment = self._segments[-1]
        start = self.written_position
        if start - segment.base + total + BLANK_SIZE_MIN > segment.size:
            return False
        self._ensure_ready(segment, start + total + BLANK_SIZE_MIN)
        epoch = self.epoch  # (read once: set_epoch may run while the write lets the GIL go)
        staged = bytearray()
        for index, (body, size) in enumerate(zip(bodies, sizes, strict=True)):
            if borns is not None:
                fields = (*fields[:4], borns[index], fields[5])
            staged += self._encode(queue, fields, body, size, epoch, start + len(staged),
                                   queue.next_offset + index, store_timestamp)
        write_segment(segment.base, start - segment.base, staged)
        self._note_epoch(epoch, start)
        self._publishing_end = start + total
        position = start
        for size in sizes:
            self._index(queue, position, size, fields[5])
            position += size
        if fields[1]:
            self.last_keyed_end = start + total
        self._advance(start + total)
        self._publishing_end = 0
        return True

    def _check_fence(self) -> None:
        if self._fence is not None:
            raise self._fence

    def _prepare(self, topic: Any, queue_id: Any, key: Any, tags: Any, properties: Any,
                 born_timestamp: Any) -> tuple:
        if not isinstance(topic, str):
            raise InvalidArgument(f"topic must be str, got {type(topic).__name__}")
        if not isinstance(queue_id, int) or isinstance(queue_id, bool) or queue_id < 0:
            raise InvalidArgument(f"queue_id must be a non-negative int, got {shown(queue_id)}")
        key_bytes = _text_field("key", key, self.key_size_bytes_max)
        tags_bytes = _text_field("tags", tags, self.tags_size_bytes_max)
        if tags_bytes:
            _check_tags(tags)
        props_bytes = _pack_properties(properties)
        if born_timestamp is not None and (not isinstance(born_timestamp, int)
                                           or isinstance(born_timestamp, bool)):
            raise InvalidArgument("born_timestamp must be an int (milliseconds) or None")
        if born_timestamp is not None and not -(1 << 63) <= born_timestamp < (1 << 63):
            raise InvalidArgument(
                "born_timestamp must fit in a signed 64-bit integer (milliseconds)")
        try:
            topic_bytes = topic.encode()
        except UnicodeEncodeError:
            raise _text_error("topic", topic) from None
        return (topic_bytes, key_bytes, tags_bytes, props_bytes, born_timestamp,
                tag_hash(tags_bytes))

    def _record_size(self, fields: tuple, body_size: int) -> int:
        topic_bytes, key_bytes, tags_bytes, props_bytes = fields[:4]
        size = (HEADER_SIZE + len(topic_bytes) + len(key_bytes) + len(tags_bytes)
                + len(props_bytes) + body_size)
        if size > self.message_size_bytes_max:
            raise MessageTooLarge(
                f"record of {size} bytes exceeds message_size_bytes_max="
                f"{self.message_size_bytes_max}; send a smaller body or raise the limit")
        return size

    def _writable_queue(self, topic: str, queue_id: int) -> _Queue:
        queue = self._queues.get(topic, {}).get(queue_id)
        if queue is None:
            # The engine validates the name and id, creates the files and calls add_queue.
            self._new_queue_file(topic, queue_id, 0)
            queue = self._queues[topic][queue_id]
        return queue

    def _next_timestamp(self) -> int:
        now = self._clock_ms() if self._clock_ms is not None else \
            time.clock_gettime_ns(CLOCK_REALTIME_COARSE) // 1_000_000
        if now > self.last_store_timestamp:
            self.last_store_timestamp = now
        return self.last_store_timestamp

    def _append(self, queue: _Queue, fields: tuple, body: bytes, size: int,
                store_timestamp: int) -> int:
        """Encode one record at the end of the log and index it; return its position."""
        self._ensure_queue_room(queue)
        segment, offset = self._reserve(size)
        position = segment.base + offset
        segment.buffer[offset:offset + size] = self._encode(
            queue, fields, body, size, self.epoch, position, queue.next_offset,
            store_timestamp)
        self._note_epoch(self.epoch, position)
        self._index(queue, position, size, fields[5])
        if fields[1]:
            self.last_keyed_end = position + size
        self._advance(position + size)
        return position

    def _encode(self, queue: _Queue, fields: tuple, body: bytes, size: int, epoch: int,
                position: int, offset: int, store_timestamp: int) -> bytearray:
        """The bytes of one record of ``queue`` at ``position`` and ``offset``."""
        topic_bytes, key_bytes, tags_bytes, props_bytes, born, _ = fields
        record = bytearray(size)
        HEADER.pack_into(record, 0, size, MAGIC, 0, 0, len(topic_bytes), queue.queue_id,
                         len(body), epoch, offset, position,
                         store_timestamp if born is None else born, store_timestamp,
                         len(key_bytes), len(tags_bytes), len(props_bytes))
        record[HEADER_SIZE:] = topic_bytes + key_bytes + tags_bytes + props_bytes + body
        struct.pack_into("<I", record, 8, crc32c(memoryview(record)[CRC_START:]))
        return record

    def _ensure_queue_room(self, queue: _Queue) -> None:
        base, _ = queue.files[-1]
        if queue.next_offset >= base + queue.entries_per_file:
            self._new_queue_file(queue.topic, queue.queue_id, base + queue.entries_per_file)
        if queue.next_offset >= queue.ready_end and self._prepare_queue is not None:
            queue.ready_end = self._prepare_queue(queue.topic, queue.queue_id,
                                                  queue.next_offset)

    def _reserve(self, size: int) -> tuple[_Segment, int]:
        """The segment and in-segment offset where a record of ``size`` bytes goes."""
        self._ensure_segment()
        segment = self._segments[-1]
        offset = self.written_position - segment.base
        if offset + size + BLANK_SIZE_MIN > segment.size:
            segment = self._roll(segment)
            offset = 0
            assert size + BLANK_SIZE_MIN <= segment.size
        self._ensure_ready(segment, self.written_position + size + BLANK_SIZE_MIN)
        return segment, offset

    def _ensure_ready(self, segment: _Segment, end: int) -> None:
        """Have the engine back the last segment with blocks up to ``end``."""
        if end <= self._ready_end:
            return
        if self._prepare_segment is None:
            self._ready_end = segment.base + segment.size
            return
        ready = self._prepare_segment(segment.base, end)
        assert end <= ready <= segment.base + segment.size, \
            f"prepare_segment answered {ready} for a segment that must be ready to {end}"
        self._ready_end = ready

    def _ensure_segment(self) -> None:
        """Open the next segment when there is none or the last one is full."""
        if not self._segments or self.written_position == (self._segments[-1].base
                                                           + self._segments[-1].size):
            self._new_segment(self.written_position)

    def _write_blank(self, segment: _Segment, offset: int) -> None:
        BLANK.pack_into(segment.buffer, offset, segment.size - offset, BLANK_MAGIC)
        self._advance(segment.base + segment.size)

    def _index(self, queue: _Queue, position: int, size: int, hash_value: int) -> None:
        base, buffer = queue.files[-1]
        if queue.next_offset < base:  # (put_batch opened the file its last entries go in)
            base, buffer = queue._file_for(queue.next_offset)
        at = (queue.next_offset - base) * CQ_ENTRY_SIZE
        # The size last: it publishes the entry to readers in other processes (layout.h).
        _U64.pack_into(buffer, at + CQ_AT_POSITION, position)
        _U64.pack_into(buffer, at + CQ_AT_HASH, hash_value)
        _U32.pack_into(buffer, at + CQ_AT_SIZE, size)
        queue.next_offset += 1

    def _note_epoch(self, epoch: int, position: int) -> None:
        if not self.epoch_starts or self.epoch_starts[-1][0] != epoch:
            assert not self.epoch_starts or self.epoch_starts[-1][0] < epoch
            self.epoch_starts.append((epoch, position))

    def _advance(self, position: int) -> None:
        self.written_position = position
        if self.commit_follows_written:
            self.committed_position = position

    # --- the read path ------------------------------------------------------------------

    def get(self, topic: str, queue_id: int, offset: int, max_count: int,
            max_bytes: int) -> list[Record]:
        """Records of one queue from ``offset`` on, in order, up to the committed position.

        At least one record is returned when one is visible, even if it is larger than
        ``max_bytes``, so a consumer always makes progress (Kafka's rule). A truncation,
        reset or retention that takes records away during the read ends the answer
        before them; a store closed meanwhile raises StoreClosed. Each record must be
        the one its consume-queue entry names (topic, queue, offset): an entry that
        points elsewhere is a ConsumeQueueMismatch. A damaged record (CorruptRecord)
        ends the answer before it, as Kafka's fetch does: the records before it are
        returned, and the read that starts at it raises CorruptRecord naming it.
        """
        generation = self._generation  # (first: a release after it changes it)
        self._check_released()
        _check_read_arguments(topic, queue_id, offset, max_count, max_bytes)
        queue = self._readable_queue(topic, queue_id, offset)
        records: list[Record] = []
        total = 0
        for index in range(offset, min(queue.next_offset, offset + max_count)):
            # Checked every time: a truncation, retention or close may change the queue.
            if self._moved_on(generation) or not queue.min_offset <= index < queue.next_offset:
                break
            entry = self._entry(queue, index, generation)
            if entry is None:
                break
            position, size, _hash = entry
            if not self._visible(queue, index, position, size, generation) or \
                    (records and total + size > max_bytes):
                break
            record = self._read_entry(queue, index, position, size, generation,
                                      index == offset)
            if record is None:
                break
            records.append(record)
            total += size
        return records

    def pull(self, topic: str, queue_id: int, offset: int, max_count: int, max_bytes: int,
             tag_hashes: tuple[int, ...], scan_count_max: int) -> tuple[list[Record], int]:
        """``get`` with a tag filter: returns (records, next offset to pull from).

        Entries whose consume-queue tag hash is not in ``tag_hashes`` are skipped without
        touching the commit log (an empty tuple keeps every record). At most
        ``scan_count_max`` entries are examined, so the answer may be empty while the
        next offset moves on: a consumer always makes progress. A damaged record past
        the first entry examined ends the answer before it (as ``get``): the next
        offset is its own, and the pull from there raises CorruptRecord.
        """
        generation = self._generation  # (first: a release after it changes it)
        self._check_released()
        _check_read_arguments(topic, queue_id, offset, max_count, max_bytes)
        queue = self._readable_queue(topic, queue_id, offset)
        records: list[Record] = []
        total = 0
        index, stop = offset, min(queue.next_offset, offset + max(scan_count_max, 0))
        while index < stop and len(records) < max_count:
            if self._moved_on(generation) or not queue.min_offset <= index < queue.next_offset:
                break
            entry = self._entry(queue, index, generation)
            if entry is None:
                break
            position, size, hash_value = entry
            if not self._visible(queue, index, position, size, generation):
                break
            if tag_hashes and hash_value not in tag_hashes:
                index += 1
                continue
            if records and total + size > max_bytes:
                break
            record = self._read_entry(queue, index, position, size, generation,
                                      index == offset)
            if record is None:
                break
            records.append(record)
            total += size
            index += 1
        return records, index

    def _readable_queue(self, topic: str, queue_id: int, offset: int) -> _Queue:
        """The queue (an empty one if it was never written), once ``offset`` is checked."""
        queue = self._queues.get(topic, {}).get(queue_id)
        if queue is None:  # (named "": a topic that cannot be encoded is no error here,
            queue = _Queue("", 0, 0, 0)  # as in the C core: no such queue, no records)
        if not queue.min_offset <= offset <= queue.next_offset:
            raise OffsetOutOfRange(
                f"offset {offset} is outside [{queue.min_offset}, {queue.next_offset}] of "
                f"queue {topic!r}/{queue_id}; seek to a valid offset",
                min_offset=queue.min_offset, max_offset=queue.next_offset)
        return queue

    def _moved_on(self, generation: int) -> bool:
        """Whether a change completed since ``generation`` (StoreClosed if a release)."""
        if self._generation == generation:
            return False
        self._check_released()
        return True

    def _entry(self, queue: _Queue, offset: int,
               generation: int) -> tuple[int, int, int] | None:
        """The entry of ``offset``; None if its file went away under the read."""
        try:
            return queue.entry(offset)
        except _GONE_ERRORS:
            if not self._changed(generation):
                raise
            self._check_released()
            return None

    def _visible(self, queue: _Queue, offset: int, position: int, size: int,
                 generation: int) -> bool:
        """Whether the record an entry points to is committed. An entry whose record
        would end past the written position is garbage, not a record yet to come:
        waiting would never show it (the consumer would be stuck below max_offset), so
        it is an error."""
        if position + size <= self.committed_position:
            return True
        written = self.written_position
        if position + size <= written or self._yet_to_come(queue, offset, position, size,
                                                           written):
            return False
        if self._changed(generation):
            return False
        raise ConsumeQueueMismatch(_mismatch_text(
            queue.topic, queue.queue_id, offset, position, size,
            f"past the end of the log ({written})"))

    def _yet_to_come(self, queue: _Queue, offset: int, position: int, size: int,
                     written: int) -> bool:
        """Whether an entry past the written position (as read, ``written``) is one a
        writer publishes before it moves the written position over its record."""
        return (offset + 1 == queue.next_offset and position == written  # _append's
                or (position >= written and position + size <= self._publishing_end)
                or position + size <= self.written_position)  # (published since)

    def _read_entry(self, queue: _Queue, offset: int, position: int, size: int,
                    generation: int, first: bool) -> Record | None:
        """The record of a consume-queue entry, or None if the log changed under the read
        (the record went away: the answer ends before it) or, unless it is the ``first``
        entry the read examines, if the record is damaged (the answer ends before it;
        the read that starts at it raises CorruptRecord)."""
        try:
            raw, problem = self._copy_record(position, size)
        except _GONE_ERRORS:
            if not self._changed(generation):
                raise
            raw, problem = None, _PAST_END
        if raw is not None and not problem:
            if _is_queue_record(raw, queue, offset):
                return Record(raw)
            problem = _IDENTITY
        if self._changed(generation):
            self._check_released()
            return None
        self._refuse_entry(queue, offset, position, size, problem, first)
        return None  # (a damaged record past the first: _refuse_entry did not raise)

    def _copy_record(self, position: int, size: int) -> tuple[bytes | None, str]:
        """A private copy of the ``size`` bytes at ``position`` and what _check_record
        says of it (None and a problem if they are not in one segment)."""
        if not self._bases or position < self._bases[0]:
            return None, _BEFORE_LOG
        segment, offset = self._locate(position)
        if offset + size > segment.size:
            return None, _PAST_END
        raw = bytes(segment.buffer[offset:offset + size])
        return raw, _check_record(raw, position, self.verify_crc_on_read)

    def _refuse_entry(self, queue: _Queue, offset: int, position: int, size: int,
                      problem: str, first: bool) -> None:
        """Raise what a failed read of an entry's record means. If the log holds an
        intact record at the entry's position that is not the one named (another
        queue's, another offset's, another size), the entry is wrong:
        ConsumeQueueMismatch. Else the bytes there are damaged: CorruptRecord, raised
        only for the ``first`` entry a read examines (past it, the answer ends before
        the damaged record and this returns)."""
        if problem == _BEFORE_LOG:
            raise ConsumeQueueMismatch(_mismatch_text(
                queue.topic, queue.queue_id, offset, position, size,
                "before the log's first segment"))
        if problem == _IDENTITY or self._intact_at(position):
            segment, at = self._locate(position)
            header = HEADER.unpack_from(segment.buffer, at)
            topic = bytes(segment.buffer[at + HEADER_SIZE:at + HEADER_SIZE + header[4]])
            raise ConsumeQueueMismatch(_mismatch_text(
                queue.topic, queue.queue_id, offset, position, size,
                f"which holds the record of {topic.decode(errors='replace')!r}/{header[5]} "
                f"offset {header[8]} ({header[0]} bytes)"))
        if self._inside_record(position):
            raise ConsumeQueueMismatch(_mismatch_text(
                queue.topic, queue.queue_id, offset, position, size,
                "which lies inside a record, not at its start"))
        if not first:
            return
        if problem == _PAST_END:
            raise CorruptRecord(position, f"size {size} runs past the segment's end")
        raise CorruptRecord(position, problem)

    def _inside_record(self, position: int) -> bool:
        """Whether ``position`` lies inside a whole record, past its start, with every
        record before it in its segment whole too (sizes, magic, positions: not CRCs): no
        record starts there, and the log is not what is damaged."""
        if not self._bases or position < self._bases[0]:
            return False
        segment, offset = self._locate(position)
        end = 0
        while end < offset:
            if segment.size - end < BLANK_SIZE_MIN:
                return False
            size = BLANK.unpack_from(segment.buffer, end)[0]
            if end + size > segment.size or _check_record(
                    bytes(segment.buffer[end:end + size]), segment.base + end, False):
                return False
            if end + size > offset:
                return True
            end += size
        return False

    def _intact_at(self, position: int) -> bool:
        """Whether an intact record (its own size, position and CRC32C) starts there."""
        if not self._bases or position < self._bases[0]:
            return False
        segment, offset = self._locate(position)
        if segment.size - offset < HEADER_SIZE:
            return False
        size = BLANK.unpack_from(segment.buffer, offset)[0]
        return offset + size <= segment.size and not _check_record(
            bytes(segment.buffer[offset:offset + size]), position, True)

    def read_record(self, position: int) -> Record:
        """The record that starts at ``position``; it must be below the committed position."""
        generation = self._generation  # (first: a release after it changes it)
        self._check_released()
        try:
            return self._read_record(position)
        except (*_GONE_ERRORS, CorruptRecord):
            if not self._changed(generation):
                raise
            self._check_released()
            raise _gone(position, self.written_position) from None

    def _read_record(self, position: int) -> Record:
        if not isinstance(position, int) or position < 0 or position >= self.committed_position:
            raise InvalidPosition(
                f"position {position} is not below the committed position "
                f"{self.committed_position}")
        segment, offset = self._locate(position)
        if offset + BLANK_SIZE_MIN > segment.size:
            raise InvalidPosition(f"position {position} is not the start of a record")
        size, magic = BLANK.unpack_from(segment.buffer, offset)
        if magic != MAGIC or size < HEADER_SIZE or offset + size > segment.size:
            raise InvalidPosition(f"position {position} is not the start of a record")
        if position + size > self.committed_position:
            raise InvalidPosition(f"the record at {position} is not committed yet")
        raw, problem = self._copy_record(position, size)
        if problem:
            raise CorruptRecord(position, problem)
        return Record(raw)  # type: ignore[arg-type]

    def _locate(self, position: int) -> tuple[_Segment, int]:
        index = bisect_right(self._bases, position) - 1
        if index < 0:
            raise InvalidPosition(f"position {position} lies before the log's first segment")
        segment = self._segments[index]
        return segment, position - segment.base

    # --- what replication needs -------------------------------------------------------

    def read_raw(self, position: int, max_bytes: int) -> bytes:
        """Whole records from ``position`` up to the written position, never crossing a
        segment (a blank record ends the answer); at least one record if any; the record
        that would pass ``max_bytes`` is left unread."""
        generation = self._generation  # (first: a release after it changes it)
        self._check_released()
        try:
            answer = self._read_raw(position, max_bytes)
        except (*_GONE_ERRORS, CorruptRecord):
            if not self._changed(generation):
                raise
            self._check_released()
            raise _gone(position, self.written_position) from None
        if answer and self._changed(generation):  # (its bytes may mix before and after)
            self._check_released()
            raise _gone(position, self.written_position)
        return answer

    def raw_extent(self, position: int, max_bytes: int
                   ) -> tuple[int, int, int, int, int] | None:
        """``read_raw``'s answer without its copy, to be sent from the segment file:
        (segment base, offset in the segment, bytes from the file, zeros after them, CRC32C
        of the answer), or None for an empty answer (a closing blank's header is read
        from the file, its zeros are not: the rest of a segment may be a hole)."""
        answer = self.read_raw(position, max_bytes)
        if not answer:
            return None
        size = 0
        while size < len(answer):
            length, magic = BLANK.unpack_from(answer, size)
            if magic == BLANK_MAGIC:
                size += BLANK_SIZE_MIN
                break
            size += length
        segment, offset = self._locate(position)
        return segment.base, offset, size, len(answer) - size, crc32c(answer)

    def _read_raw(self, position: int, max_bytes: int) -> bytes:
        if position == self.written_position:
            return b""
        if not 0 <= position < self.written_position:
            raise InvalidPosition(
                f"position {position} is outside the log [{self._bases[0] if self._bases else 0}"
                f", {self.written_position}]")
        segment, offset = self._locate(position)
        end = offset
        limit = min(segment.size, self.written_position - segment.base)
        # The answer is the copies that were checked, never a second copy: another
        # process may rewrite the mapping between a check and a copy (as the C core's
        # CRC pass runs on its answer's own bytes).
        answer: list[bytes] = []
        while end < limit:
            at = segment.base + end
            if segment.size - end < BLANK_SIZE_MIN:  # (no room for even a blank's header)
                problem = _check_record(b"", at, True)
                if end == offset:  # (the C core's order: a damaged record after the first)
                    raise InvalidPosition(f"position {at} is not the start of a record "
                                          f"({problem})")
                raise CorruptRecord(at, problem)
            size, magic = BLANK.unpack_from(segment.buffer, end)
            if magic == BLANK_MAGIC and end + size == segment.size:
                # Its header, then zeros: the rest of the segment is never written, and
                # may be a hole, which on a full tmpfs a read through the mapping turns
                # into a SIGBUS (files.py).
                answer.append(bytes(segment.buffer[end:end + BLANK_SIZE_MIN])
                              + bytes(size - BLANK_SIZE_MIN))
                break
            if end > offset and (end - offset >= max_bytes or end + size - offset > max_bytes):
                break  # (the record that does not fit is left unread: the next read's first)
            raw = bytes(segment.buffer[end:end + size]) if end + size <= limit else b""
            problem = _check_record(raw, at, True)
            if problem and end == offset and problem != _CRC_MISMATCH:  # (a header that
                # holds together, its own position included, starts a record: if only
                # its CRC fails, the record is damaged, not the position wrong)
                raise InvalidPosition(f"position {at} is not the start of a record ({problem})")
            if problem:
                raise CorruptRecord(at, problem)
            answer.append(raw)
            end += size
        return b"".join(answer)

    def append_raw(self, position: int, data: Any) -> int:
        """Append records copied from another replica at the same position.

        Every record is checked first (size, magic, CRC32C, position, offset order); bad
        data raises ReplicaDataRejected and changes nothing. Returns the new written position.
        """
        self._check_fence()
        data = bytes(data)
        with self._lock:
            self._check_fence()
            if position != self.written_position:
                raise ReplicaDataRejected(position, f"this log ends at {self.written_position}")
            plan = self._plan_raw(position, data)
            step = 0
            while step < len(plan):
                step = self._apply_run(plan, step, data)
            return self.written_position

    def _plan_raw(self, position: int, data: bytes) -> list[tuple[str, int, int]]:
        """Validate raw data against the current log; return (kind, start, size) steps."""
        plan = []
        cursor = 0
        segment_end = None  # None: the next record opens a new segment
        if self._segments:
            last = self._segments[-1]
            if position < last.base + last.size:
                segment_end = last.base + last.size
        next_offsets: dict[tuple[str, int], int] = {}
        last_epoch = self.epoch_starts[-1][0] if self.epoch_starts else -1
        while cursor < len(data):
            at = position + cursor
            if len(data) - cursor < BLANK_SIZE_MIN:
                raise ReplicaDataRejected(at, "truncated record header")
            size, magic = BLANK.unpack_from(data, cursor)
            if magic == BLANK_MAGIC:
                if segment_end is None or at + size != segment_end:
                    raise ReplicaDataRejected(
                        at, f"blank record ends at {at + size} but this replica's segment ends "
                        f"at {segment_end}; give every replica the same segment_size_bytes")
                plan.append(("blank", cursor, size))
                segment_end = None
                cursor += size
                continue
            raw = data[cursor:cursor + size]
            problem = _check_record(raw, at, True) if size >= HEADER_SIZE else "size too small"
            if problem:
                raise ReplicaDataRejected(at, problem)
            room = self.segment_size_bytes if segment_end is None else segment_end - at
            if size + BLANK_SIZE_MIN > room:  # (a record opening a segment: the whole one)
                raise ReplicaDataRejected(at, _no_fit(size, self.segment_size_bytes))
            record = Record(raw)
            if record.epoch < last_epoch:
                raise ReplicaDataRejected(at, f"epoch {record.epoch} is older than {last_epoch}"
                                              ", the epoch before it")
            last_epoch = record.epoch
            if not record.attributes & ATTR_CONTROL:
                key = (record.topic, record.queue_id)
                expected = next_offsets.get(key)
                if expected is None:
                    offsets = self.queue_offsets(*key)
                    expected = record.offset if offsets is None else offsets[1]
                if record.offset != expected:
                    raise ReplicaDataRejected(at, f"queue {key[0]!r}/{key[1]} expects offset "
                                                  f"{expected}, record has {record.offset}")
                next_offsets[key] = expected + 1
            plan.append(("record", cursor, size))
            cursor += size
            if segment_end is None:
                segment_end = at + self.segment_size_bytes
        return plan

    def _apply_run(self, plan: list[tuple[str, int, int]], first: int, data: bytes) -> int:
        """Apply the planned steps from ``first`` on that go into the last segment (a new
        one when it is full); return the first step not applied. With ``write_segment``,
        every whole step that fits in the segment goes with one pwrite, and is published
        after it step by step, as when copied; otherwise (or when the first step is cut
        short or does not fit: the copy raises) one step is copied through the mapping."""
        self._ensure_segment()
        segment = self._segments[-1]
        offset = self.written_position - segment.base
        write_segment, last, end = self._write_segment, first, offset
        while write_segment is not None and last < len(plan):
            _kind, start, size = plan[last]
            if start + size > len(data) or end + size > segment.size:
                break
            last, end = last + 1, end + size
        if write_segment is None or last == first:
            kind, start, size = plan[first]
            if offset + size <= segment.size and start + size <= len(data):  # (else the
                self._ensure_ready(segment, self.written_position + size)  # copy raises)
            segment.buffer[offset:offset + size] = data[start:start + size]
            self._publish_raw(kind, segment, data, start, size)
            return first + 1
        start = plan[first][1]
        with memoryview(data)[start:start + end - offset] as run:  # (valid during the call)
            write_segment(segment.base, offset, run)
        try:
            for kind, start, size in plan[first:last]:
                self._publish_raw(kind, segment, data, start, size)
        except BaseException:
            # A consume-queue file that cannot be made or backed (DiskFull), an entry that
            # disagrees: what was written and not published goes, lest a recovery find
            # whole records past the written position (its blocks are there: no fault).
            unpublished = self.written_position - segment.base
            if unpublished < end:
                segment.buffer[unpublished:end] = bytes(end - unpublished)
            raise
        return last

    def _publish_raw(self, kind: str, segment: _Segment, data: bytes, start: int,
                     size: int) -> None:
        """A raw step now in the log: index its record and move the written position."""
        if kind == "blank":
            self._advance(segment.base + segment.size)
            return
        record = Record(data[start:start + size])
        self._dispatch(record)
        self._note_epoch(record.epoch, record.position)
        self.last_store_timestamp = max(self.last_store_timestamp, record.store_timestamp)
        self._advance(record.position + size)

    def _dispatch(self, record: Record) -> None:
        """Index a record that is already in the log (append_raw, recovery), and note
        where it ends if it has a key (the key indexer skips the log after that unread)."""
        if record._sizes[1]:  # a key (its size: no decoding)
            self.last_keyed_end = max(self.last_keyed_end, record.position + record.size)
        if record.attributes & ATTR_CONTROL:
            return
        queue = self._queues.get(record.topic, {}).get(record.queue_id)
        if queue is None:
            self._new_queue_file(record.topic, record.queue_id, record.offset)
            queue = self._queues[record.topic][record.queue_id]
        if record.offset < queue.next_offset:
            if record.offset >= queue.min_offset and queue.entry(record.offset)[:2] == (
                    record.position, record.size):
                return
            raise ConsumeQueueMismatch(f"queue {record.topic!r}/{record.queue_id} already has "
                                       f"offset {record.offset} for another record")
        if record.offset > queue.next_offset:
            raise ConsumeQueueMismatch(f"queue {record.topic!r}/{record.queue_id} ends at "
                                       f"{queue.next_offset}, record has offset {record.offset}")
        self._ensure_queue_room(queue)
        self._index(queue, record.position, record.size, tag_hash(record.tags))

    def truncate(self, position: int, on_dropped: Callable[[list, list], None] | None = None
                 ) -> tuple[list[int], list[tuple[str, int, int]]]:
        """Cut the log back to ``position`` (a record boundary); return what was dropped.

        Returns the bases of whole segments dropped and the (topic, queue id, base offset)
        of whole consume-queue files dropped. ``on_dropped(segments, files)``, if given,
        runs before the write lock is released, so the engine can delete those files
        before any writer could want a new file of the same name.
        """
        with self._lock:
            if not 0 <= position <= self.written_position:
                raise InvalidPosition(f"cannot truncate to {position}: the log ends at "
                                      f"{self.written_position}")
            self.check_boundary(position)
            self._begin_change()
            try:
                return self._truncate(position, on_dropped)
            finally:
                self._end_change()

    def _truncate(self, position: int, on_dropped: Callable[[list, list], None] | None
                  ) -> tuple[list[int], list[tuple[str, int, int]]]:
        # Readers first lose sight of what goes (ends, entries, segments); only then is
        # the dead tail zeroed.
        old_end = self.written_position
        self.committed_position = min(self.committed_position, position)
        self.written_position = position
        self._ready_end = 0
        dropped_files = [item for queue in self._all_queues()
                         for item in self._truncate_queue(queue, position)]
        # A segment that starts exactly at ``position`` stays, empty.
        dropped_segments = self._detach_from(position + 1)
        self.epoch_starts = [(e, p) for e, p in self.epoch_starts if p < position]
        self._zero_tail(position, old_end)
        if on_dropped is not None:
            on_dropped(dropped_segments, dropped_files)
        return dropped_segments, dropped_files

    def trim_front(self, log_start: int, on_dropped: Callable[[list, list], None] | None = None
                   ) -> tuple[list[int], list[tuple[str, int, int]]]:
        """Drop every segment below ``log_start`` (retention); return what was dropped.

        ``log_start`` must be the base of a segment that starts at or below the committed
        position, and never the active segment's end. Every queue's minimum offset moves
        to its first record at or after ``log_start``; its consume-queue files that hold
        only earlier entries are dropped (the last one always stays). Returns and reports
        through ``on_dropped`` like ``truncate``.
        """
        with self._lock:
            if log_start not in self._bases or log_start > self.committed_position:
                raise InvalidPosition(f"cannot trim the log to {log_start}: it must be the "
                                      "base of a segment at or below the committed position "
                                      f"{self.committed_position}")
            self._begin_change()
            try:
                return self._trim_front(log_start, on_dropped)
            finally:
                self._end_change()

    def _trim_front(self, log_start: int, on_dropped: Callable[[list, list], None] | None
                    ) -> tuple[list[int], list[tuple[str, int, int]]]:
        dropped_files = [item for queue in self._all_queues()
                         for item in self._trim_queue(queue, log_start)]
        index = self._bases.index(log_start)
        dropped_segments = self._bases[:index]
        del self._segments[:index], self._bases[:index]
        self.epoch_starts = _epochs_from(self.epoch_starts, log_start)
        if on_dropped is not None:
            on_dropped(dropped_segments, dropped_files)
        return dropped_segments, dropped_files

    def _trim_queue(self, queue: _Queue, log_start: int) -> list[tuple[str, int, int]]:
        low = queue.min_offset = queue.first_at(log_start)
        dropped = []
        while len(queue.files) > 1 and queue.files[1][0] <= low:
            dropped.append((queue.topic, queue.queue_id, queue.files.pop(0)[0]))
        return dropped

    def check_boundary(self, position: int) -> None:
        """Raise InvalidPosition unless a record (or the log's end) starts at ``position``:
        its header says so, or, when that header is damaged, the records from the
        segment's start end there, header after header (a replica told to truncate there
        cuts the damaged record away; its header alone cannot show it starts a record)."""
        if position == self.written_position:
            return
        if not 0 <= position < self.written_position:
            raise InvalidPosition(f"position {position} lies outside the log (it ends at "
                                  f"{self.written_position})")
        try:  # (retention, on its own thread, may let the segment go meanwhile)
            starts = self._starts_record(position)
        except _GONE_ERRORS:
            starts = False
        if not starts:
            raise InvalidPosition(f"position {position} is not a record boundary")

    def _starts_record(self, position: int) -> bool:
        segment, offset = self._locate(position)
        raw_head = bytes(segment.buffer[offset:offset + HEADER_SIZE])
        if len(raw_head) < BLANK_SIZE_MIN:
            return False
        size, magic = BLANK.unpack_from(raw_head)
        if magic == BLANK_MAGIC and offset + size == segment.size:
            return True
        return (magic == MAGIC and size >= HEADER_SIZE and offset + size <= segment.size
                and HEADER.unpack_from(segment.buffer, offset)[9] == position) or \
            _records_end_at(segment, offset)

    def _zero_tail(self, position: int, old_end: int) -> None:
        for segment in self._segments:
            if segment.base > position:
                break
            start = position - segment.base
            end = min(old_end - segment.base, segment.size)
            if start < end:
                _zero(segment.buffer, start, end)

    def _all_queues(self) -> list[_Queue]:
        return [queue for queues in self._queues.values() for queue in queues.values()]

    def _truncate_queue(self, queue: _Queue, position: int) -> list[tuple[str, int, int]]:
        low = queue.first_at(position)
        dropped = []
        while len(queue.files) > 1 and queue.files[-1][0] > low:
            dropped.append((queue.topic, queue.queue_id, queue.files.pop()[0]))
        base, buffer = queue.files[-1]
        end = min(queue.next_offset, base + queue.entries_per_file)
        if low < end:
            _zero(buffer, (low - base) * CQ_ENTRY_SIZE, (end - base) * CQ_ENTRY_SIZE)
        queue.next_offset = low
        return dropped

    # --- recovery -----------------------------------------------------------------------

    def scan_segment(self, base: int, start_offset: int, dispatch: bool = True) -> ScanResult:
        """Check records of an attached segment from ``start_offset`` on, indexing each one.

        Stops at zero bytes ("end"), at a blank record that fills the tail ("blank"), or at
        the first record whose size, magic, position or CRC is wrong (the reason). Never
        raises on garbage; raises ConsumeQueueMismatch when the queues cannot take a record.
        """
        segment = self._segments[self._bases.index(base)]
        buffer = segment.buffer
        offset, count, last_timestamp = start_offset, 0, 0
        while True:
            if offset + BLANK_SIZE_MIN > segment.size:
                return ScanResult(offset, count, "no room for a record header", last_timestamp)
            size, magic = BLANK.unpack_from(buffer, offset)
            if size == 0 and magic == 0:
                return ScanResult(offset, count, STOP_END, last_timestamp)
            if magic == BLANK_MAGIC:
                if offset + size == segment.size:
                    return ScanResult(offset, count, STOP_BLANK, last_timestamp)
                return ScanResult(offset, count, "blank record of a wrong size", last_timestamp)
            if size < HEADER_SIZE or offset + size + BLANK_SIZE_MIN > segment.size:
                return ScanResult(offset, count, f"bad size {size}", last_timestamp)
            raw = bytes(buffer[offset:offset + size])
            problem = _check_record(raw, base + offset, True)
            if problem:
                return ScanResult(offset, count, problem, last_timestamp)
            record = Record(raw)
            if dispatch:
                self._dispatch(record)
                self._note_epoch(record.epoch, record.position)
            last_timestamp = max(last_timestamp, record.store_timestamp)
            self.last_store_timestamp = max(self.last_store_timestamp, record.store_timestamp)
            offset += size
            count += 1

    # --- the key index ------------------------------------------------------------------

    def index_keys(self, index: Any, end: int, count_max: int) -> int:
        """Add the keyed records of ``[header end_position, end)`` to a key-index file.

        ``index`` is the file's writable buffer (docs/FORMAT.md, "Key index"); ``end`` must
        be a record boundary at or below the committed position. Indexes at most
        ``count_max`` records (keyed or not), and stops early when the file is full.
        Every record's CRC32C is checked: a damaged one (bytes that recovery did not scan
        may rot) is counted in the header and skipped to the next intact record.
        Updates the header's counts, end position and time range (not its CRC: the
        engine seals it). Returns the new end position.
        """
        (magic, hash_bits, slot_count, entry_count_max, entry_count, damaged, first_position,
         position, low, high, _r2, _crc) = INDEX_HEADER.unpack_from(index)
        assert magic == INDEX_MAGIC and end <= self.committed_position
        entries_at = INDEX_HEADER_SIZE + 4 * slot_count
        for _ in range(count_max):
            if position >= end:
                break
            segment, offset = self._locate(position)
            header = _header_at(segment, offset)
            if header is None:
                damaged += 1
                position = _resync(segment, offset, end)
                continue
            if header == "blank":
                position = segment.base + segment.size
                continue
            if header[12] and not header[3] & ATTR_CONTROL:
                if entry_count >= entry_count_max:
                    break
                start = offset + HEADER_SIZE
                topic_and_key = bytes(segment.buffer[start:start + header[4] + header[12]])
                value = _key_hash(topic_and_key[:header[4]] + b"\x00" +
                                  topic_and_key[header[4]:], hash_bits)
                slot_at = INDEX_HEADER_SIZE + 4 * (value % slot_count)
                entry_count += 1
                fields = (value, position, header[11], INDEX_SLOT.unpack_from(index, slot_at)[0])
                crc = crc32c(INDEX_ENTRY.pack(*fields, 0)[:INDEX_ENTRY_CRC_AT])
                INDEX_ENTRY.pack_into(index, entries_at + (entry_count - 1) * INDEX_ENTRY_SIZE,
                                      *fields, crc)
                INDEX_SLOT.pack_into(index, slot_at, entry_count)
                low, high = min(low, header[11]), max(high, header[11])
            position += header[0]
        INDEX_HEADER.pack_into(index, 0, INDEX_MAGIC, hash_bits, slot_count, entry_count_max,
                               entry_count, damaged, first_position, position, low, high, 0, 0)
        return position


class Waiter:
    """One sleep of one thread, ended once by ``wake()`` (from any thread) or by its
    timeout; group commit's (engine/flush.py). Not reusable: make one per wait. The C
    core's lets the GIL go before it wakes another (see _waiter.pxi); this one cannot,
    and behaves the same otherwise."""

    __slots__ = ("_lock", "_woken")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()  # held from birth; wake() releases it
        self._woken = False

    def wake(self) -> None:
        """End the sleep (now, or before it starts); a second wake is a RuntimeError."""
        self._woken_once()
        self._lock.release()

    def _woken_once(self) -> None:
        if self._woken:
            raise RuntimeError("a Waiter is woken once")
        self._woken = True

    def wait(self, timeout: float, wake: Waiter | None = None) -> bool:
        """Sleep until woken or ``timeout`` seconds pass (< 0: no limit); True if woken.
        With ``wake``, first wake that other Waiter."""
        if wake is not None:
            wake.wake()
        return self._lock.acquire(timeout=-1 if timeout < 0 else timeout)


WAIT_NOT_DURABLE = 0  # GroupCommit.wait's answers
WAIT_DURABLE = 1
WAIT_LEAD = 2


class GroupCommit:
    """Who waits for the log to be durable up to which position (engine/flush.py has
    the protocol): the flushed position, the leader (the waiting writer that syncs for
    all), a heap of waiters by end position, and the ready queue of covered waiters not
    woken yet, which threads going to sleep wake one at a time. The C core's runs each
    call under the GIL alone (see _waiter.pxi); this one takes a lock of its own, and
    behaves the same otherwise (the same steps in the same order)."""

    def __init__(self, flushed_position: int) -> None:
        self._lock = threading.Lock()
        self._heap: list[tuple[int, int, Waiter]] = []  # (end, arrival, waiter)
        self._ready: deque[Waiter] = deque()
        self._tie = 0
        self._leader: Waiter | None = None
        self.flushed_position = flushed_position
        self.error: BaseException | None = None  # a FlushFailed: every waiter raises it
        self.stopping = False  # the store is closing: covered waiters are woken at once
        self.handoffs = 0  # waiters taken from the ready queue so far

    @property
    def ready_count(self) -> int:
        """Covered waiters not woken yet."""
        return len(self._ready)

    @property
    def waiting_count(self) -> int:
        """Waiters not covered yet (the leader not counted)."""
        return len(self._heap)

    def wait(self, end: int, timeout: float) -> int:
        """See the C core's: WAIT_DURABLE, WAIT_NOT_DURABLE or WAIT_LEAD."""
        waiter = Waiter()
        with self._lock:
            if self.error is not None:
                raise self.error
            if self.flushed_position >= end:
                return WAIT_DURABLE
            handoff = self._take_ready()
            leads = self._leader is None
            if leads:
                self._leader = waiter
            else:
                self._tie += 1
                heapq.heappush(self._heap, (end, self._tie, waiter))
        if leads:
            if handoff is not None:
                handoff.wake()
            return WAIT_LEAD
        if not waiter.wait(timeout, handoff):
            with self._lock:  # the deadline: leave the queues, unless woken meanwhile
                if self._leader is not waiter and self._forget(waiter) and \
                        self.flushed_position < end:
                    if self.error is not None:
                        raise self.error
                    return WAIT_NOT_DURABLE
        with self._lock:
            if self._leader is waiter:
                return WAIT_LEAD
            if self.error is not None:
                raise self.error
            return WAIT_DURABLE if self.flushed_position >= end else WAIT_NOT_DURABLE

    def lead_done(self) -> None:
        """See the C core's."""
        with self._lock:
            self._leader = None
            while self._heap and self.error is None:
                end, _tie, waiter = heapq.heappop(self._heap)
                if end > self.flushed_position:
                    self._leader = waiter
                    break
                self._ready.append(waiter)
            wake = self._leader if self._leader is not None else self._take_ready()
            if self.stopping:
                self._wake_all_ready()
        if wake is not None:
            wake.wake()

    def publish(self, target: int) -> int:
        """See the C core's; the number of waiters ready."""
        with self._lock:
            if target > self.flushed_position:
                self.flushed_position = target
            self._release(target)
            return len(self._ready)

    def release_all(self) -> None:
        with self._lock:
            self._release(None)

    def _release(self, target: int | None) -> None:
        while self._heap and (target is None or self._heap[0][0] <= target):
            self._ready.append(heapq.heappop(self._heap)[2])
        if self.error is not None or self.stopping:
            self._wake_all_ready()

    def take_ready(self) -> Waiter | None:
        with self._lock:
            return self._take_ready()

    def wake_all_ready(self) -> None:
        with self._lock:
            self._wake_all_ready()

    def _take_ready(self) -> Waiter | None:
        if not self._ready:
            return None
        self.handoffs += 1
        return self._ready.popleft()

    def _wake_all_ready(self) -> None:
        while self._ready:
            self._take_ready().wake()  # type: ignore[union-attr]

    def _forget(self, waiter: Waiter) -> bool:
        for index, entry in enumerate(self._heap):
            if entry[2] is waiter:
                self._heap[index] = self._heap[-1]
                self._heap.pop()
                heapq.heapify(self._heap)
                return True
        try:
            self._ready.remove(waiter)
            return True
        except ValueError:
            return False


def _header_at(segment: _Segment, offset: int) -> Any:
    """The header of the record at ``offset`` if an intact one starts there (its sizes,
    magic, own position and CRC32C agree), "blank" for the blank that ends the segment,
    else None."""
    if segment.size - offset < BLANK_SIZE_MIN:
        return None
    size, magic = BLANK.unpack_from(segment.buffer, offset)
    if magic == BLANK_MAGIC:
        return "blank" if size == segment.size - offset else None
    if segment.size - offset < HEADER_SIZE:
        return None
    if magic != MAGIC or size < HEADER_SIZE or size > segment.size - offset or \
            _check_record(bytes(segment.buffer[offset:offset + size]), segment.base + offset,
                          True):
        return None
    return HEADER.unpack_from(segment.buffer, offset)


def _resync(segment: _Segment, offset: int, end: int) -> int:
    """The position of the first intact record after a damaged one at ``offset``, in the
    same segment and before ``end``; else the segment's end (or ``end``)."""
    limit = min(segment.size, end - segment.base)
    at = offset + 1
    while True:
        found = segment.buffer.find(_MAGIC_BYTES, at + 4, limit)
        if found < 0:
            return min(segment.base + segment.size, end)
        if isinstance(_header_at(segment, found - 4), tuple):
            return segment.base + found - 4
        at = found - 3


def _epochs_from(epoch_starts: list[tuple[int, int]], log_start: int) -> list[tuple[int, int]]:
    """The epoch starts of a log that now begins at ``log_start``: those at or after
    it, and the last one before it as it was, so that the log still knows the epoch of
    the record that ends at its start (a replica matches logs there; Raft's snapshot
    keeps its last term for the same reason)."""
    kept = [(epoch, start) for epoch, start in epoch_starts if start >= log_start]
    earlier = [(epoch, start) for epoch, start in epoch_starts if start < log_start]
    if earlier:
        kept.insert(0, earlier[-1])
    return kept


_CRC_MISMATCH = "CRC32C mismatch"


def _check_borns(borns: list, count: int) -> None:
    """put_batch's born timestamps given one per body: as many, each a signed 64-bit int."""
    if len(borns) != count:
        raise InvalidArgument(f"born_timestamp lists {len(borns)} timestamps for {count} "
                              "bodies; give one per body")
    for value in borns:
        if not isinstance(value, int) or isinstance(value, bool) or \
                not -(1 << 63) <= value < (1 << 63):
            raise InvalidArgument("a born_timestamp list must hold ints that fit in a "
                                  f"signed 64-bit integer (milliseconds), got {shown(value)}")


def _check_record(raw: bytes, position: int, verify_crc: bool) -> str:
    """'' if ``raw`` is one whole, intact record that belongs at ``position``; else why not."""
    if len(raw) < HEADER_SIZE:
        return "shorter than a record header"
    (size, magic, crc, _attributes, topic_size, _queue_id, body_size, _epoch, _offset,
     stored_position, _born, _stored, key_size, tags_size, properties_size) = \
        HEADER.unpack_from(raw)
    if magic != MAGIC:
        return f"bad magic {magic:#010x}"
    if size != len(raw):
        return f"size {size} does not match the record"
    if HEADER_SIZE + topic_size + key_size + tags_size + properties_size + body_size != size:
        return "field sizes do not add up to the record size"
    if stored_position != position:
        return f"record says it belongs at position {stored_position}"
    if verify_crc and crc32c(memoryview(raw)[CRC_START:]) != crc:
        return _CRC_MISMATCH
    return ""


def _as_bytes(body: Any) -> Any:
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        raise InvalidArgument("body must be bytes-like, not str; encode it first")
    try:
        return memoryview(body).cast("B").tobytes()
    except TypeError:
        raise InvalidArgument(f"body must be bytes-like, got {type(body).__name__}") from None


def _text_field(name: str, value: Any, size_max: int) -> bytes:
    if value is None:
        return b""
    if not isinstance(value, str):
        raise InvalidArgument(f"{name} must be str or None, got {type(value).__name__}")
    try:
        data = value.encode()
    except UnicodeEncodeError:
        raise _text_error(name, value) from None
    if len(data) > size_max:
        raise MessageTooLarge(f"{name} of {len(data)} bytes exceeds {name}_size_bytes_max="
                              f"{size_max}")
    return data


def _pack_properties(properties: Any) -> bytes:
    if properties is None or properties == {}:
        return b""
    if not isinstance(properties, dict):
        raise InvalidArgument(f"properties must be a dict or None, got "
                              f"{type(properties).__name__}")
    if not all(isinstance(key, str) for key in properties):
        raise InvalidArgument("properties keys must be str")  # msgpack reads back only str keys
    if _nested_key_problem(properties):
        raise InvalidArgument("properties keys must be str, in nested dicts too")
    try:
        return msgpack.packb(properties)
    except (TypeError, ValueError, OverflowError) as error:
        raise InvalidArgument(f"properties cannot be encoded with msgpack: {error}") from None


def _zero(buffer: Any, start: int, end: int) -> None:
    while start < end:
        chunk = min(end - start, len(_ZERO_CHUNK))
        buffer[start:start + chunk] = _ZERO_CHUNK[:chunk]
        start += chunk



_GONE_ERRORS = (ValueError, IndexError, AssertionError, struct.error)  # a mapping went away
# what a read of a consume-queue entry's record met besides _check_record's problems
_PAST_END = "past the segment's end"  # the entry's size runs past its segment's end
_BEFORE_LOG = "before the log"  # the entry's position lies before the first segment
_IDENTITY = "another record"  # an intact record, of another queue or offset


def _is_queue_record(raw: bytes, queue: _Queue, offset: int) -> bool:
    """Whether the intact record ``raw`` is the one ``queue``'s entry for ``offset`` names."""
    return _fmt.names_queue_record(raw, 0, queue.queue_id, offset, queue.topic_bytes)


def _mismatch_text(topic: str, queue_id: int, offset: int, position: int, size: int,
                   why: str) -> str:
    return (f"consume queue {topic!r}/{queue_id}: the entry of offset {offset} points at "
            f"position {position} (size {size}), {why}; the queue is damaged, not the log: "
            "close the store, move its consumequeue/ directory away and open it again to "
            "rebuild every queue from the commit log")


def _records_end_at(segment: _Segment, offset: int) -> bool:
    """Whether the segment's records, from its start, end exactly at ``offset``, each
    whole before it (sizes, magic, positions: not CRCs)."""
    end = 0
    while end < offset:
        if segment.size - end < BLANK_SIZE_MIN:
            return False
        size = BLANK.unpack_from(segment.buffer, end)[0]
        raw = bytes(segment.buffer[end:end + size]) if end + size <= offset else b""
        if _check_record(raw, segment.base + end, False):
            return False
        end += size
    return end == offset


def _gone(position: int, written_position: int) -> InvalidPosition:
    """What a read gets when a truncation, reset, or retention took its position away
    while it was reading (never a CorruptRecord: those records were healthy)."""
    return InvalidPosition(f"position {position} went away while it was read (the log was "
                           f"truncated, reset or trimmed meanwhile; it now ends at "
                           f"{written_position}): read again from a valid position")


def _nested_key_problem(properties: dict) -> bool:
    """Whether a dict inside a properties value has a key that is not a str (msgpack
    reads back only str keys: such a record could be stored and never read)."""
    stack: list[tuple[Any, int]] = [(value, 1) for value in properties.values()
             if isinstance(value, (dict, list, tuple))]
    while stack:
        value, depth = stack.pop()
        if depth > _PROPERTIES_DEPTH_MAX:
            continue  # (msgpack refuses to pack it anyway)
        if isinstance(value, dict):
            if not all(isinstance(key, str) for key in value):
                return True
            value = value.values()
        stack.extend((item, depth + 1) for item in value
                     if isinstance(item, (dict, list, tuple)))
    return False


def check_text(name: str, value: str) -> None:
    """Refuse a str put would refuse as not UTF-8 (a lone surrogate), with put's error:
    the engine checks the names a read or a query is given with it."""
    try:
        value.encode()
    except UnicodeEncodeError:
        raise _text_error(name, value) from None


def _no_fit(size: int, segment_size_bytes: int) -> str:
    return (f"a record of {size} bytes does not fit in this replica's segment (of "
            f"{segment_size_bytes} bytes); give every replica the same segment_size_bytes")


def _text_error(name: str, value: str) -> InvalidArgument:
    """InvalidArgument for a str that UTF-8 cannot encode (a lone surrogate)."""
    return InvalidArgument(f"{name} {shown(value)} is not valid Unicode text (a lone surrogate "
                           "cannot be stored as UTF-8)")


def _check_tags(tags: str) -> None:
    """Refuse tags that no subscription could ever select (queries.parse_subscription
    splits on '||', strips each name, and reads '*' as every record)."""
    if "||" in tags or tags != tags.strip() or tags == "*":
        raise InvalidArgument(f"tags {shown(tags)} could never be selected by a subscription: "
                              "store tags without '||', surrounding spaces or a lone '*'")


def _check_read_arguments(topic: Any, queue_id: Any, offset: Any, max_count: Any,
                          max_bytes: Any) -> None:
    """get's and pull's arguments: a str topic and ints (both cores say the same)."""
    if not isinstance(topic, str):
        raise InvalidArgument(f"topic must be str, got {type(topic).__name__}")
    for name, value in (("queue_id", queue_id), ("offset", offset),
                        ("max_count", max_count), ("max_bytes", max_bytes)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidArgument(f"{name} must be an int, got {shown(value)}")
