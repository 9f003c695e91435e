"""Regions hold the /dev/shm pages they use: created sparse, populated at start only as far
as asked, grown ahead of the allocations that reach further, and a growth that /dev/shm
cannot give is an error, never a SIGBUS."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from inferpool.shm.arena import Arena
from inferpool.shm.region import MiB, Region
from inferpool.shm.runs import RunLock, region_name
from inferpool.shm.warm import GROWTH_CAP, STEP
from tests.support import ROOT


def resident(region: Region) -> int:
    return os.stat(f"/dev/shm/{region.name}").st_blocks * 512


@pytest.fixture
def region() -> Iterator[Region]:
    lock = RunLock()
    region = Region.create(region_name(lock.run_id, "arena"), 256 * MiB, prefault=False)
    try:
        yield region
    finally:
        region.destroy()
        lock.release()


def test_an_arena_populates_what_its_slots_reach(region: Region) -> None:
    assert resident(region) == 0  # created sparse
    arena = Arena(region, prefault=2 * MiB)
    assert resident(region) == 2 * MiB == arena.warm.upto
    small = [arena.alloc(4096) for _ in range(100)]  # all within the warm part
    assert resident(region) == 2 * MiB
    for slot in small:
        arena.free(slot)
    big = arena.alloc(3 * MiB)  # reaches past it: populated to twice what was warm
    assert arena.warm.upto == 4 * MiB and resident(region) == 4 * MiB
    arena.free(big)
    assert arena.alloc(3 * MiB).offset == big.offset  # the warm block again, nothing grows
    assert resident(region) == 4 * MiB
    huge = arena.alloc(100 * MiB)  # far past twice the warm part: just what it needs
    end = huge.offset + huge.nbytes
    assert end <= arena.warm.upto < end + STEP
    more = arena.alloc(2 * MiB)  # a little past a large warm part: at most GROWTH_CAP more
    assert more.offset + more.nbytes + GROWTH_CAP <= arena.warm.upto
    assert arena.warm.upto < more.offset + more.nbytes + GROWTH_CAP + STEP
    assert resident(region) == arena.warm.upto


def test_a_growth_dev_shm_cannot_give_is_an_error_not_a_sigbus() -> None:
    """The region shrinks under the arena (as a full /dev/shm refuses pages): growing into
    the missing part raises ShmExhausted naming the region and how to give more room."""
    code = textwrap.dedent("""
        import os
        import posix_ipc
        from inferpool.shm.arena import Arena
        from inferpool.shm.region import MiB, Region, ShmExhausted
        from inferpool.shm.runs import RunLock, region_name
        lock = RunLock()
        region = Region.create(region_name(lock.run_id, "arena"), 64 * MiB, prefault=False)
        try:
            arena = Arena(region, prefault=MiB)
            shm = posix_ipc.SharedMemory("/" + region.name)
            os.ftruncate(shm.fd, 2 * MiB)
            shm.close_fd()
            try:
                arena.alloc(8 * MiB)
            except ShmExhausted as exc:
                print("refused:", exc)
            assert arena.allocator.used_blocks == 0
        finally:
            region.destroy()
            lock.release()
    """)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "refused: /dev/shm is full: the shared-memory arena" in done.stdout
    assert "docker run --shm-size" in done.stdout
