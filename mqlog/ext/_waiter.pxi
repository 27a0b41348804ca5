# mqlog's C log core, part 5 of 6: Waiter, where a thread sleeps until group commit
# wakes it, and GroupCommit, group commit's bookkeeping of who waits for which position
# (engine/flush.py). The twins are fallback.Waiter (a threading.Lock) and
# fallback.GroupCommit (the same steps in Python, under a lock of its own).
# (included by _core.pyx: see its docstring; it shares the module's namespace)
#
# Why it is in C: a sync-flush writer's thread sleeps once per record, and each wake-up
# is a thread hand-off. Done from Python, the waker holds the GIL while it wakes: the
# woken thread runs (often on the waker's core, preempting it), finds the GIL taken and
# sleeps again, and the waker is switched back in: three switches for one record.
# ``wait(timeout, wake=other)`` lets the GIL go first and only then wakes ``other`` and
# sleeps, in one call: the woken thread finds the GIL free, one switch per record.

cdef extern from "pythread.h":
    int PyThread_acquire_lock_timed(PyThread_type_lock, long long, int) nogil

cdef extern from "Python.h":
    int PyErr_CheckSignals() except -1


@cython.final
cdef class Waiter:
    """One sleep of one thread, ended once by ``wake()`` (from any thread) or by its
    timeout. Not reusable: make one per wait."""

    cdef PyThread_type_lock _lock  # held from birth; wake() releases it
    cdef bint _woken

    def __cinit__(self):
        self._lock = PyThread_allocate_lock()
        if self._lock == NULL:
            raise MemoryError()
        PyThread_acquire_lock(self._lock, NOWAIT_LOCK)

    def __dealloc__(self):
        if self._lock != NULL:
            PyThread_free_lock(self._lock)

    def wake(self):
        """End the sleep (now, or before it starts); a second wake is a RuntimeError."""
        self._wake()

    cdef int _wake(self) except -1:
        self._woken_once()
        with nogil:
            PyThread_release_lock(self._lock)
        return 0

    cdef int _woken_once(self) except -1:
        if self._woken:
            raise RuntimeError("a Waiter is woken once")
        self._woken = True
        return 0

    def wait(self, double timeout, Waiter wake=None):
        """Sleep until woken or ``timeout`` seconds pass (< 0: no limit); True if woken.
        With ``wake``, first wake that other Waiter, with the GIL already let go."""
        return self._wait(timeout, wake)

    cdef bint _wait(self, double timeout, Waiter wake) except -1:
        cdef long long micros = -1 if timeout < 0 else <long long>(timeout * 1e6)
        cdef int64_t deadline = _monotonic_us() + micros
        cdef PyThread_type_lock other = NULL
        cdef int status
        if wake is not None:
            wake._woken_once()
            other = wake._lock
        while True:
            with nogil:
                if other != NULL:
                    PyThread_release_lock(other)
                    other = NULL
                status = PyThread_acquire_lock_timed(self._lock, micros, 1)
            if status != PY_LOCK_INTR:
                return status == PY_LOCK_ACQUIRED
            PyErr_CheckSignals()  # a signal handler that raises ends the wait
            if micros > 0:
                micros = max(0, deadline - _monotonic_us())


cdef inline int64_t _monotonic_us() noexcept nogil:
    cdef timespec now
    clock_gettime(CLOCK_MONOTONIC, &now)
    return <int64_t>now.tv_sec * 1000000 + now.tv_nsec // 1000


# --- GroupCommit ---------------------------------------------------------------------
#
# Why it is in C: every sync put from a thread went through this bookkeeping in Python
# (a lock, a heap push, a deque, a new Waiter, half a dozen method calls: ~7 us of a
# sync put's ~18 us of CPU here). Here each step is one C call that runs no Python code
# and never lets the GIL go until it sleeps, so the GIL alone makes it atomic: no lock.

cdef struct _Waiting:
    uint64_t end
    uint64_t tie  # arrival order among equal ends
    PyObject *waiter  # a reference owned by the heap


cdef enum:
    _GROUP_CAPACITY_MIN = 64

WAIT_NOT_DURABLE = 0  # GroupCommit.wait's answers
WAIT_DURABLE = 1
WAIT_LEAD = 2


