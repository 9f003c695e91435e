"""A region the server makes for a client and never touches through a mapping.

A client of the server's user can open any region made for it read-write and shrink it
(``ftruncate``).  Touching a page a shrunk object no longer has is SIGBUS, which no Python
process survives, and no check before a load can close the window between the check and
the load.  So the process that must never die of a client's doing (the broker) reads and
writes such a region through its descriptor: a read past the end comes back short, a
write past it grows the object again; neither faults.

The one mapping kept is of the first page, for futex wake-ups only (its words are never
loaded or stored here): a futex call on a page that is gone fails with EFAULT, it does not
fault.  Pages are reserved at creation with ``posix_fallocate``, so a full /dev/shm is an
error then (:class:`ShmExhausted`), never a SIGBUS later.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import struct

import posix_ipc

from inferpool.shm import futex
from inferpool.shm.names import check_name
from inferpool.shm.region import exhausted, unmap

_WORD = struct.Struct("<I")


class GuardedRegion:
    """A region created here (mode 0600), reached only through its descriptor."""

    def __init__(self, name: str, fd: int, size: int) -> None:
        self.name = name
        self.size = size
        self._fd = fd
        self._page = mmap.mmap(fd, min(size, mmap.PAGESIZE))
        self._buf = memoryview(self._page)

    @classmethod
    def create(cls, name: str, size: int) -> GuardedRegion:
        """Create ``name`` exclusively with ``size`` bytes reserved (ShmExhausted when
        /dev/shm cannot hold them); the name is unlinked again if anything fails."""
        if size <= 0:
            raise ValueError(f"region size must be positive, got {size}")
        check_name(name)
        shm = posix_ipc.SharedMemory("/" + name, posix_ipc.O_CREX, mode=0o600, size=size)
        fd = shm.fd
        try:
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                raise exhausted(f"region {name}", size) from None
            return cls(name, fd, size)
        except BaseException:
            os.close(fd)
            posix_ipc.unlink_shared_memory("/" + name)
            raise

    def write(self, offset: int, data: bytes) -> None:
        os.pwrite(self._fd, data, offset)

    def write_word(self, offset: int, value: int) -> None:
        """Store a 32-bit word (little-endian).  A peer reading it through its mapping sees
        the old value or the new one whenever the two differ in their lowest byte only
        (the flags and codes written this way)."""
        os.pwrite(self._fd, _WORD.pack(value & 0xFFFFFFFF), offset)

    def read(self, offset: int, nbytes: int) -> bytes:
        """``nbytes`` from ``offset``; fewer when the object ends before them."""
        return os.pread(self._fd, nbytes, offset)

    def current_size(self) -> int:
        """The object's size now (a client may have changed it)."""
        return os.fstat(self._fd).st_size

    @property
    def shrunk(self) -> bool:
        return self.current_size() < self.size

    def wake(self, offset: int) -> None:
        """Wake whoever sleeps on the futex word at ``offset`` (in the first page)."""
        futex.wake(futex.address(self._page, offset))

    def destroy(self) -> None:
        """Unmap, close and unlink (mappings elsewhere stay valid until closed)."""
        if self._fd < 0:
            return
        unmap(self._buf, self._page)
        os.close(self._fd)
        self._fd = -1
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_shared_memory("/" + self.name)

    def __repr__(self) -> str:
        return f"GuardedRegion({self.name!r}, size={self.size})"
