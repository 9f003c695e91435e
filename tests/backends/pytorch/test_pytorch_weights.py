"""ENABLE_WEIGHT_SHARING: one copy of the weights in shared memory for every CPU instance.

The harnesses of a test share one ``LocalRegions`` (the broker's table of shared regions);
tests/integration/test_pytorch_weight_sharing.py measures the memory of real workers.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest
import torch
import torch_models as tm

from inferpool.backends.pytorch.weights import _DATA, _layout, region_key
from inferpool.shm.runs import region_name, regions_of_run
from inferpool.wire.errors import Code, InferpoolError

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


def key_of(path) -> str:
    return f"weights-{region_key(str(path), 'cpu')}"


def test_instances_share_one_region_and_the_last_one_removes_it(
    run_id, repo, regions, harness, caplog
):
    caplog.set_level(logging.INFO)
    path = tm.save(tm.Linear(), repo)
    first, second = harness(SHARED), harness(SHARED)
    name = regions.table.name_of(key_of(path))
    assert regions_of_run(run_id) == sorted([name, region_name(run_id, "lock")])
    assert os.stat(f"/dev/shm/{name}").st_mode & 0o777 == 0o600
    assert "filled shared weights region" in caplog.text
    assert "attached to shared weights region" in caplog.text
    assert first.host.instance.weights.created and not second.host.instance.weights.created
    # plain tensors, not inference ones: matmul would not fold a 3-D batch into one mm
    for h in (first, second):
        assert not any(
            t.is_inference() for t in h.host.instance.artifact.module.state_dict().values()
        )
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


def test_a_region_granted_but_never_filled_fails_the_load(run_id, repo, regions, harness):
    path = tm.save(tm.Linear(), repo)
    size = _DATA + _layout(torch.jit.load(str(path))).size
    regions.table.ask("another", key_of(path), size)  # as a filler that said "filled" early
    regions.table.filled("another", key_of(path), True)
    with pytest.raises(InferpoolError) as info:
        harness(SHARED)
    assert info.value.code is Code.INTERNAL
    assert "was granted but never filled" in info.value.message


def test_without_regions_each_instance_keeps_its_weights(repo, harness, caplog):
    tm.save(tm.Linear(), repo)
    h = harness(SHARED, regions=None)
    assert h.host.instance.weights is None
    assert "no broker serves 'm_0_0' (a BackendHarness without regions)" in caplog.text


def test_a_region_the_broker_refuses_fails_the_load(run_id, repo, regions, harness):
    path = tm.save(tm.Linear(), repo)
    regions.table.ask("another", key_of(path), 4096)  # the key, laid out otherwise
    with pytest.raises(InferpoolError) as info:
        harness(SHARED)
    assert info.value.code is Code.INVALID_ARG
    assert f"cannot share region '{key_of(path)}': shared region" in info.value.message
    assert "holds 4096 bytes, not the" in info.value.message


def test_a_failed_load_gives_the_region_back(run_id, repo, harness):
    tm.save(tm.Linear(), repo)
    two_inputs = SHARED.replace(
        "input {", 'input { name: "INPUT__1" data_type: TYPE_FP32 dims: [4] }\ninput {'
    )
    with pytest.raises(InferpoolError) as info:
        harness(two_inputs)
    assert "configuration expects 2 inputs, model provides 1" in info.value.message
    assert regions_of_run(run_id) == [region_name(run_id, "lock")]


def test_each_instance_reports_the_weights_it_holds(run_id, repo, harness):
    tm.save(tm.Linear(), repo)
    weights = sum(p.numel() * 4 for p in tm.Linear().parameters())
    own = harness(SHARED.replace("true", "false"))
    assert own.host.stats.memory_usage() == [("CPU", 0, weights)]
    first, second = harness(SHARED), harness(SHARED)
    region = first.host.instance.weights.region.size  # the weights, aligned, and a header
    assert first.host.stats.memory_usage() == [("CPU", 0, region)]  # it filled the region
    assert second.host.stats.memory_usage() == []  # attached: the pages are the first's
