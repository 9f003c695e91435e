"""Sequence batching as the model sees it: control inputs and implicit state.

The sequence batcher (scheduling) lives in the broker; this module reads what the config
declares (validated as Triton's ``Get{Boolean,Typed}SequenceControlProperties`` do) and
gives each request the control tensors it lacks: START/END from ``request.flags``, READY
true (a request is present), CORRID from ``request.correlation_id``.  A request that
already carries a control tensor keeps it.  A sequence's first request without its state
input starts from zeros; later requests must carry the state their predecessor returned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2

from inferpool.backends.api import Request
from inferpool.backends.pytorch.dtypes import config_type_name, wire_datatype
from inferpool.wire import codec
from inferpool.wire.errors import invalid_arg, unsupported

START = "CONTROL_SEQUENCE_START"
END = "CONTROL_SEQUENCE_END"
READY = "CONTROL_SEQUENCE_READY"
CORRID = "CONTROL_SEQUENCE_CORRID"
BOOLEAN_KINDS = (START, END, READY)

_Kind = model_config_pb2.ModelSequenceBatching.Control.Kind


@dataclass(frozen=True)
class Control:
    """One control input: which tensor carries which signal, and how it is encoded."""

    kind: str
    name: str
    config_type: str  # TYPE_INT32, TYPE_FP32, TYPE_BOOL, or CORRID's declared type
    false_value: Any = 0
    true_value: Any = 1

    @property
    def datatype(self) -> str:
        return wire_datatype(self.config_type)

    def tensor_for(self, request: Request, batch: int, batching: bool, model: str) -> np.ndarray:
        """The control tensor the sequence batcher would attach to ``request``."""
        if self.kind == CORRID:
            value: Any = request.correlation_id
            if self.datatype != "BYTES":
                try:
                    value = int(value)
                except ValueError:
                    raise invalid_arg(
                        f"correlation id '{value}' of request '{request.id}' is not an integer, "
                        f"but model '{model}' declares {CORRID} as {self.config_type}"
                    ) from None
        else:
            on = {START: request.sequence_start, END: request.sequence_end, READY: True}[self.kind]
            value = self.true_value if on else self.false_value
        shape = (batch, 1) if batching else (1,)
        try:
            return np.full(shape, value, dtype=codec.numpy_dtype(self.datatype))
        except OverflowError:
            raise invalid_arg(
                f"correlation id {value} of request '{request.id}' does not fit "
                f"{self.config_type} ({CORRID} of model '{model}')"
            ) from None


@dataclass(frozen=True)
class State:
    """An implicit state: fed as ``input_name``, returned as ``output_name``."""

    input_name: str
    output_name: str
    config_type: str
    dims: tuple[int, ...]
    initial_dims: tuple[int, ...]

    @property
    def datatype(self) -> str:
        return wire_datatype(self.config_type)

    def initial(self, batch: int, batching: bool) -> np.ndarray | list[str]:
        """Zeros (empty strings for TYPE_STRING), as Triton starts a sequence's state."""
        dims = [1 if d < 0 else d for d in self.initial_dims]
        shape = [batch, *dims] if batching else dims
        if self.datatype == "BYTES":
            return [""] * math.prod(shape)
        return np.zeros(shape, dtype=codec.numpy_dtype(self.datatype))


def controls(config: Any, model: str) -> list[Control]:
    """The control inputs of ``sequence_batching``, validated; [] without sequence batching."""
    if not config.HasField("sequence_batching"):
        return []
    found: dict[str, Control] = {}
    seen_tensors: set[str] = set()
    for control_input in config.sequence_batching.control_input:
        name = control_input.name
        if not name:
            raise invalid_arg(f"sequence batching control tensor must have a name for {model}")
        if name in seen_tensors:
            raise invalid_arg(
                f"sequence batching control tensor '{name}' is specified for multiple control "
                f"kinds for {model}"
            )
        seen_tensors.add(name)
        for c in control_input.control:
            kind = _Kind.Name(c.kind)
            if kind in found:
                raise invalid_arg(
                    f"sequence batching specifies multiple {kind} tensors for {model}"
                )
            found[kind] = (
                _boolean(kind, name, c, model)
                if kind in BOOLEAN_KINDS
                else _typed(kind, name, c, model)
            )
    order = (*BOOLEAN_KINDS, CORRID)
    return sorted(found.values(), key=lambda ctl: order.index(ctl.kind))


def _boolean(kind: str, name: str, c: Any, model: str) -> Control:
    encodings = [
        (field, type_name, list(getattr(c, field)))
        for field, type_name in (
            ("int32_false_true", "TYPE_INT32"),
            ("fp32_false_true", "TYPE_FP32"),
            ("bool_false_true", "TYPE_BOOL"),
        )
        if len(getattr(c, field)) > 0
    ]
    if len(encodings) != 1:
        raise invalid_arg(
            "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
            f"'bool_false_true' for {kind} for {model}"
        )
    field, config_type, values = encodings[0]
    if len(values) != 2:
        raise invalid_arg(
            f"sequence batching control '{field}' must have exactly 2 entries for {kind} for "
            f"{model}"
        )
    return Control(kind, name, config_type, values[0], values[1])


def _typed(kind: str, name: str, c: Any, model: str) -> Control:
    if any(len(getattr(c, f)) for f in ("int32_false_true", "fp32_false_true", "bool_false_true")):
        raise invalid_arg(
            f"sequence batching must not specify 'int32_false_true', 'fp32_false_true' or "
            f"'bool_false_true' for {kind} for {model}"
        )
    config_type = config_type_name(c.data_type)
    if config_type == "TYPE_INVALID":
        raise invalid_arg(f"sequence batching must specify a data_type for {kind} for {model}")
    return Control(kind, name, config_type)


def states(config: Any) -> list[State]:
    """The implicit states of ``sequence_batching``; initial states other than zeros are refused."""
    if not config.HasField("sequence_batching"):
        return []
    out = []
    for s in config.sequence_batching.state:
        initial_dims = tuple(s.dims)
        for init in s.initial_state:
            if init.WhichOneof("state_data") != "zero_data":
                raise unsupported(
                    f"initial state '{init.name}' of state '{s.input_name}': only zero_data "
                    "initial states are supported"
                )
            initial_dims = tuple(init.dims) or initial_dims
        out.append(
            State(
                s.input_name,
                s.output_name,
                config_type_name(s.data_type),
                tuple(s.dims),
                initial_dims,
            )
        )
    return out
