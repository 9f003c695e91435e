"""ENABLE_WEIGHT_SHARING across worker processes: one copy of a model's weights in shared memory.

Triton shares one module between the instances of a process; inferpool runs one instance
per process, so the weights move instead.  Every instance loads the model, then, holding the
exclusive *setup lock* (an ``flock`` on ``<region>.lock``):

* the first finds no region: it creates ``inferpool-<run>-weights-<key>`` (mode 0600),
  copies every parameter and buffer storage in, and marks the header ready;
* later ones attach to it and check that their own layout digest matches;

then each re-points its parameters and buffers at views of the region (``Tensor.data``), so
its private copy is freed and every process maps the same pages.  Each instance holds a
shared ``flock`` on the region file for as long as it lives; at finalize, under the setup
lock, an instance that can upgrade it to exclusive is the last one and unlinks the region.
Locks are per open file, so instances in one process behave like instances in many.  A
region whose creator died half way lacks the ready mark and is rebuilt.  The broker sweeps
whatever a crash leaves, because the name carries the run id.

``key`` identifies the model file (path, size, mtime) and the device, so instances of any
model loading the same file share it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from inferpool.shm.region import Region, exists
from inferpool.shm.runs import SHM_DIR, region_name, run_of
from inferpool.wire.errors import internal, invalid_arg, unavailable

ENV_RUN_ID = "INFERPOOL_RUN_ID"
LOCK_TIMEOUT_S = 600.0
_MAGIC = b"IPWEIGHT"
_HEADER = struct.Struct("<8sQ32sQ")  # magic, ready, layout digest, payload bytes
_ALIGN = 64
_DATA = 64  # payload starts after the (padded) header


def region_key(path: str, device: str) -> str:
    """A name fragment that is the same for every process loading this file onto this device."""
    st = os.stat(path)
    ident = f"{os.path.realpath(path)}\0{st.st_size}\0{st.st_mtime_ns}\0{device}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def check_run_id(run_id: str) -> str:
    if run_of(region_name(run_id, "weights")) != run_id:
        raise invalid_arg(f"run id '{run_id}' is not a broker run id (10 hexadecimal digits)")
    return run_id


@dataclass
class _Layout:
    tensors: list[torch.Tensor]  # unique parameter/buffer tensor objects
    storages: list[torch.UntypedStorage]  # unique storages, in first-use order
    offsets: list[int]  # byte offset of each storage in the payload
    storage_of: list[int]  # tensor -> index into storages
    size: int
    digest: bytes


def _layout(module: torch.nn.Module) -> _Layout:
    tensors: list[torch.Tensor] = []
    seen: set[int] = set()
    for t in module.state_dict(keep_vars=True).values():
        if id(t) not in seen and t.device.type == "cpu":
            seen.add(id(t))
            tensors.append(t)
    storages: list[torch.UntypedStorage] = []
    index: dict[int, int] = {}
    storage_of, offsets, size = [], [], 0
    h = hashlib.sha256()
    for t in tensors:
        s = t.untyped_storage()
        if s.data_ptr() not in index:
            index[s.data_ptr()] = len(storages)
            storages.append(s)
            offsets.append(size)
            size += -(-s.nbytes() // _ALIGN) * _ALIGN
        storage_of.append(index[s.data_ptr()])
        h.update(
            repr(
                (
                    str(t.dtype),
                    tuple(t.shape),
                    t.stride(),
                    t.storage_offset(),
                    storage_of[-1],
                    s.nbytes(),
                )
            ).encode()
        )
    return _Layout(tensors, storages, offsets, storage_of, size, h.digest())


class SharedWeights:
    """The shared-memory home of one instance's weights; ``close()`` at instance finalize."""

    def __init__(self, region: Region, users_fd: int, lock_path: str, created: bool) -> None:
        self.region = region
        self.created = created
        self._users_fd: int | None = users_fd
        self._lock_path = lock_path

    @classmethod
    def share(
        cls, module: torch.nn.Module, run_id: str, key: str, log: logging.Logger
    ) -> SharedWeights | None:
        """Move ``module``'s parameters and buffers into the run's region for ``key``."""
        layout = _layout(module)
        if layout.size == 0:
            return None
        name = region_name(check_run_id(run_id), f"weights-{key}")
        lock_path = os.path.join(SHM_DIR, name + ".lock")
        with _setup_lock(lock_path):
            region, users_fd, created = _open_or_create(name, layout)
            try:
                _repoint(layout, region)
            except BaseException:
                os.close(users_fd)
                raise
        log.info(
            "%s shared weights region '%s' (%d bytes)",
            "created" if created else "attached to",
            name,
            layout.size,
        )
        return cls(region, users_fd, lock_path, created)

    def close(self) -> None:
        """Drop this instance's hold; the last holder unlinks the region and its lock file.

        The mapping itself is not closed here: the weight tensors reference it, and it is
        unmapped when the last of them is freed, so a tensor can never outlive its memory.
        """
        if self._users_fd is None:
            return
        fd, self._users_fd = self._users_fd, None
        try:
            with _setup_lock(self._lock_path):
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return  # other instances still use it
                self.region.unlink()
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._lock_path)
        finally:
            os.close(fd)


