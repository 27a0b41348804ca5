"""mqlog's wire codec in C: ``mqlog.ext.wire_fallback`` done fast.

``wire_fallback.py`` is the specification (docs/FORMAT.md, "Frames"): the same
functions, the same Frame, the same errors, byte-identical frames. Read it to learn the
codec; read this module to see where the time goes.

What differs from the twin
--------------------------
* msgpack. The twin calls the msgpack library; each ``packb``/``unpackb`` call sets up
  a packer or unpacker, which costs more than a small header takes to code. This module
  codes the part of msgpack a header uses (nil, bools, ints, floats, str, bin, arrays,
  maps) straight between Python objects and a C buffer, choosing the same (smallest)
  encodings the library does, so both write the same bytes. A header holding anything
  else is refused: TypeError when encoding (as the library), RemoteProtocolError when
  decoding (the library would return an ExtType that no mqlog message accepts).
* One call decodes every whole frame a read brought (``decode_frames``), so a read of a
  megabyte full of small requests costs one Python call, not one per frame.
* CRC32C is computed in C (crc32c.h), with the GIL released for frames of 64 KiB or more
  so the flush thread and the loop are not held up by a large Entries frame.
"""

cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_Check, PyBytes_FromStringAndSize
from cpython.bool cimport PyBool_Check
from cpython.bytearray cimport PyByteArray_Check
from cpython.dict cimport PyDict_Check, PyDict_New, PyDict_Next, PyDict_SetItem
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_Check, PyFloat_FromDouble
from cpython.list cimport (
    PyList_Append,
    PyList_Check,
    PyList_GET_ITEM,
    PyList_New,
    PyList_SET_ITEM,
)
from cpython.long cimport (
    PyLong_AsLongLong,
    PyLong_AsLongLongAndOverflow,
    PyLong_AsUnsignedLongLong,
    PyLong_Check,
    PyLong_FromLongLong,
    PyLong_FromUnsignedLongLong,
)
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.memoryview cimport PyMemoryView_Check
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.tuple cimport PyTuple_Check
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_Check, PyUnicode_DecodeUTF8
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset

import msgpack

from mqlog.errors import RemoteProtocolError

cdef extern from "crc32c.h" nogil:
    void mq_crc32c_setup()
    uint32_t mq_crc32c(uint32_t value, const void *data, size_t n)
    uint32_t mq_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t size_b)

mq_crc32c_setup()

cdef enum:
    PREFIX = 12  # frame_size u32, crc32c u32, header_size u32
    NEST_LIMIT = 511  # as msgpack's Packer: deeper values are refused, not recursed into
    NOGIL_CRC_BYTES = 65536  # frames this large are checksummed with the GIL released
    SHORT_TEXT_BYTES = 32  # header strings this short are cached (_short_text)
    TEXT_CACHE_SLOTS = 512  # a power of two

cdef object _msgpack_packb = msgpack.packb

IMPLEMENTATION = "cython"
PREFIX_SIZE = PREFIX


@cython.final
@cython.freelist(64)
cdef class Frame:
    """One decoded frame: a header map and a payload of raw bytes."""

    cdef readonly dict header
    cdef readonly bytes payload

    def __init__(self, dict header, bytes payload=b""):
        self.header = header
        self.payload = payload

    def __repr__(self):
        return f"Frame(header={self.header!r})"

    def __eq__(self, other):
        if not isinstance(other, Frame):
            return NotImplemented
        return self.header == (<Frame>other).header and self.payload == (<Frame>other).payload


# --- encoding ----------------------------------------------------------------------------

cdef struct Buffer:
    char *data
    Py_ssize_t size
    Py_ssize_t capacity


cdef int _reserve(Buffer *out, Py_ssize_t more) except -1:
    cdef Py_ssize_t capacity = out.capacity
    cdef char *grown
    if out.size + more <= capacity:
        return 0
    while capacity < out.size + more:
        capacity *= 2
    grown = <char *>PyMem_Realloc(out.data, capacity)
    if grown == NULL:
        raise MemoryError()
    out.data, out.capacity = grown, capacity
    return 0


