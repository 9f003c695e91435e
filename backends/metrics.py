"""Statistics and custom metrics, as TRITONBACKEND_ModelInstanceReportStatistics and
TRITONSERVER_MetricFamily / TRITONSERVER_Metric: what a backend reports, in what shape."""

from __future__ import annotations

from typing import Protocol

from inferpool.backends.messages import Request
from inferpool.wire.errors import invalid_arg


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
    def report_request(
        self,
        request: Request,
        success: bool,
        exec_start: int,
        compute_start: int,
        compute_end: int,
        exec_end: int,
    ) -> None: ...

    def report_batch(
        self,
        batch_size: int,
        exec_start: int,
        compute_start: int,
        compute_end: int,
        exec_end: int,
    ) -> None: ...

    def metric_family(self, name: str, description: str, kind: str) -> MetricFamily: ...
