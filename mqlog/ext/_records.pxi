# mqlog's C log core, part 3 of 6: records. Pure helpers (CRC32C, the tag and key hashes,
# the record check and its words), what a caller gets back (Record, ScanResult), and the
# raw walkers over a segment's memory (recovery, the indexer, read_raw, append_raw).
# (included by _core.pyx: see its docstring; it shares the module's namespace)

# --- pure helpers ---------------------------------------------------------------------

def crc32c(data, value=0):
    """CRC32C (Castagnoli) of a bytes-like object, continuing from ``value``."""
    return _crc_of(data, value, False)


def _crc32c_portable(data, value=0):
    """crc32c() computed with the table implementation, whatever the CPU (for tests)."""
    return _crc_of(data, value, True)


def _crc32c_backend():
    """Which CRC32C implementation crc32c() uses on this CPU: "sse4.2" or "table"."""
    return "sse4.2" if mq_crc32c_hardware() else "table"


cdef object _crc_of(object data, object value, bint portable):
    cdef Py_buffer view
    cdef uint32_t crc = <uint32_t>PyLong_AsUnsignedLongLongMask(value)  # as the package
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        if portable:
            crc = mq_crc32c_portable(crc, view.buf, view.len)
        elif view.len >= GIL_FREE_BYTES:
            with nogil:
                crc = mq_crc32c(crc, view.buf, view.len)
        else:
            crc = mq_crc32c(crc, view.buf, view.len)
    finally:
        PyBuffer_Release(&view)
    return crc


def tag_hash(tags):
    """The 64-bit FNV-1a hash of a record's tags as stored in its consume-queue entry."""
    cdef Py_buffer view
    cdef const char *text
    cdef Py_ssize_t size
    cdef uint64_t value
    if not tags:
        return 0
    if PyUnicode_Check(tags):
        text = PyUnicode_AsUTF8AndSize(tags, &size)
        return mq_fnv1a64(<const unsigned char *>text, size)
    try:
        PyObject_GetBuffer(tags, &view, PyBUF_SIMPLE)
    except TypeError:
        return _tag_hash_of_ints(tags)  # the twin accepts any iterable of small ints
    try:
        value = mq_fnv1a64(<const unsigned char *>view.buf, view.len)
    finally:
        PyBuffer_Release(&view)
    return value


cdef inline uint64_t _fnv_more(uint64_t value, const char *data, size_t size) noexcept nogil:
    cdef size_t index
    for index in range(size):
        value = (value ^ <unsigned char>data[index]) * MQ_FNV_PRIME
    return value


cdef inline uint64_t _key_hash(const char *topic, size_t topic_size, const char *key,
                               size_t key_size, uint64_t hash_bits) noexcept nogil:
    cdef char zero = 0
    cdef uint64_t value = _fnv_more(MQ_FNV_OFFSET, topic, topic_size)
    value = _fnv_more(_fnv_more(value, &zero, 1), key, key_size)
    return value & (((<uint64_t>1) << hash_bits) - 1) if hash_bits < 64 else value


def key_hash(topic, key, hash_bits=64):
    """The key index's hash of (topic, key): FNV-1a 64 of ``topic \\0 key``, keeping the
    low ``hash_bits`` bits (fewer bits force collisions: a test knob)."""
    cdef bytes topic_bytes = topic.encode(), key_bytes = key.encode()
    return _key_hash(PyBytes_AS_STRING(topic_bytes), PyBytes_GET_SIZE(topic_bytes),
                     PyBytes_AS_STRING(key_bytes), PyBytes_GET_SIZE(key_bytes), hash_bits)


def _tag_hash_of_ints(tags):
    value = 0xCBF29CE484222325
    for byte in tags:
        value = ((value ^ byte) * 0x100000001B3) & 0xFFFF_FFFF_FFFF_FFFF
    return value


cdef inline int64_t _wall_clock_ms() noexcept nogil:
    # The store timestamp (docs/FORMAT.md): the wall clock as of the kernel's last tick.
    # A precise CLOCK_REALTIME read cost ~10% of a put (24 ns against 6 here); the
    # stored value is milliseconds anyway, at most one tick (1-4 ms) behind time.time().
    cdef timespec now
    clock_gettime(CLOCK_REALTIME_COARSE, &now)
    return <int64_t>now.tv_sec * 1000 + now.tv_nsec // 1000000


