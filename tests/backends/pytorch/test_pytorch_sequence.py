"""Sequence models: control inputs from request flags/correlation ids, and implicit state."""

from __future__ import annotations

import numpy as np
import pytest
import torch_models as tm

from inferpool.backends.api import FLAG_SEQUENCE_END, FLAG_SEQUENCE_START
from inferpool.wire.errors import Code, InferpoolError

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


def test_state_accumulates_and_controls_come_from_flags(repo, harness):
    tm.save(tm.Accumulate(), repo)
    h = harness(tm.accumulate_config())
    first = h.infer(
        {"INPUT__0": np.array([2.0], np.float32)}, flags=FLAG_SEQUENCE_START, correlation_id=42
    )
    assert first["OUTPUT__0"].tolist() == [2.0]
    assert first["CONTROLS__1"].tolist() == [1, 0, 1, 42]  # START, END, READY, CORRID
    assert first["STATE_OUT__2"].tolist() == [2.0]  # returned for the sequence batcher
    last = h.infer(
        {"INPUT__0": np.array([3.0], np.float32), "STATE_IN__5": first["STATE_OUT__2"]},
        flags=FLAG_SEQUENCE_END,
        correlation_id="42",
    )
    assert last["OUTPUT__0"].tolist() == [5.0]
    assert last["CONTROLS__1"].tolist() == [0, 1, 1, 42]


def test_explicit_control_tensors_win_over_flags(repo, harness):
    tm.save(tm.Accumulate(), repo)
    h = harness(tm.accumulate_config())
    out = h.infer(
        {"INPUT__0": np.array([1.0], np.float32), "END__2": np.array([1.0], np.float32)},
        flags=FLAG_SEQUENCE_START,
        correlation_id=7,
    )
    assert out["CONTROLS__1"].tolist() == [1, 1, 1, 7]


def test_sequences_batched_together_keep_their_own_state(repo, harness):
    tm.save(tm.Accumulate(), repo)
    h = harness(tm.accumulate_config(max_batch_size=4))
    requests = [
        h.request(
            {"INPUT__0": np.array([[1.0]], np.float32)}, flags=FLAG_SEQUENCE_START, correlation_id=1
        ),
        h.request(
            {
                "INPUT__0": np.array([[1.0], [2.0]], np.float32),
                "STATE_IN__5": np.array([[10.0], [20.0]], np.float32),
            },
            correlation_id=2,
        ),
    ]
    out = [h.outputs_of(r) for _, r, _ in h.execute(requests)]
    assert out[0]["OUTPUT__0"].tolist() == [[1.0]]
    assert out[1]["OUTPUT__0"].tolist() == [[11.0], [22.0]]
    assert out[1]["CONTROLS__1"].tolist() == [[0, 0, 1, 2], [0, 0, 1, 2]]


def test_continuing_without_state_and_bad_correlation_ids_fail_alone(repo, harness):
    tm.save(tm.Accumulate(), repo)
    h = harness(tm.accumulate_config(max_batch_size=4, corrid="TYPE_INT32"))
    x = np.array([[1.0]], np.float32)
    requests = [
        h.request({"INPUT__0": x}, correlation_id=5),
        h.request({"INPUT__0": x}, flags=FLAG_SEQUENCE_START, correlation_id=3),
    ]
    errors = [r.error for _, r, _ in h.execute(requests)]
    assert str(errors[0]) == (
        "INVALID_ARG: request '1' of a sequence of model 'm' carries no state input "
        "'STATE_IN__5'; each request must feed the 'STATE_OUT__2' its predecessor returned"
    )
    assert errors[1] is None
    # the control inputs are built with the request (by the worker, here the harness)
    with pytest.raises(InferpoolError) as err:
        h.request({"INPUT__0": x}, flags=FLAG_SEQUENCE_START, correlation_id="abc")
    assert str(err.value) == (
        "INVALID_ARG: model 'm': correlation id 'abc' of request '3' is not an integer, but "
        "CONTROL_SEQUENCE_CORRID is TYPE_INT32"
    )
    with pytest.raises(InferpoolError, match="does not fit TYPE_INT32, the type of CONTROL_SEQ"):
        h.request({"INPUT__0": x}, flags=FLAG_SEQUENCE_START, correlation_id=2**40)


