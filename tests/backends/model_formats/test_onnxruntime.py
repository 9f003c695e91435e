"""The onnxruntime backend through the real lifecycle host: answers against ONNX Runtime called
directly, auto-complete, Triton's config errors, zero-copy binding."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_models as om
import pytest

from inferpool.backends.testing import BackendHarness
from inferpool.wire.errors import Code, InferpoolError
from tests import ragged_batches as rb

Harness = Callable[..., BackendHarness]


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    """``harness(model, config, **kw)``: the model saved under ``<tmp>/m`` and loaded."""
    opened: list[BackendHarness] = []

    def make(model: onnx.ModelProto, config: str, **kw: Any) -> BackendHarness:
        om.save(model, tmp_path / "m")
        h = BackendHarness("onnxruntime", config, repository_path=str(tmp_path / "m"), **kw)
        opened.append(h)
        return h

    yield make
    for h in reversed(opened):
        h.close()


def test_answers_match_onnx_runtime_and_batches_split_back(harness: Harness, tmp_path: Path):
    h = harness(om.add_sub(), om.add_sub_config("m"))
    rng = np.random.default_rng(0)
    parts = [rng.random((n, 16), dtype=np.float32) for n in (1, 3, 2)]
    results = h.execute([h.request({"INPUT0": p, "INPUT1": p * 2}) for p in parts])
    for part, (_, response, final) in zip(parts, results, strict=True):
        assert final
        got = h.outputs_of(response)
        want = om.reference(tmp_path / "m", {"INPUT0": part, "INPUT1": part * 2})
        np.testing.assert_array_equal(got["OUTPUT0"], want[0])
        np.testing.assert_array_equal(got["OUTPUT1"], want[1])
    assert [b.batch_size for b in h.host.take_batches()] == [6]


@pytest.mark.parametrize(
    ("dtype", "config_type", "values"),
    [
        (np.float16, "TYPE_FP16", [0.5, 1.25]),
        (np.int32, "TYPE_INT32", [7, -3]),
        (object, "TYPE_STRING", [b"7", b"-3"]),
    ],
)
def test_datatypes(harness: Harness, tmp_path: Path, dtype, config_type, values):
    h = harness(om.add_sub(dtype), om.add_sub_config("m", config_type))
    a = np.array([[values[0]] * 16], dtype=dtype)
    b = np.array([[values[1]] * 16], dtype=dtype)
    got = h.infer({"INPUT0": a, "INPUT1": b})
    if dtype is object:
        assert got["OUTPUT0"].tolist() == [[b"4"] * 16] and got["OUTPUT1"].tolist() == [
            [b"10"] * 16
        ]
        return
    want = om.reference(tmp_path / "m", {"INPUT0": a, "INPUT1": b})
    assert got["OUTPUT0"].dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got["OUTPUT0"], want[0])
    np.testing.assert_array_equal(got["OUTPUT1"], want[1])


def test_a_config_without_tensors_is_completed_from_the_model(harness: Harness):
    h = harness(om.add_sub(), 'name: "m" backend: "onnxruntime"')
    config = h.host.config
    assert config.max_batch_size == 4  # Triton's default-max-batch-size
    assert config.HasField("dynamic_batching")
    assert [(t.name, list(t.dims)) for t in config.input] == [("INPUT0", [16]), ("INPUT1", [16])]
    assert [t.name for t in config.output] == ["OUTPUT0", "OUTPUT1"]


def test_default_max_batch_size_comes_from_the_backend_config(tmp_path: Path):
    om.save(om.add_sub(), tmp_path / "m")
    from inferpool.backends.host import BackendHost
    from inferpool.wire.worker.spec import InstanceSpec

    host = BackendHost(
        backend_name="onnxruntime",
        model_name="m",
        model_version=1,
        config_json='{"name": "m", "backend": "onnxruntime"}',
        repository_path=str(tmp_path / "m"),
        artifact_path=str(tmp_path / "m" / "1"),
        instance=InstanceSpec(name="m_0"),
        backend_config={"default-max-batch-size": "1"},
    )
    host.load()
    try:
        assert host.config.max_batch_size == 1
        assert not host.config.HasField("dynamic_batching")  # Triton adds it only past 1
    finally:
        host.close()


def test_a_model_without_batch_dimension_keeps_max_batch_size_zero(harness: Harness):
    h = harness(om.add_sub(batch=False), 'name: "m" backend: "onnxruntime"')
    assert h.host.config.max_batch_size == 0
    assert list(h.host.config.input[0].dims) == [16]
    got = h.infer({"INPUT0": np.ones(16, np.float32), "INPUT1": np.ones(16, np.float32)})
    assert got["OUTPUT0"].tolist() == [2.0] * 16


@pytest.mark.parametrize(
    ("model", "config", "message"),
    [
        (om.add_sub(), om.add_sub_config("m", "TYPE_INT32"),
         "unable to load model 'm', configuration expects datatype TYPE_INT32 for input 'INPUT0', "
         "model provides TYPE_FP32"),
        (om.add_sub(), om.add_sub_config("m", dims=8),
         "model 'm', tensor 'INPUT0': the model expects 2 dimensions (shape [-1,16]) but the "
         "model configuration specifies 2 dimensions (an initial batch dimension because "
         "max_batch_size > 0 followed by the explicit tensor shape, making complete shape "
         "[-1,8])"),
        (om.add_sub(), om.add_sub_config("m").replace('"INPUT1"', '"IN1"'),
         "unexpected inference input 'IN1', allowed inputs are: INPUT0, INPUT1"),
        (om.add_sub(), om.add_sub_config("m").replace('"OUTPUT1"', '"OUT1"'),
         "unexpected inference output 'OUT1', allowed outputs are: OUTPUT0, OUTPUT1"),
        (om.add_sub(batch=False), om.add_sub_config("m"),
         "model 'm', tensor 'INPUT0': for the model to support batching the shape should have at "
         "least 1 dimension and the first dimension must be -1; but shape expected by the model "
         "is [16]"),
        (om.add_sub(batch=False), 'name: "m" backend: "onnxruntime" max_batch_size: 4',
         "autofill failed for model 'm': model does not support batching while non-zero "
         "max_batch_size is specified"),
        (om.add_sub(), om.add_sub_config("m", extra='parameters { key: "execution_mode" '
                                                    'value: { string_value: "2" } }'),
         "Expected values for  execution_mode are 0 or 1 but got 2"),
        (om.add_sub(), om.add_sub_config("m", extra='parameters { key: "enable_mem_arena" '
                                                    'value: { string_value: "maybe" } }'),
         "parameter 'enable_mem_arena' of model 'm': failed to convert 'maybe' to boolean"),
        (om.accumulate(), om.ACCUMULATE_CONFIG.replace('"START"', '"BEGIN"'),
         "configuration specified sequence control 'BEGIN', but model does not provide that "
         "input"),
        (om.accumulate(), om.ACCUMULATE_CONFIG.replace("state [", "state_unused [").split(
            "state_unused")[0] + "}",
         "unable to load model 'm', configuration expects 2 inputs, model provides 3"),
    ],
)  # fmt: skip
def test_a_config_that_contradicts_the_model_fails_the_load(harness, model, config, message):
    with pytest.raises(InferpoolError) as err:
        harness(model, config)
    assert message in err.value.message
    assert err.value.code in (Code.INVALID_ARG, Code.INTERNAL)


def test_a_missing_model_file_is_named(tmp_path: Path):
    (tmp_path / "m" / "1").mkdir(parents=True)
    with pytest.raises(InferpoolError) as err:
        BackendHarness("onnxruntime", om.add_sub_config("m"), repository_path=str(tmp_path / "m"))
    assert err.value.code == Code.UNAVAILABLE
    assert f"unable to find '{tmp_path}/m/1/model.onnx'" in err.value.message


def test_a_model_directory_holds_model_onnx(tmp_path: Path):
    """A large model is a directory model.onnx/ with model.onnx (and its weights) inside."""
    om.save(om.add_sub(), tmp_path / "m")
    folder = tmp_path / "m" / "1" / "model.onnx"
    data = folder.read_bytes()
    folder.unlink()
    folder.mkdir()
    (folder / "model.onnx").write_bytes(data)
    with BackendHarness(
        "onnxruntime", om.add_sub_config("m"), repository_path=str(tmp_path / "m")
    ) as h:
        got = h.infer(
            {"INPUT0": np.ones((1, 16), np.float32), "INPUT1": np.ones((1, 16), np.float32)}
        )
        assert got["OUTPUT1"].tolist() == [[0.0] * 16]


class BindingSpy:
    """Records the addresses ONNX Runtime's IO binding was given (and binds them)."""

    def __init__(self, binding) -> None:
        self.binding = binding
        self.inputs: dict[str, int] = {}
        self.outputs: dict[str, int] = {}

    def bind_input(self, name, device, ordinal, dtype, shape, address) -> None:
        self.inputs[name] = address
        self.binding.bind_input(name, device, ordinal, dtype, shape, address)

    def bind_output(self, name, device="cpu", ordinal=0, dtype=None, shape=None, address=None):
        self.outputs[name] = address
        if address is None:
            return self.binding.bind_output(name, device, ordinal)
        return self.binding.bind_output(name, device, ordinal, dtype, shape, address)

    def __getattr__(self, name: str):
        return getattr(self.binding, name)


