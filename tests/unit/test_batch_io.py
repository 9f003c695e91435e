"""backends.batch_io: each batch input kind and the batch output split, on the examples of
Triton's model_config.proto and ragged-batching guide."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from inferpool.backends.api import Request, RequestedOutput
from inferpool.backends.batch_io import BatchIO
from inferpool.backends.tensor_data import input_tensor
from inferpool.backends.testing import HeapMemory
from inferpool.wire.errors import Code, InferpoolError

KINDS = [
    "BATCH_ELEMENT_COUNT",
    "BATCH_ACCUMULATED_ELEMENT_COUNT",
    "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO",
    "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE",
    "BATCH_ITEM_SHAPE",
    "BATCH_ITEM_SHAPE_FLATTEN",
]


def batch_io(dims: str = "[ -1, -1 ]", data_type: str = "TYPE_INT32") -> BatchIO:
    inputs = ", ".join(
        f'{{ kind: {k} target_name: "{k}" data_type: {data_type} source_input: "X" }}'
        for k in KINDS
    )
    config = text_format.Parse(
        f"""
        name: "m" max_batch_size: 8
        input [ {{ name: "X" data_type: TYPE_FP32 dims: {dims} allow_ragged_batch: true }} ]
        output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ -1, 2 ] }} ]
        batch_input [ {inputs} ]
        batch_output [ {{ target_name: "Y" source_input: "X" }} ]
        """,
        pb.ModelConfig(),
    )
    return BatchIO(config)


def requests(*shapes: tuple[int, ...]) -> list[Request]:
    memory = HeapMemory()
    return [
        Request(
            id=str(i),
            inputs={"X": input_tensor("X", "FP32", np.zeros(shape, np.float32))},
            requested_outputs={"Y": RequestedOutput("Y")},
            memory=memory,
            emit=lambda *_: None,
        )
        for i, shape in enumerate(shapes)
    ]


def test_every_kind_as_the_proto_describes_it() -> None:
    """A batch-2 input of shape [3, 1] and a batch-1 one of shape [2, 2] (the proto's)."""
    built = batch_io().build(requests((2, 3, 1), (1, 2, 2)))
    assert {k: (v.dtype, v.shape, v.tolist()) for k, v in built.items() if "MAX" not in k} == {
        "BATCH_ELEMENT_COUNT": (np.dtype(np.int32), (2,), [6, 4]),
        "BATCH_ACCUMULATED_ELEMENT_COUNT": (np.dtype(np.int32), (2,), [6, 10]),
        "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO": (np.dtype(np.int32), (3,), [0, 6, 10]),
        "BATCH_ITEM_SHAPE": (np.dtype(np.int32), (3, 2), [[3, 1], [3, 1], [2, 2]]),
        "BATCH_ITEM_SHAPE_FLATTEN": (np.dtype(np.int32), (6,), [3, 1, 3, 1, 2, 2]),
    }
    assert built["BATCH_MAX_ELEMENT_COUNT_AS_SHAPE"].shape == (6,)  # only its shape counts


def test_the_guides_example_in_fp32() -> None:
    """Requests of 3, 4 and 5 elements: INDEX [3, 7, 12]."""
    built = batch_io("[ -1 ]", "TYPE_FP32").build(requests((1, 3), (1, 4), (1, 5)))
    index = built["BATCH_ACCUMULATED_ELEMENT_COUNT"]
    assert index.dtype == np.float32 and index.tolist() == [3.0, 7.0, 12.0]
    assert batch_io("[ -1 ]").shape_key(requests((1, 3))[0].inputs["X"], True) == ()


def test_a_ragged_input_is_flat_and_an_output_splits_by_its_shape() -> None:
    io = batch_io()
    batch = requests((1, 3, 2), (2, 1, 2))
    assert BatchIO.flat(np.zeros((1, 3, 2))).shape == (6,)
    parts = io.scatter("Y", np.arange(10), batch)  # dims [-1, 2]: [batch, the input's, 2]
    assert [p.tolist() for p in parts] == [[[[0, 1], [2, 3], [4, 5]]], [[[6, 7]], [[8, 9]]]]
    with pytest.raises(InferpoolError) as info:
        io.scatter("Y", np.arange(9), batch)
    assert info.value.code == Code.INTERNAL
    assert info.value.message == (
        "output 'Y' holds 9 elements, fewer than the 10 the shapes of input 'X' take"
    )
