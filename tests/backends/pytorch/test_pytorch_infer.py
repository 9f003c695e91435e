"""The pytorch backend through the real lifecycle host: naming, batching, outputs, errors."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
import torch
import torch_models as tm
from torch import Tensor, nn

from inferpool.wire.errors import Code, InferpoolError
from tests import ragged_batches as rb
from tests.support import threads_beside

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")

LINEAR = tm.config(
    [tm.inp("INPUT__0", "TYPE_FP32", [4])],
    [tm.out("OUTPUT__0", "TYPE_FP32", [2])],
    max_batch_size=8,
)


def reference(module: nn.Module, *args: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return module(*(torch.from_numpy(a) for a in args)).numpy()


def test_linear_batch_matches_torch_and_reports_statistics(repo, harness):
    tm.save(tm.Linear(), repo)
    h = harness(LINEAR)
    x = np.random.default_rng(0).random((3, 4), dtype=np.float32)
    request = h.request({"INPUT__0": x})
    [(_, response, final)] = h.execute([request])
    assert final
    np.testing.assert_allclose(
        h.outputs_of(response)["OUTPUT__0"], reference(tm.Linear(), x), rtol=1e-6
    )
    timing = h.host.timing_of(request)
    assert timing is not None and timing.success
    stamps = timing.stamps
    assert stamps.exec_start <= stamps.compute_start <= stamps.compute_end <= stamps.exec_end
    [(batch_size, *_)] = h.host.take_batches()
    assert batch_size == 3


def test_requests_are_batched_together_and_split_back(repo, harness):
    tm.save(tm.Linear(), repo)
    h = harness(LINEAR)
    rng = np.random.default_rng(1)
    parts = [rng.random((n, 4), dtype=np.float32) for n in (1, 3, 2)]
    results = h.execute([h.request({"INPUT__0": p}) for p in parts])
    for part, (_, response, _) in zip(parts, results, strict=True):
        got = h.outputs_of(response)["OUTPUT__0"]
        np.testing.assert_allclose(got, reference(tm.Linear(), part), rtol=1e-6)
    assert [b.batch_size for b in h.host.take_batches()] == [6]


def test_a_bad_request_does_not_sink_the_batch(repo, harness):
    tm.save(tm.Linear(), repo)
    h = harness(LINEAR)
    x = np.ones((1, 4), np.float32)
    requests = [
        h.request({"INPUT__0": x}),
        h.request({"INPUT__0": x.astype(np.float64)}),
        h.request({"INPUT__0": np.ones((1, 5), np.float32)}),
        h.request({"INPUT__0": x, "EXTRA": x}),
        h.request({"OTHER": x}),
        h.request({"INPUT__0": np.ones((9, 4), np.float32)}),
        h.request({"INPUT__0": x}),
    ]
    results = [r for _, r, _ in h.execute(requests)]
    errors = [r.error for r in results]
    assert errors[0] is None and errors[-1] is None
    assert str(errors[1]) == (
        "INVALID_ARG: inference input 'INPUT__0' data-type is 'FP64', but model 'm' expects 'FP32'"
    )
    assert str(errors[2]) == (
        "INVALID_ARG: unexpected shape for input 'INPUT__0' for model 'm'. "
        "Expected [-1,4], got [1,5]"
    )
    assert str(errors[3]) == "INVALID_ARG: unexpected inference input 'EXTRA' for model 'm'"
    assert "missing required input(s) ['INPUT__0']" in str(errors[4])
    assert str(errors[5]) == "INVALID_ARG: inference request batch-size must be <= 8 for 'm', got 9"
    assert [h.host.timing_of(r).success for r in requests] == [e is None for e in errors]


def test_a_batch_over_max_batch_size_fails_every_request(repo, harness):
    tm.save(tm.Linear(), repo)
    h = harness(LINEAR)
    results = h.execute([h.request({"INPUT__0": np.ones((5, 4), np.float32)}) for _ in range(2)])
    for _, response, _ in results:
        assert response.error == InferpoolError(
            Code.INTERNAL, "batch size 10 for 'm_0_0', max allowed is 8"
        )
    assert h.host.take_batches() == []


def test_non_batching_model_takes_the_full_shape(repo, harness):
    tm.save(tm.Linear(), repo)
    h = harness(
        tm.config(
            [tm.inp("INPUT__0", "TYPE_FP32", [2, 4])], [tm.out("OUTPUT__0", "TYPE_FP32", [2, 2])]
        )
    )
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_allclose(
        h.infer({"INPUT__0": x})["OUTPUT__0"], reference(tm.Linear(), x), rtol=1e-6
    )


ADD_SUB_OUT = [tm.out("OUTPUT__1", "TYPE_FP32", [2]), tm.out("OUTPUT__0", "TYPE_FP32", [2])]


@pytest.mark.parametrize(
    ("names", "outputs"),
    [
        (["INPUT__1", "INPUT__0"], ADD_SUB_OUT),  # <name>__<index>, in any config order
        (["b", "a"], ADD_SUB_OUT),  # forward-argument names
    ],
)
def test_inputs_and_outputs_follow_their_naming_convention(repo, harness, names, outputs):
    tm.save(tm.AddSub(), repo)
    h = harness(tm.config([tm.inp(n, "TYPE_FP32", [2]) for n in names], outputs))
    a, b = np.array([5, 7], np.float32), np.array([1, 2], np.float32)
    out = h.infer({names[1]: a, names[0]: b})  # names[1] is the first forward argument
    np.testing.assert_array_equal(out["OUTPUT__0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT__1"], a - b)


def test_strict_config_ordering_when_names_follow_no_convention(repo, harness, caplog):
    tm.save(tm.AddSub(), repo)
    h = harness(
        tm.config(
            [tm.inp("fir__st", "TYPE_FP32", [2]), tm.inp("second", "TYPE_FP32", [2])],
            [tm.out("sum", "TYPE_FP32", [2]), tm.out("diff", "TYPE_FP32", [2])],
        )
    )
    assert "Falling back to enforcing strict ordering" in caplog.text
    out = h.infer({"fir__st": np.full(2, 5, np.float32), "second": np.ones(2, np.float32)})
    np.testing.assert_array_equal(out["sum"], [6, 6])
    np.testing.assert_array_equal(out["diff"], [4, 4])


def test_only_requested_outputs_are_produced(repo, harness):
    tm.save(tm.AddSub(), repo)
    h = harness(
        tm.config([tm.inp("a", "TYPE_FP32", [2]), tm.inp("b", "TYPE_FP32", [2])], ADD_SUB_OUT)
    )
    out = h.infer({"a": np.ones(2, np.float32), "b": np.ones(2, np.float32)}, ["OUTPUT__1"])
    assert list(out) == ["OUTPUT__1"]


def test_dict_input(repo, harness):
    tm.save(tm.DictInput(), repo)
    h = harness(tm.DICT_INPUT)
    x, y = np.arange(6).reshape(2, 3), np.full((2, 3), 10)
    np.testing.assert_array_equal(h.infer({"x": x, "y": y})["OUTPUT__0"], x * 2 + y)


def test_strings_in_and_out_batched_per_request(repo, harness):
    tm.save(tm.Upper(), repo)
    h = harness(
        tm.config(
            [tm.inp("INPUT__0", "TYPE_STRING", [1], "reshape: { shape: [] }")],
            [
                tm.out("OUTPUT__0", "TYPE_STRING", [1], "reshape: { shape: [] }"),
                tm.out("OUTPUT__1", "TYPE_INT64", [1]),
            ],
            max_batch_size=8,
        )
    )
    words = [
        np.array([[b"ab"], [b"cd"]], dtype=object),
        np.array([["\u00e9f".encode()]], dtype=object),
    ]
    results = h.execute([h.request({"INPUT__0": w}, ["OUTPUT__0"]) for w in words])
    got = [h.outputs_of(r)["OUTPUT__0"] for _, r, _ in results]
    assert got[0].tolist() == [
        [b"AB"],
        [b"CD"],
    ]  # each request its own rows (the seed repeats row 0)
    assert got[1].tolist() == [["\u00e9F".encode()]]  # TorchScript upper() is ASCII-only
    bad = h.request({"INPUT__0": np.array([[b"\xff"]], dtype=object)})
    [(_, response, _)] = h.execute([bad])
    assert "element 0 of input 'INPUT__0' is not valid UTF-8" in str(response.error)


def test_bf16_and_reshape(repo, harness):
    class Double(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            assert x.shape[1:] == (2, 2)
            return (x * 2).reshape(x.shape[0], 2, 2)

    tm.save(Double(), repo)
    h = harness(
        tm.config(
            [tm.inp("INPUT__0", "TYPE_BF16", [4], "reshape: { shape: [2, 2] }")],
            [tm.out("OUTPUT__0", "TYPE_BF16", [4], "reshape: { shape: [2, 2] }")],
            max_batch_size=2,
        )
    )
    x = np.arange(8).reshape(2, 4).astype(ml_dtypes.bfloat16)
    out = h.infer({"INPUT__0": x})["OUTPUT__0"]
    assert out.shape == (2, 4) and out.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out.astype(np.float32), x.astype(np.float32) * 2)


# ---------------------------------------------------------------------------- output errors
class ListOfInts(nn.Module):
    def forward(self, x: Tensor) -> list[int]:
        return [1]


class TupleWithInts(nn.Module):
    def forward(self, x: Tensor) -> tuple[Tensor, list[int]]:
        return x, [1]


class ReturnsDict(nn.Module):
    def forward(self, x: Tensor) -> dict[str, Tensor]:
        return {"x": x}


class Scalar(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.sum()


class Fails(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        raise RuntimeError("boom")


@pytest.mark.parametrize(
    ("module", "out_type", "outputs", "code", "message"),
    [
        (ListOfInts(), "TYPE_FP32", 1, Code.INTERNAL,
         "PyTorch execute failure: output must be of type Tensor or List[str], received List[int]"),
        (TupleWithInts(), "TYPE_FP32", 1, Code.INTERNAL,
         "PyTorch execute failure: output at index 1 must be of type Tensor or List[str], "
         "received List[int]"),
        (ReturnsDict(), "TYPE_FP32", 1, Code.INTERNAL,
         "PyTorch execute failure: output must be of type Tensor, List[str] or Tuple containing "
         "one of these two types. It should not be a List / Dictionary of Tensors or a Scalar"),
        (Scalar(), "TYPE_FP32", 1, Code.INVALID_ARG,
         "output 'OUTPUT__0' is a scalar which is not supported."),
        (tm.Linear(2, 2), "TYPE_INT32", 1, Code.INVALID_ARG,
         "configuration expects datatype TYPE_INT32 for output 'OUTPUT__0', "
         "model provides TYPE_FP32"),
        (tm.Linear(2, 2), "TYPE_FP32", 2, Code.INVALID_ARG,
         "The output OUTPUT__1 in the model configuration refers to an output index which doesn't "
         "exist. This model has 1 outputs"),
    ],
)  # fmt: skip
def test_output_errors_fail_the_batch(repo, harness, module, out_type, outputs, code, message):
    tm.save(module, repo)
    h = harness(
        tm.config(
            [tm.inp("INPUT__0", "TYPE_FP32", [2])],
            [tm.out(f"OUTPUT__{i}", out_type, [2]) for i in range(outputs)],
        )
    )
    [(_, response, _)] = h.execute([h.request({"INPUT__0": np.ones(2, np.float32)})])
    assert response.error == InferpoolError(code, message)
    assert response.outputs == {}


def test_execute_failure_carries_torch_message(repo, harness):
    tm.save(Fails(), repo)
    h = harness(
        tm.config([tm.inp("INPUT__0", "TYPE_FP32", [2])], [tm.out("OUTPUT__0", "TYPE_FP32", [2])])
    )
    [(_, response, _)] = h.execute([h.request({"INPUT__0": np.ones(2, np.float32)})])
    assert response.error.code is Code.INTERNAL
    assert response.error.message.startswith("PyTorch execute failure: ")
    assert "boom" in response.error.message


# ---------------------------------------------------------------------------- load errors
def load_error(harness, config: str) -> InferpoolError:
    with pytest.raises(InferpoolError) as info:
        harness(config)
    return info.value


def test_missing_model_file_is_unavailable_with_the_path(repo, harness):
    err = load_error(harness, LINEAR)
    assert err.code is Code.UNAVAILABLE
    assert f"unable to find '{repo / '1' / 'model.pt'}' for model instance 'm_0_0'" in err.message


def test_corrupt_model_file_is_unavailable_with_the_path(repo, harness):
    (repo / "1").mkdir()
    (repo / "1" / "custom.pt").write_bytes(b"not a model")
    err = load_error(harness, LINEAR + '\ndefault_model_filename: "custom.pt"')
    assert err.code is Code.UNAVAILABLE
    assert f"failed to load model 'm' from '{repo / '1' / 'custom.pt'}': " in err.message


class IntArg(nn.Module):
    def forward(self, x: Tensor, n: int) -> Tensor:
        return x * n


class TwoDicts(nn.Module):
    def forward(self, a: dict[str, Tensor], b: dict[str, Tensor]) -> Tensor:
        return a["x"]


ONE_OUT = [tm.out("OUTPUT__0", "TYPE_FP32", [2])]


@pytest.mark.parametrize(
    ("module", "inputs", "outputs", "code", "message"),
    [
        (tm.AddSub(), [tm.inp("INPUT__0", "TYPE_FP32", [2])], ONE_OUT, Code.INVALID_ARG,
         "unable to load model 'm', configuration expects 1 inputs, model provides 2"),
        (tm.DictInput(), [], ONE_OUT, Code.INTERNAL,
         "model configuration must contain at least one input, none were specified."),
        (tm.Linear(2, 2), [tm.inp("INPUT__0", "TYPE_FP32", [2])], [], Code.INTERNAL,
         "model configuration must contain at least one output, none were specified."),
        (tm.Linear(2, 2), [tm.inp("INPUT__0", "TYPE_UINT32", [2])], ONE_OUT, Code.INTERNAL,
         "unsupported datatype TYPE_UINT32 for input 'INPUT__0' for model 'm'"),
        (tm.Linear(2, 2), [tm.inp("INPUT__0", "TYPE_FP32", [2])],
         [tm.out("OUTPUT__0", "TYPE_UINT64", [2])], Code.INTERNAL,
         "unsupported datatype TYPE_UINT64 for output 'OUTPUT__0' for model 'm'"),
        (tm.Upper(), [tm.inp("INPUT__0", "TYPE_STRING", [2, 2])], ONE_OUT, Code.INTERNAL,
         "Triton only supports 1 dimensional List of String as input for 'INPUT__0' for model 'm'"),
        (tm.Linear(2, 2), [tm.inp("INPUT__0", "TYPE_FP32", [2])],
         [tm.out("OUTPUT__0", "TYPE_STRING", [2, 2])], Code.INTERNAL,
         "Triton only supports 1 dimensional List of String as output for 'OUTPUT__0' "
         "for model 'm'"),
        (IntArg(), [tm.inp("INPUT__0", "TYPE_FP32", [2])], ONE_OUT, Code.INTERNAL,
         "An input of type 'int' was detected in the model. Only a single input of type "
         "Dict(str, Tensor) or input(s) of type Tensor are supported."),
        (TwoDicts(), [tm.inp("INPUT__0", "TYPE_FP32", [2])], ONE_OUT, Code.INTERNAL,
         "Multiple inputs of kind DictType were detected. Only a single input of type "
         "Dict(str, Tensor) is supported."),
        (tm.AddSub(), [tm.inp("INPUT__0", "TYPE_FP32", [2]), tm.inp("INPUT__5", "TYPE_FP32", [2])],
         ONE_OUT, Code.INVALID_ARG,
         "input 'INPUT__5' of model 'm' refers to forward argument 5, but forward() takes "
         "2 input(s)"),
        (tm.AddSub(), [tm.inp("INPUT__0", "TYPE_FP32", [2]), tm.inp("OTHER__0", "TYPE_FP32", [2])],
         ONE_OUT, Code.INVALID_ARG,
         "inputs 'INPUT__0' and 'OTHER__0' of model 'm' both refer to forward argument 0"),
    ],
)  # fmt: skip
def test_config_errors_fail_the_load(repo, harness, module, inputs, outputs, code, message):
    tm.save(module, repo)
    err = load_error(harness, tm.config(inputs, outputs))
    assert err.code is code
    assert err.message.endswith(message), err.message


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("batch_input [{ kind: BATCH_ELEMENT_COUNT target_name: 'N' data_type: TYPE_INT32 }]",
         "unable to load model 'm', configuration expects 2 inputs, model provides 1"),
        ('parameters { key: "INFERENCE_MODE" value: { string_value: "yes" } }',
         "parameter 'INFERENCE_MODE' of model 'm': failed to convert 'yes' to boolean"),
        ('parameters { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "two" } }',
         "parameter 'INTRA_OP_THREAD_COUNT' of model 'm': failed to convert 'two' to "
         "integral number"),
    ],
)  # fmt: skip
def test_unsupported_config_and_malformed_parameters(repo, harness, config, message):
    tm.save(tm.Linear(), repo)
    err = load_error(harness, LINEAR + "\n" + config)
    assert message in err.message


# ---------------------------------------------------------------------------- zero copy
def address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def test_inputs_reach_torch_without_a_copy(repo, harness):
    tm.save(tm.Linear(), repo)
    h = harness(LINEAR)
    assembler = h.host.instance.assembler
    memory = np.random.default_rng(0).random((4, 4), dtype=np.float32)
    memory.flags.writeable = False  # as a read-only view of shared memory

    def args_for(*views: np.ndarray) -> Tensor:
        requests = [h.request({"INPUT__0": v}) for v in views]
        for request, view in zip(requests, views, strict=True):
            request.inputs["INPUT__0"].data = view  # the harness copies; point at `memory`
        [arg] = assembler.forward_args([assembler.prepare(r) for r in requests])
        return arg

    one = args_for(memory)  # one request: a view, and no non-writable warning
    assert one.data_ptr() == address(memory)
    adjacent = args_for(memory[:1], memory[1:3], memory[3:])  # consecutive slots: one span
    assert adjacent.data_ptr() == address(memory) and adjacent.shape == (4, 4)
    apart = args_for(memory[:1], memory[2:])  # not adjacent: one copy into a batch tensor
    assert apart.data_ptr() != address(memory)
    np.testing.assert_array_equal(apart.numpy(), memory[[0, 2, 3]])


def test_weights_are_not_inference_tensors(repo, harness):
    """Loaded outside inference mode: torch's matmul runs a 3-D batch against an inference
    tensor's weight as a bmm, not one mm (1.6x the CPU of a BERT-base encoder at batch 8)."""
    tm.save(tm.Linear(), repo)
    h = harness(tm.config([tm.inp("INPUT__0", "TYPE_FP32", [4])],
                          [tm.out("OUTPUT__0", "TYPE_FP32", [2])], max_batch_size=8))  # fmt: skip
    weights = h.host.instance.artifact.module.state_dict().values()
    assert weights and not any(t.is_inference() for t in weights)
    assert h.infer({"INPUT__0": np.ones((2, 4), np.float32)})["OUTPUT__0"].shape == (2, 2)


