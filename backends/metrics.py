"""Statistics and custom metrics, as TRITONBACKEND_ModelInstanceReportStatistics and
TRITONSERVER_MetricFamily / TRITONSERVER_Metric: what a backend reports, in what shape, and
the collector that holds it until the worker sends it to the broker."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from inferpool.backends.request_io import Request
from inferpool.wire.errors import invalid_arg
from inferpool.wire.worker.protocol import (
    Durations,
    MemoryUsage,
    MetricFamilyInfo,
    MetricOp,
    MetricsUpdate,
)

MEMORY_TYPES = ("CPU", "CPU_PINNED", "GPU")  # TRITONSERVER_MemoryTypeString
# NamedTuples reported per request are built by tuple.__new__, which skips their Python-level
# __new__ (a third of the cost, on every request's path)
_make = tuple.__new__


class Timestamps(NamedTuple):
    """The instants of one execution that Triton's statistics are reported in (monotonic ns)."""

    exec_start: int
    compute_start: int  # inputs are ready
    compute_end: int  # outputs are computed
    exec_end: int

    def durations(self) -> Durations:
        """Compute input, infer and output time, as the broker's statistics count them."""
        exec_start, compute_start, compute_end, exec_end = self
        return _make(
            Durations,
            (compute_start - exec_start, compute_end - compute_start, exec_end - compute_end),
        )


class RequestTiming(NamedTuple):
    """One request's outcome and timestamps, as its backend reported them."""

    success: bool
    stamps: Timestamps


class Metric:
    """A custom metric (counter or gauge) with fixed labels, as TRITONSERVER_Metric."""

    def __init__(self, family: str, kind: str, labels: dict[str, str], sink: MetricSink) -> None:
        self.family = family
        self.kind = kind
        self.labels = labels
        self.key = (family, tuple(sorted(labels.items())))
        self._sink = sink

    def increment(self, value: float = 1.0) -> None:
        if self.kind == "counter" and value < 0:
            raise invalid_arg(f"counter '{self.family}' cannot decrease")
        self._sink.record(self, "inc", value)

    def set(self, value: float) -> None:
        if self.kind != "gauge":
            raise invalid_arg(f"metric '{self.family}' is a counter; only gauges can be set")
        self._sink.record(self, "set", value)


class MetricSink(Protocol):
    """Where a custom metric's changes go (the worker sends them to the broker)."""

    def record(self, metric: Metric, op: str, value: float) -> None: ...


class MetricFamily:
    """TRITONSERVER_MetricFamily: a named counter or gauge with per-label-set metrics."""

    def __init__(self, name: str, description: str, kind: str, sink: MetricSink) -> None:
        if kind not in ("counter", "gauge"):
            raise invalid_arg(f"metric kind must be 'counter' or 'gauge', got {kind!r}")
        self.name = name
        self.description = description
        self.kind = kind
        self._sink = sink

    def metric(self, **labels: str) -> Metric:
        return Metric(self.name, self.kind, {k: str(v) for k, v in labels.items()}, self._sink)


class StatisticsReporter(Protocol):
    """Where ``ModelInstance.report_statistics`` and ``report_batch_statistics`` go."""

    def report_request(self, request: Request, success: bool, stamps: Timestamps) -> None: ...

    def report_batch(self, batch_size: int, stamps: Timestamps) -> None: ...

    def report_alone(
        self, request: Request, success: bool, batch_size: int, stamps: Timestamps
    ) -> None:
        """``report_request`` and ``report_batch`` of a batch of one request, in one call."""
        ...

    def report_memory_usage(self, memory_type: str, device_id: int, byte_size: int) -> None: ...

    def metric_family(self, name: str, description: str, kind: str) -> MetricFamily: ...


class StatsCollector:
    """Collects what backends report (statistics, custom metrics) until the worker sends it.

    Backend threads may update metrics while the worker drains them, hence the lock.
    """

    def __init__(self) -> None:
        self.timings: dict[int, RequestTiming] = {}  # keyed by id(request)
        # (batch size, Timestamps) of each batch reported: made BatchStats when taken
        self.batches: list[tuple[int, Timestamps]] = []
        self._families: list[MetricFamilyInfo] = []
        # Metric.key -> [metric, op, value]: folded in place until drained
        self._ops: dict[tuple[str, tuple[tuple[str, str], ...]], list[Any]] = {}
        self._memory: dict[tuple[str, int], int] = {}  # (memory type, device id) -> bytes
        self._lock = threading.Lock()
        # called once a request's times are reported: an ensemble's lane wakes the next
        # step then, not before (its wake-up must not count in this step's time)
        self.timed: Callable[[], None] | None = None

    # StatisticsReporter
    def report_request(self, request: Request, success: bool, stamps: Timestamps) -> None:
        self.timings[id(request)] = _make(RequestTiming, (success, stamps))
        if self.timed is not None:
            self.timed()

    def report_batch(self, batch_size: int, stamps: Timestamps) -> None:
        self.batches.append((batch_size, stamps))

    def report_alone(
        self, request: Request, success: bool, batch_size: int, stamps: Timestamps
    ) -> None:
        self.timings[id(request)] = _make(RequestTiming, (success, stamps))
        self.batches.append((batch_size, stamps))
        if self.timed is not None:
            self.timed()

    def report_memory_usage(self, memory_type: str, device_id: int, byte_size: int) -> None:
        """The instance holds ``byte_size`` bytes of this memory (replaces an earlier report)."""
        if memory_type not in MEMORY_TYPES:
            raise invalid_arg(
                f"memory type must be one of {', '.join(MEMORY_TYPES)}, got {memory_type!r}"
            )
        if byte_size < 0:
            raise invalid_arg(f"memory usage cannot be negative, got {byte_size}")
        self._memory[(memory_type, int(device_id))] = int(byte_size)

    def memory_usage(self) -> list[MemoryUsage]:
        return [MemoryUsage(kind, device, size) for (kind, device), size in self._memory.items()]

    def metric_family(self, name: str, description: str, kind: str) -> MetricFamily:
        family = MetricFamily(name, description, kind, self)
        with self._lock:
            self._families.append(MetricFamilyInfo(name, description, kind))
        return family

    # MetricSink
    def record(self, metric: Metric, op: str, value: float) -> None:
        """Updates are folded per metric until sent: one entry per metric per batch (an
        increment adds to the entry's value, whatever its op; a set replaces it)."""
        with self._lock:
            entry = self._ops.get(metric.key)
            if entry is not None and op == "inc":
                entry[2] += value
            else:
                self._ops[metric.key] = [metric, op, value]

    def drain_metrics(self) -> MetricsUpdate | None:
        """The metric updates since the last drain, or None if there were none."""
        with self._lock:
            if not self._families and not self._ops:
                return None
            ops = []  # a loop, not a comprehension: this runs once per batch
            for m, op, v in self._ops.values():
                ops.append(_make(MetricOp, (m.family, m.labels, op, v)))
            update = _make(MetricsUpdate, (self._families, ops))
            self._families, self._ops = [], {}
            return update
