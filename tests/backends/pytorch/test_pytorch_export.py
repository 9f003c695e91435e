"""model.pt2: a torch.export ExportedProgram, or an AOTInductor package (opt-in, slow)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch_models as tm

from inferpool.wire.errors import Code, InferpoolError

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")

CONFIG = tm.config(
    [tm.inp("b", "TYPE_FP32", [2]), tm.inp("a", "TYPE_FP32", [2])],
    [tm.out("OUTPUT__0", "TYPE_FP32", [2]), tm.out("OUTPUT__1", "TYPE_FP32", [2])],
    max_batch_size=16,
    extra='default_model_filename: "model.pt2"',
)


def exported(repo: Path) -> torch.export.ExportedProgram:
    batch = torch.export.Dim("batch", min=1, max=16)
    program = torch.export.export(
        tm.AddSub(),
        (torch.ones(2, 2), torch.ones(2, 2)),
        dynamic_shapes={"a": {0: batch}, "b": {0: batch}},
    )
    (repo / "1").mkdir(parents=True, exist_ok=True)
    return program


def check_add_sub(h) -> None:
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    b = np.ones((3, 2), np.float32)
    out = h.infer({"a": a, "b": b})  # forward-argument names, listed in reverse order
    np.testing.assert_array_equal(out["OUTPUT__0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT__1"], a - b)


def test_exported_program_with_a_dynamic_batch(repo, harness):
    torch.export.save(exported(repo), str(repo / "1" / "model.pt2"))
    h = harness(CONFIG)
    assert h.host.instance.artifact.format == "exported"
    check_add_sub(h)
    ones = [np.ones((n, 2), np.float32) for n in (1, 4)]
    results = h.execute([h.request({"a": x, "b": x}) for x in ones])
    assert [h.outputs_of(r)["OUTPUT__0"].shape for _, r, _ in results] == [(1, 2), (4, 2)]


def test_exported_program_outside_its_shape_constraints_fails_the_request(repo, harness):
    torch.export.save(exported(repo), str(repo / "1" / "model.pt2"))
    h = harness(CONFIG.replace("max_batch_size: 16", "max_batch_size: 32"))
    ones = np.ones((20, 2), np.float32)
    [(_, response, _)] = h.execute([h.request({"a": ones, "b": ones})])
    assert response.error.code is Code.INTERNAL
    assert response.error.message.startswith("PyTorch execute failure: ")


def test_a_torchscript_file_named_pt2_is_unavailable(repo, harness):
    tm.save(tm.AddSub(), repo, "model.pt2")
    with pytest.raises(InferpoolError) as info:
        harness(CONFIG)
    assert info.value.code is Code.UNAVAILABLE
    assert f"failed to load model 'm' from '{repo / '1' / 'model.pt2'}'" in info.value.message


@pytest.mark.skipif(
    not os.environ.get("INFERPOOL_SLOW_TESTS"),
    reason="AOTInductor compiles C++ (about 40 s on 2 cores); set INFERPOOL_SLOW_TESTS=1",
)
def test_aoti_package(repo, harness):
    from torch._inductor import aoti_compile_and_package

    aoti_compile_and_package(exported(repo), package_path=str(repo / "1" / "model.pt2"))
    h = harness(
        tm.config(
            [tm.inp("INPUT__0", "TYPE_FP32", [2]), tm.inp("INPUT__1", "TYPE_FP32", [2])],
            [tm.out("OUTPUT__0", "TYPE_FP32", [2]), tm.out("OUTPUT__1", "TYPE_FP32", [2])],
            max_batch_size=16,
            extra='default_model_filename: "model.pt2"',
        )
    )
    assert h.host.instance.artifact.format == "aoti"
    a, b = np.full((3, 2), 5, np.float32), np.ones((3, 2), np.float32)
    out = h.infer({"INPUT__0": a, "INPUT__1": b})  # AOTI keeps no argument names: <name>__<index>
    np.testing.assert_array_equal(out["OUTPUT__0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT__1"], a - b)


def test_exported_program_weights_are_shared(run_id, repo, harness, caplog):
    caplog.set_level("INFO")
    batch = torch.export.Dim("batch", min=1, max=8)
    program = torch.export.export(
        tm.Linear(), (torch.ones(2, 4),), dynamic_shapes={"x": {0: batch}}
    )
    (repo / "1").mkdir()
    torch.export.save(program, str(repo / "1" / "model.pt2"))
    config = tm.config(
        [tm.inp("x", "TYPE_FP32", [4])],
        [tm.out("OUTPUT__0", "TYPE_FP32", [2])],
        max_batch_size=8,
        extra='default_model_filename: "model.pt2"\n'
        'parameters { key: "ENABLE_WEIGHT_SHARING" value: { string_value: "true" } }',
    )
    first, second = harness(config), harness(config)
    assert "attached to shared weights region" in caplog.text
    x = np.random.default_rng(0).random((3, 4), dtype=np.float32)
    expected = tm.Linear()(torch.from_numpy(x)).detach().numpy()
    for h in (first, second):
        np.testing.assert_allclose(h.infer({"x": x})["OUTPUT__0"], expected, rtol=1e-6)