@cython.final
cdef class GroupCommit:
    """Who waits for the log to be durable up to which position (engine/flush.py has
    the protocol): the flushed position, the leader (the waiting writer that syncs for
    all), a heap of waiters by end position, and the ready queue of covered waiters not
    woken yet, which threads going to sleep wake one at a time."""

    cdef _Waiting *_heap
    cdef Py_ssize_t _heap_count
    cdef Py_ssize_t _heap_capacity
    cdef PyObject **_ready  # a ring of owned references
    cdef Py_ssize_t _ready_head
    cdef Py_ssize_t _ready_count
    cdef Py_ssize_t _ready_capacity
    cdef uint64_t _tie
    cdef object _leader
    cdef public uint64_t flushed_position
    cdef public object error  # a FlushFailed: every waiter raises it
    cdef public bint stopping  # the store is closing: covered waiters are woken at once
    cdef readonly uint64_t handoffs  # waiters taken from the ready queue so far

    def __cinit__(self, uint64_t flushed_position):
        self.flushed_position = flushed_position
        self._heap = <_Waiting *>PyMem_Malloc(_GROUP_CAPACITY_MIN * sizeof(_Waiting))
        self._ready = <PyObject **>PyMem_Malloc(_GROUP_CAPACITY_MIN * sizeof(PyObject *))
        if self._heap == NULL or self._ready == NULL:
            raise MemoryError()
        self._heap_capacity = self._ready_capacity = _GROUP_CAPACITY_MIN

    def __dealloc__(self):
        cdef Py_ssize_t index
        if self._heap != NULL:
            for index in range(self._heap_count):
                Py_XDECREF(self._heap[index].waiter)
            PyMem_Free(self._heap)
        if self._ready != NULL:
            for index in range(self._ready_count):
                Py_XDECREF(self._ready[(self._ready_head + index) % self._ready_capacity])
            PyMem_Free(self._ready)

    @property
    def ready_count(self):
        """Covered waiters not woken yet."""
        return self._ready_count

    @property
    def waiting_count(self):
        """Waiters not covered yet (the leader not counted)."""
        return self._heap_count

    def wait(self, uint64_t end, double timeout):
        """Wait until the log is durable up to ``end``: WAIT_DURABLE, WAIT_NOT_DURABLE
        (the deadline passed), or WAIT_LEAD: nobody was syncing (or this waiter was
        handed the lead): the caller syncs for all now, then calls ``lead_done``.
        Raises ``error`` if a flush failed."""
        cdef Waiter waiter, handoff
        if self.error is not None:
            raise self.error
        if self.flushed_position >= end:
            return WAIT_DURABLE
        waiter = Waiter.__new__(Waiter)
        handoff = self._take_ready()  # woken as this thread lets the GIL go
        if self._leader is None:  # nobody is syncing: this thread does, for all
            self._leader = waiter
            if handoff is not None:
                handoff._wake()
            return WAIT_LEAD
        self._push(end, waiter)
        if not waiter._wait(timeout, handoff):
            # The deadline: leave the queues, unless woken meanwhile.
            if self._leader is not waiter and self._forget(waiter) and \
                    self.flushed_position < end:
                if self.error is not None:
                    raise self.error
                return WAIT_NOT_DURABLE
        if self._leader is waiter:  # handed the lead by the one before
            return WAIT_LEAD
        if self.error is not None:
            raise self.error
        return WAIT_DURABLE if self.flushed_position >= end else WAIT_NOT_DURABLE

    def lead_done(self):
        """The leader's sync ended (published or failed): hand the lead to the first
        waiter it does not cover, the covered ones go to the ready queue; with nobody
        to lead, wake the first covered waiter instead, so that the queue drains."""
        cdef Waiter wake
        cdef _Waiting first
        self._leader = None
        while self._heap_count and self.error is None:
            first = self._pop()
            if first.end > self.flushed_position:
                self._leader = <object>first.waiter
                Py_XDECREF(first.waiter)
                break
            self._append_ready(first.waiter)  # the heap's reference moves with it
        wake = <Waiter>self._leader if self._leader is not None else self._take_ready()
        if self.stopping:  # closing: nobody will go to sleep again to wake them
            self.wake_all_ready()
        if wake is not None:
            wake._wake()

    def publish(self, uint64_t target):
        """A sync made the log durable up to ``target``: the flushed position moves
        there and the waiters it covers go to the ready queue (after a failure or while
        closing they are all woken now). Returns the number of waiters ready."""
        if target > self.flushed_position:
            self.flushed_position = target
        self._release(target)
        return self._ready_count

    def release_all(self):
        """After a failure or an abandon: every waiter goes, and is woken now."""
        self._release(0xFFFF_FFFF_FFFF_FFFF)

    cdef int _release(self, uint64_t target) except -1:
        cdef _Waiting first
        while self._heap_count and self._heap[0].end <= target:
            first = self._pop()
            self._append_ready(first.waiter)
        if self.error is not None or self.stopping:
            self.wake_all_ready()
        return 0

    def take_ready(self):
        """The first covered waiter not woken yet, for the caller to wake; or None."""
        return self._take_ready()

    def wake_all_ready(self):
        """Wake every covered waiter now: after a failure (each raises it) or once the
        store is closing (no writer goes to sleep again to wake the next)."""
        cdef Waiter waiter
        while self._ready_count:
            waiter = self._take_ready()
            waiter._wake()

    cdef Waiter _take_ready(self):
        cdef PyObject *first
        cdef Waiter waiter
        if not self._ready_count:
            return None
        first = self._ready[self._ready_head]
        self._ready_head = (self._ready_head + 1) % self._ready_capacity
        self._ready_count -= 1
        self.handoffs += 1
        waiter = <Waiter>first
        Py_XDECREF(first)  # (``waiter`` holds its own reference now)
        return waiter

    cdef int _append_ready(self, PyObject *waiter) except -1:
        """Queue ``waiter``, whose reference the ready queue takes over."""
        cdef PyObject **grown
        cdef Py_ssize_t index
        if self._ready_count == self._ready_capacity:
            grown = <PyObject **>PyMem_Malloc(2 * self._ready_capacity * sizeof(PyObject *))
            if grown == NULL:
                Py_XDECREF(waiter)
                raise MemoryError()
            for index in range(self._ready_count):
                grown[index] = self._ready[(self._ready_head + index) % self._ready_capacity]
            PyMem_Free(self._ready)
            self._ready, self._ready_head = grown, 0
            self._ready_capacity *= 2
        self._ready[(self._ready_head + self._ready_count) % self._ready_capacity] = waiter
        self._ready_count += 1
        return 0

    cdef int _push(self, uint64_t end, Waiter waiter) except -1:
        cdef _Waiting *grown
        cdef Py_ssize_t index = self._heap_count
        cdef Py_ssize_t parent
        if self._heap_count == self._heap_capacity:
            grown = <_Waiting *>PyMem_Realloc(self._heap,
                                              2 * self._heap_capacity * sizeof(_Waiting))
            if grown == NULL:
                raise MemoryError()
            self._heap = grown
            self._heap_capacity *= 2
        Py_INCREF(waiter)
        self._tie += 1
        while index > 0:  # sift up
            parent = (index - 1) // 2
            if not _earlier(end, self._tie, &self._heap[parent]):
                break
            self._heap[index] = self._heap[parent]
            index = parent
        self._heap[index].end = end
        self._heap[index].tie = self._tie
        self._heap[index].waiter = <PyObject *>waiter
        self._heap_count += 1
        return 0

    cdef _Waiting _pop(self) noexcept:
        """Take the first waiter (by end, then arrival) out; its reference goes to the
        caller. The heap must not be empty."""
        cdef _Waiting first = self._heap[0]
        self._heap_count -= 1
        if self._heap_count:
            self._sift_down(0, self._heap[self._heap_count])
        return first

    cdef void _sift_down(self, Py_ssize_t index, _Waiting moved) noexcept:
        cdef Py_ssize_t child
        while True:
            child = 2 * index + 1
            if child >= self._heap_count:
                break
            if child + 1 < self._heap_count and \
                    _earlier(self._heap[child + 1].end, self._heap[child + 1].tie,
                             &self._heap[child]):
                child += 1
            if not _earlier(self._heap[child].end, self._heap[child].tie, &moved):
                break
            self._heap[index] = self._heap[child]
            index = child
        self._heap[index] = moved

    cdef bint _forget(self, Waiter waiter) except -1:
        """Take a waiter that gave up out of the heap or the ready queue; False if it
        is in neither: it was woken."""
        cdef Py_ssize_t index, at, later
        cdef PyObject *found
        for index in range(self._heap_count):
            if self._heap[index].waiter == <PyObject *>waiter:
                found = self._heap[index].waiter
                self._heap_count -= 1
                if index < self._heap_count:  # the last entry refills the hole
                    self._heap[index] = self._heap[self._heap_count]
                    self._reheap()
                Py_XDECREF(found)
                return True
        for index in range(self._ready_count):
            at = (self._ready_head + index) % self._ready_capacity
            if self._ready[at] == <PyObject *>waiter:
                found = self._ready[at]
                for later in range(index + 1, self._ready_count):  # close the gap
                    self._ready[(self._ready_head + later - 1) % self._ready_capacity] = \
                        self._ready[(self._ready_head + later) % self._ready_capacity]
                self._ready_count -= 1
                Py_XDECREF(found)
                return True
        return False

    cdef void _reheap(self) noexcept:
        cdef Py_ssize_t index = self._heap_count // 2
        while index > 0:
            index -= 1
            self._sift_down(index, self._heap[index])


cdef inline bint _earlier(uint64_t end, uint64_t tie, _Waiting *other) noexcept:
    return end < other.end or (end == other.end and tie < other.tie)
