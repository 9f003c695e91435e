"""systemd's sd_notify protocol (READY=1, STOPPING=1, STATUS=..., WATCHDOG=1), without
libsystemd."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


def sd_notify(state: str) -> bool:
    """Tell systemd about our state when run as a Type=notify service; a no-op otherwise."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.setblocking(False)  # a reader that falls behind never stalls the broker
            sock.connect(address)
            sock.send(state.encode())
    except OSError:
        return False
    return True


class Watchdog:
    """``WatchdogSec=``: systemd restarts a service that stops sending WATCHDOG=1.

    The broker's loop calls :meth:`tick` at every housekeeping step, so the pings stop when
    the loop is stuck, and systemd restarts the broker.  They go at half the interval that
    systemd asks for (``WATCHDOG_USEC``, meant for the process ``WATCHDOG_PID``), as
    sd_watchdog_enabled(3) advises; without one, tick does nothing.
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
        mine = not pid or pid == str(os.getpid())
        self.interval = int(usec) / 2e6 if usec.isdigit() and mine else 0.0
        self._next = 0.0

    def tick(self, now: float) -> None:
        if self.interval and now >= self._next:
            sd_notify("WATCHDOG=1")
            self._next = now + self.interval
