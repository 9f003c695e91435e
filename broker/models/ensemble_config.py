"""Ensemble models (``platform: "ensemble"``): their configuration checked as Triton checks it.

Two passes, as in Triton.  When the configuration is read, the ensemble's own wiring
(:func:`wiring`, a ``wire.ensemble_wiring.Wiring``): steps name a model and map inputs and
outputs, every ensemble input is used, every output is written, no tensor dangles (a cycle
leaves some output unwritten).  Once the composing models have loaded, their served
configurations against that wiring (:func:`check_composing`): mapped inputs and outputs
exist, every required input is mapped, one data type and one shape per tensor, batch sizes
fit, and decoupled steps do not mix.  Messages are Triton's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import model_config_pb2 as pb

from inferpool.wire.contract import shape_text
from inferpool.wire.ensemble_wiring import Step, Wiring
from inferpool.wire.errors import invalid_arg

PLATFORM = "ensemble"


def is_ensemble(config: pb.ModelConfig) -> bool:
    """Whether ``config`` declares an ensemble."""
    return config.platform == PLATFORM or config.HasField("ensemble_scheduling")


def check_platform(config: pb.ModelConfig) -> str | None:
    """What is wrong with how ``config`` declares (or half-declares) an ensemble."""
    name = config.name
    if config.HasField("ensemble_scheduling") and config.platform != PLATFORM:
        return (
            f"ensemble scheduling cannot be set for model '{name}' whose platform is not {PLATFORM}"
        )
    if config.platform != PLATFORM:
        return None
    if config.backend:
        return (
            f"Ensemble model '{name}' must have platform type '{PLATFORM}' and empty backend type"
        )
    if not config.HasField("ensemble_scheduling"):
        return f"ensemble scheduling must be set for ensemble {name} whose platform is {PLATFORM}"
    if config.instance_group:
        return f"instance group should not be specified for ensemble '{name}'"
    if config.HasField("optimization"):
        return f"optimization should not be specified for ensemble '{name}'"
    if config.model_warmup:
        return f"model_warmup can not be specified for ensemble '{name}'"
    return None


def wiring(config: pb.ModelConfig) -> Wiring:
    """The ensemble's wiring, checked; INVALID_ARG with Triton's message if it is wrong."""
    name = config.name
    raw = config.ensemble_scheduling.step
    if not raw:
        raise invalid_arg(f"must specify 'step' for ensemble '{name}'")
    steps: list[Step] = []
    written: set[str] = set()
    for i, s in enumerate(raw):
        for what, value in (("model_name", s.model_name), ("input_map", s.input_map)):
            if not value:
                raise invalid_arg(f"must specify '{what}' in step {i} of ensemble '{name}'")
        if not s.output_map:
            raise invalid_arg(f"must specify 'output_map' in step {i} of ensemble '{name}'")
        for tensor in s.output_map.values():
            if tensor in written:
                raise invalid_arg(
                    f"ensemble tensor '{tensor}' can appear in an output map only once for "
                    f"ensemble '{name}' step {i}"
                )
            written.add(tensor)
        version = int(s.model_version) if s.model_version > 0 else -1
        steps.append(Step(i, s.model_name, version, dict(s.input_map), dict(s.output_map)))
    inputs = tuple(t.name for t in config.input)
    outputs = tuple(t.name for t in config.output)
    found = Wiring(name, tuple(steps), inputs, outputs)
    _check_flow(found)
    return found


def _check_flow(wiring: Wiring) -> None:
    """Every input read, every output written, no tensor that leads nowhere."""
    name, steps, inputs, outputs = wiring.name, wiring.steps, wiring.inputs, wiring.outputs
    readers, written = wiring.readers, wiring.writer
    for tensor in inputs:
        if tensor not in readers:
            raise invalid_arg(f"ensemble input '{tensor}' for ensemble '{name}' is not used")
    ready = set(inputs)
    queue = deque(inputs)
    done: set[int] = set()
    while queue:
        tensor = queue.popleft()
        for i in readers.get(tensor, ()):
            step = steps[i]
            if i in done or not step.ready(ready.__contains__):
                continue
            done.add(i)
            for out in step.outputs.values():
                if out not in ready:
                    ready.add(out)
                    queue.append(out)
    for tensor in outputs:
        if tensor in inputs:  # Triton passes it through; here answers come from the steps
            raise invalid_arg(
                f"ensemble output '{tensor}' for ensemble '{name}' is one of its inputs: "
                "map it through a step"
            )
        if tensor not in written and tensor not in ready:
            raise invalid_arg(f"ensemble output '{tensor}' for ensemble '{name}' is not used")
        if tensor not in ready:
            source = _unconnected(tensor, steps, written, ready)
            detail = (
                f": at least one of its depending tensors, '{source}', is not connected"
                if source != tensor
                else ""
            )
            raise invalid_arg(f"output '{tensor}' for ensemble '{name}' is not written{detail}")
    for tensor in sorted(set(written) | set(readers)):
        if tensor in outputs:
            continue
        if tensor not in ready or tensor not in readers:
            raise invalid_arg(f"ensemble tensor '{tensor}' is unused in ensemble '{name}'")


def _unconnected(
    tensor: str, steps: Sequence[Step], written: Mapping[str, int], ready: set[str]
) -> str:
    """The furthest tensor upstream of ``tensor`` that never becomes ready."""
    seen = {tensor}
    current = tensor
    while current in written:
        step = steps[written[current]]
        nxt = next((t for t in step.inputs.values() if t not in ready and t not in seen), None)
        if nxt is None:
            break
        seen.add(nxt)
        current = nxt
    return current


# ---------------------------------------------------------------------------- composing models
@dataclass
class _Node:
    model: str
    datatype: int
    dims: tuple[int, ...]
    full: tuple[int, ...]  # with the batch dimension, where the model batches


def _node(model: str, batching: bool, tensor: Any, reshape: bool = False) -> _Node:
    dims = tuple(tensor.reshape.shape if reshape and tensor.HasField("reshape") else tensor.dims)
    return _Node(model, tensor.data_type, dims, ((-1,) if batching else ()) + dims)


def check_composing(
    wiring: Wiring, config: pb.ModelConfig, composing: Mapping[str, pb.ModelConfig]
) -> bool:
    """Check the composing models' served configs against the wiring; True when the ensemble
    is decoupled (some step is)."""
    name = wiring.name
    batching = config.max_batch_size > 0
    tensors: dict[str, _Node] = {}
    for t in config.input:
        tensors[t.name] = _node(name, batching, t, reshape=True)
    for t in config.output:
        tensors.setdefault(t.name, _node(name, batching, t, reshape=True))
    decoupled_steps: set[int] = set()
    for step in wiring.steps:
        model = composing[step.model_name]
        mbs = model.max_batch_size
        if mbs != 0 and mbs < config.max_batch_size:
            raise invalid_arg(
                f"ensemble {name} allows maximum batch size {config.max_batch_size}, but it "
                f"contains model {step.model_name} which only allows maximum batch size to be "
                f"{mbs}"
            )
        _check_step(name, step, model, tensors)
        if model.model_transaction_policy.decoupled:
            decoupled_steps.add(step.index)
    _check_decoupled(wiring, decoupled_steps)
    return bool(decoupled_steps)


def _check_step(name: str, step: Step, model: pb.ModelConfig, tensors: dict[str, _Node]) -> None:
    """Triton's ValidateTensorMapping for one step."""
    sid = step.model_name
    batching = model.max_batch_size > 0
    inputs = {t.name: t for t in model.input}
    for model_input, tensor in step.inputs.items():
        if model_input not in inputs:
            raise invalid_arg(
                f"in ensemble {name}, ensemble tensor {tensor} is mapping to non-existing "
                f"input {model_input} in model {sid}"
            )
    for model_input, spec in inputs.items():
        mapped = step.inputs.get(model_input)
        if mapped is None:
            if spec.optional:
                continue
            raise invalid_arg(
                f"in ensemble {name}, input {model_input} in model {sid} is not mapped to any "
                "ensemble tensors"
            )
        _unify(name, mapped, tensors, _node(sid, batching, spec))
    outputs = {t.name: t for t in model.output}
    for model_output, tensor in step.outputs.items():
        if model_output not in outputs:
            raise invalid_arg(
                f"in ensemble {name}, ensemble tensor {tensor} is mapped from non-existing "
                f"output {model_output} in model {sid}"
            )
        _unify(name, tensor, tensors, _node(sid, batching, outputs[model_output]))