cdef extern from *:
    """
    /* PutResult(...) / BatchPutResult(...) without a NamedTuple's Python-level __new__:
       what tuple.__new__ does for a tuple subclass in the end (the subclass's tp_alloc,
       then the items set), minus the two temporary tuples it builds on the way. */
    static PyObject *mq_tuple_of(PyObject *cls, Py_ssize_t count, PyObject **items)
    {
        PyTypeObject *type = (PyTypeObject *)cls;
        PyObject *result = type->tp_alloc(type, count);
        Py_ssize_t index;
        if (result == NULL)
            return NULL;
        for (index = 0; index < count; index++) {
            Py_INCREF(items[index]);
            PyTuple_SET_ITEM(result, index, items[index]);
        }
        return result;
    }
    static PyObject *mq_tuple5(PyObject *cls, PyObject *a, PyObject *b, PyObject *c,
                               PyObject *d, PyObject *e)
    {
        PyObject *items[5] = {a, b, c, d, e};
        return mq_tuple_of(cls, 5, items);
    }
    /* PutResult(...) for a writer that drops each result (a loop of puts): one of the
       two results made before is refilled if nobody else holds it any more (reference
       count 1: only ``spares`` does), as CPython's zip() reuses its tuple; else a new
       one is made and kept in the older slot. Two slots: ``r = put(...)`` in a loop
       holds the last result while the next put runs. */
    static PyObject *mq_reused5(PyObject **spares, int *next, PyObject *cls, PyObject *a,
                                PyObject *b, PyObject *c, PyObject *d, PyObject *e)
    {
        PyObject *items[5] = {a, b, c, d, e}, *spare, *old;
        Py_ssize_t index, slot;
        for (slot = 0; slot < 2; slot++) {
            spare = spares[slot];
            if (spare == NULL || Py_REFCNT(spare) != 1)
                continue;
            for (index = 0; index < 5; index++) {
                old = PyTuple_GET_ITEM(spare, index);
                Py_INCREF(items[index]);
                PyTuple_SET_ITEM(spare, index, items[index]);
                Py_DECREF(old);  /* an int or the status: frees, runs no code */
            }
            Py_INCREF(spare);
            return spare;
        }
        spare = mq_tuple_of(cls, 5, items);
        if (spare == NULL)
            return NULL;
        Py_XDECREF(spares[*next]);
        Py_INCREF(spare);
        spares[*next] = spare;
        *next = 1 - *next;
        return spare;
    }
    static PyObject *mq_tuple6(PyObject *cls, PyObject *a, PyObject *b, PyObject *c,
                               PyObject *d, PyObject *e, PyObject *f)
    {
        PyObject *items[6] = {a, b, c, d, e, f};
        return mq_tuple_of(cls, 6, items);
    }
    """
    object _tuple5 "mq_tuple5"(object cls, object a, object b, object c, object d, object e)
    object _reused5 "mq_reused5"(PyObject **spares, int *next, object cls, object a,
                                 object b, object c, object d, object e)
    object _tuple6 "mq_tuple6"(object cls, object a, object b, object c, object d, object e,
                               object f)


cdef int _check_record(const char *p, size_t size, uint64_t position,
                       bint verify_crc) noexcept nogil:
    """RECORD_OK if ``p[:size]`` is one whole, intact record that belongs at ``position``."""
    cdef mq_header header
    if size < MQ_HEADER_SIZE:
        return RECORD_SHORT
    mq_read_header(p, &header)
    if header.magic != MQ_MAGIC:
        return RECORD_MAGIC
    if header.size != size:
        return RECORD_SIZE
    if MQ_HEADER_SIZE + mq_fields_size(&header) != size:
        return RECORD_FIELDS
    if header.position != position:
        return RECORD_POSITION
    if verify_crc and mq_crc32c(0, p + MQ_CRC_START, size - MQ_CRC_START) != header.crc:
        return RECORD_CRC
    return RECORD_OK


