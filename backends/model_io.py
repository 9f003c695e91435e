"""A model file's inputs and outputs against its config: Triton's auto-complete and checks.

Backends that read a model format describing its own tensors (ONNX Runtime, OpenVINO) share
these rules, as Triton's onnxruntime and openvino backends do:

* :func:`autocomplete` fills what the config leaves out: ``max_batch_size`` (the backend
  config's ``default-max-batch-size``, 4 unless set) when every tensor's first dimension is
  variable, ``dynamic_batching`` when the model then batches, and the inputs and outputs;
* :func:`check_inputs`, :func:`check_outputs` and :func:`check_controls` refuse a config that
  contradicts the model, naming the tensor, in Triton's words.

Shapes use -1 for a variable dimension; ``config_type`` is the config's ``TYPE_*`` name.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import model_config_pb2 as pb

from inferpool.backends import sequence
from inferpool.wire.errors import internal, invalid_arg

DEFAULT_MAX_BATCH_SIZE = 4  # Triton's default for --backend-config=default-max-batch-size


@dataclass(frozen=True)
class ModelTensor:
    """An input or output as the model file declares it."""

    name: str
    config_type: str  # "TYPE_FP32"; "TYPE_INVALID" for a type the config cannot name
    shape: tuple[int, ...]  # -1 for a variable dimension


@dataclass(frozen=True)
class DimRules:
    """How a backend compares a config's dims with the model's (Triton's two backends
    differ): whether a model that batches must have a variable first dimension (else the
    first dimension is the batch, whatever its size), and whether a variable model
    dimension matches any configured one, outputs included."""

    variable_batch: bool
    variable_matches_any: bool


ONNX_RULES = DimRules(variable_batch=True, variable_matches_any=False)
OPENVINO_RULES = DimRules(variable_batch=False, variable_matches_any=True)


def default_max_batch_size(backend_config: dict[str, str], backend: str) -> int:
    """``--backend-config=[<backend>,]default-max-batch-size=<int>``, or Triton's default."""
    raw = backend_config.get("default-max-batch-size")
    if raw is None:
        return DEFAULT_MAX_BATCH_SIZE
    try:
        return int(raw)
    except ValueError:
        raise invalid_arg(
            f"backend '{backend}': default-max-batch-size must be an integer, got '{raw}'"
        ) from None


def shape_str(shape: Sequence[int]) -> str:
    """A shape as Triton writes it in messages: ``[2,-1]``."""
    return "[" + ",".join(str(d) for d in shape) + "]"


def can_batch(inputs: Sequence[ModelTensor], outputs: Sequence[ModelTensor]) -> bool:
    """Whether every tensor's first dimension is variable (the model may batch)."""
    return all(t.shape and t.shape[0] == -1 for t in (*inputs, *outputs))


def autocomplete(
    config: Any,
    name: str,
    inputs: Sequence[ModelTensor],
    outputs: Sequence[ModelTensor],
    batching: bool,
    default_max_batch: int,
    log: logging.Logger,
) -> Any:
    """A completed copy of ``config``: batching where the model ``batching`` allows it (see
    the module's doc) and the inputs and outputs the config lists none of.  A config that
    asks for batching the model cannot do is INVALID_ARG, in Triton's words."""
    done = pb.ModelConfig()
    done.CopyFrom(config)
    if batching:
        if done.max_batch_size == 0:
            done.max_batch_size = max(default_max_batch, 0)
            log.warning(
                "autofilled max_batch_size to %d for model '%s' since batching is supported but "
                "no max_batch_size is specified in model configuration. Must specify "
                "max_batch_size to utilize autofill with a larger max batch size",
                done.max_batch_size,
                name,
            )
        if (
            done.max_batch_size > 1
            and not done.HasField("dynamic_batching")
            and not done.HasField("sequence_batching")
        ):
            done.dynamic_batching.SetInParent()
    elif done.max_batch_size != 0:
        raise invalid_arg(
            f"autofill failed for model '{name}': model does not support batching while "
            "non-zero max_batch_size is specified"
        )
    for kind, tensors in (("input", inputs), ("output", outputs)):
        listed = getattr(done, kind)
        if len(listed):
            log.info("skipping %s model configuration auto-complete for '%s'", kind, name)
            continue
        for tensor in tensors:
            _add(listed, tensor, done.max_batch_size > 0)
    return done


