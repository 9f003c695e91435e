"""Where a client connects, and whether anything answered there (no I/O: the clients feed
it their socket monitor's events).

An endpoint is ``ipc:///path/to/broker.sock``, ``tcp://host:port``, or ``host:port`` (read
as tcp, the way tritonclient users write it); anything else is INVALID_ARG before a socket
exists.  A zmq DEALER connects in the background and never says that nobody is there, so the
clients watch the socket's monitor once, at their first call: zmq's handshake with a server
completes within the connect window, or the call fails with UNAVAILABLE saying what was seen
(no socket file, a refused connection, a peer that does not speak zmq, silence).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

import zmq

from inferpool.client.curve import SECRET_KEY_ENV, SERVER_KEY_ENV
from inferpool.wire.errors import Code, InferpoolError, invalid_arg
from inferpool.wire.paths import ENDPOINT_ENV

CONNECT_TIMEOUT = 2.0  # seconds a first call waits for a server's handshake at most
_HOST = re.compile(r"[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\]")
_EVENT = struct.Struct("=HI")  # a monitor event's first frame: event id, value
_HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_MECHANISM_MISMATCH = int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
_FORMS = "ipc:///path/to/broker.sock, tcp://host:port or host:port"


@dataclass(frozen=True)
class Endpoint:
    """A server endpoint, parsed."""

    url: str  # what the socket connects to
    path: str = ""  # the socket file of an ipc endpoint ("" for tcp and abstract sockets)


def parse_endpoint(text: str) -> Endpoint:
    """The endpoint ``text`` names, or INVALID_ARG saying what a valid one looks like."""
    if not isinstance(text, str) or not text.strip():
        raise invalid_arg(f"no endpoint given: expected {_FORMS}")
    text = text.strip()
    scheme, sep, rest = text.partition("://")
    if not sep and "/" in text:
        raise invalid_arg(f"endpoint {text!r} has no transport: a socket file is ipc://{text}")
    if not sep:  # tritonclient's habit: host:port
        scheme, rest = "tcp", text
    if scheme == "ipc":
        if not rest:
            raise invalid_arg(f"endpoint {text!r} names no socket file: expected {_FORMS}")
        return Endpoint(text, "" if rest.startswith("@") else rest)
    if scheme != "tcp":
        raise invalid_arg(
            f"endpoint {text!r} is not one inferpool serves (its clients speak ZeroMQ over "
            f"ipc or tcp): expected {_FORMS}"
        )
    host, colon, port = rest.rpartition(":")
    if not colon or not _HOST.fullmatch(host) or not port.isdigit() or not 0 < int(port) < 65536:
        raise invalid_arg(
            f"endpoint {text!r} is not a host and port (like 127.0.0.1:8710): expected {_FORMS}"
        )
    return Endpoint(f"tcp://{host}:{int(port)}")


class Handshake:
    """What the socket monitor said about the connection, until zmq's handshake succeeds."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.done = False
        self.curve = False  # whether this client speaks CURVE (the client sets it)
        self.refusal = ""  # why the server's security refused the handshake: no use waiting
        self._seen = 0  # every event so far, or-ed

    def event(self, parts: list[zmq.Frame]) -> None:
        """One monitor message (its event id and value, then the endpoint)."""
        event, value = _EVENT.unpack_from(parts[0].buffer)
        self._seen |= event
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.done = True
        elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            self.refusal = (
                "the server refused this client's CURVE key: it is not among the keys the "
                "server authorized (--curve-authorized-keys)"
            )
        elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == _MECHANISM_MISMATCH:
            self.refusal = (
                "the server uses CURVE on this endpoint and this client does not: give it "
                f"the keys (curve_server_key and curve_secret_key, or ${SERVER_KEY_ENV} and "
                f"${SECRET_KEY_ENV})"
                if not self.curve
                else "this client uses CURVE but the server does not on this endpoint"
            )
        elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and self.curve:
            self.refusal = "the CURVE handshake failed: is the server key the server's public key?"

    @staticmethod
    def window(limit: float) -> float:
        """How long a first call waits for the handshake: the connect timeout or its own."""
        return min(CONNECT_TIMEOUT, limit)

    def failure(self, waited: float, missing: bool = False) -> InferpoolError:
        """UNAVAILABLE naming the endpoint, what was seen there and what to check."""
        path = self.endpoint.path
        if self.refusal:
            return InferpoolError(
                Code.UNAVAILABLE, f"cannot connect to {self.endpoint.url}: {self.refusal}"
            )
        if missing:
            seen = f"the socket file {path} does not exist"
        elif self._seen & _HANDSHAKE_FAILED:
            seen = (
                "the peer there does not speak ZeroMQ's protocol (is it an inferpool server? "
                "or one that uses CURVE on this endpoint: give this client the keys, "
                f"curve_server_key and curve_secret_key or ${SERVER_KEY_ENV} and "
                f"${SECRET_KEY_ENV})"
            )
        elif self._seen & zmq.EVENT_CONNECTED:
            seen = f"a connection was accepted but no ZeroMQ handshake came within {waited:g}s"
        elif self._seen & zmq.EVENT_CONNECT_RETRIED and path:
            seen = f"the socket file {path} refuses connections (left by a server that stopped?)"
        elif self._seen & zmq.EVENT_CONNECT_RETRIED:
            seen = "the connection was refused: nothing listens on that port"
        else:
            seen = f"nothing answered within {waited:g}s"
        return InferpoolError(
            Code.UNAVAILABLE,
            f"no inferpool server answers at {self.endpoint.url}: {seen}. Is `inferpool serve` "
            "running? Connect to an endpoint it printed at start ('listening on ...'), given "
            f"to the client or in ${ENDPOINT_ENV}.",
        )
