"""CUDA registrations through a real server: one allocation registered twice, an oversized
byte_size, an unregister while another worker is busy, the GPU a region is opened on, lanes.

One server (module scope) serving identity models and a python model that waits for a file.
Needs a GPU, torch with CUDA and cupy (``scripts/check_gpu.sh``); skipped otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from inferpool.client import ShmClient
from inferpool.wire.errors import Code, InferpoolError
from tests.gpu import paths
from tests.gpu.paths import path
from tests.gpu.support import GPUS, LAST_GPU, device_buffer, needs_cuda_ipc, read, write
from tests.support import Server, identity_config, serving, write_model

pytestmark = needs_cuda_ipc
X = np.arange(8, dtype=np.int32)

WAIT_FOR_FILE = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            path = pb_utils.get_input_tensor_by_name(request, "PATH").as_numpy()[0].decode()
            while not os.path.exists(path):
                time.sleep(0.01)
            done = pb_utils.Tensor("DONE", np.array([1], np.int32))
            responses.append(pb_utils.InferenceResponse([done]))
        return responses
"""


def build(repo: Path) -> Path:
    write_model(repo, "identity", identity_config("identity", "TYPE_INT32"))
    write_model(repo, "identity_far", identity_config("identity_far", "TYPE_INT32"))
    write_model(
        repo,
        "wait_for_file",
        """
        name: "wait_for_file"
        backend: "python"
        input [ { name: "PATH" data_type: TYPE_STRING dims: [ 1 ] } ]
        output [ { name: "DONE" data_type: TYPE_INT32 dims: [ 1 ] } ]
        """,
        files={"1/model.py": WAIT_FOR_FILE},
    )
    return repo


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from serving(lambda tmp: build(tmp / "repo"))


def echo(c: ShmClient, region: str, offset: int, model: str = "identity") -> None:
    """identity reads X from ``region`` and writes it back at ``offset`` there."""
    req = c.request(model, outputs=[])
    req.input_from("INPUT0", region, [X.size], "INT32", X.nbytes)
    req.output_to("OUTPUT0", region, X.nbytes, offset=offset)
    with c.run(req):
        pass


def instance(server: Server, model: str) -> dict:
    with server.client() as c:
        [row] = [r for r in c.status() if r["model"] == model]
    return row


# ---------------------------------------------------------------------------- registrations
@path(paths.DUPLICATE_REGISTRATION)
def test_one_allocation_registered_twice(server: Server) -> None:
    """Under two names by one client and once more by another client: one worker reads
    through all three (CUDA maps a handle once per process), and ending one registration
    leaves the others working."""
    with (
        device_buffer(4096) as buffer,
        ShmClient(server.endpoint, input_bytes=0) as c,
        ShmClient(server.endpoint, input_bytes=0) as other,
    ):
        write(buffer, X)
        c.register_cuda_shared_memory("a", buffer)
        c.register_cuda_shared_memory("b", buffer)
        other.register_cuda_shared_memory("a", buffer)
        for client, name, offset in ((c, "a", 1024), (c, "b", 2048), (other, "a", 3072)):
            echo(client, name, offset)
            np.testing.assert_array_equal(read(buffer, np.int32, X.size, offset), X)
        assert c.unregister_cuda_shared_memory("a") == ["a"]
        write(buffer, np.zeros(X.size, np.int32), offset=2048)
        echo(c, "b", 2048)  # still mapped for the other two
        np.testing.assert_array_equal(read(buffer, np.int32, X.size, 2048), X)
        assert c.unregister_cuda_shared_memory() == ["b"]
        echo(other, "a", 1024)
        assert other.unregister_cuda_shared_memory() == ["a"]
    assert instance(server, "identity")["restarts"] == 0


@path(paths.OVERSIZED_REGISTRATION)
def test_an_oversized_byte_size_fails_its_requests_and_nothing_else(server: Server) -> None:
    """A registration that claims 64 MiB more than its allocation: its requests are
    INVALID_ARG, the worker lives on, and a right-sized registration of the same
    allocation works."""
    with device_buffer(4096) as buffer, ShmClient(server.endpoint, input_bytes=0) as c:
        write(buffer, X)
        c.register_cuda_shared_memory("big", buffer, byte_size=buffer.nbytes + (64 << 20))
        with pytest.raises(InferpoolError) as info:
            echo(c, "big", 1024)
        assert info.value.code is Code.INVALID_ARG
        assert "invalid CUDA shared-memory registration: byte_size" in info.value.message
        assert "exceeds the" in info.value.message
        c.register_cuda_shared_memory("fits", buffer)
        echo(c, "fits", 1024)
        np.testing.assert_array_equal(read(buffer, np.int32, X.size, 1024), X)
        assert sorted(c.unregister_cuda_shared_memory()) == ["big", "fits"]
    assert instance(server, "identity")["restarts"] == 0


