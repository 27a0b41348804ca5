# mqlog's C log core, part 4 of 6: the arguments of a put (and of a read), validated
# before anything is touched, with the same errors and words as the twin.
# (included by _core.pyx: see its docstring; it shares the module's namespace)

# --- the arguments of a put, validated ------------------------------------------------

cdef struct Fields:
    const char *topic
    Py_ssize_t topic_size
    const char *key
    Py_ssize_t key_size
    const char *tags
    Py_ssize_t tags_size
    const char *properties
    Py_ssize_t properties_size
    uint64_t queue_id
    bint queue_id_fits  # below 2**32: otherwise no queue can exist (the engine refuses it)
    int64_t born_timestamp
    bint has_born_timestamp
    # born_timestamp outside i64 or a text field over 65535 bytes: the twin fails when
    # it packs the header (struct.error), and so do we, at the same step and in words
    # of the first field it packs that is out of range (0: none)
    int too_wide
    uint64_t tag_hash
    size_t fixed_size  # header + topic + key + tags + properties


cdef struct Body:
    const char *data
    Py_ssize_t size
    Py_buffer view
    bint held  # view must be released


cdef int _text_field(const char **data, Py_ssize_t *size, str name, object value,
                     long long size_max) except -1:
    if value is None:
        data[0] = NULL
        size[0] = 0
        return 0
    if not PyUnicode_Check(value):
        raise InvalidArgument(f"{name} must be str or None, got {type(value).__name__}")
    try:
        data[0] = PyUnicode_AsUTF8AndSize(value, size)  # cached in the str: no copy
    except UnicodeEncodeError:
        raise _text_error(name, value) from None
    if size[0] > size_max:
        raise MessageTooLarge(f"{name} of {size[0]} bytes exceeds {name}_size_bytes_max="
                              f"{size_max}")
    return 0


cdef object _pack_properties(object properties):
    """msgpack bytes of ``properties`` (None: nothing to store)."""
    if properties is None:
        return None
    if PyDict_Check(properties):
        if PyDict_Size(properties) == 0:
            return None
    elif properties == {}:
        return None
    else:
        raise InvalidArgument(f"properties must be a dict or None, got "
                              f"{type(properties).__name__}")
    for key in properties:
        if not isinstance(key, str):
            raise InvalidArgument("properties keys must be str")  # msgpack reads back only str keys
    if _nested_key_problem(properties):
        raise InvalidArgument("properties keys must be str, in nested dicts too")
    try:
        return _packb(properties)
    except (TypeError, ValueError, OverflowError) as error:
        raise InvalidArgument(f"properties cannot be encoded with msgpack: {error}") from None


cdef int _check_born(Fields *fields, object born_timestamp) except -1:
    cdef int overflow = 0
    fields.has_born_timestamp = born_timestamp is not None
    fields.too_wide = 0
    if born_timestamp is None:
        return 0
    if not PyLong_Check(born_timestamp) or PyBool_Check(born_timestamp):
        raise InvalidArgument("born_timestamp must be an int (milliseconds) or None")
    fields.born_timestamp = PyLong_AsLongLongAndOverflow(born_timestamp, &overflow)
    if overflow:
        raise InvalidArgument("born_timestamp must fit in a signed 64-bit integer (milliseconds)")
    return 0


cdef int _check_borns(list borns, Py_ssize_t count) except -1:
    """put_batch's born timestamps given one per body: as many, each a signed 64-bit int."""
    cdef int overflow = 0
    if len(borns) != count:
        raise InvalidArgument(f"born_timestamp lists {len(borns)} timestamps for {count} "
                              "bodies; give one per body")
    for value in borns:
        if PyLong_Check(value) and not PyBool_Check(value):
            PyLong_AsLongLongAndOverflow(value, &overflow)
        if not PyLong_Check(value) or PyBool_Check(value) or overflow:
            raise InvalidArgument("a born_timestamp list must hold ints that fit in a "
                                  f"signed 64-bit integer (milliseconds), got {shown(value)}")
    return 0


cdef int _check_queue_id(Fields *fields, object queue_id) except -1:
    cdef uint64_t number = 0
    if not PyLong_Check(queue_id) or PyBool_Check(queue_id) or \
            _clamp_u64(queue_id, &number) < 0:
        raise InvalidArgument(f"queue_id must be a non-negative int, got {shown(queue_id)}")
    fields.queue_id = number
    fields.queue_id_fits = number <= U32_MAX
    return 0


cdef int _acquire_body(Body *body, object value) except -1:
    body.held = False
    if PyBytes_Check(value):
        body.data = PyBytes_AS_STRING(value)
        body.size = PyBytes_GET_SIZE(value)
        return 0
    if PyUnicode_Check(value):
        raise InvalidArgument("body must be bytes-like, not str; encode it first")
    try:
        PyObject_GetBuffer(value, &body.view, PyBUF_C_CONTIGUOUS)
    except (TypeError, BufferError, ValueError):
        raise InvalidArgument(f"body must be bytes-like, got {type(value).__name__}") from None
    # Held until the record is written: a bytearray cannot be resized under the copy.
    body.held = True
    body.data = <const char *>body.view.buf
    body.size = body.view.len
    return 0


