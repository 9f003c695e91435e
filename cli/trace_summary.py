"""``inferpool trace FILE...``: a trace file summarised, stage by stage.

Reads trace files in Triton's format (the server's ``--trace-config triton,file=`` and its
indexed files; Triton's own read the same way), groups each trace's records by its id, and
prints per model and frontend how long requests spent in each stage: receiving, reaching
the broker, queued, the compute stages (input, infer, output), answering and sending, with
the mean, p50 and p99 in microseconds.  ``--plot PATH`` draws the same as a picture: the
mean of each stage as one stacked bar per model, and each model's total latencies.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferpool.usage import UsageError

# (stage, from timestamp, to timestamp); the frontends' stages only where it has them
STAGES = (
    ("receive", "HTTP_RECV_START", "HTTP_RECV_END"),
    ("to broker", "{recv_end}", "REQUEST_START"),
    ("admit", "REQUEST_START", "QUEUE_START"),
    ("queue", "QUEUE_START", "COMPUTE_START"),
    ("compute input", "COMPUTE_START", "COMPUTE_INPUT_END"),
    ("compute infer", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START"),
    ("compute output", "COMPUTE_OUTPUT_START", "COMPUTE_END"),
    ("answer", "COMPUTE_END", "REQUEST_END"),
    ("to frontend", "REQUEST_END", "{send_start}"),
    ("send", "{send_start}", "{send_end}"),
)
FRONTENDS = {
    "HTTP": {
        "recv_end": "HTTP_RECV_END",
        "send_start": "HTTP_SEND_START",
        "send_end": "HTTP_SEND_END",
    },
    "GRPC": {
        "recv_end": "GRPC_WAITREAD_END",
        "send_start": "GRPC_SEND_START",
        "send_end": "GRPC_SEND_END",
    },
}


@dataclass
class Trace:
    """One trace's records, gathered by its id."""

    id: int
    model: str = "?"
    version: Any = "?"
    parent: int = 0
    stamps: dict[str, int] = field(default_factory=dict)

    @property
    def frontend(self) -> str:
        """HTTP, GRPC, or "" (a zmq client's request, or a child of another trace)."""
        for kind, names in FRONTENDS.items():
            if names["recv_end"] in self.stamps:
                return kind
        return ""

    def stages(self) -> dict[str, int]:
        """Each stage's ns, for the stages whose two timestamps the trace has."""
        names = FRONTENDS.get(self.frontend, {})
        out = {}
        for stage, start, end in STAGES:
            start, end = start.format_map(_Missing(names)), end.format_map(_Missing(names))
            if start in self.stamps and end in self.stamps:
                out[stage] = self.stamps[end] - self.stamps[start]
        if self.stamps:
            out["total"] = max(self.stamps.values()) - min(self.stamps.values())
        return out


class _Missing(dict[str, str]):
    """Format names a trace's frontend lacks as a name no trace has."""

    def __missing__(self, key: str) -> str:
        return "-"


def add_trace(sub: Any) -> None:
    """The ``trace`` subcommand."""
    p = sub.add_parser(
        "trace",
        help="summarise a trace file (Triton's format) stage by stage; --plot draws it",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="trace files (JSON arrays)")
    p.add_argument("--plot", metavar="PATH", help="draw the stages per model (PNG)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead")
    p.set_defaults(func=cmd_trace)


def cmd_trace(args: argparse.Namespace) -> int:
    """Print (and draw) the summary of the trace files."""
    if args.plot:  # a missing matplotlib is said before the files are read
        from inferpool.bench.plot import pyplot

        pyplot()
    traces = read(args.files)
    summary = summarise(traces)
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print_summary(summary, len(traces))
    if args.plot:
        plot(summary, args.plot)
        print(f"wrote {args.plot}")
    return 0


def read(paths: Sequence[str]) -> list[Trace]:
    """The traces of the files, their records gathered by id (ids are per file)."""
    traces: list[Trace] = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            try:
                records = json.load(f)
            except json.JSONDecodeError as exc:
                raise UsageError(f"{path} is not a trace file: {exc}") from None
        if not isinstance(records, list):
            raise UsageError(f"{path} is not a trace file: expected a JSON array of records")
        traces += gather(records)
    if not traces:
        raise UsageError(f"no traces in {', '.join(paths)}")
    return traces


