"""KServe v2 JSON tensors for HTTP-fronted clients: inputs to arrays (clear errors), outputs back."""

from __future__ import annotations

import numpy as np
import pytest

from inferpool.client.kserve_json import array, output
from inferpool.wire.errors import Code, InferpoolError


def test_inputs_become_arrays_and_outputs_json() -> None:
    arr = array({"name": "INPUT0", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3, 4]})
    assert arr.dtype == np.float32 and arr.tolist() == [[1, 2], [3, 4]]
    assert output("OUTPUT0", arr) == {
        "name": "OUTPUT0",
        "datatype": "FP32",
        "shape": [2, 2],
        "data": [1.0, 2.0, 3.0, 4.0],
    }
    text = array({"name": "T", "datatype": "BYTES", "shape": [2], "data": ["a", "bé"]})
    assert output("T", text)["data"] == ["a", "bé"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"datatype": "FP32", "shape": [3], "data": [1, 2]}, r"2 values for shape \[3\]"),
        ({"datatype": "FP33", "shape": [1], "data": [1]}, "unknown datatype 'FP33'"),
        ({"datatype": "FP32", "shape": [-2], "data": [1]}, "shape"),
    ],
)
def test_a_bad_input_is_invalid_arg_naming_it(spec: dict, message: str) -> None:
    with pytest.raises(InferpoolError, match=message) as err:
        array({"name": "INPUT0", **spec})
    assert err.value.code is Code.INVALID_ARG
