"""A client's POSIX object as a worker maps it: only the registered window, and only while
the object is still the one the broker checked and still covers the window.

The object belongs to a client, who may replace it or shrink it at any time.  A mapping of
pages past the end of a file faults with SIGBUS, which Python cannot survive, so:

- the window is mapped alone (its pages, not the whole object: a 16-byte window of a sparse
  gigabyte costs a page), after ``fstat`` shows the object still covers it;
- the object must be the inode the broker checked at registration (a name replaced by a
  link to memory the client may not reach is refused);
- before each batch that uses the window, one ``fstat`` on the descriptor kept open says
  whether the object shrank since (:meth:`ObjectWindow.check`), so a shrunk object is a
  request error, not a dead worker.

What remains is a client that shrinks its object *while* a batch reads it: nothing in
user space can stop that SIGBUS.  The broker then blames the client's object, not the
instance (``broker.models.blame``: the worker is respawned, the crash is not counted).
"""

from __future__ import annotations

import mmap
import os
import stat

from inferpool.shm.names import check_name
from inferpool.shm.region import unmap

SHM_DIR = "/dev/shm"
PAGE = mmap.PAGESIZE


class ObjectChanged(ValueError):
    """The object is no longer what was registered: replaced, or too small for its window."""


def open_object(name: str, write: bool = True) -> tuple[int, os.stat_result]:
    """A descriptor of /dev/shm/``name`` and its status, never following a symlink nor
    blocking on a FIFO.  OSError if it cannot be opened, ValueError if it is not a regular
    file (or ``name`` cannot be a name)."""
    check_name(name)
    flags = (os.O_RDWR if write else os.O_RDONLY) | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(os.path.join(SHM_DIR, name), flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"'/{name}' is not a shared-memory object (a regular file)")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


class ObjectWindow:
    """The pages of object ``name`` around [offset, offset + size), mapped read-write.

    ``buf`` starts at byte ``base`` of the object (``offset`` rounded down to a page), so a
    byte at ``o`` in the object is ``buf[o - base]``.
    """

    def __init__(self, name: str, inode: tuple[int, int], offset: int, size: int) -> None:
        fd, st = open_object(name)
        try:
            self.name = name
            self.end = offset + size
            if (st.st_dev, st.st_ino) != inode:
                raise ObjectChanged(
                    f"shared-memory object '/{name}' was replaced since it was registered"
                )
            self._fits(st.st_size)
            self.base = offset - offset % PAGE
            self.size = max(self.end - self.base, 1)
            flags = mmap.MAP_SHARED | mmap.MAP_POPULATE
            prot = mmap.PROT_READ | mmap.PROT_WRITE
            try:
                self._map: mmap.mmap | None = mmap.mmap(
                    fd, self.size, flags=flags, prot=prot, offset=self.base
                )
            except ValueError:  # mmap's "length is greater than file size": it shrank since
                self._fits(os.fstat(fd).st_size)
                raise
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.buf = memoryview(self._map)
        self._checked = -1  # the last batch whose check passed

    def check(self, batch: int) -> None:
        """Once per ``batch``: ObjectChanged if the object no longer covers the window."""
        if batch != self._checked:
            self._fits(os.fstat(self._fd).st_size)
            self._checked = batch

    def _fits(self, size: int) -> None:
        if size < self.end:
            raise ObjectChanged(
                f"shared-memory object '/{self.name}' shrank to {size} bytes: the registered "
                f"window ending at byte {self.end} is no longer inside it (register it again "
                "once it is large enough)"
            )

    def close(self) -> None:
        if self._map is None:
            return
        unmap(self.buf, self._map)
        self._map = None
        os.close(self._fd)


def shrunk(name: str, inode: tuple[int, int], end: int) -> bool:
    """Whether /dev/shm/``name`` is no longer object ``inode`` covering ``end`` bytes (after a
    worker died of SIGBUS: was it reading a window the client shrank?)."""
    try:
        st = os.lstat(os.path.join(SHM_DIR, name))
    except OSError:
        return True
    return (st.st_dev, st.st_ino) != inode or st.st_size < end
