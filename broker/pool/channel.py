"""The broker's end of a worker's channel: a SOCK_SEQPACKET socketpair, one JSON message
per datagram.

Why not zmq for this hop: a zmq message crosses two libzmq I/O threads (the sender's and
the receiver's), so on a shared core every batch and every result costs extra context
switches; a socketpair wakes the other process directly.  The pair also tells the truth
about liveness: when either process dies, the other end reads EOF at once.
"""

from __future__ import annotations

import socket
from typing import Any

import orjson

from inferpool.wire.errors import Code, InferpoolError

BUFFER_BYTES = 4 << 20  # asked of the kernel; it caps this at net.core.{r,w}mem_max
MAX_MESSAGE = 192 * 1024  # below the default cap, so a datagram always fits


class Channel:
    """One worker's message pipe (broker side; non-blocking, polled by the event loop)."""

    _buf = bytearray(MAX_MESSAGE)  # the broker is single-threaded: one buffer serves all

    def __init__(self) -> None:
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._child: socket.socket | None = child
        for s in (self.sock, child):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER_BYTES)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER_BYTES)
        self.sock.setblocking(False)
        self.fd = self.sock.fileno()

    def child_fd(self) -> int:
        """The worker's end, to be inherited by the worker process (``pass_fds``)."""
        assert self._child is not None
        return self._child.fileno()

    def spawned(self) -> None:
        """The worker has its copy of the child end: drop ours, so EOF means it is gone."""
        if self._child is not None:
            self._child.close()
            self._child = None

    def send(self, msg: dict[str, Any]) -> None:
        data = orjson.dumps(msg)
        if len(data) > MAX_MESSAGE:
            raise InferpoolError(
                Code.INTERNAL, f"message of {len(data)} bytes exceeds the worker channel limit"
            )
        try:
            self.sock.send(data)
        except BlockingIOError:
            raise InferpoolError(
                Code.UNAVAILABLE, "the worker is not reading its channel (buffer full)"
            ) from None

    def recv(self) -> dict[str, Any] | None:
        """The next message; None once the worker's end is closed (it exited or died)."""
        try:
            n = self.sock.recv_into(self._buf)
        except BlockingIOError:
            return {}
        except ConnectionResetError:
            return None
        if n == 0:
            return None
        msg: dict[str, Any] = orjson.loads(memoryview(self._buf)[:n])
        return msg

    def close(self) -> None:
        self.spawned()
        self.sock.close()