def test_a_lone_request_is_read_and_answered_in_place(harness: Harness):
    """The input's memory is bound as it is, and ONNX Runtime writes each output into the
    response's own slot: the addresses bound are the request's and the response's."""
    h = harness(om.add_sub(), om.add_sub_config("m"))
    instance: Any = h.host.instance
    binder = instance.binder
    spy = binder.binding = BindingSpy(binder.binding)
    request = h.request(
        {"INPUT0": np.ones((2, 16), np.float32), "INPUT1": np.ones((2, 16), np.float32)}
    )
    [(_, response, _)] = h.execute([request])
    assert response is not None
    for name in ("INPUT0", "INPUT1"):
        assert spy.inputs[name] == request.inputs[name].data.__array_interface__["data"][0]
    for name, out in response.outputs.items():
        slot = np.frombuffer(h.memory.read(out.offset), np.uint8)
        assert spy.outputs[name] == slot.__array_interface__["data"][0]
    assert h.outputs_of(response)["OUTPUT0"].tolist() == [[2.0] * 16] * 2
    assert binder.copied == 0


def test_inputs_lying_back_to_back_are_one_batch_without_a_copy(harness: Harness):
    h = harness(om.add_sub(), om.add_sub_config("m"))
    instance: Any = h.host.instance
    binder = instance.binder
    spy = binder.binding = BindingSpy(binder.binding)
    whole = np.arange(3 * 16, dtype=np.float32).reshape(3, 16)
    whole.flags.writeable = False
    requests = [
        h.request({"INPUT0": np.zeros((1, 16), np.float32), "INPUT1": whole[:1]}) for _ in range(3)
    ]
    for i, request in enumerate(requests):  # one buffer, row after row, as a batcher lays it
        request.inputs["INPUT0"].data = whole[i : i + 1]
    results = h.execute(requests)
    assert spy.inputs["INPUT0"] == whole.__array_interface__["data"][0]
    assert [h.outputs_of(r)["OUTPUT0"].tolist() for _, r, _ in results] == [
        (whole[i : i + 1] + whole[:1]).tolist() for i in range(3)
    ]
    # INPUT1 (three separate arrays) was joined, and the outputs of a batch copied back
    assert binder.copied == 3 * 16 * 4 + 2 * 3 * 16 * 4


