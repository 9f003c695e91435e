"""What the tests' ragged-batch models (an ONNX model, a TorchScript one) are configured
with and answer: RAGGED (FP32, a ragged input) comes back doubled as DOUBLED, split back by
its shape; ITEMS (BATCH_ITEM_SHAPE) comes back as ITEMS_OUT; each batch input of
:data:`BATCH_KINDS` comes back as ``<name>_OUT``, whole on every row of the batch."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

BATCH_KINDS = {  # a batch input of the models: its kind and data type
    "COUNT": ("BATCH_ELEMENT_COUNT", "TYPE_FP32"),
    "ACC": ("BATCH_ACCUMULATED_ELEMENT_COUNT", "TYPE_INT32"),
    "ACC0": ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "TYPE_FP32"),
    "MAXS": ("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", "TYPE_FP32"),
    "FLAT": ("BATCH_ITEM_SHAPE_FLATTEN", "TYPE_INT32"),
}


def config(
    name: str, backend: str = "onnxruntime", extra: str = "", max_batch_size: int = 8
) -> str:
    """The models' config: RAGGED [-1, -1] ragged, DOUBLED split back by its shape."""
    batch_inputs = [
        f'{{ kind: {kind} target_name: "{n}" data_type: {t} source_input: "RAGGED" }}'
        for n, (kind, t) in {"ITEMS": ("BATCH_ITEM_SHAPE", "TYPE_FP32"), **BATCH_KINDS}.items()
    ]
    outputs = [f'{{ name: "{n}_OUT" data_type: TYPE_FP32 dims: [ -1 ] }}' for n in BATCH_KINDS]
    return f"""
name: "{name}" backend: "{backend}" max_batch_size: {max_batch_size}
input [ {{ name: "RAGGED" data_type: TYPE_FP32 dims: [ -1, -1 ] allow_ragged_batch: true }} ]
output [ {{ name: "DOUBLED" data_type: TYPE_FP32 dims: [ -1, -1 ] }},
         {{ name: "ITEMS_OUT" data_type: TYPE_FP32 dims: [ 2 ] }}, {", ".join(outputs)} ]
batch_input [ {", ".join(batch_inputs)} ]
batch_output [ {{ kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "DOUBLED"
                  source_input: "RAGGED" }} ]
{extra}
"""


def expected(shapes: Sequence[tuple[int, ...]]) -> list[dict[str, np.ndarray]]:
    """What a ragged-batch model answers each request of one batch whose RAGGED inputs have
    ``shapes`` (and hold ``arange`` values), worked out with numpy."""
    counts = [int(np.prod(s)) for s in shapes]
    items = [s[1:] for s in shapes for _ in range(s[0])]
    whole = {
        "COUNT": np.array(counts, np.float32),
        "ACC": np.cumsum(counts).astype(np.float32),
        "ACC0": np.cumsum([0, *counts]).astype(np.float32),
        "MAXS": np.zeros(max(counts), np.float32),
        "FLAT": np.array(items, np.float32).reshape(-1),
    }
    answers = []
    row = 0
    for shape in shapes:
        rows = shape[0]
        answer = {f"{n}_OUT": np.tile(v, (rows, 1)) for n, v in whole.items()}
        answer["DOUBLED"] = 2 * np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        answer["ITEMS_OUT"] = np.array(items[row : row + rows], np.float32)
        answers.append(answer)
        row += rows
    return answers
