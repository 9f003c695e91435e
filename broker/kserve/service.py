"""The KServe frontends' listeners: HTTP, gRPC and health, in one asyncio loop.

They run in the frontends' own process (``kserve.frontends``), with aiohttp (the HTTP frontend,
and the health routes alone on the health port) and ``grpc.aio`` (the gRPC frontend), and
reach the broker only through the channel (``kserve.broker_channel``).  :meth:`Listeners.start`
binds every listener before the process says it is ready, so a port in use fails the
broker's start with one clear line; :meth:`Listeners.close` stops them, letting the calls
in progress finish for up to ``STOP_GRACE_S``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket

import grpc
from aiohttp import web

from inferpool.broker.kserve import grpc_ssl, health, http_app
from inferpool.broker.kserve.broker_channel import BrokerChannel
from inferpool.broker.kserve.callers import Callers
from inferpool.broker.kserve.classification import Labels
from inferpool.broker.kserve.frontend_options import FrontendOptions
from inferpool.broker.kserve.grpc_handlers import add_to_server
from inferpool.broker.kserve.grpc_service import InferenceServicer
from inferpool.broker.kserve.http_base import application
from inferpool.broker.kserve.input_region import Inputs
from inferpool.broker.kserve.socket_owner import SocketOwners
from inferpool.wire.errors import Code, InferpoolError

log = logging.getLogger("inferpool.kserve")
STOP_GRACE_S = 2.0  # the broker answered every request before it stops the frontends
_GRPC_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.so_reuseport", 0),  # a port in use is an error, never silently shared
]


class Listeners:
    """The listeners the options ask for, each serving through ``channel``."""

    def __init__(self, channel: BrokerChannel, options: FrontendOptions, inputs: Inputs) -> None:
        """``inputs``: the process's input region, where large tensors are written."""
        self._channel = channel
        self._options = options
        self._inputs = inputs
        self._stack = contextlib.AsyncExitStack()

    async def start(self) -> None:
        """Bind and start every listener; InferpoolError (UNAVAILABLE) naming the one that
        cannot be bound, with nothing left listening."""
        try:
            await self._start()
        except BaseException:
            await self._stack.aclose()
            raise

    async def _start(self) -> None:
        opts = self._options
        channel = self._channel
        owners = SocketOwners()
        self._stack.callback(owners.close)
        callers = Callers(owners)
        labels = Labels(channel)  # of the outputs classified, for both frontends
        if opts.http_port:
            app = http_app.build(channel, callers, opts.bodies(), self._inputs, labels)
            # a closed connection cancels its handler, and so its inference at the broker
            await self._serve_http(
                app, "HTTP", "http", opts.http_address, opts.http_port, handler_cancellation=True
            )
        if opts.health_port:
            app = application(health.routes(channel, callers), 1 << 16)
            await self._serve_http(app, "health", "health", opts.health_address, opts.health_port)
        if opts.grpc_port:
            servicer = InferenceServicer(
                channel, callers, opts.grpc_address, opts.grpc_port, self._inputs, labels
            )
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
        opts = self._options
        limit = ("grpc.max_receive_message_length", opts.max_message)
        secure = grpc_ssl.credentials(opts)  # (a certificate that cannot be read: here)
        server = grpc.aio.server(options=[*_GRPC_OPTIONS, limit])
        add_to_server(servicer, server)
        where = f"{_host(address)}:{port}"
        try:
            if secure is None:
                server.add_insecure_port(where)
            else:
                server.add_secure_port(where, secure)
        except RuntimeError:  # grpc does not say why: a plain bind on the address does
            raise _bind_error("gRPC", "grpc", address, port, _why_not(address, port)) from None
        await server.start()
        self._stack.push_async_callback(server.stop, STOP_GRACE_S)
        log.info("gRPC on %s%s", where, opts.grpc_security)

    async def close(self) -> None:
        """Stop every listener (the calls in progress get ``STOP_GRACE_S`` to finish)."""
        await self._stack.aclose()


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
