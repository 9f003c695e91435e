"""An admitted request as the schedulers and the request path see it.

The front builds it (``front.admission``) and answers it; everything in between (queues,
batches, sequences, timeouts) happens in ``models``, so the type lives here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from inferpool.broker.models.batch_shapes import ANY, ShapeKey
from inferpool.broker.models.registry import ModelVersion
from inferpool.shm.arena import Slot
from inferpool.wire.errors import InferpoolError
from inferpool.wire.worker.protocol import FLAG_SEQUENCE_END, FLAG_SEQUENCE_START, Result, Work

if TYPE_CHECKING:
    from inferpool.broker.models.tracer import Trace

__all__ = ["FLAG_SEQUENCE_END", "FLAG_SEQUENCE_START", "PendingRequest", "Sink"]


class Sink(Protocol):
    """Where the answers of a request the broker made itself go (an ensemble's step, a
    model's BLS call) instead of a client socket.  Whoever receives a result owns one
    reference to each of its output slots (``pool.output_regions``)."""

    def result(self, req: PendingRequest, item: Result) -> None: ...

    def failed(self, req: PendingRequest, err: InferpoolError) -> None: ...


@dataclass(slots=True, eq=False)
class PendingRequest:
    """An admitted request, from admission until its final response."""

    rid: int
    envelope: list[Any]  # zmq routing frames of the client
    client_id: Any  # the request's own "id", echoed in every response
    model: ModelVersion
    work: Work  # what the worker receives for this request
    slots: list[Slot]  # arena slots to return when the request ends
    outputs: dict[str, dict[str, Any]]  # requested output -> the client's output parameters
    batch_size: int
    received_ns: int
    deadline_ns: int = 0  # queue timeout; 0: none
    dispatched_ns: int = 0
    worker: Any = None
    shm_outputs: bool = False  # some output stays in shared memory (handle, client region)
    cancelled: bool = False  # answered CANCELLED while executing (models.cancellation)
    sink: Sink | None = None  # answers go there, not to ``envelope`` (models/internal.py)
    cache_key: bytes | None = None  # set when a response cache lookup missed: store the result
    cache_ns: int = 0  # how long that lookup took
    responses: int = 0  # responses sent so far (a decoupled model's response statistics)
    wire: orjson.Fragment | None = None  # ``work`` encoded at admission, sent as is
    wire_bytes: int = 0  # the size of ``work`` in an Execute message (front.limits)
    trace: Trace | None = None  # set when the request is traced (models.tracer)
    shape_key: ShapeKey = ANY  # requests of equal keys may share a batch (models.batch_shapes)
