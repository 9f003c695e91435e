"""Checked once per request signature (backends.pytorch.shape_checks): a lone request of a known
signature skips the checks it passed before and is answered as the first was; any other
signature, and every model output, is checked in full."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch_models as tm
from torch import Tensor, nn

from inferpool.backends.api import Request
from inferpool.backends.pytorch import shape_checks as plans
from inferpool.backends.testing import BackendHarness

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")

LINEAR = tm.config(
    [tm.inp("INPUT__0", "TYPE_FP32", [4])],
    [tm.out("OUTPUT__0", "TYPE_FP32", [2])],
    max_batch_size=8,
)


def expected(x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return tm.Linear()(torch.from_numpy(x)).numpy()


def counted_checks(h: BackendHarness) -> list[int]:
    """How many requests the instance has checked in full, counted as they come."""
    assembler = h.host.instance.assembler  # type: ignore[union-attr]
    prepare, seen = assembler.prepare, [0]

    def counting(request: Any) -> Any:
        seen[0] += 1
        return prepare(request)

    assembler.prepare = counting
    return seen


def test_a_known_signature_is_checked_once_and_answered_as_the_first(repo, harness):
    tm.save(tm.Linear(), repo)
    h = harness(LINEAR)
    checks = counted_checks(h)
    rng = np.random.default_rng(0)
    for _ in range(3):
        x = rng.random((2, 4), dtype=np.float32)
        request = h.request({"INPUT__0": x})
        [(_, response, final)] = h.execute([request])
        assert final and response is not None
        np.testing.assert_allclose(h.outputs_of(response)["OUTPUT__0"], expected(x), rtol=1e-6)
        timing = h.host.timing_of(request)
        assert timing is not None and timing.success
        assert [b.batch_size for b in h.host.take_batches()] == [2]
    assert checks == [1]
    h.infer({"INPUT__0": np.ones((3, 4), np.float32)})  # another shape: another signature
    assert checks == [2]


def test_every_other_signature_gets_the_full_checks_and_their_errors(repo, harness):
    tm.save(tm.Linear(), repo)
    h = harness(LINEAR)
    x = np.ones((1, 4), np.float32)
    h.infer({"INPUT__0": x})  # its plan is made
    bad = {
        "inference input 'INPUT__0' data-type is 'FP64', but model 'm' expects 'FP32'": {
            "INPUT__0": x.astype(np.float64)
        },
        "unexpected shape for input 'INPUT__0' for model 'm'. Expected [-1,4], got [1,5]": {
            "INPUT__0": np.ones((1, 5), np.float32)
        },
        "unexpected inference input 'EXTRA' for model 'm'": {"INPUT__0": x, "EXTRA": x},
        "missing required input(s) ['INPUT__0']": {"OTHER": x},
        "inference request batch-size must be <= 8 for 'm', got 9": {
            "INPUT__0": np.ones((9, 4), np.float32)
        },
    }
    for message, inputs in bad.items():
        [(_, response, _)] = h.execute([h.request(inputs)])
        assert response is not None and message in str(response.error)
        h.host.take_batches()
    np.testing.assert_allclose(h.infer({"INPUT__0": x})["OUTPUT__0"], expected(x), rtol=1e-6)


def test_the_outputs_asked_for_are_part_of_the_signature(repo, harness):
    tm.save(tm.AddSub(), repo)
    outputs = [tm.out("OUTPUT__0", "TYPE_FP32", [2]), tm.out("OUTPUT__1", "TYPE_FP32", [2])]
    h = harness(tm.config([tm.inp("a", "TYPE_FP32", [2]), tm.inp("b", "TYPE_FP32", [2])], outputs))
    a, b = np.array([3, 4], np.float32), np.array([1, 1], np.float32)
    for wanted in (["OUTPUT__0"], ["OUTPUT__0", "OUTPUT__1"], ["OUTPUT__1"], ["OUTPUT__0"]):
        got = h.infer({"a": a, "b": b}, wanted)
        assert sorted(got) == sorted(wanted)
        for name, value in got.items():
            np.testing.assert_array_equal(value, a + b if name == "OUTPUT__0" else a - b)


def test_a_dict_input_and_a_reshape_go_through_a_plan(repo, harness):
    tm.save(tm.DictInput(), repo)
    h = harness(tm.DICT_INPUT)
    for k in range(3):
        x, y = np.arange(6).reshape(2, 3) + k, np.full((2, 3), 10)
        np.testing.assert_array_equal(h.infer({"y": y, "x": x})["OUTPUT__0"], x * 2 + y)

    class Flat(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            return x.sum(dim=(1, 2)).reshape(-1, 1)

    tm.save(Flat(), repo)
    g = harness(
        tm.config(
            [tm.inp("INPUT__0", "TYPE_FP32", [4], "reshape: { shape: [2, 2] }")],
            [tm.out("OUTPUT__0", "TYPE_FP32", [1])],
            max_batch_size=4,
        )
    )
    for k in range(3):
        xk = np.arange(8, dtype=np.float32).reshape(2, 4) + k
        np.testing.assert_array_equal(
            g.infer({"INPUT__0": xk})["OUTPUT__0"], xk.sum(1, keepdims=True)
        )


class Rows(nn.Module):
    """As many rows out as its first element says: right or wrong for the same signature."""

    def forward(self, x: Tensor) -> Tensor:
        return x[:, :2].repeat(int(x[0, 0].item()), 1)


def test_the_model_outputs_are_checked_on_every_execution(repo, harness):
    tm.save(Rows(), repo)
    h = harness(LINEAR)
    good, wrong = np.ones((1, 4), np.float32), np.full((1, 4), 2, np.float32)
    for x in (good, wrong, good):
        [(_, response, _)] = h.execute([h.request({"INPUT__0": x})])
        assert response is not None
        if x is wrong:
            assert "has 2 rows in its batch dimension, but the batch holds 1" in str(response.error)
            assert not response.outputs  # what it had written was given back
        else:
            np.testing.assert_array_equal(h.outputs_of(response)["OUTPUT__0"], x[:, :2])
    assert len(h.host.take_batches()) == 3


def test_plans_are_bounded_and_none_is_made_for_strings(
    repo, harness: Callable[..., BackendHarness]
):
    class Double(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            return x * 2

    tm.save(Double(), repo)
    h = harness(
        tm.config([tm.inp("INPUT__0", "TYPE_FP32", [-1])], [tm.out("OUTPUT__0", "TYPE_FP32", [-1])])
    )
    known = h.host.instance.plans  # type: ignore[union-attr]
    for n in range(1, plans.LIMIT + 6):
        x = np.arange(n, dtype=np.float32)
        np.testing.assert_array_equal(h.infer({"INPUT__0": x})["OUTPUT__0"], x * 2)
        assert len(known._known) == min(n, plans.LIMIT)

    tm.save(tm.Upper(), repo)
    words = tm.config(
        [tm.inp("INPUT__0", "TYPE_STRING", [1], "reshape: { shape: [] }")],
        [
            tm.out("OUTPUT__0", "TYPE_STRING", [1], "reshape: { shape: [] }"),
            tm.out("OUTPUT__1", "TYPE_INT64", [1]),
        ],
        max_batch_size=8,
    )
    s = harness(words)
    for _ in range(2):
        got = s.infer({"INPUT__0": np.array([[b"ab"]], dtype=object)}, ["OUTPUT__0"])
        assert got["OUTPUT__0"].tolist() == [[b"AB"]]
    [(_, response, _)] = s.execute([s.request({"INPUT__0": np.array([[b"\xff"]], dtype=object)})])
    assert response is not None
    assert "element 0 of input 'INPUT__0' is not valid UTF-8" in str(response.error)
    assert not s.host.instance.plans._known  # type: ignore[union-attr]


def again(h: BackendHarness, first: Request, outputs: list[str] | None = None) -> Request:
    """A request over the very input objects of ``first``, as a worker hands out one object
    for every request naming the same place (WorkerMemory.batch_input, a lane's plan)."""
    request = h.request({}, outputs)
    request.inputs = dict(first.inputs)
    return request


def answer(h: BackendHarness, request: Request) -> dict[str, np.ndarray]:
    [(_, response, _)] = h.execute([request])
    assert response is not None
    h.host.take_batches()
    return h.outputs_of(response)


def test_an_input_object_keeps_its_tensor_and_each_request_gets_a_view_of_its_own(repo, harness):
    tm.save(tm.GrowsItsInput(), repo)
    h = harness(
        tm.config(
            [tm.inp("INPUT__0", "TYPE_FP32", [4])],
            [tm.out("OUTPUT__0", "TYPE_FP32", [4])],
            max_batch_size=8,
        )
    )
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    first = h.request({"INPUT__0": x})
    given = first.inputs["INPUT__0"]
    for request in (first, again(h, first), again(h, first)):  # checked, planned, planned
        got = answer(h, request)["OUTPUT__0"]
        # the model grew its own tensor's shape, not the one the next request is given
        assert got.shape == (1, 4)
        np.testing.assert_array_equal(got, x * 2)
    made = given.made
    assert made is not None and made[0] is given.data  # made once, kept with the input
    y = np.full((1, 4), 5, np.float32)
    y.flags.writeable = False
    given.data = y  # another array: the tensor kept is not its
    np.testing.assert_array_equal(answer(h, again(h, first))["OUTPUT__0"], y * 2)
    assert given.made[0] is y
    for other in (torch.from_numpy, lambda a: torch.zeros(a.shape)):  # another maker's
        assert torch.equal(plans.over(given, other), other(y))


def test_the_last_plan_serves_only_the_same_input_objects_asking_the_same_outputs(repo, harness):
    tm.save(tm.AddSub(), repo)
    outputs = [tm.out("OUTPUT__0", "TYPE_FP32", [-1]), tm.out("OUTPUT__1", "TYPE_FP32", [-1])]
    inputs = [tm.inp("a", "TYPE_FP32", [-1]), tm.inp("b", "TYPE_FP32", [-1])]
    h = harness(tm.config(inputs, outputs))
    a, b = np.array([3, 4], np.float32), np.array([1, 1], np.float32)
    first = h.request({"a": a, "b": b}, ["OUTPUT__0"])
    assert sorted(answer(h, first)) == ["OUTPUT__0"]
    for wanted in (["OUTPUT__0"], ["OUTPUT__0", "OUTPUT__1"], ["OUTPUT__1"], ["OUTPUT__0"]):
        got = answer(h, again(h, first, wanted))
        assert sorted(got) == sorted(wanted)
        for name, value in got.items():
            np.testing.assert_array_equal(value, a + b if name == "OUTPUT__0" else a - b)
    longer = h.request({"a": np.arange(3, dtype=np.float32), "b": np.ones(3, np.float32)})
    for request in (longer, again(h, longer)):  # other objects, of another shape: checked
        np.testing.assert_array_equal(answer(h, request)["OUTPUT__1"], np.arange(3) - 1)
    # the plan found last does not keep its inputs (nor the memory they see) alive
    gone = weakref.ref(longer.inputs["a"])
    del longer, request
    h.responses.clear()  # the harness's record of what it answered
    gc.collect()
    assert gone() is None
    np.testing.assert_array_equal(answer(h, again(h, first))["OUTPUT__0"], a + b)
