"""What the GPU tests share: why they skip, the GPUs this machine has, device buffers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from inferpool.broker.pool.topology import discover_gpus
from inferpool.client import ShmClient
from inferpool.shm import cuda
from tests.support import Server

IPC_REASON = cuda.unavailable_reason()
needs_cuda_ipc = pytest.mark.skipif(
    IPC_REASON is not None, reason=f"CUDA IPC unavailable: {IPC_REASON}"
)
needs_torch_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="torch.cuda.is_available() is false on this machine"
)
GPUS = discover_gpus()  # CUDA_VISIBLE_DEVICES tokens, as the broker places instances
LAST_GPU = max(len(GPUS) - 1, 0)


@contextlib.contextmanager
def device_buffer(nbytes: int, device: int = 0) -> Iterator[cuda.CudaBuffer]:
    buffer = cuda.CudaBuffer(nbytes, device)
    try:
        yield buffer
    finally:
        buffer.free()


@contextlib.contextmanager
def cuda_client(
    server: Server, nbytes: int, values: Any = None
) -> Iterator[tuple[ShmClient, cuda.CudaBuffer]]:
    """A client with a CUDA buffer registered as "gpu" (``values`` written at its start),
    unregistered (answered once no worker maps it) before the buffer is freed."""
    with device_buffer(nbytes) as buffer, ShmClient(server.endpoint, input_bytes=0) as c:
        if values is not None:
            write(buffer, values)
        c.register_cuda_shared_memory("gpu", buffer)
        yield c, buffer
        assert c.unregister_cuda_shared_memory() == ["gpu"]


def write(buffer: cuda.CudaBuffer, values: Any, offset: int = 0) -> None:
    """Write a numpy array (or serialized bytes) into the buffer, byte for byte, and wait
    for it, as a client must before sending."""
    raw = np.frombuffer(values, np.uint8) if isinstance(values, bytes) else _bytes_of(values)
    buffer.array(offset, raw.nbytes).set(raw)  # cupy: host -> device on the current stream
    buffer.synchronize()


def read(buffer: cuda.CudaBuffer, dtype: Any, count: int, offset: int = 0) -> np.ndarray:
    """``count`` elements of ``dtype`` at ``offset`` of the buffer, copied to the host."""
    nbytes = count * np.dtype(dtype).itemsize
    return buffer.array(offset, nbytes).get().view(dtype)


def _bytes_of(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values).reshape(-1).view(np.uint8)
