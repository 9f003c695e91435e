"""systemd's sd_notify protocol (READY=1, STOPPING=1, STATUS=...), without libsystemd."""

from __future__ import annotations

import os
import socket


def sd_notify(state: str) -> bool:
    """Tell systemd about our state when run as a Type=notify service; a no-op otherwise."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError:
        return False
    return True
