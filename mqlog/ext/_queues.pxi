# mqlog's C log core, part 2 of 6: mappings held as Py_buffers (Segment, QueueFile) and
# the consume queues (_Queue, _Topic), with the checks that a record is the one a
# consume-queue entry names.
# (included by _core.pyx: see its docstring; it shares the module's namespace)

# --- mappings, queues -----------------------------------------------------------------

cdef struct Segment:
    uint64_t base
    uint64_t size
    char *data
    Py_buffer view  # the export that keeps ``data`` mapped


cdef struct QueueFile:
    uint64_t base  # first offset
    char *data
    Py_buffer view


cdef int _hold(object buffer, Py_buffer *view, char **data, uint64_t *size,
               bint writable) except -1:
    """Export ``buffer`` into ``view``; a read-only core never writes through ``data``."""
    PyObject_GetBuffer(buffer, view, PyBUF_WRITABLE if writable else PyBUF_SIMPLE)
    data[0] = <char *>view.buf
    size[0] = <uint64_t>view.len
    return 0


cdef int _grow(void ***array, Py_ssize_t *capacity, Py_ssize_t count) except -1:
    """Make room for one more pointer in a PyMem array."""
    cdef Py_ssize_t wanted
    cdef void **grown
    if count < capacity[0]:
        return 0
    wanted = max(8, capacity[0] * 2)
    grown = <void **>PyMem_Realloc(array[0], wanted * sizeof(void *))
    if grown == NULL:
        raise MemoryError()
    array[0] = grown
    capacity[0] = wanted
    return 0


@cython.final
@cython.no_gc
cdef class _Queue:
    """One (topic, queue id): its offsets and its consume-queue files, in C fields."""

    cdef str topic
    cdef bytes topic_bytes
    cdef uint32_t queue_id
    cdef uint64_t min_offset
    cdef uint64_t next_offset
    cdef uint64_t entries_per_file
    cdef uint64_t ready_end  # entries below this offset have pages behind them
    cdef QueueFile **files  # ascending, contiguous
    cdef Py_ssize_t file_count
    cdef Py_ssize_t file_capacity
    # files[file_count - 1], where appends go (the hot state of the write path)
    cdef uint64_t last_base
    cdef char *last_data

    def __dealloc__(self):
        self.release_files(0)
        PyMem_Free(self.files)

    cdef int attach(self, uint64_t base_offset, object buffer, bint writable) except -1:
        cdef QueueFile *file = <QueueFile *>PyMem_Malloc(sizeof(QueueFile))
        cdef uint64_t size
        if file == NULL:
            raise MemoryError()
        try:
            _hold(buffer, &file.view, &file.data, &size, writable)
        except BaseException:
            PyMem_Free(file)
            raise
        file.base = base_offset
        try:
            if size != self.entries_per_file * MQ_CQ_ENTRY_SIZE:
                _fail(f"a consume-queue file of {size} bytes does not hold "
                      f"{self.entries_per_file} entries")
            if self.file_count and base_offset != self.last_base + self.entries_per_file:
                _fail("consume-queue files must be contiguous")
            _grow(<void ***>&self.files, &self.file_capacity, self.file_count)
        except BaseException:
            PyBuffer_Release(&file.view)
            PyMem_Free(file)
            raise
        self.files[self.file_count] = file
        self.file_count += 1
        # Entries before a new last file are backed: the files before it were filled, or
        # backed whole by _room_for_entries before it opened this one.
        self.ready_end = base_offset
        self.last_base = base_offset
        self.last_data = file.data
        return 0

    cdef void release_files(self, Py_ssize_t keep) noexcept:
        """Release every file after the first ``keep`` (the engine closes them next)."""
        while self.file_count > keep:
            self.file_count -= 1
            PyBuffer_Release(&self.files[self.file_count].view)
            PyMem_Free(self.files[self.file_count])
        if self.file_count:
            self.last_base = self.files[self.file_count - 1].base
            self.last_data = self.files[self.file_count - 1].data
        else:
            self.last_base = 0
            self.last_data = NULL

    cdef void release_front(self, Py_ssize_t count) noexcept:
        """Release the first ``count`` files (retention); at least one must remain."""
        cdef Py_ssize_t index
        for index in range(count):
            PyBuffer_Release(&self.files[index].view)
            PyMem_Free(self.files[index])
        for index in range(self.file_count - count):
            self.files[index] = self.files[index + count]
        self.file_count -= count

    cdef Py_ssize_t file_index(self, uint64_t offset) except -1:
        """Index of the file holding ``offset``."""
        cdef uint64_t index
        if self.file_count == 0 or offset < self.files[0].base:
            _fail(f"no consume-queue file holds offset {offset}")
        index = (offset - self.files[0].base) // self.entries_per_file
        if index >= <uint64_t>self.file_count:
            _fail(f"no consume-queue file holds offset {offset}")
        return <Py_ssize_t>index

    cdef uint64_t first_at(self, uint64_t position) except? 0xFFFF_FFFF_FFFF_FFFF:
        """The first offset whose record starts at or after ``position`` (next_offset if
        none): a binary search, positions grow with offsets."""
        cdef uint64_t low = self.min_offset, high = self.next_offset, middle
        while low < high:
            middle = low + (high - low) // 2
            if mq_u64(self.entry(middle) + MQ_CQ_AT_POSITION) < position:
                low = middle + 1
            else:
                high = middle
        return low

    cdef const char *entry(self, uint64_t offset) except NULL:
        """The 20 bytes of ``offset``'s entry."""
        cdef QueueFile *file = self.files[self.file_index(offset)]
        return file.data + (offset - file.base) * MQ_CQ_ENTRY_SIZE


