"""Reading one queue partition: consume-queue entries, raw records, Arrow batches.

Theory of operation. ``read_queue`` is what a Spark task runs for a ``QueueRange`` (a
``QueueRanges`` partition, several small queues packed into one task, is read range
after range: see options.pack). It opens the store read-only (a snapshot: no lock,
beside a live writer, on a crashed copy) and never trusts more than the snapshot shows:
the range must lie within the queue's ``min_offset``/``max_offset`` there.

0. Same records. The planner read the range from its own snapshot, earlier; since then
   retention may have deleted its first records, or a truncation (or a replica's reset)
   cut or replaced its last ones. The range's ``marks`` (position and CRC32C of its
   first and last records, as planned) are checked against the segment files before
   reading (``_readable``) and the last one again after (``unchanged``): a log changes
   only at its ends, so while both stand every record between them is the one planned.
   Otherwise the read fails with ``StoreChanged``, as does an error met while reading
   when the marks moved meanwhile or the store's change count (``changes``, bumped
   before a truncation, reset or retention takes its first step) is not the planner's:
   the error came from the change, not from damage. The marks alone do not tell: a
   change in another process may have cut the queue's entries, or lowered what a
   snapshot opened during it holds, before it reaches the marked records.

1. Entries. The consume-queue entries of the range (docs/FORMAT.md: position, size,
   tag hash) are read with numpy straight from the queue's files, 20 bytes an entry.
   Only offsets the snapshot vouches for are read, so entries a live writer is adding
   are never looked at. A queue's records lie in the log in offset order, none
   overlapping the next, so entries must too (``_check_order``): an entry that points
   backwards, or into the record before it, is a ``ConsumeQueueMismatch`` before
   anything is read.
2. Bytes. Entries (read ``ENTRY_RECORDS`` at a time) are cut into chunks, one batch
   each. For each chunk the records are fetched with ``Store.read_raw`` — one C call per
   run of records, which checks every record's CRC32C and raises ``CorruptRecord`` on
   damage. Between two of the queue's records lie other queues' records (a gap): a gap
   is read through, in the same call, only when it is small — at most ``GAP_BYTES`` or
   the size of the record after it (``_read_through``) — so that what is read stays
   within twice the queue's own bytes plus ``GAP_BYTES`` a record, however many queues
   share the log (a queue of 64 written round-robin is not read through the other 63's
   records); a larger gap is skipped with a new call. A chunk holds at most
   ``CHUNK_RECORDS`` records and at most ``CHUNK_BYTES`` of bytes to read (its records
   and the gaps read through: ``_chunks``), at least one record; a segment's closing
   blank that ``read_raw`` adds after a run is cut off (``_read_run``). So no buffer of
   a chunk, joined or not, holds more than ``CHUNK_BYTES`` (or its one record), well
   within the int32 offsets of an Arrow binary column. The pieces the calls return are
   kept as they are (``Fetched``): joining them copies every byte, and is done only for
   a batch that needs one buffer. An entry whose position is not a record start
   (``read_raw`` refuses it) or whose record does not lie wholly in what was read is a
   ``ConsumeQueueMismatch`` too; a record whose CRC fails stays a ``CorruptRecord``.
3. Check and convert (``_convert``). When the chunk's records are all one size and lie
   back to back in each piece (fixed-size messages: the consume queue says so before
   anything is read), each piece is a matrix with a record per row; headers are a
   structured view of it and ``layout.build_row_batch`` cuts every field with one
   strided copy. Otherwise, or when the records' field sizes differ, the pieces are
   joined and ``layout.build_batch`` gathers headers and fields (Arrow ``take``). Either
   way, before a batch is yielded every header is checked against its entry (magic,
   position, size, queue, offset, topic), so an entry that points at the wrong record is
   an error (``ConsumeQueueMismatch``), never a silently wrong row.

Counters (records and bytes read, batches, calls) are kept per partition and, when the
``metricsDir`` option is set, written there as one JSON file per partition read.

Memory. Every batch allocates a few MB afresh (the bytes ``read_raw`` returns, the
columns), which glibc by default takes from and gives back to the kernel, so that each
batch's memory is page-faulted and zeroed again: a third of the reader's time.
``keep_freed_memory`` (called once per worker process) raises malloc's mmap and trim
thresholds, so freed batches are reused instead; the worker keeps at most about
``TRIM_BYTES`` of free heap.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import mqlog
from mqlog.engine.checkpoint import read_changes
from mqlog.engine.files import numbered_files
from mqlog.engine.store import Store, StorePaths
from mqlog.errors import ConsumeQueueMismatch, InvalidPosition, MqlogError, StoreChanged
from mqlog.spark_connector import layout
from mqlog.spark_connector.options import QueueRange
from mqlog.spark_connector.schema import ARROW_SCHEMA

ENTRY_RECORDS = 262_144  # consume-queue entries read at a time (5 MiB)
CHUNK_RECORDS = 65_536  # a batch (fewer, larger batches cost the JVM less per row)
CHUNK_BYTES = 16 << 20  # bytes a chunk reads at most: its records and the gaps read through
GAP_BYTES = 4 << 10  # a gap read through (one call) if at most this or its next record's size
ROWS_PER_PIECE = 16  # fixed-size records: matrices per piece while pieces hold this many
READ_BYTES_MAX = 32 << 20  # below the default read_size_bytes_max (64 MiB)
_TOMBSTONE = (1 << 64) - 1
MMAP_BYTES = 32 << 20  # allocations below this come from the heap (a batch's are)
TRIM_BYTES = 64 << 20  # free heap kept for the next batches
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # <malloc.h>


@dataclass
class Counters:
    """What one partition read did."""

    partition: str = ""
    records: int = 0
    bytes: int = 0
    batches: int = 0
    read_calls: int = 0
    stepped: int = 0  # commit-log mode: records walked over before the partition's start

    def save(self, directory: str | None) -> None:
        if directory is None:
            return
        os.makedirs(directory, exist_ok=True)
        name = os.path.join(directory, f"{uuid.uuid4().hex}.json")
        with open(name + ".tmp", "w") as out:
            json.dump(asdict(self), out)
        os.replace(name + ".tmp", name)


def load_counters(directory: str) -> list[dict]:
    """Every partition's counters left in ``directory``."""
    found = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json"):
            with open(os.path.join(directory, name)) as source:
                found.append(json.load(source))
    return found