cdef str _problem_text(int problem, const char *p):
    """The twin's words for a problem found by _check_record (p: the record's bytes)."""
    if problem == RECORD_SHORT:
        return "shorter than a record header"
    if problem == RECORD_MAGIC:
        return f"bad magic {mq_u32(p + MQ_AT_MAGIC):#010x}"
    if problem == RECORD_SIZE:
        return f"size {mq_u32(p + MQ_AT_SIZE)} does not match the record"
    if problem == RECORD_FIELDS:
        return "field sizes do not add up to the record size"
    if problem == RECORD_POSITION:
        return f"record says it belongs at position {mq_u64(p + MQ_AT_POSITION)}"
    if problem == RECORD_CRC:
        return "CRC32C mismatch"
    return ""


cdef int _clamp_u64(object value, uint64_t *out) except -2:
    """Store an int argument as u64; return -1 (stored 0) if negative, 1 (stored the
    maximum) if above 2**64-1, 0 if exact. Non-integers raise TypeError."""
    cdef int overflow = 0
    cdef long long small = PyLong_AsLongLongAndOverflow(value, &overflow)
    if overflow == 0:
        out[0] = <uint64_t>small if small >= 0 else 0
        return 0 if small >= 0 else -1
    if overflow < 0:
        out[0] = 0
        return -1
    if value > 0xFFFF_FFFF_FFFF_FFFF:
        out[0] = 0xFFFF_FFFF_FFFF_FFFF
        return 1
    out[0] = PyLong_AsUnsignedLongLongMask(value)
    return 0


cdef inline int64_t _clamp_i64(object value) except? -1:
    """An int argument as i64, saturating (limits such as max_bytes)."""
    cdef int overflow = 0
    cdef long long result = PyLong_AsLongLongAndOverflow(value, &overflow)
    if overflow > 0:
        return INT64_MAX
    if overflow < 0:
        return INT64_MIN
    return result


cdef int _fail(str message) except -1:
    # Broken invariants between the engine and the core are programmer errors (asserts
    # in the twin); here they guard raw memory, so they are checked even under -O.
    raise AssertionError(message)


# --- what a caller gets back ----------------------------------------------------------

@cython.final
@cython.no_gc
@cython.freelist(4096)
cdef class Record:
    """One record read back from the log; variable fields decode when first used.

    ``lost`` is true for a lost-record filler: ``mqlog repair`` put it at the offset of a
    record whose bytes were damaged and not copied from a replica (docs/FORMAT.md,
    "Damage"). It keeps the queue's offsets consecutive and holds no data: its body is
    empty or zero bytes, and it has no key, tags or properties."""

    cdef readonly bytes raw
    cdef readonly unsigned long long position
    cdef readonly unsigned int size
    cdef readonly unsigned int attributes
    cdef readonly unsigned int queue_id
    cdef readonly unsigned long long epoch
    cdef readonly unsigned long long offset
    cdef readonly long long born_timestamp
    cdef readonly long long store_timestamp
    # topic, key, tags, properties, body sizes, as the header gives them
    cdef uint32_t _sizes[5]

    def __init__(self, raw):
        if not PyBytes_Check(raw):
            raw = bytes(raw)
        if PyBytes_GET_SIZE(raw) < MQ_HEADER_SIZE:
            raise _struct_error(f"unpack_from requires a buffer of at least {HEADER_SIZE} "
                                f"bytes for unpacking {HEADER_SIZE} bytes at offset 0 "
                                f"(actual buffer size is {len(raw)})")
        _fill_record(self, raw)

    cdef bytes _field(self, int index):
        cdef Py_ssize_t start, end
        self._span(index, &start, &end)
        return PyBytes_FromStringAndSize(PyBytes_AS_STRING(self.raw) + start, end - start)

    cdef str _text(self, int index):
        cdef Py_ssize_t start, end
        self._span(index, &start, &end)
        return PyUnicode_DecodeUTF8(PyBytes_AS_STRING(self.raw) + start, end - start, NULL)

    cdef void _span(self, int index, Py_ssize_t *start, Py_ssize_t *end) noexcept:
        # Slicing semantics: a header whose sizes overrun the bytes yields short fields.
        cdef Py_ssize_t length = PyBytes_GET_SIZE(self.raw)
        cdef Py_ssize_t begin = MQ_HEADER_SIZE
        cdef int i
        for i in range(index):
            begin += self._sizes[i]
        begin = min(begin, length)
        start[0] = begin
        end[0] = min(begin + <Py_ssize_t>self._sizes[index], length)

    @property
    def topic(self):
        return self._text(0)

    @property
    def key(self):
        return self._text(1) if self._sizes[1] else None

    @property
    def tags(self):
        return self._text(2) if self._sizes[2] else None

    @property
    def properties(self):
        return _unpackb(self._field(3)) if self._sizes[3] else {}

    @property
    def body(self):
        return self._field(4)

    @property
    def end_position(self):
        return self.position + self.size

    @property
    def lost(self):
        return bool(self.attributes & MQ_ATTR_FILLER)

    def __eq__(self, other):
        # Records of the C core and of the twin compare equal when their bytes do.
        return type(other).__name__ == "Record" and self.raw == other.raw

    def __hash__(self):
        return hash(self.raw)

    def __reduce__(self):
        return Record, (self.raw,)

    def __repr__(self):
        if self.attributes & MQ_ATTR_FILLER:  # (its body is padding, not data)
            return (f"Record(topic={self.topic!r}, queue_id={self.queue_id}, "
                    f"offset={self.offset}, position={self.position}, epoch={self.epoch}, "
                    "lost=True)")
        more = "..." if self._sizes[4] > 32 else ""
        return (f"Record(topic={self.topic!r}, queue_id={self.queue_id}, offset={self.offset}, "
                f"position={self.position}, epoch={self.epoch}, key={self.key!r}, "
                f"tags={self.tags!r}, body={self.body[:32]!r}{more})")


