"""mqlog/format.py is the one definition of the byte layouts on the Python side: the
cores' Python-visible constants must agree with it, and its record walker must read a
segment as the cores' recovery scan does."""

from __future__ import annotations

import pytest

import mqlog
from mqlog import ext
from mqlog import format as fmt
from tests.conftest import IMPLEMENTATIONS, SMALL

# core constant -> format.py constant
SAME = {
    "HEADER": "RECORD_HEADER", "HEADER_SIZE": "RECORD_HEADER_SIZE", "CRC_START": "CRC_START",
    "MAGIC": "RECORD_MAGIC", "BLANK": "BLANK", "BLANK_MAGIC": "BLANK_MAGIC",
    "BLANK_SIZE_MIN": "BLANK_SIZE_MIN", "ATTR_CONTROL": "ATTR_CONTROL",
    "ATTR_FILLER": "ATTR_FILLER",
    "CQ_ENTRY": "CQ_ENTRY", "CQ_ENTRY_SIZE": "CQ_ENTRY_SIZE",
    "CQ_AT_POSITION": "CQ_AT_POSITION", "CQ_AT_SIZE": "CQ_AT_SIZE", "CQ_AT_HASH": "CQ_AT_HASH",
    "INDEX_HEADER": "INDEX_HEADER", "INDEX_HEADER_SIZE": "INDEX_HEADER_SIZE",
    "INDEX_ENTRY": "INDEX_ENTRY", "INDEX_ENTRY_SIZE": "INDEX_ENTRY_SIZE",
    "INDEX_MAGIC": "INDEX_MAGIC", "INDEX_ENTRY_CRC_AT": "INDEX_ENTRY_CRC_AT",
}


def _value(thing: object) -> object:
    return getattr(thing, "format", thing)  # a struct.Struct by its layout


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_the_cores_constants_agree_with_format_py(implementation):
    core = ext.load(implementation)
    for core_name, format_name in SAME.items():
        assert _value(getattr(core, core_name)) == _value(getattr(fmt, format_name)), core_name


def test_field_offsets_agree_with_the_header_layout():
    header = fmt.RecordHeader._fields
    sizes = {"I": 4, "H": 2, "Q": 8, "q": 8}
    at, offsets = 0, {}
    for name, code in zip(header, fmt.RECORD_HEADER.format.lstrip("<"), strict=True):
        offsets[name] = at
        at += sizes[code]
    assert at == fmt.RECORD_HEADER_SIZE
    for name, constant in [("size", fmt.SIZE_AT), ("magic", fmt.MAGIC_AT), ("crc", fmt.CRC_AT),
                           ("attributes", fmt.ATTRIBUTES_AT),
                           ("topic_size", fmt.TOPIC_SIZE_AT), ("queue_id", fmt.QUEUE_ID_AT),
                           ("body_size", fmt.BODY_SIZE_AT), ("epoch", fmt.EPOCH_AT),
                           ("queue_offset", fmt.QUEUE_OFFSET_AT),
                           ("position", fmt.POSITION_AT),
                           ("born_timestamp", fmt.BORN_TIMESTAMP_AT),
                           ("store_timestamp", fmt.STORE_TIMESTAMP_AT),
                           ("key_size", fmt.KEY_SIZE_AT), ("tags_size", fmt.TAGS_SIZE_AT),
                           ("properties_size", fmt.PROPERTIES_SIZE_AT)]:
        assert offsets[name] == constant, name
    assert fmt.CRC_START == fmt.CRC_AT + 4


def test_the_walker_reads_a_segment_as_the_core_does(tmp_path, impl):
    with mqlog.open(tmp_path / "s", implementation=impl, **SMALL) as store:
        for index in range(400):
            store.put("t", bytes(index % 200), index % 3, key="k" if index % 2 else None)
        records = {record.position: bytes(record.raw)
                   for queue in store.queues() for offset in range(store.max_offset(*queue))
                   for record in store.get(*queue, offset, max_count=1)}
    walked = {}
    for path in sorted((tmp_path / "s" / "commitlog").iterdir()):
        data = path.read_bytes()
        base = int(path.name)
        steps = list(fmt.walk(data, base))
        assert steps[-1].kind in ("blank", "end")
        for step in steps[:-1]:
            assert step.kind == "record"
            walked[base + step.offset] = data[step.offset:step.offset + step.size]
    assert walked == records
    # One flipped bit: the walker reports the damaged record up to the next intact one.
    position = sorted(records)[10]
    first = sorted((tmp_path / "s" / "commitlog").iterdir())[0].read_bytes()
    data = bytearray(first)
    data[position + 80] ^= 1
    damage = [step for step in fmt.walk(data, 0) if step.kind != "record"]
    assert damage[0] == fmt.Step(position, "damage", len(records[position]), None)


