"""Read-only access to a store's commit log: no lock, no recovery, no writes.

``LogReader`` is what ``mqlog dump``, ``mqlog verify`` and ``mqlog consume --follow``
stand on. It maps each segment file (``commitlog/<20-digit base>``) with
``mmap.ACCESS_READ``, so it works while another process has the store open and it can
never change a byte, and it walks the records of a segment in position order, checking
each one as recovery does (docs/FORMAT.md, "Commit log: the record"):

* the magic is ``MQR\\x01``; the size covers at least a header, the field sizes add up
  to it, and the record leaves room for a blank record in its segment;
* the position stored in the record is where it was found;
* the CRC32C stored at bytes ``[8, 12)`` matches bytes ``[12, total_size)``.

A walk through one segment stops at one of three things:

* a blank record (magic ``MQB\\x01``) reaching exactly the segment's end: the walk
  continues at the next segment, which must start where this one ends;
* eight zero bytes where a header should be: the end of the data. In a closed store
  everything after it (the rest of this segment, and any later, prepared segment) must
  be zeros too; ``verify`` checks that, the other walks simply stop there;
* anything else: a ``Problem(position, reason)``.

A store that is open elsewhere may be writing the record at the end of the log while
it is read, so a problem at the very end is not necessarily damage: ``read_batch``
(the follower's call) reports it and lets its caller retry; ``verify`` and ``records``
are meant for stores at rest and treat it as corruption.

The walking loop is Python; it unpacks one header and computes one CRC32C (in C, on a
memoryview of the mapping: no copy) per record, and copies a record's bytes only when
it hands out a ``Record``.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from crc32c import crc32c

from mqlog import ext
from mqlog import format as fmt
from mqlog.engine.checkpoint import read_flushed
from mqlog.engine.files import numbered_files
from mqlog.errors import CorruptRecord, InvalidArgument

_core = ext.load()
_HEADER = fmt.RECORD_HEADER
_HEADER_SIZE = fmt.RECORD_HEADER_SIZE
_CRC_START = fmt.CRC_START
_MAGIC = fmt.RECORD_MAGIC
_BLANK_MAGIC = fmt.BLANK_MAGIC
_BLANK = fmt.BLANK
_BLANK_SIZE_MIN = fmt.BLANK_SIZE_MIN
_Record = _core.Record

_END = "end"  # zero bytes: the end of the data
_BLANK_STOP = "blank"  # a blank record fills the segment's tail
_MORE = ""  # the walk stopped because it had done what was asked
_CHUNK_RECORDS = 4096  # records walked between two progress reports
_ZERO_CHUNK_BYTES = 8 << 20
_ZEROS = bytes(_ZERO_CHUNK_BYTES)


class Problem(NamedTuple):
    """Where the first bad bytes are, and what is wrong with them."""

    position: int
    reason: str


class VerifyReport(NamedTuple):
    record_count: int  # records whose checks passed
    bytes_checked: int  # every byte examined: records, blank records, zero tails
    problem: Problem | None  # the first damage found; None when the log is clean
    segment_count: int = 0
    end_position: int = 0  # where the good records end


class Batch(NamedTuple):
    records: list  # Records, in position order
    next_position: int  # where the next read_batch continues
    problem: Problem | None  # why the walk stopped early, if it did


class SegmentFile(NamedTuple):
    base: int  # the segment's first position (its file name)
    path: Path
    size: int  # bytes, the file's size


class LogReader:
    """The commit log of the store in directory ``path``, read-only."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.root = Path(path)
        self.directory = self.root / "commitlog"
        if not self.directory.is_dir():
            raise InvalidArgument(f"{self.root} is not an mqlog store (it has no commitlog "
                                  "directory)")

    def saved_flushed_position(self) -> int:
        """How far the store last said its log was flushed (its ``flushed`` file; 0 if
        it says nothing): a problem below it is damage, never a record being written."""
        return read_flushed(self.root / "flushed") or 0

    def segments(self) -> list[SegmentFile]:
        """The segment files as they are now, by base position."""
        found = []
        for base, path in numbered_files(self.directory):
            try:
                found.append(SegmentFile(base, path, path.stat().st_size))
            except FileNotFoundError:
                continue  # a prepared segment its store discarded as it closed
        return found

    def segment_of(self, position: int) -> int | None:
        """Base of the segment holding ``position`` (None if no segment does)."""
        for segment in self.segments():
            if segment.base <= position < segment.base + segment.size:
                return segment.base
        return None

    def records(self, from_position: int = 0) -> Iterator[Any]:
        """Every record from ``from_position`` (a record boundary) on, in position order.

        Stops quietly at the end of the data; raises CorruptRecord at the first problem.
        """
        position = from_position
        while True:
            batch = self.read_batch(position, _CHUNK_RECORDS)
            yield from batch.records
            if batch.problem is not None:
                raise CorruptRecord(*batch.problem)
            if batch.next_position == position:
                return
            position = batch.next_position

    def read_batch(self, position: int, count_max: int) -> Batch:
        """Up to ``count_max`` records from ``position`` on, crossing into later segments.

        ``next_position`` equals ``position`` when nothing more is there yet. A position
        before the first segment (retention removed it) starts at the first segment.
        """
        segments = self.segments()
        if segments and position < segments[0].base:
            position = segments[0].base
        records: list = []
        for index, segment in enumerate(segments):
            if not segment.base <= position < segment.base + segment.size:
                continue
            try:
                with _Mapping(segment) as view:
                    found, offset, _, stop = _walk(view, segment.base, position - segment.base,
                                                   count_max - len(records), decode=True)
            except FileNotFoundError:  # removed since it was listed: nothing there now
                return Batch(records, position, None)
            records.extend(found)
            position = segment.base + offset
            if stop != _BLANK_STOP:
                problem = None if stop in (_END, _MORE) else Problem(position, stop)
                return Batch(records, position, problem)
            position = segment.base + segment.size
            following = segments[index + 1] if index + 1 < len(segments) else None
            if following is not None and following.base != position:
                return Batch(records, position, Problem(
                    position, f"the next segment starts at {following.base}, not here"))
        return Batch(records, position, None)

    def verify(self, progress: Callable[[int], object] | None = None) -> VerifyReport:
        """Check every record of every segment; stop at the first problem.

        ``progress(byte_count)`` is called as bytes are checked; they add up to
        ``total_bytes()`` when the log is clean.
        """
        report = progress or (lambda _count: None)
        segments = self.segments()
        count = checked = 0
        for index, segment in enumerate(segments):
            with _Mapping(segment) as view:
                walked, stop, offset = _verify_segment(view, segment.base, report)
            count += walked
            end = segment.base + offset
            if stop == _BLANK_STOP:
                checked += segment.size
                following = segments[index + 1] if index + 1 < len(segments) else None
                if following is not None and following.base != segment.base + segment.size:
                    gap = Problem(segment.base + segment.size,
                                  f"the next segment starts at {following.base}, not here")
                    return VerifyReport(count, checked, gap, len(segments), end)
                continue
            checked += offset
            if stop != _END:
                return VerifyReport(count, checked, Problem(end, stop), len(segments), end)
            problem = _check_zero_tail(segments[index:], offset, report)
            checked += 0 if problem else sum(s.size for s in segments[index:]) - offset
            return VerifyReport(count, checked, problem, len(segments), end)
        end = segments[-1].base + segments[-1].size if segments else 0
        return VerifyReport(count, checked, None, len(segments), end)

    def total_bytes(self) -> int:
        """Bytes ``verify`` examines in a clean log: every segment, whole."""
        return sum(segment.size for segment in self.segments())


