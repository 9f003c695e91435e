"""Why a request failed, as Triton labels ``nv_inference_request_failure`` (its ``reason``),
and the log line a failed request leaves at ``--log-verbose``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from inferpool.wire.errors import Code, InferpoolError

if TYPE_CHECKING:
    from inferpool.broker.models.registry import ModelVersion

log = logging.getLogger("inferpool.requests")

# Why a request failed, as Triton labels nv_inference_request_failure: refused for want of
# room or time (a full queue or arena, a queue timeout, a server stopping), cancelled, failed
# by its backend (an error response, a dead instance), or anything else (a request that does
# not fit the model).
REJECTED, CANCELED, BACKEND, OTHER = "REJECTED", "CANCELED", "BACKEND", "OTHER"
FAILURE_REASONS = (REJECTED, CANCELED, BACKEND, OTHER)
_BY_CODE = {Code.CANCELLED: CANCELED, Code.TIMEOUT: REJECTED, Code.UNAVAILABLE: REJECTED}


def failure_reason(err: InferpoolError) -> str:
    """The label of a request that ended with ``err`` before its backend answered it."""
    return _BY_CODE.get(err.code, OTHER)


def log_failure(request_id: Any, mv: ModelVersion, reason: str, err: InferpoolError) -> None:
    """A failed request, logged at DEBUG with its id and model (JSON log fields)."""
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "request %s for model %s failed (%s): %s",
            request_id,
            mv.label,
            reason,
            err,
            extra={"request_id": request_id, "model": mv.name, "version": mv.version_str},
        )
