"""What Triton's sequence batcher adds to a sequence model's requests, for every backend:
control inputs and initial states.

``sequence_batching.control_input`` names tensors the model receives with every request of a
sequence (validated as Triton's ``Get{Boolean,Typed}SequenceControlProperties`` do):

- ``CONTROL_SEQUENCE_START``, ``_END``, ``_READY``: booleans, each encoded as the config says
  (``int32_false_true``, ``fp32_false_true`` or ``bool_false_true``: the false value, then the
  true one).  START and END follow the request's flags; READY is true for a request and false
  for a null request (a direct-batching slot without one).
- ``CONTROL_SEQUENCE_CORRID``: the correlation id, as TYPE_UINT64, INT64, UINT32, INT32 or
  STRING.

Each is shaped ``[batch, 1]`` when the model batches, ``[1]`` when it does not.

``sequence_batching.state`` declares implicit states.  A sequence's first request gets each
state's initial value: ``initial_state`` zero data or a data file in ``<model>/initial_state/``
(checked as Triton checks them), else zeros, shaped ``[1, dims...]`` (variable dims as 1)
when the model batches.  The worker carries the state a response returns to the next request
(``workers/sequence_state.py``); ``backends.testing.BackendHarness`` adds these inputs too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2

from inferpool.backends import tensor_data
from inferpool.backends.api import FLAG_SEQUENCE_END, FLAG_SEQUENCE_START, InputTensor
from inferpool.wire import codec
from inferpool.wire.errors import InferpoolError, invalid_arg

START = "CONTROL_SEQUENCE_START"
END = "CONTROL_SEQUENCE_END"
READY = "CONTROL_SEQUENCE_READY"
CORRID = "CONTROL_SEQUENCE_CORRID"
BOOLEAN_KINDS = (START, END, READY)
CORRID_TYPES = ("TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32", "TYPE_STRING")
INITIAL_STATE_FOLDER = "initial_state"
_FLAGS = {START: FLAG_SEQUENCE_START, END: FLAG_SEQUENCE_END}  # the request flag each follows

_Kind = model_config_pb2.ModelSequenceBatching.Control.Kind


def config_type_name(data_type: int) -> str:
    """The protobuf enum value as the config spells it: ``TYPE_FP32``."""
    return str(model_config_pb2.DataType.Name(data_type))


@dataclass(frozen=True)
class Control:
    """One control input: which tensor carries which signal, and how it is encoded.

    A START, END or READY tensor depends only on its value and shape, so each is built once
    and shared, read-only, by every request that needs it: a sequence request costs no
    allocation per boolean control.
    """

    kind: str
    name: str
    config_type: str  # TYPE_INT32, TYPE_FP32, TYPE_BOOL, or CORRID's declared type
    false_value: Any = 0
    true_value: Any = 1
    _made: dict[tuple[bool, tuple[int, ...]], InputTensor] = field(
        default_factory=dict, compare=False, repr=False
    )

    @property
    def datatype(self) -> str:
        return codec.config_to_wire_datatype(self.config_type)

    def tensor(
        self, correlation_id: Any, flags: int, ready: bool, shape: tuple[int, ...], whose: str
    ) -> InputTensor:
        """The control tensor for a request with these flags (``ready``: False for a null
        request); ``whose``: the request's id, for errors."""
        if self.kind == CORRID:
            return self._corrid(correlation_id, shape, whose)
        on = ready and (self.kind == READY or bool(flags & _FLAGS[self.kind]))
        made = self._made.get((on, shape))
        if made is None:
            value = self.true_value if on else self.false_value
            data = np.full(shape, value, dtype=codec.numpy_dtype(self.datatype))
            made = self._made[on, shape] = tensor_data.input_tensor(self.name, self.datatype, data)
        return made

    def _corrid(self, correlation_id: Any, shape: tuple[int, ...], whose: str) -> InputTensor:
        value: Any = correlation_id
        if self.datatype == "BYTES":
            data = codec.bytes_array([str(value).encode()] * codec.element_count(shape), shape)
            return tensor_data.input_tensor(self.name, "BYTES", data)
        try:
            value = int(value)
        except ValueError:
            raise invalid_arg(
                f"correlation id '{value}' of request '{whose}' is not an integer, but "
                f"{CORRID} is {self.config_type}"
            ) from None
        try:
            data = np.full(shape, value, dtype=codec.numpy_dtype(self.datatype))
        except OverflowError:
            raise invalid_arg(
                f"correlation id {value} of request '{whose}' does not fit {self.config_type}, "
                f"the type of {CORRID}"
            ) from None
        return tensor_data.input_tensor(self.name, self.datatype, data)


