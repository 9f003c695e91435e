"""Response headers from a model version's template: byte for byte what the full encoding
gives, and never the header of another response's outputs (names, datatypes, shapes)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from google.protobuf import text_format
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2 as pb

from inferpool.broker.front.response_header import (
    described,
    plain_header,
    response_header,
)
from inferpool.broker.models.registry import ModelVersion
from inferpool.wire.codec import encode_header
from inferpool.wire.worker.protocol import TensorRef

# two outputs of different datatypes (the responses' headers describe either or both)
OUTPUTS = "output [ { name: 'OUTPUT0' data_type: TYPE_UINT8 dims: [ -1 ] } ]\n" + (
    "output [ { name: 'OUTPUT1' data_type: TYPE_FP32 dims: [ -1 ] } ]"
)
CONFIG = "name: 'm' backend: 'identity' max_batch_size: 8\n" + OUTPUTS


@pytest.fixture
def model() -> ModelVersion:
    return ModelVersion("m", 3, text_format.Parse(CONFIG, pb.ModelConfig()), "/nonexistent")


def ref(name: str = "OUTPUT0", datatype: str = "UINT8", shape: Any = (1, 64)) -> TensorRef:
    return TensorRef(name, datatype, list(shape), "region", 0, 64)


def full(model: ModelVersion, client_id: Any, outputs: list[TensorRef]) -> bytes:
    """The header encoded in full, as a response with parameters is."""
    return encode_header(response_header(model, client_id, [described(o) for o in outputs], {}))


@pytest.mark.parametrize("client_id", ["7", "", 'a "quoted" id\n', 12, "ü"])
def test_a_templated_header_is_the_full_encoding(model: ModelVersion, client_id: Any) -> None:
    outputs = [ref(), ref("OUTPUT1", "FP32", (1, 16))]
    plain_header(model, "first", outputs)  # the template is made
    assert plain_header(model, client_id, outputs) == full(model, client_id, outputs)
    assert orjson.loads(plain_header(model, client_id, outputs))["id"] == client_id


@pytest.mark.parametrize(
    "changed",
    [
        [ref(shape=(1, 32))],  # another shape
        [ref(shape=(2, 64))],
        [ref("OUTPUT1", "FP32", (1, 64))],  # another output
        [ref(datatype="INT8")],  # another datatype
        [ref(), ref("OUTPUT1", "FP32", (1, 16))],  # one output more
        [],  # none
    ],
)
def test_a_template_never_gives_another_responses_outputs(
    model: ModelVersion, changed: list[TensorRef]
) -> None:
    plain_header(model, "1", [ref()])
    assert plain_header(model, "2", changed) == full(model, "2", changed)
    assert plain_header(model, "3", [ref()]) == full(model, "3", [ref()])  # and back


def test_each_model_version_has_its_own_template(model: ModelVersion) -> None:
    other = ModelVersion("other", 1, text_format.Parse(CONFIG, pb.ModelConfig()), "/nowhere")
    plain_header(model, "1", [ref()])
    header = orjson.loads(plain_header(other, "1", [ref()]))
    assert (header["model_name"], header["model_version"]) == ("other", "1")


refs = st.builds(
    ref,
    st.sampled_from(["OUTPUT0", "OUTPUT1"]),
    st.sampled_from(["UINT8", "FP32", "INT8"]),
    st.lists(st.integers(0, 3), min_size=1, max_size=2).flatmap(
        lambda dims: st.sampled_from([dims, tuple(dims)])
    ),
)
ids = st.one_of(st.text(max_size=4), st.integers(-(2**63), 2**63 - 1))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(ids, st.lists(refs, max_size=2)), min_size=1))
def test_every_header_of_a_stream_is_its_full_encoding(
    stream: list[tuple[Any, list[TensorRef]]],
) -> None:
    model = ModelVersion("m", 3, text_format.Parse(CONFIG, pb.ModelConfig()), "/nonexistent")
    for client_id, outputs in stream:
        assert plain_header(model, client_id, outputs) == full(model, client_id, outputs)
