"""Admission: check an infer request against its model and place its inputs in the arena.

Everything a backend could trip over is caught here, before any worker sees the request,
with Triton's wording (``wire.contract``: a lane's worker checks its requests the same way).
An input whose name, datatype and shape the model has checked before takes the fast path:
one dict lookup.  A frame-borne input costs exactly one copy (frame -> arena slot);
if anything fails after a slot was taken, every slot is returned before the error leaves.
"""

from __future__ import annotations

from typing import Any, Protocol

from inferpool.broker.front.limits import MAX_ID_LENGTH, check_id, encode_work
from inferpool.broker.models.registry import ModelVersion
from inferpool.broker.models.request import FLAG_SEQUENCE_END, FLAG_SEQUENCE_START, PendingRequest
from inferpool.shm.arena import Arena, ArenaFull, Slot
from inferpool.shm.region import ShmExhausted
from inferpool.wire.contract import check_byte_size, check_input, check_required
from inferpool.wire.errors import Code, InferpoolError, invalid_arg
from inferpool.wire.worker.messages import TensorRef, WantedOutput, Window, Work

_BROKER_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end", "priority", "timeout")
_NO_PARAMETERS: dict[str, Any] = {}
CHECKED = 256  # (input, datatype, shape) a model remembers as checked
_new = tuple.__new__  # records built per request without their Python-level __new__


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


def admit(
    header: dict[str, Any],
    frames: list[Any],
    model: ModelVersion,
    arena: Arena,
    *,
    rid: int,
    envelope: list[Any],
    client: bytes,
    limit: int,
    now_ns: int,
    shm: SharedMemoryInputs | None,
) -> PendingRequest:
    """Validate ``header``/``frames`` for ``model``; returns the request with inputs placed."""
    name = model.name
    inputs = header.get("inputs")
    if not isinstance(inputs, list):
        raise invalid_arg(f"inference request for model '{name}' has no 'inputs' list")
    client_id = header.get("id", "")
    short = type(client_id) is str and len(client_id) <= MAX_ID_LENGTH  # the common case
    work_id = client_id if short else check_id(client_id)
    total = 0
    for f in frames:
        total += len(f)
    if total > limit:
        raise invalid_arg(
            f"request of {total} bytes for model '{name}' exceeds the server limit of "
            f"{limit} bytes (--max-request-bytes / --arena-size)"
        )
    work_inputs: list[TensorRef] = []
    slots: list[Slot] = []
    seen: set[str] = set()
    batch = 0
    next_frame = 0
    checked = model.checked
    try:
        for i, inp in enumerate(inputs):
            try:  # the fast path: an input as this model has seen it before
                iname, datatype, shape = inp["name"], inp["datatype"], inp["shape"]
                input_batch, expected_bytes = checked[(iname, datatype, *shape)]
                if type(shape) is not list:
                    raise KeyError
                for d in shape:
                    if type(d) is not int:
                        raise KeyError  # 1.0 and True would pass for 1 as a key
                shape = tuple(shape)
            except (KeyError, TypeError):
                iname, datatype, shape, input_batch, expected_bytes = _check(i, inp, model)
            if iname in seen:
                raise invalid_arg(f"input '{iname}' is given more than once for model '{name}'")
            seen.add(iname)
            if input_batch:
                if batch and input_batch != batch:
                    raise invalid_arg(
                        f"input '{iname}' batch size {input_batch} does not match the other "
                        f"inputs' batch size {batch} for model '{name}'"
                    )
                batch = input_batch
            params = inp.get("parameters")
            if params and "shared_memory_region" in params:
                if shm is None:
                    raise InferpoolError(
                        Code.UNSUPPORTED, "shared-memory inputs are not enabled on this server"
                    )
                region, offset, nbytes = shm.resolve_input(client, iname, params, expected_bytes)
                work_inputs.append(TensorRef(iname, datatype, shape, region, offset, nbytes))
                continue
            if next_frame >= len(frames):
                raise invalid_arg(
                    f"input '{iname}' for model '{name}' has no data: each input needs a tensor "
                    f"frame (or shared_memory_region parameters); {len(frames)} frame(s) sent"
                )
            frame = frames[next_frame]
            next_frame += 1
            nbytes = len(frame)
            check_byte_size(name, iname, expected_bytes, nbytes)
            try:
                slot = arena.alloc(nbytes)
            except ShmExhausted as exc:
                raise InferpoolError(Code.UNAVAILABLE, f"input '{iname}': {exc}") from None
            except ArenaFull as exc:
                raise InferpoolError(
                    Code.UNAVAILABLE,
                    f"input '{iname}' ({nbytes} bytes) does not fit in the shared-memory arena "
                    f"right now ({exc}); retry, or start the server with a larger --arena-size",
                ) from None
            slots.append(slot)
            if nbytes:
                arena.region.buf[slot.offset : slot.offset + nbytes] = frame.buffer
            work_inputs.append(
                _new(TensorRef, (iname, datatype, shape, slot.region, slot.offset, nbytes))
            )
        if next_frame != len(frames):
            raise invalid_arg(
                f"request for model '{name}' sent {len(frames)} tensor frame(s) but its inputs "
                f"use {next_frame}"
            )
        if not model.required <= seen:  # (optional inputs count in seen too)
            check_required(name, model.required, seen)
        outputs, work_outputs, shm_outputs = _outputs(header.get("outputs"), model, client, shm)
        parameters = header.get("parameters") or _NO_PARAMETERS
        if not isinstance(parameters, dict):
            raise invalid_arg("request 'parameters' must be an object")
        corr, flags, timeout_us, priority = (
            _scheduling(parameters, model) if parameters else (0, 0, 0, model.default_priority)
        )
        passed = (  # what the backend sees of them
            {k: v for k, v in parameters.items() if k not in _BROKER_PARAMETERS}
            if parameters
            else parameters
        )
        fields = (rid, work_id, corr, flags, passed, work_inputs, work_outputs, priority)
        work = _new(Work, (*fields, timeout_us))
        wire, wire_bytes = encode_work(work, parameters, name)
    except BaseException:
        for slot in slots:
            arena.free(slot)
        raise
    return PendingRequest(
        rid=rid,
        envelope=envelope,
        client_id=client_id,
        model=model,
        work=work,
        slots=slots,
        outputs=outputs,
        batch_size=batch or 1,
        received_ns=now_ns,
        shm_outputs=shm_outputs,
        wire=wire,
        wire_bytes=wire_bytes,
    )