cdef inline int _put_byte(Buffer *out, uint8_t value) except -1:
    _reserve(out, 1)
    out.data[out.size] = <char>value
    out.size += 1
    return 0


cdef inline int _put_be(Buffer *out, uint8_t code, uint64_t value, int width) except -1:
    """``code`` then ``value`` as a big-endian integer of ``width`` bytes."""
    cdef int index
    _reserve(out, 1 + width)
    out.data[out.size] = <char>code
    for index in range(width):
        out.data[out.size + width - index] = <char>(value >> (8 * index))
    out.size += 1 + width
    return 0


cdef int _put_sized(Buffer *out, const char *data, Py_ssize_t size, uint8_t fix_code,
                    Py_ssize_t fix_max, uint8_t code8) except -1:
    """A str (``fix_code`` 0xa0, fixstr up to 31) or bin (no fix form) header, then data."""
    if size <= fix_max:
        _put_byte(out, fix_code | <uint8_t>size)
    elif size <= 0xff:
        _put_be(out, code8, <uint64_t>size, 1)
    elif size <= 0xffff:
        _put_be(out, code8 + 1, <uint64_t>size, 2)
    elif size <= 0xffffffff:
        _put_be(out, code8 + 2, <uint64_t>size, 4)
    else:
        raise ValueError(f"{size} bytes is too large for msgpack")
    _reserve(out, size)
    memcpy(out.data + out.size, data, size)
    out.size += size
    return 0


cdef int _put_container_size(Buffer *out, Py_ssize_t count, uint8_t fix_code,
                             uint8_t code16) except -1:
    if count <= 15:
        _put_byte(out, fix_code | <uint8_t>count)
    elif count <= 0xffff:
        _put_be(out, code16, <uint64_t>count, 2)
    elif count <= 0xffffffff:
        _put_be(out, code16 + 1, <uint64_t>count, 4)
    else:
        raise ValueError(f"{count} items is too many for msgpack")
    return 0


cdef int _put_int(Buffer *out, object value) except -1:
    cdef int overflow = 0
    cdef long long small = PyLong_AsLongLongAndOverflow(value, &overflow)
    cdef unsigned long long whole
    if overflow > 0:
        whole = PyLong_AsUnsignedLongLong(value)  # OverflowError past 2**64 - 1
        _put_be(out, 0xcf, whole, 8)
    elif overflow < 0:
        raise OverflowError("int too big to convert")  # (msgpack's message)
    elif small >= 0:
        if small < 0x80:
            _put_byte(out, <uint8_t>small)
        elif small <= 0xff:
            _put_be(out, 0xcc, <uint64_t>small, 1)
        elif small <= 0xffff:
            _put_be(out, 0xcd, <uint64_t>small, 2)
        elif small <= 0xffffffff:
            _put_be(out, 0xce, <uint64_t>small, 4)
        else:
            _put_be(out, 0xcf, <uint64_t>small, 8)
    elif small >= -32:
        _put_byte(out, <uint8_t>(<int8_t>small))
    elif small >= -0x80:
        _put_be(out, 0xd0, <uint64_t>(<uint8_t>(<int8_t>small)), 1)
    elif small >= -0x8000:
        _put_be(out, 0xd1, <uint64_t>(<uint16_t>(<int16_t>small)), 2)
    elif small >= -0x80000000:
        _put_be(out, 0xd2, <uint64_t>(<uint32_t>(<int32_t>small)), 4)
    else:
        _put_be(out, 0xd3, <uint64_t>small, 8)
    return 0


