"""CUDA IPC between two processes, as a client and a worker share a region (needs a GPU).

The child opens the parent's buffer from its IPC handle with shm.cuda.CudaRegion, as a
worker does: once seeing every GPU, once narrowed to the last one (CUDA_VISIBLE_DEVICES),
as a GPU instance's worker is.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

from tests.gpu.paths import IPC_ACROSS_PROCESSES, IPC_NARROWED, path
from tests.gpu.support import GPUS, device_buffer, needs_cuda_ipc, write

pytestmark = needs_cuda_ipc

CHILD = """
import sys
import cupy
from inferpool.shm.cuda import CudaRegion, RegionTooLarge

handle, nbytes = bytes.fromhex(sys.argv[1]), int(sys.argv[2])
try:
    CudaRegion(handle, nbytes + (64 << 20))
except RegionTooLarge as exc:
    print("refused:", exc)
region = CudaRegion(handle, nbytes)
data = region.array(0, nbytes).view(cupy.float32)
print("device", region.device, "sum", float(data.sum()))
print(region.size)
data *= 2  # the parent reads this back
cupy.cuda.runtime.deviceSynchronize()
region.close()
"""


def share(env: dict[str, str]) -> None:
    values = np.arange(1 << 18, dtype=np.float32)  # 1 MiB
    with device_buffer(values.nbytes) as buffer:
        write(buffer, values)
        done = subprocess.run(
            [sys.executable, "-c", CHILD, buffer.handle.hex(), str(values.nbytes)],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0].startswith("refused: byte_size") and "exceeds the" in lines[0]
        assert lines[1] == f"device 0 sum {float(values.sum())}"  # its own device 0
        assert int(lines[2]) >= values.nbytes  # the allocation (may be rounded up)
        np.testing.assert_array_equal(buffer.array().view(np.float32).get(), values * 2)


@path(IPC_ACROSS_PROCESSES)
def test_a_buffer_is_shared_with_another_process() -> None:
    share({})


@path(IPC_NARROWED)
def test_a_worker_narrowed_to_the_last_gpu_opens_a_buffer_of_the_first() -> None:
    share({"CUDA_VISIBLE_DEVICES": GPUS[-1]})
