"""Instance kinds: KIND_CPU (elsewhere), KIND_MODEL, and KIND_GPU where CUDA exists."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch_models as tm

from inferpool.wire.errors import Code, InferpoolError

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")
needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="torch.cuda.is_available() is false on this machine"
)

CONFIG = tm.config(
    [tm.inp("INPUT__0", "TYPE_FP32", [4])],
    [tm.out("OUTPUT__0", "TYPE_FP32", [2])],
    max_batch_size=8,
)


def expected(x: np.ndarray) -> np.ndarray:
    return tm.Linear()(torch.from_numpy(x)).detach().numpy()  # type: ignore[no-any-return]


def instance(kind: str, device_id: int = 0) -> dict[str, object]:
    return {"name": "m_0_0", "kind": kind, "device_id": device_id}


def test_kind_model_runs_where_the_model_put_itself(repo, harness):
    tm.save(tm.Linear(), repo)
    h = harness(CONFIG, instance=instance("MODEL"))
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(h.infer({"INPUT__0": x})["OUTPUT__0"], expected(x), rtol=1e-6)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a CUDA-less machine")
def test_kind_gpu_without_cuda_is_unavailable(repo, harness):
    tm.save(tm.Linear(), repo)
    with pytest.raises(InferpoolError) as info:
        harness(CONFIG, instance=instance("GPU"))
    assert info.value.code is Code.UNAVAILABLE
    assert (
        "instance 'm_0_0' is KIND_GPU on device 0, but torch sees 0 CUDA device(s) "
        "(torch.cuda.is_available() is False)"
    ) in info.value.message


@needs_cuda
@pytest.mark.parametrize("cache_cleaning", ["false", "true"])
def test_kind_gpu_loads_on_its_device_and_times_with_events(repo, harness, cache_cleaning):
    tm.save(tm.Linear(), repo)
    config = CONFIG + (
        '\nparameters { key: "ENABLE_CACHE_CLEANING" '
        f'value: {{ string_value: "{cache_cleaning}" }} }}'
    )
    device_id = torch.cuda.device_count() - 1
    h = harness(config, instance=instance("GPU", device_id))
    module = h.host.instance.artifact.module
    assert {p.device for p in module.parameters()} == {torch.device("cuda", device_id)}
    x = np.random.default_rng(0).random((3, 4), dtype=np.float32)
    requests = [h.request({"INPUT__0": x[:1]}), h.request({"INPUT__0": x[1:]})]
    results = [h.outputs_of(r)["OUTPUT__0"] for _, r, _ in h.execute(requests)]
    np.testing.assert_allclose(np.concatenate(results), expected(x), rtol=1e-5, atol=1e-6)
    stamps = h.host.timing_of(requests[0]).stamps
    assert stamps.exec_start <= stamps.compute_start <= stamps.compute_end


@needs_cuda
def test_kind_model_with_cuda_uses_a_stream_per_device(repo, harness):
    tm.save(tm.Linear().cuda(), repo)
    h = harness(CONFIG, instance=instance("MODEL"))
    assert len(h.host.instance.placement.streams) == torch.cuda.device_count()
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(
        h.infer({"INPUT__0": x})["OUTPUT__0"], expected(x), rtol=1e-5, atol=1e-6
    )
