from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import posix_ipc
import pytest

from inferpool.shm.region import Region, RegionCache
from inferpool.shm.runs import RunLock, region_name, regions_of_run, run_is_alive, sweep_dead_runs
from tests.support import ROOT


def test_create_attach_view_and_unlink() -> None:
    lock = RunLock()
    name = region_name(lock.run_id, "t")
    try:
        with Region.create(name, 1 << 16) as owner:
            assert os.stat(f"/dev/shm/{name}").st_mode & 0o777 == 0o600
            np.frombuffer(owner.view(128, 16), np.uint8)[:] = 7
            cache = RegionCache()
            reader = cache.get(name)
            assert cache.get(name) is reader  # mapped once
            assert bytes(reader.view(128, 16)) == b"\x07" * 16
            with pytest.raises(ValueError, match="outside region"):
                reader.view(1 << 16, 1)
            cache.close()
            with pytest.raises(posix_ipc.ExistentialError):
                Region.create(name, 4096)  # exclusive
        assert not os.path.exists(f"/dev/shm/{name}")
    finally:
        lock.release()


def test_a_sweep_at_the_moment_a_run_starts_leaves_it_a_lock(monkeypatch) -> None:
    """Another broker's sweep, run between the lock object's creation and its flock (the
    worst moment), takes the run for a dead one: the run makes its lock again and lives."""
    import fcntl

    from inferpool.shm import runs

    real_flock = fcntl.flock
    swept: list[str] = []

    def flock_after_a_sweep(fd: int, op: int) -> None:
        monkeypatch.setattr(runs.fcntl, "flock", real_flock)  # the sweep's own probes
        swept.extend(sweep_dead_runs())
        real_flock(fd, op)

    monkeypatch.setattr(runs.fcntl, "flock", flock_after_a_sweep)
    lock = RunLock()
    try:
        assert region_name(lock.run_id, "lock") in swept  # the worst happened
        assert regions_of_run(lock.run_id) == [lock.name] and run_is_alive(lock.run_id)
    finally:
        lock.release()


def test_sweep_removes_only_dead_runs() -> None:
    live = RunLock()
    live_region = Region.create(region_name(live.run_id, "arena"), 4096)
    # a run whose process is gone: a child creates its lock and a region, then is SIGKILLed
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import os, signal, sys
        from inferpool.shm.runs import RunLock, region_name
        from inferpool.shm.region import Region
        lock = RunLock()
        Region.create(region_name(lock.run_id, "arena"), 4096)
        print(lock.run_id, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    dead_run = child.stdout.readline().strip()
    child.wait()
    try:
        assert regions_of_run(dead_run) and not run_is_alive(dead_run) and run_is_alive(live.run_id)
        removed = sweep_dead_runs()
        assert set(regions_of_run(dead_run)) == set()
        assert {region_name(dead_run, "arena"), region_name(dead_run, "lock")} <= set(removed)
        assert os.path.exists(f"/dev/shm/{live_region.name}")
    finally:
        live_region.destroy()
        live.release()
