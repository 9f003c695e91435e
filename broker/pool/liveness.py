"""Noticing a worker that is alive as a process but can no longer work: frozen workers.

What detects what, none of it through the worker's GIL:

* a worker that *exits* (crash, signal, ``os._exit``): its channel reads EOF at once, and
  SIGCHLD (a fresh worker) or its zygote's report (a forked one) wakes the loop, whose reap
  reports how it ended;
* a worker whose execute *runs too long* (a GIL-holding loop, a sleep, a deadlock): the
  supervisor's execute timeout (``--execute-timeout``) kills it;
* a worker that is *frozen* (SIGSTOP, a debugger stop, a cgroup freezer): looked for here,
  every ``--heartbeat-ms``, in the state the kernel reports for the process
  (``/proc/<pid>/stat``: ``T`` stopped, ``t`` traced; the cgroup freezer shows as ``D`` in
  ``__refrigerator``, and ``/proc/<pid>/wchan`` names it).  One that is still frozen on
  the next look is killed, and the supervisor handles it like a crash: its in-flight
  requests are answered UNAVAILABLE and it is respawned.

Either way the kill is ``Supervisor.kill``: SIGABRT (with SIGCONT, so a stopped process
runs its handler) makes faulthandler write the stuck call's Python stack to the log, and
SIGKILL follows a moment later.
"""

from __future__ import annotations

import logging

from inferpool.broker.pool.handle import WorkerHandle
from inferpool.broker.pool.supervisor import Supervisor

log = logging.getLogger("inferpool.liveness")
FROZEN_STATES = ("T", "t")


def frozen(pid: int) -> bool:
    """Whether the kernel holds process ``pid`` stopped or frozen right now."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        state = stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3].decode()
        if state in FROZEN_STATES:
            return True
        if state == "D":
            with open(f"/proc/{pid}/wchan", "rb") as f:
                wchan = f.read()
            return b"refrigerator" in wchan or b"freezer" in wchan
    except (OSError, ValueError):
        return False  # gone: the reap reports it
    return False


class Liveness:
    """Looks at every live worker each interval; kills the ones frozen on two looks running."""

    def __init__(self, supervisor: Supervisor, heartbeat_ms: int) -> None:
        self.supervisor = supervisor
        self.interval = heartbeat_ms / 1000.0
        self._next = 0.0
        self._frozen: dict[WorkerHandle, float] = {}  # handle -> when first seen frozen

    def check(self, now: float) -> None:
        if self.interval <= 0 or now < self._next:
            return
        self._next = now + self.interval
        seen: dict[WorkerHandle, float] = {}
        for handle in self.supervisor.alive():
            pid = handle.pid
            if pid is None or handle.kill_reason or not frozen(pid):
                continue
            since = self._frozen.get(handle)
            if since is None:
                seen[handle] = now
                continue
            reason = (
                f"was frozen (stopped) for {now - since:.1f}s and was killed; "
                "its requests cannot progress"
            )
            log.error("worker %s (pid %s) %s", handle.name, pid, reason)
            handle.kill(reason)
        self._frozen = seen