def test_a_failing_request_does_not_sink_the_others(harness: Harness):
    h = harness(om.add_sub(dims="n"), om.add_sub_config("m", dims=-1))
    good = h.request({"INPUT0": np.ones((1, 4), np.float32), "INPUT1": np.ones((1, 4), np.float32)})
    other_shape = h.request(
        {"INPUT0": np.ones((1, 5), np.float32), "INPUT1": np.ones((1, 5), np.float32)}
    )
    mismatched = h.request(
        {"INPUT0": np.ones((1, 4), np.float32), "INPUT1": np.ones((1, 3), np.float32)}
    )
    too_big = h.request(
        {"INPUT0": np.ones((9, 4), np.float32), "INPUT1": np.ones((9, 4), np.float32)}
    )
    batch = [good, other_shape, mismatched, too_big]
    results = {r.id: resp for r, resp, _ in h.execute(batch) if resp is not None}
    assert h.outputs_of(results[good.id])["OUTPUT0"].tolist() == [[2.0] * 4]
    assert h.outputs_of(results[other_shape.id])["OUTPUT0"].tolist() == [[2.0] * 5]
    assert "onnx runtime error" in str(results[mismatched.id].error)
    assert str(results[too_big.id].error) == (
        "INVALID_ARG: inference request batch-size must be <= 8 for 'm', got 9"
    )