@functools.cache
def keep_freed_memory() -> bool:
    """Tune glibc malloc so that freed batches are reused (see the module docstring);
    once per process. False where there is no glibc ``mallopt``."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_BYTES)) and \
        bool(mallopt(_M_TRIM_THRESHOLD, TRIM_BYTES))


def read_queue(part: QueueRange, counters: Counters,
               arrow: pa.Schema = ARROW_SCHEMA) -> Iterator[pa.RecordBatch]:
    """The records of ``part`` as Arrow batches, in offset order."""
    try:
        yield from _read_queue(part, counters, arrow)
    except (MqlogError, OSError) as error:
        if isinstance(error, StoreChanged) or (unchanged(part) and not changed_since(part)):
            raise
        under_way = " (a change was under way when it was planned: if its writer died " \
            "then, open the store for writing once)" if (part.changes or 0) % 2 else ""
        raise _changed(part, "records it was to read were replaced or deleted while it "
                       f"read them ({type(error).__name__}: {error}){under_way}") from error
    if not unchanged(part, last_only=True):  # a truncation under the read: rows of 2 logs
        raise _changed(part, "records it read were replaced (a truncation) while it read "
                       "them")


def _read_queue(part: QueueRange, counters: Counters,
                arrow: pa.Schema) -> Iterator[pa.RecordBatch]:
    with mqlog.open(part.path, read_only=True) as store:
        low, high = _readable(store, part)
        previous_end = 0  # where the record of the entry before ``start`` ends
        for start in range(low, high, ENTRY_RECORDS):
            entries = queue_entries(store, part.topic, part.queue_id, start,
                                    min(high, start + ENTRY_RECORDS))
            _check_order(entries, previous_end, part, start)
            previous_end = int(entries["position"][-1]) + int(entries["size"][-1])
            for chunk_start, chunk in _chunks(entries, start):
                try:
                    fetched = fetch(store, chunk, counters)
                except _BadEntry as bad:
                    _mismatch(part, chunk_start, chunk, bad.index, bad.reason)
                batch = _convert(fetched, chunk, part, chunk_start, arrow)
                counters.records += len(chunk)
                counters.batches += 1
                yield batch


def _readable(store: Store, part: QueueRange) -> tuple[int, int]:
    """The offsets of ``part`` that this snapshot holds: all of them, unless retention or
    a truncation took some since the planner saw them (then ``StoreChanged``; a lenient
    stream skips what retention took)."""
    low = store.min_offset(part.topic, part.queue_id)
    high = store.max_offset(part.topic, part.queue_id)
    if not part.marks and part.changes is None and not part.skip_lost:
        return max(part.start, low), min(part.end, high)  # unplanned: as the store is now
    if not part.marks and not part.skip_lost and changed_since(part):
        raise _changed(part, "its first or last record could not be marked when it was "
                       "planned (damaged, or being deleted by a change beside the planner), "
                       "and the store changed since, so its records cannot be checked"
                       + (": if a change's writer died then, open the store for writing once"
                          if (part.changes or 0) % 2 else ""))
    if low > part.start and not part.skip_lost:
        raise _changed(part, f"offsets [{part.start}, {min(low, part.end)}) were deleted "
                       "since (retention, or a replica's reset)")
    if high < part.end:
        raise _changed(part, f"offsets [{high}, {part.end}) are gone: the log was truncated "
                       "(or reset) since")
    if not unchanged(part, last_only=part.skip_lost):
        raise _changed(part, "records it was to read were replaced since (a truncation "
                       "and new writes)")
    return max(part.start, low), part.end


def unchanged(part: QueueRange, last_only: bool = False) -> bool:
    """Whether the records the planner marked (the range's first and last) are still in
    the segment files, at the same positions with the same CRC32C. A truncation cuts the
    log's tail, and retention its head: while both marks stand, every record between
    them is the one the planner saw (``last_only``: once read, retention may take them;
    a truncation below the last one would still show). Read from the files, not through
    a snapshot, whose mappings may still show a file that was deleted and written again."""
    for position, crc in part.marks[-1:] if last_only else part.marks:
        header = _header_on_disk(part.path, position)
        if header is None or int(header["position"]) != position or \
                int(header["crc"]) != crc or not layout.magic_ok(header):
            return False
    return True


def changed_since(part: QueueRange) -> bool:
    """Whether a change that cuts records ran on ``part``'s store, or was under way, since
    the planner looked (the change count: checkpoint.py). False when not known."""
    if part.changes is None:
        return False
    now = read_changes(StorePaths(Path(part.path)).changes)
    return part.changes % 2 == 1 or now != part.changes


def _header_on_disk(path: str, position: int) -> np.ndarray | None:
    """The record header at commit-log ``position`` of the store at ``path``, read from
    its segment file; None if there is none."""
    try:
        segments = [(base, file) for base, file in numbered_files(Path(path) / "commitlog")
                    if base <= position]
        if not segments:
            return None
        base, file = segments[-1]
        with open(file, "rb") as segment:
            raw = os.pread(segment.fileno(), layout.HEADER_SIZE, position - base)
    except OSError:
        return None
    if len(raw) < layout.HEADER_SIZE:
        return None
    return np.frombuffer(raw, layout.HEADER, count=1)[0]


def _changed(part: QueueRange, what: str) -> StoreChanged:
    return StoreChanged(f"mqlog source: the store {part.path} changed after this read was "
                        f"planned: in {part.topic}/{part.queue_id} (offsets {part.start} to "
                        f"{part.end - 1}), {what}; load the DataFrame again to read what it "
                        "holds now")


def _check_order(entries: np.ndarray, previous_end: int, part: QueueRange,
                 first_offset: int) -> None:
    """A queue's records lie in the log in offset order, each at least a header long
    and none overlapping the next: an entry that points backwards (or into the record
    before it) is wrong, and ``fetch`` relies on the order."""
    positions = entries["position"].astype(np.int64)
    sizes = entries["size"].astype(np.int64)
    starts_after = np.empty(len(entries), np.int64)  # where each record may start
    starts_after[0] = previous_end
    np.add(positions[:-1], sizes[:-1], out=starts_after[1:])
    good = (positions >= starts_after) & (sizes >= layout.HEADER_SIZE)
    if not good.all():
        bad = int(np.argmin(good))
        reason = "which is shorter than a record header" if sizes[bad] < layout.HEADER_SIZE \
            else f"which is before the end ({int(starts_after[bad])}) of the record of the " \
            f"entry before it (offset {first_offset + bad - 1}): one of the two is wrong"
        _mismatch(part, first_offset, entries, bad, reason)


def queue_entries(store: Store, topic: str, queue_id: int, low: int, high: int) -> np.ndarray:
    """Consume-queue entries of offsets [low, high), read from the queue's files."""
    parts = []
    for base, path in numbered_files(store.paths.queue_dir(topic, queue_id)):
        try:  # (retention or a truncation beside the read may delete a file listed: one
            # outside [low, high) changes nothing, one inside leaves entries missing below)
            count = os.path.getsize(path) // layout.CQ_ENTRY.itemsize
            first, last = max(low, base), min(high, base + count)
            if first < last:
                parts.append(np.fromfile(path, layout.CQ_ENTRY, count=last - first,
                                         offset=(first - base) * layout.CQ_ENTRY.itemsize))
        except FileNotFoundError:
            continue
    entries = parts[0] if len(parts) == 1 else \
        np.concatenate(parts) if parts else np.empty(0, layout.CQ_ENTRY)
    if len(entries) != high - low or (entries["size"] == 0).any() or \
            (entries["position"] == _TOMBSTONE).any():
        raise ConsumeQueueMismatch(f"consume queue {topic}/{queue_id} of {store.paths.root} "
                                   f"lacks entries in [{low}, {high}); open the store "
                                   "read-write once to rebuild it")
    return entries


def _read_through(entries: np.ndarray) -> np.ndarray:
    """Which gaps between consecutive entries' records (other queues' records, in log
    order as ``_check_order`` made sure) are read through rather than skipped with a new
    ``read_raw`` call: those of at most GAP_BYTES or the size of the record after them.
    Reading through a few KiB costs less than a call; a larger gap is read only when the
    record after it is as large, so the bytes read stay within twice the records' own
    plus GAP_BYTES a record (element ``i``: the gap before record ``i + 1``)."""
    positions = entries["position"].astype(np.int64)
    sizes = entries["size"].astype(np.int64)
    gaps = positions[1:] - (positions[:-1] + sizes[:-1])
    return gaps <= np.maximum(sizes[1:], GAP_BYTES)


def _chunks(entries: np.ndarray, start: int) -> Iterator[tuple[int, np.ndarray]]:
    """Cut entries into chunks of at most CHUNK_RECORDS records and CHUNK_BYTES of bytes
    to read: the records, and the gaps between them that ``fetch`` reads through (a
    chunk's first record starts a new call; at least one record a chunk)."""
    sizes = entries["size"].astype(np.int64)
    positions = entries["position"].astype(np.int64)
    gaps = np.zeros(len(entries), np.int64)  # gaps[i]: read before record i, if through
    np.subtract(positions[1:], positions[:-1] + sizes[:-1], out=gaps[1:])
    gaps[1:][~_read_through(entries)] = 0
    ends = np.cumsum(sizes + gaps)  # bytes read up to each record's end, all in one call
    index = 0
    while index < len(entries):
        before = (ends[index - 1] if index else 0) + gaps[index]  # (not read: a new call)
        stop = int(np.searchsorted(ends, before + CHUNK_BYTES, side="right"))
        stop = min(max(stop, index + 1), index + CHUNK_RECORDS)
        yield start + index, entries[index:stop]
        index = stop


@dataclass
class Fetched:
    """A chunk's records as ``read_raw`` returned them: ``pieces`` (one per call) and, for
    each record, the piece it is in and where it starts there. Joining the pieces is a
    copy of every byte, so it is done only when a batch needs one buffer."""

    pieces: list[bytes | memoryview]
    piece: np.ndarray
    local: np.ndarray

    @functools.cached_property
    def joined(self) -> tuple[bytes | memoryview, np.ndarray]:
        """One buffer holding every piece, and each record's start in it."""
        if len(self.pieces) == 1:
            return self.pieces[0], self.local
        lengths = np.fromiter((len(piece) for piece in self.pieces), np.int64,
                              len(self.pieces))
        joined_at = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        return b"".join(self.pieces), self.local + joined_at[self.piece]

    def rows(self, sizes: np.ndarray) -> list[np.ndarray] | None:
        """Each piece's records as the rows of a (records, size) uint8 matrix (views, no
        copy) when all are one size and lie back to back in their piece; else None. Also
        None when the pieces hold few records each (a queue whose records are scattered
        among other queues' is read a record or a few per call): a matrix each would
        cost more in Python than joining their few bytes (``ROWS_PER_PIECE``)."""
        if len(self.pieces) * ROWS_PER_PIECE > len(self.piece):
            return None
        size = int(sizes[0])
        same_piece = self.piece[1:] == self.piece[:-1]
        if (sizes != size).any() or (self.piece[1:] < self.piece[:-1]).any() or \
                (np.diff(self.local)[same_piece] != size).any():
            return None  # (entries out of order: left to the checks of the other path)
        counts = np.bincount(self.piece, minlength=len(self.pieces)).tolist()
        firsts = np.searchsorted(self.piece, np.arange(len(self.pieces))).tolist()
        matrices = []
        for piece, count, first in zip(self.pieces, counts, firsts, strict=True):
            at = int(self.local[first]) if count else 0
            if at + count * size > len(piece):
                return None
            matrices.append(np.frombuffer(piece, np.uint8, count * size, at)
                            .reshape(count, size))
        return matrices


class _BadEntry(Exception):
    """``fetch`` found that entry ``index`` cannot be right (``reason``)."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(index, reason)
        self.index = index
        self.reason = reason


def fetch(store: Store, entries: np.ndarray, counters: Counters) -> Fetched:
    """The bytes holding the records of ``entries`` (in log order, as ``_check_order``
    makes sure), in pieces (see ``Fetched``). Raises ``_BadEntry`` for an entry that
    does not point at a record start, or whose record is not wholly in what was read
    (past the log's end, or a size larger than its record's)."""
    positions = entries["position"].astype(np.int64)
    ends = positions + entries["size"].astype(np.int64)
    breaks = np.flatnonzero(~_read_through(entries)) + 1
    run_starts = np.concatenate(([0], breaks))
    run_stops = np.concatenate((breaks, [len(entries)]))
    pieces: list[bytes | memoryview] = []
    piece_bases: list[int] = []  # log position where each piece starts
    for first, last in zip(run_starts.tolist(), run_stops.tolist(), strict=True):
        _read_run(store, positions[first:last], first, int(ends[last - 1]), pieces,
                  piece_bases, counters)
    bases = np.asarray(piece_bases, np.int64)
    which = np.searchsorted(bases, positions, side="right") - 1
    counters.bytes += sum(len(piece) for piece in pieces)
    local = positions - bases[which]
    lengths = np.fromiter(map(len, pieces), np.int64, len(pieces))
    inside = local + entries["size"] <= lengths[which]
    if not inside.all():
        raise _BadEntry(int(np.argmin(inside)), "past the records read there")
    return Fetched(pieces, which, local)


def _read_run(store: Store, positions: np.ndarray, first: int, end: int,
              pieces: list[bytes | memoryview], piece_bases: list[int],
              counters: Counters) -> None:
    """read_raw from the run's first record to ``end``; read_raw stops at a segment's end
    (and at READ_BYTES_MAX), so go on from the next record not yet covered. A segment's
    closing blank that read_raw adds past ``end`` (up to the rest of the segment) is cut
    off, without a copy: a chunk's pieces hold no more than the chunk reads."""
    at = int(positions[0])
    while at < end:
        try:
            raw: bytes | memoryview = store.read_raw(at, min(end - at, READ_BYTES_MAX))
        except InvalidPosition as error:  # (a damaged record there is a CorruptRecord)
            raise _BadEntry(int(np.searchsorted(positions, at)) + first,
                            "which is not the start of a record it can read") from error
        counters.read_calls += 1
        assert raw, f"read_raw returned nothing at {at}"
        if len(raw) > end - at:
            raw = memoryview(raw)[:end - at]
        pieces.append(raw)
        piece_bases.append(at)
        covered = at + len(raw)
        if covered >= end:
            break
        following = int(np.searchsorted(positions, covered))
        if following >= len(positions):
            break
        at = int(positions[following])


def _check(head: layout.Fields, entries: np.ndarray, part: QueueRange,
           first_offset: int) -> None:
    expected = np.arange(first_offset, first_offset + len(entries), dtype=np.uint64)
    good = layout.magic_ok(head) & (head["position"] == entries["position"]) & \
        (head["total_size"] == entries["size"]) & (head["offset"] == expected) & \
        (head["queue_id"] == part.queue_id)
    if not good.all():
        _mismatch(part, first_offset, entries, int(np.argmin(good)))


def _mismatch(part: QueueRange, first_offset: int, entries: np.ndarray, bad: int,
              reason: str = "which holds another record") -> NoReturn:
    raise ConsumeQueueMismatch(
        f"consume queue {part.topic}/{part.queue_id} of {part.path}: the entry of offset "
        f"{first_offset + bad} points at position {int(entries['position'][bad])} (size "
        f"{int(entries['size'][bad])}), {reason}; open the store read-write once to "
        "rebuild its queues")


def _convert(fetched: Fetched, chunk: np.ndarray, part: QueueRange, first_offset: int,
             arrow: pa.Schema) -> pa.RecordBatch:
    """Check a chunk's records against their entries and build its batch.

    Records of one size lying back to back (fixed-size messages) are rows of a matrix
    per piece: headers and fields are strided numpy copies straight out of the pieces.
    Otherwise the pieces are joined and headers and fields are gathered (``layout``).
    """
    topic_size = len(part.topic.encode())
    rows = fetched.rows(chunk["size"])
    fields = None if rows is None else layout.row_headers(rows, topic_size)
    if fields is None:
        rows = None
        fields = layout.Fields(_headers(*fetched.joined, topic_size))
    _check(fields, chunk, part, first_offset)
    _check_topic(fetched, fields, part, first_offset, chunk)
    batch = None
    if rows is not None:
        batch = layout.build_row_batch(rows, fields, part.replica, arrow, part.topic)
    if batch is None:
        buffer, starts = fetched.joined
        batch = layout.build_batch(buffer, starts, part.replica, head=fields, schema=arrow,
                                   topic=part.topic)
    return batch


def _headers(buffer: bytes | memoryview, starts: np.ndarray, topic_size: int) -> np.ndarray:
    """The chunk's headers, each with the ``topic_size`` bytes after it (where the queue's
    topic should be) when those spans cannot overlap; plain headers otherwise (a record
    too short to hold the topic, which ``_check``/``_check_topic`` will report)."""
    ends = starts + (layout.HEADER_SIZE + topic_size)
    disjoint = ends[-1] <= len(buffer) and bool((ends[:-1] <= starts[1:]).all())
    return layout.headers(pa.py_buffer(buffer), starts, topic_size if disjoint else 0)


def _check_topic(fetched: Fetched, head: layout.Fields, part: QueueRange,
                 first_offset: int, entries: np.ndarray) -> None:
    """Every record's topic is the queue's (compared as bytes, in bulk): on the bytes
    gathered with the headers if they were, else cut out of the joined buffer."""
    name = part.topic.encode()
    same = (head["topic_size"] == len(name))
    if "tail" in head.names:
        same &= head["tail"] == name
        if same.all():
            return
    elif same.all():
        buffer, starts = fetched.joined
        at = starts + layout.HEADER_SIZE
        topics = layout.slice_binary(pa.py_buffer(buffer), at, at + head["topic_size"])
        if pc.all(pc.equal(topics, pa.scalar(name, pa.binary()))).as_py():
            return
    _mismatch(part, first_offset, entries, int(np.argmin(same)) if not same.all() else 0)