def _check(i: int, inp: Any, model: ModelVersion) -> tuple[str, str, tuple[int, ...], int, Any]:
    """The slow path: check input ``i`` in full (Triton's words, wire.contract) and remember
    it as checked: (name, datatype, shape, its batch size or 0, its byte size or None)."""
    name = model.name
    if not isinstance(inp, dict):
        raise invalid_arg(f"inputs[{i}] of the request must be an object")
    iname = inp.get("name")
    spec = model.inputs.get(iname) if isinstance(iname, str) else None
    if spec is None or not isinstance(iname, str):
        raise invalid_arg(f"unexpected inference input '{iname}' for model '{name}'")
    datatype = inp.get("datatype")
    shape = _shape(inp.get("shape"), iname)
    batch, expected = check_input(name, spec, datatype, shape, model.max_batch_size, 0)
    if len(model.checked) >= CHECKED:
        model.checked.clear()
    model.checked[(iname, datatype, *shape)] = (batch, expected)
    return iname, str(datatype), shape, batch, expected


def _shape(raw: Any, name: str) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(type(d) is int and d >= 0 for d in raw):
        raise invalid_arg(
            f"input '{name}': shape must be a list of non-negative integers, got {raw!r}"
        )
    return tuple(raw)


def _outputs(
    raw: Any, model: ModelVersion, client: bytes, shm: SharedMemoryInputs | None
) -> tuple[dict[str, dict[str, Any]], list[WantedOutput], bool]:
    if not raw:
        return model.default_outputs, model.default_work_outputs, False
    if not isinstance(raw, list):
        raise invalid_arg("request 'outputs' must be a list")
    outputs: dict[str, dict[str, Any]] = {}
    work: list[WantedOutput] = []
    in_shm = False
    for i, out in enumerate(raw):
        oname = out.get("name") if isinstance(out, dict) else None
        if not isinstance(oname, str) or oname not in model.outputs:
            raise invalid_arg(f"unexpected inference output '{oname}' for model '{model.name}'")
        if oname in outputs:
            raise invalid_arg(f"output '{oname}' is requested more than once (outputs[{i}])")
        params = out.get("parameters") or {}
        if not isinstance(params, dict):
            raise invalid_arg(f"parameters of output '{oname}' must be an object")
        target = None
        if "shared_memory_region" in params or "output_handle" in params:
            if shm is None:
                raise InferpoolError(
                    Code.UNSUPPORTED, "shared-memory outputs are not enabled on this server"
                )
            target = shm.resolve_output(client, oname, params)
            in_shm = True
        outputs[oname] = params
        work.append(WantedOutput(oname, target))
    return outputs, work, in_shm


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
