"""One direction of a lane: a sequence word its producer bumps and its consumer waits on.

The consumer spins on the word for a bounded time (worth it only when the producer runs on
another core: its ``stay`` check, looked at on every turn of the spin, says so, and when
its spins have been catching the change: ``MISSES``), then raises its ``sleeping`` flag and
sleeps on the word with a futex.  The
producer publishes by storing the new sequence number, then, after a full barrier, looks at
the flag and makes the wake-up system call only when the consumer sleeps: a producer whose
peer is spinning pays no system call at all.  Both words live in shared memory (the lane's
region, ``wire.lane_region`` gives their offsets); each side writes only its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from inferpool.shm import futex

_now = time.monotonic_ns
# After MISSES spins in a row ran out of time, a consumer sleeps at once and spins again only
# on every TRY_EVERY-th wait: a producer that answers later than the spin lasts (a long
# forward pass) is not raced by a core that only burns (where two cores share a physical
# one, or a host's time, that burning slows the producer's own work)
MISSES, TRY_EVERY = 3, 16
_acquire, _release = futex.fence_acquire, futex.fence_release


class Bell:
    """``seq``: the byte offset of the sequence word (the futex); ``sleeping``: the offset of
    the consumer's flag.  ``buf`` is a writable view of the mapping (which must stay open),
    ``words`` the same memory cast to 32-bit words: a word is loaded and stored with one
    aligned access (``struct.pack_into`` zero-fills first, and a peer would read the 0)."""

    __slots__ = (
        "_addr",
        "_seq",
        "_skipped",
        "_sleeping",
        "_words",
        "misses",
        "shrunk",
        "slept",
        "spun",
    )

    def __init__(self, buf: memoryview, words: memoryview, seq: int, sleeping: int) -> None:
        self._words = words
        self._seq = seq >> 2
        self._sleeping = sleeping >> 2
        self._addr = futex.word(futex.address(buf, seq))
        self.spun = 0  # waits the word's change ended while spinning (consumer)
        self.slept = 0  # waits that went to sleep
        # (consumer) whether the region lost the words' page: a peer may shrink it, and the
        # words are not touched after a sleep while it says so (None: nobody can)
        self.shrunk: Callable[[], bool] | None = None
        self.misses = 0  # spins in a row that ran out of time before the change came
        self._skipped = 0  # waits that did not spin since the last try (after MISSES)

    def value(self) -> int:
        return int(self._words[self._seq])

    # ------------------------------------------------------------------ producer
    def ring(self, value: int) -> None:
        """Publish ``value`` (everything written before it is visible first, x86-64 keeps
        stores in order) and wake the consumer if it sleeps."""
        words = self._words
        words[self._seq] = value & 0xFFFFFFFF
        _acquire()  # futex.fence(), inline: a full barrier
        _release()
        if words[self._sleeping]:
            futex.wake(self._addr)

    def publish(self, value: int) -> None:
        """Publish ``value`` and wake nobody yet: the caller calls ``wake`` soon (whoever
        sleeps on the word then wakes, the consumer or others who watch it)."""
        self._words[self._seq] = value & 0xFFFFFFFF
        _acquire()
        _release()

    def wake(self) -> None:
        """Wake the consumer whatever it waits for (a revocation, a close)."""
        futex.wake(self._addr)

    # ------------------------------------------------------------------ consumer
    def wait(
        self, seen: int, spin_ns: int, slice_s: float, stay: Callable[[], object] | None = None
    ) -> int:
        """The word once it differs from ``seen``, or after one sleep of at most ``slice_s``
        (then it may still equal ``seen``: the caller looks at what else changed).  The
        spin lasts ``spin_ns`` at most, and only while ``stay()`` is true (None: always)."""
        words, seq = self._words, self._seq
        value: int = words[seq]
        if value != seen:
            return value
        if spin_ns > 0 and self.misses >= MISSES:  # changes come later than a spin lasts
            self._skipped += 1
            if self._skipped < TRY_EVERY:
                spin_ns = 0
            else:
                self._skipped = 0  # try again: the producer may be quick again
        if spin_ns > 0 and (stay is None or stay()):
            deadline = _now() + spin_ns
            while True:
                value = words[seq]
                if value != seen:
                    self.spun += 1
                    self.misses = 0
                    return value
                if _now() >= deadline:
                    self.misses += 1
                    break
                if stay is not None and not stay():
                    break
        self.slept += 1
        words[self._sleeping] = 1
        futex.wait(self._addr, seen, slice_s)
        if self.shrunk is not None and self.shrunk():
            return seen  # the caller sees the region shrank
        words[self._sleeping] = 0
        return int(words[seq])


def bells(
    buf: memoryview, words: memoryview, offsets: tuple[int, int, int, int]
) -> tuple[Bell, Bell]:
    """A lane's two bells, (requests, responses), from the four offsets of its layout:
    request sequence, worker's flag, response sequence, client's flag."""
    req_seq, worker_sleeping, resp_seq, client_sleeping = offsets
    return Bell(buf, words, req_seq, worker_sleeping), Bell(buf, words, resp_seq, client_sleeping)
