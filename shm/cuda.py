"""CUDA IPC memory: device buffers shared between processes, behind the POSIX path's shape.

cupy (the ``gpu`` extra) is imported on first use only, so machines without a GPU never
load it.  A :class:`CudaBuffer` is device memory a client allocates and exports; a
:class:`CudaRegion` is the same memory opened in another process from its IPC handle
(once per region: opening costs milliseconds).  Both hand out cupy arrays that view the
memory without a copy; ``torch.from_dlpack`` turns those into torch tensors.

Device numbers are per process.  A registration names its GPU as the server numbers it;
the broker turns that into the GPU's ``CUDA_VISIBLE_DEVICES`` entry (an index or a UUID),
and a worker opens the region on the device that entry is in its own numbering: ordinal 0
in a GPU instance's worker, which sees only its own GPU, the same ordinal as the server's
in a worker that sees them all (KIND_CPU, KIND_MODEL, python, identity), so no worker
makes a CUDA context on a GPU the memory is not on.  Where the worker does not see that
GPU, the region is opened on its current device: CUDA maps memory of another device, even
one the process does not see, with peer access.

CUDA maps an IPC handle once per process (a second ``cudaIpcOpenMemHandle`` of it fails):
regions registered with the same handle (two names, two clients) share one mapping, closed
when the last of them is.

Writes into device memory are queued on a stream and finish later: whoever wrote must
:func:`synchronize` before telling another process the bytes are there (a client after
writing its inputs, a worker before answering with outputs in a client's region).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import threading
from collections.abc import Iterable
from typing import Any

from inferpool.shm.refs import CUDA_IPC_HANDLE_SIZE


class CudaUnavailable(RuntimeError):
    """cupy or a GPU is missing; the message says which."""


class RegionTooLarge(ValueError):
    """A registration claims more bytes than the device allocation behind its handle has."""


INSTALL_HINT = "pip install 'inferpool[gpu]' (CUDA 12) or 'inferpool[gpu-cuda13]'"


@functools.cache
def unavailable_reason() -> str | None:
    """Why CUDA IPC cannot work in this process, or None when it can (imports cupy and
    initialises CUDA: seconds, the first time)."""
    try:
        import cupy
    except ImportError as exc:
        return f"cupy is not installed ({INSTALL_HINT}): {exc}"
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # CUDARuntimeError without a driver
        return f"no usable CUDA device: {exc}"
    return None if count > 0 else "no CUDA device is visible"


def support_reason(gpus: int) -> str | None:
    """Why this machine cannot serve CUDA shared memory, judged without CUDA.

    For the broker: it neither imports cupy nor initialises CUDA (seconds of stall on its
    event loop, and a context nobody uses), so it asks only whether cupy is installed for
    its workers and whether it counted a GPU (``gpus``, from its topology).
    """
    if importlib.util.find_spec("cupy") is None:
        return f"cupy is not installed ({INSTALL_HINT})"
    return None if gpus > 0 else "no GPU is visible to the server"


def _cupy() -> Any:
    reason = unavailable_reason()
    if reason is not None:
        raise CudaUnavailable(reason)
    import cupy

    return cupy


def _view(cupy: Any, ptr: int, nbytes: int, owner: Any, device: int) -> Any:
    memory = cupy.cuda.UnownedMemory(ptr, nbytes, owner, device_id=device)
    return cupy.ndarray((nbytes,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(memory, 0))


def device_bytes(ptr: int, nbytes: int, owner: Any, device: int) -> Any:
    """A cupy uint8 array over ``nbytes`` of device memory at ``ptr`` on ``device`` (a CUDA
    ordinal), no copy; ``owner`` is kept alive with it (the memory's owner)."""
    return _view(_cupy(), ptr, nbytes, owner, device)


@functools.cache
def _libcuda() -> Any:
    return ctypes.CDLL("libcuda.so.1")


def allocation_size(ptr: int) -> int:
    """Bytes from ``ptr`` to the end of the device allocation it lies in.

    ``cuMemGetAddressRange`` of the driver API, which cupy does not wrap, through ctypes;
    the driver library is there wherever cupy found a GPU.
    """
    lib = _libcuda()
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    status = lib.cuMemGetAddressRange_v2(
        ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr)
    )
    if status != 0:
        name = ctypes.c_char_p()
        lib.cuGetErrorName(status, ctypes.byref(name))
        what = name.value.decode() if name.value else f"error {status}"
        raise RuntimeError(f"cuMemGetAddressRange failed: {what}")
    return int(base.value + size.value - ptr)


def ordinal_of(gpu: str, visible: str | None) -> int | None:
    """The CUDA ordinal of GPU ``gpu`` (its ``CUDA_VISIBLE_DEVICES`` entry: an index or a
    UUID) in a process whose ``CUDA_VISIBLE_DEVICES`` is ``visible`` (None: unset, every
    GPU by index); None when that process does not see it."""
    if visible is None:
        return int(gpu) if gpu.isdigit() else None
    entries = [entry.strip() for entry in visible.split(",")]
    return entries.index(gpu) if gpu in entries else None


