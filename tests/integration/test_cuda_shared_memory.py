"""CUDA shared memory through the same interface as the POSIX path (needs cupy and a GPU).

Device memory the client allocates and exports with CUDA IPC (shm.cuda.CudaBuffer) is
registered, an input read from it and an output written into it; the result views the
client's own device memory.  The client synchronises after writing its input, before it
sends the request.  Skipped, with the reason, where CUDA IPC cannot work.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from inferpool.client import ShmClient
from inferpool.shm import cuda
from tests.gpu.paths import SERVED_CUDA_SHM, path
from tests.gpu.support import needs_cuda_ipc
from tests.support import Server, identity_config, write_model

pytestmark = [needs_cuda_ipc, path(SERVED_CUDA_SHM)]


@pytest.fixture
def server(short_tmp: Path) -> Iterator[Server]:
    repo = short_tmp / "repo"
    write_model(repo, "identity", identity_config("identity"))
    with Server(short_tmp, repo) as srv:
        yield srv


def test_cuda_region_inputs_outputs_and_handles(server: Server) -> None:
    import cupy

    buffer = cuda.CudaBuffer(4096)
    try:
        buffer.array(0, 16).view(cupy.float32)[:] = cupy.arange(4, dtype=cupy.float32)
        buffer.synchronize()  # the server must read finished data
        with ShmClient(server.endpoint, input_bytes=0) as c:
            c.register_cuda_shared_memory("gpu", buffer)
            assert c.cuda_shared_memory_status() == [
                {"name": "gpu", "device_id": 0, "byte_size": 4096}
            ]
            req = c.request("identity", outputs=[])
            req.input_from("INPUT0", "gpu", [4], "FP32", 16)
            req.output_to("OUTPUT0", "gpu", 16, offset=1024)
            with c.run(req) as result:
                out = result["OUTPUT0"]  # the client's own device memory, no copy
                assert isinstance(out, cupy.ndarray) and out.data.ptr == buffer.ptr + 1024
                assert cupy.array_equal(out, cupy.arange(4, dtype=cupy.float32))
            handle = c.request("identity", outputs=["OUTPUT0"])
            handle.input_from("INPUT0", "gpu", [4], "FP32", 16)
            with c.run(handle) as result:  # a device input, answered in the host arena
                np.testing.assert_array_equal(result["OUTPUT0"], np.arange(4))
            assert c.unregister_cuda_shared_memory() == ["gpu"]
            assert c.lease_status()["registrations"] == 0
    finally:
        buffer.free()
