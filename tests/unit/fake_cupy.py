"""A stand-in for the few cupy calls the GPU paths make, for machines without a GPU.

It records what it is asked (``calls``) and keeps "device memory" in numpy arrays, so the
unit tests can check the order of calls (open on which device, synchronise before replying)
and that device arrays never reach a numpy-only call.  The real paths run in tests/gpu.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np


class DeviceArray:
    """Device memory as the paths see a cupy array: no buffer protocol, no numpy flags."""

    def __init__(self, data: np.ndarray, device: int, calls: list[Any]) -> None:
        self._data = data
        self.device = device
        self._calls = calls

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._data.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._data.shape

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "typestr": self.dtype.str, "version": 3}

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, self.device)  # kDLCUDA

    def __dlpack__(self, **kw: Any) -> Any:
        raise BufferError("Unsupported device in DLTensor.")  # what numpy's from_dlpack meets

    def __array__(self, *args: Any, **kw: Any) -> Any:
        raise TypeError("Implicit conversion to a NumPy array is not allowed")

    def view(self, dtype: Any) -> DeviceArray:
        return DeviceArray(self._data.view(dtype), self.device, self._calls)

    def reshape(self, shape: Any) -> DeviceArray:
        return DeviceArray(self._data.reshape(shape), self.device, self._calls)

    def get(self, out: np.ndarray | None = None) -> np.ndarray:
        self._calls.append(("get", self.device))
        if out is None:
            return self._data.copy()
        np.copyto(out, self._data)
        return out

    def set(self, arr: np.ndarray) -> None:
        self._calls.append(("set", self.device))
        np.copyto(self._data, arr)

    def __setitem__(self, key: Any, value: DeviceArray) -> None:
        self._calls.append(("device copy", self.device))
        self._data[key] = value._data


class FakeCupy:
    """``cuda.runtime``, ``cuda.Device``, ``ndarray`` and ``from_dlpack``, recorded."""

    ndarray = DeviceArray

    def __init__(self, current_device: int = 0, fail_sync: bool = False) -> None:
        self.calls: list[Any] = []
        self.current = current_device
        self.fail_sync = fail_sync
        self.cuda = SimpleNamespace(runtime=self, Device=self._device)

    @contextlib.contextmanager
    def _device(self, device: int) -> Iterator[None]:
        before, self.current = self.current, device
        try:
            yield
        finally:
            self.current = before

    # cuda.runtime (cupy's names)
    def getDevice(self) -> int:
        return self.current

    def ipcOpenMemHandle(self, handle: bytes) -> int:
        self.calls.append(("open", self.current))
        return 0x7000

    def ipcCloseMemHandle(self, ptr: int) -> None:
        self.calls.append(("close", self.current))

    def deviceSynchronize(self) -> None:
        self.calls.append(("synchronize", self.current))
        if self.fail_sync:
            raise RuntimeError("cudaErrorIllegalAddress: an illegal memory access")

    def array(self, data: np.ndarray, device: int = 0) -> DeviceArray:
        return DeviceArray(data, device, self.calls)

    def from_dlpack(self, value: Any) -> DeviceArray:
        raise AssertionError("every device array in these tests is already a DeviceArray")
