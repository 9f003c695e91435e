"""A model's input contract and the checks every request must pass, in Triton's words.

The broker checks requests that come through it (``broker.front.admission``), a worker checks
requests that come over a lane (``workers.lanes``): both hold the same tensor specs, built
from the served configuration, and raise the same errors.  An ensemble's runs (the broker's,
and a shared-memory client's over lanes) fail with the same errors too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from inferpool.wire import codec
from inferpool.wire.errors import InferpoolError, invalid_arg


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """What a model declares of one input or output."""

    name: str
    datatype: str
    dims: tuple[int, ...]  # without the batch dimension
    optional: bool = False
    itemsize: int = 0  # 0 for BYTES
    variable: bool = False  # any -1 in dims

    def matches(self, shape: tuple[int, ...]) -> bool:
        if len(shape) != len(self.dims):
            return False
        if not self.variable:
            return shape == self.dims
        return all(d == -1 or d == s for d, s in zip(self.dims, shape, strict=True))


def tensor_spec(t: Any, optional: bool = False) -> TensorSpec:
    """The spec of a ModelInput or ModelOutput of a configuration."""
    from tritonclient.grpc import model_config_pb2 as pb

    datatype = codec.config_to_wire_datatype(pb.DataType.Name(t.data_type))
    spec = spec_of(t.name, datatype, t.dims)
    return replace(spec, optional=True) if optional else spec


def spec_of(name: str, datatype: str, dims: Any) -> TensorSpec:
    """A spec from a tensor's name, wire datatype and configured dims."""
    dims = tuple(int(d) for d in dims)
    return TensorSpec(
        name, datatype, dims, False, codec.element_size(datatype), any(d < 0 for d in dims)
    )


def batch_reshape(
    spec: TensorSpec, batching: bool, batched: bool, shape: Sequence[int]
) -> Sequence[int]:
    """A tensor of ``shape`` (``batched``: made by a side that batches) as ``spec``'s model
    reads it (``batching``: it batches): the batch dimension of one added or removed where
    one side batches and the other does not (Triton's ReshapeTensorDims in an ensemble)."""
    if batching and not batched and spec.matches(tuple(shape)):
        return (1, *shape)
    if not batching and batched and not spec.matches(tuple(shape)) and shape and shape[0] == 1:
        return shape[1:]
    return shape


def shape_text(shape: Any) -> str:
    """A shape as Triton writes it in messages: ``[2,-1]``."""
    return "[" + ",".join(str(d) for d in shape) + "]"


def check_input(
    model: str,
    spec: TensorSpec,
    datatype: Any,
    shape: tuple[int, ...],
    max_batch_size: int,
    batch: int,
) -> tuple[int, int | None]:
    """(the batch size, the byte size the input must have, None for BYTES) of input
    ``spec.name`` given as ``datatype`` ``shape``; ``batch``: the other inputs' batch size
    so far (0: none yet)."""
    name = spec.name
    if any(d < 0 for d in shape):
        raise invalid_arg(
            f"input '{name}' for model '{model}' has a negative dimension: shape "
            f"{shape_text(shape)}"
        )
    if datatype != spec.datatype:
        raise invalid_arg(
            f"inference input '{name}' data-type is '{datatype}', but model '{model}' "
            f"expects '{spec.datatype}'"
        )
    if max_batch_size > 0:
        if not shape or shape[0] < 1:
            raise invalid_arg(
                f"input '{name}' for model '{model}' needs the batch dimension first: "
                f"expected shape [-1{''.join(',' + str(d) for d in spec.dims)}], got "
                f"{shape_text(shape)}"
            )
        if shape[0] > max_batch_size:
            raise invalid_arg(
                f"inference request batch-size must be <= {max_batch_size} for '{model}'"
            )
        if batch and shape[0] != batch:
            raise invalid_arg(
                f"input '{name}' batch size {shape[0]} does not match the other inputs' "
                f"batch size {batch} for model '{model}'"
            )
        batch = shape[0]
        inner = shape[1:]
    else:
        inner = shape
    if not spec.matches(inner):
        expected = ([-1] if max_batch_size > 0 else []) + list(spec.dims)
        raise invalid_arg(
            f"unexpected shape for input '{name}' for model '{model}'. Expected "
            f"{shape_text(expected)}, got {shape_text(shape)}"
        )
    if not spec.itemsize:
        return batch, None
    count = 1
    for d in shape:
        count *= d
    return batch, spec.itemsize * count


def check_byte_size(model: str, name: str, expected: int | None, nbytes: int) -> None:
    """INVALID_ARG (Triton's words) if an input brings other than the bytes its shape needs."""
    if expected is not None and nbytes != expected:
        raise invalid_arg(
            f"input byte size mismatch for input '{name}' for model '{model}'. "
            f"Expected {expected}, got {nbytes}"
        )


def check_required(model: str, required: frozenset[str], seen: set[str]) -> None:
    """INVALID_ARG (Triton's words) naming the required inputs a request left out."""
    missing = required - seen
    if missing:
        raise invalid_arg(
            f"expected {len(required)} inputs but got {len(seen)} inputs for model "
            f"'{model}'. Got input(s) {sorted(seen)}, but missing required input(s) "
            f"{sorted(missing)}. Please provide all required input(s)."
        )


def step_failed(ensemble: str, index: int, model: str, err: InferpoolError) -> InferpoolError:
    """An ensemble request's error when its step ``index`` (of ``model``) failed with ``err``."""
    return InferpoolError(
        err.code,
        f"in ensemble '{ensemble}', step {index} (model '{model}') failed: {err.message}",
    )


def ensemble_deadlock(ensemble: str) -> InferpoolError:
    """Triton's words for an ensemble request that cannot make all its outputs."""
    return invalid_arg(
        f"in ensemble '{ensemble}', unexpected deadlock, at least one output is not set while "
        "no more ensemble steps can be made"
    )