@path(paths.UNREGISTER_BUSY)
def test_an_unregister_does_not_wait_for_a_busy_worker(server: Server, short_tmp: Path) -> None:
    """A worker busy in a long execute never opened the region: the unregister is answered
    while it is still busy (before, it waited for that worker's word)."""
    flag = short_tmp / "go"
    done: list[np.ndarray] = []
    with server.client() as waiting:

        def wait() -> None:
            path_ = np.array([str(flag).encode()], dtype=object)
            done.append(waiting.infer("wait_for_file", {"PATH": path_})["DONE"])

        worker = threading.Thread(target=wait)
        with device_buffer(4096) as buffer, ShmClient(server.endpoint, input_bytes=0) as c:
            write(buffer, X)
            c.register_cuda_shared_memory("gpu", buffer)
            echo(c, "gpu", 1024)  # identity's worker has it mapped now
            worker.start()
            try:
                deadline = time.monotonic() + 60
                while not instance(server, "wait_for_file")["busy"]:
                    assert time.monotonic() < deadline, "wait_for_file never got its request"
                    time.sleep(0.02)
                c.timeout = 20  # the old behaviour: answered only once wait_for_file is done
                assert c.unregister_cuda_shared_memory() == ["gpu"]
                assert instance(server, "wait_for_file")["busy"] and not done
            finally:
                flag.touch()
                worker.join(60)
    assert [d.tolist() for d in done] == [[1]]


def compute_apps() -> dict[int, set[str]]:
    """The GPUs (by UUID) each process holds a CUDA context on, as nvidia-smi lists them."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {}
    query = [smi, "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"]
    out = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout
    apps: dict[int, set[str]] = {}
    for row in out.splitlines():
        pid, _, uuid = (part.strip() for part in row.partition(","))
        if pid.isdigit():
            apps.setdefault(int(pid), set()).add(uuid)
    return apps


@path(paths.REGION_DEVICE)
def test_a_worker_that_sees_every_gpu_opens_a_region_on_its_gpu(server: Server) -> None:
    """identity's worker is not narrowed to a GPU; once it has read a region on the last
    GPU, it holds a CUDA context on that GPU alone (no context on GPU 0 for it)."""
    if not GPUS[LAST_GPU].startswith("GPU-"):
        pytest.skip("needs CUDA_VISIBLE_DEVICES by UUID, as scripts/check_gpu.sh sets it")
    with device_buffer(4096, LAST_GPU) as buffer, ShmClient(server.endpoint, input_bytes=0) as c:
        write(buffer, X)
        c.register_cuda_shared_memory("far", buffer)  # device_id: the last GPU
        echo(c, "far", 1024, model="identity_far")
        np.testing.assert_array_equal(read(buffer, np.int32, X.size, 1024), X)
        apps = compute_apps()
        pid = instance(server, "identity_far")["pid"]
        assert c.unregister_cuda_shared_memory() == ["far"]
    if os.getpid() not in apps:
        pytest.skip("nvidia-smi lists no CUDA process of this machine's own (a container)")
    assert apps.get(pid) == {GPUS[LAST_GPU]}


# ---------------------------------------------------------------------------- lanes
@path(paths.LANE_CUDA)
def test_a_lane_client_with_cuda_inputs(server: Server) -> None:
    """A device array given as an input is copied into the lane's input region and runs
    on the lane; an input in a CUDA region (which a lane cannot read) takes the broker
    path; both answer right."""
    import cupy

    with (
        device_buffer(4096) as buffer,
        ShmClient(server.endpoint, input_bytes=1 << 20, lane=True) as c,
    ):
        write(buffer, X)
        c.register_cuda_shared_memory("gpu", buffer)
        req = c.request("identity", outputs=["OUTPUT0"])
        req.set_input("INPUT0", cupy.asarray(X))
        with c.run(req) as result:
            np.testing.assert_array_equal(result["OUTPUT0"], X)
        assert len(c.session.lanes) == 1  # it went over the model's lane
        region = c.request("identity", outputs=["OUTPUT0"])
        region.input_from("INPUT0", "gpu", [X.size], "INT32", X.nbytes)
        with c.run(region) as result:
            np.testing.assert_array_equal(result["OUTPUT0"], X)
        echo(c, "gpu", 1024)  # and an output into the region
        np.testing.assert_array_equal(read(buffer, np.int32, X.size, 1024), X)
        assert c.unregister_cuda_shared_memory() == ["gpu"]
