"""GPU paths through a real server: narrowed GPU workers, CUDA regions, device copies.

One server (module scope) serves identity, pytorch KIND_GPU on the first and the last GPU,
KIND_CPU and KIND_MODEL, and python models; clients write inputs into CUDA buffers and
synchronise before sending, as docs/PROTOCOL.md asks.  Skipped where torch sees no GPU; the
tests that share device memory also need cupy (the ``gpu`` extra).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.backends.pytorch import torch_models as tm
from tests.gpu import paths
from tests.gpu.paths import path
from tests.gpu.support import GPUS, LAST_GPU, cuda_client, needs_cuda_ipc, needs_torch_cuda
from tests.support import Server, identity_config, write_model

pytestmark = [needs_torch_cuda, pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")]
BIG = 256 << 20


def linear(kind: str) -> str:
    return tm.config(
        [tm.inp("INPUT__0", "TYPE_FP32", [4])],
        [tm.out("OUTPUT__0", "TYPE_FP32", [2])],
        max_batch_size=8,
        extra=f"instance_group [ {{ {kind} }} ]",
    )


PYTHON_MODEL = """
import torch
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            t = pb_utils.get_input_tensor_by_name(r, "IN")
            if t.is_cpu():
                out = pb_utils.Tensor("OUT", t.as_numpy() * 2)
            else:  # stays on the GPU: a torch CUDA tensor out
                out = pb_utils.Tensor.from_dlpack("OUT", torch.from_dlpack(t) * 2)
            responses.append(pb_utils.InferenceResponse([out], parameters={"is_cpu": t.is_cpu()}))
        return responses
