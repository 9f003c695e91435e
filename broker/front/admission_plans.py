"""Admission plans: what checking an infer request found, kept per request signature.

A client sends the same request again and again with new data: the same model, inputs (names,
datatypes, shapes, where their bytes lie) and outputs; only its ``id`` changes.  Everything
admission checks of such a request depends on that signature and the model alone, so it is
checked once, in full (Triton's words, ``wire.contract``), and what it found is kept as a
:class:`Plan` on the model version, under the header's bytes less its ``id``, its
``parameters`` and the lease releases it carries: the next request of that signature costs
one encoding and one dict lookup.  What depends on the request itself stays per request in
``front.admission``: the frames' sizes against the inputs', the client's shared-memory
regions (resolved each time: a region may be unregistered between two requests), the limits.

A request's ``parameters`` (sequences, priorities, timeouts, a backend's own) are no part of
its signature: their values change from one request to the next, so they are checked for
each request (``scheduling``), which costs nothing when it has none.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from inferpool.broker.models.batch_shapes import ShapeKey
from inferpool.broker.models.registry import ModelVersion
from inferpool.broker.models.request import FLAG_SEQUENCE_END, FLAG_SEQUENCE_START
from inferpool.wire.contract import InputChecks, check_output, input_spec
from inferpool.wire.errors import Code, InferpoolError, invalid_arg
from inferpool.wire.worker.protocol import WantedOutput, Window

PLANS = 256  # signatures a model version keeps; all are dropped when it has this many
_BROKER_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end", "priority", "timeout")
_NO_PARAMETERS: dict[str, Any] = {}
# (name, datatype, shape, byte size or None (BYTES), shared-memory parameters or None: a frame)
PlanInput = tuple[str, str, tuple[int, ...], int | None, dict[str, Any] | None]


class SharedMemoryInputs(Protocol):
    """Resolves inputs that name a client-registered shared-memory region."""

    def resolve_input(
        self, client: bytes, name: str, params: dict[str, Any], nbytes: int | None
    ) -> tuple[str, int, int]:
        """(region, offset, byte size) of the input's bytes, or an InferpoolError."""
        ...

    def resolve_output(self, client: bytes, name: str, params: dict[str, Any]) -> Window | None:
        """Where in a client region the output is to be written, or None (``output_handle``:
        the worker's own arena, answered with a handle)."""
        ...


class Plan:
    """One signature's inputs in order and the outputs it asks for."""

    __slots__ = ("batch", "inputs", "outputs", "shape_key", "shm_outputs", "work_outputs")

    def __init__(
        self,
        inputs: list[PlanInput],
        batch: int,
        outputs: dict[str, dict[str, Any]],
        work_outputs: list[WantedOutput],
        shm_outputs: Any,
        shape_key: ShapeKey,
    ) -> None:
        self.inputs = inputs
        self.batch = batch or 1
        self.outputs = outputs
        self.work_outputs = work_outputs
        self.shm_outputs = shm_outputs  # the outputs' entries when one names shared memory
        self.shape_key = shape_key  # which requests it may share a batch with


def plan_for(header: dict[str, Any], model: ModelVersion, shm: SharedMemoryInputs | None) -> Plan:
    """The plan of ``header`` (its ``id`` and releases taken out) for ``model``: kept from an
    earlier request of the same signature, or made by checking it in full (InferpoolError)."""
    try:
        key = orjson.dumps(header)
    except TypeError:  # an integer beyond 64 bits: checked in full, and not kept
        return _plan(header, model, shm)
    plans = model.plans
    plan = plans.get(key)
    if plan is None:
        plan = _plan(header, model, shm)
        if len(plans) >= PLANS:
            plans.clear()
        plans[key] = plan
    return plan


