"""What the sequence batcher adds to a sequence model's requests (backends.sequence), and the
cancellation marks a backend reads (shm.cancel_flags)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from inferpool.backends.api import FLAG_SEQUENCE_END, FLAG_SEQUENCE_START, InputTensor
from inferpool.backends.sequence import SequenceInputs
from inferpool.shm.cancel_flags import WORDS, CancelFlags
from inferpool.shm.runs import new_run_id
from inferpool.wire.errors import InferpoolError


def config(batch: int, sequence: str) -> Any:
    text = (
        f'name: "m" backend: "identity" max_batch_size: {batch} sequence_batching {{ {sequence} }}'
    )
    return text_format.Parse(text, pb.ModelConfig())


CONTROLS = """
    control_input [
      { name: "S" control [ { kind: CONTROL_SEQUENCE_START bool_false_true: [ false, true ] } ] },
      { name: "E" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 5, 9 ] } ] },
      { name: "R" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] } ] },
      { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] } ]
"""


def values(inputs: dict[str, InputTensor]) -> dict[str, Any]:
    return {n: (t.shape, t.data.reshape(-1).tolist()) for n, t in inputs.items()}


def test_controls_follow_the_flags_in_each_encoding() -> None:
    seq = SequenceInputs(config(4, CONTROLS), "m", "/nowhere")
    inputs: dict[str, InputTensor] = {}
    seq.add_controls(inputs, "abc", FLAG_SEQUENCE_END, request_id="1")
    assert values(inputs) == {
        "S": ((1, 1), [False]),
        "E": ((1, 1), [9]),
        "R": ((1, 1), [1.0]),
        "C": ((1, 1), [b"abc"]),
    }
    assert not inputs["E"].data.flags.writeable and inputs["C"].byte_size == 7
    null: dict[str, InputTensor] = {}
    SequenceInputs(config(0, CONTROLS), "m", "/").add_controls(
        null, 0, FLAG_SEQUENCE_START, ready=False
    )
    assert values(null)["R"] == ((1,), [0.0]) and values(null)["S"] == ((1,), [False])


def test_initial_states_from_a_file_or_zeros(tmp_path: Path) -> None:
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "s.bin").write_bytes(np.array([3, 4], np.int32).tobytes())
    states = """
        state [ { input_name: "A_IN" output_name: "A_OUT" data_type: TYPE_INT32 dims: [ 2 ]
                  initial_state: { name: "i" data_type: TYPE_INT32 dims: [ 2 ] data_file: "s.bin" } },
                { input_name: "B_IN" output_name: "B_OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
    """
    inputs: dict[str, InputTensor] = {}
    SequenceInputs(config(2, states), "m", str(tmp_path)).add_initial_states(inputs)
    assert values(inputs) == {"A_IN": ((1, 2), [3, 4]), "B_IN": ((1, 1), [0.0])}


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ('initial_state: { name: "i" data_type: TYPE_INT32 dims: [ -1 ] zero_data: true }',
         "'initial_state' field for state input name 'IN' contains variable dimensions."),
        ('initial_state: { name: "i" data_type: TYPE_INT32 dims: [ 3 ] zero_data: true }',
         "'initial_state' dim for input name 'IN' doesn't match 'state' dim description. 3 != 2"),
        ('initial_state: { name: "i" data_type: TYPE_INT32 dims: [ 2, 1 ] zero_data: true }',
         "Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions "
         "for state input 'IN'. 2 != 1"),
        ('initial_state: { data_type: TYPE_INT32 dims: [ 2 ] zero_data: true }',
         "Field 'name' must be set when using initial_state for state input 'IN'."),
        ('initial_state: { name: "i" data_type: TYPE_INT32 dims: [ 2 ] data_file: "short" }',
         "initial_state setting expects 8 bytes, but the data provided from short only has 1 bytes"),
    ],
)  # fmt: skip
def test_initial_states_are_checked_as_triton_checks_them(
    tmp_path: Path, state: str, message: str
) -> None:
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "short").write_bytes(b"x")
    text = f'state [ {{ input_name: "IN" output_name: "OUT" data_type: TYPE_INT32 dims: [ 2 ] {state} }} ]'
    with pytest.raises(InferpoolError) as err:
        SequenceInputs(config(1, text), "m", str(tmp_path))
    assert err.value.message == message


def test_a_cancel_mark_names_one_request() -> None:
    flags = CancelFlags.create(new_run_id())
    try:
        reader = CancelFlags.attach(flags.region.name)
        assert not reader.is_cancelled(7)
        flags.cancel(7)
        assert reader.is_cancelled(7) and not reader.is_cancelled(7 + WORDS)
        flags.cancel(7 + WORDS)  # shares the word: the later mark wins, nobody is misreported
        assert reader.is_cancelled(7 + WORDS) and not reader.is_cancelled(7)
        assert not reader.is_cancelled(0)
        reader.close()
    finally:
        flags.close()