def test_index_entries_carry_the_crc_format_py_computes(tmp_path, impl):
    """Both cores write each key-index entry's CRC32C as mqlog/format.py defines it, and a
    sealed file's slots CRC and header CRC as the engine checks them."""
    with mqlog.open(tmp_path / "s", implementation=impl, **SMALL) as store:
        for number in range(100):
            store.put("t", b"x", key=f"k{number % 7}")
    data = (tmp_path / "s" / "index" / f"{0:020d}").read_bytes()
    header = fmt.INDEX_HEADER.unpack_from(data)
    assert header[0] == fmt.INDEX_MAGIC and header[4] == 100
    entries_at = fmt.INDEX_HEADER_SIZE + fmt.INDEX_SLOT_SIZE * header[2]
    for number in range(header[4]):
        entry = data[entries_at + number * fmt.INDEX_ENTRY_SIZE:][:fmt.INDEX_ENTRY_SIZE]
        assert fmt.INDEX_ENTRY.unpack(entry)[4] == fmt.index_entry_crc(entry), number
    assert header[10] == fmt.crc32c(data[fmt.INDEX_HEADER_SIZE:entries_at])
    assert header[11] == fmt.crc32c(data[:fmt.INDEX_CRC_AT])


def test_the_producer_table_reads_tags_through_format_py(tmp_path, impl):
    """replication/idempotence.py reads record headers with mqlog/format.py's layout: a
    rebuild finds each tagged record's position, end and queue offset (control records
    and untagged ones are passed over)."""
    from mqlog.replication.idempotence import ProducerTable

    with mqlog.open(tmp_path / "s", implementation=impl, **SMALL) as store:
        stored = {}
        for number in range(60):
            properties = {"producer_id": f"p{number % 3}", "sequence": number} \
                if number % 4 else {"other": "x"}
            result = store.put("t", b"y" * number, number % 2, properties=properties)
            if number % 4:
                stored[(f"p{number % 3}", number)] = (result.position, result.offset)
        table = ProducerTable(1000)
        assert table.rebuild(store, 1 << 30) == len(stored)
        for (producer, sequence), (position, offset) in stored.items():
            found = table.lookup(producer, sequence, 0)
            assert found is not None and (found.position, found.offset) == (position, offset)
            assert found.end == store.read_record(position).end_position


def test_a_request_cut_on_a_replica_is_never_answered_as_stored(tmp_path, impl):
    """A replica's copy of a three-record request cut after its first record (a fetch or
    an Entries ends at a record, not at a request): once that replica leads, a retry of
    the request found only one record of three and was answered as stored, PUT_OK, with
    two records missing. Now the rebuilt table says how many are there (the node refuses
    the retry with PartiallyStored, naming that count, once that copy is committed:
    test_cluster)."""
    from mqlog.replication.idempotence import ProducerTable, producer_properties

    with mqlog.open(tmp_path / "leader", implementation=impl, **SMALL) as leader, \
            mqlog.open(tmp_path / "replica", implementation=impl, **SMALL) as replica:
        whole = leader.put_batch("t", [b"x" * 300, b"y" * 300, b"z" * 300],
                                 properties=producer_properties("p", 7, 0))
        first = leader.read_record(whole.position).end_position
        replica.append_raw(0, leader.read_raw(0, first))  # (cut inside the request)
        table = ProducerTable(1000)
        assert table.rebuild(replica, 1 << 30) == 1
        assert table.lookup("p", 7, 0).count == 1
        table.rebuild(leader, 1 << 30)
        assert table.lookup("p", 7, 0).count == 3
        # a request whose records go on in the next segment (a blank between) is whole:
        # one larger than a segment (one that fits is placed whole in one, FORMAT.md)
        count = SMALL["segment_size_bytes"] // 8000 + 1
        split = leader.put_batch("t", [b"s" * 8000] * count,
                                 properties=producer_properties("p", 8, 0))
        assert len({position // SMALL["segment_size_bytes"] for position in
                    (split.position, split.end_position - 1)}) == 2
        table.rebuild(leader, 1 << 30)
        assert table.lookup("p", 8, 0).count == count
