"""Where a server listens by default, for the broker and every client on the machine."""

from __future__ import annotations

import os

ENDPOINT_ENV = "INFERPOOL_ENDPOINT"  # a client's endpoint when it is given none
DEFAULT_TCP = "tcp://127.0.0.1:8710"


def default_run_dir() -> str:
    """The user's own directory for the broker's sockets: $XDG_RUNTIME_DIR or /tmp."""
    base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    return os.path.join(base, f"inferpool-{os.getuid()}")


def default_ipc_endpoint() -> str:
    """The ipc endpoint a broker binds by default."""
    return f"ipc://{os.path.join(default_run_dir(), 'broker.sock')}"


def default_endpoint() -> str:
    """A client's endpoint: $INFERPOOL_ENDPOINT, else the broker's default ipc endpoint."""
    return os.environ.get(ENDPOINT_ENV) or default_ipc_endpoint()
