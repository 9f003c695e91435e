"""Which clients are still there: disconnects from the socket monitors, silence by the clock.

A client's zmq routing id is tied to its connection through the fd its message came from
(``zmq.SRCFD``), which also says who the peer is (``front.peers``, looked up once per
connection, when a rule needs it).  The KServe frontends' callers have no connection of their
own: each of their messages names its caller, and what they register lasts until they
unregister it (as in Triton).  Each ROUTER's monitor reports that fd when the
connection closes, however the client died: what it held ends then.  Of the clients that
hold something (registrations, leases), one that stays connected but says nothing for longer
than the lease timeout loses its leases (a live one keeps them with ``keepalive`` messages).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from inferpool.broker.front.peers import KSERVE_TAG, SECURE_TAG, UNKNOWN, Peer, caller_peer, peer_of

log = logging.getLogger("inferpool.clients")


@dataclass
class _Client:
    last_seen: float


class ClientTracker:
    """The clients that hold something, and the end of each: a disconnect or too long a silence."""

    def __init__(
        self,
        sockets: Sequence[zmq.Socket[Any]],
        silence_s: float,
        on_disconnect: Callable[[bytes], None],
        on_silent: Callable[[bytes], None],
    ) -> None:
        self.silence_s = silence_s
        self._sockets = sockets
        self._monitors = [s.get_monitor_socket(zmq.EVENT_DISCONNECTED) for s in sockets]
        for monitor in self._monitors:
            monitor.setsockopt(zmq.LINGER, 0)
        self._on_disconnect = on_disconnect
        self._on_silent = on_silent
        self._clients: dict[bytes, _Client] = {}  # those that hold something
        self._peers: dict[bytes, Peer] = {}  # every connection looked at, by client
        self._fds: dict[bytes, int] = {}
        self._by_fd: dict[int, bytes] = {}

    def track(self, client: bytes, source: Any) -> None:
        """Start watching ``client``; ``source`` is a frame of the message it just sent."""
        if client in self._clients or client.startswith(KSERVE_TAG):
            return
        self._connection(client, source)
        self._clients[client] = _Client(time.monotonic())

    def active(self, client: bytes, source: Any) -> None:
        """``client`` sent a request (``source``: a frame of it): it is watched from now on
        (``track``), who it is was looked at (``peer``) and it was ``seen`` now; one lookup
        for a client already known, as every request of a steady client is."""
        state = self._clients.get(client)
        if state is not None and client in self._peers:
            state.last_seen = time.monotonic()
            return
        self.track(client, source)
        self.peer(client, source)
        self.seen(client)

    def peer(self, client: bytes, source: Any) -> Peer:
        """Who ``client`` is (``source``: a frame of the message it just sent)."""
        if client.startswith(KSERVE_TAG):
            return caller_peer(client)
        peer = self._peers.get(client)
        if peer is None:
            fd = self._connection(client, source)
            secure = client.startswith(SECURE_TAG)
            peer = peer_of(fd, secure, _user_id(source) if secure else "") if fd >= 0 else UNKNOWN
            self._peers[client] = peer
        return peer

    def known(self, client: bytes) -> Peer | None:
        """Who ``client`` is, if it was looked at already."""
        if client.startswith(KSERVE_TAG):
            return caller_peer(client)
        return self._peers.get(client)

    def _connection(self, client: bytes, source: Any) -> int:
        """The fd of ``client``'s connection, watched for its end from now on (-1: none)."""
        fd = self._fds.get(client)
        if fd is not None:
            return fd
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
            self._fds[client] = fd
        return fd

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
        for monitor in self._monitors:
            while True:
                try:
                    event = recv_monitor_message(monitor, zmq.NOBLOCK)
                except zmq.Again:
                    break
                client = self._by_fd.get(int(event["value"]))
                if client is not None:
                    self._gone(client)

    def _gone(self, client: bytes) -> None:
        fd = self._fds.pop(client, None)
        if fd is not None:
            self._by_fd.pop(fd, None)
        self._peers.pop(client, None)
        if self._clients.pop(client, None) is not None:
            self._on_disconnect(client)

    def __len__(self) -> int:
        return len(self._clients)

    def close(self) -> None:
        for sock, monitor in zip(self._sockets, self._monitors, strict=True):
            with contextlib.suppress(zmq.ZMQError):
                sock.disable_monitor()
            monitor.close(0)


def _user_id(source: Any) -> str:
    """The User-Id the ZAP handler gave a CURVE client's messages: its public key (Z85)."""
    try:
        return str(source.get("User-Id"))
    except (AttributeError, zmq.ZMQError):
        return ""
