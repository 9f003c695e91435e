"""Tensors in CUDA regions through a real server: batches, slow kernels, BYTES and BF16.

One server (module scope).  Each test writes its inputs into a client's CUDA buffer (and
synchronises, as a client must), asks for outputs there too, and compares the bytes the
server wrote with the expected ones as soon as the answer is in: a worker that answered
before the GPU finished writing shows as wrong bytes.  Needs a GPU, torch with CUDA and
cupy (``scripts/check_gpu.sh``); skipped otherwise, with the reason.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from inferpool.client import AsyncShmClient
from inferpool.wire import codec
from tests.backends.pytorch import torch_models as tm
from tests.gpu import paths
from tests.gpu.paths import path
from tests.gpu.support import (
    cuda_client,
    device_buffer,
    needs_cuda_ipc,
    needs_torch_cuda,
    read,
    write,
)
from tests.support import Server, identity_config, serving, write_model

pytestmark = [
    needs_torch_cuda,
    needs_cuda_ipc,
    pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning"),
]
ROUNDS = 5
SLEEP_CYCLES = 1 << 27  # torch.cuda._sleep: some 70 ms of one GPU thread spinning


class SlowTriple(nn.Module):
    """3x + 1, written only after a chain of large matrix products on the input's device."""

    def forward(self, x: Tensor) -> Tensor:
        w = torch.full((4096, 4096), 1.0 / 4096, device=x.device)
        acc = w
        for _ in range(24):
            acc = acc @ w  # stays 1/4096 everywhere
        return x * 3 + 1 + acc[0, 0] * 0


