"""Futexes on words of shared memory, and a full memory barrier, from Python.

A lane's two sides wait for each other on 32-bit words of the lane's region: a sleeper calls
``wait(addr, seen)`` (FUTEX_WAIT: sleep while the word still holds ``seen``), a producer that
changed the word calls ``wake(addr)``.  The calls go through ctypes, which releases the GIL,
so a thread asleep here costs its process nothing.  Shared (not ``_PRIVATE``) futex
operations, as the word lives in a MAP_SHARED mapping seen by two processes.

``fence()`` orders a store before a later load (the store-load barrier of a Dekker
hand-shake: "publish, then look whether the peer sleeps").  CPython has no atomics; taking
an uncontended ``threading.Lock`` is an atomic read-modify-write (``sem_trywait``), which is
a full barrier on x86-64.  It is taken blocking: two threads fencing at once take it in turn
(a try that fails makes no barrier, and releasing the lock another thread holds would fail
that thread's release).  Where it is not (weaker architectures), a missed wake-up costs at
most one sleep slice: every sleeper here wakes at least that often to look again.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import threading
from typing import Any

SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine(), 202)
FUTEX_WAIT = 0
FUTEX_WAKE = 1
WAKE_ALL = 0x7FFFFFFF

# Calls made without argtypes, on arguments converted once (a ctypes object passes as it is,
# an int as a C int, masked to its 32 bits as the futex word is): about half the cost of
# converting every argument by argtypes.  A wait needs errno (and releases the GIL: it
# sleeps); a wake ignores its result.
_wait_call = ctypes.CDLL(None, use_errno=True).syscall
_wake_call = ctypes.CDLL(None).syscall
_wait_call.restype = _wake_call.restype = ctypes.c_long
_NR = ctypes.c_long(SYS_FUTEX)
_REMEMBERED = 64  # timeouts whose timespec is kept (a waiter uses few distinct ones)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_timespecs: dict[float, Any] = {}  # timeout -> a pointer to its timespec (never changed)
_barrier = threading.Lock()
# fence()'s two halves, for a caller that inlines it on its hot path (a call is a third of it)
fence_acquire, fence_release = _barrier.acquire, _barrier.release


def fence() -> None:
    """A full memory barrier (see the module's docstring)."""
    fence_acquire()
    fence_release()


def word(addr: int) -> Any:
    """``addr`` as the futex calls take it (convert it once, pass it to every call)."""
    return ctypes.c_void_p(addr)


def wait(addr: Any, seen: int, timeout: float) -> None:
    """Sleep while the u32 at ``addr`` (an int, or ``word(addr)``) holds ``seen``, at most
    ``timeout`` seconds.

    Returns on a wake, a timeout, a signal or a word that already differs: callers look at
    the word again.
    """
    ts = _timespecs.get(timeout)
    if ts is None:
        if len(_timespecs) >= _REMEMBERED:
            _timespecs.clear()
        ts = _timespecs[timeout] = ctypes.pointer(_Timespec(int(timeout), int((timeout % 1) * 1e9)))
    if type(addr) is int:
        addr = ctypes.c_void_p(addr)
    if _wait_call(_NR, addr, FUTEX_WAIT, seen, ts, None, 0) < 0:
        err = ctypes.get_errno()
        if err not in (errno.EAGAIN, errno.ETIMEDOUT, errno.EINTR):
            raise OSError(err, f"futex wait failed: {errno.errorcode.get(err, err)}")


def wake(addr: Any, count: int = WAKE_ALL) -> None:
    """Wake up to ``count`` sleepers on the word at ``addr`` (an int, or ``word(addr)``)."""
    if type(addr) is int:
        addr = ctypes.c_void_p(addr)
    _wake_call(_NR, addr, FUTEX_WAKE, count, None, None, 0)


def address(buffer: object, offset: int) -> int:
    """The address of byte ``offset`` of a writable buffer (an mmap): the caller keeps the
    mapping open for as long as it uses the address."""
    word = ctypes.c_uint32.from_buffer(buffer, offset)  # type: ignore[arg-type]
    addr = ctypes.addressof(word)
    del word  # drops the buffer export: the mapping can be closed later
    return addr
