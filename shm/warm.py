"""The warm part of a region: the pages /dev/shm has given it, grown ahead of use.

A region is created large and sparse; only its first ``initial`` bytes are populated at start
(what the first requests need).  An allocator hands out low offsets first (best fit keeps
reusing the warm blocks), so its high-water mark is what the region really needs: when an
allocation ends beyond the warm part, the part grows to cover it, to at least twice its size
(at most ``GROWTH_CAP`` beyond the need), so a growing load populates O(log size) times and
the request path never takes a page fault on fresh memory.  Growth that /dev/shm cannot give
raises :class:`~inferpool.shm.region.ShmExhausted`, never a SIGBUS.
"""

from __future__ import annotations

from inferpool.shm.region import MiB, Region

STEP = 1 * MiB  # growth is rounded up to whole steps
GROWTH_CAP = 32 * MiB  # the most a growth populates beyond what was asked


class Warm:
    """How far ``region`` is populated, in this process's mapping."""

    def __init__(self, region: Region, initial: int, what: str) -> None:
        self.region = region
        self.what = what  # names the region in a ShmExhausted message
        self.upto = 0
        if initial > 0:
            self._grow(min(region.size, initial))

    def cover(self, end: int) -> None:
        """Make sure ``[0, end)`` is populated (ShmExhausted if /dev/shm is full)."""
        if end > self.upto:
            target = max(end, min(2 * self.upto, end + GROWTH_CAP))
            self._grow(min(self.region.size, -(-target // STEP) * STEP))

    def _grow(self, upto: int) -> None:
        self.region.populate(self.upto, upto, self.what)
        self.upto = upto
