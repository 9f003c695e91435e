"""The KServe frontends' thread: one asyncio loop serving HTTP, gRPC and health.

The broker's loop stays single-threaded and never waits on a client: this thread runs its
own asyncio loop with aiohttp (the HTTP frontend, and the health routes alone on the health
port) and ``grpc.aio`` (the gRPC frontend), and reaches the broker only through the channel
(an inproc zmq connection to the broker's ROUTER, read by the broker's loop like any
client's).  Every listener is bound before the constructor returns, so a port in use fails
the broker's start with one clear line; :meth:`Frontends.close` stops the listeners and the
channel before the broker closes its sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
from dataclasses import dataclass
from typing import Any

import grpc
import zmq
from aiohttp import web

from inferpool.broker.kserve import health, http_app
from inferpool.broker.kserve.bodies import BodyLimits
from inferpool.broker.kserve.callers import Callers
from inferpool.broker.kserve.channel import BrokerChannel
from inferpool.broker.kserve.grpc_handlers import add_to_server
from inferpool.broker.kserve.grpc_service import InferenceServicer
from inferpool.broker.kserve.http_base import application
from inferpool.broker.kserve.socket_owner import SocketOwners
from inferpool.wire.errors import Code, InferpoolError

log = logging.getLogger("inferpool.kserve")
START_TIMEOUT_S = 30.0
STOP_GRACE_S = 2.0  # the broker answered every request before it stops the frontends
BODY_SLACK = 64 << 20  # JSON text and headers beyond the tensor bytes a request may bring
_GRPC_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.so_reuseport", 0),  # a port in use is an error, never silently shared
]


@dataclass(frozen=True)
class FrontendOptions:
    """Where each listener binds (port 0: not served), the largest tensor bytes a request
    may bring (the broker's own limit), and what the frontends hold for a request while it
    arrives (0: derived from the request limit)."""

    http_address: str = "127.0.0.1"
    http_port: int = 0
    grpc_address: str = "127.0.0.1"
    grpc_port: int = 0
    health_address: str = "127.0.0.1"
    health_port: int = 0
    request_limit: int = 256 << 20
    http_max_input_size: int = 0  # one HTTP body (0: the request limit and BODY_SLACK)
    grpc_max_input_size: int = 0  # one gRPC message (0: as an HTTP body)
    http_header_timeout: float = 60.0  # a request's headers, and an idle keep-alive
    http_body_timeout: float = 60.0  # a body, once its headers are in
    http_body_budget: int = 0  # all bodies being received (0: twice the largest body)

    @property
    def enabled(self) -> bool:
        return bool(self.http_port or self.grpc_port or self.health_port)

    @property
    def max_body(self) -> int:
        return self.http_max_input_size or self.request_limit + BODY_SLACK

    @property
    def max_message(self) -> int:
        """The largest gRPC message (grpc's own limit: RESOURCE_EXHAUSTED beyond it)."""
        return min(self.grpc_max_input_size or self.max_body, (1 << 31) - 1)

    def bodies(self) -> BodyLimits:
        budget = self.http_body_budget or 2 * self.max_body
        return BodyLimits(self.max_body, self.http_body_timeout, budget)


class Frontends:
    """The thread, its loop and the listeners the options ask for."""

    def __init__(self, ctx: zmq.Context[Any], endpoint: str, options: FrontendOptions) -> None:
        """Bind every listener; ``endpoint``: the inproc address of the broker's ROUTER for
        the frontends."""
        self._ctx = ctx
        self._endpoint = endpoint
        self._options = options
        self._loop = asyncio.new_event_loop()
        self._stack = contextlib.AsyncExitStack()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="inferpool-kserve", daemon=True)
        self._thread.start()
        if not self._started.wait(START_TIMEOUT_S):
            raise InferpoolError(Code.UNAVAILABLE, "the KServe frontends did not start in time")
        if self._error is not None:
            self._thread.join()
            raise self._error

    def _run(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._start())
        except BaseException as exc:
            self._error = exc
            loop.run_until_complete(self._stack.aclose())
            loop.close()
            return
        finally:
            self._started.set()
        loop.run_forever()
        loop.run_until_complete(self._stack.aclose())
        loop.close()

    async def _start(self) -> None:
        opts = self._options
        stack = self._stack
        channel = BrokerChannel(self._ctx, self._endpoint)
        channel.attach(self._loop)
        stack.callback(channel.close)  # runs last: the servers stop first
        owners = SocketOwners()
        stack.callback(owners.close)
        callers = Callers(owners)
        if opts.http_port:
            app = http_app.build(channel, callers, opts.bodies())
            # a closed connection cancels its handler, and so its inference at the broker
            await self._serve_http(
                app, "HTTP", "http", opts.http_address, opts.http_port, handler_cancellation=True
            )
        if opts.health_port:
            app = application(health.routes(channel, callers), 1 << 16)
            await self._serve_http(app, "health", "health", opts.health_address, opts.health_port)
        if opts.grpc_port:
            servicer = InferenceServicer(channel, callers, opts.grpc_address, opts.grpc_port)
            await self._serve_grpc(servicer, opts.grpc_address, opts.grpc_port)

    async def _serve_http(
        self,
        app: web.Application,
        what: str,
        flags: str,
        address: str,
        port: int,
        handler_cancellation: bool = False,
    ) -> None:
        runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,
            shutdown_timeout=STOP_GRACE_S,
            handler_cancellation=handler_cancellation,
            keepalive_timeout=self._options.http_header_timeout,
        )
        await runner.setup()
        self._stack.push_async_callback(runner.cleanup)
        try:
            await web.TCPSite(runner, address, port).start()
        except OSError as exc:
            raise _bind_error(what, flags, address, port, _reason(exc)) from None
        log.info("%s on http://%s:%d", what, _host(address), port)

    async def _serve_grpc(self, servicer: InferenceServicer, address: str, port: int) -> None:
        limit = ("grpc.max_receive_message_length", self._options.max_message)
        server = grpc.aio.server(options=[*_GRPC_OPTIONS, limit])
        add_to_server(servicer, server)
        try:
            server.add_insecure_port(f"{_host(address)}:{port}")
        except RuntimeError:  # grpc does not say why: a plain bind on the address does
            raise _bind_error("gRPC", "grpc", address, port, _why_not(address, port)) from None
        await server.start()
        self._stack.push_async_callback(server.stop, STOP_GRACE_S)
        log.info("gRPC on %s:%d", _host(address), port)

    def close(self) -> None:
        """Stop the listeners and the channel; safe to call more than once."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(STOP_GRACE_S * 3)


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def _reason(exc: OSError) -> str:
    """The kernel's (or the resolver's) words, without asyncio's preamble."""
    if exc.errno and exc.errno > 0:
        return os.strerror(exc.errno)
    return exc.strerror or str(exc)


def _why_not(address: str, port: int) -> str:
    """Why ``address:port`` cannot be bound, as the kernel says it."""
    try:
        with socket.create_server((address, port)):
            return "the address cannot be bound"
    except OSError as exc:
        return _reason(exc)


def _bind_error(what: str, flags: str, address: str, port: int, why: str) -> InferpoolError:
    """``flags``: the listener's flags' stem (``http``: --http-port, --http-address)."""
    return InferpoolError(
        Code.UNAVAILABLE,
        f"cannot serve {what} on {_host(address)}:{port}: {why} (choose another "
        f"--{flags}-port or --{flags}-address, or --{flags}-port 0 to turn it off)",
    )