@pytest.mark.parametrize(
    ("config", "code", "message"),
    [
        (tm.accumulate_config(corrid="TYPE_UINT64"), Code.INTERNAL,
         "input 'CORRID__4' type 'TYPE_UINT64' is not supported by PyTorch."),
        (tm.accumulate_config().replace("int32_false_true: [0, 1]", ""), Code.INVALID_ARG,
         "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
         "'bool_false_true' for CONTROL_SEQUENCE_START for m"),
        (tm.accumulate_config().replace("fp32_false_true: [0, 1]", "fp32_false_true: [0]"),
         Code.INVALID_ARG,
         "sequence batching control 'fp32_false_true' must have exactly 2 entries for "
         "CONTROL_SEQUENCE_END for m"),
        (tm.accumulate_config().replace("CONTROL_SEQUENCE_END", "CONTROL_SEQUENCE_START"),
         Code.INVALID_ARG,
         "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors for m"),
        (tm.accumulate_config().replace('"READY__3"', '"END__2"'), Code.INVALID_ARG,
         "sequence batching control tensor 'END__2' is specified for multiple control kinds for m"),
        (tm.accumulate_config().replace('"START__1"', '"START"'), Code.INTERNAL,
         "input 'START' does not follow <name>__<index> naming convention."),
        (tm.accumulate_config().replace('output_name: "STATE_OUT__2"', 'output_name: "STATE_OUT"'),
         Code.INVALID_ARG,
         "PyTorch model 'm' is using sequence batching with state but state 'STATE_OUT' does not "
         "follow the <name>__<index> naming convention."),
        (tm.accumulate_config().replace('"INPUT__0"', '"INPUT"'), Code.INVALID_ARG,
         "PyTorch model 'm' is using sequence batching with state but not all inputs and outputs "
         "follow the <name>__<index> naming convention."),
        (tm.accumulate_config().replace("dims: [1] }]", "dims: [1] initial_state: [{ data_type: "
                                     "TYPE_FP32 dims: [1] name: 'init' data_file: 'f' }] }]"),
         Code.INVALID_ARG,
         "initial_state/f: No such file or directory"),
        (tm.accumulate_config().replace("dims: [1] }]", "dims: [1] initial_state: [{ data_type: "
                                     "TYPE_INT32 dims: [1] name: 'init' zero_data: true }] }]"),
         Code.INVALID_ARG,
         "The data type used for 'initial_state' field of state 'STATE_IN__5' does not match "
         "the state data type."),
        (tm.accumulate_config(state=""), Code.INVALID_ARG,
         "unable to load model 'm', configuration expects 5 inputs, model provides 6"),
    ],
)  # fmt: skip
def test_sequence_config_errors(repo, harness, config, code, message):
    tm.save(tm.Accumulate(), repo)
    with pytest.raises(InferpoolError) as info:
        harness(config)
    assert info.value.code is code
    assert info.value.message.endswith(message), info.value.message


def test_a_sequence_starts_from_its_initial_state_file(repo, harness):
    tm.save(tm.Accumulate(), repo)
    (repo / "initial_state").mkdir()
    (repo / "initial_state" / "start.bin").write_bytes(np.array([40.0], np.float32).tobytes())
    config = tm.accumulate_config().replace(
        "dims: [1] }]",
        "dims: [1] initial_state: [{ data_type: TYPE_FP32 dims: [1] name: 'init' "
        "data_file: 'start.bin' }] }]",
    )
    h = harness(config)
    first = h.infer(
        {"INPUT__0": np.array([2.0], np.float32)}, flags=FLAG_SEQUENCE_START, correlation_id=1
    )
    assert first["OUTPUT__0"].tolist() == [42.0]