class _Mapping:
    """One handle opened in this process: where, on which device, how large, how many
    regions use it."""

    def __init__(self, ptr: int, device: int, size: int) -> None:
        self.ptr, self.device, self.size = ptr, device, size
        self.users = 0


_MAPPINGS: dict[bytes, _Mapping] = {}  # by IPC handle
_MAPPINGS_LOCK = threading.Lock()


def _map(cupy: Any, handle: bytes, device: int) -> _Mapping:
    runtime = cupy.cuda.runtime
    with cupy.cuda.Device(device):
        ptr = runtime.ipcOpenMemHandle(handle)
        try:
            return _Mapping(ptr, device, allocation_size(ptr))
        except BaseException:
            runtime.ipcCloseMemHandle(ptr)
            raise


class CudaRegion:
    """Device memory another process exported, opened here from its IPC handle.

    Opened on the device the server names ``gpu`` where this process sees it, else on this
    thread's current device (0 in a GPU instance's worker), with lazy peer access.
    ``byte_size`` (what the client registered) is checked against the allocation, as
    Triton does when it registers a CUDA region, so no window can reach past the memory.
    """

    def __init__(self, handle: bytes, byte_size: int, gpu: str = "") -> None:
        if len(handle) != CUDA_IPC_HANDLE_SIZE:
            raise ValueError(
                f"a CUDA IPC handle has {CUDA_IPC_HANDLE_SIZE} bytes, not {len(handle)}"
            )
        self._cupy = _cupy()
        self.handle = handle
        with _MAPPINGS_LOCK:
            mapping = _MAPPINGS.get(handle)
            if mapping is None:
                device = ordinal_of(gpu, os.environ.get("CUDA_VISIBLE_DEVICES")) if gpu else None
                if device is None:
                    device = int(self._cupy.cuda.runtime.getDevice())
                mapping = _map(self._cupy, handle, device)
            if byte_size > mapping.size:
                if not mapping.users:
                    self._unmap(mapping)
                raise RegionTooLarge(
                    f"byte_size {byte_size} exceeds the {mapping.size} bytes of the CUDA "
                    "allocation the handle names"
                )
            mapping.users += 1
            _MAPPINGS[handle] = mapping
        self.ptr: int = mapping.ptr
        self.device: int = mapping.device
        self.size: int = mapping.size

    def array(self, offset: int, nbytes: int) -> Any:
        """A cupy uint8 array over ``[offset, offset + nbytes)`` of the region."""
        return _view(self._cupy, self.ptr + offset, nbytes, self, self.device)

    def close(self) -> None:
        """The region is done with the mapping; the last region of a handle closes it."""
        if not self.ptr:
            return
        self.ptr = 0
        with _MAPPINGS_LOCK:
            mapping = _MAPPINGS[self.handle]
            mapping.users -= 1
            if not mapping.users:
                del _MAPPINGS[self.handle]
                self._unmap(mapping)

    def _unmap(self, mapping: _Mapping) -> None:
        with self._cupy.cuda.Device(mapping.device):
            self._cupy.cuda.runtime.ipcCloseMemHandle(mapping.ptr)


class CudaBuffer:
    """Device memory allocated outside cupy's pool, so its IPC handle names exactly it."""

    def __init__(self, nbytes: int, device_id: int = 0) -> None:
        if nbytes <= 0:
            raise ValueError(f"a CUDA buffer needs a positive size, got {nbytes}")
        self._cupy = _cupy()
        self.nbytes = nbytes
        self.device_id = device_id
        runtime = self._cupy.cuda.runtime
        with self._cupy.cuda.Device(device_id):
            self.ptr: int = runtime.malloc(nbytes)
            try:
                self.handle: bytes = bytes(runtime.ipcGetMemHandle(self.ptr))
            except BaseException:
                runtime.free(self.ptr)
                raise

    def array(self, offset: int = 0, nbytes: int | None = None) -> Any:
        size = self.nbytes - offset if nbytes is None else nbytes
        if offset < 0 or size < 0 or offset + size > self.nbytes:
            raise ValueError(f"[{offset}, {offset + size}) is outside a buffer of {self.nbytes}")
        return _view(self._cupy, self.ptr + offset, size, self, self.device_id)

    def synchronize(self) -> None:
        """Wait for the work queued on this buffer's device: call it after writing inputs
        and before sending the request, so the server reads finished data."""
        synchronize([self.device_id])

    def free(self) -> None:
        if self.ptr:
            with self._cupy.cuda.Device(self.device_id):
                self._cupy.cuda.runtime.free(self.ptr)
            self.ptr = 0


def synchronize(devices: Iterable[int]) -> None:
    """Wait until every stream of each device has finished what was queued on it."""
    cupy = _cupy()
    for device in sorted(set(devices)):
        with cupy.cuda.Device(device):
            cupy.cuda.runtime.deviceSynchronize()


def as_cupy(array: Any) -> Any:
    """A cupy array over a device array (cupy, torch or any DLPack producer), no copy."""
    cupy = _cupy()
    return array if isinstance(array, cupy.ndarray) else cupy.from_dlpack(array)
