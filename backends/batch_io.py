"""Triton's ragged batching, for backends that run a batch as whole tensors.

A config may mark inputs ``allow_ragged_batch``, list ``batch_input`` and ``batch_output``.
This module is the one home of what they mean once a batch is formed (as Triton's backend
utilities do it), so that every backend hands the model the same tensors:

* a ragged input's requests may differ in shape: the model gets their elements one after
  another, as one tensor of shape ``[total elements]`` (:meth:`BatchIO.flat`);
* a batch input is an extra model input built from the batch (:meth:`BatchIO.build`): the
  element counts of its source input per request, their running sums (with or without a
  leading zero), the largest count as the tensor's shape (its values unset: zeros here),
  or each batch item's shape, as ``[items, rank]`` or flattened;
* a batch output (``BATCH_SCATTER_WITH_INPUT_SHAPE``) is split back by the shape of its
  source input: each request takes, in order, as many elements as its part's shape holds,
  where each variable dimension of the output is the input's dimension at the same place
  (:meth:`BatchIO.scatter`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as pb

from inferpool.backends.api import InputTensor, Request
from inferpool.wire.errors import internal

ELEMENT_COUNT = "BATCH_ELEMENT_COUNT"
ACCUMULATED = "BATCH_ACCUMULATED_ELEMENT_COUNT"
ACCUMULATED_WITH_ZERO = "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO"
MAX_AS_SHAPE = "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE"
ITEM_SHAPE = "BATCH_ITEM_SHAPE"
ITEM_SHAPE_FLATTEN = "BATCH_ITEM_SHAPE_FLATTEN"
_DTYPES = {pb.TYPE_INT32: np.dtype(np.int32), pb.TYPE_FP32: np.dtype(np.float32)}


@dataclass(frozen=True)
class BatchInput:
    """One ``batch_input``: its kind, the model inputs it fills, their dtype, its source."""

    kind: str
    targets: tuple[str, ...]
    dtype: np.dtype[Any]
    source: str


@dataclass(frozen=True)
class BatchOutput:
    """One ``BATCH_SCATTER_WITH_INPUT_SHAPE`` output: its source input and the shape of one
    request's part (-1 where the source input's dimension goes; the batch dimension first
    when the model batches)."""

    source: str
    shape: tuple[int, ...]


class BatchIO:
    """The ragged inputs, batch inputs and batch outputs of one model's config."""

    def __init__(self, config: Any) -> None:
        self.ragged = frozenset(io.name for io in config.input if io.allow_ragged_batch)
        self.inputs = tuple(
            BatchInput(
                pb.BatchInput.Kind.Name(bi.kind),
                tuple(bi.target_name),
                _DTYPES.get(bi.data_type, np.dtype(np.float32)),
                bi.source_input[0] if bi.source_input else "",
            )
            for bi in config.batch_input
        )
        dims = {io.name: _dims(io) for io in config.output}
        lead = (-1,) if config.max_batch_size > 0 else ()
        self.outputs = {
            name: BatchOutput(bo.source_input[0] if bo.source_input else "", (*lead, *dims[name]))
            for bo in config.batch_output
            for name in bo.target_name
            if name in dims
        }

    @property
    def targets(self) -> tuple[str, ...]:
        """The model inputs the batch inputs add, in the config's order."""
        return tuple(name for bi in self.inputs for name in bi.targets)

    def shape_key(self, tensor: InputTensor, batching: bool) -> tuple[int, ...]:
        """What of an input's shape requests must share to run together: nothing for a
        ragged input, the shape past the batch dimension (all of it without batching)."""
        if tensor.name in self.ragged:
            return ()
        return tensor.shape[1:] if batching else tensor.shape

    @staticmethod
    def flat(data: Any) -> Any:
        """A ragged input's part as the one dimension the model reads (a view)."""
        return data.reshape(-1)

    def build(self, requests: Sequence[Request]) -> dict[str, np.ndarray]:
        """The batch inputs of ``requests`` (one batch, in order), by model input name."""
        built: dict[str, np.ndarray] = {}
        for bi in self.inputs:
            shapes = [r.input(bi.source).shape for r in requests]
            value = _value(bi.kind, shapes, bi.dtype)
            for name in bi.targets:
                built[name] = value
        return built

    def scatter(self, name: str, data: Any, requests: Sequence[Request]) -> list[Any]:
        """Output ``name`` of the batch split back to ``requests``: each one's part, shaped
        by its source input; INTERNAL when the model gave fewer elements than they take."""
        spec = self.outputs[name]
        flat = data.reshape(-1)
        parts = []
        start = 0
        for request in requests:
            given = request.input(spec.source).shape
            shape = tuple(
                given[i] if d == -1 and i < len(given) else d for i, d in enumerate(spec.shape)
            )
            count = math.prod(shape)
            if start + count > flat.shape[0]:
                raise internal(
                    f"output '{name}' holds {flat.shape[0]} elements, fewer than the "
                    f"{start + count} the shapes of input '{spec.source}' take"
                )
            parts.append(flat[start : start + count].reshape(shape))
            start += count
        return parts


def _dims(io: Any) -> tuple[int, ...]:
    return tuple(io.reshape.shape) if io.HasField("reshape") else tuple(io.dims)


def _value(kind: str, shapes: list[tuple[int, ...]], dtype: np.dtype[Any]) -> np.ndarray:
    """A batch input of ``kind`` for requests whose source input has ``shapes``."""
    counts = [math.prod(s) for s in shapes]
    if kind == ELEMENT_COUNT:
        return np.array(counts, dtype)
    if kind == ACCUMULATED:
        return np.cumsum(counts).astype(dtype)
    if kind == ACCUMULATED_WITH_ZERO:
        return np.cumsum([0, *counts]).astype(dtype)
    if kind == MAX_AS_SHAPE:
        return np.zeros(max(counts, default=0), dtype)
    items = [s[1:] for s in shapes for _ in range(s[0] if s else 0)]
    rank = len(shapes[0]) - 1 if shapes else 0
    value = np.array(items, dtype).reshape(len(items), rank)
    return value if kind == ITEM_SHAPE else value.reshape(-1)
