from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferpool.wire import codec
from inferpool.wire.errors import Code, InferpoolError


def test_datatypes_round_trip_through_numpy() -> None:
    for name in codec.DATATYPES - {"BYTES"}:
        assert codec.datatype_of(codec.numpy_dtype(name)) == name
    assert codec.numpy_dtype("BF16") == np.dtype(ml_dtypes.bfloat16)
    assert codec.datatype_of(np.dtype(">f4")) == "FP32"  # byte order is the wire's business
    assert codec.datatype_of(np.array(["a"]).dtype) == "BYTES"
    assert codec.config_to_wire_datatype("TYPE_STRING") == "BYTES"
    assert codec.config_to_wire_datatype("TYPE_INT8") == "INT8"


def test_unknown_datatype_is_invalid_arg() -> None:
    with pytest.raises(InferpoolError) as err:
        codec.numpy_dtype("FP8")
    assert err.value.code is Code.INVALID_ARG and "unknown datatype 'FP8'" in err.value.message


@given(st.lists(st.binary(max_size=40), max_size=20))
def test_bytes_serialisation_round_trips(values: list[bytes]) -> None:
    data = codec.serialize_bytes(values)
    assert len(data) == codec.serialized_bytes_size(values)
    assert codec.deserialize_bytes(data, len(values)) == values


@pytest.mark.parametrize(
    "data, count, message",
    [
        (b"\x05\x00\x00\x00abc", 1, "element 0 claims 5 bytes but only 3 remain"),
        (b"\x01\x00\x00\x00a", 2, "data ends before element 1 of 2"),
        (b"\x01\x00\x00\x00ab", 1, "1 bytes left over after 1 elements"),
    ],
)
def test_malformed_bytes_are_named(data: bytes, count: int, message: str) -> None:
    with pytest.raises(InferpoolError, match=message):
        codec.deserialize_bytes(data, count, "input 'X'")


def test_array_from_buffer_is_a_view_and_checks_size() -> None:
    buf = bytearray(np.arange(6, dtype=np.int32).tobytes())
    arr = codec.array_from_buffer(buf, "INT32", [2, 3], "x")
    buf[0] = 7
    assert arr[0, 0] == 7 and arr.shape == (2, 3)
    with pytest.raises(InferpoolError, match="expected 28 bytes for INT32 shape \\[7\\], got 24"):
        codec.array_from_buffer(buf, "INT32", [7], "x")


def test_headers_decode_or_fail_cleanly() -> None:
    assert codec.decode_header(codec.encode_header({"a": np.int64(3)})) == {"a": 3}
    for raw, text in ((b"\xff", "not valid UTF-8 JSON"), (b"3", "got int"), (b"", "not valid")):
        with pytest.raises(InferpoolError, match=text):
            codec.decode_header(raw)


def test_errors_cross_the_wire_typed() -> None:
    err = InferpoolError(Code.NOT_FOUND, "no such model")
    assert InferpoolError.from_wire(err.to_wire()) == err
    assert str(err) == "NOT_FOUND: no such model"
    assert InferpoolError.from_wire({"code": "WHAT", "message": "m"}).code is Code.UNKNOWN
    assert InferpoolError.from_wire("text").code is Code.INTERNAL
    wrapped = InferpoolError.wrap(ValueError("bad"), Code.INVALID_ARG, "while x: ")
    assert wrapped.message == "while x: ValueError: bad" and wrapped.code is Code.INVALID_ARG


def test_torch_tensors_are_accepted_without_copy() -> None:
    torch = pytest.importorskip("torch")
    t = torch.arange(4, dtype=torch.float32)
    arr = codec.as_array(t)
    t[0] = 9
    assert arr[0] == 9 and codec.datatype_of(arr.dtype) == "FP32"
