"""CUDA regions through Triton's frontends and pipelines: KServe HTTP and gRPC with a real
CUDA IPC handle, an ensemble and a BLS call whose tensors live in CUDA regions.

One server (module scope) with the KServe frontends on.  The HTTP client is the standard
library's (JSON, as any KServe caller writes it); gRPC is Triton's own client.  Needs a GPU,
torch with CUDA and cupy (``scripts/check_gpu.sh``); skipped otherwise.
"""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferpool.client import ShmClient
from tests.gpu import paths
from tests.gpu.paths import path
from tests.gpu.support import device_buffer, needs_cuda_ipc, read, write
from tests.support import Server, identity_config, serving, write_model

pytestmark = needs_cuda_ipc
X = np.arange(16, dtype=np.int32) - 5

BLS = """
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            t = pb_utils.get_input_tensor_by_name(request, "IN")
            given = pb_utils.Tensor("INPUT0", t.as_numpy()) if t.is_cpu() else (
                pb_utils.Tensor.from_dlpack("INPUT0", torch.from_dlpack(t)))
            reply = pb_utils.InferenceRequest(
                model_name="identity", inputs=[given], requested_output_names=["OUTPUT0"]
            ).exec()
            if reply.has_error():
                raise pb_utils.TritonModelException(reply.error().message())
            echoed = pb_utils.get_output_tensor_by_name(reply, "OUTPUT0").as_numpy()
            out = pb_utils.Tensor("OUT", echoed * 2)
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""


def bls_config(name: str, gpu_inputs: bool) -> str:
    force = 'parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: { string_value: "no" } }'
    return f"""
        name: "{name}"
        backend: "python"
        input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }} ]
        output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] }} ]
        {force if gpu_inputs else ""}
    """


def build(repo: Path) -> Path:
    for name in ("identity", "identity_a", "identity_b"):
        write_model(repo, name, identity_config(name, "TYPE_INT32"))
    write_model(
        repo,
        "chain",
        """
        name: "chain"
        platform: "ensemble"
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
        ensemble_scheduling { step [
          { model_name: "identity_a" model_version: -1
            input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "MID" } },
          { model_name: "identity_b" model_version: -1
            input_map { key: "INPUT0" value: "MID" } output_map { key: "OUTPUT0" value: "OUT" } }
        ] }
        """,
    )
    for name, gpu_inputs in (("bls_cpu_inputs", False), ("bls_gpu_inputs", True)):
        write_model(repo, name, bls_config(name, gpu_inputs), files={"1/model.py": BLS})
    return repo


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from serving(lambda tmp: build(tmp / "repo"), kserve=True)


def windows(offset_out: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The shared-memory parameters of an input at 0 and an output at ``offset_out``."""
    given = {"shared_memory_region": "gpu", "shared_memory_byte_size": X.nbytes}
    wanted = {
        "shared_memory_region": "gpu",
        "shared_memory_offset": offset_out,
        "shared_memory_byte_size": X.nbytes,
    }
    return given, wanted


# ---------------------------------------------------------------------------- KServe
def http(server: Server, route: str, body: dict[str, Any] | None = None) -> Any:
    """One KServe HTTP call (POST with a JSON body, GET without); its JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.http_port}{route}",
        data=data,
        headers={"Content-Type": "application/json"},
        method="GET" if body is None else "POST",
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        text = response.read()
    return json.loads(text) if text else None


@path(paths.KSERVE_HTTP)
def test_kserve_http_with_a_cuda_ipc_handle(server: Server) -> None:
    with device_buffer(4096) as buffer:
        write(buffer, X)
        raw = {"b64": base64.b64encode(buffer.handle).decode()}
        body = {"raw_handle": raw, "device_id": buffer.device_id, "byte_size": buffer.nbytes}
        http(server, "/v2/cudasharedmemory/region/gpu/register", body)
        assert http(server, "/v2/cudasharedmemory/status") == [
            {"name": "gpu", "device_id": buffer.device_id, "byte_size": buffer.nbytes}
        ]
        given, wanted = windows(2048)
        answer = http(
            server,
            "/v2/models/identity/infer",
            {
                "inputs": [
                    {"name": "INPUT0", "datatype": "INT32", "shape": [X.size], "parameters": given}
                ],
                "outputs": [{"name": "OUTPUT0", "parameters": wanted}],
            },
        )
        [out] = answer["outputs"]
        assert out["parameters"]["shared_memory_byte_size"] == X.nbytes and "data" not in out
        np.testing.assert_array_equal(read(buffer, np.int32, X.size, 2048), X)
        http(server, "/v2/cudasharedmemory/region/gpu/unregister", {})
        assert http(server, "/v2/cudasharedmemory/status") == []


@path(paths.KSERVE_GRPC)
def test_kserve_grpc_with_a_cuda_ipc_handle(server: Server) -> None:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        with device_buffer(4096) as buffer:
            write(buffer, X)
            raw = base64.b64encode(buffer.handle)  # as cuda_shared_memory.get_raw_handle
            client.register_cuda_shared_memory("gpu", raw, buffer.device_id, buffer.nbytes)
            regions = client.get_cuda_shared_memory_status().regions
            assert regions["gpu"].byte_size == buffer.nbytes
            given = grpcclient.InferInput("INPUT0", [X.size], "INT32")
            given.set_shared_memory("gpu", X.nbytes)
            wanted = grpcclient.InferRequestedOutput("OUTPUT0")
            wanted.set_shared_memory("gpu", X.nbytes, offset=3072)
            client.infer("identity", [given], outputs=[wanted])
            np.testing.assert_array_equal(read(buffer, np.int32, X.size, 3072), X)
            client.unregister_cuda_shared_memory("gpu")
            assert not client.get_cuda_shared_memory_status().regions
    finally:
        client.close()


# ---------------------------------------------------------------------------- pipelines
def run_in_region(server: Server, model: str) -> np.ndarray:
    """``model``'s OUT for IN = X, both in a client's CUDA region."""
    with device_buffer(4096) as buffer, ShmClient(server.endpoint, input_bytes=0) as c:
        write(buffer, X)
        c.register_cuda_shared_memory("gpu", buffer)
        req = c.request(model, outputs=[])
        req.input_from("IN", "gpu", [X.size], "INT32", X.nbytes)
        req.output_to("OUT", "gpu", X.nbytes, offset=2048)
        with c.run(req):
            got = read(buffer, np.int32, X.size, 2048)
        assert c.unregister_cuda_shared_memory() == ["gpu"]  # every step's worker closed it
    return got


@path(paths.ENSEMBLE_CUDA)
def test_an_ensemble_reads_and_writes_cuda_regions(server: Server) -> None:
    """Its first step reads the client's region, its last writes the answer there."""
    np.testing.assert_array_equal(run_in_region(server, "chain"), X)


@path(paths.BLS_CUDA)
@pytest.mark.parametrize("model", ["bls_cpu_inputs", "bls_gpu_inputs"])
def test_a_bls_call_with_tensors_in_cuda_regions(server: Server, model: str) -> None:
    """The model's input comes from the client's region (on the CPU by default, on the GPU
    with FORCE_CPU_ONLY_INPUT_TENSORS "no"), goes on to identity in a BLS call, and twice
    the answer is written into the client's region."""
    np.testing.assert_array_equal(run_in_region(server, model), X * 2)
