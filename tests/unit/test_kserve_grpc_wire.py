"""grpc_wire against protobuf's own encoding: a request read with its raw inputs as views is
the request protobuf parses, a message protobuf refuses is refused, and an answer built at
the wire format is the answer protobuf decodes."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.message import DecodeError
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from inferpool.broker.kserve.grpc_wire import MAX_FIELDS, answer_bytes, read_infer

names = st.text(max_size=12)
blobs = st.binary(max_size=300)
params = st.dictionaries(
    names,
    st.one_of(
        st.booleans().map(lambda v: {"bool_param": v}),
        st.integers(-(1 << 63), (1 << 63) - 1).map(lambda v: {"int64_param": v}),
        names.map(lambda v: {"string_param": v}),
        st.floats(allow_nan=False).map(lambda v: {"double_param": v}),
    ),
    max_size=3,
)
tensors = st.fixed_dictionaries(
    {
        "name": names,
        "datatype": st.sampled_from(["UINT8", "FP32", "BYTES"]),
        "shape": st.lists(st.integers(-1, 1 << 40), max_size=4),
        "parameters": params,
    }
)


@st.composite
def requests(draw: Any) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(
        model_name=draw(names),
        model_version=draw(names),
        id=draw(names),
        raw_input_contents=draw(st.lists(blobs, max_size=4)),
    )
    for key, value in draw(params).items():
        request.parameters[key].MergeFrom(pb.InferParameter(**value))
    for entry in draw(st.lists(tensors, max_size=3)):
        tensor = request.inputs.add(
            name=entry["name"], datatype=entry["datatype"], shape=entry["shape"]
        )
        for key, value in entry["parameters"].items():
            tensor.parameters[key].MergeFrom(pb.InferParameter(**value))
    for name in draw(st.lists(names, max_size=2)):
        request.outputs.add(name=name)
    return request


def parsed(data: bytes) -> tuple[pb.ModelInferRequest, list[bytes]]:
    """What protobuf makes of ``data``: the request without its raw inputs, and those."""
    request = pb.ModelInferRequest.FromString(data)
    raw = list(request.raw_input_contents)
    del request.raw_input_contents[:]
    return request, raw


def read(data: bytes) -> tuple[pb.ModelInferRequest, list[bytes]]:
    call = read_infer(data)
    request = pb.ModelInferRequest()
    request.CopyFrom(call.request)
    del request.raw_input_contents[:]
    return request, [bytes(view) for view in call.raw]


@settings(max_examples=300, deadline=None)
@given(st.lists(requests(), min_size=1, max_size=3))
def test_a_request_reads_as_protobuf_parses_it(parts: list[pb.ModelInferRequest]) -> None:
    """Serialized requests, concatenated (fields in any order, raw inputs among the others:
    protobuf merges them), read as protobuf parses them; the raw inputs are views of the
    message, not copies."""
    data = b"".join(part.SerializeToString() for part in parts)
    assert read(data) == parsed(data)
    for view in read_infer(data).raw:
        assert view.obj is data


def test_a_flood_of_fields_is_parsed_by_protobuf() -> None:
    """A message of more fields than a request has is protobuf's to parse (in C), not read
    field by field here, one view per raw input."""
    flood = pb.ModelInferRequest(raw_input_contents=[b"x"] * (MAX_FIELDS + 1))
    data = flood.SerializeToString()
    call = read_infer(data)
    assert [bytes(view) for view in call.raw] == [b"x"] * (MAX_FIELDS + 1)
    assert all(view.obj is not data for view in call.raw)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=120))
@example(b"\xff\xff\xff\xff\x0f")  # field number 0, a truncated varint
@example(b"\x3a\x05abc")  # a raw input longer than the message
@example(b"\x3a\x01a\x0b\x0c")  # a group after a raw input
@example(b"\x38\x01\x3a\x00")  # field 7 as a varint, then as bytes
def test_any_bytes_read_as_protobuf_parses_them_or_are_refused_alike(data: bytes) -> None:
    try:
        expected = parsed(data)
    except DecodeError:
        with pytest.raises(DecodeError):
            read_infer(data)
        return
    assert read(data) == expected


@settings(max_examples=200, deadline=None)
@given(requests(), st.lists(blobs, max_size=4), st.booleans(), st.sampled_from([0, 200, 70000]))
def test_an_answer_decodes_as_protobuf_serializes_it(
    request: pb.ModelInferRequest, raw: list[bytes], streamed: bool, big: int
) -> None:
    """The answer's fields (a request's stand in for them: names, ids, parameters) and its
    raw outputs, one of them past a varint's two bytes."""
    response = pb.ModelInferResponse(
        model_name=request.model_name, model_version=request.model_version, id=request.id
    )
    for key, value in request.parameters.items():
        response.parameters[key].CopyFrom(value)
    for tensor in request.inputs:
        response.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
    raw = [*raw, bytes(big)]
    data = answer_bytes(response, [memoryview(b) for b in raw], streamed=streamed)
    expected = pb.ModelInferResponse()
    expected.CopyFrom(response)
    expected.raw_output_contents.extend(raw)
    if streamed:
        assert pb.ModelStreamInferResponse.FromString(data) == pb.ModelStreamInferResponse(
            infer_response=expected
        )
    else:
        assert pb.ModelInferResponse.FromString(data) == expected