@dataclass(frozen=True)
class State:
    """An implicit state: fed as ``input_name``, returned as ``output_name``."""

    input_name: str
    output_name: str
    config_type: str
    dims: tuple[int, ...]
    initial: np.ndarray  # a sequence's first value, without the batch dimension

    @property
    def datatype(self) -> str:
        return codec.config_to_wire_datatype(self.config_type)

    def initial_tensor(self, batching: bool, batch: int = 1) -> InputTensor:
        data = np.repeat(self.initial[None], batch, axis=0) if batching else self.initial.copy()
        return tensor_data.input_tensor(self.input_name, self.datatype, data)


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
    if kind == CORRID and config_type not in CORRID_TYPES:
        raise invalid_arg(
            f"unexpected data type for control {CORRID} for {model}. Allowed data types are "
            "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"
        )
    return Control(kind, name, config_type)


def states(config: Any, model: str, repository_path: str) -> list[State]:
    """The implicit states of ``sequence_batching`` with their initial values, checked as
    Triton checks ``initial_state``."""
    if not config.HasField("sequence_batching"):
        return []
    out: list[State] = []
    for s in config.sequence_batching.state:
        config_type = config_type_name(s.data_type)
        datatype = codec.config_to_wire_datatype(config_type)
        dims = tuple(int(d) for d in s.dims)
        if s.input_name in (o.input_name for o in out):
            raise invalid_arg(f"State input name '{s.input_name}' specified more than once.")
        if len(s.initial_state) > 1:
            raise invalid_arg(
                f"initial_state field for state input '{s.input_name}' must contain exactly one "
                f"or zero element. Found '{len(s.initial_state)}' elements."
            )
        if s.initial_state:
            initial = _initial(s, s.initial_state[0], datatype, dims, repository_path)
        else:
            initial = tensor_data.zeros(datatype, [1 if d < 0 else d for d in dims])
        out.append(State(s.input_name, s.output_name, config_type, dims, initial))
    return out


def _initial(s: Any, init: Any, datatype: str, dims: tuple[int, ...], repo: str) -> np.ndarray:
    name = s.input_name
    if init.data_type != s.data_type:
        raise invalid_arg(
            f"The data type used for 'initial_state' field of state '{name}' does not match "
            "the state data type."
        )
    if not init.name:
        raise invalid_arg(
            f"Field 'name' must be set when using initial_state for state input '{name}'."
        )
    shape = [int(d) for d in init.dims]
    if len(shape) != len(dims):
        raise invalid_arg(
            "Number of dimensions in 'initial_state' doesn't match the size of 'state' "
            f"dimensions for state input '{name}'. {len(shape)} != {len(dims)}"
        )
    for got, want in zip(shape, dims, strict=True):
        if got < 0:
            raise invalid_arg(
                f"'initial_state' field for state input name '{name}' contains variable dimensions."
            )
        if want >= 0 and got != want:
            raise invalid_arg(
                f"'initial_state' dim for input name '{name}' doesn't match 'state' dim "
                f"description. {got} != {want}"
            )
    kind = init.WhichOneof("state_data")
    if kind == "zero_data":
        return tensor_data.zeros(datatype, shape)
    if kind == "data_file":
        folder = os.path.join(repo, INITIAL_STATE_FOLDER)
        return tensor_data.from_file(folder, init.data_file, datatype, shape, "initial_state")
    raise invalid_arg(f"initial_state setting expects state'{name}' to have state_data set")


class SequenceInputs:
    """The control tensors and initial states of one sequence model, built for requests."""

    def __init__(self, config: Any, model: str, repository_path: str) -> None:
        self.model = model
        self.batching = config.max_batch_size > 0
        self.controls = controls(config, model)
        self.states = states(config, model, repository_path)
        # the inputs these are (a null request copies every other input of a real one)
        self.owned = {c.name for c in self.controls} | {s.input_name for s in self.states}

    @classmethod
    def of(cls, config: Any, model: str, repository_path: str) -> SequenceInputs | None:
        """None for a model without sequence batching."""
        if not config.HasField("sequence_batching"):
            return None
        return cls(config, model, repository_path)

    def add_controls(
        self,
        inputs: dict[str, InputTensor],
        correlation_id: Any,
        flags: int,
        batch: int = 1,
        ready: bool = True,
        request_id: str = "",
    ) -> None:
        """Add the control tensors ``inputs`` does not carry already."""
        shape = (batch, 1) if self.batching else (1,)
        for control in self.controls:
            if control.name not in inputs:
                try:
                    tensor = control.tensor(correlation_id, flags, ready, shape, request_id)
                except InferpoolError as err:
                    raise InferpoolError(err.code, f"model '{self.model}': {err.message}") from None
                inputs[control.name] = tensor

    def add_initial_states(self, inputs: dict[str, InputTensor], batch: int = 1) -> None:
        """Add each state's initial value where ``inputs`` carries none."""
        for state in self.states:
            if state.input_name not in inputs:
                inputs[state.input_name] = state.initial_tensor(self.batching, batch)
