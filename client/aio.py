"""The asyncio client: many requests in flight on one DEALER socket.

    from inferpool.client import AsyncClient
    async with AsyncClient("ipc:///tmp/inferpool-1000/broker.sock") as c:
        outs = await asyncio.gather(*(c.infer("identity", {"INPUT0": x}) for x in xs))
        async for result in c.stream("decoupled_model", {"IN": x}):
            ...

The messages are client.core's, as for the sync client.  One reader, called by the event
loop when the socket's descriptor signals, hands every response to the core, which files it
with the request whose ``id`` it echoes; the caller waiting for that request wakes.  Every
wait has a timeout (TIMEOUT), and a response to a request that was given up on is dropped.

The socket is pyzmq's plain one, watched with ``loop.add_reader`` as zmq.asyncio does
underneath: zmq.asyncio's futures on every send and receive alone cost as much per request as
this client's whole request does (scripts/bench_aio.py, echo peer), so the loop integration
is kept to one callback.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np
import zmq

from inferpool.client import control_calls
from inferpool.client.connection import EVENTS, POLLIN, POLLOUT, Connection
from inferpool.client.core import ClientCore, Exchange, InferResult, Message, Retry
from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.zmqio import NOBLOCK, SNDMORE, recv_frames

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from Python 3.11

    from inferpool.client.core import Header, InferOptions, Inputs, Outputs

T = TypeVar("T")


def _expire(future: asyncio.Future[None], core: ClientCore, what: str, limit: float) -> None:
    if not future.done():
        error = core.timed_out(what, limit) if what else core.handshake.failure(limit)
        future.set_exception(error)


class AsyncClient(Connection):
    """An asyncio client; use it from one event loop, with as many concurrent calls as wanted."""

    _loop: asyncio.AbstractEventLoop | None = None  # the one it serves, once used

    def _setup(self) -> None:
        super()._setup()
        self._waiters: dict[str, asyncio.Future[None]] = {}  # request id -> its caller
        self._writable: list[asyncio.Future[None]] = []  # senders held back by the HWM
        self._connecting: list[asyncio.Future[None]] = []  # callers waiting for a handshake

    # ------------------------------------------------------------------ the readers
    def _attach(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            loop.add_reader(self._sock.FD, self._on_events)
            if self._monitor is not None:
                loop.add_reader(self._monitor.FD, self._on_monitor)
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
        sock, core = self._sock, self._core
        while not core.closed:
            events = cast(int, sock.getsockopt(EVENTS))
            if events & POLLOUT and self._writable:
                _wake(self._writable)
                self._writable.clear()
            if not events & POLLIN:
                return
            try:
                exchange = core.receive(recv_frames(sock, NOBLOCK))
            except zmq.Again:
                return
            if exchange is not None:
                waiter = self._waiters.get(exchange.id)
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)

    def _on_monitor(self) -> None:
        if not self._answered() and self._core.handshake.refusal:
            for future in self._connecting:  # the server refused: no use waiting
                if not future.done():
                    future.set_exception(self._core.handshake.failure(0))

    def _end_monitor(self) -> None:
        """Connected (or closing): the callers waiting for the handshake go on."""
        if self._monitor is not None and self._loop is not None:
            self._loop.remove_reader(self._monitor.FD)
        super()._end_monitor()
        _wake(self._connecting)

    # ------------------------------------------------------------------ transport
    async def _run(self, exchange: Exchange[T]) -> T:
        """Send one request, read its (first) response."""
        try:
            await self._start(exchange)
            return exchange.read(await self._next(exchange))
        except BaseException:
            self._cancel(exchange)  # a timeout, a cancelled task: the server stops its work
            raise
        finally:
            self._core.forget(exchange)

    async def _start(self, exchange: Exchange[Any]) -> None:
        loop = self._attach()
        limit = exchange.limit
        if self._monitor is not None or self._connecting:
            await self._connect(loop, limit)
        sock = self._sock
        while True:  # the first part waits for room; the rest of the message always fits
            try:
                sock.send(b"", SNDMORE | NOBLOCK)
                break
            except zmq.Again:
                future: asyncio.Future[None] = loop.create_future()
                self._writable.append(future)
                self._on_events()
                await self._wait(future, limit, "could not send to")
        self._send_request(exchange)
        self._on_events()

    async def _next(self, exchange: Exchange[Any]) -> Message:
        if not exchange.replies:
            assert self._loop is not None
            waiter = self._waiters[exchange.id] = self._loop.create_future()
            try:
                await self._wait(waiter, exchange.limit, "no response from")
            finally:
                del self._waiters[exchange.id]
        return self._core.take(exchange)

    async def _connect(self, loop: asyncio.AbstractEventLoop, limit: float) -> None:
        """Once: wait for a server's handshake, or fail fast (UNAVAILABLE) without one.

        Callers go on in the order they came (so their requests are sent in that order),
        those that come while earlier ones are still on their way after them.
        """
        if not self._connecting and self._answered():
            return
        if self._monitor is not None:
            self._check_path()
        future: asyncio.Future[None] = loop.create_future()
        self._connecting.append(future)
        if self._monitor is None:
            future.set_result(None)  # connected already: after those woken before
        try:
            await self._wait(future, self._core.handshake.window(limit), "")
        finally:
            self._connecting.remove(future)

    async def _wait(self, future: asyncio.Future[None], limit: float, what: str) -> None:
        """Until ``future`` is done or ``limit`` has passed: TIMEOUT ``what`` (no response
        from, could not send to) the endpoint, or UNAVAILABLE for a handshake (no ``what``)."""
        assert self._loop is not None
        timer = self._loop.call_later(limit, _expire, future, self._core, what, limit)
        try:
            await future
        finally:
            timer.cancel()

    async def call(self, msg_type: str, timeout: float | None = None, **fields: Any) -> Header:
        """Send a control message and return its (error-checked) response header."""
        return await self._run(self._core.call(msg_type, fields, timeout))

    # ------------------------------------------------------------------ inference
    async def infer(
        self, model: str, inputs: Inputs, outputs: Outputs = None, **options: Unpack[InferOptions]
    ) -> dict[str, np.ndarray]:
        """Run one inference; returns the outputs as numpy arrays (options: infer_result's)."""
        return (await self.infer_result(model, inputs, outputs, **options)).outputs

    async def infer_result(
        self, model: str, inputs: Inputs, outputs: Outputs = None, **options: Unpack[InferOptions]
    ) -> InferResult:
        """Like infer(), with the response's parameters and model version (``options``:
        version, parameters, datatypes, timeout)."""
        return await self._run(self._core.infer(model, inputs, outputs, **options))

    async def stream(
        self, model: str, inputs: Inputs, outputs: Outputs = None, **options: Unpack[InferOptions]
    ) -> AsyncIterator[InferResult]:
        """Responses of a decoupled model as they arrive, until the final one
        (``triton_final_response``); that one is yielded only if it carries outputs.
        ``timeout`` bounds each wait."""
        exchange = self._core.infer(model, inputs, outputs, **options, stream=True)
        try:
            await self._start(exchange)
            while not exchange.done:
                result = exchange.read(await self._next(exchange))
                if result.streamed:
                    yield result
        finally:
            self._cancel(exchange)  # left before the final response: cancelled on the server

    # ------------------------------------------------------------------ control
    async def control(self, call: control_calls.Call[T], timeout: float | None = None) -> T:
        """Run one control call (client.control_calls) and read its answer."""
        return await self._run(self._core.control(call, timeout))

    async def is_live(self, timeout: float | None = None) -> bool:
        return await self.control(control_calls.live(), timeout)

    async def is_ready(self, timeout: float | None = None) -> bool:
        return await self.control(control_calls.ready(), timeout)

    async def is_model_ready(self, model: str, version: str | int = "") -> bool:
        return await self.control(control_calls.model_ready(model, version))

    async def server_metadata(self) -> dict[str, Any]:
        return await self.control(control_calls.server_metadata())

    async def model_metadata(self, model: str, version: str | int = "") -> dict[str, Any]:
        return await self.control(control_calls.model_metadata(model, version))

    async def model_config(self, model: str, version: str | int = "") -> dict[str, Any]:
        return await self.control(control_calls.model_config(model, version))

    async def models(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return await self.control(control_calls.models(ready_only))

    async def load_model(
        self,
        model: str,
        timeout: float | None = None,
        *,
        config: str | Mapping[str, Any] | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        """Load (or reload) ``model``; ``config`` and ``files`` override its configuration
        and files as Triton's load API does (docs/PROTOCOL.md)."""
        await self.control(control_calls.load(model, config, files), timeout)

    async def unload_model(self, model: str, timeout: float | None = None) -> None:
        await self.control(control_calls.unload(model), timeout)

    async def drain(self) -> dict[str, Any]:
        """Stop the server taking requests, finish those in flight, exit (docs/scale-out.md)."""
        return await self.control(control_calls.drain())

    async def statistics(self, model: str = "", version: str | int = "") -> dict[str, Any]:
        return await self.control(control_calls.statistics(model, version))

    async def status(self) -> list[dict[str, Any]]:
        return await self.control(control_calls.status())

    async def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the server answers ready, whether or not it is up yet (else TIMEOUT)."""
        retry = Retry(self.endpoint, timeout)
        while True:
            with retry:
                if await self.is_ready(retry.attempt()):
                    return
            await asyncio.sleep(retry.pause())

    # ------------------------------------------------------------------ lifetime
    async def close(self) -> None:
        """Say goodbye (the shm client's releases), close the socket; calls still waiting
        get CANCELLED."""
        if self._core.closed:
            return
        for exchange in self._core.goodbye():
            try:
                await self._run(exchange)
            except InferpoolError:
                break  # the server is gone or busy: it reclaims all when we disconnect
        for exchange in self._core.close():
            waiter = self._waiters.get(exchange.id)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)  # it takes the CANCELLED the core queued
        err = InferpoolError(Code.CANCELLED, "the client was closed")
        for future in (*self._writable, *self._connecting):
            if not future.done():
                future.set_exception(err)
        if self._loop is not None:
            self._loop.remove_reader(self._sock.FD)
        self._close_socket()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _wake(futures: list[asyncio.Future[None]]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(None)