cdef int _put_value(Buffer *out, object value, int depth) except -1:
    cdef const char *text
    cdef Py_ssize_t size, index
    cdef Py_buffer view
    cdef double number
    cdef uint64_t bits
    cdef PyObject *key
    cdef PyObject *item
    if depth > NEST_LIMIT:
        raise ValueError("recursion limit exceeded.")
    if value is None:
        return _put_byte(out, 0xc0)
    if PyBool_Check(value):
        return _put_byte(out, 0xc3 if value else 0xc2)
    if PyLong_Check(value):
        return _put_int(out, value)
    if PyUnicode_Check(value):
        text = PyUnicode_AsUTF8AndSize(value, &size)
        return _put_sized(out, text, size, 0xa0, 31, 0xd9)
    if PyBytes_Check(value) or PyByteArray_Check(value) or PyMemoryView_Check(value):
        PyObject_GetBuffer(value, &view, PyBUF_SIMPLE)
        try:
            return _put_sized(out, <const char *>view.buf, view.len, 0xc4, -1, 0xc4)
        finally:
            PyBuffer_Release(&view)
    if PyFloat_Check(value):
        number = PyFloat_AS_DOUBLE(value)
        memcpy(&bits, &number, 8)
        return _put_be(out, 0xcb, bits, 8)
    if PyDict_Check(value):
        _put_container_size(out, len(value), 0x80, 0xde)
        index = 0
        while PyDict_Next(value, &index, &key, &item):
            _put_value(out, <object>key, depth + 1)
            _put_value(out, <object>item, depth + 1)
        return 0
    if PyList_Check(value) or PyTuple_Check(value):
        _put_container_size(out, len(value), 0x90, 0xdc)
        for element in value:
            _put_value(out, element, depth + 1)
        return 0
    raise TypeError(f"can not serialize {type(value).__name__!r} object")


def encode_frame(dict header, payload=b""):
    """The bytes of one frame (docs/FORMAT.md)."""
    return _encode(header, payload, True)


def encode_frame_head(dict header, payload=b""):
    """The bytes of one frame up to its payload (its sizes and CRC count the payload):
    the head then ``payload`` is ``encode_frame(header, payload)``, without the copy."""
    return _encode(header, payload, False)


def encode_frame_head_of(dict header, Py_ssize_t payload_size, uint32_t payload_crc):
    """``encode_frame_head`` for a payload that is not in memory (log records sent from
    their file): its size and CRC32C stand for its bytes."""
    cdef bytes empty = _encode(header, b"", True)  # (the head: a frame of no payload)
    cdef Py_ssize_t size = len(empty)
    cdef bytes head
    cdef char *data
    if payload_size < 0 or size - 4 + payload_size > 0xffffffff:
        raise ValueError(f"a payload of {payload_size} bytes cannot be framed")
    head = PyBytes_FromStringAndSize(PyBytes_AS_STRING(empty), size)
    data = PyBytes_AS_STRING(head)
    _store_u32(data, <uint32_t>(size - 4 + payload_size))
    _store_u32(data + 4, mq_crc32c_combine(_load_u32(data + 4), payload_crc,
                                           <uint64_t>payload_size))
    return head


def crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t size_b):
    """The CRC32C of A then B from crc32c(A), crc32c(B) and len(B)."""
    return mq_crc32c_combine(crc_a, crc_b, size_b)


cdef bytes _encode(dict header, payload, bint whole):
    cdef Buffer out
    cdef Py_buffer view
    cdef Py_ssize_t header_size, total
    cdef uint32_t crc
    cdef char *data
    cdef const char *source
    out.capacity, out.size = 256, PREFIX
    out.data = <char *>PyMem_Malloc(out.capacity)
    if out.data == NULL:
        raise MemoryError()
    PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
    try:
        _put_value(&out, header, 0)
        header_size = out.size - PREFIX
        total = out.size + view.len
        if total - 4 > 0xffffffff:
            raise ValueError(f"a frame of {total} bytes is too large for its size field")
        frame = PyBytes_FromStringAndSize(NULL, total if whole else out.size)
        data = PyBytes_AS_STRING(frame)
        _store_u32(out.data, <uint32_t>(total - 4))
        _store_u32(out.data + 8, <uint32_t>header_size)
        memcpy(data, out.data, out.size)
        crc = mq_crc32c(0, data + 8, out.size - 8)
        source = <const char *>view.buf
        if whole:  # (the CRC runs over the frame's own copy: a buffer another thread
            memcpy(data + out.size, source, view.len)  # changes cannot make it wrong)
            source = data + out.size
        if view.len >= NOGIL_CRC_BYTES:
            with nogil:
                crc = mq_crc32c(crc, source, view.len)
        else:
            crc = mq_crc32c(crc, source, view.len)
        _store_u32(data + 4, crc)
        return frame
    finally:
        PyBuffer_Release(&view)
        PyMem_Free(out.data)


