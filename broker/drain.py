"""Draining a node: stop taking requests, finish the admitted ones, stop the workers, exit 0.

SIGTERM, SIGINT and the ``drain`` message (``POST /drain`` over HTTP) start the same drain;
the message only from the server's own user or root (``front.peers.require_operator``).
Readiness fails at once, so probes and routers (Kubernetes endpoints, a Ray Serve health
check) stop sending here; admissions stop ``delay`` seconds later (0 by default: at once),
which lets routers that poll readiness notice before a request they send is refused.  From
then on a new request is answered UNAVAILABLE naming the drain, and the admitted ones get
``timeout`` seconds to finish; what is left is answered UNAVAILABLE, the workers stop (each
runs its finalizers) and the broker's loop returns 0.  A second signal or message changes
nothing: the first drain goes on.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from typing import Any

from inferpool.broker.front.peers import Peer, require_operator
from inferpool.broker.front.readiness import Readiness
from inferpool.broker.front.router import Handler
from inferpool.broker.models.request_path import RequestPath
from inferpool.broker.notify import sd_notify
from inferpool.broker.pool.supervisor import Supervisor
from inferpool.wire.errors import Code, InferpoolError

log = logging.getLogger("inferpool.broker")


class Phase(str, enum.Enum):
    """Where a drain stands."""

    SERVING = "SERVING"
    NOTICE = "NOTICE"  # readiness fails, requests are still admitted (the delay)
    DRAINING = "DRAINING"  # no admissions; the admitted requests finish
    STOPPING = "STOPPING"  # the workers stop


class Drain:
    """A drain (SIGTERM, SIGINT or the drain message): readiness fails, admissions stop, the
    admitted requests finish, the workers stop."""

    def __init__(
        self,
        readiness: Readiness,
        requests: RequestPath,
        supervisor: Supervisor[Any],
        delay: float,
        timeout: float,
        peer: Callable[[bytes], Peer],
        admissions_end: Callable[[str], None],
    ) -> None:
        """``delay``: seconds between the drain's start and the end of admissions;
        ``timeout``: seconds the admitted requests then get to finish; ``peer``: who sent
        the message being handled (only an operator may drain); ``admissions_end(why)``:
        told when admissions end (the lanes end then)."""
        self.readiness = readiness
        self.requests = requests
        self.supervisor = supervisor
        self.delay = delay
        self.timeout = timeout
        self.peer = peer
        self.admissions_end = admissions_end
        self.phase = Phase.SERVING
        self._admit_until = 0.0
        self._deadline = 0.0

    @property
    def active(self) -> bool:
        return self.phase is not Phase.SERVING

    def handlers(self) -> dict[str, Handler]:
        return {"drain": self.requested}

    def requested(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        """The ``drain`` message (the server's own user or root only): answered at once,
        with what is still in flight."""
        require_operator(self.peer(e[0]), "drain the server")
        self.begin("asked to drain", time.monotonic())
        return {
            "draining": True,
            "reason": self.readiness.draining,
            "inflight": len(self.requests.inflight),
        }

    def begin(self, why: str, now: float) -> None:
        if self.active:
            return
        log.info(
            "draining (%s): not ready; %d request(s) in flight; admissions stop in %gs, "
            "in-flight requests then get %gs",
            why,
            len(self.requests.inflight),
            self.delay,
            self.timeout,
        )
        sd_notify("STOPPING=1")
        self.readiness.draining = why
        self.phase = Phase.NOTICE
        self._admit_until = now + self.delay

    def step(self, now: float) -> bool:
        """Advance the drain; True once every worker has stopped."""
        if self.phase is Phase.NOTICE:
            if now < self._admit_until:
                return False
            self.readiness.admitting = False
            self.phase = Phase.DRAINING
            self.admissions_end(self.readiness.draining)
            self._deadline = now + self.timeout
            log.info("admissions stopped; %d request(s) in flight", len(self.requests.inflight))
        requests = self.requests
        if self.phase is Phase.DRAINING:
            if requests.inflight and now < self._deadline:
                return False
            err = InferpoolError(
                Code.UNAVAILABLE,
                f"the server drained ({self.readiness.draining}) before the request finished",
            )
            for req in list(requests.inflight.values()):
                requests.reject(req, err)
            for handle in list(self.supervisor.handles.values()):
                self.supervisor.stop(handle)
            self.phase = Phase.STOPPING
        self.supervisor.reap()
        return not self.supervisor.alive()
