"""CURVE on tcp endpoints: the server's key pair, and the clients it lets in.

With ``--curve-secret-key FILE --curve-authorized-keys DIR`` every tcp endpoint is bound on a
ROUTER socket of its own that speaks CURVE: the traffic is encrypted, and zmq's ZAP handler
(pyzmq's ``ThreadAuthenticator``, one thread) admits only clients whose public key is one of
the certificates in ``DIR``.  ipc endpoints stay on the plain socket, where the kernel says
who the client is.  Key files are zmq's certificates (``inferpool keygen`` writes them).
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from inferpool.wire.errors import invalid_arg

log = logging.getLogger("inferpool.broker")


@dataclass(frozen=True)
class CurveKeys:
    """The server's CURVE key pair and where its clients' public certificates are."""

    public: bytes
    secret: bytes
    authorized: str  # the directory of the authorized clients' public certificates


def load_server_keys(secret_file: str, authorized: str) -> CurveKeys:
    """The server's key pair and its clients' directory; INVALID_ARG naming what is wrong."""
    try:
        public, secret = zmq.auth.load_certificate(secret_file)
    except (OSError, ValueError) as exc:
        raise invalid_arg(
            f"--curve-secret-key {secret_file}: not a zmq certificate ({exc})"
        ) from None
    if not secret:
        raise invalid_arg(
            f"--curve-secret-key {secret_file} holds no secret key: give the server's "
            "*.key_secret file (inferpool keygen writes it)"
        )
    if not os.path.isdir(authorized):
        raise invalid_arg(f"--curve-authorized-keys {authorized} is not a directory")
    return CurveKeys(public, secret, authorized)


def secure(
    stack: contextlib.ExitStack, ctx: zmq.Context[Any], sock: zmq.Socket[Any], keys: CurveKeys
) -> None:
    """Make ``sock`` a CURVE server that lets in only the authorized keys (before it binds)."""
    auth = ThreadAuthenticator(ctx, log=log)
    auth.start()
    stack.callback(auth.stop)
    auth.configure_curve(domain="*", location=keys.authorized)
    clients = len(glob.glob(os.path.join(keys.authorized, "*.key")))
    log.info("CURVE on tcp endpoints: %d authorized client key(s) in %s", clients, keys.authorized)
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_server = True