def split_bodies(bytes payload, sizes):
    """The bodies of a produce request: ``payload`` cut at ``sizes``, a list of ints >= 0
    that add up to its length (RemoteProtocolError naming what is wrong otherwise). One
    body of the whole payload is the payload itself, not a copy. (The twin's, without a
    Python loop: a request of 100 records is 100 checks and 100 slices.)"""
    cdef Py_ssize_t count, index, at = 0, length = len(payload)
    cdef long long size, total = 0
    cdef int overflow = 0
    cdef object item
    cdef const char *data = PyBytes_AS_STRING(payload)
    if type(sizes) is not list:
        raise RemoteProtocolError("produce sizes must be a list of non-negative ints")
    count = len(sizes)
    for index in range(count):
        item = <object>PyList_GET_ITEM(sizes, index)
        if type(item) is not int:
            raise RemoteProtocolError("produce sizes must be a list of non-negative ints")
        size = PyLong_AsLongLongAndOverflow(item, &overflow)
        if overflow < 0 or (not overflow and size < 0):
            raise RemoteProtocolError("produce sizes must be a list of non-negative ints")
        if overflow or size > length - total:  # (past the payload: no sum can match)
            total = -1
        elif total >= 0:
            total += size
    if total != length:
        raise RemoteProtocolError(f"produce sizes add up to {sum(sizes)} bytes, its "
                                  f"payload has {length}")
    if count == 1:
        return [payload]
    bodies = PyList_New(count)
    for index in range(count):
        size = PyLong_AsLongLong(<object>PyList_GET_ITEM(sizes, index))
        body = PyBytes_FromStringAndSize(data + at, <Py_ssize_t>size)
        Py_INCREF(body)  # (PyList_SET_ITEM steals a reference)
        PyList_SET_ITEM(bodies, index, body)
        at += <Py_ssize_t>size
    return bodies


def packb(value):
    """``msgpack.packb(value)``, the same bytes, faster for the types headers use (the
    log core packs record properties with it); other types go to msgpack itself."""
    cdef Buffer out
    out.capacity, out.size = 128, 0
    out.data = <char *>PyMem_Malloc(out.capacity)
    if out.data == NULL:
        raise MemoryError()
    try:
        _put_value(&out, value, 0)
        return PyBytes_FromStringAndSize(out.data, out.size)
    except TypeError:
        return _msgpack_packb(value)  # (an ext type, a Timestamp: msgpack knows them)
    finally:
        PyMem_Free(out.data)


cdef inline void _store_u32(char *at, uint32_t value) noexcept:
    memcpy(at, &value, 4)  # (the host is little-endian: setup.py checks)


cdef inline uint32_t _load_u32(const char *at) noexcept:
    cdef uint32_t value
    memcpy(&value, at, 4)
    return value


# --- decoding ----------------------------------------------------------------------------

