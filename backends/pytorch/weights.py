"""ENABLE_WEIGHT_SHARING across worker processes: one copy of a model's weights in shared memory.

Triton shares one module between the instances of a process; inferpool runs one instance
per process, so the weights move instead.  Every instance loads the model, then asks the
broker for the shared region of its key (``backends.shared_regions``) sized for its weights:

* the first is told to fill it: it copies every parameter and buffer storage in, writes the
  header (layout digest, ready mark) and reports the region filled;
* the others get the region once it is filled, attach, and check that the layout matches;

then each re-points its parameters and buffers at views of the region (``Tensor.data``), so
its private copy is freed and every process maps the same pages.  Only the broker creates
and unlinks the region: it passes a fill that fails (or whose worker dies) to a waiting
instance, unlinks the region when no instance that asked for it is left, and sweeps it with
the run after a crash.

``key`` identifies the model file (path, size, mtime) and the device, so instances of any
model loading the same file share it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import struct
from dataclasses import dataclass

import torch

from inferpool.backends.shared_regions import SharedRegions
from inferpool.shm.region import Region
from inferpool.wire.errors import internal

_MAGIC = b"IPWEIGHT"
_HEADER = struct.Struct("<8sQ32sQ")  # magic, ready, layout digest, payload bytes
_ALIGN = 64
_DATA = 64  # payload starts after the (padded) header


def region_key(path: str, device: str) -> str:
    """A name fragment that is the same for every process loading this file onto this device."""
    st = os.stat(path)
    ident = f"{os.path.realpath(path)}\0{st.st_size}\0{st.st_mtime_ns}\0{device}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def held_bytes(module: torch.nn.Module) -> dict[str, int]:
    """Bytes of the module's parameter and buffer storages, by device type ("cpu", "cuda")."""
    seen: set[int] = set()
    held: dict[str, int] = {}
    for t in module.state_dict(keep_vars=True).values():
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            held[t.device.type] = held.get(t.device.type, 0) + storage.nbytes()
    return held


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


@dataclass
class SharedWeights:
    """The shared-memory home of one instance's weights (the broker owns the region)."""

    region: Region
    created: bool  # this instance filled it

    @classmethod
    def share(
        cls, module: torch.nn.Module, regions: SharedRegions, key: str, log: logging.Logger
    ) -> SharedWeights | None:
        """Move ``module``'s parameters and buffers into the broker's region for ``key``."""
        layout = _layout(module)
        if layout.size == 0:
            return None
        grant = regions.share(key, _DATA + layout.size)
        if grant.fill:
            region = _fill(grant.name, layout, regions, key)
        else:
            region = Region.attach(grant.name, populate=True)
            try:
                _check(region, layout)
            except BaseException:
                region.close()
                raise
        _repoint(layout, region)
        log.info(
            "%s shared weights region '%s' (%d bytes)",
            "filled" if grant.fill else "attached to",
            grant.name,
            layout.size,
        )
        return cls(region, grant.fill)


def _fill(name: str, layout: _Layout, regions: SharedRegions, key: str) -> Region:
    """Copy the weights into the region, mark it ready and tell the broker (ok or not)."""
    try:
        region = Region.attach(name)
        try:
            for storage, offset in zip(layout.storages, layout.offsets, strict=True):
                n = storage.nbytes()
                dst = torch.frombuffer(
                    region.buf, dtype=torch.uint8, count=n, offset=_DATA + offset
                )
                dst.copy_(torch.empty(0, dtype=torch.uint8).set_(storage))
                del dst
            _HEADER.pack_into(region.buf, 0, _MAGIC, 1, layout.digest, layout.size)
        except BaseException:
            region.close()
            raise
    except BaseException:
        with contextlib.suppress(Exception):  # the broker may be gone; the error says more
            regions.filled(key, False)
        raise
    regions.filled(key, True)
    return region


def _check(region: Region, layout: _Layout) -> None:
    magic, ready, digest, size = _HEADER.unpack_from(region.buf, 0)
    if magic != _MAGIC or ready != 1:
        raise internal(f"shared weights region '{region.name}' was granted but never filled")
    if digest != layout.digest or size != layout.size:
        raise internal(
            f"shared weights region '{region.name}' holds a different tensor layout than this "
            "model; the model file changed while instances were loading it"
        )


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
