"""The arena: a region carved into slots by a best-fit allocator with coalescing.

A region is created once; requests take and return slots, never mapping or unlinking
anything.  Best fit keeps reusing the same recently-freed, already-faulted pages for a
steady stream of same-sized requests, and keeps the blocks in use low in the region, whose
pages are populated only as far as they are used (``shm.warm``).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from inferpool.shm.region import Region, ShmExhausted
from inferpool.shm.warm import Warm

ALIGN = 64  # cache line; also satisfies every numpy/torch dtype
_new = tuple.__new__  # a Slot without its Python-level __new__ (one per request)
QUICK_BLOCKS = 8  # freed blocks kept per exact size before they are merged
_ZEROS = memoryview(bytes(4096))  # what small freed slots are scrubbed with


class ArenaFull(MemoryError):
    """No free block is large enough right now."""


class Slot(NamedTuple):
    """A block of an arena: where it lives and how many bytes the caller asked for
    (immutable; a named tuple is made at a third of a frozen dataclass's cost, and one is
    made per frame-borne input)."""

    region: str
    offset: int
    nbytes: int


class Allocator:
    """Offsets only, no memory: best-fit over free blocks kept by size, merged on free.

    A freed block is first kept on a short list for its exact size (as dlmalloc's fast
    bins): a steady stream of same-sized requests then takes and returns the same warm
    blocks in O(1).  Those blocks are merged back only when an allocation would otherwise
    fail, or when the largest free block is asked for.
    """

    def __init__(self, size: int, align: int = ALIGN) -> None:
        if size <= 0:
            raise ValueError("allocator size must be positive")
        self.size = size - size % align
        self.align = align
        self._by_start: dict[int, int] = {0: self.size}  # free block start -> size
        self._by_end: dict[int, int] = {self.size: 0}  # free block end -> start
        self._sizes: list[tuple[int, int]] = [(self.size, 0)]  # sorted (size, start)
        self._used: dict[int, int] = {}  # allocated start -> rounded size
        self._quick: dict[int, list[int]] = {}  # rounded size -> freed blocks not yet merged
        self.free_bytes = self.size

    def alloc(self, nbytes: int) -> int:
        """Offset of a block of at least ``nbytes`` (at least one ALIGN unit); ArenaFull if none."""
        align = self.align
        need = (nbytes + align - 1) // align * align if nbytes > 0 else align
        quick = self._quick.get(need)
        if quick:
            start = quick.pop()
            self._used[start] = need
            self.free_bytes -= need
            return start
        i = bisect.bisect_left(self._sizes, (need, -1))
        if i == len(self._sizes) and self._quick:
            self._merge_quick()
            i = bisect.bisect_left(self._sizes, (need, -1))
        if i == len(self._sizes):
            raise ArenaFull(
                f"no free block of {need} bytes ({self.free_bytes} of {self.size} bytes free, "
                f"largest block {self.largest_free()})"
            )
        size, start = self._sizes.pop(i)
        del self._by_start[start]
        del self._by_end[start + size]
        if size > need:
            self._insert(start + need, size - need)
        self._used[start] = need
        self.free_bytes -= need
        return start

    def block_size(self, offset: int) -> int:
        """The size of the block allocated at ``offset`` (rounded up; 0 if none is)."""
        return self._used.get(offset, 0)

    def free(self, offset: int) -> None:
        """Return a block; ValueError for an offset that is not allocated (double free)."""
        try:
            size = self._used.pop(offset)
        except KeyError:
            raise ValueError(f"offset {offset} is not an allocated block") from None
        self.free_bytes += size
        quick = self._quick.get(size)
        if quick is None:
            quick = self._quick[size] = []
        if len(quick) < QUICK_BLOCKS:
            quick.append(offset)
            return
        self._merge(offset, size)

    def _merge_quick(self) -> None:
        quick, self._quick = self._quick, {}
        for size, starts in quick.items():
            for start in starts:
                self._merge(start, size)

    def _merge(self, offset: int, size: int) -> None:
        """Put a block back among the free ones, joined with its free neighbours."""
        start, end = offset, offset + size
        before = self._by_end.get(start)
        if before is not None:  # merge with the free block that ends where this one starts
            self._remove(before, start - before)
            start = before
        after = self._by_start.get(end)
        if after is not None:  # and with the one that starts where this one ends
            self._remove(end, after)
            end += after
        self._insert(start, end - start)

    def size_of(self, offset: int) -> int | None:
        return self._used.get(offset)

    def largest_free(self) -> int:
        """The largest block one allocation can get (merges the quick lists first)."""
        if self._quick:
            self._merge_quick()
        return self._sizes[-1][0] if self._sizes else 0

    @property
    def used_blocks(self) -> int:
        return len(self._used)

    def _insert(self, start: int, size: int) -> None:
        self._by_start[start] = size
        self._by_end[start + size] = start
        bisect.insort(self._sizes, (size, start))

    def _remove(self, start: int, size: int) -> None:
        del self._by_start[start]
        del self._by_end[start + size]
        i = bisect.bisect_left(self._sizes, (size, start))
        del self._sizes[i]


class Arena:
    """A region plus its allocator: hands out Slots whose memory is a view of the region.

    The region's first ``prefault`` bytes are populated at once; the rest as slots reach it
    (``alloc`` raises ShmExhausted, a MemoryError, when /dev/shm cannot give them).  A freed
    slot is zeroed (``scrub``): whoever gets the block next, or reads the arena by any path,
    never sees the bytes of the request that held it.
    """

    def __init__(
        self,
        region: Region,
        align: int = ALIGN,
        prefault: int = 0,
        scrub: bool = True,
        interrupt: Callable[[], None] | None = None,
    ) -> None:
        """``interrupt``: called between chunks of the pre-fault (``Region.populate``)."""
        self.region = region
        self.allocator = Allocator(region.size, align)
        what = f"the shared-memory arena {region.name}"
        self.warm = Warm(region, prefault, what, interrupt)
        self._bytes: np.ndarray | None = np.frombuffer(region.buf, np.uint8) if scrub else None

    @property
    def name(self) -> str:
        return self.region.name

    @property
    def free_bytes(self) -> int:
        return self.allocator.free_bytes

    @property
    def size(self) -> int:
        return self.allocator.size

    def alloc(self, nbytes: int) -> Slot:
        offset = self.allocator.alloc(nbytes)
        if offset + nbytes > self.warm.upto:
            try:
                self.warm.cover(offset + nbytes)
            except ShmExhausted:
                self.allocator.free(offset)
                raise
        return _new(Slot, (self.region.name, offset, nbytes))

    def free(self, slot: Slot) -> None:
        self.allocator.free(slot.offset)
        nbytes = slot.nbytes
        if self._bytes is not None and nbytes:
            start = slot.offset
            if nbytes <= len(_ZEROS):  # a copy of zeros: a third of numpy's fill, this small
                self.region.buf[start : start + nbytes] = _ZEROS[:nbytes]
            else:
                self._bytes[start : start + nbytes] = 0

    def view(self, slot: Slot) -> memoryview:
        return self.region.view(slot.offset, slot.nbytes)

    def destroy(self) -> None:
        self._bytes = None  # its export of the mapping would keep it open
        self.region.destroy()
