# mqlog's C log core, part 1 of 6: the on-disk layout (layout.h, crc32c.h), the
# Python-visible layout constants (mqlog/format.py is their definition; tests check them),
# the import-time check that both agree, and the core's compile-time figures.
# (included by _core.pyx: see its docstring; it shares the module's namespace)

cdef extern from "layout.h" nogil:
    enum:
        MQ_HEADER_SIZE
        MQ_CRC_START
        MQ_MAGIC
        MQ_BLANK_MAGIC
        MQ_BLANK_SIZE_MIN
        MQ_ATTR_CONTROL
        MQ_ATTR_FILLER
        MQ_AT_SIZE
        MQ_AT_MAGIC
        MQ_AT_CRC
        MQ_AT_ATTRIBUTES
        MQ_AT_TOPIC_SIZE
        MQ_AT_QUEUE_ID
        MQ_AT_BODY_SIZE
        MQ_AT_EPOCH
        MQ_AT_QUEUE_OFFSET
        MQ_AT_POSITION
        MQ_AT_BORN
        MQ_AT_STORE
        MQ_AT_KEY_SIZE
        MQ_AT_TAGS_SIZE
        MQ_AT_PROPERTIES_SIZE
        MQ_CQ_ENTRY_SIZE
        MQ_CQ_AT_POSITION
        MQ_CQ_AT_SIZE
        MQ_CQ_AT_HASH

    ctypedef struct mq_header:
        uint32_t size
        uint32_t magic
        uint32_t crc
        uint16_t attributes
        uint16_t topic_size
        uint32_t queue_id
        uint32_t body_size
        uint64_t epoch
        uint64_t queue_offset
        uint64_t position
        int64_t born_timestamp
        int64_t store_timestamp
        uint16_t key_size
        uint16_t tags_size
        uint32_t properties_size

    const uint64_t MQ_FNV_OFFSET
    const uint64_t MQ_FNV_PRIME

    uint32_t mq_u32(const char *p)
    uint64_t mq_u64(const char *p)
    int64_t mq_i64(const char *p)
    void mq_put_i64(char *p, int64_t v)
    void mq_put_u32(char *p, uint32_t v)
    void mq_put_u64(char *p, uint64_t v)
    void mq_read_header(const char *p, mq_header *h)
    void mq_write_header(char *p, const mq_header *h)
    uint64_t mq_fields_size(const mq_header *h)
    void mq_write_cq_entry(char *p, uint64_t position, uint32_t size, uint64_t tag_hash)
    char *mq_write_record_head(char *record, const mq_header *h, const char *topic,
                               const char *key, const char *tags, const char *properties)
    uint64_t mq_fnv1a64(const unsigned char *p, size_t n)

cdef extern from "crc32c.h" nogil:
    void mq_crc32c_setup()
    uint32_t mq_crc32c(uint32_t value, const void *data, size_t n)
    uint32_t mq_crc32c_portable(uint32_t value, const void *data, size_t n)
    int mq_crc32c_hardware()

mq_crc32c_setup()

IMPLEMENTATION = "cython"

# --- the record layout (docs/FORMAT.md); the C figures come from layout.h ------------
HEADER = struct.Struct("<IIIHHIIQQQqqHHI")
HEADER_SIZE = HEADER.size
CRC_START = 12  # the CRC covers every byte after its own field
MAGIC = int.from_bytes(b"MQR\x01", "little")  # record, format version 1
BLANK_MAGIC = int.from_bytes(b"MQB\x01", "little")  # pads a segment's tail
BLANK_SIZE_MIN = 8
BLANK = struct.Struct("<II")
CQ_ENTRY = struct.Struct("<QIQ")  # position u64, size u32, tag hash u64
CQ_ENTRY_SIZE = CQ_ENTRY.size
CQ_AT_POSITION, CQ_AT_SIZE, CQ_AT_HASH = 0, 8, 12  # the size is written last (layout.h)
ATTR_CONTROL = 0x0001  # reserved: control records (no consume-queue entry)
ATTR_FILLER = 0x0002  # a lost-record filler (`mqlog repair`): Record.lost
_PROPERTIES_DEPTH_MAX = 512  # containers checked for non-str keys this deep (msgpack: 511)
INDEX_HEADER = struct.Struct("<IIIIIIQQqqII")  # the key-index file (docs/FORMAT.md)
INDEX_HEADER_SIZE = INDEX_HEADER.size
INDEX_MAGIC = int.from_bytes(b"MQI\x02", "little")  # key-index file, version 2
INDEX_ENTRY = struct.Struct("<QQqII")
INDEX_ENTRY_SIZE = INDEX_ENTRY.size
INDEX_ENTRY_CRC_AT = 28  # an entry's CRC32C covers its bytes [0, 28)

