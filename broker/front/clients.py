"""Which clients are still there: disconnects from the socket monitor, silence by the clock.

Only clients that hold something (registrations, leases) are tracked.  A client's zmq
routing id is tied to its connection through the fd its message came from
(``zmq.SRCFD``); the ROUTER's monitor reports that fd when the connection closes, however
the client died.  A client that stays connected but says nothing for longer than the lease
timeout loses its leases (a live one keeps them with ``keepalive`` messages).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

log = logging.getLogger("inferpool.clients")


@dataclass
class _Client:
    fd: int
    last_seen: float


class ClientTracker:
    def __init__(
        self,
        socket: zmq.Socket[Any],
        silence_s: float,
        on_disconnect: Callable[[bytes], None],
        on_silent: Callable[[bytes], None],
    ) -> None:
        self.silence_s = silence_s
        self._socket = socket
        self._monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._monitor.setsockopt(zmq.LINGER, 0)
        self._on_disconnect = on_disconnect
        self._on_silent = on_silent
        self._clients: dict[bytes, _Client] = {}
        self._by_fd: dict[int, bytes] = {}

    def track(self, client: bytes, source: Any) -> None:
        """Start watching ``client``; ``source`` is a frame of the message it just sent."""
        if client in self._clients:
            return
        self._drain()  # a closed connection's fd may be reused by this one: settle that first
        try:
            fd = int(source.get(zmq.SRCFD))
        except (AttributeError, zmq.ZMQError):
            fd = -1  # no fd to watch: the silence timeout still applies
        if fd >= 0:
            stale = self._by_fd.get(fd)
            if stale is not None:
                self._gone(stale)
            self._by_fd[fd] = client
        self._clients[client] = _Client(fd, time.monotonic())

    def seen(self, client: bytes) -> None:
        state = self._clients.get(client)
        if state is not None:
            state.last_seen = time.monotonic()

    def tick(self, now: float) -> None:
        self._drain()
        limit = now - self.silence_s
        for client, state in list(self._clients.items()):
            if state.last_seen < limit:
                state.last_seen = now  # one reclaim per silence
                self._on_silent(client)

    def _drain(self) -> None:
        while True:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            client = self._by_fd.pop(int(event["value"]), None)
            if client is not None:
                self._clients.pop(client, None)
                self._on_disconnect(client)

    def _gone(self, client: bytes) -> None:
        state = self._clients.pop(client, None)
        if state is not None:
            self._by_fd.pop(state.fd, None)
            self._on_disconnect(client)

    def __len__(self) -> int:
        return len(self._clients)

    def close(self) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self._socket.disable_monitor()
        self._monitor.close(0)
