"""mqlog's C log core: ``mqlog.ext.fallback`` done fast.

``fallback.py`` is the executable specification and this module is its port: the same
classes, methods, arguments, errors (the classes of ``mqlog.errors``, raised under the
same conditions, with the same messages) and byte-identical files. Read fallback.py to
learn what the core does; read this module to see where the time goes.

Theory of operation (as in fallback.py)
---------------------------------------
The core owns the hot state of a store: the mapped segments of the commit log, the
mapped consume-queue files, the written and committed positions, the epoch and a write
lock. It creates no files; when it needs a segment or a consume-queue file it calls the
engine back (``new_segment``, ``new_queue_file``), which maps the file and hands it over
with ``attach_segment``/``attach_queue_file``. Those two (and ``add_queue``) take no
lock, because they run inside a callback while the core holds its write lock.

Write path: validate (nothing is touched if the arguments are bad) → take the write
lock → find or create the queue → make room in its consume-queue file → assign the
position (a record that does not fit leaves a blank record and rolls to a new segment),
offset and store timestamp → encode the record straight into the mapping → append the
consume-queue entry → advance the written (and maybe committed) position → release. A
put_batch first makes room for all of it (the twin's _room_for_batch): the segment it
goes in and every consume-queue file its entries go in, opened and backed, so a full
disk refuses it before any record is written. With
``write_segment`` and ``stage_batches`` (a sync-flush store), a put_batch that fits in
its segment and consume-queue file is encoded into a staging buffer, written with one
pwrite, and then published as a record is: its entries, then the written position (the
twin's _put_staged). With ``write_segment``, append_raw writes a replica's records that
fit in the last segment with one pwrite too, straight from the bytes received (the
twin's _apply_run).

Readers take no lock. They read a queue's next offset and the committed position, which
a writer publishes only after the bytes and the consume-queue entry they cover are in
place, and they check every record's size, magic, position and CRC32C.

Where things are (msgpack-python's way: one module, included files by subject)
--------------------------------------------------------------------------------
* ``_layout.pxi``: the externs of layout.h and crc32c.h, the Python-visible layout
  constants (mqlog/format.py is their definition; tests/test_format.py compares), the
  import-time check that layout.h agrees, and the compile-time figures;
* ``_queues.pxi``: mappings held as Py_buffers (Segment, QueueFile), the consume queues
  (_Queue, _Topic), and the check that a record is the one its entry names;
* ``_records.pxi``: CRC32C and the hashes, the record check, Record and ScanResult, and
  the raw walkers over a segment's memory;
* ``_arguments.pxi``: the arguments of a put or a read, validated;
* ``_waiter.pxi``: Waiter, where a sync-flush writer's thread sleeps until group commit
  wakes it (engine/flush.py), letting the GIL go before it wakes another;
* this file: LogCore, in the twin's sections (changes readers must notice, set-up by the
  engine, the write path, the read path, what replication needs, recovery, the key
  index; plus the write lock, which the twin does with threading.Lock), then the few
  helpers only it uses.

What differs from the twin
--------------------------
* State lives in C fields: each mapping is held as a ``Py_buffer`` (``PyObject_GetBuffer``,
  writable) in a small C struct, with its base, size and data pointer; the core keeps
  the last segment and each queue its last consume-queue file at hand. A put costs at
  most one dict lookup (topic -> per-topic object, whose queues are indexed by id in a
  list; a put with the same topic object and queue as the one before skips even that),
  no Python attribute lookups and no tuple keys. The buffers are released in
  ``detach_segments_from``, ``truncate`` (dropped consume-queue files), ``drop_queues``
  and ``release``: the engine closes each mmap right after, which fails (BufferError)
  while an export is held.
* Lock: a ``pthread_mutex_t`` (a ``PyThread_type_lock`` reads the clock on every
  acquire, even one that does not wait: a tenth of a put). It is first tried without
  releasing the GIL (the common, uncontended case costs two atomic operations); only
  when that fails is it waited for with the GIL released, so a writer that waits never
  holds the GIL and a writer that holds the lock can always get the GIL back: no
  deadlock. The thread that takes it always releases it (no method lets another thread
  release it, as a mutex requires). Methods that
  take the lock refuse (RuntimeError) to be re-entered from a callback of the same
  thread, where the twin's threading.Lock would hang forever.
* GIL: small records are encoded with the GIL held (releasing and re-taking it costs
  more than the copy). Bodies of 64 KiB or more are copied and checksummed with the
  GIL released; a writer does so under the write lock, which every method that drops a
  mapping also takes, so the mapping cannot go away. Readers copy a record (or
  read_raw's answer) out of the mapping with the GIL held, then check the CRC of their
  private copy with it released, so no reader ever holds an export that would make
  the engine's unmap fail; and they read nothing from a mapping (nor a Segment or
  QueueFile struct) after letting the GIL go, since a truncate, reset or retention
  may have unmapped and freed it meanwhile: they look everything up again, and the
  generation count (see the twin) tells them whether the log changed under them.
  Only scan_segment (recovery) holds an export of its own while it calls the engine
  back.
* CRC32C uses SSE4.2's crc32 instruction when the CPU has it (chosen at import; the
  extension is not built with -march=native) and slicing-by-8 tables otherwise
  (crc32c.h). The record layout lives in layout.h; at import this module checks that
  it agrees with the Python-visible constants below.
* Record is an extension type with a freelist and no GC tracking (it holds only bytes),
  so reading a thousand records allocates little and never triggers a collection.
"""

cimport cython
from cpython.bool cimport PyBool_Check
from cpython.buffer cimport (
    PyBUF_C_CONTIGUOUS,
    PyBUF_READ,
    PyBUF_SIMPLE,
    PyBUF_WRITABLE,
    PyBuffer_Release,
    PyObject_GetBuffer,
)
from cpython.bytes cimport (
    PyBytes_AS_STRING,
    PyBytes_Check,
    PyBytes_FromStringAndSize,
    PyBytes_GET_SIZE,
)
from cpython.dict cimport PyDict_Check, PyDict_GetItemWithError, PyDict_Size
from cpython.list cimport PyList_CheckExact
from cpython.long cimport (
    PyLong_AsLongLong,
    PyLong_AsLongLongAndOverflow,
    PyLong_AsUnsignedLongLongMask,
    PyLong_Check,
)
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.memoryview cimport PyMemoryView_FromMemory
from cpython.object cimport PyObject
from cpython.pythread cimport (
    NOWAIT_LOCK,
    PyThread_acquire_lock,
    PyThread_allocate_lock,
    PyThread_free_lock,
    PyThread_get_thread_ident,
    PyThread_release_lock,
    PY_LOCK_ACQUIRED,
    PY_LOCK_INTR,
    PyThread_type_lock,
)
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_Check, PyUnicode_DecodeUTF8
from libc.stdint cimport INT64_MAX, INT64_MIN, int64_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset
from posix.time cimport CLOCK_MONOTONIC, CLOCK_REALTIME_COARSE, clock_gettime, timespec

import os
import struct

import msgpack

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
include "_layout.pxi"

cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    int pthread_mutex_init(pthread_mutex_t *mutex, const void *attributes)
    int pthread_mutex_destroy(pthread_mutex_t *mutex)
    int pthread_mutex_lock(pthread_mutex_t *mutex)
    int pthread_mutex_trylock(pthread_mutex_t *mutex)
    int pthread_mutex_unlock(pthread_mutex_t *mutex)

try:  # the same bytes as msgpack.packb, faster for properties' usual types
    from mqlog.ext._wire import packb as _fast_packb
except ImportError:
    _fast_packb = msgpack.packb
cdef object _packb = _fast_packb
cdef object _unpackb = msgpack.unpackb
cdef object _struct_error = struct.error
cdef object _PutResult = PutResult
cdef object _BatchPutResult = BatchPutResult
cdef object _PUT_OK = PUT_OK


include "_queues.pxi"
include "_records.pxi"
include "_arguments.pxi"
include "_waiter.pxi"


cdef struct QueueRun:
    # The queue the last records planned by append_raw belong to (a replica's fetch holds
    # one partition's records: most records continue it). topic NULL: none.
    const char *topic  # the topic's bytes in the data being planned
    uint16_t topic_size
    uint32_t queue_id
    uint64_t next_offset


cdef inline bint _run_continues(QueueRun *run, const char *record, mq_header *header):
    """Whether ``record`` is the next record of the run's queue (then the run moves on);
    False sends it the slow way (``_plan_offset``), which also raises for a gap."""
    if run.topic == NULL or header.queue_id != run.queue_id or \
            header.topic_size != run.topic_size or \
            header.queue_offset != run.next_offset or \
            memcmp(record + MQ_HEADER_SIZE, run.topic, run.topic_size) != 0:
        return False
    run.next_offset += 1
    return True


# --- the core -------------------------------------------------------------------------

cdef char _ZEROS[1 << 20]  # (static storage: all zeros)


