"""The one definition of every byte layout the Python side reads (docs/FORMAT.md).

Everything here is little-endian and fixed by the store's format version (meta.json):

* the commit-log record: a 72-byte header, then topic, key, tags, properties, body; the
  CRC32C at bytes [8, 12) covers bytes [12, size). ``RECORD_HEADER`` unpacks the header
  in the order of ``RecordHeader``'s fields; the ``*_AT`` constants are byte offsets;
* the blank record (size u32, magic u32) that fills a segment's tail;
* the consume-queue entry (position u64, size u32, tag hash u64) and its tombstone;
* the key-index file: header, slots and entries;
* control records (attribute bit 0), which belong to no queue, and lost-record fillers
  (attribute bit 1), which ``mqlog repair`` writes;
* the checkpoint.

Every Python reader of these bytes takes them from here: the pure-Python twin
(``mqlog.ext.fallback`` re-exports them as the core's API), the engine (index, reader,
consumequeue, checkpoint, repair, control), the producer table
(``replication/idempotence.py``) and the config's header size. The C core
(``mqlog.ext._core``) has its own copy in layout.h and exports the same Python-visible
constants; ``_core`` checks layout.h against those at import and tests/test_format.py
checks those against this module. Below the layouts, a record checker and a record walker
that work on any buffer (a mapped segment, bytes read from a replica): recovery, repair
and ``mqlog verify`` use them where the core's own scan does not fit.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any, NamedTuple

from crc32c import crc32c

# --- the record ---------------------------------------------------------------------
#  total_size u32 | magic u32 | crc32c u32 | attributes u16 | topic_size u16 |
#  queue_id u32 | body_size u32 | epoch u64 | queue_offset u64 | position u64 |
#  born_timestamp i64 | store_timestamp i64 | key_size u16 | tags_size u16 |
#  properties_size u32 | topic | key | tags | properties | body
RECORD_HEADER = struct.Struct("<IIIHHIIQQQqqHHI")
RECORD_HEADER_SIZE = RECORD_HEADER.size
SIZE_AT, MAGIC_AT, CRC_AT, ATTRIBUTES_AT, TOPIC_SIZE_AT = 0, 4, 8, 12, 14
QUEUE_ID_AT, BODY_SIZE_AT, EPOCH_AT, QUEUE_OFFSET_AT, POSITION_AT = 16, 20, 24, 32, 40
BORN_TIMESTAMP_AT, STORE_TIMESTAMP_AT = 48, 56
KEY_SIZE_AT, TAGS_SIZE_AT, PROPERTIES_SIZE_AT = 64, 66, 68
CRC_START = 12  # the CRC covers every byte after its own field
RECORD_MAGIC = int.from_bytes(b"MQR\x01", "little")  # record, format version 1
ATTR_CONTROL = 0x0001  # a control record: no queue sees it (a Raft no-op, a filler)
ATTR_FILLER = 0x0002  # written by `mqlog repair` in place of a lost record: empty body

# --- the blank record: fills a segment's tail ---------------------------------------
BLANK = struct.Struct("<II")  # size, magic
BLANK_SIZE_MIN = BLANK.size
BLANK_MAGIC = int.from_bytes(b"MQB\x01", "little")

# --- consume-queue entries ------------------------------------------------------------
CQ_ENTRY = struct.Struct("<QIQ")  # position u64, size u32, tag hash u64
CQ_ENTRY_SIZE = CQ_ENTRY.size
CQ_AT_POSITION, CQ_AT_SIZE, CQ_AT_HASH = 0, 8, 12
# An entry is published by its size, written last (a writer may be filling an entry
# while a reader in another process reads it): read the size first, and only a non-zero
# size makes the position and hash beside it valid.
CQ_SIZE = struct.Struct("<I")
CQ_POSITION = struct.Struct("<Q")
CQ_TOMBSTONE_SIZE = 0xFFFF_FFFF  # the size of an entry before a queue's first offset
CQ_TOMBSTONE = CQ_ENTRY.pack(0xFFFF_FFFF_FFFF_FFFF, CQ_TOMBSTONE_SIZE, 0)

# --- the key index (format version 2) ------------------------------------------------
#  magic u32 | hash_bits u32 | slot_count u32 | entry_count_max u32 | entry_count u32 |
#  damaged_count u32 | first_position u64 | end_position u64 | min_timestamp i64 |
#  max_timestamp i64 | slots_crc32c u32 | crc32c u32 ; then slots u32[slot_count] ;
#  then entries: key_hash u64 | position u64 | store_timestamp i64 | prev u32 | crc32c u32
# Version 1 ("MQI" 0x01) had no CRCs in the entries nor over the slots: a flipped bit in an
# entry's hash hid its record. A file of another version is rebuilt from the log.
INDEX_HEADER = struct.Struct("<IIIIIIQQqqII")
INDEX_HEADER_SIZE = INDEX_HEADER.size
INDEX_END_POSITION_AT = 32
INDEX_SLOTS_CRC_AT = 56  # CRC32C of the slot array, written when the file is sealed
INDEX_CRC_AT = 60  # the header's CRC32C covers bytes [0, 60), slots_crc32c included
INDEX_MAGIC = int.from_bytes(b"MQI\x02", "little")
INDEX_SLOT = struct.Struct("<I")
INDEX_SLOT_SIZE = INDEX_SLOT.size
INDEX_ENTRY = struct.Struct("<QQqII")
INDEX_ENTRY_SIZE = INDEX_ENTRY.size
INDEX_ENTRY_CRC_AT = 28  # each entry's CRC32C covers its bytes [0, 28)


def index_entry_crc(entry: Any) -> int:
    """The CRC32C an index entry (32 bytes, or just its first 28) must carry."""
    with memoryview(entry) as view:
        return crc32c(view[:INDEX_ENTRY_CRC_AT])


# --- the checkpoint (36 bytes) --------------------------------------------------------
#  magic "MQCP" | version u32 | log_position u64 | log_end u64 | timestamp_ms i64 |
#  crc32c u32 of the bytes before it
CHECKPOINT = struct.Struct("<4sIQQqI")
CHECKPOINT_MAGIC = b"MQCP"

# --- the flushed position (two 32-byte slots) ---------------------------------------------
#  magic "MQFP" | version u32 | sequence u64 | position u64 | reserved u32 (0) |
#  crc32c u32 of the bytes before it; slot ``sequence % 2`` is overwritten in place
FLUSHED_SLOT = struct.Struct("<4sIQQII")
FLUSHED_MAGIC = b"MQFP"
FLUSHED_SLOTS = 2

# The change count (``changes``, 16 bytes), overwritten in place, never synced:
#  magic "MQCH" | version u32 | count u64 (odd while a truncation, reset or retention runs)
CHANGES = struct.Struct("<4sIQ")
CHANGES_MAGIC = b"MQCH"

assert RECORD_HEADER_SIZE == 72 and CQ_ENTRY_SIZE == 20 and CHECKPOINT.size == 36
assert FLUSHED_SLOT.size == 32 and CHANGES.size == 16
assert INDEX_HEADER_SIZE == 64 and INDEX_ENTRY_SIZE == 32


class RecordHeader(NamedTuple):
    size: int
    magic: int
    crc: int
    attributes: int
    topic_size: int
    queue_id: int
    body_size: int
    epoch: int
    queue_offset: int
    position: int
    born_timestamp: int
    store_timestamp: int
    key_size: int
    tags_size: int
    properties_size: int

    @property
    def control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)


def check_record(raw: Any, position: int) -> str:
    """'' if ``raw`` is one whole, intact record that belongs at ``position``; else why
    not (the same checks, in the same order, as the cores' recovery scan)."""
    if len(raw) < RECORD_HEADER_SIZE:
        return "shorter than a record header"
    header = RecordHeader._make(RECORD_HEADER.unpack_from(raw))
    if header.magic != RECORD_MAGIC:
        return f"bad magic {header.magic:#010x}"
    if header.size != len(raw):
        return f"size {header.size} does not match the record"
    if RECORD_HEADER_SIZE + header.topic_size + header.key_size + header.tags_size + \
            header.properties_size + header.body_size != header.size:
        return "field sizes do not add up to the record size"
    if header.position != position:
        return f"record says it belongs at position {header.position}"
    if crc32c(memoryview(raw)[CRC_START:]) != header.crc:
        return "CRC32C mismatch"
    return ""


def names_queue_record(buffer: Any, at: int, queue_id: int, offset: int,
                       topic: bytes) -> bool:
    """Whether the record at ``at`` of ``buffer`` is the one a consume-queue entry for
    ``offset`` of queue (``topic``, ``queue_id``) names: its queue id, queue offset and
    topic, and not a control record (the C core's twin: _is_queue_record, _queues.pxi).
    A read checks this beside the CRC; an open checks the last entry it counts."""
    header = RECORD_HEADER.unpack_from(buffer, at)  # (fields in RecordHeader's order)
    name_at = at + RECORD_HEADER_SIZE
    return header[5] == queue_id and header[8] == offset and \
        not header[3] & ATTR_CONTROL and header[4] == len(topic) and \
        buffer[name_at:name_at + len(topic)] == topic


def seal_record(record: bytearray) -> None:
    """Store the CRC32C of a record's bytes [12, size) at bytes [8, 12)."""
    struct.pack_into("<I", record, CRC_AT, crc32c(memoryview(record)[CRC_START:]))


def intact_header(buffer: Any, base: int, offset: int) -> RecordHeader | None:
    """The header of the intact record at ``offset`` of a segment starting at position
    ``base`` (size, magic, fields, position and CRC32C all agree, and it leaves room for
    a blank after it), else None."""
    room = len(buffer) - offset
    if room < RECORD_HEADER_SIZE + BLANK_SIZE_MIN:
        return None
    size, magic = BLANK.unpack_from(buffer, offset)
    if magic != RECORD_MAGIC or not RECORD_HEADER_SIZE <= size <= room - BLANK_SIZE_MIN:
        return None
    with memoryview(buffer) as view:
        if check_record(view[offset:offset + size], base + offset):
            return None
    return RecordHeader._make(RECORD_HEADER.unpack_from(buffer, offset))


def find_intact(buffer: Any, base: int, start: int) -> int | None:
    """Offset of the first intact record at or after ``start`` in a segment (a search
    for the magic, then the full checks), or None."""
    magic = RECORD_MAGIC.to_bytes(4, "little")
    at = start + 4
    while True:
        found = buffer.find(magic, at)
        if found < 0:
            return None
        if intact_header(buffer, base, found - 4) is not None:
            return found - 4
        at = found + 1


class Step(NamedTuple):
    """One stop of ``walk``: what lies at ``offset`` of the segment."""

    offset: int
    kind: str  # "record", "blank" (fills the tail), "end" (zeros), "damage"
    size: int  # bytes the step covers (the record, the blank; for damage: to the next
    #            intact record or the segment's end; 0 for the end)
    header: RecordHeader | None  # a record's header


def walk(buffer: Any, base: int, start: int = 0) -> Iterator[Step]:
    """Walk a segment's records from ``start`` (a record boundary), in position order.

    Yields each intact record, each damaged stretch (from where a record should start to
    the next intact record, or to the segment's end), and finally a blank that fills the
    tail or the zeros that end the data, as recovery reads a segment."""
    size = len(buffer)
    offset = start
    while offset < size:
        step = step_at(buffer, base, offset)
        if step is not None:
            yield step
            if step.kind != "record":
                return
            offset += step.size
            continue
        following = None if size - offset < BLANK_SIZE_MIN else \
            find_intact(buffer, base, offset + 1)
        stop = size if following is None else following
        yield Step(offset, "damage", stop - offset, None)
        offset = stop


def step_at(buffer: Any, base: int, offset: int) -> Step | None:
    """What starts at ``offset`` (< the segment's size) if it is an intact record, the
    blank that fills the segment's tail or the zeros that end its data; None if none of
    them (damage, or too few bytes left for any)."""
    size = len(buffer)
    if size - offset < BLANK_SIZE_MIN:
        return None
    length, magic = BLANK.unpack_from(buffer, offset)
    if length == 0 and magic == 0:
        return Step(offset, "end", 0, None)
    if magic == BLANK_MAGIC and offset + length == size:
        return Step(offset, "blank", length, None)
    header = intact_header(buffer, base, offset)
    return None if header is None else Step(offset, "record", header.size, header)
