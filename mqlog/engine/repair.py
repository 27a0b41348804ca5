"""Repair: mend a commit log damaged in the middle, which recovery refuses to open.

Recovery cuts only a damaged tail (DESIGN §4). Damage with intact records after it —
a flipped bit in an old segment, a segment file lost or cut — makes the store refuse to
open with a CorruptStore that sends the user here (``mqlog repair DIR``). Repair runs on
a closed store (it takes the store's lock) and does exactly this:

1. Survey. Every segment file is checked against its neighbour (a hole: missing, tiny
   or short segment files; a long one), and every segment is walked record by record
   (``format.walk``): each stretch from where a record should start to the next intact
   record is a damaged range. The end of the log is where recovery would end it: zeros
   where a record should start, or damage with nothing intact after it (a damaged tail
   is recovery's to cut; repair leaves it alone). But zeros with an intact record after
   them, before the saved flushed position or the checkpoint's, are damage (``Zeros``):
   nothing leaves zeros there (they were synced; a truncation lowers both first), and
   taking them for the end cut every acknowledged record after them. Walking the intact
   records also tells, for each queue, which offsets are missing between two records
   that survived.
2. From a replica (``--from REPLICA_DIR``, a store: else StoreNotFound, nothing done): a
   damaged range whose bytes in the replica's segment files are whole, intact records
   at exactly those positions (ending exactly at the range's end, or a blank that ends
   the segment) is copied from there, so nothing is lost, when the replica is this
   store's: the intact records next to the range are the same bytes in both
   (``_check_replica``; another store's records verify at their positions too, and one
   that differs refuses the repair, ReplicaDataRejected). What does not verify, or has
   nothing to compare, is blanked like the rest.
3. Blank fillers. The bytes of each remaining range are first saved to
   ``repair/<UTC time>/<start>-<end>`` (nothing is destroyed), then replaced by valid
   records: one *lost-record filler* per missing queue offset (attribute bit 1,
   ``format.ATTR_FILLER``: the record's topic, queue and offset, an empty body), so
   every queue keeps consecutive offsets and a consumer is told what it lost instead of
   stalling; then a control record (no queue sees it) over the rest, or the blank record
   that fills a segment's tail. Missing segment files are created, short ones extended,
   long ones cut to fit (their extra bytes saved too).
4. Derived files are dropped so that the next open rebuilds them from the mended log:
   the checkpoint, the queue manifest (every consume queue is rebuilt) and the key-index
   files (an entry could point into a mended range, where no record starts any more).

A log that ends before its saved flushed position (checkpoint.py) — acknowledged records
damaged or missing at its end, which recovery refuses too — is mended last: the range
is copied from the replica when its records there verify (whole records at exactly
those positions, segment by segment), else it is cut: its bytes are saved like the
others and the saved flushed position is lowered to where the log now ends, so the next
open cuts the tail and reports it. The report names the range and what was done.

Offsets lost at the very end of a queue (no record of that queue survived after them)
leave no trace in the log: the queue simply ends earlier, and the report says so when
the old queue manifest knew more. The report lists every range, how it was mended, and
the queue offsets lost.

Everything is planned before a byte of the log is written: the survey after the copies
from a replica, and the log's end after every mend (where the acknowledged tail starts),
walk the segments with each mended range read as the records that will replace it
(``walk``). A dry run plans the same way, over the segment files as they would be
(``Segment``), and stops there; so it reports exactly what the real repair does (it
used to take the damage it had not blanked for the log's end, and reported a cut of
every acknowledged record after it).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crc32c import crc32c

from mqlog import format as fmt
from mqlog.engine.checkpoint import (
    ChangeCount,
    FlushedPosition,
    read_checkpoint,
    read_flushed,
    read_queues,
)
from mqlog.engine.files import LockFile, LockHeld, file_name, fsync_directory, numbered_files
from mqlog.errors import CorruptStore, ReplicaDataRejected, StoreLocked, StoreNotFound


@dataclass
class Piece:
    """One damaged range inside one segment: [start, end) positions."""

    start: int
    end: int
    segment_end: bool  # the range reaches the segment's end (a blank closes it)
    epoch: int = 0  # of the intact record before it (else after it)
    timestamp: int = 0
    fillers: list[tuple[str, int, int]] = field(default_factory=list)  # (topic, queue, offset)
    how: str = "blank"  # "blank", or "replica" when copied from one
    # (position, size) of the nearest intact records before and after it in this store:
    # a replica's copy must hold the same records there (``_check_replica``)
    neighbours: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class Mend:
    """What replaces a piece: blank fillers (``replica`` None), or the replica's bytes
    there, which verified when planned (``crc``: their CRC32C then). The bytes are made or
    read when needed, not kept: a mend may be a whole segment."""

    piece: Piece
    replica: Path | None = None
    crc: int = 0

    def data(self, zeros: bool = True) -> bytes:
        """Its bytes (without ``zeros``: less the zeros after a closing blank's header,
        all a walk reads of it)."""
        if self.replica is None:
            return filler_bytes(self.piece, zeros)
        data = _replica_bytes(self.replica, self.piece)
        if data is None or crc32c(data) != self.crc:
            raise CorruptStore(
                f"the bytes of [{self.piece.start}, {self.piece.end}) in {self.replica} "
                "changed while repair read them (is that store open?); close it and run "
                "repair again")
        return data

    def check(self) -> None:
        """Raise now what ``data`` would raise for fillers that cannot fit."""
        if self.replica is None:
            _check_filler_room(self.piece)


@dataclass(frozen=True)
class Segment:
    """A segment file as repair leaves it: ``size`` bytes, the first ``kept`` of them
    those of the file ``source`` as it is now, the rest zeros (a file made anew, or
    extended). A real repair makes the files so before it reads them; a dry run reads
    them as they would be."""

    base: int
    size: int
    source: Path | None
    kept: int

    @contextlib.contextmanager
    def mapped(self) -> Iterator[Any]:
        """Its bytes, read-only (a mapping of the file, or of memory for a dry run's
        segment file that is not as it will be)."""
        if self.size == 0:  # (an empty last file: nothing to walk, nothing to map)
            yield b""
            return
        if self.source is not None and self.kept == self.size:
            with open(self.source, "rb") as file, \
                    mmap.mmap(file.fileno(), self.size, access=mmap.ACCESS_READ) as buffer:
                yield buffer
            return
        with mmap.mmap(-1, self.size) as buffer:  # (zeros: pages of it never written
            if self.source is not None:            # take no memory)
                with open(self.source, "rb") as file:
                    file.readinto(memoryview(buffer)[:self.kept])  # type: ignore[arg-type]
            yield buffer


@dataclass
class Lost:
    """Offsets of one queue that no intact record holds, between two that survived."""

    topic: str
    queue_id: int
    first: int  # the first offset lost
    count: int
    after: int  # position of the last intact record of the queue before them (-1: none,
    #             the queue's head was lost, below the first offset the manifest knew)
    before: int  # position of the first intact record of the queue after them


@dataclass
class RepairReport:
    pieces: list[Piece] = field(default_factory=list)
    lost: list[Lost] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # segment files created, extended, cut
    saved_to: Path | None = None
    queue_tails_lost: list[str] = field(default_factory=list)
    # [start, end) of acknowledged records damaged at the log's end, and what was done
    acknowledged_tail: tuple[int, int, str] | None = None

    @property
    def clean(self) -> bool:
        return not self.pieces and not self.files and self.acknowledged_tail is None

    def lines(self) -> list[str]:
        out = list(self.files)
        if self.acknowledged_tail is not None:
            start, end, how = self.acknowledged_tail
            out.append(f"[{start}, {end}): {end - start} bytes of records acknowledged as "
                       f"flushed, damaged at the log's end: {how}")
        for piece in self.pieces:
            what = "copied from the replica" if piece.how == "replica" else (
                f"blanked, {len(piece.fillers)} lost-record filler(s)")
            out.append(f"[{piece.start}, {piece.end}): {piece.end - piece.start} bytes {what}")
        for lost in self.lost:
            last = lost.first + lost.count - 1
            out.append(f"lost {lost.topic}/{lost.queue_id} offsets {lost.first}..{last}")
        out += self.queue_tails_lost
        if self.saved_to is not None:
            out.append(f"the bytes replaced are saved in {self.saved_to}")
        return out


def repair(root: Path, replica: Path | None = None, dry_run: bool = False) -> RepairReport:
    """Mend the store in ``root`` (closed); see the module docstring."""
    if not (root / "meta.json").is_file() or not (root / "commitlog").is_dir():
        raise StoreNotFound(f"{root} is not an mqlog store (no meta.json or commitlog/)")
    if replica is not None and (not (replica / "meta.json").is_file()
                                or not (replica / "commitlog").is_dir()):
        raise StoreNotFound(f"the replica {replica} (--from) is not an mqlog store (no "
                            "meta.json or commitlog/); nothing was done")
    lock = _take_lock(root)
    changes = None
    try:
        # (readers in other processes, the Spark source's, may be reading: a change to
        # them)
        changes = None if dry_run else ChangeCount(root / "changes")
        with changes.changing() if changes is not None else contextlib.nullcontext():
            return _repair(root, replica, dry_run)
    finally:
        if changes is not None:
            changes.close()
        lock.release()


def _repair(root: Path, replica: Path | None, dry_run: bool) -> RepairReport:
    """``repair``'s work, under its lock and (unless a dry run) the change count: the
    plan first, then (unless a dry run) the writes, so a dry run says what they do."""
    report = RepairReport()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    saved = root / "repair" / stamp
    holes, layout = _mend_files(root, report, saved, dry_run)
    checkpoint = read_checkpoint(root / "checkpoint")
    flushed_to = max(read_flushed(root / "flushed") or 0,
                     0 if checkpoint is None else checkpoint.log_position)
    heads = {key: low for key, (low, _high) in (read_queues(root / "queues") or {}).items()}
    pieces, lost, last_offsets = survey(layout, holes, None, flushed_to, heads)
    copies: dict[int, Mend] = {}
    if replica is not None and pieces:
        for piece in pieces:
            mend = _replica_mend(replica, piece, layout)
            if mend is not None:
                piece.how = "replica"
                copies[piece.start] = mend
        if copies:  # (the log as it is once they are copied: they hold records)
            report.pieces += [piece for piece in pieces if piece.start in copies]
            pieces, lost, last_offsets = survey(layout, holes, copies, flushed_to, heads)
    _place_fillers(pieces, lost)
    blanked = {piece.start: Mend(piece) for piece in pieces}
    for mend in blanked.values():
        mend.check()  # (a range too short for a filler: refused before anything is written)
    # (after the ranges intact records follow are mended: what is left is the end)
    tail = _plan_acknowledged_tail(root, layout, {**copies, **blanked}, replica)
    report.acknowledged_tail = None if tail is None else tail[:3]
    report.pieces = sorted(report.pieces + pieces, key=lambda piece: piece.start)
    report.lost = lost
    if not report.clean:
        report.queue_tails_lost = _queue_tails(root, last_offsets)
    if dry_run:
        return report
    for mend in [*copies.values(), *blanked.values()]:
        _write(root, mend.piece.start, mend.data(), saved)
    if tail is not None:
        _mend_acknowledged_tail(root, tail, saved)
    if not report.clean:
        _drop_derived(root)
        report.saved_to = saved if saved.exists() else None
    return report


def _take_lock(root: Path) -> LockFile:
    try:  # (writing nothing in it: a dry run changes no byte of the store)
        return LockFile.take(root / "lock", None)
    except LockHeld as held:
        raise StoreLocked(f"store {root} is open (pid {held.holder}); close it before "
                          "repairing it") from None


# --- 1. the survey ---------------------------------------------------------------------


Survey = tuple[list["Piece"], list["Lost"], dict[tuple[str, int], tuple[int, int]]]


def survey(layout: list[Segment], holes: list[tuple[int, int]],
           mends: dict[int, Mend] | None = None, flushed_to: int = 0,
           heads: dict[tuple[str, int], int] | None = None) -> Survey:
    """The damaged ranges before the log's end, the queue offsets missing between intact
    records, and each queue's last (offset, position) (see the module docstring), in the
    segment files of ``layout`` (contiguous), with the ranges of ``mends`` (by start)
    holding their records. Zeros where a record should start are damage, not the log's
    end, inside ``holes`` (bytes repair adds), and before ``flushed_to`` (the saved
    flushed position or the checkpoint's, the further) when an intact record follows
    them (``Zeros``). A queue whose first intact record comes after damage and has an
    offset above its first one in ``heads`` (the old queue manifest's) lost its head
    there (``Lost.after`` -1)."""
    pieces: list[Piece] = []
    lost: list[Lost] = []
    last_seen: dict[tuple[str, int], tuple[int, int]] = {}  # queue -> (offset, position)
    previous: fmt.RecordHeader | None = None
    before: tuple[int, int] | None = None  # this store's last intact record
    after: list[Piece] = []  # the pieces since
    zeros = Zeros(layout, holes, flushed_to)
    for index, segment in enumerate(layout):
        base = segment.base
        with segment.mapped() as buffer:
            for step, data, at in walk(buffer, base, mends or {}, zeros.at(index)):
                position = base + step.offset
                if step.kind == "damage":
                    pieces.append(Piece(position, position + step.size,
                                        step.offset + step.size == len(buffer)))
                    if before is not None:
                        pieces[-1].neighbours.append(before)
                elif step.kind == "record":
                    previous = _note_record(step, data, at, pieces, previous, last_seen, lost,
                                            heads or {})
                    if data is buffer:  # (one of this store's, not a mend's)
                        before = (position, step.size)
                        for piece in after:
                            piece.neighbours.append(before)
                        after = []
                if step.kind == "damage":
                    after.append(pieces[-1])
                elif step.kind == "end":
                    return _before_end(pieces, previous), lost, last_seen
    return _before_end(pieces, previous), lost, last_seen


class Zeros:
    """Which zeros where a record should start are damage rather than the log's end, and
    how far such a stretch goes: zeros inside ``holes`` (to the segment's end), and zeros
    before ``flushed_to`` that an intact record follows, in their segment or a later one
    (to that record, or the segment's end). Nothing leaves zeros there: bytes before the
    saved flushed position or the checkpoint's were synced, and a truncation (whose
    crash leaves zeros with intact records after them, to be cut) lowers both first."""

    def __init__(self, layout: list[Segment], holes: list[tuple[int, int]],
                 flushed_to: int) -> None:
        self.layout, self.holes, self.flushed_to = layout, holes, flushed_to
        self._later: dict[int, bool] = {}  # segment index -> an intact record after it

    def at(self, index: int) -> Any:
        """``walk``'s ``zeros`` for the segment ``layout[index]``."""
        base = self.layout[index].base

        def stretch(buffer: Any, offset: int) -> int | None:
            position = base + offset
            if any(low <= position < high for low, high in self.holes):
                return len(buffer)
            if position >= self.flushed_to:
                return None
            following = fmt.find_intact(buffer, base, offset + 1)
            if following is not None:
                return following
            return len(buffer) if self._intact_after(index) else None

        return stretch

    def _intact_after(self, index: int) -> bool:
        if index not in self._later:
            found = False
            for segment in self.layout[index + 1:]:
                with segment.mapped() as buffer:
                    found = fmt.find_intact(buffer, segment.base, 0) is not None
                if found:
                    break
            self._later[index] = found
        return self._later[index]


def walk(buffer: Any, base: int, mends: dict[int, Mend],
         zeros: Any = None) -> Iterator[tuple[fmt.Step, Any, int]]:
    """``format.walk`` over a segment as repair leaves it: where a stretch that is not a
    record starts at a mend's position, the mend's records (and closing blank) instead,
    then on from its end; zeros that ``zeros(buffer, offset)`` says are damage (it
    returns where they end; None: they end the log) as a damaged stretch, then on from
    its end. Yields each step, and the buffer and offset its bytes are at."""
    offset = 0
    while offset < len(buffer):
        for step in fmt.walk(buffer, base, offset):
            stop = None
            if step.kind == "end" and zeros is not None:
                stop = zeros(buffer, step.offset)
                if stop is not None:
                    step = step._replace(kind="damage", size=stop - step.offset)
            mend = None if step.kind == "record" else mends.get(base + step.offset)
            if mend is not None:
                yield from _mended_steps(mend.data(zeros=False), step.offset)
                offset = step.offset + mend.piece.end - mend.piece.start
                break
            yield step, buffer, step.offset
            if stop is not None:
                offset = stop
                break
        else:
            return


def _mended_steps(data: bytes, offset: int) -> Iterator[tuple[fmt.Step, Any, int]]:
    """The steps of a mend's bytes (whole, intact records, then perhaps the blank that
    ends the segment) placed at ``offset`` of their segment."""
    at = 0
    while at < len(data):
        size, magic = fmt.BLANK.unpack_from(data, at)
        if magic == fmt.BLANK_MAGIC:
            yield fmt.Step(offset + at, "blank", size, None), data, at
            return
        header = fmt.RecordHeader._make(fmt.RECORD_HEADER.unpack_from(data, at))
        yield fmt.Step(offset + at, "record", size, header), data, at
        at += size


def _note_record(step: fmt.Step, data: Any, at: int, pieces: list[Piece],
                 previous: fmt.RecordHeader | None,
                 last_seen: dict[tuple[str, int], tuple[int, int]],
                 lost: list[Lost], heads: dict[tuple[str, int], int]) -> fmt.RecordHeader:
    header = step.header
    assert header is not None
    for piece in pieces:  # stamp the pieces before this record with a fitting epoch
        if piece.end <= header.position and (previous is None or piece.start > previous.position):
            piece.epoch, piece.timestamp = (previous or header).epoch, \
                (previous or header).store_timestamp
    if not header.control:
        start = at + fmt.RECORD_HEADER_SIZE
        topic = bytes(data[start:start + header.topic_size]).decode(errors="replace")
        key = (topic, header.queue_id)
        seen = last_seen.get(key)
        if seen is not None and header.queue_offset > seen[0] + 1:
            lost.append(Lost(topic, header.queue_id, seen[0] + 1,
                             header.queue_offset - seen[0] - 1, seen[1], header.position))
        elif seen is None and pieces and header.queue_offset > heads.get(key, 1 << 63):
            first = heads[key]  # (its head was in the damage before it)
            lost.append(Lost(topic, header.queue_id, first, header.queue_offset - first, -1,
                             header.position))
        last_seen[key] = (header.queue_offset, header.position)
    return header


def _before_end(pieces: list[Piece], last: fmt.RecordHeader | None) -> list[Piece]:
    """The pieces an intact record follows (the others are a damaged tail)."""
    if last is None:
        return []
    return [piece for piece in pieces if piece.start < last.position]


# --- 2. from a replica -------------------------------------------------------------------


def _replica_mend(replica: Path, piece: Piece, layout: list[Segment]) -> Mend | None:
    """A mend that copies ``piece`` from the replica, if its bytes there verify and the
    replica holds this store's records next to it (``_check_replica``)."""
    known = _check_replica(replica, piece, layout)  # (first: a wrong replica is refused)
    data = _replica_bytes(replica, piece)
    return None if data is None or not known else Mend(piece, replica, crc32c(data))


def _check_replica(replica: Path, piece: Piece, layout: list[Segment]) -> bool:
    """Whether the replica is a copy of this store around ``piece``: each intact record
    next to it here (``piece.neighbours``) is byte for byte the replica's at the same
    position, where the replica holds an intact record there. Records that verify
    (whole, CRC32C, position) are not evidence enough: another store's records (another
    partition's, a diverged log's) verify at their own positions too. ReplicaDataRejected
    if one differs (nothing is done: the replica is the wrong one); False if there was
    nothing to compare (the piece is blanked, not copied on trust)."""
    compared = 0
    for position, size in piece.neighbours:
        theirs = _read(replica, position, size)
        if theirs is None or fmt.check_record(theirs, position):
            continue  # (the replica lacks it, or has it damaged: no evidence either way)
        ours = _layout_bytes(layout, position, size)
        if theirs != ours:
            raise ReplicaDataRejected(
                position, f"{replica} (--from) is not a replica of this store: its intact "
                f"record at position {position}, next to the damaged range [{piece.start}, "
                f"{piece.end}), differs from this store's, so its records in the range "
                "would not be this store's; nothing was done. Name a replica of this "
                "store (its group's other replica, or a backup of it), or repair without "
                "--from")
        compared += 1
    return compared > 0


def _read(store: Path, position: int, size: int) -> bytes | None:
    """The bytes [position, +size) of a store's segment files (None: not all there)."""
    for base, path in numbered_files(store / "commitlog"):
        if base <= position and position + size <= base + path.stat().st_size:
            with open(path, "rb") as file:
                file.seek(position - base)
                return file.read(size)
    return None


def _layout_bytes(layout: list[Segment], position: int, size: int) -> bytes:
    """The bytes [position, +size) of the segment files as repair leaves them."""
    for segment in layout:
        if segment.base <= position and position + size <= segment.base + segment.size:
            with segment.mapped() as buffer:
                return bytes(buffer[position - segment.base:position - segment.base + size])
    raise AssertionError(f"no segment holds [{position}, {position + size})")


def _replica_bytes(replica: Path, piece: Piece) -> bytes | None:
    for base, path in numbered_files(replica / "commitlog"):
        size = path.stat().st_size
        if not base <= piece.start < base + size:
            continue
        if piece.end > base + size or (piece.segment_end and piece.end != base + size):
            return None  # laid out differently there: nothing to trust
        with open(path, "rb") as file:
            file.seek(piece.start - base)
            data = file.read(piece.end - piece.start)
        at = 0
        while at < len(data):  # whole intact records at exactly these positions
            length, magic = fmt.BLANK.unpack_from(data, at) if len(data) - at >= 8 else (0, 0)
            if magic == fmt.BLANK_MAGIC and piece.segment_end and at + length == len(data):
                return data
            if length < fmt.RECORD_HEADER_SIZE or at + length > len(data) or \
                    fmt.check_record(data[at:at + length], piece.start + at):
                return None
            at += length
        return data
    return None


Tail = tuple[int, int, str, list[Piece], list[Mend]]


def _plan_acknowledged_tail(root: Path, layout: list[Segment], mends: dict[int, Mend],
                            replica: Path | None) -> Tail | None:
    """Where the log, once ``mends`` are written, ends before the saved flushed position
    (see the module docstring), and what is done there: its pieces are copied from the
    replica (the mends returned) or cut. None if it does not."""
    acknowledged = read_flushed(root / "flushed")
    end, last = _log_end(layout, mends)
    if acknowledged is None or end >= acknowledged:
        return None
    pieces = _segment_pieces(layout, end, acknowledged)
    for piece in pieces:
        piece.neighbours = [] if last is None else [last]
    copies = [] if replica is None else [_replica_mend(replica, piece, layout)
                                         for piece in pieces]
    if pieces and copies and all(mend is not None for mend in copies):
        return end, acknowledged, "copied from the replica", pieces, \
            [mend for mend in copies if mend is not None]
    return end, acknowledged, (
        "cut: the next open cuts the log there and reports it" + (
            " (the replica's bytes there did not verify)" if replica is not None else "")), \
        pieces, []


def _mend_acknowledged_tail(root: Path, tail: Tail, saved: Path) -> None:
    """Copy the pieces of an acknowledged tail from the replica, or cut them: their bytes
    (which the next open zeroes) saved first, and the saved flushed position lowered."""
    end, _acknowledged, _how, pieces, copies = tail
    if copies:
        for mend in copies:
            _write(root, mend.piece.start, mend.data(), saved)
        return
    for piece in pieces:
        _write(root, piece.start, None, saved, piece.end - piece.start)
    FlushedPosition(root / "flushed", end, 0, threaded=False).close()


def _log_end(layout: list[Segment],
             mends: dict[int, Mend]) -> tuple[int, tuple[int, int] | None]:
    """Where recovery would end the log once ``mends`` are written: after the last intact
    record (or blank) that no damage or zeros come before; and the (position, size) of
    the last intact record of this store's own (not a mend's) before it."""
    end = 0
    last = None
    for segment in layout:
        end = segment.base
        with segment.mapped() as buffer:
            for step, data, _at in walk(buffer, segment.base, mends):
                if step.kind not in ("record", "blank"):
                    return segment.base + step.offset, last
                if step.kind == "record" and data is buffer:
                    last = (segment.base + step.offset, step.size)
                end = segment.base + step.offset + step.size
    return end, last


def _segment_pieces(layout: list[Segment], start: int, end: int) -> list[Piece]:
    """[start, end) split at segment boundaries, as pieces (empty if a segment file that
    should hold part of it is missing)."""
    pieces = []
    for segment in layout:
        limit = segment.base + segment.size
        if limit <= start or segment.base >= end:
            continue
        low, high = max(start, segment.base), min(end, limit)
        pieces.append(Piece(low, high, high == limit))
    covered = sum(piece.end - piece.start for piece in pieces)
    return pieces if covered == end - start else []


# --- 3. blank fillers ----------------------------------------------------------------------


def _place_fillers(pieces: list[Piece], lost: list[Lost]) -> None:
    """Give each lost offset a filler in a piece between its queue's neighbours. A
    queue's lost head gets as many as fit, for its last offsets (the manifest's first
    offset may be stale, lower than retention left it: the queue then starts later)."""
    for gap in lost:
        size = fmt.RECORD_HEADER_SIZE + len(gap.topic.encode())
        offset = gap.first
        if gap.after < 0:
            room = sum(_room(piece) // size for piece in pieces if piece.start < gap.before)
            offset = max(gap.first, gap.first + gap.count - room)
        for piece in pieces:
            if not gap.after < piece.start < gap.before:
                continue
            while offset < gap.first + gap.count and _room(piece) >= size:
                piece.fillers.append((gap.topic, gap.queue_id, offset))
                offset += 1
        if offset < gap.first + gap.count:
            raise CorruptStore(f"no room to keep offsets {offset}.. of queue {gap.topic}/"
                               f"{gap.queue_id} consecutive; copy the damaged range from a "
                               "replica (--from), or restore the store from a backup")


def _room(piece: Piece) -> int:
    """Bytes left in a piece for more fillers (a closing blank, or a control record or
    nothing, must still fit after them)."""
    used = sum(fmt.RECORD_HEADER_SIZE + len(topic.encode()) for topic, _, _ in piece.fillers)
    left = piece.end - piece.start - used
    return left - fmt.BLANK_SIZE_MIN if piece.segment_end else left


def encode_filler(position: int, size: int, piece: Piece, topic: str = "", queue_id: int = 0,
                  offset: int = 0, control: bool = True) -> bytes:
    """One filler record of exactly ``size`` bytes at ``position``."""
    topic_bytes = topic.encode()
    body_size = size - fmt.RECORD_HEADER_SIZE - len(topic_bytes)
    assert body_size >= 0
    record = bytearray(size)
    attributes = fmt.ATTR_CONTROL if control else fmt.ATTR_FILLER
    fmt.RECORD_HEADER.pack_into(record, 0, size, fmt.RECORD_MAGIC, 0, attributes,
                                len(topic_bytes), queue_id, body_size, piece.epoch, offset,
                                position, piece.timestamp, piece.timestamp, 0, 0, 0)
    record[fmt.RECORD_HEADER_SIZE:fmt.RECORD_HEADER_SIZE + len(topic_bytes)] = topic_bytes
    fmt.seal_record(record)
    return bytes(record)


def filler_bytes(piece: Piece, zeros: bool = True) -> bytes:
    """What replaces a piece: its lost-record fillers, then a control record or a blank
    (without ``zeros``: its header only, not the zeros after it)."""
    out = bytearray()
    for size, (topic, queue_id, offset) in zip(_check_filler_room(piece), piece.fillers,
                                               strict=True):
        out += encode_filler(piece.start + len(out), size, piece, topic, queue_id, offset,
                             control=False)
    rest = piece.end - piece.start - len(out)
    if piece.segment_end:
        out += fmt.BLANK.pack(rest, fmt.BLANK_MAGIC)
        if zeros:
            out += bytes(rest - fmt.BLANK_SIZE_MIN)
    elif rest:
        out += encode_filler(piece.start + len(out), rest, piece)
    return bytes(out)


def _check_filler_room(piece: Piece) -> list[int]:
    """The sizes of a piece's lost-record fillers; CorruptStore if what is left after them
    is too short for the control record that must close the piece."""
    sizes: list[int] = []
    for index, (topic, _queue_id, _offset) in enumerate(piece.fillers):
        size = fmt.RECORD_HEADER_SIZE + len(topic.encode())
        rest = piece.end - piece.start - sum(sizes) - size
        last = index == len(piece.fillers) - 1
        if last and not piece.segment_end and 0 < rest < fmt.RECORD_HEADER_SIZE:
            size += rest  # too little left for a control record: the last filler grows
        sizes.append(size)
    rest = piece.end - piece.start - sum(sizes)
    if not piece.segment_end and 0 < rest < fmt.RECORD_HEADER_SIZE:
        raise CorruptStore(f"the damaged range [{piece.start}, {piece.end}) is too short "
                           "for a filler record; restore the store from a replica")
    return sizes


def _write(root: Path, position: int, data: bytes | None, saved: Path,
           size: int = 0) -> None:
    """Save the bytes at [position, +len(data)) under ``saved``, then overwrite them
    (``data`` None: save ``size`` bytes only)."""
    for base, path in numbered_files(root / "commitlog"):
        if base <= position < base + path.stat().st_size:
            break  # (``size`` is the caller's: what to save when ``data`` is None)
    else:
        raise AssertionError(f"no segment holds position {position}")
    with open(path, "r+b") as file:
        file.seek(position - base)
        old = file.read(size if data is None else len(data))
        saved.mkdir(parents=True, exist_ok=True)
        (saved / f"{position}-{position + len(old)}").write_bytes(old)
        fsync_directory(saved)
        if data is None:
            return
        file.seek(position - base)
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


# --- segment files, derived files ------------------------------------------------------------


def _mend_files(root: Path, report: RepairReport, saved: Path,
                dry_run: bool) -> tuple[list[tuple[int, int]], list[Segment]]:
    """Make the segment files contiguous: create missing ones, extend short ones (with
    zeros, blanked later), cut long ones; tiny ones are moved into ``saved`` and made
    anew. Returns the position ranges of the bytes added, and the segment files as they
    are now (a dry run: as they would be)."""
    directory = root / "commitlog"
    found = numbered_files(directory)
    holes = []
    planned = []  # (base, size, the file's bytes kept: from the start, the rest zeros)
    for index, (base, path) in enumerate(found):
        size = path.stat().st_size
        if index == len(found) - 1:
            planned.append((base, size, size))
            continue
        following = found[index + 1][0]
        if size < mmap.PAGESIZE:
            report.files.append(f"segment {path.name}: {size} bytes, moved aside and "
                                f"made anew for [{base}, {following})")
            holes.append((base, following))
            planned.append((base, following - base, 0))
            if not dry_run:
                saved.mkdir(parents=True, exist_ok=True)
                os.replace(path, saved / path.name)
                _zero_file(path, following - base)
        elif base + size < following and _closed(base, path):
            name = file_name(base + size)  # whole, then a missing file
            report.files.append(f"segment {name}: made anew for [{base + size}, {following})"
                                ", which no file held")
            holes.append((base + size, following))
            planned += [(base, size, size), (base + size, following - base - size, 0)]
            if not dry_run:
                _zero_file(directory / name, following - base - size)
        elif base + size < following:
            report.files.append(f"segment {path.name}: extended by {following - base - size} "
                                f"bytes (positions [{base + size}, {following}) were in no "
                                "file)")
            holes.append((base + size, following))
            planned.append((base, following - base, size))
            if not dry_run:
                _zero_file(path, following - base)
        elif base + size > following:
            report.files.append(f"segment {path.name}: cut by {base + size - following} "
                                "bytes that overlapped the next segment")
            planned.append((base, following - base, following - base))
            if not dry_run:
                _cut(path, following - base, saved)
        else:
            planned.append((base, size, size))
    if not dry_run:
        fsync_directory(directory)
        return holes, [Segment(base, path.stat().st_size, path, path.stat().st_size)
                       for base, path in numbered_files(directory)]
    return holes, [Segment(base, size, directory / file_name(base) if kept else None, kept)
                   for base, size, kept in planned]


def _closed(base: int, path: Path) -> bool:
    """Whether a segment file ends as a whole segment does: with a blank over its tail."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
        last = deque(fmt.walk(buffer, base), maxlen=1)
        return bool(last) and last[0].kind == "blank"


def _zero_file(path: Path, size: int) -> None:
    """Create or extend a file to ``size`` bytes; what is added reads as zeros."""
    with open(path, "ab") as file:
        file.truncate(size)
        os.fsync(file.fileno())


def _cut(path: Path, size: int, saved: Path) -> None:
    with open(path, "r+b") as file:
        file.seek(size)
        saved.mkdir(parents=True, exist_ok=True)
        (saved / f"{path.name}-past-{size}").write_bytes(file.read())
        file.truncate(size)
        os.fsync(file.fileno())


def _queue_tails(root: Path, last_offsets: dict[tuple[str, int], tuple[int, int]]) -> list[str]:
    """Queues the old manifest says went further than their last intact record."""
    manifest = read_queues(root / "queues") or {}
    out = []
    for key, (_low, high) in sorted(manifest.items()):
        last = last_offsets.get(key, (-1, 0))[0]
        if high > last + 1:
            out.append(f"queue {key[0]}/{key[1]}: the manifest said it reached offset "
                       f"{high - 1}, its last intact record has offset {last}: offsets "
                       f"{last + 1}..{high - 1} are lost")
    return out


def _drop_derived(root: Path) -> None:
    """The checkpoint, queue manifest and key-index files go: the next open rescans the
    log and rebuilds them (an index entry may point into a mended range, where no record
    starts any more)."""
    for name in ("checkpoint", "queues"):
        (root / name).unlink(missing_ok=True)
    for _, path in numbered_files(root / "index"):
        path.unlink()
    (root / "abort").touch()  # recovery, not a clean open
    fsync_directory(root)