class _Mapping:
    """A segment mapped read-only, as a memoryview released on exit."""

    def __init__(self, segment: SegmentFile) -> None:
        self.segment = segment
        self._mapping: mmap.mmap | None = None
        self._view: memoryview | None = None

    def __enter__(self) -> memoryview:
        if self.segment.size == 0:
            return memoryview(b"")  # an empty file cannot be mapped; _walk reports it
        with open(self.segment.path, "rb") as file:
            self._mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        self._view = memoryview(self._mapping)
        return self._view

    def __exit__(self, *exc_info: object) -> None:
        if self._view is not None:
            self._view.release()
        if self._mapping is not None:
            self._mapping.close()


def _verify_segment(view: memoryview, base: int,
                    report: Callable[[int], object]) -> tuple[int, str, int]:
    """Walk one whole segment in chunks, reporting progress; (count, stop, offset)."""
    offset = count = 0
    while True:
        _, reached, walked, stop = _walk(view, base, offset, _CHUNK_RECORDS, decode=False)
        count += walked
        report(reached - offset)
        offset = reached
        if stop != _MORE:
            if stop == _BLANK_STOP:
                report(len(view) - offset)
            return count, stop, offset


def _walk(view: memoryview, base: int, offset: int, count_max: int,
          decode: bool) -> tuple[list, int, int, str]:
    """Check up to ``count_max`` records of one segment from ``offset``.

    Returns (the Records if ``decode`` else [], the offset reached, how many records
    passed, why it stopped: _MORE, _END, _BLANK_STOP or a problem's reason).
    """
    found: list = []
    size_of_segment = len(view)
    header, blank, magic_ok, checked = _HEADER.unpack_from, _BLANK.unpack_from, _MAGIC, 0
    stop = _MORE
    while checked < count_max:
        if offset + _BLANK_SIZE_MIN > size_of_segment:
            stop = "no room for a record header before the segment's end"
            break
        size, magic = blank(view, offset)
        if magic != magic_ok:
            stop = _stop_reason(size, magic, offset, size_of_segment)
            break
        if size < _HEADER_SIZE or offset + size + _BLANK_SIZE_MIN > size_of_segment:
            stop = f"bad size {size}"
            break
        (_, _, crc, _, topic_size, _, body_size, _, _, position, _, _, key_size, tags_size,
         properties_size) = header(view, offset)
        if _HEADER_SIZE + topic_size + key_size + tags_size + properties_size + body_size \
                != size:
            stop = "field sizes do not add up to the record size"
            break
        if position != base + offset:
            stop = f"the record says it belongs at position {position}"
            break
        if crc32c(view[offset + _CRC_START:offset + size]) != crc:
            stop = "crc mismatch: the record's bytes do not have the CRC32C stored with them"
            break
        if decode:
            found.append(_Record(view[offset:offset + size].tobytes()))
        offset += size
        checked += 1
    return found, offset, checked, stop


