"""The metrics text: Triton's names as declared (no ``_total``), escaped labels, plain numbers."""

from __future__ import annotations

import math

from inferpool.broker.front.exposition import Family, render
from inferpool.broker.models.failures import FAILURE_REASONS, failure_reason
from inferpool.broker.models.stats import ModelStats
from inferpool.wire.errors import Code, InferpoolError


def test_families_render_as_declared() -> None:
    success = Family(
        "nv_inference_request_success",
        "Number of successful\nrequests",
        "counter",
        ["model", "version"],
    )
    success.add(["a\\b", '"q"'], 3)
    success.add(["m", "1"], 2.5)
    free = Family("inferpool_arena_bytes", "free", "gauge", ["kind"])
    free.add(["free"], math.inf)
    bare = Family("inferpool_inflight_requests", "in flight", "gauge")
    bare.add([], 0)
    assert render([success, free, bare]).decode().splitlines() == [
        "# HELP nv_inference_request_success Number of successful\\nrequests",
        "# TYPE nv_inference_request_success counter",
        'nv_inference_request_success{model="a\\\\b",version="\\"q\\""} 3',
        'nv_inference_request_success{model="m",version="1"} 2.5',
        "# HELP inferpool_arena_bytes free",
        "# TYPE inferpool_arena_bytes gauge",
        'inferpool_arena_bytes{kind="free"} +Inf',
        "# HELP inferpool_inflight_requests in flight",
        "# TYPE inferpool_inflight_requests gauge",
        "inferpool_inflight_requests 0",
    ]


def test_failures_are_counted_by_triton_reason() -> None:
    stats = ModelStats()
    assert stats.failures == dict.fromkeys(FAILURE_REASONS, 0)
    for code in (Code.INVALID_ARG, Code.TIMEOUT, Code.UNAVAILABLE, Code.CANCELLED):
        stats.request_done(False, 10, 1, None, failure_reason(InferpoolError(code, "x")))
    stats.request_done(False, 10, 1, None)  # the backend's error response
    stats.request_done(True, 10, 1, None)
    assert stats.failures == {"REJECTED": 2, "CANCELED": 1, "BACKEND": 1, "OTHER": 1}
    assert stats.fail.count == 5 and stats.success.count == 1