def gather(records: Iterable[Any]) -> list[Trace]:
    """Records grouped into traces (a record without an id is not a trace's)."""
    by_id: dict[int, Trace] = {}
    for record in records:
        if not isinstance(record, dict) or not isinstance(record.get("id"), int):
            continue
        trace = by_id.setdefault(record["id"], Trace(record["id"]))
        if "model_name" in record:
            trace.model = str(record["model_name"])
            trace.version = record.get("model_version", "?")
            trace.parent = int(record.get("parent_id", 0) or 0)
        for stamp in record.get("timestamps", ()):
            if isinstance(stamp, dict) and isinstance(stamp.get("ns"), int):
                trace.stamps[str(stamp.get("name"))] = stamp["ns"]
    return list(by_id.values())


def summarise(traces: Sequence[Trace]) -> list[dict[str, Any]]:
    """Per model, version and frontend: how many traces, and each stage's mean, p50, p99."""
    groups: dict[tuple[str, str, str], list[dict[str, int]]] = {}
    for trace in traces:
        key = (trace.model, str(trace.version), trace.frontend or ("child" if trace.parent else ""))
        groups.setdefault(key, []).append(trace.stages())
    out = []
    for (model, version, frontend), rows in sorted(groups.items()):
        stages = {}
        for stage in [s for s, _, _ in STAGES] + ["total"]:
            values = np.array([r[stage] for r in rows if stage in r], dtype=np.float64) / 1e3
            if values.size:
                stages[stage] = {
                    "count": int(values.size),
                    "mean_us": float(values.mean()),
                    "p50_us": float(np.percentile(values, 50)),
                    "p99_us": float(np.percentile(values, 99)),
                }
        out.append(
            {
                "model": model,
                "version": version,
                "frontend": frontend or "zmq",
                "traces": len(rows),
                "stages": stages,
            }
        )
    return out


def print_summary(summary: list[dict[str, Any]], traces: int) -> None:
    """The summary as a table per group."""
    print(f"{traces} traces")
    for group in summary:
        print(
            f"\n{group['model']} (version {group['version']}), {group['frontend']}: "
            f"{group['traces']} traces"
        )
        print(f"  {'stage':<15} {'count':>6} {'mean us':>10} {'p50 us':>10} {'p99 us':>10}")
        for stage, s in group["stages"].items():
            print(
                f"  {stage:<15} {s['count']:>6} {s['mean_us']:>10.1f} {s['p50_us']:>10.1f} "
                f"{s['p99_us']:>10.1f}"
            )


def plot(summary: list[dict[str, Any]], path: str) -> None:
    """Each group's mean stages as a stacked bar, and its totals' p50 and p99."""
    from inferpool.bench.plot import pyplot, save

    plt = pyplot()
    labels = [f"{g['model']} ({g['frontend']})" for g in summary]
    height = max(3.0, 0.6 * len(summary) + 1.5)
    fig, (stages, totals) = plt.subplots(
        1, 2, figsize=(13, height), constrained_layout=True, width_ratios=[3, 1]
    )
    left = np.zeros(len(summary))
    for stage, _, _ in STAGES:
        means = np.array([g["stages"].get(stage, {}).get("mean_us", 0.0) for g in summary])
        means = np.maximum(means, 0.0)  # (clocks of two processes may cross by a little)
        if means.any():
            stages.barh(labels, means, left=left, label=stage)
            left += means
    stages.set(xlabel="mean time (us)", title="where a request's time goes, stage by stage")
    stages.invert_yaxis()
    stages.legend(fontsize="small", ncols=2)
    for i, name in enumerate(("p50_us", "p99_us")):
        values = [g["stages"].get("total", {}).get(name, 0.0) for g in summary]
        offsets = np.arange(len(summary)) + (i - 0.5) * 0.4
        totals.barh(offsets, values, height=0.4, label=name.removesuffix("_us"))
    totals.set_yticks(np.arange(len(summary)), labels)
    totals.set(xlabel="end to end (us)", title="total")
    totals.invert_yaxis()
    totals.legend(fontsize="small")
    for axes in (stages, totals):
        axes.grid(axis="x", alpha=0.3)
    save(plt, fig, path)