def _stop_reason(size: int, magic: int, offset: int, size_of_segment: int) -> str:
    if size == 0 and magic == 0:
        return _END
    if magic == _BLANK_MAGIC:
        if offset + size == size_of_segment:
            return _BLANK_STOP
        return f"blank record of size {size} does not reach the segment's end"
    return f"bad magic {magic:#010x}"


def _check_zero_tail(segments: list[SegmentFile], offset: int,
                     report: Callable[[int], object]) -> Problem | None:
    """After the end of the data in ``segments[0]`` (at ``offset``), every byte of it and
    of the later segments must be zero; else name the first one that is not."""
    end = segments[0].base + offset
    for segment in segments:
        start = offset if segment is segments[0] else 0
        try:
            where = _first_non_zero(segment, start, report)
        except FileNotFoundError:
            continue  # a prepared segment its store discarded meanwhile
        if where is not None:
            return Problem(end, f"non-zero bytes at position {where} after the last record "
                                "(a torn or overwritten tail)")
    return None


def _first_non_zero(segment: SegmentFile, start: int,
                    report: Callable[[int], object]) -> int | None:
    with _Mapping(segment) as view:
        for chunk_start in range(start, len(view), _ZERO_CHUNK_BYTES):
            chunk = view[chunk_start:chunk_start + _ZERO_CHUNK_BYTES].tobytes()
            if chunk != _ZEROS[:len(chunk)]:  # memcmp: ~4 GB/s, where lstrip is ~0.3
                return segment.base + chunk_start + len(chunk) - len(chunk.lstrip(b"\0"))
            report(len(chunk))
    return None
