"""``inferpool keygen``: a CURVE key pair as zmq certificates, for a server or a client.

``NAME.key`` holds the public key (give it to the other side: a client's goes into the
server's ``--curve-authorized-keys`` directory, the server's to its clients) and
``NAME.key_secret`` both keys (mode 0600: it stays with its owner).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import zmq.auth

from inferpool.wire.errors import invalid_arg


def add_keygen(sub: Any) -> None:
    """``inferpool keygen`` and its flags."""
    p = sub.add_parser(
        "keygen", help="write a CURVE key pair for a server or a client", description=__doc__
    )
    p.add_argument("name", help="file name of the pair: NAME.key and NAME.key_secret")
    p.add_argument("--dir", default=".", help="where to write them (default: here)")
    p.set_defaults(func=cmd_keygen)


def cmd_keygen(args: argparse.Namespace) -> int:
    """Write a CURVE key pair: NAME.key and NAME.key_secret."""
    name = args.name
    if not name or "/" in name or name.startswith("."):
        raise invalid_arg(f"keygen: {name!r} is not a file name")
    paths = [os.path.join(args.dir, f"{name}.{ext}") for ext in ("key", "key_secret")]
    existing = [p for p in paths if os.path.exists(p)]
    if existing:
        raise invalid_arg(f"keygen: {existing[0]} exists already; remove it or choose another name")
    os.makedirs(args.dir, mode=0o700, exist_ok=True)
    umask = os.umask(0o077)  # the secret file is never readable by others, not even briefly
    try:
        public, secret = zmq.auth.create_certificates(args.dir, name)
    finally:
        os.umask(umask)
    os.chmod(public, 0o644)
    print(f"public key: {public}\nsecret key: {secret} (keep it private)")
    return 0
