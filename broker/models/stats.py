"""Per-model statistics in the shape of Triton's statistics extension, plus custom metrics."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from inferpool.broker.models.failures import BACKEND, FAILURE_REASONS
from inferpool.wire.errors import Code
from inferpool.wire.worker.protocol import (
    Durations,
    LanePart,
    LaneStats,
    MemoryUsage,
    MetricsUpdate,
    Result,
)


@dataclass(slots=True)
class Duration:
    """A count and the nanoseconds it took."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, n: int = 1) -> None:
        self.count += n
        self.ns += ns

    def to_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


def _timed(ci: Duration, cf: Duration, co: Duration, timing: Durations) -> None:
    """One execution's compute durations, added (in one call: this runs per request and per
    batch)."""
    ci.count += 1
    ci.ns += timing.compute_input
    cf.count += 1
    cf.ns += timing.compute_infer
    co.count += 1
    co.ns += timing.compute_output


@dataclass
class BatchStats:
    """The compute times of the batches of one size."""

    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass
class ResponseStats:
    """One response index of a decoupled model's requests (Triton's InferResponseStatistics)."""

    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    empty_response: Duration = field(default_factory=Duration)
    cancel: Duration = field(default_factory=Duration)

    def to_dict(self) -> dict[str, dict[str, int]]:
        return {f.name: getattr(self, f.name).to_dict() for f in fields(self)}


# how a decoupled model's response ended (the ResponseStats field it counts in)
SUCCESS, FAIL, EMPTY, CANCEL = "success", "fail", "empty_response", "cancel"


def response_outcome(item: Result) -> str:
    """Which of a response statistic's counts a decoupled model's response goes to."""
    if item.error is not None:
        return CANCEL if item.error.get("code") == Code.CANCELLED.value else FAIL
    if item.final and not item.outputs and item.parameters is None:
        return EMPTY  # the final flag alone
    return SUCCESS