cdef inline void _fill_record(Record record, bytes raw) noexcept:
    cdef mq_header header
    mq_read_header(PyBytes_AS_STRING(raw), &header)
    record.raw = raw
    record.position = header.position
    record.size = header.size
    record.attributes = header.attributes
    record.queue_id = header.queue_id
    record.epoch = header.epoch
    record.offset = header.queue_offset
    record.born_timestamp = header.born_timestamp
    record.store_timestamp = header.store_timestamp
    record._sizes[0] = header.topic_size
    record._sizes[1] = header.key_size
    record._sizes[2] = header.tags_size
    record._sizes[3] = header.properties_size
    record._sizes[4] = header.body_size


cdef inline Record _new_record(bytes raw):
    cdef Record record = Record.__new__(Record)
    _fill_record(record, raw)
    return record


cdef class ScanResult:
    """Where a recovery scan of one segment stopped, and why."""

    cdef public object end_offset
    cdef public object record_count
    cdef public object stop_reason
    cdef public object last_store_timestamp

    def __init__(self, end_offset, record_count, stop_reason, last_store_timestamp):
        self.end_offset = end_offset
        self.record_count = record_count
        self.stop_reason = stop_reason
        self.last_store_timestamp = last_store_timestamp

    def __repr__(self):
        return (f"ScanResult(end_offset={self.end_offset}, record_count={self.record_count}, "
                f"stop_reason={self.stop_reason!r})")


# --- helpers that work on raw memory --------------------------------------------------

cdef int _header_at(Segment *segment, uint64_t offset, mq_header *header) noexcept:
    """HEADER_RECORD (and the header) if an intact record starts at ``offset`` (its
    sizes, magic, own position and CRC32C agree); HEADER_BLANK for the blank that ends
    the segment; else HEADER_NONE."""
    cdef uint64_t available = segment.size - offset if offset < segment.size else 0
    if available < MQ_BLANK_SIZE_MIN:
        return HEADER_NONE
    if mq_u32(segment.data + offset + MQ_AT_MAGIC) == MQ_BLANK_MAGIC:
        return HEADER_BLANK if mq_u32(segment.data + offset) == available else HEADER_NONE
    if available < MQ_HEADER_SIZE:
        return HEADER_NONE
    mq_read_header(segment.data + offset, header)
    if header.magic != MQ_MAGIC or header.size < MQ_HEADER_SIZE or header.size > available \
            or _check_record(segment.data + offset, header.size, segment.base + offset,
                             True) != RECORD_OK:
        return HEADER_NONE
    return HEADER_RECORD


cdef uint64_t _resync(Segment *segment, uint64_t offset, uint64_t stop) noexcept:
    """The position of the first intact record after a damaged one at ``offset``, in the
    same segment and before ``stop``; else the segment's end (or ``stop``)."""
    cdef uint64_t limit = min(segment.size, stop - segment.base), at
    cdef mq_header header
    for at in range(offset + 1, limit - 7 if limit >= 8 else 0):
        if mq_u32(segment.data + at + MQ_AT_MAGIC) == MQ_MAGIC and \
                _header_at(segment, at, &header) == HEADER_RECORD:
            return segment.base + at
    return min(segment.base + segment.size, stop)