def _add(listed: Any, tensor: ModelTensor, batched: bool) -> None:
    entry = listed.add(name=tensor.name, data_type=pb.DataType.Value(tensor.config_type))
    dims = list(tensor.shape[1:] if batched else tensor.shape)
    if dims:
        entry.dims.extend(dims)
        return
    entry.dims.append(1)  # a scalar (past the batch dimension): [1], reshaped to []
    if batched:
        entry.reshape.SetInParent()


def config_dims(io: Any) -> tuple[int, ...]:
    """The dims a backend's model sees: ``reshape.shape`` where the config reshapes."""
    return tuple(io.reshape.shape) if io.HasField("reshape") else tuple(io.dims)


def _allowed(kind: str, name: str, known: dict[str, ModelTensor]) -> ModelTensor:
    tensor = known.get(name)
    if tensor is None:
        raise invalid_arg(
            f"unexpected inference {kind} '{name}', allowed {kind}s are: "
            + ", ".join(sorted(known))
        )
    return tensor


def _check_type(config_type: str, tensor: ModelTensor, kind: str, model: str) -> None:
    if config_type != tensor.config_type:
        raise invalid_arg(
            f"unable to load model '{model}', configuration expects datatype {config_type} for "
            f"{kind} '{tensor.name}', model provides {tensor.config_type}"
        )


def compare_dims(
    model: str,
    tensor: ModelTensor,
    dims: Sequence[int],
    max_batch_size: int,
    exact: bool,
    rules: DimRules,
) -> None:
    """Triton's ``CompareDimsSupported``: the config's ``dims`` (past the batch dimension
    when the model batches) against the model's shape."""
    shape = tensor.shape
    where = f"model '{model}', tensor '{tensor.name}'"
    if max_batch_size > 0:
        if not shape or (rules.variable_batch and shape[0] != -1):
            need = " and the first dimension must be -1" if rules.variable_batch else ""
            raise invalid_arg(
                f"{where}: for the model to support batching the shape should have at least 1 "
                f"dimension{need}; but shape expected by the model is {shape_str(shape)}"
            )
        full = (-1 if rules.variable_batch else max_batch_size, *dims)
        skip_batch = not rules.variable_batch and not exact
        if not _dims_match(shape, full, exact, rules, skip_batch):
            raise invalid_arg(
                f"{where}: the model expects {len(shape)} dimensions (shape {shape_str(shape)}) "
                f"but the model configuration specifies {len(full)} dimensions (an initial "
                "batch dimension because max_batch_size > 0 followed by the explicit tensor "
                f"shape, making complete shape {shape_str(full)})"
            )
    elif not _dims_match(shape, tuple(dims), exact, rules, False):
        raise invalid_arg(
            f"{where}: the model expects {len(shape)} dimensions (shape {shape_str(shape)}) but "
            f"the model configuration specifies {len(dims)} dimensions (shape {shape_str(dims)})"
        )


def _dims_match(
    shape: Sequence[int], full: Sequence[int], exact: bool, rules: DimRules, skip_first: bool
) -> bool:
    if len(shape) != len(full):
        return False
    for i, (have, want) in enumerate(zip(shape, full, strict=True)):
        if (i == 0 and skip_first) or (have == -1 and (rules.variable_matches_any or not exact)):
            continue
        if have != want:
            return False
    return True


def _check_scalar(model: str, tensor: ModelTensor, dims: Sequence[int]) -> None:
    if any(d != 1 for d in dims):
        raise invalid_arg(
            f"unable to load model '{model}', scalar tensor '{tensor.name}', should only "
            "provide 1 in the model configuration when the model doesn't support batching. "
            f"Model configuration provided: {shape_str(dims)}."
        )


def declared_inputs(config: Any) -> int:
    """How many inputs the config lists, its batch inputs' targets included (Triton skips
    auto-complete of the inputs when there are any)."""
    return len(config.input) + len(batch_input_targets(config))


def batch_input_targets(config: Any) -> list[str]:
    """The model inputs the config's ``batch_input`` entries fill."""
    return [name for bi in config.batch_input for name in bi.target_name]


