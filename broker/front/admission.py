"""Admission: check an infer request against its model and place its inputs in the arena.

Everything a backend could trip over is caught here, before any worker sees the request,
with Triton's wording (``wire.contract``: a lane's worker checks its requests the same way).
The checks that depend on the request's signature alone are made once per signature
(``front.admission_plans``); what depends on the request itself is checked here every time.  A
frame-borne input costs exactly one copy (frame -> arena slot); if anything fails after a
slot was taken, every slot is returned before the error leaves.
"""

from __future__ import annotations

from typing import Any

from inferpool.broker.front.admission_plans import (
    SharedMemoryInputs,
    outputs_of,
    plan_for,
    scheduling,
)
from inferpool.broker.front.limits import MAX_ID_LENGTH, check_id, encode_work
from inferpool.broker.models.registry import ModelVersion
from inferpool.broker.models.request import PendingRequest
from inferpool.shm.arena import Arena, ArenaFull, Slot
from inferpool.shm.region import ShmExhausted
from inferpool.wire.contract import check_byte_size
from inferpool.wire.errors import Code, InferpoolError, invalid_arg
from inferpool.wire.worker.protocol import TensorRef, Work

__all__ = ["Placed", "SharedMemoryInputs", "admit"]
_new = tuple.__new__  # records built per request without their Python-level __new__


class Placed:
    """An input whose bytes its sender wrote in a region of the run already (the KServe
    frontends' process, in its input region): it takes a frame's place and is not copied."""

    __slots__ = ("nbytes", "offset", "region")

    def __init__(self, region: str, offset: int, nbytes: int) -> None:
        self.region = region
        self.offset = offset
        self.nbytes = nbytes

    def __len__(self) -> int:
        return self.nbytes


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
    """Validate ``header``/``frames`` for ``model``; returns the request with inputs placed.
    ``header`` loses its ``id``, ``parameters`` and ``release`` (what is left is the request's
    signature)."""
    name = model.name
    client_id = header.pop("id", "")
    header.pop("release", None)  # handled before admission (front.shared_memory)
    parameters = header.pop("parameters", None)
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
    corr, flags, timeout_us, priority, passed = scheduling(parameters, model)
    plan = plan_for(header, model, shm)
    work_inputs: list[TensorRef] = []
    slots: list[Slot] = []
    next_frame = 0
    try:
        for iname, datatype, shape, expected_bytes, params in plan.inputs:
            if params is not None:  # its bytes lie in the client's region: resolved each time
                assert shm is not None  # (the plan was refused without)
                region, offset, nbytes = shm.resolve_input(client, iname, params, expected_bytes)
                ref = (iname, datatype, shape, region, offset, nbytes)
                work_inputs.append(_new(TensorRef, ref))
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
            if type(frame) is Placed:
                ref = (iname, datatype, shape, frame.region, frame.offset, nbytes)
                work_inputs.append(_new(TensorRef, ref))
                continue
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
        if plan.shm_outputs is None:
            outputs, work_outputs, shm_outputs = plan.outputs, plan.work_outputs, False
        else:  # windows in the client's regions: resolved each time
            outputs, work_outputs, shm_outputs = outputs_of(plan.shm_outputs, model, client, shm)
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
        batch_size=plan.batch,
        received_ns=now_ns,
        shm_outputs=shm_outputs,
        wire=wire,
        wire_bytes=wire_bytes,
        shape_key=plan.shape_key,
    )
