"""The onnxruntime backend on KIND_GPU: ONNX Runtime's CUDA execution provider, IO binding.

One server (module scope) serves Triton's ``simple`` shape (OUTPUT0 = INPUT0 + INPUT1,
OUTPUT1 = INPUT0 - INPUT1) on the last GPU: with fixed dims (outputs bound in place), with
variable dims (outputs ONNX Runtime allocates on the device, then copied out) and with a
dynamic batcher that forms batches of 4.  Answers are compared to ONNX Runtime called here
on the CPU.  Skipped without a GPU, and where this onnxruntime has no CUDA execution provider
(``onnxruntime-gpu`` brings it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferpool.client import AsyncShmClient
from tests.gpu import paths
from tests.gpu.paths import path
from tests.gpu.support import (
    GPUS,
    LAST_GPU,
    cuda_client,
    device_buffer,
    needs_cuda_ipc,
    needs_torch_cuda,
    read,
    write,
)
from tests.support import Server, serving


def _cuda_provider_reason() -> str | None:
    try:
        import onnx  # noqa: F401  (builds the models)
        import onnxruntime
    except ImportError as exc:
        return f"{exc.name} is not installed (pip install 'inferpool[onnx]')"
    providers = onnxruntime.get_available_providers()
    if "CUDAExecutionProvider" in providers:
        return None
    return (
        f"onnxruntime {onnxruntime.__version__} has no CUDA execution provider (it has "
        f"{', '.join(providers)}): install onnxruntime-gpu in place of onnxruntime"
    )


CUDA_PROVIDER_REASON = _cuda_provider_reason()
pytestmark = [
    needs_torch_cuda,
    pytest.mark.skipif(CUDA_PROVIDER_REASON is not None, reason=CUDA_PROVIDER_REASON or ""),
]
GPU = f"instance_group [ {{ kind: KIND_GPU gpus: [ {LAST_GPU} ] }} ]"
BATCHING = "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 10000000 }"
DIMS = 16


def build(repo: Path) -> Path:
    from tests.backends.model_formats.onnx_models import add_sub, add_sub_config, save

    save(add_sub(np.float32, DIMS), repo / "fixed", add_sub_config("fixed", extra=GPU))
    any_dims = add_sub_config("any", dims=-1, extra=GPU)
    save(add_sub(np.float32, "n"), repo / "any", any_dims)
    batched = add_sub_config("batched", extra=f"{GPU} {BATCHING}")
    save(add_sub(np.float32, DIMS), repo / "batched", batched)
    return repo


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from serving(lambda tmp: build(tmp / "repo"))


def on_cpu(server: Server, model: str, a: np.ndarray, b: np.ndarray) -> list[Any]:
    """ONNX Runtime's own answer, on the CPU, from the file the server serves."""
    import onnxruntime

    path = Path(server.ipc.removeprefix("ipc://")).parent / "repo" / model / "1" / "model.onnx"
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return list(session.run(["OUTPUT0", "OUTPUT1"], {"INPUT0": a, "INPUT1": b}))