cdef class _Reader:
    """A cursor over one header's bytes; every read is bounds-checked."""

    cdef const unsigned char *data
    cdef Py_ssize_t at, end

    cdef inline int need(self, Py_ssize_t count) except -1:
        if count > self.end - self.at:
            raise RemoteProtocolError("frame header is not msgpack: it is cut short")
        return 0

    cdef inline uint64_t be(self, int width) except? 0xFFFFFFFFFFFFFFFF:
        cdef uint64_t value = 0
        cdef int index
        self.need(width)
        for index in range(width):
            value = (value << 8) | self.data[self.at + index]
        self.at += width
        return value

    cdef object text(self, Py_ssize_t size):
        cdef Py_ssize_t start
        self.need(size)
        start, self.at = self.at, self.at + size
        if size <= SHORT_TEXT_BYTES:
            return _short_text(<const char *>self.data + start, size)
        return _decode_text(<const char *>self.data + start, size)

    cdef object binary(self, Py_ssize_t size):
        cdef Py_ssize_t start
        self.need(size)
        start, self.at = self.at, self.at + size
        return PyBytes_FromStringAndSize(<const char *>self.data + start, size)

    cdef object array(self, Py_ssize_t count, int depth):
        cdef Py_ssize_t index
        if count > self.end - self.at:  # every element takes a byte: refuse before allocating
            raise RemoteProtocolError("frame header is not msgpack: an array overruns it")
        items = PyList_New(count)
        for index in range(count):
            item = self.value(depth + 1)
            Py_INCREF(item)
            PyList_SET_ITEM(items, index, item)
        return items

    cdef object map(self, Py_ssize_t count, int depth):
        cdef Py_ssize_t _index
        if count > (self.end - self.at) // 2:
            raise RemoteProtocolError("frame header is not msgpack: a map overruns it")
        result = PyDict_New()
        for _index in range(count):
            key = self.value(depth + 1)
            if not (PyUnicode_Check(key) or PyBytes_Check(key)):  # msgpack's strict_map_key
                raise RemoteProtocolError(f"frame header is not msgpack: a map key of type "
                                          f"{type(key).__name__} (str or bytes only)")
            PyDict_SetItem(result, key, self.value(depth + 1))
        return result

    cdef object value(self, int depth):
        cdef uint8_t code
        cdef uint64_t bits
        cdef double number
        cdef float single
        if depth > NEST_LIMIT:
            raise RemoteProtocolError("frame header is not msgpack: nested too deep")
        self.need(1)
        code = self.data[self.at]
        self.at += 1
        if code <= 0x7f:
            return PyLong_FromLongLong(code)
        if code >= 0xe0:
            return PyLong_FromLongLong(<int8_t>code)
        if 0xa0 <= code <= 0xbf:
            return self.text(code & 0x1f)
        if 0x80 <= code <= 0x8f:
            return self.map(code & 0x0f, depth)
        if 0x90 <= code <= 0x9f:
            return self.array(code & 0x0f, depth)
        if code == 0xc0:
            return None
        if code == 0xc2:
            return False
        if code == 0xc3:
            return True
        if 0xc4 <= code <= 0xc6:
            return self.binary(<Py_ssize_t>self.be(1 << (code - 0xc4)))
        if code == 0xca:
            bits = self.be(4)
            memcpy(&single, &bits, 4)  # (little-endian host: the low half)
            return PyFloat_FromDouble(single)
        if code == 0xcb:
            bits = self.be(8)
            memcpy(&number, &bits, 8)
            return PyFloat_FromDouble(number)
        if 0xcc <= code <= 0xcf:
            return PyLong_FromUnsignedLongLong(self.be(1 << (code - 0xcc)))
        if code == 0xd0:
            return PyLong_FromLongLong(<int8_t>self.be(1))
        if code == 0xd1:
            return PyLong_FromLongLong(<int16_t>self.be(2))
        if code == 0xd2:
            return PyLong_FromLongLong(<int32_t>self.be(4))
        if code == 0xd3:
            return PyLong_FromLongLong(<int64_t>self.be(8))
        if 0xd9 <= code <= 0xdb:
            return self.text(<Py_ssize_t>self.be(1 << (code - 0xd9)))
        if code == 0xdc or code == 0xdd:
            return self.array(<Py_ssize_t>self.be(2 if code == 0xdc else 4), depth)
        if code == 0xde or code == 0xdf:
            return self.map(<Py_ssize_t>self.be(2 if code == 0xde else 4), depth)
        raise RemoteProtocolError(f"frame header is not msgpack: type 0x{code:02x} (an ext "
                                  "type, or not msgpack at all) is never in a header")


