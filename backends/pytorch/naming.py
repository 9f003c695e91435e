"""Which config tensor feeds which forward argument, and which model output is which.

The seed's rules (``GetNamingConvention``, ``ValidateInputs``, ``ValidateOutputs``):

* inputs are matched to forward-argument names when every config input is one; otherwise
  by ``<name>__<index>``; otherwise by their order in the config;
* outputs by ``<name>__<index>``, otherwise by config order;
* control and state tensors always by ``<name>__<index>``;
* a single ``Dict[str, Tensor]`` argument takes every input keyed by its config name.

Error messages and codes are the seed's.  One check is added: the mapped indices must
cover the forward arguments exactly once, so a mis-numbered config fails at load rather
than inside the model.
"""

from __future__ import annotations

import enum
import functools
import logging
from dataclasses import dataclass
from typing import Any

from inferpool.backends.pytorch.dtypes import config_type_name, supported, wire_datatype
from inferpool.backends.sequence import CORRID, Control, State
from inferpool.wire.errors import internal, invalid_arg


class Convention(enum.Enum):
    """How config tensors map onto forward arguments and outputs (Triton's three rules)."""

    NAMED_INDEX = "<name>__<index>"
    FORWARD_ARGUMENT = "forward argument names"
    STRICT_CONFIG_ORDERING = "configuration order"


@dataclass(frozen=True)
class Arg:
    """One forward argument after ``self``: name and kind ('tensor', 'list', 'dict', 'other')."""

    name: str
    kind: str
    type_str: str


@dataclass(frozen=True)
class TensorSpec:
    """A config input, output or state tensor."""

    name: str
    config_type: str
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None = None

    @functools.cached_property
    def datatype(self) -> str:  # computed once: it is asked for on every request
        return wire_datatype(self.config_type)

    @property
    def model_dims(self) -> tuple[int, ...]:
        """The shape the model sees (after ``reshape``), without the batch dimension."""
        return self.dims if self.reshape is None else self.reshape


@dataclass(frozen=True)
class InputLayout:
    """Where each config input goes in the forward call."""

    is_dict: bool
    index: dict[str, int]  # input name -> forward position (dict inputs: insertion order)
    arg_count: int


@dataclass(frozen=True)
class OutputSpec(TensorSpec):
    """A config output and the index of the model's output it is."""

    index: int = 0
    config_output: bool = True  # listed in ``output``: returned to the client when requested
    state: bool = False  # an implicit state: always returned (to the sequence batcher)


def named_index(name: str) -> int | None:
    """The index of ``<name>__<index>`` (the first ``__`` splits, as in the seed), else None."""
    _, sep, tail = name.partition("__")
    if sep and tail.isascii() and tail.isdigit():
        return int(tail)
    return None


def tensor_spec(io: Any) -> TensorSpec:
    """A config input's or output's name, datatype, dims and reshape."""
    reshape = tuple(io.reshape.shape) if io.HasField("reshape") else None
    return TensorSpec(io.name, config_type_name(io.data_type), tuple(io.dims), reshape)


def _control_index(name: str) -> int:
    index = named_index(name)
    if index is None:
        raise internal(f"input '{name}' does not follow <name>__<index> naming convention.")
    return index


def convention(
    kind: str,
    names: list[str],
    allowed: list[str],
    states: list[State],
    model: str,
    log: logging.Logger,
) -> Convention:
    """The seed's ``GetNamingConvention`` for ``kind`` 'input' or 'output'."""
    chosen = Convention.NAMED_INDEX
    if kind == "input" and all(n in allowed for n in names):
        chosen = Convention.FORWARD_ARGUMENT
    if chosen is Convention.NAMED_INDEX:
        for name in names:
            if "__" not in name:
                chosen = Convention.STRICT_CONFIG_ORDERING
                break
            if named_index(name) is None:
                what = (
                    f"input '{name}' or previous input(s) are neither an input argument to the "
                    f"model '{model}' nor do they follow"
                    if kind == "input"
                    else f"output '{name}' or previous output(s) of the model '{model}' do "
                    "not follow"
                )
                log.warning(
                    "%s the <name>__<index> naming convention. Falling back to enforcing strict "
                    "ordering from model configuration.",
                    what,
                )
                chosen = Convention.STRICT_CONFIG_ORDERING
                break
    if states and chosen is not Convention.NAMED_INDEX:
        raise invalid_arg(
            f"PyTorch model '{model}' is using sequence batching with state but not all inputs "
            "and outputs follow the <name>__<index> naming convention."
        )
    for state in states:
        name = state.input_name if kind == "input" else state.output_name
        if named_index(name) is None:
            raise invalid_arg(
                f"PyTorch model '{model}' is using sequence batching with state but state "
                f"'{name}' does not follow the <name>__<index> naming convention."
            )
    return chosen


def _check_type(
    config_type: str, dims: tuple[int, ...], what: str, name: str, model: str, batching: bool
) -> None:
    if not supported(config_type) and config_type != "TYPE_STRING":
        raise internal(
            f"unsupported datatype {config_type} for {what} '{name}' for model '{model}'"
        )
    if config_type == "TYPE_STRING" and len(dims) + (1 if batching else 0) > 1:
        direction = "output" if what in ("output", "state") else "input"
        raise internal(
            f"Triton only supports 1 dimensional List of String as {direction} for '{name}' "
            f"for model '{model}'"
        )


