"""Ask Linux for a short scheduler slice, so that a server process woken by a message gets a
core soon even when other work keeps the cores busy.

Every request crosses several processes (client, broker, workers; an ensemble's steps, a
BLS call), and each hand-off wakes one of them.  On a busy core, Linux's EEVDF scheduler
(6.6+) lets the running task finish its slice first (1.4 ms on the 2-core VM, it grows with the
cores), so each wake-up can cost that much: on the 2-core VM with other jobs running a
three-step ensemble spent most of its time waiting for cores, not in its steps or in
Python.  Since Linux 6.12 a task may ask for a shorter slice (``sched_attr.sched_runtime``
of a SCHED_OTHER task): it is then picked as soon as it wakes, and preempted as soon, so
its share of the CPU stays what it was while its wake-up latency drops.  No privilege is
needed, and the request is inherited by threads, forks and exec: set in the broker before
it starts anything, it holds for libzmq's threads, the zygotes and every worker.

Older kernels take the call and keep their default; other architectures and non-Linux
systems are left as they are.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

log = logging.getLogger("inferpool.broker")

SLICE_MIN_US, SLICE_MAX_US = 100, 100_000  # what the kernel accepts (it clamps to this)
# sched_setattr, sched_getattr
_SYSCALLS = {
    "x86_64": (314, 315),
    "aarch64": (274, 275),
    "ppc64le": (355, 356),
    "s390x": (345, 346),
}


class SchedAttr(ctypes.Structure):
    """``struct sched_attr`` as of its first version (48 bytes)."""

    _fields_ = (
        ("size", ctypes.c_uint32),
        ("policy", ctypes.c_uint32),
        ("flags", ctypes.c_uint64),
        ("nice", ctypes.c_int32),
        ("priority", ctypes.c_uint32),
        ("runtime", ctypes.c_uint64),
        ("deadline", ctypes.c_uint64),
        ("period", ctypes.c_uint64),
    )


def request_slice(us: int) -> bool:
    """Ask for a slice of ``us`` microseconds for this process and what it starts later
    (0: leave the kernel's default); whether the kernel took the call."""
    numbers = _SYSCALLS.get(platform.machine())
    if not us or numbers is None or os.sched_getscheduler(0) != os.SCHED_OTHER:
        return False  # a real-time policy an operator chose is theirs
    attr = SchedAttr(
        size=ctypes.sizeof(SchedAttr),
        policy=os.SCHED_OTHER,
        nice=os.getpriority(os.PRIO_PROCESS, 0),  # kept: the call sets it too
        runtime=us * 1000,
    )
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(numbers[0], 0, ctypes.byref(attr), 0) != 0:
        log.debug("no scheduler slice: %s", os.strerror(ctypes.get_errno()))
        return False
    return True


def current_slice_ns(pid: int = 0) -> int:
    """The slice process ``pid`` runs with, as the kernel reports it (0 where it cannot)."""
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        return 0
    attr = SchedAttr()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(numbers[1], pid, ctypes.byref(attr), ctypes.sizeof(SchedAttr), 0) != 0:
        return 0
    return int(attr.runtime)
