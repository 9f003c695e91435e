"""Run naming and the start-up sweep of regions that a dead run left behind.

Every region of a broker run is named ``inferpool-<run>-<tag>``.  The run holds an exclusive
``flock`` on its lock object ``inferpool-<run>-lock`` for as long as it lives; the kernel drops
that lock when the process dies, however it dies.  A sweep therefore unlinks exactly the
regions whose run no longer holds its lock, and never touches a live run's regions.

/dev/shm is writable by every local user, so nothing found there is trusted by its name: a
lock or region counts only if it is a regular file owned by this user, opened without
following a symlink or blocking on a FIFO.  Anything else is another user's business (or
an attack) and is left alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import stat
from collections import defaultdict

PREFIX = "inferpool-"
SHM_DIR = "/dev/shm"
_NAME = re.compile(r"^inferpool-([0-9a-f]{10})-(.+)$")


def new_run_id() -> str:
    """A fresh run id (ten hex digits)."""
    return secrets.token_hex(5)


def region_name(run_id: str, tag: str) -> str:
    """The name of a region of run ``run_id``."""
    return f"{PREFIX}{run_id}-{tag}"


def run_of(name: str) -> str | None:
    """The run a region's name belongs to, or None for a name not of ours."""
    m = _NAME.match(name)
    return m.group(1) if m else None


class RunLock:
    """The liveness token of one run: an flock held on a 0600 shm object until release.

    A broker sweeping at the moment this one creates its lock may see the object before it
    is locked: its probe then holds the lock for an instant (so this waits for it), or it
    takes the run for a dead one and unlinks the object (so this, finding its object
    unlinked, makes it again).
    """

    def __init__(self, run_id: str | None = None) -> None:
        self.run_id = run_id or new_run_id()
        self.name = region_name(self.run_id, "lock")
        path = os.path.join(SHM_DIR, self.name)
        while True:
            fd = os.open(
                path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # a probe's hold lasts an instant
                linked = os.fstat(fd).st_nlink > 0
            except BaseException:
                os.close(fd)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                raise
            if linked:
                self._fd: int | None = fd
                return
            os.close(fd)  # swept as a dead run's before it was locked: again

    def release(self) -> None:
        """Unlink the lock object and drop the lock (call after the run's regions are gone)."""
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(SHM_DIR, self.name))
        os.close(self._fd)
        self._fd = None


def ours(path: str) -> bool:
    """Whether ``path`` is a regular file owned by this user (a symlink is not followed)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


def run_is_alive(run_id: str, shm_dir: str = SHM_DIR) -> bool:
    """Whether the run's lock is held; a lock that is not a regular file of ours counts as
    alive: not ours to judge (and never opened in a way that could block)."""
    path = os.path.join(shm_dir, region_name(run_id, "lock"))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return False  # a run without its lock is dead or finishing its own cleanup
    except OSError:
        return True  # a symlink (ELOOP), another user's (EACCES): not ours to judge
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return True
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def sweep_dead_runs(shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink every ``inferpool-`` region of ours whose run is dead; return the names removed."""
    by_run: dict[str, list[str]] = defaultdict(list)
    try:
        entries = os.listdir(shm_dir)
    except FileNotFoundError:
        return []
    for entry in entries:
        run = run_of(entry)
        if run is not None:
            by_run[run].append(entry)
    removed: list[str] = []
    for run, names in by_run.items():
        if run_is_alive(run, shm_dir):
            continue
        lock = region_name(run, "lock")
        for name in sorted(names, key=lambda n: n == lock):  # the lock goes last
            if not ours(os.path.join(shm_dir, name)):
                continue
            try:
                os.unlink(os.path.join(shm_dir, name))  # shm_unlink is this, in /dev/shm
                removed.append(name)
            except (FileNotFoundError, PermissionError):
                pass
    return removed


def regions_of_run(run_id: str, shm_dir: str = SHM_DIR) -> list[str]:
    """The regions of run ``run_id`` in /dev/shm."""
    prefix = f"{PREFIX}{run_id}-"
    try:
        return sorted(e for e in os.listdir(shm_dir) if e.startswith(prefix))
    except FileNotFoundError:
        return []
