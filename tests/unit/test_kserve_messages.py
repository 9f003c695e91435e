"""The KServe frontends' translations, without a server: an HTTP body or a gRPC request into
the zmq protocol's infer message, and a reply back; what only a frontend can check is
refused in Triton's words."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
from tritonclient.grpc import service_pb2 as pb

from inferpool.broker.kserve.grpc_infer import (
    infer_message,
    infer_response,
    parameters,
    set_parameters,
)
from inferpool.broker.kserve.http_infer import (
    bytes_to_json,
    json_to_bytes,
    parse_body,
    response_body,
)
from inferpool.wire.errors import Code, InferpoolError


def http(request: dict[str, Any], *tensors: bytes) -> tuple[bytes, int | None]:
    head = orjson.dumps(request)
    return head + b"".join(tensors), len(head) if tensors else None


def refused(code: Code = Code.INVALID_ARG) -> Any:
    return pytest.raises(InferpoolError, check=lambda e: e.code is code)


# ============================================================================ HTTP requests
def test_http_inputs_from_json_binary_and_regions() -> None:
    body, length = http(
        {
            "id": "a",
            "inputs": [
                {"name": "J", "datatype": "INT32", "shape": [2, 2], "data": [[1, 2], [3, 4]]},
                {
                    "name": "B",
                    "datatype": "UINT8",
                    "shape": [3],
                    "parameters": {"binary_data_size": 3},
                },
                {
                    "name": "S",
                    "datatype": "FP32",
                    "shape": [1],
                    "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 4},
                },
            ],
            "outputs": [{"name": "O", "parameters": {"binary_data": True}}],
            "parameters": {"sequence_id": 5, "binary_data_output": False},
        },
        b"\x01\x02\x03",
    )
    call = parse_body(body, length, "m", "2")
    header = call.header
    assert (header["type"], header["id"], header["model_name"], header["model_version"]) == (
        "infer",
        "a",
        "m",
        "2",
    )
    assert header["single_response"] is True and header["parameters"] == {"sequence_id": 5}
    assert [i.get("parameters") for i in header["inputs"]] == [
        None,
        None,
        {"shared_memory_region": "r", "shared_memory_byte_size": 4},
    ]
    json_frame, binary_frame = call.frames  # the region's input brings no frame
    assert np.frombuffer(json_frame, np.int32).tolist() == [1, 2, 3, 4]
    assert isinstance(binary_frame, memoryview) and binary_frame.obj is body  # a slice, no copy
    assert bytes(binary_frame) == b"\x01\x02\x03"
    assert call.binary == {"O": True} and call.binary_default is False


@pytest.mark.parametrize(
    "inputs,tensors,length,message",
    [
        ([{"name": "X", "datatype": "FP32", "shape": [1]}], b"", None, "But no field is set"),
        (
            [
                {
                    "name": "X",
                    "datatype": "FP32",
                    "shape": [1],
                    "data": [1],
                    "parameters": {"binary_data_size": 4},
                }
            ],
            b"\x00" * 4,
            "header",
            "But set 'data' 'binary_data_size'",
        ),
        (
            [
                {
                    "name": "X",
                    "datatype": "FP32",
                    "shape": [1],
                    "parameters": {"binary_data_size": 4},
                }
            ],
            b"",
            None,
            "must specify valid 'Infer-Header-Content-Length'",
        ),
        (
            [
                {
                    "name": "X",
                    "datatype": "FP32",
                    "shape": [1],
                    "parameters": {"binary_data_size": 8},
                }
            ],
            b"\x00" * 4,
            "header",
            "unexpected size for input 'X', expecting 4 additional bytes for model 'm'",
        ),
        (
            [
                {
                    "name": "X",
                    "datatype": "FP32",
                    "shape": [1],
                    "parameters": {"binary_data_size": 4},
                }
            ],
            b"\x00" * 6,
            "header",
            "unexpected additional input data for model 'm'",
        ),
        (
            [{"name": "X", "datatype": "FP32", "shape": ["1"], "data": [1]}],
            b"",
            None,
            "shape must be",
        ),
        (
            [{"name": "X", "datatype": "FP32", "shape": [3], "data": [1, 2]}],
            b"",
            None,
            "shape does not match",
        ),
        (
            [{"name": "X", "datatype": "FP16", "shape": [1], "data": [1]}],
            b"",
            None,
            "receiving FP16 data via JSON is not supported",
        ),
        (
            [{"name": "X", "datatype": "INT8", "shape": [1], "data": ["x"]}],
            b"",
            None,
            "Unable to parse 'data' of input 'X'",
        ),
    ],
)
def test_http_inputs_refused_in_tritons_words(
    inputs: list[dict[str, Any]], tensors: bytes, length: str | None, message: str
) -> None:
    head = orjson.dumps({"inputs": inputs})
    with refused() as err:
        parse_body(head + tensors, len(head) if length else None, "m", "")
    assert message in err.value.message


def test_http_request_level_refusals() -> None:
    for body, message in [
        (b"{nope", "failed to parse the request JSON buffer"),
        (b"[]", "expected an object"),
        (b'{"inputs": 1}', "Unable to parse 'inputs'"),
        (b'{"inputs": [], "id": 3}', "Unable to parse 'id'"),
        (b'{"inputs": [], "parameters": {"triton_x": 1}}', "reserved for Triton usage"),
        (
            b'{"inputs": [], "outputs": [{"name": "O", "parameters": {"shared_memory_region": "r", "binary_data": true}}]}',
            "can't set both 'shared_memory_region' and 'binary_data'",
        ),
    ]:
        with refused() as err:
            parse_body(body, None, "m", "")
        assert message in err.value.message, body


def test_json_tensors_both_ways() -> None:
    words = json_to_bytes("W", "BYTES", [2], ["ab", "\u00fc"])
    assert words == b"\x02\x00\x00\x00ab\x02\x00\x00\x00\xc3\xbc"
    assert bytes_to_json("W", "BYTES", [2], words) == ["ab", "\u00fc"]
    assert json_to_bytes("B", "BOOL", [2], [True, False]) == b"\x01\x00"
    assert bytes_to_json("F", "FP32", [2], np.array([1.5, -2], np.float32).tobytes()) == [1.5, -2.0]
    with refused() as err:
        bytes_to_json("W", "BYTES", [1], b"\x01\x00\x00\x00\xff")
    assert "request it with binary_data" in err.value.message


def test_http_answer_binary_json_and_regions() -> None:
    body, _ = http(
        {
            "id": "q",
            "inputs": [],
            "outputs": [{"name": "A"}, {"name": "B", "parameters": {"binary_data": True}}],
        }
    )
    call = parse_body(body, None, "m", "")
    reply = {
        "model_name": "m",
        "model_version": "1",
        "parameters": {"p": 1},
        "outputs": [
            {
                "name": "R",
                "datatype": "FP32",
                "shape": [1],
                "parameters": {
                    "shared_memory_region": "r",
                    "shared_memory_offset": 0,
                    "shared_memory_byte_size": 4,
                },
            },
            {"name": "A", "datatype": "INT32", "shape": [2], "parameters": {}},
            {"name": "B", "datatype": "UINT8", "shape": [2]},
        ],
    }
    head, binaries = response_body(
        call, reply, [memoryview(np.array([7, 8], np.int32).tobytes()), memoryview(b"\x09\x0a")]
    )
    answer = orjson.loads(head)
    assert answer["id"] == "q" and answer["parameters"] == {"p": 1}
    region, json_out, binary_out = answer["outputs"]
    assert "data" not in region and region["parameters"]["shared_memory_byte_size"] == 4
    assert json_out["data"] == [7, 8]
    assert binary_out["parameters"] == {"binary_data_size": 2} and [bytes(b) for b in binaries] == [
        b"\x09\x0a"
    ]


# ============================================================================ gRPC requests
def test_grpc_raw_typed_and_region_inputs() -> None:
    request = pb.ModelInferRequest(model_name="m", model_version="3", id="g")
    request.inputs.add(name="R", datatype="FP32", shape=[1])
    region = request.inputs.add(name="S", datatype="FP32", shape=[1])
    region.parameters["shared_memory_region"].string_param = "r"
    request.raw_input_contents.append(b"\x00\x00\x80\x3f")
    request.outputs.add(name="O").parameters["shared_memory_region"].string_param = "out"
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    request.parameters["priority"].int64_param = 2
    header, frames, empty_final, classes = infer_message(request, single_response=False)
    assert empty_final is True and classes == {} and "single_response" not in header
    assert header["parameters"] == {"priority": 2}
    assert header["inputs"][1]["parameters"] == {"shared_memory_region": "r"}
    assert header["outputs"] == [{"name": "O", "parameters": {"shared_memory_region": "out"}}]
    assert frames == [b"\x00\x00\x80\x3f"]
    typed = pb.ModelInferRequest(model_name="m")
    words = typed.inputs.add(name="W", datatype="BYTES", shape=[2])
    words.contents.bytes_contents.extend([b"a", b"bc"])
    ints = typed.inputs.add(name="I", datatype="INT16", shape=[2])
    ints.contents.int_contents.extend([-1, 2])
    frames = infer_message(typed, single_response=True).frames
    assert frames == [b"\x01\x00\x00\x00a\x02\x00\x00\x00bc", np.array([-1, 2], np.int16).tobytes()]


def test_grpc_inputs_refused_in_tritons_words() -> None:
    def request(**fields: Any) -> pb.ModelInferRequest:
        return pb.ModelInferRequest(model_name="m", **fields)

    missing = request()
    missing.inputs.add(name="X", datatype="FP32", shape=[1])
    both = request(raw_input_contents=[b"1234"])
    both.inputs.add(name="X", datatype="FP32", shape=[1]).contents.fp32_contents.append(1)
    extra = request(raw_input_contents=[b"1234", b"5678"])
    extra.inputs.add(name="X", datatype="FP32", shape=[1])
    shm_and_contents = request()
    x = shm_and_contents.inputs.add(name="X", datatype="FP32", shape=[1])
    x.parameters["shared_memory_region"].string_param = "r"
    x.contents.fp32_contents.append(1)
    half = request()
    half.inputs.add(name="X", datatype="FP16", shape=[1]).contents.fp32_contents.append(1)
    reserved = request()
    reserved.parameters["triton_other"].bool_param = True
    for req, message in [
        (missing, "unable to find data for input tensor 'X' for model 'm' in request."),
        (both, "contents field must not be specified when using raw_input_contents for 'X'"),
        (extra, "has 2 raw_input_contents but its inputs use 1"),
        (shm_and_contents, "unexpected 'content' provided when using shared memory"),
        (half, "of type 'FP32', expected datatype 'FP16'"),
        (reserved, "Only the following keys starting with 'triton_' are allowed"),
    ]:
        with refused() as err:
            infer_message(req, single_response=True)
        assert message in err.value.message


def test_grpc_answer_keeps_one_raw_entry_per_output() -> None:
    reply = {
        "id": "g",
        "model_name": "m",
        "model_version": "1",
        "parameters": {"s": "x", "b": True, "f": 0.5, "big": 1 << 63},
        "outputs": [
            {
                "name": "R",
                "datatype": "FP32",
                "shape": [1],
                "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 4},
            },
            {"name": "A", "datatype": "UINT8", "shape": [2]},
        ],
    }
    answer = infer_response(reply, [memoryview(b"\x01\x02")], final=True)
    response = pb.ModelStreamInferResponse.FromString(answer).infer_response
    assert list(response.raw_output_contents) == [b"", b"\x01\x02"]
    assert parameters(response.outputs[0].parameters)["shared_memory_region"] == "r"
    sent = reply["parameters"]
    assert isinstance(sent, dict)
    assert parameters(response.parameters) == {**sent, "triton_final_response": True}
    assert response.parameters["big"].WhichOneof("parameter_choice") == "uint64_param"


def test_parameters_round_trip() -> None:
    message = pb.ModelInferRequest()
    values = {"b": False, "i": -3, "f": 1.25, "s": "x"}
    set_parameters(message.parameters, values)
    assert parameters(message.parameters) == values
