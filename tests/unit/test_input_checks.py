"""A request's inputs checked as every path checks them (wire.contract): the broker's
admission and its own requests, a lane's worker, a client running an ensemble over lanes.
The messages are Triton's."""

from __future__ import annotations

from collections.abc import Callable

import orjson
import pytest

from inferpool.wire.contract import (
    InputChecks,
    check_output,
    input_spec,
    spec_entries,
    spec_of,
    specs_of,
)
from inferpool.wire.errors import Code, InferpoolError

SPECS = {
    "A": spec_of("A", "FP32", [4]),
    "B": spec_of("B", "INT32", [-1]),
    "T": spec_of("T", "BYTES", [1]),
}
REQUIRED = frozenset({"A", "B"})


def refused(call: Callable[..., object], *args: object) -> str:
    with pytest.raises(InferpoolError) as err:
        call(*args)
    assert err.value.code is Code.INVALID_ARG
    return err.value.message


def test_inputs_of_one_batch_size_give_their_byte_sizes_and_the_batch() -> None:
    checks = InputChecks("m", 8, REQUIRED)
    assert checks.add(SPECS["A"], "FP32", (2, 4)) == 32
    assert checks.add(SPECS["B"], "INT32", (2, 3)) == 24
    assert checks.add(SPECS["T"], "BYTES", (2, 1)) is None  # BYTES: any length
    assert checks.done() == 2


def test_a_model_that_does_not_batch_has_no_batch_size() -> None:
    checks = InputChecks("m", 0, REQUIRED)
    checks.add(SPECS["A"], "FP32", (4,))
    checks.add(SPECS["B"], "INT32", (7,))
    assert checks.done() == 0


def test_each_input_once_and_of_the_others_batch_size() -> None:
    checks = InputChecks("m", 8, REQUIRED)
    checks.add(SPECS["A"], "FP32", (2, 4))
    assert refused(checks.add, SPECS["A"], "FP32", (2, 4)) == (
        "input 'A' is given more than once for model 'm'"
    )
    assert refused(checks.add, SPECS["B"], "INT32", (3, 1)) == (
        "input 'B' batch size 3 does not match the other inputs' batch size 2 for model 'm'"
    )


def test_every_required_input_comes() -> None:
    checks = InputChecks("m", 0, REQUIRED)
    checks.add(SPECS["T"], "BYTES", (1,))
    assert refused(checks.done) == (
        "expected 2 inputs but got 1 inputs for model 'm'. Got input(s) ['T'], but missing "
        "required input(s) ['A', 'B']. Please provide all required input(s)."
    )


def test_datatype_and_shape_as_triton_words_them() -> None:
    checks = InputChecks("m", 8, REQUIRED)
    assert refused(checks.add, SPECS["A"], "FP64", (1, 4)) == (
        "inference input 'A' data-type is 'FP64', but model 'm' expects 'FP32'"
    )
    assert refused(checks.add, SPECS["B"], "INT32", (9, 1)) == (
        "inference request batch-size must be <= 8 for 'm'"
    )
    assert refused(InputChecks("m", 0, REQUIRED).add, SPECS["A"], "FP32", (5,)) == (
        "unexpected shape for input 'A' for model 'm'. Expected [4], got [5]"
    )


def test_unknown_inputs_and_outputs_by_name() -> None:
    assert input_spec("m", SPECS, "A") is SPECS["A"]
    assert refused(input_spec, "m", SPECS, "Z") == "unexpected inference input 'Z' for model 'm'"
    assert refused(input_spec, "m", SPECS, ["A"]) == (
        "unexpected inference input '['A']' for model 'm'"
    )
    assert check_output("m", {"OUT"}, "OUT") == "OUT"
    assert refused(check_output, "m", {"OUT"}, None) == (
        "unexpected inference output 'None' for model 'm'"
    )


def test_specs_cross_an_open_lane_answer_with_what_is_optional() -> None:
    optional = {**SPECS, "O": spec_of("O", "FP32", [2])}
    entries = spec_entries(optional.values())
    entries[-1]["optional"] = True
    read = specs_of(orjson.loads(orjson.dumps(entries)))
    assert list(read) == ["A", "B", "T", "O"]
    assert read["O"].optional and not read["A"].optional
    assert read["B"].variable and read["B"].dims == (-1,) and read["A"].itemsize == 4
