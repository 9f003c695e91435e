"""Real models served and measured: a ResNet-50-shaped CNN and a BERT-base-shaped encoder.

    python scripts/bench_models.py [--quick] [--models resnet,bert] [--backends onnxruntime,...]
                                   [--instance-cores 1] [--preferred N|best] [--seconds S]

Both models are built from torch.nn with random weights (``real_models``; ``--quick`` narrows
them, same layouts and input shapes), exported to ONNX (the onnxruntime and openvino
backends) and TorchScript (pytorch).  Each (model, backend) gets one server (``served_runs``)
with ``plain`` (no batching) and ``batched`` (``dynamic_batching``, ``max_batch_size`` 32,
``--preferred`` its preferred_batch_size: a size, or ``best``, the size up to 16 the floor
runs with the least CPU per row, timed before the server starts).  The model's instances run on
``--instance-cores`` (default: the last core), the broker and this process's clients on the
other cores.  The
floor (``runtime_floor``) is the runtime called in-process by one Python thread, pinned to
the instance's cores with the instance's thread count, timed between the served runs.

Rows: batch 1 through ``Client``, ``ShmClient`` and a lane, in rounds alternating with the
floor at batch 1; 8 and 32 concurrent clients (``Client`` threads, and ``ShmClient`` threads
with batching), each over a window after a warm-up (with batching at 32, a window of at least
10 batches of 32 as the floor runs them); the floor at each batch size of a ladder (1 to 32)
before the 32-client rows with batching, and again after them with the sizes they formed.
Beside each served row: the server's statistics over the window (queue, compute input /
infer / output per request, the batches formed), the share of the window the instance
computed ("instance busy") and the CPU time each side spent per request (the clients, the
broker, the processes pinned to the instance's cores).  Beside each floor row: the share of
its core the floor's process got while it ran, and its CPU time per row.  Printed last, with
the load average:

* batch 1 through a lane: p50 against the floor's in the same rounds (goal: within 1.1x), and
  the worker's CPU per request against the runtime's per call;
* 32 clients with dynamic batching: requests/s against the floor's best rows/s at its best
  batch size (goal: at least 0.9x), with p99, as a product: what the batch sizes formed cost
  (the floor at that mix against its best) x the share of the window the instance computed /
  how long its computing took against the floor's for the same batches.  "Load aside": the
  floor's least CPU per row against the instance's CPU per request, times that share: what
  the ratio comes to where no other job takes the cores (the wall-clock ratio on a shared
  machine compares how much of a core each side got when it ran).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from real_models import ModelSpec, export, spec
from runtime_floor import Floor
from served_runs import MAX_BATCH, Server, Window, check_choices, cpus_text, pct, served

LADDER = (1, 2, 4, 8, 16, 32)
BEST = -1  # --preferred best
HEADER = (
    "| model | backend | path | clients | p50 ms | p99 ms | req/s | queue / input / infer / "
    "output ms per request | batches formed (size x count) | instance busy | CPU ms per "
    "request: clients / broker / instance |\n|---|---|---|---|---|---|---|---|---|---|---|"
)


# ----------------------------------------------------------------------------- the table
def formed_text(formed: dict[int, int]) -> str:
    top = sorted(formed.items(), key=lambda kv: (-kv[0] * kv[1], kv[0]))[:4]
    more = " ..." if len(formed) > 4 else ""
    return ", ".join(f"{size}x{count}" for size, count in top) + more


class Bench:
    """One (model, backend): its floor, its server, its rows and its ratios."""

    def __init__(self, model: ModelSpec, backend: str, paths: tuple[Path, Path],
                 args: argparse.Namespace, cores: list[int], client_cores: list[int],
                 stack: contextlib.ExitStack) -> None:  # fmt: skip
        source = paths[1] if backend == "pytorch" else paths[0]
        self.model, self.backend, self.args = model, backend, args
        self.floor = Floor(backend, source, model.input, cores)
        stack.callback(self.floor.close)
        self.floors: dict[int, list[tuple[float, float]]] = {}
        self.preferred = args.preferred
        if args.preferred == BEST:  # the ladder first: the size the floor runs cheapest
            self.ladder(LADDER)
            self.preferred = self.thriftiest()
        self.server = Server(model, backend, source, cores, client_cores, self.preferred, stack)
        self.rows: list[str] = []
        self.ratios: list[str] = []

    def row(self, path: str, clients: int, w: Window) -> None:
        lat = w.latencies
        self.rows.append(
            f"| {self.model.name} | {self.backend} | {path} | {clients} | {pct(lat, 50):.1f} | "
            f"{pct(lat, 99):.1f} | {w.rate:.1f} | {w.stats} | {formed_text(w.formed)} | "
            f"{w.busy:.0%} | {w.cpu} |"
        )

    def time_floor(self, size: int, seconds: float) -> list[float]:
        calls = self.floor.time(size, seconds)
        self.floors.setdefault(size, []).extend(calls)
        return [wall for wall, _ in calls]

    def ladder(self, sizes: Iterable[int]) -> None:
        for size in sorted(sizes):
            self.time_floor(size, self.args.seconds / 6)

    def per_call(self, size: int, which: int = 0) -> float:
        """The floor's median latency (``which`` 0) or CPU time (1) of a call, ms."""
        return pct([call[which] for call in self.floors[size]], 50)

    def best(self) -> tuple[int, float]:
        """The floor's best batch size and its rows/s."""
        return max(((s, s * 1e3 / self.per_call(s)) for s in self.floors), key=lambda b: b[1])

    def thriftiest(self) -> int:
        """The batch size of least CPU per row on the floor (CPU time, not the wall clock:
        other jobs move the wall clock); within 3% of it, the largest size up to half the
        clients. A larger size spreads the server's costs per batch over more rows, but a
        batch of all the clients leaves the instance idle while its answers go out and the
        next requests come in; with half, one batch gathers while the other computes."""
        per_row = {s: self.per_call(s, 1) / s for s in self.floors if s <= MAX_BATCH // 2}
        least = min(per_row.values())
        return max(s for s, cost in per_row.items() if cost <= least * 1.03)

    def batch_one(self) -> None:
        """Client, ShmClient and a lane at batch 1, in rounds with the floor at batch 1."""
        x, secs = self.model.input.make(1), self.args.seconds / 3
        kinds = ["floor", "Client", "ShmClient", "lane"]
        got: dict[str, list[Window]] = {k: [] for k in kinds[1:]}
        floor: list[float] = []
        lane_ratios = []
        for r in range(self.args.rounds):
            floor_p50 = lane_p50 = 0.0
            for kind in kinds[r % 4 :] + kinds[: r % 4]:  # the order turns each round
                if kind == "floor":
                    floor += (samples := self.time_floor(1, secs))
                    floor_p50 = pct(samples, 50)
                    continue
                w = served(self.server, "plain", kind, 1, x, secs / 4, secs)
                got[kind].append(w)
                lane_p50 = pct(w.latencies, 50) if kind == "lane" else lane_p50
            lane_ratios.append(lane_p50 / floor_p50)
        for kind, windows in got.items():
            self.row(f"{kind}, no batching", 1, _pooled(windows))
        lanes = _pooled(got["lane"])
        lane = pct(lanes.latencies, 50)
        rounds = ", ".join(f"{r:.2f}" for r in lane_ratios)
        worker = lanes.instance_cpu * 1e3 / len(lanes.latencies)
        runtime = self.per_call(1, 1)
        self.ratios.append(
            f"{self.model.name}/{self.backend}: lane p50 {lane:.2f} ms = "
            f"{lane / pct(floor, 50):.2f}x the runtime's {pct(floor, 50):.2f} ms at batch 1 "
            f"(rounds: {rounds}; goal <= 1.1x); CPU per request: the worker {worker:.2f} ms, "
            f"the runtime {runtime:.2f} ms per call ({worker / runtime:.2f}x)"
        )

    def concurrent(self) -> None:
        """8 and 32 clients, without and with batching; the floor's ladder before and after
        the 32-client rows with batching, and at the batch sizes they formed."""
        x, secs, warm = self.model.input.make(1), self.args.seconds, self.args.seconds / 3
        for clients in (8, 32):
            self.row("Client, no batching", clients, served(
                self.server, "plain", "Client", clients, x, warm, secs))  # fmt: skip
        for kind in ("Client", "ShmClient"):
            w = served(self.server, "batched", kind, 8, x, warm, secs)
            self.row(f"{kind}, dynamic batching", 8, w)
        self.ladder(LADDER)
        # at least 10 batches of the largest size in the window: a rate counted over a few
        # batches is off by the one that ends just inside or just outside it
        secs = max(secs, 10 * self.per_call(MAX_BATCH) / 1e3)
        batched: dict[str, Window] = {}
        for kind in ("Client", "ShmClient"):
            batched[kind] = served(self.server, "batched", kind, MAX_BATCH, x, warm, secs)
            self.row(f"{kind}, dynamic batching", MAX_BATCH, batched[kind])
        self.ladder(set(LADDER) | {s for w in batched.values() for s in _main_sizes(w.formed)})
        for kind, w in batched.items():
            self.goal(kind, w)

    def goal(self, kind: str, w: Window) -> None:
        """The 32-client ratio, as the product of what the batch sizes formed cost, the
        share of the window the instance computed, and how long its computing took."""
        sizes = sorted(self.floors)
        size, rate = self.best()
        rows = sum(s * n for s, n in w.formed.items())

        def floor_ms(which: int) -> float:  # the formed batches, run by the floor
            known = [self.per_call(s, which) for s in sizes]
            return sum(float(np.interp(s, sizes, known)) * n for s, n in w.formed.items())

        wall, cpu = floor_ms(0), floor_ms(1)
        mix = rows * 1e3 / wall if wall else float("nan")
        compute = w.compute_ns / 1e6 / wall if wall else float("nan")
        used = w.instance_cpu * 1e3 / cpu if cpu else float("nan")
        per_row = w.instance_cpu * 1e3 / max(len(w.latencies), 1)
        thrift = min(self.per_call(s, 1) / s for s in sizes)  # the floor's least CPU per row
        preferred = f"preferred {self.preferred}" if self.preferred > 0 else "no preferred size"
        self.ratios.append(
            f"{self.model.name}/{self.backend}: {MAX_BATCH} {kind}s, dynamic batching "
            f"({preferred}): {w.rate:.1f} req/s = {w.rate / rate:.2f}x the runtime's best "
            f"{rate:.1f} rows/s (batch {size}; goal >= 0.9x), p99 {pct(w.latencies, 99):.1f} ms"
            f" = {mix / rate:.2f} (the batches formed, {formed_text(w.formed)}, run in-process "
            f"at {mix:.1f} rows/s) x {w.busy:.2f} (the share of the window the instance "
            f"computed) / {compute:.2f} (its computing against the floor's time for those "
            f"batches; its CPU {used:.2f}x the floor's). Load aside: CPU per request "
            f"{per_row:.2f} ms against the floor's least {thrift:.2f} ms per row; "
            f"{thrift / per_row * min(w.busy, 1.0):.2f}x with the share computed"
        )

    def floor_rows(self) -> None:
        for size in sorted(self.floors):
            p50, calls = self.per_call(size), self.floors[size]
            share = sum(c for _, c in calls) / sum(w for w, _ in calls)
            self.rows.append(
                f"| {self.model.name} | {self.backend} | in-process, batch {size} | 1 | "
                f"{p50:.1f} | {pct([w for w, _ in calls], 99):.1f} | {size * 1e3 / p50:.1f} "
                f"rows/s | | | {share:.0%} CPU | {self.per_call(size, 1) / size:.1f} per row |"
            )


def _main_sizes(formed: dict[int, int]) -> list[int]:
    """The batch sizes that carried at least 5% of the rows."""
    rows = sum(s * n for s, n in formed.items())
    return [s for s, n in formed.items() if s * n >= 0.05 * rows]


def _pooled(windows: list[Window]) -> Window:
    """Rounds of one path as one row: every latency, the median rate; the statistics and
    CPU columns of the middle round; the instance's compute and CPU summed."""
    latencies = [d for w in windows for d in w.latencies]
    middle = windows[len(windows) // 2]
    rate = float(np.median([w.rate for w in windows]))
    compute = sum(w.compute_ns for w in windows)
    cpu = sum(w.instance_cpu for w in windows)
    return Window(
        latencies, rate, middle.stats, middle.formed, middle.busy, compute, cpu, middle.cpu
    )


def preferred_arg(value: str) -> int:
    if value == "best":
        return BEST
    if value.isdigit() and 0 < int(value) <= MAX_BATCH:
        return int(value)
    raise argparse.ArgumentTypeError(f"'{value}' is not 'best' or a size from 1 to {MAX_BATCH}")


def cores_arg(value: str) -> list[int]:
    try:
        return sorted({int(c) for c in value.split(",") if c.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{value}' is not a list of cores like 1 or 0,1"
        ) from None


@contextlib.contextmanager
def pinned(cores: list[int]) -> Iterator[None]:
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, mine)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="resnet,bert")
    parser.add_argument("--backends", default="onnxruntime,openvino,pytorch")
    parser.add_argument("--quick", action="store_true", help="narrower models, short windows")
    parser.add_argument("--seconds", type=float, default=0, help="window of a served row")
    parser.add_argument("--rounds", type=int, default=0, help="rounds of the batch-1 rows")
    parser.add_argument("--instance-cores", type=cores_arg, default=None)
    parser.add_argument(
        "--preferred",
        type=preferred_arg,
        default=0,
        help="preferred_batch_size of batched: N, or 'best' (the size up to half the clients the "
        "floor runs with the least CPU per row, timed first); default none",
    )
    args = parser.parse_args()
    check_choices(parser, args.models, args.backends)
    args.seconds = args.seconds or (2.0 if args.quick else 15.0)
    args.rounds = args.rounds or (3 if args.quick else 5)
    every = sorted(os.sched_getaffinity(0))
    cores = args.instance_cores or every[-1:]
    if not set(cores) <= set(every):
        parser.error(
            f"--instance-cores {cpus_text(cores)}: this process may run on {cpus_text(every)}"
        )
    client_cores = [c for c in every if c not in cores] or every
    print(f"instance cores {cpus_text(cores)}, broker and clients on {cpus_text(client_cores)}; "
          f"{'quick (narrower) models' if args.quick else 'full-size models'}; "
          f"load average before: {os.getloadavg()}", flush=True)  # fmt: skip
    rows, ratios = [], []
    with tempfile.TemporaryDirectory(prefix="ipb-models-") as tmp, pinned(client_cores):
        for name in args.models.split(","):
            model = spec(name, args.quick)
            folder = Path(tmp) / name
            folder.mkdir()
            paths = export(model, folder)
            for backend in args.backends.split(","):
                began = time.monotonic()
                with contextlib.ExitStack() as stack:
                    bench = Bench(model, backend, paths, args, cores, client_cores, stack)
                    bench.batch_one()
                    bench.concurrent()
                    bench.floor_rows()
                rows += bench.rows
                ratios += bench.ratios
                took = time.monotonic() - began
                print("\n".join(bench.ratios), flush=True)
                print(f"({took:.0f} s; load average {os.getloadavg()})", flush=True)
    print(HEADER)
    print("\n".join(rows))
    print()
    print("\n".join(ratios))
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
