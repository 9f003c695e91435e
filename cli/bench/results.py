"""What one concurrency level measured: the client's latencies and throughput, and the
server's breakdown of the same window (the statistics API's counters, after minus before),
in the shapes the reports print: a dict for JSON, a row for CSV."""

from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

PERCENTILES = (50, 90, 95, 99)
_STAGES = ("queue", "compute_input", "compute_infer", "compute_output")


@dataclass(frozen=True)
class Server:
    """The statistics API over the window: counts, and average microseconds per request."""

    requests: int  # successful requests the server counted
    failures: int
    inferences: int
    executions: int
    request_us: float
    queue_us: float
    compute_input_us: float
    compute_infer_us: float
    compute_output_us: float

    @property
    def overhead_us(self) -> float:
        """What the server spent on a request beyond its queue and compute: admission,
        copies into shared memory, the way back."""
        stages = self.queue_us + self.compute_input_us + self.compute_infer_us
        return max(0.0, self.request_us - stages - self.compute_output_us)

    @classmethod
    def between(cls, before: dict[str, Any], after: dict[str, Any]) -> Server:
        """The window's numbers from two of the model's ``model_stats`` entries."""

        def delta(stage: str, key: str) -> int:
            a, b = after["inference_stats"][stage], before["inference_stats"][stage]
            return int(a[key]) - int(b[key])

        count = delta("success", "count")

        def avg_us(stage: str) -> float:
            return delta(stage, "ns") / count / 1000 if count else 0.0

        return cls(
            requests=count,
            failures=delta("fail", "count"),
            inferences=int(after["inference_count"]) - int(before["inference_count"]),
            executions=int(after["execution_count"]) - int(before["execution_count"]),
            request_us=avg_us("success"),
            queue_us=avg_us("queue"),
            compute_input_us=avg_us("compute_input"),
            compute_infer_us=avg_us("compute_infer"),
            compute_output_us=avg_us("compute_output"),
        )


@dataclass(frozen=True)
class Level:
    """What one concurrency level measured, client and server side."""

    concurrency: int
    requests: int  # answered without an error
    errors: int
    seconds: float  # from the first request sent to the last answer
    batch_size: int
    latencies_us: tuple[float, ...]  # p50, p90, p95, p99
    avg_us: float
    min_us: float
    max_us: float
    server: Server

    @classmethod
    def measured(
        cls,
        concurrency: int,
        latencies_ns: list[int],
        errors: int,
        seconds: float,
        batch_size: int,
        server: Server,
    ) -> Level:
        lat = np.asarray(latencies_ns, dtype=np.float64) / 1000 if latencies_ns else np.zeros(1)
        return cls(
            concurrency=concurrency,
            requests=len(latencies_ns),
            errors=errors,
            seconds=seconds,
            batch_size=batch_size,
            latencies_us=tuple(float(v) for v in np.percentile(lat, PERCENTILES)),
            avg_us=float(lat.mean()),
            min_us=float(lat.min()),
            max_us=float(lat.max()),
            server=server,
        )

    @property
    def throughput(self) -> float:
        """Requests answered per second."""
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The level as ``--json`` writes it: times to 0.1 usec, the window to 0.1 ms, rates
        to 0.1 per second (what a clock and a Python client measure, no digit more)."""
        out = asdict(self)
        out["seconds"] = round(self.seconds, 4)
        out["latencies_us"] = {
            f"p{p}": round(v, 1) for p, v in zip(PERCENTILES, self.latencies_us, strict=True)
        }
        for key in ("avg_us", "min_us", "max_us"):
            out[key] = round(out[key], 1)
        out["server"]["overhead_us"] = self.server.overhead_us
        for key, value in out["server"].items():
            if key.endswith("_us"):
                out["server"][key] = round(value, 1)
        out["requests_per_second"] = round(self.throughput, 1)
        out["inferences_per_second"] = round(self.throughput * self.batch_size, 1)
        return out


CSV_HEADER = (
    "Concurrency",
    "Inferences/Second",
    "Requests/Second",
    "Client Requests",
    "Client Errors",
    *(f"p{p} latency" for p in PERCENTILES),
    "Avg latency",
    "Server Requests",
    "Server Queue",
    "Server Compute Input",
    "Server Compute Infer",
    "Server Compute Output",
    "Server Overhead",
)


def to_csv(levels: list[Level]) -> str:
    """perf_analyzer's habit: one row per concurrency, latencies in microseconds."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for lv in levels:
        s = lv.server
        writer.writerow(
            [
                lv.concurrency,
                round(lv.throughput * lv.batch_size, 2),
                round(lv.throughput, 2),
                lv.requests,
                lv.errors,
                *(round(v) for v in lv.latencies_us),
                round(lv.avg_us),
                s.requests,
                *(round(getattr(s, f"{stage}_us")) for stage in _STAGES),
                round(s.overhead_us),
            ]
        )
    return out.getvalue()