def _forward_inputs(args: list[Arg], expected: int, model: str) -> tuple[bool, list[str]]:
    """(is_dict, allowed input names) from the forward signature, as the seed checks it."""
    if len(args) == 1 and args[0].kind == "dict":
        return True, []
    if any(a.kind == "dict" for a in args[1:]):
        raise internal(
            "Multiple inputs of kind DictType were detected. Only a single input of type "
            "Dict(str, Tensor) is supported."
        )
    for a in args:
        if a.kind not in ("tensor", "list"):
            raise internal(
                f"An input of type '{a.type_str}' was detected in the model. Only a single input "
                "of type Dict(str, Tensor) or input(s) of type Tensor are supported."
            )
    if len(args) != expected:
        raise invalid_arg(
            f"unable to load model '{model}', configuration expects {expected} inputs, model "
            f"provides {len(args)}"
        )
    return False, [a.name for a in args]


def input_layout(
    args: list[Arg],
    inputs: list[TensorSpec],
    controls: list[Control],
    states: list[State],
    model: str,
    batching: bool,
    log: logging.Logger,
    batch_targets: tuple[str, ...] = (),
) -> InputLayout:
    """Validate the config inputs against the forward signature and place each one; the
    batch inputs' ``batch_targets`` come after the config's inputs, placed by the same
    convention (Triton's libtorch backend)."""
    index = {c.name: _control_index(c.name) for c in controls}
    for c in controls:
        if c.kind == CORRID and not supported(c.config_type):
            raise internal(f"input '{c.name}' type '{c.config_type}' is not supported by PyTorch.")
    expected = len(inputs) + len(controls) + len(states) + len(batch_targets)
    is_dict, allowed = _forward_inputs(args, expected, model)
    if not inputs:
        raise internal("model configuration must contain at least one input, none were specified.")
    names = [i.name for i in inputs]
    chosen = convention("input", names, allowed, states, model, log)
    for position, spec in enumerate(inputs):
        _check_type(spec.config_type, spec.model_dims, "input", spec.name, model, batching)
        index[spec.name] = _position(chosen, is_dict, spec.name, position, allowed)
    for position, state in enumerate(states):
        _check_type(state.config_type, state.dims, "input state", state.input_name, model, batching)
        index[state.input_name] = _position(chosen, is_dict, state.input_name, position, allowed)
    for position, name in enumerate(batch_targets, len(inputs)):
        if chosen is Convention.FORWARD_ARGUMENT and name not in allowed:
            raise invalid_arg(
                f"batch input '{name}' of model '{model}' is not an argument of its forward(); "
                f"its arguments are {', '.join(allowed)}"
            )
        if chosen is Convention.NAMED_INDEX and named_index(name) is None:
            raise internal(f"input '{name}' does not follow <name>__<index> naming convention.")
        index[name] = _position(chosen, is_dict, name, position, allowed)
    if not is_dict:
        _check_coverage(index, len(args), model)
    return InputLayout(is_dict, index, len(args))


def _position(
    chosen: Convention, is_dict: bool, name: str, position: int, allowed: list[str]
) -> int:
    if is_dict or chosen is Convention.STRICT_CONFIG_ORDERING:
        return position
    if chosen is Convention.FORWARD_ARGUMENT:
        return allowed.index(name)
    index = named_index(name)
    assert index is not None  # NAMED_INDEX was chosen because every name has one
    return index


def _check_coverage(index: dict[str, int], arg_count: int, model: str) -> None:
    by_position: dict[int, str] = {}
    for name, position in index.items():
        if position >= arg_count:
            raise invalid_arg(
                f"input '{name}' of model '{model}' refers to forward argument {position}, but "
                f"forward() takes {arg_count} input(s)"
            )
        if position in by_position:
            raise invalid_arg(
                f"inputs '{by_position[position]}' and '{name}' of model '{model}' both refer "
                f"to forward argument {position}"
            )
        by_position[position] = name


def output_layout(
    outputs: list[TensorSpec],
    states: list[State],
    model: str,
    batching: bool,
    log: logging.Logger,
) -> dict[str, OutputSpec]:
    """Validate the config outputs and states and give each its index in the model's result."""
    if not outputs:
        raise internal("model configuration must contain at least one output, none were specified.")
    chosen = convention("output", [o.name for o in outputs], [], states, model, log)
    layout: dict[str, OutputSpec] = {}
    for position, spec in enumerate(outputs):
        _check_type(spec.config_type, spec.model_dims, "output", spec.name, model, batching)
        index = position if chosen is Convention.STRICT_CONFIG_ORDERING else named_index(spec.name)
        assert index is not None
        layout[spec.name] = OutputSpec(spec.name, spec.config_type, spec.dims, spec.reshape, index)
    for state in states:
        _check_type(state.config_type, state.dims, "state", state.output_name, model, batching)
        index = named_index(state.output_name)
        assert index is not None  # convention() checked every state name
        known = layout.get(state.output_name)
        if known is not None:
            layout[state.output_name] = OutputSpec(
                known.name, known.config_type, known.dims, known.reshape, index, True, True
            )
        else:
            layout[state.output_name] = OutputSpec(
                state.output_name, state.config_type, state.dims, None, index, False, True
            )
    return layout
