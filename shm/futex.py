"""Futexes on words of shared memory, and a full memory barrier, from Python.

A lane's two sides wait for each other on 32-bit words of the lane's region: a sleeper calls
``wait(addr, seen)`` (FUTEX_WAIT: sleep while the word still holds ``seen``), a producer that
changed the word calls ``wake(addr)``.  The calls go through ctypes, which releases the GIL,
so a thread asleep here costs its process nothing.  Shared (not ``_PRIVATE``) futex
operations, as the word lives in a MAP_SHARED mapping seen by two processes.

``fence()`` orders a store before a later load (the store-load barrier of a Dekker
hand-shake: "publish, then look whether the peer sleeps").  CPython has no atomics; taking
an uncontended ``threading.Lock`` is an atomic read-modify-write (``sem_trywait``), which is
a full barrier on x86-64.  Where it is not (weaker architectures), a missed wake-up costs at
most one sleep slice: every sleeper here wakes at least that often to look again.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import threading

SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine(), 202)
FUTEX_WAIT = 0
FUTEX_WAKE = 1
WAKE_ALL = 0x7FFFFFFF

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_syscall.argtypes = [
    ctypes.c_long,
    ctypes.c_void_p,
    ctypes.c_int,
    ctypes.c_uint,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_uint,
]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_barrier = threading.Lock()


def fence() -> None:
    """A full memory barrier (see the module's docstring)."""
    _barrier.acquire(False)
    _barrier.release()


def wait(addr: int, seen: int, timeout: float) -> None:
    """Sleep while the u32 at ``addr`` holds ``seen``, at most ``timeout`` seconds.

    Returns on a wake, a timeout, a signal or a word that already differs: callers look at
    the word again.
    """
    ts = _Timespec(int(timeout), int((timeout % 1) * 1e9))
    if _syscall(SYS_FUTEX, addr, FUTEX_WAIT, seen, ctypes.addressof(ts), None, 0) < 0:
        err = ctypes.get_errno()
        if err not in (errno.EAGAIN, errno.ETIMEDOUT, errno.EINTR):
            raise OSError(err, f"futex wait failed: {errno.errorcode.get(err, err)}")


def wake(addr: int, count: int = WAKE_ALL) -> None:
    """Wake up to ``count`` sleepers on the word at ``addr``."""
    _syscall(SYS_FUTEX, addr, FUTEX_WAKE, count, None, None, 0)


def address(buffer: object, offset: int) -> int:
    """The address of byte ``offset`` of a writable buffer (an mmap): the caller keeps the
    mapping open for as long as it uses the address."""
    word = ctypes.c_uint32.from_buffer(buffer, offset)  # type: ignore[arg-type]
    addr = ctypes.addressof(word)
    del word  # drops the buffer export: the mapping can be closed later
    return addr