def check_inputs(
    config: Any,
    name: str,
    model_inputs: Sequence[ModelTensor],
    rules: DimRules,
    overridable: Sequence[ModelTensor] = (),
) -> None:
    """The config's inputs, controls, states and batch inputs against the model's inputs
    (``overridable``: initializers a request may also feed, as ONNX Runtime allows); a
    ragged input must be ``[-1]`` in the model; ``name``: the model's."""
    targets = batch_input_targets(config)
    expected = sum(1 for io in config.input if not io.optional) + len(targets)
    if config.HasField("sequence_batching"):
        expected += len(sequence.controls(config, name))
        expected += len(config.sequence_batching.state)
    if len(model_inputs) != expected:
        raise invalid_arg(
            f"unable to load model '{name}', configuration expects {expected} inputs, model "
            f"provides {len(model_inputs)}"
        )
    known = {t.name: t for t in (*model_inputs, *overridable)}
    for io in config.input:
        if io.optional and config.max_batch_size != 0:
            raise invalid_arg(
                f"unable to load model '{name}', optional input '{io.name}' is not supported "
                "for models that support batching"
            )
        tensor = _allowed("input", io.name, known)
        _check_type(pb.DataType.Name(io.data_type), tensor, "input", name)
        if io.allow_ragged_batch:
            _check_ragged(name, io, tensor)
        else:
            _check_shape(config, name, tensor, config_dims(io), False, rules)
    for target in targets:
        _allowed("input", target, known)
    for state in config.sequence_batching.state:
        tensor = _allowed("input", state.input_name, known)
        _check_type(pb.DataType.Name(state.data_type), tensor, "input state", name)
        _check_shape(config, name, tensor, tuple(state.dims), False, rules)
    check_controls(config, name, known)


def check_outputs(
    config: Any, name: str, model_outputs: Sequence[ModelTensor], rules: DimRules
) -> None:
    """The config's outputs and output states against the model's outputs."""
    known = {t.name: t for t in model_outputs}
    scattered = {target for bo in config.batch_output for target in bo.target_name}
    for io in config.output:
        tensor = _allowed("output", io.name, known)
        _check_type(pb.DataType.Name(io.data_type), tensor, "output", name)
        if io.name not in scattered:  # a batch output's shape is its source input's
            _check_shape(config, name, tensor, config_dims(io), True, rules)
    for state in config.sequence_batching.state:
        tensor = _allowed("output", state.output_name, known)
        _check_type(pb.DataType.Name(state.data_type), tensor, "output state", name)


def _check_ragged(name: str, io: Any, tensor: ModelTensor) -> None:
    """A ragged input is one dimension of any length in the model, and never optional."""
    if io.optional:
        raise invalid_arg(
            f"unable to load model '{name}', configuration expects model provides input with "
            f"shape [-1] for ragged input '{io.name}', which is not supported for optional input"
        )
    if tensor.shape != (-1,):
        raise invalid_arg(
            f"unable to load model '{name}', configuration expects model provides input with "
            f"shape [-1]  for ragged input '{io.name}', model provides {shape_str(tensor.shape)}"
        )


def _check_shape(
    config: Any,
    name: str,
    tensor: ModelTensor,
    dims: tuple[int, ...],
    exact: bool,
    rules: DimRules,
) -> None:
    if tensor.shape:
        compare_dims(name, tensor, dims, config.max_batch_size, exact, rules)
    else:
        _check_scalar(name, tensor, dims)


def check_controls(config: Any, name: str, known: dict[str, ModelTensor]) -> None:
    """Each sequence control names a model input of dims [1] (past the batch dimension)
    and of the control's datatype (Triton's ``Validate*SequenceControl``)."""
    for control in sequence.controls(config, name):
        tensor = known.get(control.name)
        if tensor is None:
            raise internal(
                f"configuration specified sequence control '{control.name}', but model does "
                "not provide that input"
            )
        dims = tensor.shape[1:] if config.max_batch_size > 0 else tensor.shape
        if tuple(dims) != (1,):
            raise invalid_arg(
                f"unable to load model '{name}', sequence control '{control.name}' in model has "
                f"dims {shape_str(dims)} but dims [1] is expected"
            )
        if tensor.config_type != control.config_type:
            raise invalid_arg(
                f"unable to load model '{name}', sequence control '{control.name}', the model "
                f"expects data-type {tensor.config_type} but the model configuration specifies "
                f"data-type {control.config_type}"
            )
