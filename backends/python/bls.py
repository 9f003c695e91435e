"""Business Logic Scripting: ``pb_utils.InferenceRequest(...).exec()`` and ``async_exec()``.

A model's call goes through the worker's :class:`~inferpool.backends.model_calls.InferenceCalls`
to the broker, which schedules it like any request (dynamic batching included).  Inputs that
already lie in shared memory (the model's own request inputs, earlier replies' outputs)
travel as references; a reply's outputs are read in place.  As in Triton, a failed call is
an ``InferenceResponse`` whose ``has_error()`` is true, never an exception, and calls can
be made from ``initialize`` on until ``finalize`` begins.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import Awaitable, Iterator
from typing import Any

from inferpool.backends.model_calls import CallReply, CallRequest, InferenceCalls, PendingCall
from inferpool.backends.python.pb_types import InferenceResponse, TritonError
from inferpool.backends.python.tensor import Tensor, TritonModelException
from inferpool.wire.errors import InferpoolError

_serving = False  # from the instance's initialize() until its finalize()
_service: InferenceCalls | None = None  # the serving instance's calls (None: no broker)
_watched: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


def serve(serving: bool, calls: InferenceCalls | None = None) -> None:
    """The instance has initialized (``serving``, with ``calls``) or is finalizing."""
    global _serving, _service
    _serving, _service = serving, calls


def execute(request: CallRequest, decoupled: bool) -> InferenceResponse | ResponseIterator:
    """``exec()``: wait for the reply (or, ``decoupled``, for the first of a stream)."""
    try:
        pending = _calls().start(request, decoupled)
    except InferpoolError as err:
        return _failed(err, decoupled)
    if decoupled:
        return ResponseIterator(pending)
    return response(pending.next())


def execute_async(request: CallRequest, decoupled: bool) -> Awaitable[Any]:
    """``async_exec()``: an awaitable of what ``exec()`` returns, answered without a thread
    when the event loop runs on the worker's main thread (``async def execute``)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    calls = _calls()
    try:
        pending = calls.start(request, decoupled)
    except InferpoolError as err:
        future.set_result(_failed(err, decoupled))
        return future

    def settle() -> None:
        if not future.done():
            future.set_result(ResponseIterator(pending) if decoupled else response(pending.next()))

    def arrived() -> None:
        if pending.ready() and not future.done():
            pending.notify(None)
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody awaits
                loop.call_soon_threadsafe(settle)

    pending.notify(arrived)
    arrived()  # a reply that came while the call was being sent
    if threading.current_thread() is threading.main_thread() and loop not in _watched:
        _watched.add(loop)
        loop.add_reader(calls.fileno(), _pump, loop, calls)
    return future


def _pump(loop: asyncio.AbstractEventLoop, calls: InferenceCalls) -> None:
    calls.pump()
    if not calls.pending():
        loop.remove_reader(calls.fileno())
        _watched.discard(loop)


def _calls() -> InferenceCalls:
    if not _serving:
        raise TritonModelException("BLS is only supported during the 'execute' function.")
    if _service is None:
        raise TritonModelException(
            "BLS calls models a broker serves; this model runs without one (BackendHarness)"
        )
    return _service


class ResponseIterator:
    """The responses of a decoupled call as they arrive, the final (maybe empty) one last;
    iterating again once it is over starts from the first."""

    def __init__(self, pending: PendingCall | None, first: InferenceResponse | None = None):
        self._pending = pending
        self._responses: list[InferenceResponse] = [] if first is None else [first]
        self._index = 0
        self._finished = pending is None

    def __iter__(self) -> Iterator[InferenceResponse]:
        if self._finished and self._index >= len(self._responses):
            self._index = 0
        return self

    def cancel(self) -> None:
        """Cancel the call, as Triton's ``cancel()`` on a decoupled BLS iterator: the called
        model's request leaves its queue, or its ``is_cancelled()`` turns true; whether it
        stops, and how (a CANCELLED error as its last response), is up to that model.  The
        responses up to the call's end still come from the iterator."""
        if self._pending is not None and not self._finished:
            self._pending.cancel()

    def __next__(self) -> InferenceResponse:
        if self._index < len(self._responses):
            self._index += 1
            return self._responses[self._index - 1]
        if self._finished or self._pending is None:
            raise StopIteration
        reply = self._pending.next()
        self._responses.append(response(reply))
        self._index += 1
        self._finished = reply.final
        return self._responses[-1]


def response(reply: CallReply) -> InferenceResponse:
    """A reply as the ``pb_utils.InferenceResponse`` a model reads: outputs in place."""
    if reply.error is not None:
        return InferenceResponse(error=_triton_error(reply.error))
    tensors = [  # a BYTES output was decoded, its slot given back: it is nowhere shared
        Tensor._wrap(t.name, t.datatype, t.data, True, (t.region, t.offset, t.byte_size), True)
        if t.datatype != "BYTES"
        else Tensor._wrap(t.name, t.datatype, t.data, True)
        for t in reply.outputs.values()
    ]
    return InferenceResponse(tensors, parameters=reply.parameters)


def _failed(err: InferpoolError, decoupled: bool) -> InferenceResponse | ResponseIterator:
    failed = InferenceResponse(error=_triton_error(err))
    return ResponseIterator(None, failed) if decoupled else failed


def _triton_error(err: InferpoolError) -> TritonError:
    """TIMEOUT, which Triton's python backend has no code for, reads as UNAVAILABLE."""
    codes = {code: i for i, code in enumerate(TritonError._CODES)}
    return TritonError(err.message, codes.get(err.code, TritonError.UNAVAILABLE))