def test_without_onnxruntime_the_error_names_the_extra(tmp_path: Path):
    om.save(om.add_sub(), tmp_path / "m")
    code = (
        "import sys; sys.modules['onnxruntime'] = None\n"
        "from inferpool.backends.testing import BackendHarness\n"
        "from inferpool.wire.errors import InferpoolError\n"
        "try:\n"
        f"    BackendHarness('onnxruntime', {om.add_sub_config('m')!r}, "
        f"repository_path={str(tmp_path / 'm')!r})\n"
        "except InferpoolError as err:\n"
        "    print(err)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "backend 'onnxruntime' needs the Python package 'onnxruntime'" in out.stdout, out
    assert "pip install 'inferpool[onnx]'" in out.stdout


def test_a_sequence_carries_its_state_and_controls(harness: Harness):
    from inferpool.backends.api import FLAG_SEQUENCE_START

    h = harness(om.accumulate(), om.ACCUMULATE_CONFIG)
    x = np.array([[2.0]], np.float32)
    first = h.infer(
        {"INPUT": x}, ["OUTPUT", "STATE_OUT"], flags=FLAG_SEQUENCE_START, correlation_id=9
    )
    assert first["OUTPUT"].tolist() == [[2.0]] and first["STATE_OUT"].tolist() == [[2.0]]
    then = h.infer({"INPUT": x, "STATE_IN": first["STATE_OUT"]}, ["OUTPUT"], correlation_id=9)
    assert then["OUTPUT"].tolist() == [[4.0]]


def test_a_global_backend_config_reaches_every_backend() -> None:
    """Triton's --backend-config=default-max-batch-size=8 (no backend name) is global."""
    from inferpool.serve import parse_backend_config

    parsed = parse_backend_config(["default-max-batch-size=8", "onnxruntime,x=1"])
    assert parsed == {"": {"default-max-batch-size": "8"}, "onnxruntime": {"x": "1"}}


RAGGED_SHAPES = [(1, 2, 3), (2, 1, 2), (1, 4, 1)]


def test_ragged_inputs_batch_inputs_and_batch_outputs(harness: Harness):
    """Requests whose ragged input differs in shape run as one batch: the model reads their
    elements one after another, and every batch input is built as Triton's backends build it;
    DOUBLED is split back by each request's input shape."""
    h = harness(om.ragged_batch(), rb.config("m"))
    instance: Any = h.host.instance
    spy = instance.binder.binding = BindingSpy(instance.binder.binding)
    requests = [
        h.request({"RAGGED": np.arange(np.prod(s), dtype=np.float32).reshape(s)})
        for s in RAGGED_SHAPES
    ]
    results = h.execute(requests)
    for (_, response, _), want in zip(results, rb.expected(RAGGED_SHAPES), strict=True):
        got = h.outputs_of(response)
        assert set(got) == set(want)
        for name, value in want.items():
            assert got[name].shape == value.shape, name
            np.testing.assert_array_equal(got[name], value, err_msg=name)
    assert [b.batch_size for b in h.host.take_batches()] == [4]  # one run, 4 batch items
    assert set(spy.inputs) == {"RAGGED", "ITEMS", *rb.BATCH_KINDS}


def test_a_lone_ragged_request_is_flat_to_the_model(harness: Harness):
    h = harness(om.ragged_batch(), rb.config("m"))
    x = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    got = h.infer({"RAGGED": x}, ["DOUBLED", "COUNT_OUT", "ITEMS_OUT"])
    assert set(got) == {"DOUBLED", "COUNT_OUT", "ITEMS_OUT"}  # only what was asked for
    np.testing.assert_array_equal(got["DOUBLED"], 2 * x)
    assert got["COUNT_OUT"].tolist() == [[6.0]] and got["ITEMS_OUT"].tolist() == [[2.0, 3.0]]


RAGGED_ADD_SUB = om.add_sub_config("m").replace(
    "dims: [ 16 ] }", "dims: [ 16 ] allow_ragged_batch: true }", 1
)


@pytest.mark.parametrize(
    ("model", "config", "message"),
    [
        (om.add_sub(), RAGGED_ADD_SUB,
         "unable to load model 'm', configuration expects model provides input with shape [-1]  "
         "for ragged input 'INPUT0', model provides [-1,16]"),
        (om.ragged_batch(), rb.config("m").replace('target_name: "FLAT"', ""),
         "unable to load model 'm', configuration expects 6 inputs, model provides 7"),
        (om.ragged_batch(), rb.config("m").replace('"FLAT"', '"FLATTER"'),
         "unexpected inference input 'FLATTER', allowed inputs are: ACC, ACC0, COUNT, FLAT, "
         "ITEMS, MAXS, RAGGED"),
    ],
)  # fmt: skip
def test_a_ragged_config_that_contradicts_the_model_fails_the_load(harness, model, config, message):
    with pytest.raises(InferpoolError) as info:
        harness(model, config)
    assert info.value.code == Code.INVALID_ARG and message in info.value.message


def test_a_batch_output_the_model_leaves_short_fails_its_batch_only(harness: Harness):
    """DOUBLED configured wider than the model makes it: a part past the model's elements is
    an error for the batch's requests, and the model serves on."""
    config = rb.config("m").replace(
        'name: "DOUBLED" data_type: TYPE_FP32 dims: [ -1, -1 ]',
        'name: "DOUBLED" data_type: TYPE_FP32 dims: [ -1, 9 ]',
    )
    h = harness(om.ragged_batch(), config)
    [(_, response, _)] = h.execute([h.request({"RAGGED": np.ones((1, 2, 3), np.float32)})])
    assert response is not None and response.error is not None
    assert response.error.code == Code.INTERNAL
    assert "output 'DOUBLED' holds 6 elements, fewer than the 18" in response.error.message
    got = h.infer({"RAGGED": np.ones((1, 2, 3), np.float32)}, ["COUNT_OUT"])
    assert got["COUNT_OUT"].tolist() == [[6.0]]
