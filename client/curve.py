"""CURVE keys of a client, for a server whose tcp endpoints require them
(``inferpool serve --curve-secret-key ... --curve-authorized-keys ...``).

The client needs the server's public key (its certificate file, or the 40-character key
itself) and its own secret certificate, whose public half the server's operator put in the
authorized directory.  ``inferpool keygen`` writes both kinds of file.  Keys not given to a
client are read from $INFERPOOL_CURVE_SERVER_KEY and $INFERPOOL_CURVE_SECRET_KEY (file
paths), so the command-line tools find them too.  They apply to tcp endpoints only: the
server's ipc endpoints do not use CURVE.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.auth

from inferpool.wire.errors import invalid_arg

SERVER_KEY_ENV = "INFERPOOL_CURVE_SERVER_KEY"
SECRET_KEY_ENV = "INFERPOOL_CURVE_SECRET_KEY"
_Z85_KEY = 40  # characters of a CURVE key in Z85


@dataclass(frozen=True)
class CurveClientKeys:
    """A client's CURVE keys and the server's public key."""

    server: bytes
    public: bytes
    secret: bytes

    def apply(self, sock: zmq.Socket[Any]) -> None:
        """Make ``sock`` a CURVE client of the server (before it connects)."""
        sock.curve_serverkey = self.server
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret


def client_keys(server_key: str | bytes | None, secret_key: str | None) -> CurveClientKeys | None:
    """The keys given (or in the environment); None when there are none."""
    server_key = server_key or os.environ.get(SERVER_KEY_ENV) or None
    secret_key = secret_key or os.environ.get(SECRET_KEY_ENV) or None
    if not server_key and not secret_key:
        return None
    if not server_key:
        raise invalid_arg(
            f"a CURVE secret key needs the server's public key too (curve_server_key or "
            f"${SERVER_KEY_ENV})"
        )
    server = _public_key(server_key)
    if not secret_key:  # encrypted, but no server that authorizes keys will let it in
        public, secret = zmq.curve_keypair()
        return CurveClientKeys(server, public, secret)
    try:
        public, secret_or_none = zmq.auth.load_certificate(secret_key)
    except (OSError, ValueError) as exc:
        raise invalid_arg(f"CURVE secret key {secret_key}: not a zmq certificate ({exc})") from None
    if not secret_or_none:
        raise invalid_arg(
            f"CURVE secret key {secret_key} holds only a public key: give the *.key_secret file"
        )
    return CurveClientKeys(server, public, secret_or_none)


def _public_key(key: str | bytes) -> bytes:
    """A Z85 public key given as itself or as the path of a certificate file."""
    raw = key.encode() if isinstance(key, str) else key
    if len(raw) == _Z85_KEY and not os.path.exists(raw):
        return raw
    try:
        public, _ = zmq.auth.load_certificate(os.fsdecode(raw))
    except (OSError, ValueError) as exc:
        raise invalid_arg(
            f"CURVE server key {os.fsdecode(raw)!r}: neither a 40-character key nor a zmq "
            f"certificate ({exc})"
        ) from None
    return public