@cython.final
cdef class LogCore:
    """The hot state of one store; see the module docstring for the protocol."""

    cdef public long long segment_size_bytes
    cdef public long long message_size_bytes_max
    cdef public long long key_size_bytes_max
    cdef public long long tags_size_bytes_max
    cdef public long long batch_count_max  # bodies per put_batch (-1: no limit)
    cdef public bint verify_crc_on_read
    cdef public unsigned long long written_position
    cdef public unsigned long long committed_position
    cdef public bint commit_follows_written
    cdef public unsigned long long epoch
    cdef public list epoch_starts  # [(epoch, first position)], ascending
    cdef public long long last_store_timestamp
    cdef public unsigned long long last_keyed_end  # just past the last keyed record seen
    cdef readonly bint read_only  # mappings are held as plain, not writable, buffers

    cdef object _new_segment
    cdef object _new_queue_file
    cdef object _prepare_queue
    cdef object _prepare_segment
    cdef object _write_segment  # records go with pwrite (see the twin)
    cdef bint _stage_batches  # ... a put_batch's too
    cdef char *_stage  # where _put_staged encodes them (kept: a new buffer per batch
    cdef Py_ssize_t _stage_capacity  # this large would be mapped and faulted in anew)
    cdef uint64_t _publishing_end  # a staged batch's end while its entries go in (twin)
    # Bytes of the last segment below this position have blocks behind them (the engine
    # said so); 0 after any change to the segments: the next write asks again.
    cdef uint64_t _ready_end
    cdef object _clock_ms
    cdef object _fence
    cdef dict _queues  # topic -> _Topic
    cdef Segment **_segments  # ascending, contiguous
    cdef Py_ssize_t _segment_count
    cdef Py_ssize_t _segment_capacity
    cdef Py_ssize_t _locate_hint  # the segment the last lookup found
    cdef Segment *_tail  # the last segment, where records go (NULL: none)
    cdef pthread_mutex_t _mutex  # the write lock (see the module docstring)
    cdef long _lock_owner  # thread ident while held, else 0
    # _note_epoch's cache: the last item of epoch_starts it read, and its epoch
    cdef object _epoch_item
    cdef uint64_t _epoch_value
    cdef _Queue _dispatch_queue  # the queue the last dispatched record went to
    # put's cache: the topic object and queue of the last put, and its store timestamp
    # as a Python int (a loop of puts passes the same topic and mostly hits both)
    cdef object _put_topic
    cdef _Queue _put_queue
    cdef object _timestamp_object
    cdef int64_t _timestamp_value
    # put's last two results, refilled when the caller dropped them (mq_reused5)
    cdef PyObject *_spare_results[2]
    cdef int _spare_next
    # Readers keep no raw pointer into a mapping across a GIL release. Every method that
    # unmaps, frees or zeroes (truncate, trim_front, detach, drop_queues, release) makes
    # the generation odd while it works and even again when done: a reader that let the
    # GIL go, or whose record failed a check, compares it with the one it started with,
    # and if the log changed under it answers as if it had read after the change (a
    # typed "gone" error, never CorruptRecord for a healthy record dropped).
    cdef uint64_t _generation
    cdef bint _released  # release() ran: every read is StoreClosed

    def __cinit__(self, *args, **kwargs):
        if pthread_mutex_init(&self._mutex, NULL) != 0:
            raise MemoryError()
        self._queues = {}
        self.epoch_starts = []
        self.commit_follows_written = True

    def __init__(self, *, segment_size_bytes, message_size_bytes_max, key_size_bytes_max,
                 tags_size_bytes_max, new_segment, new_queue_file, clock_ms=None,
                 verify_crc_on_read=True, read_only=False, prepare_queue=None,
                 prepare_segment=None, batch_count_max=-1, write_segment=None,
                 stage_batches=False):
        self.read_only = read_only
        self.segment_size_bytes = segment_size_bytes
        self.message_size_bytes_max = message_size_bytes_max
        self.key_size_bytes_max = key_size_bytes_max
        self.tags_size_bytes_max = tags_size_bytes_max
        self.batch_count_max = batch_count_max
        self._new_segment = new_segment
        self._new_queue_file = new_queue_file
        self._prepare_queue = prepare_queue
        self._prepare_segment = prepare_segment
        self._write_segment = write_segment
        self._stage_batches = stage_batches and write_segment is not None
        self._clock_ms = clock_ms
        self.verify_crc_on_read = verify_crc_on_read

    def __dealloc__(self):
        self._drop_segments(0)
        PyMem_Free(self._segments)
        pthread_mutex_destroy(&self._mutex)
        PyMem_Free(self._stage)
        Py_XDECREF(self._spare_results[0])
        Py_XDECREF(self._spare_results[1])

    # --- the write lock ---------------------------------------------------------------

    cdef inline int _acquire(self) except -1:
        cdef long me = PyThread_get_thread_ident()
        if pthread_mutex_trylock(&self._mutex) != 0:
            if self._lock_owner == me:
                raise RuntimeError("the log core was called back under its own write lock "
                                   "(a new_segment/new_queue_file callback may only attach)")
            with nogil:
                pthread_mutex_lock(&self._mutex)
        self._lock_owner = me
        return 0

    cdef inline void _release(self) noexcept:
        self._lock_owner = 0
        pthread_mutex_unlock(&self._mutex)

    # --- changes readers must notice (see _generation) -------------------------------

    cdef inline void _begin_change(self) noexcept:
        self._generation += 1 if self._generation % 2 == 0 else 2

    cdef inline void _end_change(self) noexcept:
        self._generation += 1 if self._generation % 2 else 2

    cdef inline bint _changed(self, uint64_t generation) noexcept:
        """Whether the log may have changed since a reader saw ``generation``."""
        return generation % 2 == 1 or self._generation != generation

    cdef object _closed_error(self):
        if isinstance(self._fence, StoreClosed):
            return self._fence
        return StoreClosed("the store was closed; open it again")

    cdef int _check_released(self) except -1:
        if self._released:
            raise self._closed_error()
        return 0

    @property
    def generation(self):
        """Odd while a truncation, trim or release is under way; moves with each."""
        return self._generation

    # --- set-up by the engine ---------------------------------------------------------

    def attach_segment(self, base, buffer):
        """Add the next segment of the log (open, roll, or append_raw)."""
        cdef Segment *segment
        cdef Segment *last
        cdef uint64_t start = base
        if self._segment_count:
            last = self._segments[self._segment_count - 1]
            if start != last.base + last.size:
                _fail("segments must be contiguous")
        _grow(<void ***>&self._segments, &self._segment_capacity, self._segment_count)
        segment = <Segment *>PyMem_Malloc(sizeof(Segment))
        if segment == NULL:
            raise MemoryError()
        try:
            _hold(buffer, &segment.view, &segment.data, &segment.size, not self.read_only)
        except BaseException:
            PyMem_Free(segment)
            raise
        segment.base = start
        self._segments[self._segment_count] = segment
        self._segment_count += 1
        self._tail = segment
        self._ready_end = 0

    def detach_segments_from(self, position):
        """Forget every segment starting at or after ``position``; return their bases."""
        cdef uint64_t start
        _clamp_u64(position, &start)  # bisect_left semantics: below 0 drops everything
        self._acquire()
        self._begin_change()
        try:
            return self._detach_from(start)
        finally:
            self._end_change()
            self._release()

    cdef list _detach_from(self, uint64_t position):
        cdef Py_ssize_t index = 0
        while index < self._segment_count and self._segments[index].base < position:
            index += 1
        dropped = [self._segments[i].base for i in range(index, self._segment_count)]
        self._drop_segments(index)
        return dropped

    cdef void _drop_segments(self, Py_ssize_t keep) noexcept:
        while self._segment_count > keep:
            self._segment_count -= 1
            PyBuffer_Release(&self._segments[self._segment_count].view)
            PyMem_Free(self._segments[self._segment_count])
        self._locate_hint = 0
        self._tail = self._segments[self._segment_count - 1] if self._segment_count else NULL
        self._ready_end = 0

    def segment_bases(self):
        return [self._segments[i].base for i in range(self._segment_count)]

    def add_queue(self, topic, queue_id, min_offset, next_offset, entries_per_file):
        cdef _Topic queues = self._queues.get(topic)
        if queues is None:
            queues = _Topic()
            self._queues[topic] = queues
        if queue_id in queues.queues:
            _fail(f"queue {topic!r}/{queue_id} exists already")
        if entries_per_file <= 0:
            _fail("a consume-queue file must hold at least one entry")
        queues.add(queue_id, _new_queue(topic, queue_id, min_offset, next_offset,
                                        entries_per_file))

    def attach_queue_file(self, topic, queue_id, base_offset, buffer):
        cdef _Topic queues = self._queues[topic]
        cdef _Queue queue = queues.find_object(queue_id)
        if queue is None:
            raise KeyError(queue_id)
        queue.attach(base_offset, buffer, not self.read_only)

    def queue_ids(self):
        """Every (topic, queue id), under the write lock: a put may be adding one."""
        self._acquire()
        try:
            return [(topic, queue_id) for topic, queues in self._queues.items()
                    for queue_id in (<_Topic>queues).queues]
        finally:
            self._release()

    def release(self):
        """Let go of every mapping (the engine is about to unmap them); every later
        read raises StoreClosed."""
        self._acquire()
        self._begin_change()
        try:
            self._released = True
            self._drop_segments(0)
            self._drop_all_queues()
        finally:
            self._end_change()
            self._release()

    def drop_queues(self):
        """Forget every queue (recovery is about to rebuild them from the log)."""
        self._acquire()
        self._begin_change()
        try:
            self._drop_all_queues()
        finally:
            self._end_change()
            self._release()

    cdef int _drop_all_queues(self) except -1:
        for queue in self._all_queues():
            (<_Queue>queue).release_files(0)
        self._queues.clear()
        self._dispatch_queue = None
        self._put_queue = None
        return 0

    cdef list _all_queues(self):
        return [queue for queues in self._queues.values()
                for queue in (<_Topic>queues).queues.values()]

    cdef _Queue _find_queue(self, object topic, object queue_id):
        """The queue, or None (the twin's ``_queues.get(topic, {}).get(queue_id)``)."""
        cdef PyObject *queues = PyDict_GetItemWithError(self._queues, topic)
        if queues == NULL:
            return None
        return (<_Topic>queues).find_object(queue_id)

    def committed_end_offset(self, topic, queue_id):
        """One past the last offset of the queue whose record is committed."""
        cdef _Queue queue = self._find_queue(topic, queue_id)
        cdef uint64_t low, high, middle, position, committed = self.committed_position
        cdef const char *entry
        if queue is None:
            return 0
        low, high = queue.min_offset, queue.next_offset
        if self.committed_position >= self.written_position:
            return high
        while low < high:
            middle = low + (high - low) // 2
            entry = queue.entry(middle)
            position = mq_u64(entry + MQ_CQ_AT_POSITION)
            if position <= committed and mq_u32(entry + MQ_CQ_AT_SIZE) <= committed - position:
                low = middle + 1
            else:
                high = middle
        return low

    def queue_offsets(self, topic, queue_id):
        """(min offset, next offset) of a queue, or None if it has never been written."""
        cdef _Queue queue = self._find_queue(topic, queue_id)
        return None if queue is None else (queue.min_offset, queue.next_offset)

    def restore(self, written_position):
        """After open: resume writing at ``written_position`` (must lie in the last segment)."""
        cdef Segment *last
        cdef uint64_t position = written_position
        if self._segment_count:
            last = self._segments[self._segment_count - 1]
            if not last.base <= position <= last.base + last.size:
                _fail(f"written position {position} lies outside the last segment")
        self.written_position = position
        self._ready_end = 0

    def fence(self, error):
        """Refuse every later write with ``error`` (closed store, failed flush); None lifts it."""
        self._fence = error

    # --- the write path ---------------------------------------------------------------

    def put(self, topic, body, queue_id=0, key=None, tags=None, properties=None,
            born_timestamp=None):
        """Store one record. See the module docstring for the steps."""
        cdef Fields fields
        cdef Body data
        if self._fence is not None:
            raise self._fence
        # (the packed properties: fields points into them)
        _packed = self._prepare(&fields, topic, queue_id, key, tags, properties,
                                born_timestamp)
        _acquire_body(&data, body)
        if not data.held:
            return self._put(&fields, topic, queue_id, data.data, data.size)
        try:
            return self._put(&fields, topic, queue_id, data.data, data.size)
        finally:
            PyBuffer_Release(&data.view)

    cdef object _put(self, Fields *fields, object topic, object queue_id, const char *body,
                     Py_ssize_t body_size):
        cdef uint32_t size = self._record_size(fields, body_size)
        cdef uint64_t position, offset
        cdef int64_t store_timestamp
        cdef _Queue queue
        self._acquire()
        try:
            if self._fence is not None:
                raise self._fence
            queue = self._writable_queue(fields, topic, queue_id)
            store_timestamp = self._next_timestamp()
            position = self._append(queue, fields, body, body_size, size, store_timestamp)
            offset = queue.next_offset - 1
        finally:
            self._release()
        if store_timestamp != self._timestamp_value or self._timestamp_object is None:
            self._timestamp_object = store_timestamp
            self._timestamp_value = store_timestamp
        return _reused5(self._spare_results, &self._spare_next, _PutResult, _PUT_OK,
                        position, offset, self._timestamp_object, size)

    def put_batch(self, topic, bodies, queue_id=0, key=None, tags=None, properties=None,
                  born_timestamp=None):
        """Store many records in one queue under one lock hold and one store timestamp.
        ``born_timestamp`` may be a list: one per body (a replay keeps each record's)."""
        cdef Fields fields
        cdef tuple items
        cdef list borns = born_timestamp if PyList_CheckExact(born_timestamp) else None
        if self._fence is not None:
            raise self._fence
        # (the packed properties: fields points into them)
        _packed = self._prepare(&fields, topic, queue_id, key, tags, properties,
                                None if borns is not None else born_timestamp)
        items = _bodies_as_bytes(bodies)
        if not items:
            raise InvalidArgument("put_batch needs at least one body")
        if 0 <= self.batch_count_max < len(items):
            raise InvalidArgument(f"put_batch got {len(items)} bodies; at most "
                                  f"batch_count_max={self.batch_count_max}: split the batch")
        if borns is not None:
            _check_borns(borns, len(items))
        self._check_sizes(&fields, items)
        self._acquire()
        try:
            if self._fence is not None:
                raise self._fence
            return self._put_all(&fields, topic, queue_id, items, borns)
        finally:
            self._release()

    cdef int _check_sizes(self, Fields *fields, tuple items) except -1:
        """MessageTooLarge for the first body too large (the twin sizes them all first)."""
        cdef Py_ssize_t longest = 0
        for body in items:
            longest = max(longest, PyBytes_GET_SIZE(body))
        if self.message_size_bytes_max >= 0 and fields.fixed_size + <uint64_t>longest <= \
                min(<uint64_t>self.message_size_bytes_max, <uint64_t>U32_MAX):
            return 0  # they all fit
        for body in items:
            self._record_size(fields, PyBytes_GET_SIZE(body))
        return 0

    cdef object _put_all(self, Fields *fields, object topic, object queue_id, tuple items,
                         list borns):
        """put_batch under the lock: the bodies are bytes, their sizes (and born
        timestamps, when given one per body) already checked."""
        cdef _Queue queue = self._writable_queue(fields, topic, queue_id)
        cdef int64_t store_timestamp = self._next_timestamp()
        cdef uint64_t first_offset = queue.next_offset, position, total = 0
        cdef uint64_t first_position
        cdef Py_ssize_t index, count = len(items), body_size
        cdef bytes body
        for index in range(count):
            total += fields.fixed_size + <uint64_t>PyBytes_GET_SIZE(<bytes>items[index])
        self._room_for_batch(queue, <uint64_t>count, total)
        first_position = self.written_position
        if self._stage_batches and self._put_staged(queue, fields, items, borns, total,
                                                    store_timestamp):
            return _tuple6(_BatchPutResult, _PUT_OK, first_position, first_offset, count,
                           store_timestamp, self.written_position)
        first_position = 0
        for index in range(count):
            body = <bytes>items[index]
            body_size = PyBytes_GET_SIZE(body)
            if borns is not None:
                fields.has_born_timestamp = True
                fields.born_timestamp = PyLong_AsLongLong(borns[index])
            position = self._append(queue, fields, PyBytes_AS_STRING(body), body_size,
                                    <uint32_t>(fields.fixed_size + body_size),
                                    store_timestamp)
            if index == 0:
                first_position = position
        return _tuple6(_BatchPutResult, _PUT_OK, first_position, first_offset, count,
                       store_timestamp, self.written_position)

    cdef int _room_for_batch(self, _Queue queue, uint64_t count, uint64_t total) except -1:
        """Before a batch writes anything, room for all of it: the segment it all goes
        in, backed for all of it, and every consume-queue file its ``count`` entries go
        in, opened and backed (the twin's _room_for_batch: a full disk refusing the next
        segment or consume-queue file part way through a batch left the records before
        it stored)."""
        cdef Segment *segment
        if total + MQ_BLANK_SIZE_MIN <= <uint64_t>self.segment_size_bytes:
            self._ensure_segment()
            segment = self._writable_segment()
            if self.written_position - segment.base + total + MQ_BLANK_SIZE_MIN > \
                    segment.size:
                segment = self._roll(segment)
            self._ensure_ready(segment, self.written_position + total + MQ_BLANK_SIZE_MIN)
        self._room_for_entries(queue, count)
        return 0

    cdef int _room_for_entries(self, _Queue queue, uint64_t count) except -1:
        """The consume-queue files of the queue's next ``count`` entries, opened and
        backed, each to its end before the next is opened (the twin's)."""
        cdef uint64_t end = queue.next_offset + count, file_end, ready
        self._ensure_queue_room(queue)
        while True:
            file_end = queue.last_base + queue.entries_per_file
            while min(end, file_end) > queue.ready_end:
                if self._prepare_queue is None:
                    queue.ready_end = 0xFFFF_FFFF_FFFF_FFFF
                    break
                ready = self._prepare_queue(queue.topic, queue.queue_id, queue.ready_end)
                if ready <= queue.ready_end:
                    _fail(f"prepare_queue answered {ready} for entries ready to "
                          f"{queue.ready_end}")
                queue.ready_end = ready
            if end <= file_end:
                return 0
            self._new_queue_file(queue.topic, queue.queue_id, file_end)

    cdef Segment *_roll(self, Segment *segment) except NULL:
        """Close ``segment`` with a blank (its block backed first) and open the next."""
        self._ensure_ready(segment, self.written_position + MQ_BLANK_SIZE_MIN)
        self._write_blank(segment)
        self._new_segment(self.written_position)
        return self._writable_segment()

    cdef bint _put_staged(self, _Queue queue, Fields *fields, tuple items, list borns,
                          uint64_t total, int64_t store_timestamp) except -1:
        """put_batch with ``stage_batches``: the records encoded into one buffer, written
        with one pwrite, then published as _append publishes one; False, with nothing
        written, when the batch must go record by record (the twin's _put_staged: larger
        than a segment, or crossing its consume-queue file's end). The
        callback's view of the buffer is valid only during the call. ``total``: the
        records' bytes (summed once, by _put_all), which _room_for_batch made room for."""
        cdef Py_ssize_t index, count = len(items)
        cdef uint64_t at = 0, start, epoch
        cdef uint32_t size
        cdef Segment *segment
        cdef bytes body
        cdef char *cursor
        cdef mq_header header
        if total > STAGE_BYTES_MAX or queue.next_offset < queue.last_base:
            return False  # (the twin's: _room_for_batch opened the next file)
        self._ensure_segment()
        segment = self._writable_segment()
        start = self.written_position
        if start - segment.base + total + MQ_BLANK_SIZE_MIN > segment.size:
            return False
        self._ensure_ready(segment, start + total + MQ_BLANK_SIZE_MIN)
        if fields.too_wide:  # as the twin's HEADER.pack_into
            raise _struct_error("ushort format requires 0 <= number <= 65535")
        epoch = self.epoch  # (the callbacks ran Python code)
        cursor = self._staging(<Py_ssize_t>total)
        for index in range(count):
            body = <bytes>items[index]
            if borns is not None:
                fields.has_born_timestamp = True
                fields.born_timestamp = PyLong_AsLongLong(borns[index])
            size = <uint32_t>(fields.fixed_size + PyBytes_GET_SIZE(body))
            _fill_header(&header, fields, queue.queue_id, size, PyBytes_GET_SIZE(body), epoch,
                         queue.next_offset + <uint64_t>index, start + at, store_timestamp)
            _encode(cursor + at, &header, fields, PyBytes_AS_STRING(body))
            at += size
        staged = PyMemoryView_FromMemory(cursor, <Py_ssize_t>total, PyBUF_READ)
        try:
            self._write_segment(segment.base, start - segment.base, staged)
        finally:
            staged.release()  # (the buffer is the next batch's: no view may outlive this)
            self._shrink_stage()
        self._note_epoch(epoch, start)
        self._publishing_end = start + total
        at = start
        for index in range(count):
            size = <uint32_t>(fields.fixed_size + PyBytes_GET_SIZE(<bytes>items[index]))
            self._index(queue, at, size, fields.tag_hash)
            at += size
        if fields.key_size:
            self.last_keyed_end = start + total
        self._advance(start + total)
        self._publishing_end = 0
        return True

    cdef char *_staging(self, Py_ssize_t size) except NULL:
        """The staging buffer, at least ``size`` bytes (at most STAGE_BYTES_MAX)."""
        cdef char *grown
        if size > self._stage_capacity:
            grown = <char *>PyMem_Realloc(self._stage, size)
            if grown == NULL:
                raise MemoryError()
            self._stage, self._stage_capacity = grown, size
        return self._stage

    cdef void _shrink_stage(self) noexcept:
        """Give a staging buffer grown past STAGE_KEPT_BYTES back (a store holds one)."""
        if self._stage_capacity > STAGE_KEPT_BYTES:
            PyMem_Free(self._stage)
            self._stage, self._stage_capacity = NULL, 0

    cdef object _prepare(self, Fields *fields, object topic, object queue_id, object key,
                         object tags, object properties, object born_timestamp):
        """Validate put's arguments into ``fields``; return what keeps them alive."""
        if not PyUnicode_Check(topic):
            raise InvalidArgument(f"topic must be str, got {type(topic).__name__}")
        _check_queue_id(fields, queue_id)
        _text_field(&fields.key, &fields.key_size, "key", key, self.key_size_bytes_max)
        _text_field(&fields.tags, &fields.tags_size, "tags", tags, self.tags_size_bytes_max)
        if fields.tags_size:
            _check_tags(tags)
        packed = _pack_properties(properties)
        if packed is None:
            fields.properties = NULL
            fields.properties_size = 0
        else:
            fields.properties = PyBytes_AS_STRING(packed)
            fields.properties_size = PyBytes_GET_SIZE(packed)
        _check_born(fields, born_timestamp)
        try:
            fields.topic = PyUnicode_AsUTF8AndSize(topic, &fields.topic_size)
        except UnicodeEncodeError:
            raise _text_error("topic", topic) from None
        fields.tag_hash = mq_fnv1a64(<const unsigned char *>fields.tags, fields.tags_size)
        fields.fixed_size = (MQ_HEADER_SIZE + fields.topic_size + fields.key_size
                             + fields.tags_size + fields.properties_size)
        if fields.topic_size > U16_MAX:
            fields.too_wide = WIDE_U16
        elif not fields.too_wide and (fields.key_size > U16_MAX or fields.tags_size > U16_MAX):
            fields.too_wide = WIDE_U16
        return packed

    cdef uint32_t _record_size(self, Fields *fields, Py_ssize_t body_size) except 0:
        cdef uint64_t size = fields.fixed_size + <uint64_t>body_size
        if self.message_size_bytes_max < 0 or size > <uint64_t>self.message_size_bytes_max:
            raise MessageTooLarge(
                f"record of {size} bytes exceeds message_size_bytes_max="
                f"{self.message_size_bytes_max}; send a smaller body or raise the limit")
        if size > U32_MAX:
            raise MessageTooLarge(f"record of {size} bytes exceeds the format's 4 GiB limit")
        return <uint32_t>size

    cdef _Queue _writable_queue(self, Fields *fields, object topic, object queue_id):
        cdef PyObject *queues
        cdef _Queue queue = self._put_queue
        if queue is not None and topic is self._put_topic and \
                fields.queue_id == queue.queue_id:
            return queue  # (the cache holds the topic: its identity cannot be reused)
        queue = None
        queues = PyDict_GetItemWithError(self._queues, topic)
        if queues != NULL and fields.queue_id_fits:
            queue = (<_Topic>queues).find(fields.queue_id)
        if queue is None:
            # The engine validates the name and id, creates the files and calls add_queue.
            self._new_queue_file(topic, queue_id, 0)
            queue = (<_Topic>self._queues[topic]).find_object(queue_id)
            if queue is None:
                raise KeyError(queue_id)
        self._put_topic = topic
        self._put_queue = queue
        return queue

    cdef int64_t _next_timestamp(self) except? -1:
        cdef int64_t now
        if self._clock_ms is None:
            now = _wall_clock_ms()
        else:
            now = self._clock_ms()
        if now > self.last_store_timestamp:
            self.last_store_timestamp = now
        return self.last_store_timestamp

    cdef uint64_t _append(self, _Queue queue, Fields *fields, const char *body,
                          Py_ssize_t body_size, uint32_t size,
                          int64_t store_timestamp) except? 0xFFFF_FFFF_FFFF_FFFF:
        """Encode one record at the end of the log and index it; return its position."""
        cdef char *record = self._fast_slot(queue, size)
        cdef uint64_t position, epoch = self.epoch
        cdef mq_header header
        if record == NULL:  # first a new consume-queue file, a new segment or a roll
            record = self._slow_slot(queue, size)
            epoch = self.epoch  # (the callbacks ran Python code)
        if fields.too_wide:  # as the twin's HEADER.pack_into
            raise _struct_error("ushort format requires 0 <= number <= 65535")
        position = self.written_position
        _fill_header(&header, fields, queue.queue_id, size, body_size, epoch,
                     queue.next_offset, position, store_timestamp)
        _encode(record, &header, fields, body)
        self._note_epoch(epoch, position)
        self._index(queue, position, size, fields.tag_hash)
        if fields.key_size:
            self.last_keyed_end = position + size
        self._advance(position + size)  # publishes the record
        return position

    cdef inline char *_fast_slot(self, _Queue queue, uint32_t size) noexcept:
        """Where a record of ``size`` bytes goes, if the twin would call back nothing
        first (no new consume-queue file, no new segment, no roll); else NULL."""
        cdef Segment *tail = self._tail
        cdef uint64_t offset
        if tail == NULL or queue.last_data == NULL or \
                queue.next_offset - queue.last_base >= queue.entries_per_file or \
                queue.next_offset >= queue.ready_end:
            return NULL  # (next_offset below last_base wraps around: also the slow way)
        offset = self.written_position - tail.base  # (wraps around if below: slow way)
        if offset > tail.size or tail.size - offset < <uint64_t>size + MQ_BLANK_SIZE_MIN or \
                self.written_position + size + MQ_BLANK_SIZE_MIN > self._ready_end:
            return NULL
        return tail.data + offset

    cdef char *_slow_slot(self, _Queue queue, uint32_t size) except NULL:
        """_fast_slot's answer after the twin's steps that call the engine back."""
        cdef Segment *segment
        self._ensure_queue_room(queue)
        segment = self._reserve(size)
        return segment.data + (self.written_position - segment.base)

    cdef int _ensure_queue_room(self, _Queue queue) except -1:
        if queue.file_count == 0:
            raise IndexError(f"queue {queue.topic!r}/{queue.queue_id} has no consume-queue "
                             "file")
        if queue.next_offset >= queue.last_base + queue.entries_per_file:
            self._new_queue_file(queue.topic, queue.queue_id,
                                 queue.last_base + queue.entries_per_file)
        if queue.next_offset >= queue.ready_end:
            if self._prepare_queue is None:
                queue.ready_end = 0xFFFF_FFFF_FFFF_FFFF
            else:
                queue.ready_end = self._prepare_queue(queue.topic, queue.queue_id,
                                                      queue.next_offset)
        return 0

    cdef Segment *_reserve(self, uint32_t size) except NULL:
        """The segment where a record of ``size`` bytes goes at the written position."""
        cdef Segment *segment
        self._ensure_segment()
        segment = self._writable_segment()
        if self.written_position - segment.base + size + MQ_BLANK_SIZE_MIN > segment.size:
            segment = self._roll(segment)
            if segment.base != self.written_position or \
                    size + MQ_BLANK_SIZE_MIN > segment.size:
                _fail(f"a new segment at {self.written_position} must take a record of "
                      f"{size} bytes")
        self._ensure_ready(segment, self.written_position + size + MQ_BLANK_SIZE_MIN)
        return segment

    cdef int _ensure_ready(self, Segment *segment, uint64_t end) except -1:
        """Have the engine back the last segment with blocks up to ``end`` (never write
        through a mapping into a hole: on a full disk that is a SIGBUS, not an error)."""
        if end <= self._ready_end:
            return 0
        if self._prepare_segment is None:
            self._ready_end = segment.base + segment.size
            return 0
        ready = self._prepare_segment(segment.base, end)
        if ready < end or ready > segment.base + segment.size:
            _fail(f"prepare_segment answered {ready} for a segment that must be ready to "
                  f"{end}")
        self._ready_end = ready
        return 0

    cdef Segment *_writable_segment(self) except NULL:
        """The last segment, which must hold the written position."""
        cdef Segment *segment
        if self._segment_count == 0:
            _fail("the log has no segment to write to")
        segment = self._segments[self._segment_count - 1]
        if not segment.base <= self.written_position <= segment.base + segment.size:
            _fail(f"written position {self.written_position} lies outside the last segment")
        return segment

    cdef int _ensure_segment(self) except -1:
        """Open the next segment when there is none or the last one is full."""
        cdef Segment *last
        if self._segment_count:
            last = self._segments[self._segment_count - 1]
            if self.written_position != last.base + last.size:
                return 0
        self._new_segment(self.written_position)
        return 0

    cdef int _write_blank(self, Segment *segment) except -1:
        cdef uint64_t offset = self.written_position - segment.base
        if offset + MQ_BLANK_SIZE_MIN > segment.size:
            _fail("no room for a blank record")
        mq_put_u32(segment.data + offset, <uint32_t>(segment.size - offset))
        mq_put_u32(segment.data + offset + 4, MQ_BLANK_MAGIC)
        self._advance(segment.base + segment.size)
        return 0

    cdef inline int _index(self, _Queue queue, uint64_t position, uint32_t size,
                           uint64_t hash_value) except -1:
        cdef uint64_t slot = queue.next_offset - queue.last_base
        if queue.next_offset < queue.last_base or slot >= queue.entries_per_file:
            # (a file before the last: put_batch opened the one its last entries go in)
            mq_write_cq_entry(<char *>queue.entry(queue.next_offset), position, size,
                              hash_value)
        else:
            mq_write_cq_entry(queue.last_data + slot * MQ_CQ_ENTRY_SIZE, position, size,
                              hash_value)
        queue.next_offset += 1  # publishes the entry
        return 0

    cdef inline int _note_epoch(self, uint64_t epoch, uint64_t position) except -1:
        cdef list starts = self.epoch_starts
        cdef Py_ssize_t count = len(starts)
        if count:
            if starts[count - 1] is self._epoch_item:
                if self._epoch_value == epoch:
                    return 0
                if self._epoch_value > epoch:
                    _fail(f"epoch {epoch} is older than the log's last epoch")
            elif self._epoch_matches(starts[count - 1], epoch):
                return 0
        item = (epoch, position)
        starts.append(item)
        self._epoch_item = item
        self._epoch_value = epoch
        return 0

    cdef bint _epoch_matches(self, object last, uint64_t epoch) except -1:
        """Whether ``last`` (an item of epoch_starts) is of ``epoch``; remember it."""
        # The engine may replace epoch_starts. Keeping the tuple whose epoch was read (a
        # strong reference: its address cannot be reused) lets later records compare two
        # integers instead of indexing Python objects.
        cdef uint64_t value
        last_epoch = last[0]
        if type(last) is tuple and PyLong_Check(last_epoch) and \
                _clamp_u64(last_epoch, &value) == 0:
            self._epoch_item = last
            self._epoch_value = value
        if last_epoch == epoch:
            return True
        if not last_epoch < epoch:
            _fail(f"epoch {epoch} is older than the log's last epoch")
        return False

    cdef inline void _advance(self, uint64_t position) noexcept:
        self.written_position = position
        if self.commit_follows_written:
            self.committed_position = position

    # --- the read path ----------------------------------------------------------------

    def get(self, topic, queue_id, offset, max_count, max_bytes):
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
        cdef _Queue queue
        cdef uint64_t start, stop, count
        self._check_released()
        _check_read_arguments(topic, queue_id, offset, max_count, max_bytes)
        queue = self._find_queue(topic, queue_id)
        self._check_read_offset(queue, topic, queue_id, offset, &start)
        if _clamp_u64(max_count, &count) < 0 or queue is None:
            return []  # max_count <= 0 (or no queue) asks for nothing
        stop = queue.next_offset if count >= queue.next_offset - start else start + count
        return self._read_queue(queue, start, stop, _clamp_i64(max_bytes))

    cdef int _check_read_offset(self, _Queue queue, object topic, object queue_id,
                                object offset, uint64_t *start) except -1:
        cdef uint64_t min_offset = 0, next_offset = 0
        if queue is not None:
            min_offset, next_offset = queue.min_offset, queue.next_offset
        if _clamp_u64(offset, start) != 0 or not min_offset <= start[0] <= next_offset:
            raise OffsetOutOfRange(
                f"offset {offset} is outside [{min_offset}, {next_offset}] of queue "
                f"{topic!r}/{queue_id}; seek to a valid offset", min_offset=min_offset,
                max_offset=next_offset)
        return 0

    def pull(self, topic, queue_id, offset, max_count, max_bytes, tag_hashes, scan_count_max):
        """``get`` with a tag filter: returns (records, next offset to pull from).

        Entries whose consume-queue tag hash is not in ``tag_hashes`` are skipped without
        touching the commit log (an empty tuple keeps every record). At most
        ``scan_count_max`` entries are examined, so the answer may be empty while the
        next offset moves on: a consumer always makes progress. A damaged record past
        the first entry examined ends the answer before it (as ``get``): the next
        offset is its own, and the pull from there raises CorruptRecord.
        """
        cdef _Queue queue
        cdef uint64_t hashes[TAG_HASHES_MAX]
        cdef Py_ssize_t hash_count = len(tag_hashes), index
        cdef uint64_t start, count, scan, stop
        self._check_released()
        _check_read_arguments(topic, queue_id, offset, max_count, max_bytes)
        queue = self._find_queue(topic, queue_id)
        self._check_read_offset(queue, topic, queue_id, offset, &start)
        if hash_count > TAG_HASHES_MAX:
            raise InvalidArgument(f"a tag filter may name at most {TAG_HASHES_MAX} tags")
        for index in range(hash_count):
            _clamp_u64(tag_hashes[index], &hashes[index])
        _clamp_u64(max_count, &count)
        _clamp_u64(scan_count_max, &scan)
        if queue is None:
            return [], start
        stop = queue.next_offset if scan >= queue.next_offset - start else start + scan
        return self._pull(queue, start, stop, count, _clamp_i64(max_bytes), hashes, hash_count)

    cdef tuple _pull(self, _Queue queue, uint64_t index, uint64_t stop, uint64_t count,
                     int64_t max_bytes, const uint64_t *hashes, Py_ssize_t hash_count):
        cdef list records = []
        cdef uint64_t position, total = 0, generation = self._generation, start = index
        cdef uint32_t size
        cdef const char *entry
        cdef Record record
        while index < stop and <uint64_t>len(records) < count:
            # Checked every time: a large record is read with the GIL released, and
            # meanwhile a truncation, retention or close may change the queue.
            if self._moved_on(generation) or index < queue.min_offset or \
                    index >= queue.next_offset:
                break
            entry = queue.entry(index)
            position = mq_u64(entry + MQ_CQ_AT_POSITION)
            size = mq_u32(entry + MQ_CQ_AT_SIZE)
            if not self._visible(queue, index, position, size, generation):
                break
            if hash_count and not _has_hash(hashes, hash_count,
                                            mq_u64(entry + MQ_CQ_AT_HASH)):
                index += 1
                continue
            if records and <int64_t>(total + size) > max_bytes:
                break
            record = self._read_entry(queue, index, position, size, generation,
                                      index == start)
            if record is None:
                break
            records.append(record)
            total += size
            index += 1
        return records, index

    cdef list _read_queue(self, _Queue queue, uint64_t start, uint64_t stop,
                          int64_t max_bytes):
        cdef list records = []
        cdef uint64_t index, position, total = 0, generation = self._generation
        cdef uint32_t size
        cdef Py_ssize_t file_index = -1
        cdef QueueFile *file
        cdef const char *entry
        cdef Record record
        for index in range(start, stop):
            # Checked every time: a large record is read with the GIL released, and
            # meanwhile a truncation, retention or close may change the queue.
            if self._moved_on(generation) or index >= queue.next_offset or \
                    index < queue.min_offset:
                break
            if file_index < 0 or file_index >= queue.file_count or \
                    index - queue.files[file_index].base >= queue.entries_per_file:
                file_index = queue.file_index(index)
            file = queue.files[file_index]
            entry = file.data + (index - file.base) * MQ_CQ_ENTRY_SIZE
            position = mq_u64(entry + MQ_CQ_AT_POSITION)
            size = mq_u32(entry + MQ_CQ_AT_SIZE)
            if not self._visible(queue, index, position, size, generation) or \
                    (records and <int64_t>(total + size) > max_bytes):
                break
            record = self._read_entry(queue, index, position, size, generation,
                                      index == start)
            if record is None:
                break
            records.append(record)
            total += size
        return records

    cdef inline bint _moved_on(self, uint64_t generation) except -1:
        """Whether a change completed since ``generation`` (StoreClosed if a release)."""
        if self._generation == generation:
            return False
        self._check_released()
        return True

    cdef inline bint _visible(self, _Queue queue, uint64_t offset, uint64_t position,
                              uint32_t size, uint64_t generation) except -1:
        """Whether the record an entry points to is committed. An entry whose record
        would end past the written position is garbage, not a record yet to come:
        waiting would never show it (the consumer would be stuck below max_offset), so
        it is an error."""
        cdef uint64_t committed = self.committed_position, written = self.written_position
        if position <= committed and size <= committed - position:
            return True
        if (position <= written and size <= written - position) or \
                self._yet_to_come(queue, offset, position, size, written):
            return False
        if self._changed(generation):
            return False
        _entry_mismatch(queue, offset, position, size,
                        f"past the end of the log ({written})")

    cdef inline bint _yet_to_come(self, _Queue queue, uint64_t offset, uint64_t position,
                                  uint32_t size, uint64_t written) noexcept:
        """Whether an entry past the written position (as read, ``written``) is one a
        writer publishes before it moves the written position over its record. (Sums
        are not formed: a garbage entry's position + size may wrap around.)"""
        cdef uint64_t staged_end = self._publishing_end, now = self.written_position
        return (offset + 1 == queue.next_offset and position == written) or \
            (written <= position <= staged_end and size <= staged_end - position) or \
            (position <= now and size <= now - position)  # (published since)

    cdef Record _read_entry(self, _Queue queue, uint64_t offset, uint64_t position,
                            uint32_t size, uint64_t generation, bint first):
        """The record of a consume-queue entry, or None if the log changed under the read
        (the record went away: the answer ends before it) or, unless it is the ``first``
        entry the read examines, if the record is damaged (the answer ends before it;
        the read that starts at it raises CorruptRecord)."""
        cdef int problem
        cdef bytes raw = self._copy_record(position, size, &problem)
        if problem == RECORD_OK:
            if _is_queue_record(PyBytes_AS_STRING(raw), queue, offset):
                return _new_record(raw)
            problem = RECORD_IDENTITY
        if self._changed(generation):
            self._check_released()
            return None
        self._refuse_entry(queue, offset, position, size, problem, raw, first)

    cdef bytes _copy_record(self, uint64_t position, uint32_t size, int *problem):
        """A private copy of the ``size`` bytes at ``position`` and what _check_record
        says of it (``problem``; None and a problem if they are not in one segment).

        Copied with the GIL held (the mapping cannot go away meanwhile), checked on the
        copy, without the GIL if it is large: a reader never holds an export that would
        make the engine's unmap fail, nor a pointer into a mapping that it may unmap."""
        cdef Segment *segment
        cdef uint64_t offset
        cdef bytes raw
        if self._segment_count == 0 or position < self._segments[0].base:
            problem[0] = RECORD_BEFORE_LOG
            return None
        segment = self._locate(position)
        offset = position - segment.base
        if size > segment.size or offset > segment.size - size:
            problem[0] = RECORD_PAST_END
            return None
        raw = PyBytes_FromStringAndSize(segment.data + offset, size)
        problem[0] = _check_copy(PyBytes_AS_STRING(raw), size, position,
                                 self.verify_crc_on_read)
        return raw

    cdef int _refuse_entry(self, _Queue queue, uint64_t offset, uint64_t position,
                           uint32_t size, int problem, bytes raw, bint first) except -1:
        """Raise what a failed read of an entry's record means. If the log holds an
        intact record at the entry's position that is not the one named (another
        queue's, another offset's, another size), the entry is wrong:
        ConsumeQueueMismatch. Else the bytes there are damaged: CorruptRecord, raised
        only for the ``first`` entry a read examines (past it, the answer ends before
        the damaged record and this returns)."""
        cdef Segment *segment
        cdef const char *p
        cdef mq_header header
        if problem == RECORD_BEFORE_LOG:
            _entry_mismatch(queue, offset, position, size, "before the log's first segment")
        if problem == RECORD_IDENTITY or self._intact_at(position):
            segment = self._locate(position)
            p = segment.data + (position - segment.base)
            mq_read_header(p, &header)
            # (bounded again: another process may have rewritten the header since)
            topic = PyUnicode_DecodeUTF8(
                p + MQ_HEADER_SIZE, min(header.topic_size, segment.size - MQ_HEADER_SIZE -
                                        (position - segment.base)), "replace")
            _entry_mismatch(queue, offset, position, size,
                            f"which holds the record of {topic!r}/{header.queue_id} offset "
                            f"{header.queue_offset} ({header.size} bytes)")
        if self._inside_record(position):
            _entry_mismatch(queue, offset, position, size,
                            "which lies inside a record, not at its start")
        if not first:
            return 0
        if problem == RECORD_PAST_END:
            raise CorruptRecord(position, f"size {size} runs past the segment's end")
        raise CorruptRecord(position, _problem_text(problem, PyBytes_AS_STRING(raw)))

    cdef bint _inside_record(self, uint64_t position) except -1:
        """Whether ``position`` lies inside a whole record, past its start, with every
        record before it in its segment whole too (the twin's docstring says what is
        checked; GIL held throughout: an error path only)."""
        cdef Segment *segment
        cdef uint64_t offset, start
        cdef uint32_t size
        cdef RawWalk walk
        if self._segment_count == 0 or position < self._segments[0].base:
            return False
        segment = self._locate(position)
        offset = position - segment.base
        if offset >= segment.size:
            return False
        # The walk stops at the record that crosses ``offset`` (its size runs past the
        # limit: a problem there), or at a record that is not whole before it.
        _walk_raw(segment.data, segment.size, segment.base, 0, offset, INT64_MAX, &walk)
        if walk.problem == RECORD_OK or walk.problem_offset >= offset:
            return False
        start = walk.problem_offset
        if segment.size - start < MQ_BLANK_SIZE_MIN:
            return False
        size = mq_u32(segment.data + start + MQ_AT_SIZE)
        return start + size > offset and size <= segment.size - start and \
            _check_record(segment.data + start, size, segment.base + start,
                          False) == RECORD_OK

    cdef bint _intact_at(self, uint64_t position) except -1:
        """Whether an intact record (its own size, position and CRC32C) starts at
        ``position`` (GIL held throughout: an error path only)."""
        cdef Segment *segment
        cdef uint64_t offset
        cdef uint32_t size
        if self._segment_count == 0 or position < self._segments[0].base:
            return False
        segment = self._locate(position)
        offset = position - segment.base
        if offset > segment.size or segment.size - offset < MQ_HEADER_SIZE:
            return False
        size = mq_u32(segment.data + offset + MQ_AT_SIZE)
        return size <= segment.size - offset and \
            _check_record(segment.data + offset, size, position, True) == RECORD_OK

    def read_record(self, position):
        """The record that starts at ``position``; it must be below the committed position."""
        cdef Segment *segment
        cdef uint64_t start, offset, generation = self._generation
        cdef uint32_t size
        cdef int problem
        self._check_released()
        if not PyLong_Check(position) or _clamp_u64(position, &start) != 0 or \
                start >= self.committed_position:
            raise InvalidPosition(
                f"position {position} is not below the committed position "
                f"{self.committed_position}")
        segment = self._locate(start)
        offset = start - segment.base
        if offset > segment.size or segment.size - offset < MQ_BLANK_SIZE_MIN:
            raise InvalidPosition(f"position {position} is not the start of a record")
        size = mq_u32(segment.data + offset + MQ_AT_SIZE)
        if mq_u32(segment.data + offset + MQ_AT_MAGIC) != MQ_MAGIC or \
                size < MQ_HEADER_SIZE or size > segment.size - offset:
            raise InvalidPosition(f"position {position} is not the start of a record")
        if size > self.committed_position - start:
            raise InvalidPosition(f"the record at {position} is not committed yet")
        raw = self._copy_record(start, size, &problem)
        if problem == RECORD_OK:
            return _new_record(raw)
        if self._changed(generation):
            self._check_released()
            raise _gone(start, self.written_position)
        raise CorruptRecord(start, _problem_text(problem, PyBytes_AS_STRING(raw)))

    cdef Segment *_locate(self, uint64_t position) except NULL:
        """The last segment starting at or before ``position`` (bisect_right - 1)."""
        cdef Py_ssize_t low = 0, high = self._segment_count, middle
        cdef Py_ssize_t hint = self._locate_hint
        cdef Segment *segment
        if hint < self._segment_count:
            segment = self._segments[hint]
            if segment.base <= position and (position - segment.base < segment.size
                                             or hint == self._segment_count - 1):
                return segment
        while low < high:
            middle = (low + high) // 2
            if position < self._segments[middle].base:
                high = middle
            else:
                low = middle + 1
        if low == 0:
            raise InvalidPosition(f"position {position} lies before the log's first segment")
        self._locate_hint = low - 1
        return self._segments[low - 1]

    # --- what replication needs -------------------------------------------------------

    def read_raw(self, position, max_bytes):
        """Whole records from ``position`` up to the written position, never crossing a
        segment (a blank record ends the answer); at least one record if any; the record
        that would pass ``max_bytes`` is left unread."""
        cdef uint64_t start, generation = self._generation
        cdef Segment *segment
        self._check_released()
        if position == self.written_position:
            return b""
        segment = self._raw_segment(position, &start)
        return self._read_raw(segment, start - segment.base, _clamp_i64(max_bytes),
                              generation)

    cdef Segment *_raw_segment(self, position, uint64_t *start) except NULL:
        """The segment a raw read from ``position`` (not the written position) begins in,
        ``start`` set to it; InvalidPosition outside the log."""
        if _clamp_u64(position, start) != 0 or start[0] >= self.written_position:
            first = self._segments[0].base if self._segment_count else 0
            raise InvalidPosition(f"position {position} is outside the log [{first}, "
                                  f"{self.written_position}]")
        return self._locate(start[0])

    def raw_extent(self, position, max_bytes):
        """``read_raw``'s answer without its copy, to be sent from the segment file:
        (segment base, offset in the segment, bytes from the file, zeros after them, CRC32C
        of the answer), or None for an empty answer. The bytes are ``read_raw``'s: whole
        records, and a segment's closing blank as its header then zeros (the rest of the
        segment may be a hole: files.py). Its errors and checks are ``read_raw``'s, run on
        the mapping with the GIL held (nothing here unmaps it meanwhile)."""
        cdef uint64_t start, base, offset, limit
        cdef uint64_t bad, records_size, file_size, zeros, chunk
        cdef uint32_t crc
        cdef Segment *segment
        cdef RawWalk walk
        self._check_released()
        if position == self.written_position:
            return None
        segment = self._raw_segment(position, &start)
        base, offset = segment.base, start - segment.base
        limit = min(segment.size, self.written_position - base)
        _walk_raw(segment.data, segment.size, base, offset, limit, _clamp_i64(max_bytes),
                  &walk)
        records_size = walk.records_end - offset
        bad = _first_bad_crc(segment.data + offset, records_size)
        if bad < records_size or walk.problem:
            _report_raw(segment.data + offset, records_size, bad, &walk,
                        _problem_text(walk.problem, segment.data + walk.problem_offset)
                        if walk.problem else None, base, offset)
        file_size, zeros = records_size, 0
        if walk.end > walk.records_end:  # a closing blank: its header, then zeros
            file_size += MQ_BLANK_SIZE_MIN
            zeros = walk.end - walk.records_end - MQ_BLANK_SIZE_MIN
        if file_size == 0:
            return None
        crc = mq_crc32c(0, segment.data + offset, file_size)
        while zeros > 0:
            chunk = min(zeros, sizeof(_ZEROS))
            crc = mq_crc32c(crc, _ZEROS, chunk)
            zeros -= chunk
        return base, offset, file_size, walk.end - offset - file_size, crc

    cdef bytes _read_raw(self, Segment *segment, uint64_t offset, int64_t max_bytes,
                         uint64_t generation):
        """read_raw over one segment from ``offset``: the twin's loop in passes, so that
        the CRCs (most of the work) run on the answer's private copy with the GIL
        released. Everything this needs from the mapping is read first: while the GIL is
        let go a truncation, reset or retention may unmap the segment and free
        ``segment`` (issue 14: that was a SIGSEGV)."""
        cdef RawWalk walk
        cdef uint64_t base = segment.base, written = self.written_position
        cdef uint64_t limit = min(segment.size, written - base) if written > base else 0
        cdef uint64_t bad, records_size
        cdef bytes answer
        cdef const char *copy
        cdef str walk_text = None
        _walk_raw(segment.data, segment.size, base, offset, limit, max_bytes, &walk)
        answer = PyBytes_FromStringAndSize(NULL, walk.end - offset)
        memcpy(PyBytes_AS_STRING(answer), segment.data + offset, walk.records_end - offset)
        if walk.end > walk.records_end:  # a blank: its header, then zeros (the twin's)
            memcpy(PyBytes_AS_STRING(answer) + (walk.records_end - offset),
                   segment.data + walk.records_end, MQ_BLANK_SIZE_MIN)
            memset(PyBytes_AS_STRING(answer) + (walk.records_end - offset) + MQ_BLANK_SIZE_MIN,
                   0, walk.end - walk.records_end - MQ_BLANK_SIZE_MIN)
        if walk.problem:
            walk_text = _problem_text(walk.problem, segment.data + walk.problem_offset)
        segment = NULL  # from here on: the private copy and the locals above only
        copy = PyBytes_AS_STRING(answer)
        records_size = walk.records_end - offset
        if records_size < GIL_FREE_BYTES:
            bad = _first_bad_crc(copy, records_size)
        else:
            with nogil:
                bad = _first_bad_crc(copy, records_size)
        if (bad < records_size or walk.problem) and self._changed(generation):
            self._check_released()
            raise _gone(base + offset, self.written_position)
        _report_raw(copy, records_size, bad, &walk, walk_text, base, offset)
        return answer

    def append_raw(self, position, data):
        """Append records copied from another replica at the same position.

        Every record is checked first (size, magic, CRC32C, position, offset order); bad
        data raises ReplicaDataRejected and changes nothing. Returns the new written position.
        """
        cdef bytes raw
        if self._fence is not None:
            raise self._fence
        raw = bytes(data)
        self._acquire()
        try:
            if self._fence is not None:
                raise self._fence
            if position != self.written_position:
                raise ReplicaDataRejected(position,
                                          f"this log ends at {self.written_position}")
            self._plan_raw(self.written_position, raw)
            self._apply_raw(raw)
            return self.written_position
        finally:
            self._release()

    cdef int _plan_raw(self, uint64_t position, bytes data) except -1:
        """Validate raw data against the current log (the twin's _plan_raw)."""
        cdef const char *p = PyBytes_AS_STRING(data)
        cdef Py_ssize_t length = PyBytes_GET_SIZE(data), cursor = 0, available
        cdef uint64_t at, size, segment_end = 0
        cdef bint in_segment = False  # False: the next record opens a new segment
        cdef Segment *last
        cdef int problem
        cdef mq_header header
        cdef dict next_offsets = {}
        cdef QueueRun run
        cdef object run_key = None  # (topic, queue_id) of the run
        run.topic = NULL
        cdef list starts = self.epoch_starts
        # (wraparound is off in this module: no negative indexes)
        cdef object last_epoch = starts[len(starts) - 1][0] if starts else -1
        if self._segment_count:
            last = self._segments[self._segment_count - 1]
            if position < last.base + last.size:
                segment_end, in_segment = last.base + last.size, True
        while cursor < length:
            at = position + cursor
            if length - cursor < MQ_BLANK_SIZE_MIN:
                raise ReplicaDataRejected(at, "truncated record header")
            size = mq_u32(p + cursor + MQ_AT_SIZE)
            if mq_u32(p + cursor + MQ_AT_MAGIC) == MQ_BLANK_MAGIC:
                if not in_segment or at + size != segment_end:
                    ends = segment_end if in_segment else None
                    raise ReplicaDataRejected(
                        at, f"blank record ends at {at + size} but this replica's segment "
                        f"ends at {ends}; give every replica the same segment_size_bytes")
                in_segment = False
                cursor += size
                continue
            available = min(<uint64_t>(length - cursor), size)
            problem = (_check_record(p + cursor, available, at, True)
                       if size >= MQ_HEADER_SIZE else -1)
            if problem:
                raise ReplicaDataRejected(at, "size too small" if problem < 0
                                          else _problem_text(problem, p + cursor))
            if size + MQ_BLANK_SIZE_MIN > (segment_end - at if in_segment
                                           else <uint64_t>self.segment_size_bytes):
                raise ReplicaDataRejected(at, _no_fit(size, self.segment_size_bytes))
            mq_read_header(p + cursor, &header)
            if header.epoch < last_epoch:
                raise ReplicaDataRejected(at, f"epoch {header.epoch} is older than {last_epoch}"
                                              ", the epoch before it")
            last_epoch = header.epoch
            if not header.attributes & MQ_ATTR_CONTROL and not _run_continues(
                    &run, p + cursor, &header):
                if run.topic != NULL:  # the run ends: what it reached goes to the dict
                    next_offsets[run_key] = run.next_offset
                run_key = self._plan_offset(next_offsets, &run, p + cursor, &header, at)
            cursor += size
            if not in_segment:
                segment_end, in_segment = at + <uint64_t>self.segment_size_bytes, True
        return 0

    cdef object _plan_offset(self, dict next_offsets, QueueRun *run, const char *record,
                             mq_header *header, uint64_t at):
        """Check that a raw record continues its queue (offsets in order, no gap), and
        make its queue the run ``_run_continues`` checks the next records against; return
        its key. ``next_offsets`` holds the next offset of every queue met before (the
        caller wrote the ended run's there)."""
        run.topic = NULL
        topic = PyUnicode_DecodeUTF8(record + MQ_HEADER_SIZE, header.topic_size, NULL)
        key = (topic, header.queue_id)
        expected = next_offsets.get(key)
        if expected is None:
            offsets = self.queue_offsets(topic, header.queue_id)
            expected = header.queue_offset if offsets is None else offsets[1]
        if header.queue_offset != expected:
            raise ReplicaDataRejected(at, f"queue {topic!r}/{header.queue_id} expects offset "
                                          f"{expected}, record has {header.queue_offset}")
        next_offsets[key] = expected + 1
        run.topic = record + MQ_HEADER_SIZE  # (inside the data being planned: alive)
        run.topic_size, run.queue_id = header.topic_size, header.queue_id
        run.next_offset = header.queue_offset + 1
        return key

    cdef int _apply_raw(self, bytes data) except -1:
        """Write planned raw data into the log, indexing each record (the twin's steps)."""
        cdef Py_ssize_t cursor = 0
        while cursor < PyBytes_GET_SIZE(data):
            cursor = self._apply_run(data, cursor)
        return 0

    cdef Py_ssize_t _apply_run(self, bytes data, Py_ssize_t cursor) except -1:
        """The twin's _apply_run: the records from ``cursor`` on that go into the last
        segment, with one pwrite (``write_segment``) or one copied; where the next begins."""
        cdef const char *p = PyBytes_AS_STRING(data)
        cdef Py_ssize_t length = PyBytes_GET_SIZE(data), end = cursor
        cdef uint64_t size, offset, run_end
        cdef Segment *segment
        self._ensure_segment()
        segment = self._writable_segment()
        offset = self.written_position - segment.base
        while self._write_segment is not None and end < length:
            size = mq_u32(p + end + MQ_AT_SIZE)
            if size > <uint64_t>(length - end) or \
                    offset + <uint64_t>(end - cursor) + size > segment.size:
                break
            end += <Py_ssize_t>size
        if end == cursor:
            size = mq_u32(p + cursor + MQ_AT_SIZE)
            if size > <uint64_t>(length - cursor) or offset + size > segment.size:
                # What the twin's mmap slice assignment raises (a short blank, or a record
                # larger than a fresh segment): a last guard, _plan_raw refuses both.
                raise IndexError("mmap slice assignment is wrong size")
            self._ensure_ready(segment, self.written_position + size)
            _copy_in(segment.data + offset, p + cursor, size)
            self._publish_raw(segment, p + cursor, size)
            return cursor + <Py_ssize_t>size
        run = PyMemoryView_FromMemory(<char *>p + cursor, end - cursor, PyBUF_READ)
        try:
            self._write_segment(segment.base, offset, run)
        finally:
            run.release()  # (the callback was told: valid during the call only)
        run_end = segment.base + offset + <uint64_t>(end - cursor)
        try:
            while cursor < end:
                size = mq_u32(p + cursor + MQ_AT_SIZE)
                self._publish_raw(segment, p + cursor, size)
                cursor += <Py_ssize_t>size
        except BaseException:
            # (the twin's: what was written and not published goes, lest recovery find it)
            if self.written_position < run_end:
                memset(segment.data + (self.written_position - segment.base), 0,
                       run_end - self.written_position)
            raise
        return end

    cdef int _publish_raw(self, Segment *segment, const char *record,
                          uint64_t size) except -1:
        """A raw record (or blank) now in the log: index it, move the written position."""
        cdef mq_header header
        if mq_u32(record + MQ_AT_MAGIC) == MQ_BLANK_MAGIC:
            self._advance(segment.base + segment.size)
            return 0
        mq_read_header(record, &header)
        self._dispatch(record, &header)
        self._note_epoch(header.epoch, header.position)
        if header.store_timestamp > self.last_store_timestamp:
            self.last_store_timestamp = header.store_timestamp
        self._advance(header.position + size)
        return 0

    cdef int _dispatch(self, const char *record, mq_header *header) except -1:
        """Index a record that is already in the log (append_raw, recovery), and note
        where it ends if it has a key (the key indexer skips the log after that unread)."""
        cdef _Queue queue
        cdef const char *entry
        cdef const char *tags
        if header.key_size and header.position + header.size > self.last_keyed_end:
            self.last_keyed_end = header.position + header.size
        if header.attributes & MQ_ATTR_CONTROL:
            return 0
        queue = self._dispatch_queue
        if queue is None or queue.queue_id != header.queue_id or \
                PyBytes_GET_SIZE(queue.topic_bytes) != header.topic_size or \
                memcmp(PyBytes_AS_STRING(queue.topic_bytes), record + MQ_HEADER_SIZE,
                       header.topic_size) != 0:
            queue = self._dispatch_lookup(record, header)
        if header.queue_offset < queue.next_offset:
            if header.queue_offset >= queue.min_offset:
                entry = queue.entry(header.queue_offset)
                if mq_u64(entry + MQ_CQ_AT_POSITION) == header.position and \
                        mq_u32(entry + MQ_CQ_AT_SIZE) == header.size:
                    return 0
            raise ConsumeQueueMismatch(
                f"queue {queue.topic!r}/{header.queue_id} already has offset "
                f"{header.queue_offset} for another record")
        if header.queue_offset > queue.next_offset:
            raise ConsumeQueueMismatch(
                f"queue {queue.topic!r}/{header.queue_id} ends at {queue.next_offset}, "
                f"record has offset {header.queue_offset}")
        self._ensure_queue_room(queue)
        tags = record + MQ_HEADER_SIZE + header.topic_size + header.key_size
        self._index(queue, header.position, header.size,
                    mq_fnv1a64(<const unsigned char *>tags, header.tags_size))
        return 0

    cdef _Queue _dispatch_lookup(self, const char *record, mq_header *header):
        cdef _Queue queue
        topic = PyUnicode_DecodeUTF8(record + MQ_HEADER_SIZE, header.topic_size, NULL)
        queue = self._find_queue(topic, header.queue_id)
        if queue is None:
            self._new_queue_file(topic, header.queue_id, header.queue_offset)
            queue = (<_Topic>self._queues[topic]).find(header.queue_id)
            if queue is None:
                raise KeyError(header.queue_id)
        self._dispatch_queue = queue
        return queue

    def truncate(self, position, on_dropped=None):
        """Cut the log back to ``position`` (a record boundary); return what was dropped.

        Returns the bases of whole segments dropped and the (topic, queue id, base offset)
        of whole consume-queue files dropped. ``on_dropped(segments, files)``, if given,
        runs before the write lock is released, so the engine can delete those files
        before any writer could want a new file of the same name.
        """
        cdef uint64_t start, old_end
        self._acquire()
        self._begin_change()
        try:
            if _clamp_u64(position, &start) != 0 or start > self.written_position:
                raise InvalidPosition(f"cannot truncate to {position}: the log ends at "
                                      f"{self.written_position}")
            self.check_boundary(position)
            # Readers first lose sight of what goes (ends, entries, segments), all with
            # the GIL held; only then is the dead tail zeroed, maybe with the GIL
            # released: no reader can be reading it by then.
            old_end = self.written_position
            self.committed_position = min(self.committed_position, start)
            self.written_position = start
            self._ready_end = 0
            dropped_files = []
            for queue in self._all_queues():
                dropped_files.extend(self._truncate_queue(<_Queue>queue, start))
            # A segment that starts exactly at ``position`` stays, empty.
            dropped_segments = self._detach_from(start + 1)
            self.epoch_starts = [(e, p) for e, p in self.epoch_starts if p < position]
            self._zero_tail(start, old_end)
            if on_dropped is not None:
                on_dropped(dropped_segments, dropped_files)
            return dropped_segments, dropped_files
        finally:
            self._end_change()
            self._release()

    def trim_front(self, log_start, on_dropped=None):
        """Drop every segment below ``log_start`` (retention); return what was dropped.

        ``log_start`` must be the base of a segment that starts at or below the committed
        position. Every queue's minimum offset moves to its first record at or after
        ``log_start``; its consume-queue files that hold only earlier entries are dropped
        (the last one always stays). Returns and reports through ``on_dropped`` like
        ``truncate``. Runs with the GIL held throughout, so a reader (which rechecks the
        queue's minimum whenever it may have let the GIL go) never meets a freed file.
        """
        cdef uint64_t start
        cdef Py_ssize_t index = 0, moved
        self._acquire()
        self._begin_change()
        try:
            _clamp_u64(log_start, &start)
            while index < self._segment_count and self._segments[index].base < start:
                index += 1
            if index == self._segment_count or self._segments[index].base != start or \
                    start > self.committed_position or log_start < 0:
                raise InvalidPosition(f"cannot trim the log to {log_start}: it must be the "
                                      "base of a segment at or below the committed position "
                                      f"{self.committed_position}")
            dropped_files = []
            for queue in self._all_queues():
                dropped_files.extend(self._trim_queue(<_Queue>queue, start))
            dropped_segments = [self._segments[i].base for i in range(index)]
            for moved in range(index):
                PyBuffer_Release(&self._segments[moved].view)
                PyMem_Free(self._segments[moved])
            for moved in range(self._segment_count - index):
                self._segments[moved] = self._segments[moved + index]
            self._segment_count -= index
            self._locate_hint = 0
            self.epoch_starts = _epochs_from(self.epoch_starts, start)
            if on_dropped is not None:
                on_dropped(dropped_segments, dropped_files)
            return dropped_segments, dropped_files
        finally:
            self._end_change()
            self._release()

    cdef list _trim_queue(self, _Queue queue, uint64_t log_start):
        cdef uint64_t low = queue.first_at(log_start)
        cdef Py_ssize_t count = 0
        queue.min_offset = low
        while count + 1 < queue.file_count and queue.files[count + 1].base <= low:
            count += 1
        dropped = [(queue.topic, queue.queue_id, queue.files[i].base) for i in range(count)]
        queue.release_front(count)
        return dropped

    # --- recovery ---------------------------------------------------------------------

    def scan_segment(self, base, start_offset, dispatch=True):
        """Check records of an attached segment from ``start_offset`` on, indexing each one.

        Stops at zero bytes ("end"), at a blank record that fills the tail ("blank"), or at
        the first record whose size, magic, position or CRC is wrong (the reason). Never
        raises on garbage; raises ConsumeQueueMismatch when the queues cannot take a record.
        """
        cdef Py_ssize_t index
        cdef uint64_t offset
        cdef Py_buffer view
        cdef Segment *segment = NULL
        for index in range(self._segment_count):
            if self._segments[index].base == base:
                segment = self._segments[index]
                break
        if segment == NULL:
            raise ValueError(f"{base!r} is not in list")
        _clamp_u64(start_offset, &offset)
        # Our own export: callbacks run Python code, and the segment must stay mapped.
        PyObject_GetBuffer(segment.view.obj, &view, PyBUF_SIMPLE)
        try:
            if <char *>view.buf != segment.data or <uint64_t>view.len != segment.size:
                _fail("a segment's buffer moved")
            return self._scan(<const char *>view.buf, segment.size, segment.base, offset,
                              dispatch)
        finally:
            PyBuffer_Release(&view)

    cdef ScanResult _scan(self, const char *data, uint64_t segment_size, uint64_t base,
                          uint64_t offset, bint dispatch):
        cdef uint64_t count = 0
        cdef uint32_t size, magic
        cdef int64_t last_timestamp = 0
        cdef int problem
        cdef mq_header header
        while True:
            if offset > segment_size or segment_size - offset < MQ_BLANK_SIZE_MIN:
                return ScanResult(offset, count, "no room for a record header", last_timestamp)
            size = mq_u32(data + offset + MQ_AT_SIZE)
            magic = mq_u32(data + offset + MQ_AT_MAGIC)
            if size == 0 and magic == 0:
                return ScanResult(offset, count, STOP_END, last_timestamp)
            if magic == MQ_BLANK_MAGIC:
                if offset + size == segment_size:
                    return ScanResult(offset, count, STOP_BLANK, last_timestamp)
                return ScanResult(offset, count, "blank record of a wrong size", last_timestamp)
            if size < MQ_HEADER_SIZE or offset + size + MQ_BLANK_SIZE_MIN > segment_size:
                return ScanResult(offset, count, f"bad size {size}", last_timestamp)
            if size >= GIL_FREE_BYTES:
                with nogil:  # the caller holds an export: the mapping stays
                    problem = _check_record(data + offset, size, base + offset, True)
            else:
                problem = _check_record(data + offset, size, base + offset, True)
            if problem:
                return ScanResult(offset, count, _problem_text(problem, data + offset),
                                  last_timestamp)
            mq_read_header(data + offset, &header)
            if dispatch:
                self._dispatch(data + offset, &header)
                self._note_epoch(header.epoch, header.position)
            last_timestamp = max(last_timestamp, header.store_timestamp)
            if header.store_timestamp > self.last_store_timestamp:
                self.last_store_timestamp = header.store_timestamp
            offset += size
            count += 1

    # --- the key index ----------------------------------------------------------------

    def index_keys(self, index, end, count_max):
        """Add the keyed records of ``[header end_position, end)`` to a key-index file.

        ``index`` is the file's writable buffer (docs/FORMAT.md, "Key index"); ``end`` must
        be a record boundary at or below the committed position. Indexes at most
        ``count_max`` records (keyed or not), and stops early when the file is full.
        Every record's CRC32C is checked: a damaged one (bytes that recovery did not scan
        may rot) is counted in the header and skipped to the next intact record.
        Updates the header's counts, end position and time range (not its CRC: the
        engine seals it). Returns the new end position.
        """
        cdef Py_buffer view
        cdef char *data
        cdef uint64_t size_bytes, stop, count
        _hold(index, &view, &data, &size_bytes, True)
        try:
            if size_bytes < IX_HEADER_SIZE or mq_u32(data) != INDEX_MAGIC or \
                    size_bytes < IX_HEADER_SIZE + 4 * <uint64_t>mq_u32(data + 8) + \
                    IX_ENTRY_SIZE * <uint64_t>mq_u32(data + 12):
                _fail("not a key-index file of the size its header gives")
            _clamp_u64(end, &stop)
            if stop > self.committed_position:
                _fail(f"cannot index up to {end}: it is past the committed position")
            _clamp_u64(count_max, &count)
            return self._index_keys(data, stop, count)
        finally:
            PyBuffer_Release(&view)

    cdef uint64_t _index_keys(self, char *data, uint64_t stop, uint64_t count) except? 0:
        cdef uint32_t hash_bits = mq_u32(data + 4), slot_count = mq_u32(data + 8)
        cdef uint32_t entry_count_max = mq_u32(data + 12), entry_count = mq_u32(data + 16)
        cdef uint32_t damaged = mq_u32(data + 20)
        cdef uint64_t position = mq_u64(data + 32), offset, value
        cdef int64_t low = mq_i64(data + 40), high = mq_i64(data + 48)
        cdef char *entries = data + IX_HEADER_SIZE + 4 * <uint64_t>slot_count
        cdef char *slot
        cdef char *entry
        cdef const char *record
        cdef Segment *segment
        cdef mq_header header
        cdef int found
        while count > 0 and position < stop:
            count -= 1
            segment = self._locate(position)
            offset = position - segment.base
            found = _header_at(segment, offset, &header)
            if found == HEADER_NONE:
                damaged += 1
                position = _resync(segment, offset, stop)
                continue
            if found == HEADER_BLANK:
                position = segment.base + segment.size
                continue
            if header.key_size and not header.attributes & MQ_ATTR_CONTROL:
                if entry_count >= entry_count_max:
                    break
                record = segment.data + offset + MQ_HEADER_SIZE
                value = _key_hash(record, header.topic_size, record + header.topic_size,
                                  header.key_size, hash_bits)
                slot = data + IX_HEADER_SIZE + 4 * (value % slot_count)
                entry = entries + <uint64_t>entry_count * IX_ENTRY_SIZE
                mq_put_u64(entry, value)
                mq_put_u64(entry + 8, position)
                mq_put_i64(entry + 16, header.store_timestamp)
                mq_put_u32(entry + 24, mq_u32(slot))
                mq_put_u32(entry + IX_ENTRY_CRC_AT, mq_crc32c(0, entry, IX_ENTRY_CRC_AT))
                entry_count += 1
                mq_put_u32(slot, entry_count)
                low = min(low, header.store_timestamp)
                high = max(high, header.store_timestamp)
            position += header.size
        mq_put_u32(data + 16, entry_count)
        mq_put_u32(data + 20, damaged)
        mq_put_u64(data + 32, position)
        mq_put_i64(data + 40, low)
        mq_put_i64(data + 48, high)
        mq_put_u32(data + 56, 0)
        mq_put_u32(data + 60, 0)
        return position

    def check_boundary(self, position):
        """Raise InvalidPosition unless a record (or the log's end) starts at ``position``:
        its header says so, or, when that header is damaged, the records from the
        segment's start end there (the twin's docstring says why)."""
        cdef uint64_t start, offset, available
        cdef uint32_t size, magic
        cdef Segment *segment
        cdef RawWalk walk
        if position == self.written_position:
            return
        if _clamp_u64(position, &start) != 0 or start >= self.written_position:
            raise InvalidPosition(f"position {position} lies outside the log (it ends at "
                                  f"{self.written_position})")
        segment = self._locate(start)
        offset = start - segment.base
        available = segment.size - offset if offset < segment.size else 0
        if available < MQ_BLANK_SIZE_MIN:
            raise InvalidPosition(f"position {position} is not a record boundary")
        size = mq_u32(segment.data + offset + MQ_AT_SIZE)
        magic = mq_u32(segment.data + offset + MQ_AT_MAGIC)
        if magic == MQ_BLANK_MAGIC and size == available:
            return
        if magic != MQ_MAGIC or size < MQ_HEADER_SIZE or size > available or \
                mq_u64(segment.data + offset + MQ_AT_POSITION) != start:
            _walk_raw(segment.data, segment.size, segment.base, 0, offset, INT64_MAX, &walk)
            if walk.problem or walk.records_end != offset:
                raise InvalidPosition(f"position {position} is not a record boundary")

    cdef void _zero_tail(self, uint64_t position, uint64_t old_end) noexcept:
        """Zero ``[position, old_end)`` in the segments still attached (the write lock
        keeps them mapped while _zero lets the GIL go)."""
        cdef Py_ssize_t index
        cdef Segment *segment
        cdef uint64_t start, end
        for index in range(self._segment_count):
            segment = self._segments[index]
            if segment.base > position:
                break
            start = position - segment.base
            end = (min(old_end - segment.base, segment.size)
                   if old_end > segment.base else 0)
            if start < end:
                _zero(segment.data + start, end - start)

    cdef list _truncate_queue(self, _Queue queue, uint64_t position):
        cdef uint64_t low = queue.first_at(position), end
        cdef Py_ssize_t keep
        cdef QueueFile *last
        dropped = []
        keep = queue.file_count
        while keep > 1 and queue.files[keep - 1].base > low:
            keep -= 1
            dropped.append((queue.topic, queue.queue_id, queue.files[keep].base))
        queue.release_files(keep)
        if queue.file_count:
            last = queue.files[queue.file_count - 1]
            end = min(queue.next_offset, last.base + queue.entries_per_file)
            if last.base <= low < end:
                memset(last.data + (low - last.base) * MQ_CQ_ENTRY_SIZE, 0,
                       (end - low) * MQ_CQ_ENTRY_SIZE)
        queue.next_offset = low
        return dropped