cdef int _check_copy(const char *copy, uint64_t size, uint64_t position,
                     bint verify_crc) except -1:
    """_check_record on a private copy, with the GIL released when it is large."""
    cdef int problem
    if size < GIL_FREE_BYTES:
        return _check_record(copy, size, position, verify_crc)
    with nogil:
        problem = _check_record(copy, size, position, verify_crc)
    return problem


cdef int _copy_in(char *target, const char *source, uint64_t size) except -1:
    if size >= GIL_FREE_BYTES:
        with nogil:  # the write lock is held: the target stays mapped
            memcpy(target, source, size)
    else:
        memcpy(target, source, size)
    return 0


cdef void _zero(char *target, uint64_t size) noexcept:
    if size >= GIL_FREE_BYTES:
        with nogil:  # the write lock is held: the target stays mapped
            memset(target, 0, size)
    else:
        memset(target, 0, size)


cdef extern from *:
    void __builtin_prefetch(const void *address) noexcept nogil


cdef struct RawWalk:
    uint64_t end  # where the answer ends
    uint64_t records_end  # where its last record ends (before a blank record)
    int problem  # the first record that failed a check other than the CRC: why
    uint64_t problem_offset  # ... and where


cdef void _walk_raw(const char *data, uint64_t segment_size, uint64_t base,
                    uint64_t offset, uint64_t limit, int64_t max_bytes,
                    RawWalk *walk) noexcept:
    """The twin's read_raw loop, every check but the CRC.

    Each record's size says where the next begins, so the walk is a chain of dependent
    loads that the hardware prefetcher does not run ahead of: when the log is no longer
    in the CPU's caches (a follower fetching what the leader wrote a while ago), every
    header was a miss, a quarter of a leader's CPU. The walk asks for the cache lines
    PREFETCH_BYTES ahead itself (read_raw 2.5 -> 4.7 GB/s over a log out of cache)."""
    cdef uint64_t end = offset, size, ahead = offset
    walk.problem = RECORD_OK
    walk.problem_offset = 0
    while end < limit:
        while ahead < limit and ahead < end + PREFETCH_BYTES:
            __builtin_prefetch(data + ahead)
            ahead += CACHE_LINE_BYTES
        if segment_size - end < MQ_BLANK_SIZE_MIN:  # (the twin's unpack_from fails)
            walk.problem, walk.problem_offset = RECORD_SHORT, end
            break
        size = mq_u32(data + end + MQ_AT_SIZE)
        if mq_u32(data + end + MQ_AT_MAGIC) == MQ_BLANK_MAGIC and end + size == segment_size:
            walk.records_end, walk.end = end, segment_size
            return
        if end > offset and (<int64_t>(end - offset) >= max_bytes or
                             <int64_t>(end + size - offset) > max_bytes):
            break  # (the record that does not fit is left unread: the next read's first)
        walk.problem = _check_record(data + end, size if end + size <= limit else 0,
                                     base + end, False)
        if walk.problem:
            walk.problem_offset = end
            break
        end += size
    walk.records_end = walk.end = end


cdef uint64_t _first_bad_crc(const char *records, uint64_t size) noexcept nogil:
    """Offset of the first record whose CRC32C is wrong in whole records; else size.
    The sizes are read again from ``records``, a copy of a mapping that another process
    may have rewritten since the walk that found them whole: a size that does not fit
    is a wrong record too (trusted, it ran the CRC past the copy: a SIGSEGV)."""
    cdef uint64_t at = 0, length
    while at < size:
        if size - at < MQ_HEADER_SIZE:
            return at
        length = mq_u32(records + at + MQ_AT_SIZE)
        if length < MQ_HEADER_SIZE or length > size - at:
            return at
        if mq_crc32c(0, records + at + MQ_CRC_START, length - MQ_CRC_START) != \
                mq_u32(records + at + MQ_AT_CRC):
            return at
        at += length
    return size


cdef int _raw_problem(int problem, str text, uint64_t at, bint first) except -1:
    if first and problem != RECORD_CRC:  # (only its CRC failing: a damaged record)
        raise InvalidPosition(f"position {at} is not the start of a record ({text})")
    raise CorruptRecord(at, text)