@contextlib.contextmanager
def _setup_lock(path: str) -> Iterator[None]:
    """Hold ``path``'s exclusive flock: creating, attaching and unlinking never interleave.

    The lock file is unlinked by the last user; a waiter that then wins the lock on the
    unlinked file notices (the inode changed) and starts over on a fresh one.
    """
    deadline = time.monotonic() + LOCK_TIMEOUT_S
    while True:
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise unavailable(
                            f"timed out after {LOCK_TIMEOUT_S:.0f} s waiting for another "
                            f"instance to finish sharing weights ({path})"
                        ) from None
                    time.sleep(0.01)
            try:
                current = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                current = False
            if current:
                yield
                return
        finally:
            os.close(fd)


def _users_lock(path: str) -> int:
    """A shared flock on the region file itself, held for as long as the instance uses it."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(
            fd, fcntl.LOCK_SH | fcntl.LOCK_NB
        )  # only a finisher holding the setup lock excludes
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_or_create(name: str, layout: _Layout) -> tuple[Region, int, bool]:
    """Attach to a complete region for this layout, or build it (under the setup lock).

    Returns the region, the fd holding its users lock, and whether this call created it.
    """
    path = os.path.join(SHM_DIR, name)
    if exists(name):
        region = Region.attach(name, populate=True)
        magic, ready, digest, size = _HEADER.unpack_from(region.buf, 0)
        if magic == _MAGIC and ready == 1:
            if digest != layout.digest or size != layout.size:
                region.close()
                raise internal(
                    f"shared weights region '{name}' holds a different tensor layout than this "
                    "model; the model file changed while instances were loading it"
                )
            return region, _users_lock(path), False
        region.close()  # a creator died before finishing it
        region.unlink()
    region = Region.create(name, _DATA + layout.size)
    try:
        for storage, offset in zip(layout.storages, layout.offsets, strict=True):
            n = storage.nbytes()
            dst = torch.frombuffer(region.buf, dtype=torch.uint8, count=n, offset=_DATA + offset)
            dst.copy_(torch.empty(0, dtype=torch.uint8).set_(storage))
        _HEADER.pack_into(region.buf, 0, _MAGIC, 1, layout.digest, layout.size)
        return region, _users_lock(path), True
    except BaseException:
        region.destroy()
        raise


def _repoint(layout: _Layout, region: Region) -> None:
    """Make every tensor a view of its storage's bytes in the region."""
    base = torch.frombuffer(region.buf, dtype=torch.uint8).untyped_storage()
    with torch.no_grad():
        for t, s in zip(layout.tensors, layout.storage_of, strict=True):
            byte_offset = _DATA + layout.offsets[s]
            view = torch.empty(0, dtype=t.dtype).set_(
                base, byte_offset // t.element_size() + t.storage_offset(), t.size(), t.stride()
            )
            t.data = view
