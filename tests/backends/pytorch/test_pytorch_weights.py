"""ENABLE_WEIGHT_SHARING: one copy of the weights in shared memory for every CPU instance."""

from __future__ import annotations

import logging
import os
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch
import torch_models as tm

from inferpool.backends.pytorch.weights import _HEADER, region_key
from inferpool.shm.region import Region
from inferpool.shm.runs import region_name, regions_of_run
from inferpool.wire.errors import Code, InferpoolError
from scripts.bench_torch import measure_instances

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")

SHARED = tm.config(
    [tm.inp("INPUT__0", "TYPE_FP32", [4])],
    [tm.out("OUTPUT__0", "TYPE_FP32", [2])],
    max_batch_size=8,
    extra='parameters { key: "ENABLE_WEIGHT_SHARING" value: { string_value: "true" } }',
)


def weight_addresses(harness) -> list[int]:
    module = harness.host.instance.artifact.module
    return [t.data_ptr() for t in module.state_dict().values()]


def region_span(harness) -> tuple[int, int]:
    """(address, size) of the instance's own mapping of its weights region."""
    region = harness.host.instance.weights.region
    return np.frombuffer(region.buf, np.uint8).__array_interface__["data"][0], region.size


def test_instances_share_one_region_and_the_last_one_removes_it(run_id, repo, harness, caplog):
    caplog.set_level(logging.INFO)
    path = tm.save(tm.Linear(), repo)
    first, second = harness(SHARED), harness(SHARED)
    name = region_name(run_id, f"weights-{region_key(str(path), 'cpu')}")
    assert regions_of_run(run_id) == sorted([name, name + ".lock", region_name(run_id, "lock")])
    assert os.stat(f"/dev/shm/{name}").st_mode & 0o777 == 0o600
    assert "created shared weights region" in caplog.text
    assert "attached to shared weights region" in caplog.text
    bias = [h.host.instance.artifact.module.state_dict()["linear.bias"] for h in (first, second)]
    with torch.inference_mode():
        bias[0].add_(1.0)  # both instances map the very same pages...
        assert torch.equal(bias[1], bias[0])
        bias[0].sub_(1.0)
    x = np.random.default_rng(0).random((3, 4), dtype=np.float32)
    expected = tm.Linear()(torch.from_numpy(x)).detach().numpy()
    for h in (first, second):
        np.testing.assert_allclose(h.infer({"INPUT__0": x})["OUTPUT__0"], expected, rtol=1e-6)
    first.close()
    assert name in regions_of_run(run_id)  # ...which stay while an instance uses them
    np.testing.assert_allclose(second.infer({"INPUT__0": x})["OUTPUT__0"], expected, rtol=1e-6)
    second.close()
    assert regions_of_run(run_id) == [region_name(run_id, "lock")]


def test_weights_live_in_the_region(run_id, repo, harness):
    tm.save(tm.Linear(64, 64), repo)
    h = harness(SHARED.replace("dims: [4]", "dims: [64]").replace("dims: [2]", "dims: [64]"))
    base, size = region_span(h)
    assert all(base <= p < base + size for p in weight_addresses(h))


def test_a_half_built_region_is_rebuilt(run_id, repo, harness):
    path = tm.save(tm.Linear(), repo)
    name = region_name(run_id, f"weights-{region_key(str(path), 'cpu')}")
    stale = Region.create(name, 4096)  # as a creator that died before marking it ready
    stale.close()
    h = harness(SHARED)
    region = Region.attach(name)
    try:
        assert _HEADER.unpack_from(region.buf, 0)[1] == 1
    finally:
        region.close()
    assert h.infer({"INPUT__0": np.ones((1, 4), np.float32)})["OUTPUT__0"].shape == (1, 2)


def test_without_a_run_id_each_instance_keeps_its_weights(repo, harness, caplog, monkeypatch):
    monkeypatch.delenv("INFERPOOL_RUN_ID", raising=False)
    tm.save(tm.Linear(), repo)
    harness(SHARED)
    assert "no run id (backend config 'run_id' or $INFERPOOL_RUN_ID)" in caplog.text


def test_a_malformed_run_id_fails_the_load(repo, harness, monkeypatch):
    monkeypatch.setenv("INFERPOOL_RUN_ID", "not-a-run")
    tm.save(tm.Linear(), repo)
    with pytest.raises(InferpoolError) as info:
        harness(SHARED)
    assert info.value.code is Code.INVALID_ARG
    assert "run id 'not-a-run' is not a broker run id (10 hexadecimal digits)" in info.value.message


def test_processes_sharing_weights_hold_one_copy(run_id, tmp_path: Path):
    """PSS of N real worker-like processes, with and without sharing (spawned, real shm)."""
    n_in, n_out, instances = 1024, 8192, 3  # 32 MiB of weights
    weights = n_in * n_out * 4
    torch.manual_seed(0)
    tm.save(torch.nn.Linear(n_in, n_out, bias=False), tmp_path)
    private = measure_instances(tmp_path, n_in, instances, share=False, run_id=run_id)
    shared = measure_instances(tmp_path, n_in, instances, share=True, run_id=run_id)
    saved = sum(m.pss for m in private) - sum(m.pss for m in shared)
    # Ideally (instances - 1) copies are saved; allow for allocator and page-table noise.
    assert saved > 0.75 * (instances - 1) * weights, f"PSS saved: {saved / 2**20:.1f} MiB"
    uss_drop = statistics.fmean(m.uss for m in private) - statistics.fmean(m.uss for m in shared)
    assert uss_drop > 0.75 * weights  # no instance keeps a private copy


def test_a_failed_load_gives_the_region_back(run_id, repo, harness):
    tm.save(tm.Linear(), repo)
    two_inputs = SHARED.replace(
        "input {", 'input { name: "INPUT__1" data_type: TYPE_FP32 dims: [4] }\ninput {'
    )
    with pytest.raises(InferpoolError) as info:
        harness(two_inputs)
    assert "configuration expects 2 inputs, model provides 1" in info.value.message
    assert regions_of_run(run_id) == [region_name(run_id, "lock")]
