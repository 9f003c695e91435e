"""The node's load, for autoscalers: queue depth, requests in flight, instance utilisation.

An orchestrator scales out on these (a HorizontalPodAutoscaler through a metrics adapter,
KEDA, a Ray Serve autoscaling policy): per model version, ``nv_inference_pending_request_count``
(Triton's name: admitted requests not yet dispatched to an instance) and
``inferpool_model_inflight_requests`` (admitted and not yet answered); per instance,
``inferpool_instance_busy_seconds`` (a counter of time spent executing batches: its rate is the
utilisation) and ``inferpool_instance_utilization``, the busy fraction over the last
``WINDOW_S`` seconds for consumers that read one gauge rather than a rate.

The window comes from samples of the busy counters that the broker's loop takes at most once
per ``SAMPLE_S`` (:meth:`Utilisation.sample`); scrapes only read them, so any number of
scrapers at any cadence see the same figure.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Mapping
from typing import Any

from inferpool.broker.front.cache_metrics import MetricRows, Samples
from inferpool.broker.models.registry import Registry
from inferpool.broker.models.request import PendingRequest
from inferpool.broker.pool.supervisor import Supervisor

WINDOW_S = 10.0
SAMPLE_S = 1.0
_MODEL = ("model", "version")
_INSTANCE = ("model", "version", "instance")


class Utilisation:
    """Samples of every instance's busy seconds, kept for the last ``WINDOW_S``."""

    def __init__(self, supervisor: Supervisor[Any]) -> None:
        self.supervisor = supervisor
        self._samples: deque[tuple[float, dict[int, float]]] = deque()

    def sample(self, now: float) -> None:
        """In the broker's loop (housekeeping): record the counters, at most once a second."""
        samples = self._samples
        if samples and now - samples[-1][0] < SAMPLE_S:
            return
        samples.append((now, self._busy(now)))
        while len(samples) > 1 and now - samples[1][0] >= WINDOW_S:
            samples.popleft()  # the oldest kept is the last at or before the window's start

    def fractions(self, now: float) -> dict[int, float]:
        """Each instance slot's busy fraction since the oldest sample (0.0 - 1.0)."""
        busy = self._busy(now)
        if not self._samples:
            return {slot: 0.0 for slot in busy}
        since, before = self._samples[0]
        elapsed = now - since
        if elapsed <= 0:
            return {slot: 0.0 for slot in busy}
        return {
            slot: min(1.0, max(0.0, (value - before.get(slot, 0.0)) / elapsed))
            for slot, value in busy.items()
        }

    def _busy(self, now: float) -> dict[int, float]:
        return {slot: h.busy_seconds(now) for slot, h in self.supervisor.handles.items()}


def load_metrics(
    requests: Mapping[int, PendingRequest],
    registry: Registry,
    supervisor: Supervisor[Any],
    utilisation: Utilisation,
) -> list[MetricRows]:
    """The families above, from the requests in flight and the pool's instances."""
    pending: Counter[tuple[str, str]] = Counter()
    inflight: Counter[tuple[str, str]] = Counter()
    for req in requests.values():
        key = (req.model.name, req.model.version_str)
        inflight[key] += 1
        if req.worker is None:
            pending[key] += 1
    versions = [(mv.name, mv.version_str) for mv in registry.all_versions()]
    now = time.monotonic()
    fractions = utilisation.fractions(now)
    busy: Samples = []
    used: Samples = []
    for slot, h in supervisor.handles.items():
        labels = [h.model.name, h.model.version_str, h.name]
        busy.append((labels, h.busy_seconds(now)))
        used.append((labels, fractions.get(slot, 0.0)))
    return [
        (
            "nv_inference_pending_request_count",
            "Instantaneous number of pending requests awaiting execution per-model.",
            "gauge",
            _MODEL,
            [([*key], float(pending[key])) for key in versions],
        ),
        (
            "inferpool_model_inflight_requests",
            "Requests of the model admitted and not yet answered (queued or executing)",
            "gauge",
            _MODEL,
            [([*key], float(inflight[key])) for key in versions],
        ),
        (
            "inferpool_instance_busy_seconds",
            "Seconds the instance spent executing batches (its rate is the utilisation)",
            "counter",
            _INSTANCE,
            busy,
        ),
        (
            "inferpool_instance_utilization",
            f"Fraction of the last {WINDOW_S:g} s the instance spent executing (0.0 - 1.0)",
            "gauge",
            _INSTANCE,
            used,
        ),
    ]
