"""One POSIX shared-memory region: created once, mapped once per process, unlinked by its owner.

Creation follows CPython's ``shared_memory`` discipline: if anything fails after the name
exists, the name is unlinked before the error propagates, so a failed start leaks nothing.
A region is created sparse: tmpfs gives it pages only where they are populated (``populate``,
``shm.warm``), or touched.  Populating asks the kernel for the pages up front and reports a
full /dev/shm as :class:`ShmExhausted`, where a touch would have died of SIGBUS.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
from collections.abc import Callable
from typing import Any

import posix_ipc

from inferpool.shm.names import check_name

_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux >= 5.14
_PAGE = mmap.PAGESIZE
_POPULATE_CHUNK = 64 << 20  # between chunks, a start being stopped can say so
MiB = 1 << 20
DEV_SHM = "/dev/shm"
ROOM_HINT = (
    "give /dev/shm more room (docker run --shm-size=...; Kubernetes: an emptyDir volume with "
    "medium: Memory and a sizeLimit, mounted at /dev/shm)"
)


class ShmExhausted(MemoryError):
    """/dev/shm could not give a region the pages it needs (its message says how much)."""


def shm_free() -> int:
    """Bytes /dev/shm can still allocate."""
    st = os.statvfs(DEV_SHM)
    return st.f_bavail * st.f_frsize


def exhausted(what: str, nbytes: int) -> ShmExhausted:
    """The error for /dev/shm too full to give ``nbytes`` more, with what is free."""
    free = shm_free()
    return ShmExhausted(
        f"/dev/shm is full: {what} needs {_mib(nbytes)} more and /dev/shm has {_mib(free)} free; "
        f"{ROOM_HINT}"
    )


def _mib(nbytes: int) -> str:
    return f"{nbytes / MiB:.1f} MiB"


class Region:
    """A mapped POSIX shared-memory object.

    ``name`` is the POSIX name without the leading slash, which is also the file name in
    /dev/shm.  Only creators unlink; attachers just close their mapping.
    """

    base = 0  # the object's byte that buf[0] is (a whole region: its first)
    fd = -1  # kept open by a watched attachment (``attach(watch=True)``): ``shrunk`` looks

    def __init__(self, name: str, mapping: mmap.mmap, size: int, owner: bool, readonly: bool):
        self.name = name
        self.size = size
        self.owner = owner
        self.readonly = readonly
        self._map: mmap.mmap | None = mapping
        self.buf: memoryview = memoryview(mapping)

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(
        cls,
        name: str,
        size: int,
        *,
        prefault: bool = True,
        mode: int = 0o600,
        interrupt: Callable[[], None] | None = None,
    ) -> Region:
        """Create ``name`` exclusively (mode 0600 by default) and map it read-write; with
        ``prefault`` every page is populated now (ShmExhausted if /dev/shm cannot hold it).

        ``interrupt`` is called between chunks of the populating: what it raises ends the
        creation (the name unlinked) and propagates."""
        if size <= 0:
            raise ValueError(f"region size must be positive, got {size}")
        check_name(name)
        shm = posix_ipc.SharedMemory("/" + name, posix_ipc.O_CREX, mode=mode, size=size)
        try:
            try:
                mapping = mmap.mmap(shm.fd, size)
            finally:
                shm.close_fd()
            region = cls(name, mapping, size, owner=True, readonly=False)
            if prefault:
                region.populate(0, size, f"region {name}", interrupt)
            return region
        except BaseException:
            posix_ipc.unlink_shared_memory("/" + name)
            raise

    @classmethod
    def attach(
        cls, name: str, *, readonly: bool = False, populate: bool = False, watch: bool = False
    ) -> Region:
        """Map an existing region; ``populate`` fills the page tables now instead of on touch;
        ``watch`` keeps its descriptor open for ``shrunk`` (a region a client may shrink)."""
        flags = posix_ipc.O_RDONLY if readonly else 0
        check_name(name)
        shm = posix_ipc.SharedMemory("/" + name, flags, read_only=readonly)
        try:
            size = shm.size
            if size <= 0:
                raise ValueError(f"shared-memory region {name!r} is empty")
            mflags = mmap.MAP_SHARED | (mmap.MAP_POPULATE if populate else 0)
            prot = mmap.PROT_READ | (0 if readonly else mmap.PROT_WRITE)
            mapping = mmap.mmap(shm.fd, size, flags=mflags, prot=prot)
            region = cls(name, mapping, size, owner=False, readonly=readonly)
        except BaseException:
            shm.close_fd()
            raise
        if watch:
            region.fd = shm.fd
        else:
            shm.close_fd()
        return region

    def now_size(self) -> int:
        """The object's size now (a watched region: one ``lseek``, cheaper than ``fstat``)."""
        return os.lseek(self.fd, 0, os.SEEK_END)

    def shrunk(self) -> bool:
        """Whether the object no longer covers this mapping (a watched region): touching
        what it lost would be SIGBUS."""
        return self.now_size() < self.size

    def populate(
        self, start: int, end: int, what: str, interrupt: Callable[[], None] | None = None
    ) -> None:
        """Give ``[start, end)`` its pages now (and map them here); ShmExhausted naming
        ``what`` if /dev/shm cannot, instead of a SIGBUS at the first touch.  ``interrupt``
        is called between chunks (64 MiB): what it raises ends the populating."""
        assert self._map is not None and not self.readonly
        start -= start % _PAGE
        end = min(self.size, end)
        for chunk in range(start, end, _POPULATE_CHUNK):
            if interrupt is not None:
                interrupt()
            self._populate(chunk, min(end, chunk + _POPULATE_CHUNK), what, end - chunk)

    def _populate(self, start: int, end: int, what: str, needed: int) -> None:
        """One chunk of :meth:`populate`; ``needed``: the bytes still to populate from it."""
        assert self._map is not None
        try:
            self._map.madvise(_MADV_POPULATE_WRITE, start, end - start)
        except OSError as exc:
            if exc.errno in (errno.EFAULT, errno.ENOMEM, errno.ENOSPC):
                raise exhausted(what, needed) from None
            if exc.errno != errno.EINVAL:  # EINVAL: a kernel before 5.14
                raise
            if shm_free() < end - start:
                raise exhausted(what, needed) from None
            for off in range(start, end, _PAGE):
                self.buf[off] = self.buf[off]

    # ------------------------------------------------------------------ access
    def view(self, offset: int, nbytes: int) -> memoryview:
        """A zero-copy window; raises ValueError when it does not fit in the region."""
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise ValueError(
                f"[{offset}, {offset + nbytes}) is outside region {self.name!r} "
                f"of {self.size} bytes"
            )
        return self.buf[offset : offset + nbytes]

    @property
    def closed(self) -> bool:
        return self._map is None

    @property
    def mapping(self) -> mmap.mmap:
        """The mapping itself, until ``close``: a slice of it is ``bytes`` at once (a slice of
        ``buf`` is a view, and copying it out costs three times as much)."""
        assert self._map is not None, f"region {self.name!r} is closed"
        return self._map

    def close(self) -> None:
        """Drop this process's mapping.  Views still alive keep it until they are released."""
        if self._map is None:
            return
        unmap(self.buf, self._map)
        self._map = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def unlink(self) -> None:
        """Remove the name (owner only); mappings elsewhere stay valid until closed."""
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_shared_memory("/" + self.name)

    def destroy(self) -> None:
        self.close()
        if self.owner:
            self.unlink()

    def __repr__(self) -> str:
        return f"Region({self.name!r}, size={self.size}, owner={self.owner})"

    def __enter__(self) -> Region:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.destroy()


def unmap(buf: memoryview, mapping: mmap.mmap) -> None:
    """Release ``buf`` and close ``mapping`` (live numpy views keep it until they go)."""
    with contextlib.suppress(BufferError):
        buf.release()
        mapping.close()


class RegionCache:
    """Map each region once per process and keep it: no mmap on the request path."""

    def __init__(self, *, readonly: bool = False, populate: bool = False) -> None:
        self._regions: dict[str, Region] = {}
        self._readonly = readonly
        self._populate = populate

    def get(self, name: str) -> Region:
        region = self._regions.get(name)
        if region is None:
            region = Region.attach(name, readonly=self._readonly, populate=self._populate)
            self._regions[name] = region
        return region

    def add(self, region: Region) -> None:
        self._regions[region.name] = region

    def drop(self, name: str) -> None:
        region = self._regions.pop(name, None)
        if region is not None:
            region.close()

    def __contains__(self, name: str) -> bool:
        return name in self._regions

    def close(self) -> None:
        for region in self._regions.values():
            region.close()
        self._regions.clear()


def exists(name: str) -> bool:
    """Whether a shared-memory object ``name`` exists."""
    return os.path.exists(os.path.join("/dev/shm", name))