cdef _Queue _new_queue(str topic, uint32_t queue_id, uint64_t min_offset,
                       uint64_t next_offset, uint64_t entries_per_file):
    cdef _Queue queue = _Queue.__new__(_Queue)
    queue.topic = topic
    queue.topic_bytes = topic.encode()
    queue.queue_id = queue_id
    queue.min_offset = min_offset
    queue.next_offset = next_offset
    queue.entries_per_file = entries_per_file
    return queue


@cython.final
@cython.no_gc
cdef class _Topic:
    """The queues of one topic: by id in a dict (in the order added, as the twin lists
    them) and, for small ids, also in a list indexed by id (no hashing on put)."""

    cdef dict queues
    cdef list by_id

    def __cinit__(self):
        self.queues = {}
        self.by_id = []

    cdef inline _Queue find(self, uint64_t queue_id):
        cdef PyObject *found
        if queue_id < <uint64_t>len(self.by_id):
            return <_Queue>self.by_id[queue_id]
        if queue_id < QUEUE_LIST_IDS:
            return None
        found = PyDict_GetItemWithError(self.queues, queue_id)
        return None if found == NULL else <_Queue>found

    cdef _Queue find_object(self, object queue_id):
        """The queue with id ``queue_id`` by dict semantics (any object may be asked)."""
        cdef uint64_t number
        if PyLong_Check(queue_id):
            if _clamp_u64(queue_id, &number) != 0 or number > U32_MAX:
                return None
            return self.find(number)
        return self.queues.get(queue_id)

    cdef void add(self, object key, _Queue queue):
        self.queues[key] = queue
        if queue.queue_id < QUEUE_LIST_IDS:
            while len(self.by_id) <= queue.queue_id:
                self.by_id.append(None)
            self.by_id[queue.queue_id] = queue


# --- does a record belong to the entry that named it? ------------------------------

cdef inline bint _is_queue_record(const char *p, _Queue queue, uint64_t offset) noexcept:
    """Whether the intact record ``p`` is the one ``queue``'s entry for ``offset`` names."""
    cdef mq_header header
    mq_read_header(p, &header)
    return header.queue_id == queue.queue_id and header.queue_offset == offset and \
        not header.attributes & MQ_ATTR_CONTROL and \
        header.topic_size == PyBytes_GET_SIZE(queue.topic_bytes) and \
        memcmp(p + MQ_HEADER_SIZE, PyBytes_AS_STRING(queue.topic_bytes),
               header.topic_size) == 0


cdef int _entry_mismatch(_Queue queue, uint64_t offset, uint64_t position, uint32_t size,
                         str why) except -1:
    raise ConsumeQueueMismatch(_mismatch_text(queue.topic, queue.queue_id, offset, position,
                                              size, why))


def _mismatch_text(topic, queue_id, offset, position, size, why):
    return (f"consume queue {topic!r}/{queue_id}: the entry of offset {offset} points at "
            f"position {position} (size {size}), {why}; the queue is damaged, not the log: "
            "close the store, move its consumequeue/ directory away and open it again to "
            "rebuild every queue from the commit log")