cdef bytes _as_bytes(object value):
    """The twin's _as_bytes: a body as bytes (copied unless it is bytes already)."""
    cdef Body body
    if PyBytes_Check(value):
        return <bytes>value
    _acquire_body(&body, value)
    try:
        return PyBytes_FromStringAndSize(body.data, body.size)
    finally:
        PyBuffer_Release(&body.view)


cdef inline void _fill_header(mq_header *header, Fields *fields, uint32_t queue_id,
                              uint32_t size, Py_ssize_t body_size, uint64_t epoch,
                              uint64_t queue_offset, uint64_t position,
                              int64_t store_timestamp) noexcept:
    """The header of a record of ``fields`` (its CRC is _encode's)."""
    header.size = size
    header.magic = MQ_MAGIC
    header.crc = 0
    header.attributes = 0
    header.topic_size = <uint16_t>fields.topic_size
    header.queue_id = queue_id
    header.body_size = <uint32_t>body_size
    header.epoch = epoch
    header.queue_offset = queue_offset
    header.position = position
    header.born_timestamp = (fields.born_timestamp if fields.has_born_timestamp
                             else store_timestamp)
    header.store_timestamp = store_timestamp
    header.key_size = <uint16_t>fields.key_size
    header.tags_size = <uint16_t>fields.tags_size
    header.properties_size = <uint32_t>fields.properties_size


cdef void _encode(char *record, mq_header *header, Fields *fields,
                  const char *body) noexcept:
    """Write a record (its header says every size) and its CRC32C."""
    cdef char *cursor = mq_write_record_head(record, header, fields.topic, fields.key,
                                             fields.tags, fields.properties)
    cdef size_t crc_size = header.size - MQ_CRC_START
    if header.body_size >= GIL_FREE_BYTES:
        with nogil:  # the write lock keeps the mapping; the caller keeps the body
            memcpy(cursor, body, header.body_size)
            mq_put_u32(record + MQ_AT_CRC, mq_crc32c(0, record + MQ_CRC_START, crc_size))
    else:
        memcpy(cursor, body, header.body_size)
        mq_put_u32(record + MQ_AT_CRC, mq_crc32c(0, record + MQ_CRC_START, crc_size))


cdef tuple _bodies_as_bytes(object bodies):
    """The twin's ``[_as_bytes(body) for body in bodies]``, as a tuple."""
    cdef Py_ssize_t index
    try:
        items = tuple(bodies)  # a list's items are only copied as references
    except TypeError:
        raise InvalidArgument("bodies must be an iterable of bytes-like objects") from None
    for index in range(len(items)):
        if not PyBytes_Check(items[index]):
            return tuple([_as_bytes(body) for body in items])
    return items


# --- the arguments of reads, and checks the twin shares word for word -----------------

def _nested_key_problem(properties):
    """Whether a dict inside a properties value has a key that is not a str (msgpack
    reads back only str keys: such a record could be stored and never read)."""
    stack = [(value, 1) for value in properties.values()
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


def check_text(name, value):
    """Refuse a str put would refuse as not UTF-8 (a lone surrogate), with put's error
    (the twin's check_text)."""
    try:
        value.encode()
    except UnicodeEncodeError:
        raise _text_error(name, value) from None


def _no_fit(size, segment_size_bytes):
    return (f"a record of {size} bytes does not fit in this replica's segment (of "
            f"{segment_size_bytes} bytes); give every replica the same segment_size_bytes")


def _text_error(name, value):
    """InvalidArgument for a str that UTF-8 cannot encode (a lone surrogate)."""
    return InvalidArgument(f"{name} {shown(value)} is not valid Unicode text (a lone surrogate "
                           "cannot be stored as UTF-8)")


def _check_tags(tags):
    """Refuse tags that no subscription could ever select (queries.parse_subscription
    splits on '||', strips each name, and reads '*' as every record)."""
    if "||" in tags or tags != tags.strip() or tags == "*":
        raise InvalidArgument(f"tags {shown(tags)} could never be selected by a subscription: "
                              "store tags without '||', surrounding spaces or a lone '*'")


def _check_read_arguments(topic, queue_id, offset, max_count, max_bytes):
    """get's and pull's arguments: a str topic and ints (both cores say the same)."""
    if not isinstance(topic, str):
        raise InvalidArgument(f"topic must be str, got {type(topic).__name__}")
    for name, value in (("queue_id", queue_id), ("offset", offset),
                        ("max_count", max_count), ("max_bytes", max_bytes)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidArgument(f"{name} must be an int, got {shown(value)}")
