"""One direction of a lane: a sequence word its producer bumps and its consumer waits on.

The consumer spins on the word for a bounded time (worth it only when the producer runs on
another core), then raises its ``sleeping`` flag and sleeps on the word with a futex.  The
producer publishes by storing the new sequence number, then, after a full barrier, looks at
the flag and makes the wake-up system call only when the consumer sleeps: a producer whose
peer is spinning pays no system call at all.  Both words live in shared memory (the lane's
region, ``wire.lane`` gives their offsets); each side writes only its own.
"""

from __future__ import annotations

import os
import struct
import time

from inferpool.shm import futex

# native order and alignment: struct then stores and loads the word with one instruction
# ("<I" packs byte by byte, and a peer could read a word half written)
_U32 = struct.Struct("I")
_load = _U32.unpack_from
_store = _U32.pack_into
_now = time.monotonic_ns


class Bell:
    """``seq``: the offset of the sequence word (the futex); ``sleeping``: the offset of the
    consumer's flag.  ``buf`` is a writable view of the mapping, which must stay open."""

    __slots__ = ("_addr", "_buf", "_seq", "_sleeping")

    def __init__(self, buf: memoryview, seq: int, sleeping: int) -> None:
        self._buf = buf
        self._seq = seq
        self._sleeping = sleeping
        self._addr = futex.address(buf, seq)

    def value(self) -> int:
        return int(_load(self._buf, self._seq)[0])

    # ------------------------------------------------------------------ producer
    def ring(self, value: int) -> None:
        """Publish ``value`` (everything written before it is visible first, x86-64 keeps
        stores in order) and wake the consumer if it sleeps."""
        buf = self._buf
        _store(buf, self._seq, value & 0xFFFFFFFF)
        futex.fence()
        if _load(buf, self._sleeping)[0]:
            futex.wake(self._addr)

    def wake(self) -> None:
        """Wake the consumer whatever it waits for (a revocation, a close)."""
        futex.wake(self._addr)

    # ------------------------------------------------------------------ consumer
    def wait(self, seen: int, spin_ns: int, slice_s: float) -> int:
        """The word once it differs from ``seen``, or after one sleep of at most ``slice_s``
        (then it may still equal ``seen``: the caller looks at what else changed)."""
        buf, seq = self._buf, self._seq
        value: int = _load(buf, seq)[0]
        if value != seen:
            return value
        if spin_ns > 0:
            deadline = _now() + spin_ns
            while True:
                value = _load(buf, seq)[0]
                if value != seen:
                    return value
                if _now() >= deadline:
                    break
        _store(buf, self._sleeping, 1)
        futex.wait(self._addr, seen, slice_s)
        _store(buf, self._sleeping, 0)
        return int(_load(buf, seq)[0])


def apart(pid: int) -> bool:
    """Whether spinning toward process ``pid`` can pay: this process and it may run on two
    cores (when both can only take turns on one, a spin just burns the other's time)."""
    try:
        return len(os.sched_getaffinity(0) | os.sched_getaffinity(pid)) > 1
    except OSError:
        return False