# Headers repeat the same short strings (keys, kinds, topics, producer ids): they are
# made once and kept in a small direct-mapped cache, so a decode costs no allocation, no
# UTF-8 decoding and no hashing for them (a str caches its hash, which dict inserts use).
cdef PyObject *_texts[TEXT_CACHE_SLOTS]
memset(_texts, 0, sizeof(_texts))


cdef object _short_text(const char *data, Py_ssize_t size):
    cdef uint32_t slot = 2166136261u
    cdef Py_ssize_t index, cached_size
    cdef const char *cached_data
    cdef PyObject *cached
    for index in range(size):
        slot = (slot ^ <uint8_t>data[index]) * 16777619u
    slot &= TEXT_CACHE_SLOTS - 1
    cached = _texts[slot]
    if cached != NULL:
        cached_data = PyUnicode_AsUTF8AndSize(<object>cached, &cached_size)
        if cached_size == size and memcmp(cached_data, data, size) == 0:
            return <object>cached
    text = _decode_text(data, size)
    Py_INCREF(text)
    Py_XDECREF(cached)
    _texts[slot] = <PyObject *>text
    return text


cdef object _decode_text(const char *data, Py_ssize_t size):
    try:
        return PyUnicode_DecodeUTF8(data, size, NULL)
    except UnicodeDecodeError as error:
        raise RemoteProtocolError(f"frame header is not msgpack: {error}") from None


cdef Frame _decode_one(const char *data, Py_ssize_t size):
    """One whole frame (``size`` bytes, its size field included)."""
    cdef uint32_t crc = _load_u32(data + 4), header_size = _load_u32(data + 8)
    cdef uint32_t actual
    cdef _Reader reader
    cdef Frame frame
    if size >= NOGIL_CRC_BYTES:
        with nogil:
            actual = mq_crc32c(0, data + 8, size - 8)
    else:
        actual = mq_crc32c(0, data + 8, size - 8)
    if actual != crc:
        raise RemoteProtocolError("frame CRC32C mismatch: the connection corrupted data")
    if PREFIX + <Py_ssize_t>header_size > size:
        raise RemoteProtocolError(f"frame header of {header_size} bytes overruns its frame")
    reader = _Reader.__new__(_Reader)
    reader.data = <const unsigned char *>data + PREFIX
    reader.at, reader.end = 0, header_size
    header = reader.value(0)
    if reader.at != reader.end:
        raise RemoteProtocolError("frame header is not msgpack: bytes follow its value")
    if not PyDict_Check(header):
        raise RemoteProtocolError("frame header must be a map")
    frame = Frame.__new__(Frame)
    frame.header = header
    frame.payload = PyBytes_FromStringAndSize(data + PREFIX + header_size,
                                              size - PREFIX - header_size)
    return frame


def decode_frames(buffer, Py_ssize_t start, Py_ssize_t frame_size_bytes_max):
    """Every whole frame in ``buffer[start:]``: (frames, where the rest begins, error).

    Decoding stops at the first incomplete frame, or at the first bad one: then
    ``error`` is the RemoteProtocolError it raises and the rest begins at it."""
    cdef Py_buffer view
    cdef const char *data
    cdef Py_ssize_t end
    cdef uint32_t frame_size
    frames = []
    error = None
    PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE)
    try:
        data, end = <const char *>view.buf, view.len
        while end - start >= 4:
            frame_size = _load_u32(data + start)
            if not 8 <= frame_size <= frame_size_bytes_max - 4:
                error = _size_error(frame_size, frame_size_bytes_max)
                break
            if end - start < <Py_ssize_t>frame_size + 4:
                break
            try:
                PyList_Append(frames, _decode_one(data + start, frame_size + 4))
            except RemoteProtocolError as bad:
                error = bad
                break
            start += frame_size + 4
    finally:
        PyBuffer_Release(&view)
    return frames, start, error


cdef object _size_error(uint32_t frame_size, Py_ssize_t frame_size_bytes_max):
    return RemoteProtocolError(
        f"frame of {frame_size + 4} bytes is outside [12, frame_size_bytes_max="
        f"{frame_size_bytes_max}]; the peer is not speaking mqlog, or sends "
        "frames larger than this node accepts")