@pytest.mark.parametrize(("inference_mode", "expected"), [("false", 0.0), ("true", 10.0)])
def test_settings_apply_to_the_forward_pass_and_are_restored(
    repo, harness, inference_mode, expected
):
    class Probe(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            y = x + 1
            return x + float(y.is_inference()) * 10 + float(torch.is_grad_enabled())

    tm.save(Probe(), repo)
    params = "".join(
        f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n'
        for k, v in [
            ("INFERENCE_MODE", inference_mode), ("DISABLE_OPTIMIZED_EXECUTION", "true"),
            ("ENABLE_JIT_PROFILING", "false"), ("ENABLE_TENSOR_FUSER", "off"),
            ("INTRA_OP_THREAD_COUNT", "1"), ("DISABLE_CUDNN", "1"), ("ENABLE_JIT_EXECUTOR", "on"),
        ]
    )  # fmt: skip
    threads, profiling = torch.get_num_threads(), torch._C._jit_set_profiling_mode(True)
    try:
        h = harness(tm.config([tm.inp("INPUT__0", "TYPE_FP32", [1])],
                              [tm.out("OUTPUT__0", "TYPE_FP32", [1])], extra=params))  # fmt: skip
        assert torch.get_num_threads() == 1
        # inference mode or not (10 or 0), and never autograd (+ 0)
        assert h.infer({"INPUT__0": np.zeros(1, np.float32)})["OUTPUT__0"].tolist() == [expected]
        assert torch._C._get_graph_executor_optimize() is True
        assert torch.backends.cudnn.enabled is True
        assert torch._C._jit_set_profiling_mode(True) is True  # restored after execute
    finally:
        torch.set_num_threads(threads)
        torch._C._jit_set_profiling_mode(profiling)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: any thread's team is one thread")
def test_an_execution_on_another_thread_keeps_the_thread_count(repo, harness):
    """A lane's thread runs executions too; OpenMP would give it a team of one thread per core
    (on a worker pinned to fewer cores, a team that spins against itself)."""
    tm.save(tm.Linear(256, 512), repo)
    params = 'parameters { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "1" } }'
    config = tm.config(
        [tm.inp("INPUT__0", "TYPE_FP32", [256])],
        [tm.out("OUTPUT__0", "TYPE_FP32", [512])],
        max_batch_size=32,
        extra=params,
    )
    threads = torch.get_num_threads()
    try:
        h = harness(config)
        x = np.ones((32, 256), np.float32)
        assert threads_beside(lambda: h.infer({"INPUT__0": x})) == 0  # no team beside it
    finally:
        torch.set_num_threads(threads)


def test_inputs_of_one_request_must_share_the_batch_size(repo, harness):
    tm.save(tm.AddSub(), repo)
    h = harness(
        tm.config(
            [tm.inp("a", "TYPE_FP32", [2]), tm.inp("b", "TYPE_FP32", [2])],
            [tm.out("OUTPUT__0", "TYPE_FP32", [2]), tm.out("OUTPUT__1", "TYPE_FP32", [2])],
            max_batch_size=4,
        )
    )
    request = h.request({"a": np.ones((2, 2), np.float32), "b": np.ones((3, 2), np.float32)})
    [(_, response, _)] = h.execute([request])
    assert str(response.error) == (
        "INVALID_ARG: input 'b' has shape [3,2], but the request's batch size is 2 (from input "
        "'a'): every input of a request shares the batch dimension (model 'm')"
    )


def test_ragged_inputs_batch_inputs_and_batch_outputs(repo, harness):
    """Requests whose ragged input differs in shape run as one forward pass: RAGGED flat,
    the batch inputs passed by their forward argument names, DOUBLED split back by each
    request's input shape; the answers worked out with numpy."""
    tm.save(tm.RaggedBatch(), repo)
    h = harness(rb.config("m", "pytorch"))
    shapes = [(1, 2, 3), (2, 1, 2), (1, 4, 1)]
    requests = [
        h.request({"RAGGED": np.arange(np.prod(s), dtype=np.float32).reshape(s)}) for s in shapes
    ]
    results = h.execute(requests)
    for (_, response, _), want in zip(results, rb.expected(shapes), strict=True):
        got = h.outputs_of(response)
        assert set(got) == set(want)
        for name, value in want.items():
            assert got[name].shape == value.shape, name
            np.testing.assert_array_equal(got[name], value, err_msg=name)
    alone = h.infer({"RAGGED": np.ones((1, 2, 2), np.float32)}, ["DOUBLED", "COUNT_OUT"])
    assert alone["DOUBLED"].tolist() == [[[2.0, 2.0], [2.0, 2.0]]]
    assert alone["COUNT_OUT"].tolist() == [[4.0]]
    assert [b.batch_size for b in h.host.take_batches()] == [4, 1]