def _unify(name: str, tensor: str, tensors: dict[str, _Node], node: _Node) -> None:
    known = tensors.setdefault(tensor, node)
    if known is node:
        return
    prefix = f"in ensemble {name}, ensemble tensor {tensor}: "
    if known.datatype != node.datatype:
        raise invalid_arg(
            f"{prefix}inconsistent data type: {pb.DataType.Name(known.datatype)} is inferred "
            f"from model {known.model} while {pb.DataType.Name(node.datatype)} is inferred "
            f"from model {node.model}"
        )
    if not _same_dims(known.dims, node.dims) and not _same_dims(known.full, node.full):
        raise invalid_arg(
            f"{prefix}inconsistent shape: {shape_text(known.full)} is inferred from model "
            f"{known.model} while {shape_text(node.full)} is inferred from model {node.model}"
        )


def _same_dims(a: Sequence[int], b: Sequence[int]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=True))


def _check_decoupled(wiring: Wiring, decoupled: set[int]) -> None:
    """A step must not read tensors that came out of different decoupled steps (their
    responses do not pair up)."""
    origin: dict[str, int] = {t: -1 for t in wiring.inputs}  # tensor -> its decoupled source
    pending = list(wiring.steps)
    while pending:
        progressed = False
        for step in list(pending):
            sources = [origin.get(t) for t in step.inputs.values()]
            if any(s is None for s in sources):
                continue
            pending.remove(step)
            progressed = True
            if len(set(sources)) > 1 and any(s != -1 for s in sources):
                raise invalid_arg(
                    f"in ensemble {wiring.name}, step of model '{step.model_name}' receives "
                    "inputs originated from different decoupled models"
                )
            source = step.index if step.index in decoupled else sources[0]
            for tensor in step.outputs.values():
                origin[tensor] = source if source is not None else -1
        if not progressed:
            return