@dataclass
class ModelStats:
    """TRITONSERVER model statistics for one model version."""

    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    batches: dict[int, BatchStats] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAILURE_REASONS, 0))
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    responses: dict[int, ResponseStats] = field(default_factory=dict)  # by response index
    lane_success: int = 0  # of success and fail, the requests that came over lanes
    lane_fail: int = 0

    def request_done(
        self,
        success: bool,
        total_ns: int,
        batch_size: int,
        timing: Durations | None,
        reason: str = BACKEND,
    ) -> None:
        """One request finished, with the compute durations its worker measured (or, if it
        failed, the reason: one of FAILURE_REASONS)."""
        self.last_inference_ms = int(time.time() * 1000)
        d = self.success if success else self.fail  # (updated inline: this runs per request)
        d.count += 1
        d.ns += total_ns
        if not success:
            self.failures[reason] += 1
            return
        self.inference_count += batch_size
        if timing:
            _timed(self.compute_input, self.compute_infer, self.compute_output, timing)

    def cache_hit_done(self, total_ns: int, queue_ns: int, lookup_ns: int) -> None:
        """A request answered from the response cache: a success that ran nothing."""
        self.success.add(total_ns)
        self.queue.add(queue_ns)
        self.cache_hit.add(lookup_ns)

    def cache_miss_done(self, miss_ns: int) -> None:
        """A cached model's executed request: its lookup and insertion time (Triton adds it
        to the request's duration, as the insertion happens after the request was counted)."""
        self.success.ns += miss_ns
        self.cache_miss.add(miss_ns)

    def response_done(self, index: int, outcome: str, timing: Durations | None) -> None:
        """Response ``index`` of a decoupled model's request, ending as ``outcome``."""
        stats = self.responses.get(index)
        if stats is None:
            stats = self.responses[index] = ResponseStats()
        infer, output = (timing.compute_infer, timing.compute_output) if timing else (0, 0)
        if outcome != CANCEL:
            stats.compute_infer.add(infer)
        if outcome in (SUCCESS, FAIL) and output:
            stats.compute_output.add(output)
        getattr(stats, outcome).add(infer + output)

    def batch_done(self, batch_size: int, timing: Durations) -> None:
        self.execution_count += 1
        b = self.batches.get(batch_size)
        if b is None:
            b = self.batches[batch_size] = BatchStats()
        _timed(b.compute_input, b.compute_infer, b.compute_output, timing)

    def lanes_done(self, lanes: LaneStats) -> None:
        """Fold what a worker's lanes served (they bypass the broker)."""
        if lanes.success or lanes.fail:
            self.last_inference_ms = int(time.time() * 1000)
        self.lane_success += lanes.success
        self.lane_fail += lanes.fail
        self.success.add(lanes.success_ns, lanes.success)
        self.fail.add(lanes.fail_ns, lanes.fail)
        self.queue.add(lanes.queue_ns, lanes.success)
        self.inference_count += lanes.inferences
        d = lanes.durations
        self.compute_input.add(d.compute_input, lanes.success)
        self.compute_infer.add(d.compute_infer, lanes.success)
        self.compute_output.add(d.compute_output, lanes.success)
        for batch in lanes.batches:
            self.execution_count += batch.executions
            b = self.batches.get(batch.batch_size)
            if b is None:
                b = self.batches[batch.batch_size] = BatchStats()
            b.compute_input.add(batch.durations.compute_input, batch.executions)
            b.compute_infer.add(batch.durations.compute_infer, batch.executions)
            b.compute_output.add(batch.durations.compute_output, batch.executions)

    def steps_done(self, part: LanePart, whole: bool) -> None:
        """What the lane of one of this ensemble's steps served (a client ran the steps over
        lanes, client.lane_ensemble): each step adds its queue and compute times, as the
        broker's runs add their steps'; ``whole``: the step's requests are the ensemble's
        (the last step that makes an output), counted as its requests."""
        count = part.success if whole else 0
        if count:
            self.last_inference_ms = int(time.time() * 1000)
            self.lane_success += count
            self.inference_count += part.inferences
            self.execution_count += count
        self.lane_fail += part.fail
        self.success.add(part.success_ns, count)
        self.fail.add(part.fail_ns, part.fail)
        self.queue.add(part.queue_ns, count)
        d = part.durations
        self.compute_input.add(d.compute_input, count)
        self.compute_infer.add(d.compute_infer, count)
        self.compute_output.add(d.compute_output, count)

    def to_dict(
        self, name: str, version: int, memory: Sequence[MemoryUsage] = ()
    ) -> dict[str, Any]:
        return {
            "name": name,
            "version": str(version),
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.to_dict(),
                "fail": self.fail.to_dict(),
                "queue": self.queue.to_dict(),
                "compute_input": self.compute_input.to_dict(),
                "compute_infer": self.compute_infer.to_dict(),
                "compute_output": self.compute_output.to_dict(),
                "cache_hit": self.cache_hit.to_dict(),
                "cache_miss": self.cache_miss.to_dict(),
            },
            "response_stats": {str(i): r.to_dict() for i, r in sorted(self.responses.items())},
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": b.compute_input.to_dict(),
                    "compute_infer": b.compute_infer.to_dict(),
                    "compute_output": b.compute_output.to_dict(),
                }
                for size, b in sorted(self.batches.items())
            ],
            "memory_usage": [m._asdict() for m in memory],
            "lane_stats": {"success": self.lane_success, "fail": self.lane_fail},
        }


def memory_usage(instances: Iterable[Any]) -> list[MemoryUsage]:
    """What the serving instances (pool handles) reported, summed by memory type and device,
    as Triton's accumulated memory usage of a model."""
    total: dict[tuple[str, int], int] = {}
    for handle in instances:
        if handle.state.value == "READY":
            for usage in handle.memory:
                key = (usage.type, usage.id)
                total[key] = total.get(key, 0) + usage.byte_size
    return [MemoryUsage(kind, device, size) for (kind, device), size in sorted(total.items())]


class CustomMetrics:
    """Metrics that backends declare and update (TRITONSERVER_MetricFamily / Metric)."""

    def __init__(self) -> None:
        self.families: dict[str, dict[str, str]] = {}
        self.values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def apply(self, update: MetricsUpdate) -> None:
        for fam in update.families:
            self.families.setdefault(fam.name, fam._asdict())
        for op in update.ops:
            key = (op.family, tuple(sorted(op.labels.items())))
            if op.op == "inc":
                self.values[key] = self.values.get(key, 0.0) + op.value
            else:
                self.values[key] = op.value

    def to_list(self, model: str | None = None) -> list[dict[str, Any]]:
        out = []
        for (family, labels), value in sorted(self.values.items()):
            label_dict = dict(labels)
            if model is not None and label_dict.get("model", model) != model:
                continue
            kind = self.families.get(family, {}).get("kind", "counter")
            out.append({"family": family, "kind": kind, "labels": label_dict, "value": value})
        return out
