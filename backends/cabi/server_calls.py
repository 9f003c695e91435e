"""Inference requests a C backend makes (``TRITONSERVER_ServerInferAsync``: Triton's BLS
from C), and what it asks of the server (``TRITONSERVER_ServerModel*``).

Both go through the worker's :class:`~inferpool.backends.model_calls.InferenceCalls`, the
path a Python backend's BLS takes: a call is scheduled by the broker like any request, and
its replies come back to the worker's channel.  Each reply is handed to the host
(``deliver``), which asks the backend's allocator for each output's buffer, copies the
output there and calls the backend's response callback; after the final reply it calls the
request's release callback.  Replies are delivered on whichever thread reads the channel:
the worker's main thread between batches, or the thread that reads for it while a C execute
blocks it (``InferenceCalls.run_blocked``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from inferpool.backends.model_calls import (
    CallInput,
    CallReply,
    CallRequest,
    InferenceCalls,
    PendingCall,
)
from inferpool.wire import codec
from inferpool.wire.errors import Code, InferpoolError

# (request capsule, outputs [(name, datatype, shape, buffer)], parameters, error, final)
Deliver = Callable[[Any, list[tuple[str, str, tuple[int, ...], Any]], Any, Any, bool], None]


class CCall:
    """One TRITONSERVER_InferenceRequest in flight: its replies handed to the host."""

    def __init__(self, capsule: Any, pending: PendingCall, deliver: Deliver) -> None:
        self._capsule = capsule
        self._pending = pending
        self._deliver = deliver
        self._over = False
        self._delivering = threading.Lock()  # one thread delivers at a time, in order

    def arm(self) -> None:
        """Deliver replies from now on (the host has recorded the call).  A callback never
        runs inside ServerInferAsync (the backend may hold a lock its callback takes): a
        reply that came while the call was sent is delivered from a thread of its own."""
        self._pending.notify(self._arrived)
        if self._pending.ready():
            threading.Thread(target=self._arrived, name="inferpool-early-reply").start()

    def cancel(self) -> None:
        """TRITONSERVER_InferenceRequestCancel."""
        if not self._over:
            self._pending.cancel()

    def _arrived(self) -> None:
        """Replies have arrived (the channel's reading thread, or arm()'s): each to the host,
        in order.  A thread that finds another delivering leaves its reply to that one."""
        pending = self._pending
        while not self._over and pending.ready():
            if not self._delivering.acquire(blocking=False):
                return  # the thread delivering looks again once it has finished
            try:
                while not self._over and pending.ready():
                    self._hand_over(pending.next())
            finally:
                self._delivering.release()

    def _hand_over(self, reply: CallReply) -> None:
        self._over = reply.final
        if reply.final:
            self._pending.notify(None)
        outputs = []
        for t in reply.outputs.values():
            data = codec.serialize_bytes(t.data.reshape(-1)) if t.datatype == "BYTES" else t.data
            outputs.append((t.name, t.datatype, t.shape, data))
        error = None if reply.error is None else (reply.error.code.name, reply.error.message)
        self._deliver(self._capsule, outputs, reply.parameters or None, error, reply.final)


def infer(
    calls: InferenceCalls | None,
    deliver: Deliver,
    capsule: Any,
    model_name: str,
    model_version: int,
    request_id: str,
    correlation_id: int | str,
    flags: int,
    timeout_us: int,
    parameters: dict[str, Any],
    inputs: Sequence[tuple[str, str, tuple[int, ...], Any, int]],
    outputs: Sequence[str],
) -> CCall:
    """TRITONSERVER_ServerInferAsync: send the call; the host arms the CCall once it has
    recorded it.  An input (data at ``address``, 0: not one buffer) that lies in shared
    memory the broker names goes by reference, as a Python backend's request inputs do;
    others are copied into shared memory before this returns."""
    serving = _serving(calls)
    tensors = []
    for name, datatype, shape, data, address in inputs:
        place = serving.locate(address, len(data)) if address else None
        if place is not None:  # already in shared memory (the request's own inputs): no copy
            tensors.append(CallInput(name, datatype, shape, data, place[0], place[1], len(data)))
        else:
            array = codec.array_from_buffer(data, datatype, shape, name)
            tensors.append(CallInput(name, datatype, shape, array))
    request = CallRequest(
        model_name,
        tensors,
        list(outputs),
        model_version=model_version,
        id=request_id,
        correlation_id=correlation_id,
        flags=flags,
        parameters=parameters,
        timeout_us=timeout_us,
    )
    # any model may be called: one that is not decoupled answers once, with the final flag
    return CCall(capsule, serving.start(request, decoupled=True), deliver)


def query(
    calls: InferenceCalls | None, model_name: str, model_version: int, labels: bool = False
) -> dict[str, Any]:
    """What the server knows of a served model (``InferenceCalls.query``)."""
    return _serving(calls).query(model_name, model_version, labels)


def _serving(calls: InferenceCalls | None) -> InferenceCalls:
    if calls is None:
        raise InferpoolError(
            Code.UNAVAILABLE,
            "the server's inference API serves models a broker serves; this model runs "
            "without one (BackendHarness)",
        )
    return calls