"""


def python_config(name: str, extra: str) -> str:
    return f"""
        name: "{name}"
        backend: "python"
        input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }} ]
        output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] }} ]
        {extra}
    """


def build(repo: Path) -> None:
    write_model(repo, "identity", identity_config("identity", "TYPE_INT32"))
    for name, kind in (
        ("linear_gpu0", "kind: KIND_GPU gpus: [ 0 ]"),
        ("linear_last", f"kind: KIND_GPU gpus: [ {LAST_GPU} ]"),
        ("linear_cpu", "kind: KIND_CPU"),
        ("linear_model", "kind: KIND_MODEL"),  # CPU weights
    ):
        tm.save(tm.Linear(), write_model(repo, name, linear(kind)))
    # KIND_MODEL with its weights on a GPU: it moves its inputs there itself
    follows = tm.FollowsItsWeights().to(f"cuda:{LAST_GPU}")
    tm.save(follows, write_model(repo, "follows_model", linear("kind: KIND_MODEL")))
    write_model(
        repo, "py_default", python_config("py_default", ""), files={"1/model.py": PYTHON_MODEL}
    )
    gpu_inputs = (
        'parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: { string_value: "no" } }\n'
        f"instance_group [ {{ kind: KIND_GPU gpus: [ {LAST_GPU} ] }} ]"
    )
    write_model(
        repo, "py_gpu", python_config("py_gpu", gpu_inputs), files={"1/model.py": PYTHON_MODEL}
    )


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    tmp = Path(tempfile.mkdtemp(prefix="ipt-", dir="/tmp"))  # ipc paths must stay short
    try:
        build(tmp / "repo")
        with Server(tmp, tmp / "repo", "--output-arena-size", "320M") as srv:
            yield srv
        assert srv.proc.returncode == 0, srv.log()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def expected(x: np.ndarray) -> np.ndarray:
    return tm.Linear()(torch.from_numpy(x)).detach().numpy()


def rows(n: int) -> np.ndarray:
    return np.random.default_rng(n).random((n, 4), dtype=np.float32)


# ---------------------------------------------------------------------------- pytorch
@pytest.mark.parametrize(
    ("model", "gpu"),
    [
        pytest.param("linear_gpu0", 0, marks=path(paths.PYTORCH_GPU_0)),
        pytest.param("linear_last", LAST_GPU, marks=path(paths.PYTORCH_LAST_GPU)),
    ],
)
def test_kind_gpu_runs_in_a_worker_that_sees_only_its_gpu(server: Server, model, gpu) -> None:
    x = rows(3)
    with server.client() as c:
        out = c.infer(model, {"INPUT__0": x})["OUTPUT__0"]
        [status] = [r for r in c.status() if r["model"] == model]
    np.testing.assert_allclose(out, expected(x), rtol=1e-5, atol=1e-6)
    assert status["placement"]["cuda_visible_devices"] == GPUS[gpu]


@path(paths.PYTORCH_CUDA_REGIONS)
@needs_cuda_ipc
def test_pytorch_reads_and_writes_cuda_regions(server: Server) -> None:
    import cupy

    x = rows(2)
    with cuda_client(server, 4096, x) as (c, buffer):
        req = c.request("linear_last", outputs=[])
        req.input_from("INPUT__0", "gpu", [2, 4], "FP32", x.nbytes)
        req.output_to("OUTPUT__0", "gpu", 16, offset=1024)
        with c.run(req) as result:
            out = result["OUTPUT__0"]
            assert isinstance(out, cupy.ndarray) and out.data.ptr == buffer.ptr + 1024
            np.testing.assert_allclose(cupy.asnumpy(out), expected(x), rtol=1e-5, atol=1e-6)


@path(paths.PYTORCH_CUDA_TO_CPU)
@needs_cuda_ipc
def test_cuda_inputs_reach_a_kind_cpu_instance(server: Server) -> None:
    """A single request: its input is copied to the CPU, where the weights are."""
    x = rows(4)
    with cuda_client(server, 4096, x) as (c, _):
        req = c.request("linear_cpu", outputs=["OUTPUT__0"])
        req.input_from("INPUT__0", "gpu", [4, 4], "FP32", x.nbytes)
        with c.run(req) as result:
            np.testing.assert_allclose(result["OUTPUT__0"], expected(x), rtol=1e-5, atol=1e-6)


@path(paths.PYTORCH_KIND_MODEL_SERVED)
@needs_cuda_ipc
@pytest.mark.parametrize("model", ["linear_model", "follows_model"])
def test_kind_model_gets_cuda_inputs_on_the_cpu(server: Server, model: str) -> None:
    """A KIND_MODEL instance gathers its inputs on the CPU wherever they lie: one with CPU
    weights runs on a single request whose input is in a CUDA region, one with GPU weights
    moves it there itself; its worker sees every GPU (it is not narrowed)."""
    x = rows(3)
    with cuda_client(server, 4096, x) as (c, _):
        req = c.request(model, outputs=["OUTPUT__0"])
        req.input_from("INPUT__0", "gpu", [3, 4], "FP32", x.nbytes)
        with c.run(req) as result:
            np.testing.assert_allclose(result["OUTPUT__0"], expected(x), rtol=1e-5, atol=1e-6)
    with server.client() as c:
        [status] = [r for r in c.status() if r["model"] == model]
    assert status["placement"]["cuda_visible_devices"] == os.environ.get("CUDA_VISIBLE_DEVICES")


# ---------------------------------------------------------------------------- identity, 256 MiB
@path(paths.IDENTITY_GPU_TO_GPU)
@needs_cuda_ipc
def test_identity_copies_256_mib_from_gpu_to_gpu(server: Server) -> None:
    import cupy

    count = BIG // 4
    with cuda_client(server, 2 * BIG) as (c, buffer):
        source = buffer.array(0, BIG).view(cupy.int32)
        source[:] = cupy.arange(count, dtype=cupy.int32)
        buffer.synchronize()
        req = c.request("identity", outputs=[])
        req.input_from("INPUT0", "gpu", [count], "INT32", BIG)
        req.output_to("OUTPUT0", "gpu", BIG, offset=BIG)
        with c.run(req) as result:
            out = result["OUTPUT0"]
            assert out.data.ptr == buffer.ptr + BIG
            assert bool(cupy.array_equal(out, source))


@path(paths.IDENTITY_GPU_TO_HOST)
@needs_cuda_ipc
def test_identity_copies_256_mib_from_gpu_to_host(server: Server) -> None:
    values = np.arange(BIG // 4, dtype=np.int32)
    with cuda_client(server, BIG, values) as (c, _):
        req = c.request("identity", outputs=["OUTPUT0"])
        req.input_from("INPUT0", "gpu", [values.size], "INT32", BIG)
        with c.run(req) as result:
            np.testing.assert_array_equal(result["OUTPUT0"], values)


# ---------------------------------------------------------------------------- python backend
@path(paths.PYTHON_GPU_INPUTS)
@needs_cuda_ipc
@pytest.mark.parametrize(("model", "on_cpu"), [("py_default", True), ("py_gpu", False)])
def test_python_models_get_cpu_inputs_unless_they_ask(server: Server, model, on_cpu) -> None:
    import cupy

    x = np.arange(4, dtype=np.int32)
    with cuda_client(server, 4096, x) as (c, _):
        req = c.request(model, outputs=[])
        req.input_from("IN", "gpu", [4], "INT32", 16)
        req.output_to("OUT", "gpu", 16, offset=1024)
        with c.run(req) as result:  # an output into the client's CUDA region
            assert result.parameters["is_cpu"] is on_cpu
            np.testing.assert_array_equal(cupy.asnumpy(result["OUT"]), x * 2)
        handle = c.request(model, outputs=["OUT"])
        handle.input_from("IN", "gpu", [4], "INT32", 16)
        with c.run(handle) as result:  # the same output into the host arena
            np.testing.assert_array_equal(result["OUT"], x * 2)


# ---------------------------------------------------------------------------- load limit
@path(paths.GPU_LOAD_LIMIT)
def test_the_gpu_load_limit_rejects_an_instance(short_tmp: Path) -> None:
    repo = short_tmp / "repo"
    tm.save(tm.Linear(), write_model(repo, "linear_gpu0", linear("kind: KIND_GPU gpus: [ 0 ]")))
    limit = ("--model-load-gpu-limit", "0:0.000001", "--exit-on-error=false")  # it must fail
    with Server(short_tmp, repo, *limit) as s, s.client() as c:
        [row] = c.models()
    assert row["state"] != "READY"
    assert "memory limit set for KIND_GPU 0 has exceeded" in row["reason"]
