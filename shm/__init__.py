"""Shared memory for inferpool: POSIX regions, the arena allocator, run naming and sweeping.

This package imports nothing else of inferpool, so every process (broker, worker, client)
can use it.
"""

from inferpool.shm.arena import Allocator, Arena, ArenaFull, Slot
from inferpool.shm.region import Region, RegionCache
from inferpool.shm.runs import PREFIX, RunLock, region_name, sweep_dead_runs

__all__ = [
    "PREFIX",
    "Allocator",
    "Arena",
    "ArenaFull",
    "Region",
    "RegionCache",
    "RunLock",
    "Slot",
    "region_name",
    "sweep_dead_runs",
]
