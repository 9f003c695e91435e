"""Dynamic batching on and off: a TorchScript MLP under 1, 8 and 32 concurrent clients.

    python scripts/bench_batching.py [--seconds 4] [--rounds 3] [--clients 1 8 32]

One ``inferpool serve`` loads the same MLP twice: ``mlp_off`` (``max_batch_size: 32``, no
batcher: every request is a batch of one, as Triton without ``dynamic_batching``) and
``mlp_on`` (the same with ``dynamic_batching {}``: what is queued while the instance runs
goes in its next batch).  Both instances run on the same core (the last this process may
use, a host policy), with one torch thread each, so the two are measured alike; the clients
and the broker run on the other cores.
N clients (``AsyncClient`` each, in one event loop) send batch-1 requests back to back for
``--seconds``; requests/s, p50 and p99 are measured per (clients, batching), the two
batchings alternating in ``--rounds`` rounds, the median round reported.  The last columns
are the ratios of batching on to off at the same number of clients, the floor measured in
the same run; the goal at 32 clients is at least 3x the requests/s, with p99 no worse.

The model is sized so that one request costs what it costs on a server (its weights, about
32 MiB, do not fit in the cache: a batch of one reads them all for one row, a batch of 32
for 32 rows).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_torch import save_model, serve

from inferpool.client import AsyncClient

WIDTH, HIDDEN = 1024, 2048
CONFIG = """
name: "{name}"
backend: "pytorch"
max_batch_size: 32
input [{{ name: "INPUT__0" data_type: TYPE_FP32 dims: [{width}] }}]
output [{{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [{width}] }}]
instance_group [{{ count: 1 kind: KIND_CPU host_policy: "bench" }}]
parameters {{ key: "INTRA_OP_THREAD_COUNT" value: {{ string_value: "1" }} }}
{batching}
"""
MODELS = {"off": "mlp_off", "on": "mlp_on"}


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(WIDTH, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, WIDTH),
    ).eval()


def repository(root: Path) -> Path:
    repo = root / "repo"
    module = mlp()
    for mode, name in MODELS.items():
        save_model(module, repo / name)
        batching = "dynamic_batching { }" if mode == "on" else ""
        text = CONFIG.format(name=name, width=WIDTH, batching=batching)
        (repo / name / "config.pbtxt").write_text(text)
    return repo


async def load(endpoint: str, model: str, clients: int, seconds: float) -> dict[str, float]:
    """``clients`` clients sending back to back for ``seconds``: req/s, p50, p99 (ms)."""
    x = np.random.default_rng(0).random((1, WIDTH), dtype=np.float32)
    latencies: list[float] = []
    async with contextlib.AsyncExitStack() as stack:
        conns = [await stack.enter_async_context(AsyncClient(endpoint)) for _ in range(clients)]
        for c in conns:  # warm: each client's socket connected and the instance busy once
            await c.infer(model, {"INPUT__0": x})
        stop = time.perf_counter() + seconds

        async def client(c: AsyncClient) -> None:
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                await c.infer(model, {"INPUT__0": x})
                latencies.append(time.perf_counter() - t0)

        start = time.perf_counter()
        await asyncio.gather(*(client(c) for c in conns))
        elapsed = time.perf_counter() - start
    latencies.sort()
    return {
        "rps": len(latencies) / elapsed,
        "p50": latencies[len(latencies) // 2] * 1e3,
        "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3,
    }


def check_outputs(endpoint: str, repo: Path) -> None:
    """Both models answer what the module computes (the benchmark measures real work)."""
    module = torch.jit.load(str(repo / "mlp_on" / "1" / "model.pt"))
    x = np.random.default_rng(1).random((1, WIDTH), dtype=np.float32)
    with torch.inference_mode():
        want = module(torch.from_numpy(x)).numpy()

    async def ask(model: str) -> np.ndarray:
        async with AsyncClient(endpoint) as c:
            return (await c.infer(model, {"INPUT__0": x}))["OUTPUT__0"]

    for model in MODELS.values():
        np.testing.assert_allclose(asyncio.run(ask(model)), want, rtol=1e-4, atol=1e-5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args()
    rows: dict[tuple[int, str], list[dict[str, float]]] = {}
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ipb-", dir="/tmp")))
        repo = repository(root)
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) > 1:  # clients and the broker (which inherits it) off the model's core
            os.sched_setaffinity(0, cores[:-1])
        client = serve(repo, stack, f"--host-policy=bench,cpu-cores={cores[-1]}")
        endpoint = client.endpoint
        check_outputs(endpoint, repo)
        for _ in range(args.rounds):
            for clients in args.clients:
                for mode, model in MODELS.items():
                    result = asyncio.run(load(endpoint, model, clients, args.seconds))
                    rows.setdefault((clients, mode), []).append(result)
    print(
        "| clients | batching | req/s | p50 | p99 | req/s on ÷ off | p99 on ÷ off |\n"
        "|---|---|---|---|---|---|---|"
    )
    for clients in args.clients:
        median = {
            mode: {
                k: statistics.median(r[k] for r in rows[clients, mode])
                for k in rows[clients, mode][0]
            }
            for mode in MODELS
        }
        off, on = median["off"], median["on"]
        for mode in MODELS:
            m = median[mode]
            ratios = (
                f"{on['rps'] / off['rps']:.2f} | {on['p99'] / off['p99']:.2f}"
                if mode == "on"
                else " | "
            )
            print(
                f"| {clients} | {mode} | {m['rps']:.0f} | {m['p50']:.2f} ms | {m['p99']:.2f} ms | "
                f"{ratios} |"
            )


if __name__ == "__main__":
    main()
