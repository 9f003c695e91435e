"""The broker's answer to "may I send requests?", with the reason when it is no.

Probes and routers act on it (``/readyz``, ``/v2/health/ready``, ``health_ready``): a node
that is still loading, that drains, or that has a model it should serve with no live
instance is not ready, so an orchestrator sends its traffic elsewhere.  The broker marks it
started once the initial models settled; the drain (``broker.drain``) sets ``draining`` and,
once it stops admissions, clears ``admitting``.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferpool.broker.models.registry import ModelVersion, Registry, State
from inferpool.broker.pool.handle import WorkerState


@dataclass
class Readiness:
    """Whether the node is ready: started, not draining, and (strict) every model ready."""

    registry: Registry
    strict: bool  # ready only while every model is (--strict-readiness)
    started: bool = False
    draining: str = ""  # why the node drains ("received SIGTERM"); empty while it serves
    admitting: bool = True  # new requests are admitted (false once a drain stops them)

    def ready(self) -> bool:
        return not self.why_not()

    def why_not(self) -> str:
        """Empty when ready; otherwise what keeps the node from serving, for the operator."""
        if self.draining:
            return f"draining ({self.draining})"
        if not self.started:
            rows = self.registry.index()
            loading = [f"'{r['name']}'" for r in rows if r["state"] == State.LOADING.value]
            return f"loading {', '.join(loading)}" if loading else "starting"
        if self.strict:  # the index's rows name a model that is not loaded as well
            for r in self.registry.index():
                if r["state"] != State.READY.value:
                    version = f" version {r['version']}" if r["version"] else ""
                    why = f": {r['reason']}" if r["reason"] else ""
                    return f"model '{r['name']}'{version} is {r['state'] or 'not loaded'}{why}"
        for mv in self.registry.all_versions():
            if mv.state is State.READY and not _live(mv):
                states = ", ".join(f"{h.name} {h.state.value}" for h in mv.instances)
                return f"model {mv.label} has no live instance ({states})"
        return ""


def _live(mv: ModelVersion) -> bool:
    """Whether an instance that takes requests is up (a model of passive instances only
    counts those).  An ensemble has none: it is READY only while its composing models are."""
    if not mv.instances:
        return True
    serving = [h for h in mv.instances if not h.passive] or mv.instances
    return any(h.state is WorkerState.READY for h in serving)
