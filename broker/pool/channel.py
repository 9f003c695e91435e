"""The broker's end of a worker's channel: a SOCK_SEQPACKET socketpair carrying the messages of
``wire.worker.protocol``, one per datagram.

Why not zmq for this hop: a zmq message crosses two libzmq I/O threads (the sender's and
the receiver's), so on a shared core every batch and every result costs extra context
switches; a socketpair wakes the other process directly.  The pair also tells the truth
about liveness: when either process dies, the other end reads EOF at once.
"""

from __future__ import annotations

import socket
from typing import Final, NamedTuple

from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.worker.link import Link, TooLarge
from inferpool.wire.worker.protocol import (
    MAX_MESSAGE,
    BrokerMessage,
    Execute,
    Free,
    WorkerMessage,
    decode_from_worker,
    split,
)

BUFFER_BYTES = 4 << 20  # asked of the kernel; it caps this at net.core.{r,w}mem_max
NOTHING: Final = ()  # recv() found no datagram: falsy, unlike every message


class Garbled(NamedTuple):
    """A datagram from a worker that is not a message (a bug in the worker: it is killed)."""

    reason: str


class Channel:
    """One worker's message pipe (broker side; non-blocking, polled by the event loop)."""

    _buf = bytearray(MAX_MESSAGE)  # the broker is single-threaded: one buffer serves all

    def __init__(self) -> None:
        sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._child: socket.socket | None = child
        for s in (sock, child):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER_BYTES)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER_BYTES)
        sock.setblocking(False)
        self.link = Link(sock, decode_from_worker, self._buf)
        self.fd = sock.fileno()

    def child_fd(self) -> int:
        """The worker's end, to be inherited by the worker process (``pass_fds``)."""
        assert self._child is not None
        return self._child.fileno()

    def spawned(self) -> None:
        """The worker has its copy of the child end: drop ours, so EOF means it is gone."""
        if self._child is not None:
            self._child.close()
            self._child = None

    def send(self, msg: BrokerMessage) -> None:
        """Send ``msg``, split if its slots, unmaps and releases make it too large for one
        datagram; INTERNAL if it still does not fit, UNAVAILABLE if the worker stopped reading."""
        try:
            try:
                self.link.send(msg)
            except TooLarge:
                if not isinstance(msg, Execute | Free):
                    raise
                for part in split(msg):
                    self.link.send(part)
        except BlockingIOError:
            raise InferpoolError(
                Code.UNAVAILABLE, "the worker is not reading its channel (buffer full)"
            ) from None

    def recv(self) -> WorkerMessage | Garbled | tuple[()] | None:
        """The next message; NOTHING if there is none yet; None once the worker's end is
        closed (it exited or died)."""
        try:
            return self.link.recv()
        except BlockingIOError:
            return NOTHING
        except ConnectionResetError:
            return None
        except InferpoolError as err:
            return Garbled(err.message)

    def close(self) -> None:
        self.spawned()
        self.link.close()
