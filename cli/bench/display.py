"""What a person watches: a progress bar per phase while the benchmark runs (on stderr), then
the client's table (latency percentiles, throughput) and the server's (perf_analyzer's
"Server:" lines: queue and compute stages of the same window), on stdout."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from inferpool.bench.results import PERCENTILES, Level
from inferpool.broker.pool.topology import format_cpu_list

WIDTH = 132  # of the tables when the output is not a terminal (a file, a pipe)


class Display:
    """The runner's Progress: one bar per phase (warm-up, measure) of each level."""

    def __init__(self, quiet: bool = False) -> None:
        self.console = Console(stderr=True, quiet=quiet)
        self._bars = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[answered]:>8} answered"),
            TextColumn("{task.fields[rate]:>9.1f} req/s"),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        )
        self._task: TaskID | None = None
        self._by_requests = False
        self._total = 0.0

    def __enter__(self) -> Display:
        self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bars.stop()

    def phase(self, concurrency: int, what: str, total: float, unit: str) -> None:
        if self._task is not None:
            self._bars.remove_task(self._task)
        self._by_requests = unit == "requests"
        self._total = total
        self._task = self._bars.add_task(
            f"concurrency {concurrency:>4}  {what:<8}", total=total, answered=0, rate=0.0
        )

    def advance(self, answered: int, elapsed: float) -> None:
        if self._task is None:
            return
        done = answered if self._by_requests else min(elapsed, self._total)
        rate = answered / elapsed if elapsed > 0 else 0.0
        self._bars.update(self._task, completed=done, answered=answered, rate=rate)

    def level_done(self, level: Level) -> None:
        p50, _, _, p99 = level.latencies_us
        errors = f", {level.errors} errors" if level.errors else ""
        self.console.print(
            f"concurrency {level.concurrency}: {level.requests} requests{errors}, "
            f"{level.throughput:,.1f} req/s, p50 {p50:,.0f} us, p99 {p99:,.0f} us"
        )


def print_tables(levels: list[Level], about: dict[str, Any]) -> None:
    """The client's table and the server's, for a person to read."""
    console = Console(width=None if sys.stdout.isatty() else WIDTH)
    client = Table(
        title=f"{about['model']} over {about['transport']}: client side (latency in usec)",
        title_justify="left",
    )
    for name in (
        "Concurrency",
        "Requests",
        "Errors",
        "Req/s",
        "Infer/s",
        *(f"p{p}" for p in PERCENTILES),
        "Avg",
    ):
        client.add_column(name, justify="right")
    for lv in levels:
        client.add_row(
            str(lv.concurrency),
            str(lv.requests),
            str(lv.errors),
            f"{lv.throughput:,.1f}",
            f"{lv.throughput * lv.batch_size:,.1f}",
            *(f"{v:,.0f}" for v in lv.latencies_us),
            f"{lv.avg_us:,.0f}",
        )
    server = Table(
        title="server side, same window (statistics API; average usec per request)",
        title_justify="left",
    )
    for name in (
        "Concurrency",
        "Requests",
        "Inferences",
        "Executions",
        "Request",
        "Queue",
        "Compute input",
        "Compute infer",
        "Compute output",
        "Overhead",
    ):
        server.add_column(name, justify="right")
    for lv in levels:
        s = lv.server
        server.add_row(
            str(lv.concurrency),
            str(s.requests),
            str(s.inferences),
            str(s.executions),
            *(
                f"{v:,.0f}"
                for v in (
                    s.request_us,
                    s.queue_us,
                    s.compute_input_us,
                    s.compute_infer_us,
                    s.compute_output_us,
                    s.overhead_us,
                )
            ),
        )
    console.print(client)
    console.print(server)
    lane = about.get("lane")
    if lane:
        console.print(lane_line(lane))


def lane_line(lane: dict[str, Any]) -> str:
    """How a lane's waits went and where its ends ran, in one line."""
    return (
        f"lane: waits {lane['waits']} ({lane['spun']} answered spinning, {lane['slept']} "
        f"asleep); client on core {lane['client_core']} (may run on "
        f"{format_cpu_list(lane['client_cores'])}), worker on "
        f"{format_cpu_list(lane['worker_cores'])}"
    )
