#!/usr/bin/env python3
"""What a spinning lane client costs its worker's compute, wherever the client runs.

A real server pins one pytorch worker (the MLP of scripts/bench_torch.py, at a batch whose
forward pass takes about 400 us here) to a core; clients send it requests through a lane,
spinning for each answer as ShmClient does by default (100 us, and not at all once its
spins keep running out: shm/bell.py).  The forward pass's time is read from the server's
statistics (``compute_infer`` per request) for each client, with the client's own CPU time
per request (what a spin burns shows there, whatever the other jobs do to the forward pass):

- ``apart, asleep``: pinned to another core, never spinning (the baseline: it never meets
  the worker);
- ``apart, spinning``: pinned to another core;
- ``unpinned, spinning``: nobody pinned it;
- ``worker's core, spinning``: pinned to the worker's own core (its waits must not spin);
- ``unpinned, other core busy``: nobody pinned it and a busy loop holds the other core, so
  that the scheduler puts it on the worker's core as often as it can;
- ``apart, asleep, other core busy``: what the busy loop alone costs the forward pass;
- ``apart, spinning 2 ms``: pinned to another core, spinning through the whole forward pass
  (``lane_spin_us=2000``): what a core that only burns beside the worker costs it here.

Each in alternating rounds; the goal (issue 31): every ratio to the baseline at most 1.05.

    python scripts/bench_lane_share.py [--requests 300] [--rounds 4]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_torch  # torch, and the MLP of the latency benchmark

from inferpool.client import ShmClient
from inferpool.client.shm_base import DEFAULT_LANE_SPIN_US

BATCH = 32  # the MLP's forward pass at this batch: about 400 us on this machine
CONFIG = (
    bench_torch.MLP_CONFIG
    + 'instance_group [{ count: 1 kind: KIND_CPU host_policy: "bench" }]\n'
    + 'parameters { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "1" } }\n'
)
# client: (its cores: "apart", "worker", None for nobody's choice; its spin in us; a busy loop)
SCENARIOS = {
    "apart, asleep": ("apart", 0, False),
    "apart, spinning": ("apart", DEFAULT_LANE_SPIN_US, False),
    "unpinned, spinning": (None, DEFAULT_LANE_SPIN_US, False),
    "worker's core, spinning": ("worker", DEFAULT_LANE_SPIN_US, False),
    "unpinned, other core busy": (None, DEFAULT_LANE_SPIN_US, True),
    "apart, asleep, other core busy": ("apart", 0, True),
    "apart, spinning 2 ms": ("apart", 2000, False),
}


def _client(endpoint: str, where: set[int] | None, spin_us: int, requests: int, out: Any) -> None:
    if where is not None:
        os.sched_setaffinity(0, where)
    with ShmClient(endpoint, timeout=60, lane=True, lane_spin_us=spin_us) as c:
        req = c.request("mlp", outputs=["OUTPUT__0"])
        req.input("INPUT__0", (BATCH, 256), np.float32)[:] = 0.5
        for _ in range(10):
            c.run(req).release()
        before = _compute(c)
        cpu = time.process_time_ns()
        for _ in range(requests):
            c.run(req).release()
        cpu = time.process_time_ns() - cpu
        lane = c.lane("mlp")
        after = _compute(c)
        placement = lane.placement()
    out.put(
        {
            "compute_ns": (after[1] - before[1]) / max(1, after[0] - before[0]),
            "spun": placement["spun"],
            "slept": placement["slept"],
            "cpu_us": cpu / requests / 1e3,
        }
    )


def _compute(c: ShmClient) -> tuple[int, int]:
    """(count, ns) of the model's compute_infer so far (lane requests counted in)."""
    wait_flushed = time.monotonic() + 0.2  # the lane's statistics reach the broker by then
    while time.monotonic() < wait_flushed:
        time.sleep(0.05)
    infer = c.statistics("mlp")["model_stats"][0]["inference_stats"]["compute_infer"]
    return int(infer["count"]), int(infer["ns"])


def _busy(stop: Any, core: int) -> None:
    os.sched_setaffinity(0, {core})
    while not stop.is_set():
        sum(range(1000))


def run_one(endpoint: str, name: str, cores: dict[str, set[int]], requests: int) -> dict[str, Any]:
    place, spin_us, busy = SCENARIOS[name]
    ctx = mp.get_context("spawn")
    stop, out = ctx.Event(), ctx.Queue()
    hog = None
    if busy:
        hog = ctx.Process(target=_busy, args=(stop, min(cores["apart"])), daemon=True)
        hog.start()
    where = cores[place] if place else None
    proc = ctx.Process(target=_client, args=(endpoint, where, spin_us, requests, out))
    proc.start()
    try:
        result: dict[str, Any] = out.get(timeout=600)
    finally:
        proc.join(30)
        stop.set()
        if hog is not None:
            hog.join(10)
    return result


def measure_share(
    requests: int = 300, rounds: int = 4, worker: int | None = None
) -> dict[str, Any]:
    """Every scenario's compute time per request (median of its rounds) and its ratio to
    ``apart, asleep``; the worker pinned to ``worker`` (default: the last core)."""
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        raise SystemExit("bench_lane_share needs two cores: one for the worker, one apart")
    worker = mine[-1] if worker is None else worker
    cores = {"worker": {worker}, "apart": set(mine) - {worker}}
    with contextlib.ExitStack() as stack:
        model = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ipb-", dir="/tmp")))
        bench_torch.save_model(bench_torch.mlp(), model)
        repo = bench_torch.model_repository(model / "1" / "model.pt", "mlp", CONFIG, stack)
        client = bench_torch.serve(repo, stack, f"--host-policy=bench,cpu-cores={worker}")
        times: dict[str, list[float]] = {name: [] for name in SCENARIOS}
        waits: dict[str, list[tuple[int, int]]] = {name: [] for name in SCENARIOS}
        cpu: dict[str, list[float]] = {name: [] for name in SCENARIOS}
        names = list(SCENARIOS)
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                got = run_one(client.endpoint, name, cores, requests)
                times[name].append(got["compute_ns"] / 1e3)
                waits[name].append((got["spun"], got["slept"]))
                cpu[name].append(got["cpu_us"])
    base = float(np.median(times["apart, asleep"]))
    return {
        name: {
            "compute_us": float(np.median(times[name])),
            "ratio": float(np.median(times[name])) / base,
            "spun": sum(w[0] for w in waits[name]),
            "slept": sum(w[1] for w in waits[name]),
            "client_cpu_us": float(np.median(cpu[name])),
        }
        for name in SCENARIOS
    }


def print_share(rows: dict[str, Any]) -> None:
    for name, row in rows.items():
        print(
            f"  {name:31} forward pass {row['compute_us']:7.1f} us = {row['ratio']:.3f} x apart "
            f"asleep (goal <= 1.05); waits spun {row['spun']}, slept {row['slept']}; client "
            f"CPU {row['client_cpu_us']:.0f} us per request",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}")
    print_share(measure_share(args.requests, args.rounds))
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
