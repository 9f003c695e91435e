"""One end of a worker's channel: a SOCK_SEQPACKET socket, one encoded message per datagram.

The broker creates the socketpair (broker/pool/channel.py) and the worker inherits its end;
both wrap their end in a :class:`Link`.  A datagram arrives whole or not at all, and a
datagram larger than :data:`MAX_MESSAGE` is refused on both sides rather than cut short.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Generic, TypeVar

from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.worker.protocol import MAX_MESSAGE, Message, encode

In = TypeVar("In")


class Link(Generic[In]):
    """Sends any message; receives what ``decode`` reads (the other side's messages)."""

    def __init__(
        self,
        sock: socket.socket,
        decode: Callable[[memoryview], In],
        buffer: bytearray | None = None,
    ) -> None:
        self.sock = sock
        self._decode = decode
        self._buf = buffer if buffer is not None else bytearray(MAX_MESSAGE)
        self._view = memoryview(self._buf)

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, msg: Message) -> None:
        """Send ``msg``; TooLarge (INTERNAL) if it is larger than a datagram may be.

        A non-blocking socket whose peer does not read raises BlockingIOError.
        """
        data = encode(msg)
        if len(data) > MAX_MESSAGE:
            raise too_large(len(data))
        self.sock.send(data)

    def recv(self) -> In | None:
        """The next message; None once the other end is closed.

        Raises BlockingIOError when a non-blocking socket has nothing, INTERNAL for a
        datagram that is not a message (or too large: it is discarded whole).
        """
        n = self.sock.recv_into(self._buf, MAX_MESSAGE, socket.MSG_TRUNC)
        if n == 0:
            return None
        if n > MAX_MESSAGE:
            raise too_large(n)
        return self._decode(self._view[:n])

    def close(self) -> None:
        self.sock.close()


class TooLarge(InferpoolError):
    """A message that cannot travel in one datagram (nothing of it was sent or kept)."""


def too_large(nbytes: int) -> TooLarge:
    """The error for a message past the channel's limit."""
    return TooLarge(
        Code.INTERNAL,
        f"a message of {nbytes} bytes exceeds the worker channel limit of {MAX_MESSAGE} bytes",
    )
