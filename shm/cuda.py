"""CUDA IPC memory: device buffers shared between processes, behind the POSIX path's shape.

cupy (the ``gpu`` extra, ``cupy-cuda12x``) is imported on first use only, so machines
without a GPU never load it.  A :class:`CudaBuffer` is device memory a client allocates and
exports; a :class:`CudaRegion` is the same memory opened in another process from its IPC
handle (once per region: opening costs milliseconds).  Both hand out cupy arrays that view
the memory without a copy; ``torch.from_dlpack`` turns those into torch tensors.
"""

from __future__ import annotations

import functools
from typing import Any

from inferpool.shm.refs import CUDA_IPC_HANDLE_SIZE


class CudaUnavailable(RuntimeError):
    """cupy or a GPU is missing; the message says which."""


@functools.cache
def unavailable_reason() -> str | None:
    """Why CUDA IPC cannot work in this process, or None when it can."""
    try:
        import cupy
    except ImportError as exc:
        return f"cupy is not installed (pip install 'inferpool[gpu]'): {exc}"
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # CUDARuntimeError without a driver
        return f"no usable CUDA device: {exc}"
    return None if count > 0 else "no CUDA device is visible"


def _cupy() -> Any:
    reason = unavailable_reason()
    if reason is not None:
        raise CudaUnavailable(reason)
    import cupy

    return cupy


def _view(cupy: Any, ptr: int, nbytes: int, owner: Any, device_id: int) -> Any:
    memory = cupy.cuda.UnownedMemory(ptr, nbytes, owner, device_id=device_id)
    return cupy.ndarray((nbytes,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(memory, 0))


class CudaRegion:
    """Device memory another process exported, opened here from its IPC handle."""

    def __init__(self, handle: bytes, device_id: int) -> None:
        if len(handle) != CUDA_IPC_HANDLE_SIZE:
            raise ValueError(
                f"a CUDA IPC handle has {CUDA_IPC_HANDLE_SIZE} bytes, not {len(handle)}"
            )
        self._cupy = _cupy()
        self.device_id = device_id
        with self._cupy.cuda.Device(device_id):
            self.ptr: int = self._cupy.cuda.runtime.ipcOpenMemHandle(handle)

    def array(self, offset: int, nbytes: int) -> Any:
        """A cupy uint8 array over ``[offset, offset + nbytes)`` of the region."""
        return _view(self._cupy, self.ptr + offset, nbytes, self, self.device_id)

    def close(self) -> None:
        if self.ptr:
            with self._cupy.cuda.Device(self.device_id):
                self._cupy.cuda.runtime.ipcCloseMemHandle(self.ptr)
            self.ptr = 0


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

    def free(self) -> None:
        if self.ptr:
            with self._cupy.cuda.Device(self.device_id):
                self._cupy.cuda.runtime.free(self.ptr)
            self.ptr = 0