# --- helpers of LogCore ---------------------------------------------------------------

cdef inline bint _has_hash(const uint64_t *hashes, Py_ssize_t count,
                           uint64_t value) noexcept:
    cdef Py_ssize_t index
    for index in range(count):
        if hashes[index] == value:
            return True
    return False


def _epochs_from(epoch_starts, log_start):
    """The epoch starts of a log that now begins at ``log_start``: those at or after
    it, and the last one before it as it was, so that the log still knows the epoch of
    the record that ends at its start (a replica matches logs there; Raft's snapshot
    keeps its last term for the same reason)."""
    kept = [(epoch, start) for epoch, start in epoch_starts if start >= log_start]
    earlier = [(epoch, start) for epoch, start in epoch_starts if start < log_start]
    if earlier:
        kept.insert(0, earlier[len(earlier) - 1])
    return kept


def _gone(position, written_position):
    """What a read gets when a truncation, reset, or retention took its position away
    while it was reading (never a CorruptRecord: those records were healthy)."""
    return InvalidPosition(f"position {position} went away while it was read (the log was "
                           f"truncated, reset or trimmed meanwhile; it now ends at "
                           f"{written_position}): read again from a valid position")


# --- backing files with zeros (engine/files.py) -------------------------------------------

cdef extern from "<unistd.h>" nogil:
    ssize_t pwrite(int fd, const void *buf, size_t count, long long offset)

cdef extern from "<errno.h>" nogil:
    int errno
    int EINTR
    int ENOSPC


def write_zeros(int fd, long long start, long long end, long long piece):
    """fallback.write_zeros, with the GIL let go once for all the writes, not once a
    write: the segment allocator's thread, backing a sync-flush log 16 KiB a write, got
    the GIL back only while the writer synced, so it wrote a piece or two a group commit
    and the writer's thread backed the rest itself (17% of its CPU in durable batches)."""
    cdef ssize_t written
    cdef int error = 0
    if not 0 < piece <= <long long>sizeof(_ZEROS):
        raise ValueError(f"piece must be 1..{sizeof(_ZEROS)} bytes, got {piece}")
    with nogil:
        while start < end:
            written = pwrite(fd, _ZEROS, <size_t>min(end - start, piece), start)
            if written < 0 and errno == EINTR:
                continue
            if written <= 0:
                error = errno if written < 0 else ENOSPC
                break
            start += written
    if error:
        raise OSError(error, os.strerror(error))
