from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferpool.shm.arena import ALIGN, Allocator, ArenaFull


def test_freed_blocks_are_reused_warm_then_by_best_fit() -> None:
    a = Allocator(1 << 20)
    x = a.alloc(1000)
    y = a.alloc(5000)
    a.alloc(1000)
    a.free(y)
    assert a.alloc(5000) == y  # the same (already faulted) block, from its size's quick list
    a.free(y)
    a.largest_free()  # merges the quick lists
    assert a.alloc(4000) == y  # best fit: the hole, not the tail
    assert x % ALIGN == 0 and y % ALIGN == 0


def test_quick_lists_are_merged_before_an_allocation_fails() -> None:
    a = Allocator(4096)
    blocks = [a.alloc(1024) for _ in range(4)]
    for off in blocks:
        a.free(off)  # all four wait on the 1024-byte quick list
    assert a.alloc(4096) == 0  # merged on demand into one block


def test_free_merges_neighbours_back_into_one_block() -> None:
    a = Allocator(4096)
    blocks = [a.alloc(1024) for _ in range(4)]
    with pytest.raises(ArenaFull, match="0 of 4096 bytes free"):
        a.alloc(1)
    for off in (blocks[1], blocks[3], blocks[0], blocks[2]):
        a.free(off)
    assert a.free_bytes == 4096 and a.largest_free() == 4096 and a.alloc(4096) == 0


def test_double_free_is_refused() -> None:
    a = Allocator(4096)
    off = a.alloc(10)
    a.free(off)
    with pytest.raises(ValueError, match="not an allocated block"):
        a.free(off)


@settings(max_examples=200)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3000)), max_size=80))
def test_random_alloc_free_never_overlaps_and_conserves_bytes(ops: list[tuple[bool, int]]) -> None:
    a = Allocator(64 * 1024)
    live: dict[int, int] = {}
    for is_alloc, n in ops:
        if is_alloc or not live:
            try:
                off = a.alloc(n)
            except ArenaFull:
                continue
            size = a.size_of(off)
            assert size is not None and size >= n
            for o, s in live.items():
                assert off + size <= o or o + s <= off, "blocks overlap"
            live[off] = size
        else:
            off = sorted(live)[n % len(live)]
            a.free(off)
            del live[off]
        assert a.free_bytes == a.size - sum(live.values())
    for off in list(live):
        a.free(off)
    assert a.free_bytes == a.size and a.largest_free() == a.size
