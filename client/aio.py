"""The asyncio client: many requests in flight on one DEALER socket.

    from inferpool.client import AsyncClient
    async with AsyncClient("ipc:///tmp/inferpool-1000/broker.sock") as c:
        outs = await asyncio.gather(*(c.infer("identity", {"INPUT0": x}) for x in xs))
        async for result in c.stream("decoupled_model", {"IN": x}):
            ...

One reader, called by the event loop when the socket's descriptor signals, receives every
response and hands it to the inbox of the request whose ``id`` it echoes, so callers never
wait on the socket themselves.  Every wait has a timeout (TIMEOUT), and a response to a
request that was given up on is dropped.  Messages are encoded and decoded by the sync
client's helpers; the control calls are client.control's.

The socket is pyzmq's plain one, watched with ``loop.add_reader`` as zmq.asyncio does
underneath: zmq.asyncio's futures on every send and receive alone cost as much per request as
this client's whole request does (scripts/bench_aio.py, echo peer), so the loop integration
is kept to one callback.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, TypeVar, cast

import numpy as np
import zmq

from inferpool.client import control
from inferpool.client.sync import (
    DEFAULT_TIMEOUT,
    InferResult,
    decode_result,
    default_endpoint,
    prepare,
)
from inferpool.wire import codec
from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.zmqio import NOBLOCK, SNDMORE, recv_frames

T = TypeVar("T")
Message = tuple[dict[str, Any], list[Any]]  # response header, tensor frames
_EVENTS = int(zmq.EVENTS)  # plain ints: pyzmq's attribute and enum sugar costs per call
_POLLIN = int(zmq.POLLIN)
_POLLOUT = int(zmq.POLLOUT)
log = logging.getLogger("inferpool.client")


class _Inbox:
    """The responses to one request, in order, and the caller waiting for the next."""

    __slots__ = ("items", "waiter")

    def __init__(self) -> None:
        self.items: deque[Message | InferpoolError] = deque()
        self.waiter: asyncio.Future[None] | None = None

    def put(self, item: Message | InferpoolError) -> None:
        self.items.append(item)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


def _expire(future: asyncio.Future[None], error: InferpoolError) -> None:
    if not future.done():
        future.set_exception(error)


class AsyncClient:
    """An asyncio client; use it from one event loop, with as many concurrent calls as wanted."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        context: zmq.Context[Any] | None = None,
    ) -> None:
        self.endpoint = endpoint or default_endpoint()
        self.timeout = timeout
        self._own_ctx = context is None
        self._ctx = context or zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(self.endpoint)
        self._ids = itertools.count(1)
        self._inboxes: dict[str, _Inbox] = {}  # request id -> its responses
        self._writable: list[asyncio.Future[None]] = []  # senders held back by the HWM
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    # ------------------------------------------------------------------ the reader
    def _attach(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            loop.add_reader(self._sock.FD, self._on_events)
            self._loop = loop
        elif loop is not self._loop:
            raise InferpoolError(
                Code.INVALID_ARG, "an AsyncClient serves the event loop it was first used in"
            )
        return loop

    def _on_events(self) -> None:
        """Deliver every waiting response; wake senders once the socket takes messages again.

        The descriptor is edge-triggered: reading EVENTS re-arms it, so this drains fully
        and is also run after each send (a send may consume the edge of an arrival).
        """
        sock = self._sock
        while not self._closed:
            events = cast(int, sock.getsockopt(_EVENTS))
            if events & _POLLOUT and self._writable:
                for future in self._writable:
                    if not future.done():
                        future.set_result(None)
                self._writable.clear()
            if not events & _POLLIN:
                return
            try:
                self._dispatch(recv_frames(sock, NOBLOCK))
            except zmq.Again:
                return

    def _dispatch(self, parts: list[Any]) -> None:
        if len(parts) < 2 or len(parts[0]) != 0:
            return  # not a response of the protocol
        try:
            header = codec.decode_header(parts[1].bytes)
        except InferpoolError as err:
            log.warning("dropped an unreadable response from %s: %s", self.endpoint, err)
            return
        inbox = self._inboxes.get(str(header.get("id")))
        if inbox is not None:  # else: a response to a request given up on
            inbox.put((header, parts[2:]))

    # ------------------------------------------------------------------ transport
    async def _send(
        self, header: dict[str, Any], frames: Sequence[Any], timeout: float | None
    ) -> tuple[str, _Inbox]:
        if self._closed:
            raise InferpoolError(Code.CANCELLED, "the client is closed")
        loop = self._attach()
        request_id = f"{next(self._ids)}"
        header["id"] = request_id
        parts = [b"", codec.encode_header(header), *frames]
        sock = self._sock
        while True:  # the first part waits for room; the rest of the message always fits
            try:
                sock.send(parts[0], SNDMORE | NOBLOCK)
                break
            except zmq.Again:
                future: asyncio.Future[None] = loop.create_future()
                self._writable.append(future)
                self._on_events()
                await self._wait(future, timeout, "could not send to")
        last = len(parts) - 1
        for i in range(1, len(parts)):
            # copy=False: large tensors go zero-copy (pyzmq still copies parts under 64 KiB)
            sock.send(parts[i], SNDMORE if i < last else 0, copy=False)
        inbox = self._inboxes[request_id] = _Inbox()
        self._on_events()
        return request_id, inbox

    async def _next(self, inbox: _Inbox, timeout: float | None) -> Message:
        if not inbox.items:
            assert self._loop is not None
            inbox.waiter = self._loop.create_future()
            try:
                await self._wait(inbox.waiter, timeout, "no response from")
            finally:
                inbox.waiter = None
        got = inbox.items.popleft()
        if isinstance(got, InferpoolError):
            raise got
        return got

    async def _wait(self, future: asyncio.Future[None], timeout: float | None, what: str) -> None:
        limit = self.timeout if timeout is None else timeout
        error = InferpoolError(Code.TIMEOUT, f"{what} {self.endpoint} within {limit:g}s")
        assert self._loop is not None
        timer = self._loop.call_later(limit, _expire, future, error)
        try:
            await future
        finally:
            timer.cancel()

    async def _request(
        self, header: dict[str, Any], frames: Sequence[Any] = (), timeout: float | None = None
    ) -> Message:
        """Send one request and wait for its (single) response."""
        request_id, inbox = await self._send(header, frames, timeout)
        try:
            return await self._next(inbox, timeout)
        finally:
            del self._inboxes[request_id]

    async def call(
        self, msg_type: str, timeout: float | None = None, **fields: Any
    ) -> dict[str, Any]:
        """Send a control message and return its (error-checked) response header."""
        header, _ = await self._request({"type": msg_type, **fields}, timeout=timeout)
        codec.raise_for_error(header)
        return header

    # ------------------------------------------------------------------ inference
    async def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        outputs: Sequence[str] | None = None,
        **options: Any,
    ) -> dict[str, np.ndarray]:
        """Run one inference; returns the outputs as numpy arrays (options: infer_result's)."""
        result = await self.infer_result(model, inputs, outputs, **options)
        return result.outputs

    async def infer_result(
        self,
        model: str,
        inputs: Mapping[str, Any],
        outputs: Sequence[str] | None = None,
        *,
        version: str | int = "",
        parameters: Mapping[str, Any] | None = None,
        datatypes: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> InferResult:
        """Like infer(), with the response's parameters and model version."""
        header, frames = prepare(
            model, inputs, outputs, version=version, parameters=parameters, datatypes=datatypes
        )
        return decode_result(*await self._request(header, frames, timeout))

    async def stream(
        self,
        model: str,
        inputs: Mapping[str, Any],
        outputs: Sequence[str] | None = None,
        *,
        timeout: float | None = None,
        **request: Any,
    ) -> AsyncIterator[InferResult]:
        """Responses of a decoupled model as they arrive, until the final one
        (``triton_final_response``); ``timeout`` bounds each wait; ``request``: version,
        parameters, datatypes as for infer_result().

        The final response is yielded only if it carries outputs.
        """
        header, frames = prepare(model, inputs, outputs, **request)
        request_id, inbox = await self._send(header, frames, timeout)
        try:
            while True:
                result = decode_result(*await self._next(inbox, timeout))
                if result.streamed:
                    yield result
                if result.final:
                    return
        finally:
            del self._inboxes[request_id]

    # ------------------------------------------------------------------ control
    async def control(self, call: control.Call[T], timeout: float | None = None) -> T:
        """Run one control call (client.control) and read its answer."""
        return call.read(await self.call(call.type, timeout, **call.fields))

    async def is_live(self, timeout: float | None = None) -> bool:
        return await self.control(control.live(), timeout)

    async def is_ready(self, timeout: float | None = None) -> bool:
        return await self.control(control.ready(), timeout)

    async def is_model_ready(self, model: str, version: str | int = "") -> bool:
        return await self.control(control.model_ready(model, version))

    async def server_metadata(self) -> dict[str, Any]:
        return await self.control(control.server_metadata())

    async def model_metadata(self, model: str, version: str | int = "") -> dict[str, Any]:
        return await self.control(control.model_metadata(model, version))

    async def model_config(self, model: str, version: str | int = "") -> dict[str, Any]:
        return await self.control(control.model_config(model, version))

    async def models(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return await self.control(control.models(ready_only))

    async def load_model(self, model: str, timeout: float | None = None) -> None:
        await self.control(control.load(model), timeout)

    async def unload_model(self, model: str, timeout: float | None = None) -> None:
        await self.control(control.unload(model), timeout)

    async def statistics(self, model: str = "", version: str | int = "") -> dict[str, Any]:
        return await self.control(control.statistics(model, version))

    async def status(self) -> list[dict[str, Any]]:
        return await self.control(control.status())

    async def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the server answers ready (or raise TIMEOUT)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if await self.is_ready(timeout=min(1.0, max(0.05, deadline - time.monotonic()))):
                    return
            except InferpoolError as err:
                if err.code is not Code.TIMEOUT:
                    raise
            if time.monotonic() >= deadline:
                raise InferpoolError(Code.TIMEOUT, f"{self.endpoint} not ready within {timeout:g}s")
            await asyncio.sleep(0.05)

    # ------------------------------------------------------------------ lifetime
    async def close(self) -> None:
        """Close the socket; calls still waiting get CANCELLED."""
        if self._closed:
            return
        self._closed = True
        if self._loop is not None:
            self._loop.remove_reader(self._sock.FD)
        err = InferpoolError(Code.CANCELLED, "the client was closed")
        for inbox in self._inboxes.values():
            inbox.put(err)
        for future in self._writable:
            if not future.done():
                future.set_exception(err)
        self._sock.close(0)
        if self._own_ctx:
            self._ctx.term()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
