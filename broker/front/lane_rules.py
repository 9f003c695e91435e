"""Which models lanes serve, and what an ``open_lane`` answer says of them.

Lanes serve models without dynamic or sequence batching, decoupled responses or a response
cache, on a server without a rate limiter.  Those batch, stream, cache or gate executions
in the broker, which a lane bypasses; they are refused with UNSUPPORTED, saying why.
"""

from __future__ import annotations

from inferpool.broker.models.ensemble import EnsembleScheduler
from inferpool.broker.models.registry import ModelVersion
from inferpool.wire.ensemble_wiring import Wiring
from inferpool.wire.errors import Code, InferpoolError


def check_rule(mv: ModelVersion, rate_limited: bool) -> None:
    """UNSUPPORTED, saying why, for a model lanes do not serve."""
    cfg = mv.config
    why = ""
    if rate_limited:
        why = "runs on a server whose rate limiter gates every execution (--rate-limit)"
    elif mv.decoupled:
        why = "is decoupled"
    elif cfg.HasField("sequence_batching"):
        why = "uses the sequence batcher"
    elif cfg.HasField("dynamic_batching"):
        why = "uses dynamic batching"
    elif cfg.response_cache.enable:
        why = "caches its responses in the broker (response_cache)"
    elif not mv.instances:
        why = "has no instances of its own"
    if why:
        raise InferpoolError(
            Code.UNSUPPORTED,
            f"model {mv.label} {why}: lanes serve models without dynamic or sequence batching, "
            "decoupled responses or a response cache, on a server without a rate limiter (the "
            "broker batches, streams, caches or gates those requests); use the broker path",
        )


def ensemble_wiring(mv: ModelVersion) -> Wiring | None:
    """The wiring of ``mv`` if it is an ensemble."""
    scheduler = mv.scheduler
    return scheduler.wiring if isinstance(scheduler, EnsembleScheduler) else None