# Reasons a scan stops (ScanResult.stop_reason).
STOP_END = "end"  # zero bytes: the end of the data
STOP_BLANK = "blank"  # a blank record fills the segment's tail


def _check_layout():
    """Refuse to import if layout.h and the Python-visible layout disagree."""
    offsets = [struct.calcsize("<" + HEADER.format[1:1 + n]) for n in range(15)]
    c_offsets = [MQ_AT_SIZE, MQ_AT_MAGIC, MQ_AT_CRC, MQ_AT_ATTRIBUTES, MQ_AT_TOPIC_SIZE,
                 MQ_AT_QUEUE_ID, MQ_AT_BODY_SIZE, MQ_AT_EPOCH, MQ_AT_QUEUE_OFFSET,
                 MQ_AT_POSITION, MQ_AT_BORN, MQ_AT_STORE, MQ_AT_KEY_SIZE, MQ_AT_TAGS_SIZE,
                 MQ_AT_PROPERTIES_SIZE]
    pairs = [(HEADER_SIZE, MQ_HEADER_SIZE), (CRC_START, MQ_CRC_START), (MAGIC, MQ_MAGIC),
             (BLANK_MAGIC, MQ_BLANK_MAGIC), (BLANK_SIZE_MIN, MQ_BLANK_SIZE_MIN),
             (CQ_ENTRY_SIZE, MQ_CQ_ENTRY_SIZE), (ATTR_CONTROL, MQ_ATTR_CONTROL),
             (ATTR_FILLER, MQ_ATTR_FILLER),
             (HEADER_SIZE, 72), (CQ_ENTRY_SIZE, 20), (BLANK.size, MQ_BLANK_SIZE_MIN),
             (offsets, c_offsets),
             ([CQ_AT_POSITION, CQ_AT_SIZE, CQ_AT_HASH], [MQ_CQ_AT_POSITION, MQ_CQ_AT_SIZE,
                                                         MQ_CQ_AT_HASH]),
             ([INDEX_HEADER_SIZE, INDEX_ENTRY_SIZE, INDEX_ENTRY_CRC_AT],
              [IX_HEADER_SIZE, IX_ENTRY_SIZE, IX_ENTRY_CRC_AT])]
    for python_value, c_value in pairs:
        if python_value != c_value:
            raise ImportError(f"mqlog/ext/layout.h disagrees with _core.pyx: {c_value!r} "
                              f"!= {python_value!r}; rebuild the extension")


_check_layout()

cdef enum:
    # Copies and CRCs at least this long run with the GIL released; shorter ones are
    # cheaper than releasing and re-taking it.
    GIL_FREE_BYTES = 64 * 1024
    # put_batch encodes at most this many bytes into its staging buffer for one pwrite
    # (write_segment); a larger batch is written record by record through the mapping.
    STAGE_BYTES_MAX = 4 * 1024 * 1024
    # ... and keeps at most this much of it between batches.
    STAGE_KEPT_BYTES = 1024 * 1024
    # read_raw's walk over record headers asks for the log this far ahead of it.
    PREFETCH_BYTES = 1024
    CACHE_LINE_BYTES = 64
    # Queues with ids below this are also kept in a list indexed by id (put's lookup).
    QUEUE_LIST_IDS = 4096
    U16_MAX = 0xFFFF
    U32_MAX = 0xFFFFFFFF
    # pull(): the most tag hashes a filter may carry (the engine's limit is lower)
    TAG_HASHES_MAX = 256
    # The key-index file: header, then u32 slots, then 32-byte entries, each ending in
    # the CRC32C of its first 28 bytes.
    IX_HEADER_SIZE = 64
    IX_ENTRY_SIZE = 32
    IX_ENTRY_CRC_AT = 28
    # _header_at's answers
    HEADER_NONE = 0
    HEADER_RECORD = 1
    HEADER_BLANK = 2
    # Fields.too_wide: a text field too long for its u16 size (only if limits exceed caps)
    WIDE_U16 = 2

# Why _check_record refused a record (see _problem_text for the words).
cdef enum Problem:
    RECORD_OK = 0
    RECORD_SHORT
    RECORD_MAGIC
    RECORD_SIZE
    RECORD_FIELDS
    RECORD_POSITION
    RECORD_CRC
    # what a read of a consume-queue entry's record met besides _check_record's problems
    RECORD_PAST_END  # the entry's size runs past its segment's end
    RECORD_BEFORE_LOG  # the entry's position lies before the first segment
    RECORD_IDENTITY  # an intact record, of another queue or offset
