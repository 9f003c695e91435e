"""The openvino backend through the real lifecycle host: an ONNX model and an IR model shaped
as Triton's gen_qa_models.py writes them (a fixed batch of 8), answers against ONNX Runtime,
Triton's batch-size rule and its padding, parameters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx_models as om
import openvino as ov
import pytest

from inferpool.backends.testing import BackendHarness
from inferpool.wire.errors import InferpoolError
from tests import ragged_batches as rb

OV_ONNX = 'name: "m" backend: "openvino" default_model_filename: "model.onnx"\n'


def qa_model(model_dir: Path, batch: int = 8) -> None:
    """``openvino_float32_float32_float32`` as gen_qa_models.py builds it: a fixed batch."""
    try:
        from openvino import opset1
    except ImportError:  # before openvino 2024.4 the opsets lived in openvino.runtime
        from openvino.runtime import opset1

    shape = [batch, 16]
    in0 = opset1.parameter(shape, np.float32, name="INPUT0")
    in1 = opset1.parameter(shape, np.float32, name="INPUT1")
    outputs = []
    for name, op in (("OUTPUT0", opset1.add), ("OUTPUT1", opset1.subtract)):
        result = opset1.reshape(op(in0, in1), opset1.constant(np.array(shape)), special_zero=False)
        node = opset1.convert(result, destination_type="f32", name=name)
        node.output(0).get_tensor().set_names({name})
        outputs.append(node)
    (model_dir / "1").mkdir(parents=True)
    ov.save_model(ov.Model(outputs, [in0, in1], "qa"), str(model_dir / "1" / "model.xml"))


def test_an_onnx_model_matches_onnx_runtime_and_batches(tmp_path: Path) -> None:
    om.save(om.add_sub(), tmp_path / "m")
    rng = np.random.default_rng(0)
    parts = [rng.random((n, 16), dtype=np.float32) for n in (1, 3)]
    with BackendHarness("openvino", OV_ONNX, repository_path=str(tmp_path / "m")) as h:
        assert h.host.config.max_batch_size == 4 and h.host.config.HasField("dynamic_batching")
        results = h.execute([h.request({"INPUT0": p, "INPUT1": p}) for p in parts])
        for part, (_, response, _) in zip(parts, results, strict=True):
            want = om.reference(tmp_path / "m", {"INPUT0": part, "INPUT1": part})
            np.testing.assert_allclose(h.outputs_of(response)["OUTPUT0"], want[0], rtol=1e-6)
        alone = h.infer({"INPUT0": parts[1], "INPUT1": parts[1]})  # written in place
        np.testing.assert_allclose(alone["OUTPUT1"], np.zeros((3, 16)), atol=0)


def test_a_fixed_batch_takes_that_batch_or_pads_when_asked(tmp_path: Path) -> None:
    qa_model(tmp_path / "m")
    config = om.add_sub_config("m").replace('platform: "onnxruntime_onnx"', 'backend: "openvino"')
    x = np.ones((8, 16), np.float32)
    with BackendHarness("openvino", config, repository_path=str(tmp_path / "m")) as h:
        assert h.infer({"INPUT0": x, "INPUT1": x})["OUTPUT0"].tolist() == [[2.0] * 16] * 8
        with pytest.raises(InferpoolError) as err:
            h.infer({"INPUT0": x[:1], "INPUT1": x[:1]})
        assert (
            "expected requests with batch size '8', got '1'... this error can be avoided by "
            "setting 'ENABLE_BATCH_PADDING' parameter" in err.value.message
        )
    padded = config + 'parameters { key: "ENABLE_BATCH_PADDING" value: { string_value: "YES" } }'
    with BackendHarness("openvino", padded, repository_path=str(tmp_path / "m")) as h:
        got = h.infer({"INPUT0": x[:3], "INPUT1": x[:3] * 2})
        assert got["OUTPUT1"].tolist() == [[-1.0] * 16] * 3


@pytest.mark.parametrize(
    ("parameter", "value", "message"),
    [
        ("NUM_STREAMS", "many", "expected the parameter 'NUM_STREAMS' to be either "
         "AUTO/NUMA/<int_value>, got many"),
        ("PERFORMANCE_HINT", "fast", "expected the parameter 'PERFORMANCE_HINT' to be "
         "LATENCY/THROUGHPUT/CUMULATIVE_THROUGHPUT, got fast"),
        ("INFERENCE_NUM_THREADS", "-1", "expected the parameter 'INFERENCE_NUM_THREADS' to be a "
         "non-negative number, got -1"),
    ],
)  # fmt: skip
def test_parameters_are_checked(tmp_path: Path, parameter: str, value: str, message: str) -> None:
    om.save(om.add_sub(), tmp_path / "m")
    config = OV_ONNX + f'parameters {{ key: "{parameter}" value: {{ string_value: "{value}" }} }}'
    with pytest.raises(InferpoolError) as err:
        BackendHarness("openvino", config, repository_path=str(tmp_path / "m"))
    assert message in err.value.message


def test_streams_and_hint_are_taken(tmp_path: Path) -> None:
    om.save(om.add_sub(), tmp_path / "m")
    config = OV_ONNX + (
        'parameters { key: "NUM_STREAMS" value: { string_value: "1" } }\n'
        'parameters { key: "PERFORMANCE_HINT" value: { string_value: "latency" } }\n'
        'parameters { key: "INFERENCE_NUM_THREADS" value: { string_value: "1" } }\n'
    )
    with BackendHarness("openvino", config, repository_path=str(tmp_path / "m")) as h:
        model: Any = h.host.model
        compiled = model.compiled
        assert compiled.get_property("NUM_STREAMS") == 1
        assert str(compiled.get_property("PERFORMANCE_HINT")).endswith("LATENCY")
        assert compiled.get_property("INFERENCE_NUM_THREADS") == 1


def test_ragged_inputs_batch_inputs_and_batch_outputs(tmp_path: Path) -> None:
    """The onnxruntime backend's ragged model, run by OpenVINO: the same answers, worked
    out with numpy, from one batch of requests whose ragged input differs in shape."""
    shapes = [(1, 2, 3), (2, 1, 2), (1, 4, 1)]
    config = rb.config("m", "openvino", 'default_model_filename: "model.onnx"')
    om.save(om.ragged_batch(), tmp_path / "m")
    with BackendHarness("openvino", config, repository_path=str(tmp_path / "m")) as h:
        requests = [
            h.request({"RAGGED": np.arange(np.prod(s), dtype=np.float32).reshape(s)})
            for s in shapes
        ]
        results = h.execute(requests)
        for (_, response, _), want in zip(results, rb.expected(shapes), strict=True):
            got = h.outputs_of(response)
            assert set(got) == set(want)
            for name, value in want.items():
                assert got[name].shape == value.shape, name
                np.testing.assert_array_equal(got[name], value, err_msg=name)
        assert [b.batch_size for b in h.host.take_batches()] == [4]