class Double(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x * 2


SLOW_PYTHON = f"""
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = torch.from_dlpack(pb_utils.get_input_tensor_by_name(request, "IN"))
            torch.cuda._sleep({SLEEP_CYCLES})  # the output is computed only after this
            out = pb_utils.Tensor.from_dlpack("OUT", x * 3 + 1)
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""


def build(repo: Path) -> Path:
    fp32 = ([tm.inp("INPUT__0", "TYPE_FP32", [4])], [tm.out("OUTPUT__0", "TYPE_FP32", [2])])
    batching = (
        "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 10000000 }"
    )
    for name, kind in (("batched_gpu", "KIND_GPU gpus: [ 0 ]"), ("batched_cpu", "KIND_CPU")):
        extra = f"instance_group [ {{ kind: {kind} }} ] {batching}"
        config = tm.config(*fp32, max_batch_size=8, extra=extra)
        tm.save(tm.Linear(), write_model(repo, name, config))
    gpu = "instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]"
    vector = ([tm.inp("INPUT__0", "TYPE_FP32", [-1])], [tm.out("OUTPUT__0", "TYPE_FP32", [-1])])
    tm.save(SlowTriple(), write_model(repo, "slow_pytorch", tm.config(*vector, extra=gpu)))
    bf16 = ([tm.inp("INPUT__0", "TYPE_BF16", [-1])], [tm.out("OUTPUT__0", "TYPE_BF16", [-1])])
    tm.save(Double(), write_model(repo, "double_bf16", tm.config(*bf16, extra=gpu)))
    write_model(repo, "identity_bf16", identity_config("identity_bf16", "TYPE_BF16"))
    write_model(repo, "identity_bytes", identity_config("identity_bytes", "TYPE_STRING"))
    write_model(
        repo,
        "slow_python",
        f"""
        name: "slow_python"
        backend: "python"
        input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        parameters {{ key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: {{ string_value: "no" }} }}
        {gpu}
        """,
        files={"1/model.py": SLOW_PYTHON},
    )
    return repo


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from serving(lambda tmp: build(tmp / "repo"))


def linear(x: np.ndarray) -> np.ndarray:
    return tm.Linear()(torch.from_numpy(x)).detach().numpy()


def batch_sizes(server: Server, model: str) -> list[int]:
    with server.client() as c:
        stats = c.statistics(model)["model_stats"][0]
    return [b["batch_size"] for b in stats["batch_stats"]]


# ---------------------------------------------------------------------------- batches
@path(paths.DYNAMIC_BATCH)
@pytest.mark.parametrize("model", ["batched_gpu", "batched_cpu"])
def test_a_dynamic_batch_of_cuda_inputs(server: Server, model: str) -> None:
    """Four requests, each with its input and output at its own place of one CUDA buffer,
    run as one batch: on the GPU instance's device, or gathered on the CPU."""
    rng = np.random.default_rng(4)
    xs = [rng.random((1, 4), dtype=np.float32) for _ in range(4)]

    async def main() -> list[np.ndarray]:
        with device_buffer(4096) as buffer:
            for i, x in enumerate(xs):
                write(buffer, x, offset=64 * i)
            async with AsyncShmClient(server.endpoint, input_bytes=0) as c:
                await c.register_cuda_shared_memory("gpu", buffer)
                requests = []
                for i in range(len(xs)):
                    req = c.request(model, outputs=[])
                    req.input_from("INPUT__0", "gpu", [1, 4], "FP32", 16, offset=64 * i)
                    req.output_to("OUTPUT__0", "gpu", 8, offset=2048 + 64 * i)
                    requests.append(req)
                results = await asyncio.gather(*(c.run(r) for r in requests))
                outputs = [read(buffer, np.float32, 2, 2048 + 64 * i) for i in range(len(xs))]
                for result in results:
                    result.release()
                assert await c.unregister_cuda_shared_memory() == ["gpu"]
        return outputs

    outputs = asyncio.run(main())
    for x, out in zip(xs, outputs, strict=True):
        np.testing.assert_allclose(out, linear(x)[0], rtol=1e-5, atol=1e-6)
    assert 4 in batch_sizes(server, model)  # the preferred size: one batch of the four


# ---------------------------------------------------------------------------- synchronisation
@path(paths.SLOW_KERNEL)
@pytest.mark.parametrize(
    ("model", "name_in", "name_out"),
    [
        ("slow_python", "IN", "OUT"),  # torch.cuda._sleep, then the output
        ("slow_pytorch", "INPUT__0", "OUTPUT__0"),  # a chain of matrix products, then the output
    ],
)
def test_outputs_are_in_place_when_the_answer_comes(
    server: Server, model: str, name_in: str, name_out: str
) -> None:
    """The output is computed after a slow kernel and written into the client's CUDA region;
    the worker waits for the GPU before it answers, so the bytes are there when the answer
    is, round after round (each round's input differs, its window is zeroed first)."""
    count = 1024
    with cuda_client(server, 4 * count * 2) as (c, buffer):
        for round_ in range(ROUNDS):
            x = np.arange(count, dtype=np.float32) + 1000 * round_
            write(buffer, x)
            write(buffer, np.zeros(count, np.float32), offset=4 * count)
            req = c.request(model, outputs=[])
            req.input_from(name_in, "gpu", [count], "FP32", 4 * count)
            req.output_to(name_out, "gpu", 4 * count, offset=4 * count)
            with c.run(req):
                got = read(buffer, np.float32, count, offset=4 * count)  # at once
            np.testing.assert_array_equal(got, x * 3 + 1, err_msg=f"round {round_}")


# ---------------------------------------------------------------------------- datatypes
@path(paths.BYTES_CUDA)
def test_bytes_in_cuda_regions(server: Server) -> None:
    """A BYTES input read from a CUDA region and the output written into it, serialized
    as on the wire; the client gets the output back as strings."""
    words = np.array([b"alpha", b"", "\u00fcber".encode(), b"\x00\xff"], dtype=object)
    payload = codec.serialize_bytes(words)
    with cuda_client(server, 4096) as (c, buffer):
        write(buffer, payload)
        req = c.request("identity_bytes", outputs=[])
        req.input_from("INPUT0", "gpu", [len(words)], "BYTES", len(payload))
        req.output_to("OUTPUT0", "gpu", 2048, offset=2048)
        with c.run(req) as result:
            assert result["OUTPUT0"].tolist() == words.tolist()
        assert read(buffer, np.uint8, len(payload), offset=2048).tobytes() == payload
        handle = c.request("identity_bytes", outputs=["OUTPUT0"])
        handle.input_from("INPUT0", "gpu", [len(words)], "BYTES", len(payload))
        with c.run(handle) as result:  # the same input, answered in the host arena
            assert result["OUTPUT0"].tolist() == words.tolist()


@path(paths.BF16_CUDA)
@pytest.mark.parametrize("model", ["double_bf16", "identity_bf16"])
def test_bf16_in_cuda_regions(server: Server, model: str) -> None:
    """BF16 inputs and outputs in a CUDA region, through the pytorch backend on the GPU and
    through identity's device copy; compared bit for bit."""
    import ml_dtypes

    x = np.array([0.5, -1.25, 3.0, 1e-3, 65280.0, -0.0], dtype=ml_dtypes.bfloat16)
    factor = 2 if model == "double_bf16" else 1
    want = (x.astype(np.float32) * factor).astype(ml_dtypes.bfloat16).view(np.uint16)
    with cuda_client(server, 4096) as (c, buffer):
        write(buffer, x)
        req = c.request(model, outputs=[])
        req.input_from("INPUT__0" if factor == 2 else "INPUT0", "gpu", [x.size], "BF16", x.nbytes)
        out = "OUTPUT__0" if factor == 2 else "OUTPUT0"
        req.output_to(out, "gpu", x.nbytes, offset=2048)
        with c.run(req):
            got = read(buffer, np.uint16, x.size, offset=2048)
        np.testing.assert_array_equal(got, want)
        handle = c.request(model, outputs=[out])
        handle.input_from(
            "INPUT__0" if factor == 2 else "INPUT0", "gpu", [x.size], "BF16", x.nbytes
        )
        with c.run(handle) as result:  # answered in the host arena
            np.testing.assert_array_equal(np.asarray(result[out]).view(np.uint16), want)
