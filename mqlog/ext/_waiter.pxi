# mqlog's C log core, part 5 of 6: Waiter, where a thread sleeps until group commit
# wakes it (engine/flush.py). The twin is fallback.Waiter, a threading.Lock.
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
        self._woken_once()
        with nogil:
            PyThread_release_lock(self._lock)

    cdef int _woken_once(self) except -1:
        if self._woken:
            raise RuntimeError("a Waiter is woken once")
        self._woken = True
        return 0

    def wait(self, double timeout, Waiter wake=None):
        """Sleep until woken or ``timeout`` seconds pass (< 0: no limit); True if woken.
        With ``wake``, first wake that other Waiter, with the GIL already let go."""
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
