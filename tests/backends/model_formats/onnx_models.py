"""ONNX models built at test time with the ``onnx`` package, and their configs.

``add_sub`` is the shape of Triton's ``simple`` and of gen_qa_models.py's
``onnx_<in>_<out0>_<out1>`` models: INPUT0 and INPUT1 in, OUTPUT0 = INPUT0 + INPUT1 and
OUTPUT1 = INPUT0 - INPUT1 out, with a variable batch dimension when ``batch`` is True.
``accumulate`` keeps a sum in an implicit state, fed by the sequence batcher's controls.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from tests.ragged_batches import BATCH_KINDS

OPSET = [helper.make_operatorsetid("", 13)]
# an IR version every supported onnxruntime reads: onnx 1.23 writes IR 14 by default, and
# onnxruntime 1.23 (the last for Python 3.10) reads up to IR 11
IR_VERSION = 8
TYPES = {
    np.dtype(np.float32): (TensorProto.FLOAT, "TYPE_FP32"),
    np.dtype(np.float16): (TensorProto.FLOAT16, "TYPE_FP16"),
    np.dtype(np.int32): (TensorProto.INT32, "TYPE_INT32"),
    np.dtype(np.int64): (TensorProto.INT64, "TYPE_INT64"),
    np.dtype(object): (TensorProto.STRING, "TYPE_STRING"),
}


def _value(name: str, dtype: np.dtype, shape: list[int | str | None]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TYPES[np.dtype(dtype)][0], shape)


def add_sub(dtype: type = np.float32, dims: int | str = 16, batch: bool = True) -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (``dims``: a size or a symbol)."""
    shape: list[int | str | None] = [None, dims] if batch else [dims]
    io = np.dtype(dtype)
    nodes = [
        helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
    ]
    if io == np.dtype(object):  # strings: computed as int32, as Triton's simple_string
        nodes = [
            helper.make_node("Cast", ["INPUT0"], ["A"], to=TensorProto.INT32),
            helper.make_node("Cast", ["INPUT1"], ["B"], to=TensorProto.INT32),
            helper.make_node("Add", ["A", "B"], ["C0"]),
            helper.make_node("Sub", ["A", "B"], ["C1"]),
            helper.make_node("Cast", ["C0"], ["OUTPUT0"], to=TensorProto.STRING),
            helper.make_node("Cast", ["C1"], ["OUTPUT1"], to=TensorProto.STRING),
        ]
    graph = helper.make_graph(
        nodes,
        "add_sub",
        [_value("INPUT0", io, shape), _value("INPUT1", io, shape)],
        [_value("OUTPUT0", io, shape), _value("OUTPUT1", io, shape)],
    )
    return helper.make_model(graph, opset_imports=OPSET, ir_version=IR_VERSION)


def accumulate() -> onnx.ModelProto:
    """A running sum per sequence: OUTPUT = STATE_OUT = (START ? 0 : STATE_IN) + INPUT, all
    FP32 [batch, 1], START an INT32 [batch, 1] control."""
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["START"], ["startf"], to=TensorProto.FLOAT),
            helper.make_node("Sub", ["one", "startf"], ["keep"]),
            helper.make_node("Mul", ["STATE_IN", "keep"], ["kept"]),
            helper.make_node("Add", ["kept", "INPUT"], ["OUTPUT"]),
            helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"]),
        ],
        "accumulate",
        [
            _value("INPUT", np.dtype(np.float32), [None, 1]),
            _value("START", np.dtype(np.int32), [None, 1]),
            _value("STATE_IN", np.dtype(np.float32), [None, 1]),
        ],
        [
            _value("OUTPUT", np.dtype(np.float32), [None, 1]),
            _value("STATE_OUT", np.dtype(np.float32), [None, 1]),
        ],
        initializer=[helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])],
    )
    return helper.make_model(graph, opset_imports=OPSET, ir_version=IR_VERSION)


def ragged_batch() -> onnx.ModelProto:
    """A model of every ragged-batching kind: RAGGED (FP32 [-1], a ragged input) comes back
    doubled as DOUBLED; ITEMS (FP32 [items, 2], the batch input BATCH_ITEM_SHAPE) comes back
    as ITEMS_OUT; each batch input of ``BATCH_KINDS`` comes back as ``<name>_OUT`` (FP32),
    whole on every row of the batch ([items, its length]), as Triton's QA models do."""
    f32, i32 = np.dtype(np.float32), np.dtype(np.int32)
    nodes = [
        helper.make_node("Add", ["RAGGED", "RAGGED"], ["DOUBLED"]),
        helper.make_node("Identity", ["ITEMS"], ["ITEMS_OUT"]),
        helper.make_node("ReduceSum", ["ITEMS", "axis1"], ["summed"], keepdims=1),
        helper.make_node("Mul", ["summed", "zero"], ["zeros"]),
        helper.make_node("Add", ["zeros", "one"], ["rows"]),  # [items, 1] of ones
    ]
    inputs = [_value("RAGGED", f32, [None]), _value("ITEMS", f32, [None, 2])]
    outputs = [_value("DOUBLED", f32, [None]), _value("ITEMS_OUT", f32, [None, 2])]
    for name, (_, config_type) in BATCH_KINDS.items():
        dtype = i32 if config_type == "TYPE_INT32" else f32
        inputs.append(_value(name, dtype, [None]))
        outputs.append(_value(f"{name}_OUT", f32, [None, None]))
        nodes += [
            helper.make_node("Cast", [name], [f"{name}_f"], to=TensorProto.FLOAT),
            helper.make_node("Reshape", [f"{name}_f", "row"], [f"{name}_row"]),
            helper.make_node("MatMul", ["rows", f"{name}_row"], [f"{name}_OUT"]),
        ]
    graph = helper.make_graph(
        nodes,
        "ragged_batch",
        inputs,
        outputs,
        initializer=[
            helper.make_tensor("axis1", TensorProto.INT64, [1], [1]),
            helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
            helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
            helper.make_tensor("row", TensorProto.INT64, [2], [1, -1]),
        ],
    )
    return helper.make_model(graph, opset_imports=OPSET, ir_version=IR_VERSION)


def add_sub_config(
    name: str,
    config_type: str = "TYPE_FP32",
    dims: int = 16,
    max_batch_size: int = 8,
    extra: str = "",
) -> str:
    tensors = [
        f'{{ name: "{n}" data_type: {config_type} dims: [ {dims} ] }}'
        for n in ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")
    ]
    return (
        f'name: "{name}" platform: "onnxruntime_onnx" max_batch_size: {max_batch_size}\n'
        f"input [ {tensors[0]}, {tensors[1]} ]\noutput [ {tensors[2]}, {tensors[3]} ]\n{extra}"
    )


ACCUMULATE_CONFIG = """
name: "m"
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }
  ]
  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
}
"""


def save(model: onnx.ModelProto, model_dir: Path, config: str | None = None) -> Path:
    """``<model_dir>/1/model.onnx`` and, unless None, ``config.pbtxt``."""
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(model_dir / "1" / "model.onnx"))
    if config is not None:
        (model_dir / "config.pbtxt").write_text(config)
    return model_dir


def reference(model_dir: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """What ONNX Runtime itself answers for ``feeds``."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_dir / "1" / "model.onnx"))
    outputs: list[np.ndarray] = session.run(None, feeds)
    return outputs