def pair(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.random((rows, DIMS), dtype=np.float32), rng.random((rows, DIMS), dtype=np.float32)


@path(paths.ONNX_CUDA)
@pytest.mark.parametrize("model", ["fixed", "any"])
def test_kind_gpu_runs_on_the_cuda_execution_provider(server: Server, model: str) -> None:
    """Host inputs in, host outputs out: bound in place (fixed dims) or allocated by ONNX
    Runtime on the device and copied out (variable dims); the worker sees only its GPU and
    its session runs on the CUDA provider."""
    a, b = pair(3)
    with server.client() as c:
        out = c.infer(model, {"INPUT0": a, "INPUT1": b})
        [status] = [r for r in c.status() if r["model"] == model]
    want = on_cpu(server, model, a, b)
    np.testing.assert_allclose(out["OUTPUT0"], want[0], rtol=1e-6)
    np.testing.assert_allclose(out["OUTPUT1"], want[1], rtol=1e-6)
    assert status["placement"]["cuda_visible_devices"] == GPUS[LAST_GPU]
    assert f"instance '{model}_0_0' runs on CUDAExecutionProvider" in server.log()


@path(paths.ONNX_CUDA_REGIONS)
@needs_cuda_ipc
def test_inputs_and_outputs_in_a_cuda_region_are_bound_in_place(server: Server) -> None:
    """Both inputs read where the client wrote them on the GPU, OUTPUT0 written by ONNX
    Runtime into the client's CUDA region, OUTPUT1 into the host arena."""
    import cupy

    a, b = pair(2, seed=1)
    with cuda_client(server, 4096) as (c, buffer):
        write(buffer, a)
        write(buffer, b, offset=1024)
        req = c.request("fixed", outputs=["OUTPUT1"])
        req.input_from("INPUT0", "gpu", [2, DIMS], "FP32", a.nbytes)
        req.input_from("INPUT1", "gpu", [2, DIMS], "FP32", b.nbytes, offset=1024)
        req.output_to("OUTPUT0", "gpu", a.nbytes, offset=2048)
        with c.run(req) as result:
            out0, out1 = result["OUTPUT0"], result["OUTPUT1"]
            assert isinstance(out0, cupy.ndarray) and out0.data.ptr == buffer.ptr + 2048
            np.testing.assert_allclose(cupy.asnumpy(out0), a + b, rtol=1e-6)
            assert isinstance(out1, np.ndarray)
            np.testing.assert_allclose(out1, a - b, rtol=1e-6)


@path(paths.ONNX_CUDA_BATCH)
@needs_cuda_ipc
def test_a_dynamic_batch_of_cuda_inputs_runs_on_the_device(server: Server) -> None:
    """Four requests, inputs and outputs each at their own place of one CUDA buffer, run as
    one batch: joined on the device, split back into each client's region."""
    inputs = [pair(1, seed=i) for i in range(4)]
    step = 4 * DIMS  # bytes of one row

    async def main() -> list[tuple[np.ndarray, np.ndarray]]:
        with device_buffer(1 << 16) as buffer:
            for i, (a, b) in enumerate(inputs):
                write(buffer, a, offset=256 * i)
                write(buffer, b, offset=256 * i + 128)
            async with AsyncShmClient(server.endpoint, input_bytes=0) as c:
                await c.register_cuda_shared_memory("gpu", buffer)
                requests = []
                for i in range(len(inputs)):
                    req = c.request("batched", outputs=[])
                    req.input_from("INPUT0", "gpu", [1, DIMS], "FP32", step, offset=256 * i)
                    req.input_from("INPUT1", "gpu", [1, DIMS], "FP32", step, offset=256 * i + 128)
                    req.output_to("OUTPUT0", "gpu", step, offset=8192 + 256 * i)
                    req.output_to("OUTPUT1", "gpu", step, offset=8192 + 256 * i + 128)
                    requests.append(req)
                results = await asyncio.gather(*(c.run(r) for r in requests))
                outputs = [
                    (
                        read(buffer, np.float32, DIMS, 8192 + 256 * i),
                        read(buffer, np.float32, DIMS, 8192 + 256 * i + 128),
                    )
                    for i in range(len(inputs))
                ]
                for result in results:
                    result.release()
                assert await c.unregister_cuda_shared_memory() == ["gpu"]
        return outputs

    outputs = asyncio.run(main())
    for (a, b), (plus, minus) in zip(inputs, outputs, strict=True):
        np.testing.assert_allclose(plus, (a + b)[0], rtol=1e-6)
        np.testing.assert_allclose(minus, (a - b)[0], rtol=1e-6)
    with server.client() as c:
        stats = c.statistics("batched")["model_stats"][0]
    assert [b["batch_size"] for b in stats["batch_stats"]] == [4]
