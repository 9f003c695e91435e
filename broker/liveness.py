"""Noticing a worker that is alive as a process but no longer answers: a heartbeat the
worker's GIL cannot starve.

What detects what:

* a worker that *exits* (crash, signal, ``os._exit``) is seen by the supervisor's reap
  (SIGCHLD wakes the loop at once);
* a worker whose execute *runs too long* (a GIL-holding loop, a sleep, a deadlock) is killed
  by the supervisor's execute timeout (``--execute-timeout``);
* a worker that is *frozen* (SIGSTOP, a debugger, a cgroup freezer) is seen here: the broker's
  ROUTER and the worker's DEALER exchange ZMTP heartbeats, which libzmq's I/O thread answers
  without the GIL, so a busy backend keeps its connection but a stopped process loses it after
  ``3 * --heartbeat-ms``.  The ROUTER is ``ROUTER_MANDATORY``, so a probe sent to a worker
  whose connection was dropped fails with EHOSTUNREACH instead of vanishing.  A READY worker
  that is unreachable on two probes in a row (one interval apart, so a process that is just
  exiting is reaped first) is killed, and the supervisor handles it like a crash: its
  in-flight requests are answered UNAVAILABLE and it is respawned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import zmq

from broker.supervisor import Supervisor, WorkerHandle, WorkerState

log = logging.getLogger("inferpool.liveness")
PROBE = b'{"op":"ping"}'
Send = Callable[[WorkerHandle, bytes], bool]


def configure_router(sock: zmq.Socket[Any], heartbeat_ms: int) -> None:
    """The broker's worker-facing ROUTER: heartbeats on, unroutable sends reported."""
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a worker that reconnects keeps its identity
    if heartbeat_ms > 0:
        sock.setsockopt(zmq.HEARTBEAT_IVL, heartbeat_ms)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, heartbeat_ms * 3)


class Liveness:
    """Probes READY workers every heartbeat interval; kills the ones that stay unreachable."""

    def __init__(self, supervisor: Supervisor, send: Send, heartbeat_ms: int) -> None:
        self.supervisor = supervisor
        self.send = send
        self.interval = heartbeat_ms / 1000.0
        self._next = 0.0
        self._missed: dict[WorkerHandle, float] = {}  # handle -> first failed probe

    def check(self, now: float) -> None:
        if self.interval <= 0 or now < self._next:
            return
        self._next = now + self.interval
        missed: dict[WorkerHandle, float] = {}
        for handle in self.supervisor.alive():
            if handle.state is not WorkerState.READY or handle.kill_reason:
                continue
            if self.send(handle, PROBE):
                continue
            since = self._missed.get(handle)
            if since is None:
                missed[handle] = now
                continue
            assert handle.proc is not None
            if handle.proc.poll() is not None:
                continue  # it exited: the supervisor's reap reports how
            reason = (
                f"stopped answering heartbeats (no answer for {now - since + self.interval:.1f}s;"
                " the process is stopped or frozen) and was killed"
            )
            log.error("worker %s (pid %s) %s", handle.name, handle.pid, reason)
            self.supervisor.kill(handle, reason)
        self._missed = missed
