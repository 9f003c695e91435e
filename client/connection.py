"""The socket under both clients: a DEALER connected to the core's endpoint, and its monitor,
watched until a server has answered zmq's handshake (what the sync and asyncio clients share
of I/O; how they wait is theirs)."""

from __future__ import annotations

import contextlib
import itertools
import os
from typing import Any, cast

import zmq

from inferpool.client.core import DEFAULT_TIMEOUT, ClientCore, Exchange
from inferpool.client.curve import client_keys
from inferpool.wire.paths import default_endpoint
from inferpool.wire.zmqio import NOBLOCK, SNDMORE, recv_frames, send_parts

EVENTS = int(zmq.EVENTS)  # plain ints: pyzmq's attribute and enum sugar costs per call
POLLIN = int(zmq.POLLIN)
POLLOUT = int(zmq.POLLOUT)
_MONITORS = itertools.count()


class Connection:
    """A client's connection: the socket, its endpoint, and the settings every client shares."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        context: zmq.Context[Any] | None = None,
        routing_id: bytes | None = None,
        curve_server_key: str | bytes | None = None,
        curve_secret_key: str | None = None,
    ) -> None:
        """``endpoint``: where the server listens (default: $INFERPOOL_ENDPOINT, else the
        default ipc endpoint); ``timeout``: seconds a call waits unless it says otherwise;
        ``context``: a zmq context (default: the process's shared one); ``routing_id``: the
        socket's identity; ``curve_server_key`` (the server's public certificate file or
        key) and ``curve_secret_key`` (this client's secret certificate file): for a tcp
        endpoint that requires CURVE (client.curve; default: from the environment)."""
        self._core = core = self._new_core(endpoint or default_endpoint(), timeout)
        tcp = core.endpoint.startswith("tcp://")
        self._curve = client_keys(curve_server_key, curve_secret_key) if tcp else None
        core.handshake.curve = self._curve is not None
        # one context (one zmq I/O thread) per process unless given: a client that is never
        # closed then leaves its sockets to the garbage collector, not a context to terminate
        self._ctx = context or zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        if routing_id:  # how the server knows this client (its leases, its regions)
            self._sock.setsockopt(zmq.ROUTING_ID, routing_id)
        self._secure(self._sock)
        self._monitor: zmq.Socket[Any] | None = self._sock.get_monitor_socket(
            addr=f"inproc://inferpool-monitor-{os.getpid()}-{next(_MONITORS)}"
        )  # pyzmq's default address reuses the socket's fd number: unsafe in a shared context
        self._monitor.setsockopt(zmq.LINGER, 0)
        self._sock.connect(core.endpoint)
        self._setup()

    def _setup(self) -> None:
        """What a subclass adds to a new client (each calls its parent's first)."""

    def _secure(self, sock: zmq.Socket[Any]) -> None:
        """Give a socket of this client's (before it connects) the client's CURVE keys."""
        if self._curve is not None:
            self._curve.apply(sock)

    def _new_core(self, endpoint: str, timeout: float) -> ClientCore:
        return ClientCore(endpoint, timeout)

    @property
    def endpoint(self) -> str:
        return self._core.endpoint

    @property
    def timeout(self) -> float:
        """Seconds a call waits for its response unless it says otherwise."""
        return self._core.timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        self._core.timeout = value

    # ------------------------------------------------------------------ connecting
    def _answered(self) -> bool:
        """Hand the monitor's events to the core; True (the monitor closed) once a server
        has completed zmq's handshake with this socket."""
        monitor = self._monitor
        if monitor is None:
            return True
        while cast(int, monitor.getsockopt(EVENTS)) & POLLIN:  # also re-arms its descriptor
            self._core.handshake.event(recv_frames(monitor, NOBLOCK))
        if not self._core.handshake.done:
            return False
        self._end_monitor()
        return True

    def _check_path(self) -> None:
        """UNAVAILABLE at once when the endpoint's socket file does not exist."""
        path = self._core.handshake.endpoint.path
        if path and not os.path.exists(path):
            raise self._core.handshake.failure(0.0, missing=True)

    def _end_monitor(self) -> None:
        if self._monitor is not None:
            self._sock.disable_monitor()
            self._monitor.close(0)
            self._monitor = None

    # ------------------------------------------------------------------ sending, closing
    def _send_request(self, exchange: Exchange[Any], *first: bytes) -> None:
        """The request's message from ``first`` on (the empty delimiter, unless it went
        already): the header and the tensor frames, one send, without a copy (pyzmq still
        copies parts under 64 KiB: the header, small tensors)."""
        send_parts(self._sock, (*first, exchange.header, *exchange.frames), copy=False)
        exchange.sent = True

    def _cancel(self, exchange: Exchange[Any]) -> None:
        """Cancel a request given up on (a timeout, a cancelled task, a stream left early)
        on the server: best effort, never waits (a full socket drops it)."""
        header = self._core.cancel(exchange)
        if header is not None and not self._core.closed:
            with contextlib.suppress(zmq.Again):
                self._sock.send(b"", SNDMORE | NOBLOCK)
                self._sock.send(header)

    def _close_socket(self) -> None:
        self._end_monitor()
        self._sock.close(0)
