"""Requests the broker makes itself: an ensemble's steps and a model's calls (BLS).

Their inputs already lie in shared memory (TensorRefs) and their answers go to a Sink, not
to a client.  Making one is checking those tensors against the called model as admission
checks a client's request, in the same words.  Their rids are negative, so they never meet
a client request's in the request path's in-flight table.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from inferpool.broker.models.registry import ModelVersion
from inferpool.broker.models.request import PendingRequest, Sink
from inferpool.wire.contract import InputChecks, check_byte_size, check_output, input_spec
from inferpool.wire.errors import invalid_arg
from inferpool.wire.worker.protocol import (
    BATCH_BYTES,
    FLAG_TRACE,
    CorrelationId,
    Parameters,
    TensorRef,
    WantedOutput,
    Work,
    encoded,
)

_rids = itertools.count(-1, -1)


def make_request(
    model: ModelVersion,
    inputs: Sequence[TensorRef],
    outputs: Sequence[WantedOutput],
    sink: Sink,
    *,
    request_id: str,
    correlation_id: CorrelationId,
    flags: int,
    parameters: Parameters,
    now_ns: int,
    deadline_ns: int = 0,
) -> PendingRequest:
    """A request of ``model`` whose answers go to ``sink``; INVALID_ARG (Triton's words)
    for inputs or outputs the model does not take."""
    batch = _check_inputs(model, inputs)
    if not outputs:
        outputs = model.default_work_outputs
    for out in outputs:
        check_output(model.name, model.outputs, out.name)
    rid = next(_rids)
    work = Work(
        rid,
        request_id,
        correlation_id,
        flags & ~FLAG_TRACE,  # set only by the tracer: only a traced request's worker reports
        parameters,
        list(inputs),
        list(outputs),
        model.default_priority,  # the called model's default level (models.queue_policy)
    )
    wire, size = encoded(work)  # the batchers keep a batch within one message (front.limits)
    if size > BATCH_BYTES:
        raise invalid_arg(
            f"request for model '{model.name}' is {size} bytes as its worker would receive it; "
            f"at most {BATCH_BYTES} bytes are allowed"
        )
    return PendingRequest(
        rid=rid,
        envelope=[],
        client_id=request_id,
        model=model,
        work=work,
        slots=[],
        outputs={out.name: {} for out in outputs},
        batch_size=batch or 1,
        received_ns=now_ns,
        deadline_ns=deadline_ns,
        sink=sink,
        wire=wire,
        wire_bytes=size,
        shape_key=model.batch_shapes.key((ref.name, ref.shape) for ref in inputs),
    )


def _check_inputs(model: ModelVersion, inputs: Sequence[TensorRef]) -> int:
    """The request's batch size (0 for a model that does not batch)."""
    name = model.name
    checks = InputChecks(name, model.max_batch_size, model.required)
    for ref in inputs:
        spec = input_spec(name, model.inputs, ref.name)
        expected = checks.add(spec, ref.datatype, tuple(ref.shape))
        check_byte_size(name, ref.name, expected, ref.byte_size)
    return checks.done()