cdef int _report_raw(const char *records, uint64_t records_size, uint64_t bad,
                     RawWalk *walk, str walk_text, uint64_t base,
                     uint64_t offset) except -1:
    """Raise what a raw read from ``offset`` met first, in the twin's order (it checks
    record after record, the CRC last): a record's CRC (``bad``: its offset in
    ``records``, else ``records_size``), then the walk's problem (``walk_text``: its
    text)."""
    if bad < records_size:
        _raw_problem(RECORD_CRC, _problem_text(RECORD_CRC, records + bad),
                     base + offset + bad, bad == 0)
    if walk.problem:
        _raw_problem(walk.problem, walk_text, base + walk.problem_offset,
                     walk.problem_offset == offset)
    return 0


# --- the key index: walking one chain --------------------------------------------------

def index_chain(index, value, begin, end, resume, count_max):
    """Walk the chain of key hash ``value`` in a key-index file, newest first (the
    twin's docstring says what comes back). Every entry walked has its CRC32C checked."""
    cdef Py_buffer view
    cdef char *data
    cdef uint64_t size_bytes, hash_value, number, newer_position, count
    cdef int64_t newer_timestamp, low = _clamp_i64(begin), high = _clamp_i64(end)
    cdef list found = []
    _clamp_u64(value, &hash_value)
    _clamp_u64(count_max, &count)
    _hold(index, &view, &data, &size_bytes, False)
    try:
        if size_bytes < IX_HEADER_SIZE:
            return found, None, "shorter than a key-index header"
        if mq_u32(data + 8) == 0 or mq_u32(data + 16) > mq_u32(data + 12) or \
                size_bytes < IX_HEADER_SIZE + 4 * <uint64_t>mq_u32(data + 8) + \
                IX_ENTRY_SIZE * <uint64_t>mq_u32(data + 12):
            return found, None, "not a key-index file of the size its header gives"
        if resume is None:
            number = mq_u32(data + IX_HEADER_SIZE + 4 * (hash_value % mq_u32(data + 8)))
            newer_position, newer_timestamp = mq_u64(data + 32), INT64_MAX
            if number > mq_u32(data + 16):
                return found, None, (f"slot {hash_value % mq_u32(data + 8)} names entry "
                                     f"{number} of {mq_u32(data + 16)}")
        else:
            _clamp_u64(resume[0], &number)
            _clamp_u64(resume[1], &newer_position)
            newer_timestamp = _clamp_i64(resume[2])
            if number > mq_u32(data + 16):
                return found, None, "a resumed walk names no entry"
        return _walk_chain(data, hash_value, low, high, number, newer_position,
                           newer_timestamp, count, found)
    finally:
        PyBuffer_Release(&view)


cdef tuple _walk_chain(const char *data, uint64_t value, int64_t begin, int64_t end,
                       uint64_t number, uint64_t newer_position, int64_t newer_timestamp,
                       uint64_t count, list found):
    cdef uint32_t slot_count = mq_u32(data + 8)
    cdef uint64_t first_position = mq_u64(data + 24), bucket = value % slot_count
    cdef const char *entries = data + IX_HEADER_SIZE + 4 * <uint64_t>slot_count
    cdef const char *entry
    cdef uint64_t key_hash, position, link
    cdef int64_t timestamp
    while number:
        if <uint64_t>len(found) >= count:
            return found, (number, newer_position, newer_timestamp), ""
        entry = entries + (number - 1) * IX_ENTRY_SIZE
        key_hash, position = mq_u64(entry), mq_u64(entry + 8)
        timestamp, link = mq_i64(entry + 16), mq_u32(entry + 24)
        if mq_crc32c(0, entry, IX_ENTRY_CRC_AT) != mq_u32(entry + IX_ENTRY_CRC_AT):
            return found, None, f"entry {number} fails its CRC32C"
        if link >= number or key_hash % slot_count != bucket or \
                not first_position <= position < newer_position or \
                timestamp > newer_timestamp:
            return found, None, (f"entry {number} (hash {key_hash:#x}, position {position}, "
                                 f"link {link}) does not belong in the chain of slot "
                                 f"{bucket}")
        if timestamp < begin:
            break
        if key_hash == value and timestamp <= end:
            found.append(position)
        number, newer_position, newer_timestamp = link, position, timestamp
    return found, None, ""
