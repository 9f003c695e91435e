"""What priority levels and queue policies cost a request, next to the plain queue.

    python scripts/bench_scheduling.py [--seconds 3] [--rounds 3] [--clients 1 4]

Two measurements, each against its floor measured in the same run:

- **scheduler**: the broker's own work for one request, in process: a request is queued on
  the real ``Scheduler`` of a model and dispatched to the instance waiting for it, which
  becomes idle again (what the broker's loop does per request, without the sockets).  The
  plain model has ``dynamic_batching {}`` (one FIFO level); the queued one two priority
  levels, a default queue policy (``max_queue_size``, a timeout the request may shorten) and
  a DELAY policy for level 1, and its requests alternate between the levels with a timeout.
  The best of ``--rounds`` batches of 200k requests, in ns per request.
- **served**: the same two configs on the identity backend behind a real ``inferpool
  serve``, N ``AsyncClient`` clients sending back to back (the queued model's requests carry
  ``priority`` and ``timeout``); req/s and p50, the two alternating in ``--rounds`` rounds,
  the median round reported.  Cancellation adds nothing here: the broker checks a flag only
  when a result comes back, a backend reads its mark only when it asks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_torch import serve

from inferpool.broker.models.registry import ModelVersion
from inferpool.broker.models.request import PendingRequest
from inferpool.broker.models.scheduler import Scheduler
from inferpool.client import AsyncClient
from inferpool.wire.worker.protocol import Work

IO = """
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
BATCHING = {
    "plain": "dynamic_batching { }",
    "queued": """dynamic_batching {
  priority_levels: 2 default_priority_level: 2
  default_queue_policy { max_queue_size: 1000 default_timeout_microseconds: 10000000
                         allow_timeout_override: true }
  priority_queue_policy { key: 1 value: { timeout_action: DELAY
                                          default_timeout_microseconds: 10000000 } }
}""",
}
# what the queued model's requests ask for, in turn: (priority level, timeout in us)
ASKS = [(1, 5_000_000), (2, 5_000_000)]


def config(name: str) -> str:
    return f'name: "{name}"\n{IO}\n{BATCHING[name]}\n'


# ============================================================================ in process
def scheduler_ns(name: str, requests: int) -> float:
    """ns per request: queued on the model's scheduler and dispatched to its idle instance."""
    model = ModelVersion(name, 1, text_format.Parse(config(name), pb.ModelConfig()), "")
    worker = object()
    queued = name == "queued"
    reqs = []
    for i in range(requests):
        priority, timeout_us = ASKS[i % len(ASKS)] if queued else (0, 0)
        work = Work(i + 1, str(i), 0, 0, {}, (), (), priority, timeout_us)
        reqs.append(PendingRequest(i + 1, [b"c"], str(i), model, work, [], {}, 1, 0))

    def dispatch(*_: Any) -> None:
        pass  # the batch went to its worker

    def reject(req: PendingRequest, err: Exception) -> None:
        raise AssertionError(f"request {req.client_id} refused: {err}")

    scheduler = Scheduler(model, dispatch, reject)
    start = time.perf_counter_ns()
    for req in reqs:
        scheduler.instance_idle(worker, 0)  # its last batch is done
        scheduler.enqueue(req, 0)
    return (time.perf_counter_ns() - start) / requests


# ============================================================================ served
async def load(endpoint: str, model: str, clients: int, seconds: float) -> dict[str, float]:
    """``clients`` clients sending back to back for ``seconds``: req/s and p50 (us)."""
    x = {"INPUT0": np.ones((1, 16), np.float32)}
    latencies: list[float] = []
    async with contextlib.AsyncExitStack() as stack:
        conns = [await stack.enter_async_context(AsyncClient(endpoint)) for _ in range(clients)]
        for c in conns:
            await c.infer(model, x)
        stop = time.perf_counter() + seconds

        async def client(c: AsyncClient) -> None:
            i = 0
            while time.perf_counter() < stop:
                params = None
                if model == "queued":
                    priority, timeout_us = ASKS[i % len(ASKS)]
                    params = {"priority": priority, "timeout": timeout_us}
                i += 1
                t0 = time.perf_counter()
                await c.infer(model, x, parameters=params)
                latencies.append(time.perf_counter() - t0)

        start = time.perf_counter()
        await asyncio.gather(*(client(c) for c in conns))
        elapsed = time.perf_counter() - start
    latencies.sort()
    return {"rps": len(latencies) / elapsed, "p50": latencies[len(latencies) // 2] * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per served measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()

    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for name in BATCHING:
            ns = scheduler_ns(name, 200_000)
            best[name] = min(best.get(name, ns), ns)
    print("| path | plain | priority levels + queue policy | ÷ plain |\n|---|---|---|---|")
    ratio = best["queued"] / best["plain"]
    print(
        f"| scheduler, per request | {best['plain']:.0f} ns | {best['queued']:.0f} ns "
        f"| {ratio:.2f} |"
    )

    rows: dict[tuple[int, str], list[dict[str, float]]] = {}
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ipq-", dir="/tmp")))
        repo = root / "repo"
        for name in BATCHING:
            (repo / name / "1").mkdir(parents=True)
            (repo / name / "config.pbtxt").write_text(config(name))
        endpoint = serve(repo, stack).endpoint
        for _ in range(args.rounds):
            for clients in args.clients:
                for name in BATCHING:
                    result = asyncio.run(load(endpoint, name, clients, args.seconds))
                    rows.setdefault((clients, name), []).append(result)
    for clients in args.clients:
        m = {
            name: {k: statistics.median(r[k] for r in rows[clients, name]) for k in ("rps", "p50")}
            for name in BATCHING
        }
        plain, queued = m["plain"], m["queued"]
        print(
            f"| served, {clients} client(s): req/s | {plain['rps']:.0f} | {queued['rps']:.0f} | "
            f"{queued['rps'] / plain['rps']:.2f} |"
        )
        print(
            f"| served, {clients} client(s): p50 | {plain['p50']:.0f} µs "
            f"| {queued['p50']:.0f} µs | {queued['p50'] / plain['p50']:.2f} |"
        )


if __name__ == "__main__":
    main()
