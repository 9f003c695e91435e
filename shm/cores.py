"""Which core a thread runs on, and where a waiting thread may spin (Linux).

A lane's waiter spins only while it runs on a core its peer may not run on: where the two
can meet on one core, a spin burns the time the peer needs there.  ``Apart`` answers that
per look, from the core the calling thread runs on right now (``sched_getcpu``, through
ctypes: about 0.2 us, the kernel keeps the answer in the thread's own memory), so a thread
nobody pinned spins while the scheduler keeps it off the peer's cores and stops the moment
it lands on one.  ``pin`` moves the calling thread to chosen cores.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Iterable
from typing import Any

_getcpu: Any = getattr(ctypes.CDLL(None), "sched_getcpu", None)  # None: no such call here
if _getcpu is not None:
    _getcpu.restype = ctypes.c_int
    _getcpu.argtypes = ()

CORES = os.cpu_count() or 1


def current() -> int:
    """The core the calling thread runs on now (-1 where the system cannot say)."""
    return _getcpu() if _getcpu is not None else -1


def of(pid: int) -> frozenset[int]:
    """The cores process ``pid`` (its main thread) may run on; every core if unknown."""
    try:
        return frozenset(os.sched_getaffinity(pid))
    except OSError:
        return frozenset(range(CORES))


def allowed() -> frozenset[int]:
    """The cores the calling thread may run on."""
    return frozenset(os.sched_getaffinity(0))


def pin(cores: Iterable[int]) -> frozenset[int]:
    """Restrict the calling thread (only it: ``sched_setaffinity`` of thread 0) to
    ``cores``; the cores it may run on now.  OSError (EINVAL) for cores it may not use."""
    os.sched_setaffinity(0, set(cores))
    return allowed()


def free_core(held: Iterable[int], worker: Iterable[int]) -> int | None:
    """A core for the calling thread to be pinned to: one it may run on that no worker
    holds, else one apart from ``worker`` (the cores of the worker it calls), else None.
    Threads spread over the candidates by their thread id."""
    mine = sorted(allowed())
    held, worker = set(held), set(worker)
    for candidates in ([c for c in mine if c not in held], [c for c in mine if c not in worker]):
        if candidates:
            return candidates[threading.get_native_id() % len(candidates)]
    return None


class Apart:
    """Whether the calling thread runs, right now, on a core none of ``peer`` is.

    ``static`` is the answer from affinities alone (where ``sched_getcpu`` is missing):
    the calling thread may run only on cores the peer may not."""

    __slots__ = ("_shared", "static")

    def __init__(self, peer: Iterable[int]) -> None:
        peer = frozenset(peer)
        self._shared = tuple(c in peer for c in range(max(CORES, *peer, 0) + 1))
        self.static = not (allowed() & peer)

    def __call__(self) -> bool:
        if _getcpu is None:
            return self.static
        cpu = _getcpu()
        shared = self._shared
        return cpu < len(shared) and not shared[cpu]

    @property
    def never(self) -> bool:
        """The peer may run on every core: no core is ever apart from it."""
        return all(self._shared[:CORES])
