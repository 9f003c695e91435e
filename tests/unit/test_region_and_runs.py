from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import textwrap

import numpy as np
import posix_ipc
import pytest

from inferpool.shm.names import check_name
from inferpool.shm.refs import parse_ref
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
    assert child.stdout is not None
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


def _in_child(code: str, timeout: float = 10) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter, so a sweep that blocks fails the test, not hangs it."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def test_sweep_neither_blocks_on_nor_follows_nor_trusts_foreign_files(tmp_path) -> None:
    """A FIFO, a symlink or another user's file named like a run's lock or region: the sweep
    returns at once, touches no target, and leaves what is not ours alone.  (In a directory
    standing in for /dev/shm: a FIFO in the real one would hang other brokers' older code.)"""
    shm = tmp_path / "shm"
    shm.mkdir()
    fifo_run, link_run, foreign_run, dead_run = (secrets.token_hex(5) for _ in range(4))
    os.mkfifo(shm / region_name(fifo_run, "lock"), 0o600)
    target = tmp_path / "precious"
    target.write_text("keep me")
    for tag in ("lock", "arena"):
        os.symlink(target, shm / region_name(link_run, tag))  # a dead run's names as symlinks
        other = shm / region_name(foreign_run, tag)  # a run of another user (nobody)
        other.touch()
        os.chown(other, 65534, 65534)
        (shm / region_name(dead_run, tag)).touch()  # a dead run of ours: swept
    done = _in_child(
        f"""
        from inferpool.shm.runs import sweep_dead_runs
        print(sorted(sweep_dead_runs({str(shm)!r})))
        """
    )
    assert done.returncode == 0, done.stderr
    assert target.read_text() == "keep me"
    assert sorted(os.listdir(shm)) == sorted(
        [region_name(fifo_run, "lock")]
        + [region_name(run, tag) for run in (link_run, foreign_run) for tag in ("lock", "arena")]
    )
    assert done.stdout.strip() == str(sorted(region_name(dead_run, t) for t in ("arena", "lock")))


def test_a_fifo_named_like_a_lock_does_not_hang_a_broker_start(short_tmp) -> None:
    fifo = f"/dev/shm/{region_name(secrets.token_hex(5), 'lock')}"
    os.mkfifo(fifo, 0o600)
    try:
        done = _in_child(
            f"""
            import contextlib
            from inferpool.broker.endpoints import open_run
            with contextlib.ExitStack() as stack:
                print(open_run(stack, {str(short_tmp / "run")!r}))
            """
        )
    finally:
        with contextlib.suppress(OSError):  # free any other program's sweep blocked on it
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        os.unlink(fifo)
    assert done.returncode == 0, done.stderr
    assert not regions_of_run(done.stdout.strip())


@pytest.mark.parametrize(
    "name", ["", ".", "..", "a/b", "x\x00y", "line\nbreak", "k" * 256, "\udc80", None]
)
def test_names_that_cannot_name_an_object_never_reach_posix_ipc(name) -> None:
    with pytest.raises(ValueError):
        check_name(name)
    with pytest.raises(ValueError):
        Region.attach(name)
    if name is not None:
        with pytest.raises(ValueError):
            parse_ref(f"sys/1/2.3/0/8/{name}")