def _plan(header: dict[str, Any], model: ModelVersion, shm: SharedMemoryInputs | None) -> Plan:
    name = model.name
    raw = header.get("inputs")
    if not isinstance(raw, list):
        raise invalid_arg(f"inference request for model '{name}' has no 'inputs' list")
    inputs: list[PlanInput] = []
    checks = InputChecks(name, model.max_batch_size, model.required)
    for i, inp in enumerate(raw):
        if not isinstance(inp, dict):
            raise invalid_arg(f"inputs[{i}] of the request must be an object")
        iname = inp.get("name")
        spec = input_spec(name, model.inputs, iname)
        datatype = inp.get("datatype")
        shape = _shape(inp.get("shape"), spec.name)
        expected_bytes = checks.add(spec, datatype, shape)
        params = inp.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise invalid_arg(f"parameters of input '{spec.name}' must be an object")
        in_shm = params is not None and "shared_memory_region" in params
        if in_shm and shm is None:
            raise InferpoolError(
                Code.UNSUPPORTED, "shared-memory inputs are not enabled on this server"
            )
        inputs.append((spec.name, str(datatype), shape, expected_bytes, params if in_shm else None))
    batch = checks.done()
    raw_outputs = header.get("outputs")
    outputs, work_outputs, in_shm = outputs_of(raw_outputs, model, b"", None)
    if in_shm and shm is None:
        raise InferpoolError(
            Code.UNSUPPORTED, "shared-memory outputs are not enabled on this server"
        )
    shm_outputs = raw_outputs if in_shm else None
    shape_key = model.batch_shapes.key((i[0], i[2]) for i in inputs)
    return Plan(inputs, batch, outputs, work_outputs, shm_outputs, shape_key)


def _shape(raw: Any, name: str) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(type(d) is int and d >= 0 for d in raw):
        raise invalid_arg(
            f"input '{name}': shape must be a list of non-negative integers, got {raw!r}"
        )
    return tuple(raw)


def outputs_of(
    raw: Any, model: ModelVersion, client: bytes, shm: SharedMemoryInputs | None
) -> tuple[dict[str, dict[str, Any]], list[WantedOutput], bool]:
    """The outputs a request asks for, each with its parameters; a window in the client's
    memory is resolved only with ``shm`` (per request: the plan only notes that one is)."""
    if not raw:
        return model.default_outputs, model.default_work_outputs, False
    if not isinstance(raw, list):
        raise invalid_arg("request 'outputs' must be a list")
    outputs: dict[str, dict[str, Any]] = {}
    work: list[WantedOutput] = []
    in_shm = False
    for i, out in enumerate(raw):
        oname = out.get("name") if isinstance(out, dict) else None
        oname = check_output(model.name, model.outputs, oname)
        if oname in outputs:
            raise invalid_arg(f"output '{oname}' is requested more than once (outputs[{i}])")
        params = out.get("parameters") or {}
        if not isinstance(params, dict):
            raise invalid_arg(f"parameters of output '{oname}' must be an object")
        target = None
        if "shared_memory_region" in params or "output_handle" in params:
            in_shm = True
            if shm is not None:
                target = shm.resolve_output(client, oname, params)
        outputs[oname] = params
        work.append(WantedOutput(oname, target))
    return outputs, work, in_shm


def scheduling(parameters: Any, model: ModelVersion) -> tuple[Any, int, int, int, dict[str, Any]]:
    """What a request's ``parameters`` (checked per request: their values change from one
    request to the next) say: its correlation id, sequence flags, timeout (us), priority
    level, and the parameters its backend sees."""
    if not parameters:
        return 0, 0, 0, model.default_priority, _NO_PARAMETERS
    if not isinstance(parameters, dict):
        raise invalid_arg("request 'parameters' must be an object")
    passed = {k: v for k, v in parameters.items() if k not in _BROKER_PARAMETERS}
    return (*_scheduling(parameters, model), passed)


def _scheduling(params: dict[str, Any], model: ModelVersion) -> tuple[Any, int, int, int]:
    """The request's correlation id, sequence flags, timeout (us) and priority level."""
    corr = params.get("sequence_id", 0)
    if not isinstance(corr, int | str) or isinstance(corr, bool):
        raise invalid_arg(f"sequence_id must be an integer or a string, got {corr!r}")
    flags = 0
    for key, flag in (("sequence_start", FLAG_SEQUENCE_START), ("sequence_end", FLAG_SEQUENCE_END)):
        value = params.get(key, False)
        if not isinstance(value, bool):
            raise invalid_arg(f"{key} must be a boolean, got {value!r}")
        if value:
            flags |= flag
    if flags and not corr:
        raise invalid_arg(
            f"inference request to model '{model.name}' must specify a non-zero or non-empty "
            "correlation ID (sequence_id) with sequence_start/sequence_end"
        )
    timeout = params.get("timeout", 0)
    if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 0:
        raise invalid_arg(f"timeout must be a non-negative integer (microseconds), got {timeout!r}")
    priority = params.get("priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool) or priority < 0:
        raise invalid_arg(f"priority must be a non-negative integer, got {priority!r}")
    if not priority or priority > model.priority_levels:  # as Triton: the default level
        priority = model.default_priority
    return corr, flags, timeout, priority
