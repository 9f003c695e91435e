"""A model's input contract and the checks every request must pass, in Triton's words.

Four parts check requests: the broker, those that come through it (``broker.front.
admission_plans``) and those it makes itself (``broker.models.internal``); a worker, those
that come over a lane (``workers.lane_bodies``); a shared-memory client, those it runs over
an ensemble's lanes (``client.lane_ensemble``).  All hold the same tensor specs, built from
the served configuration (an ``open_lane`` answer carries them: :func:`spec_entries`), and
check a request's inputs with :class:`InputChecks`: each input known (:func:`input_spec`),
given once, of its datatype and shape, of one batch size with the others, and every required
input given.  They raise the same errors.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from inferpool.wire import codec
from inferpool.wire.errors import invalid_arg


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


def spec_entries(specs: Iterable[TensorSpec]) -> list[dict[str, Any]]:
    """Tensor specs as an ``open_lane`` answer lists them (PROTOCOL.md)."""
    return [
        {"name": s.name, "datatype": s.datatype, "dims": list(s.dims), "optional": s.optional}
        for s in specs
    ]


def specs_of(entries: Iterable[Mapping[str, Any]]) -> dict[str, TensorSpec]:
    """The tensor specs an ``open_lane`` answer lists, by name."""
    specs = {}
    for entry in entries:
        spec = spec_of(entry["name"], entry["datatype"], entry["dims"])
        specs[spec.name] = replace(spec, optional=True) if entry.get("optional") else spec
    return specs


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


def input_spec(model: str, specs: Mapping[str, TensorSpec], name: Any) -> TensorSpec:
    """The spec of input ``name``; INVALID_ARG (Triton's words) for one the model lacks."""
    spec = specs.get(name) if isinstance(name, str) else None
    if spec is None:
        raise invalid_arg(f"unexpected inference input '{name}' for model '{model}'")
    return spec


def check_output(model: str, outputs: Container[str], name: Any) -> str:
    """``name``, an output the model has; INVALID_ARG (Triton's words) for one it lacks."""
    if not isinstance(name, str) or name not in outputs:
        raise invalid_arg(f"unexpected inference output '{name}' for model '{model}'")
    return name


class InputChecks:
    """A request's inputs checked one by one as they come (:meth:`add`), then as a set
    (:meth:`done`), in Triton's words."""

    __slots__ = ("batch", "max_batch_size", "model", "required", "seen")

    def __init__(self, model: str, max_batch_size: int, required: frozenset[str]) -> None:
        self.model = model
        self.max_batch_size = max_batch_size
        self.required = required
        self.seen: set[str] = set()
        self.batch = 0  # the inputs' batch size so far (0: none yet, or no batching)

    def add(self, spec: TensorSpec, datatype: Any, shape: tuple[int, ...]) -> int | None:
        """Check input ``spec.name``, given as ``datatype`` ``shape``: given once, of the
        model's datatype and shape, of the other inputs' batch size.  The byte size it must
        have (None for BYTES)."""
        name = spec.name
        if name in self.seen:
            raise invalid_arg(f"input '{name}' is given more than once for model '{self.model}'")
        self.seen.add(name)
        self.batch, expected = check_input(
            self.model, spec, datatype, shape, self.max_batch_size, self.batch
        )
        return expected

    def done(self) -> int:
        """Check that every required input came; the request's batch size (0: the model
        does not batch)."""
        check_required(self.model, self.required, self.seen)
        return self.batch
