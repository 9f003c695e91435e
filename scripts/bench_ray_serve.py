#!/usr/bin/env python3
"""What Ray Serve adds over direct zmq, in one run, as ratios to the direct AsyncClient.

One broker (``inferpool serve``, the example repository, its KServe HTTP port on) and a
one-node Ray cluster in this process running the adapter (``inferpool.client.ray_serve``, one
replica).  The same identity request (16 FP32 values) goes, one at a time, through:

- zmq:          AsyncClient straight to the broker over ipc (the baseline, 1.00);
- serve handle: a DeploymentHandle (``handle.infer.remote``): the driver, Serve's router, the
                replica, then zmq to the broker;
- kserve http:  the broker's own KServe v2 HTTP endpoint, JSON (the like-for-like HTTP floor);
- serve http:   Serve's HTTP proxy, the replica, then zmq to the broker, the same JSON.

Rounds alternate the paths; the median round of each is reported (mean and p99 latency).
Needs ``pip install 'inferpool[ray]'``.

    python scripts/bench_ray_serve.py --requests 500 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import ray
from ray import serve

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from inferpool.client import AsyncClient  # noqa: E402
from inferpool.client.ray_serve import RESOURCE, node_deployment  # noqa: E402
from tests.support import free_tcp_port  # noqa: E402

X = np.arange(16, dtype=np.float32)
BODY = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [16], "data": X.tolist()}]}
PATH = "/v2/models/identity/infer"


def serve_broker(tmp: str) -> tuple[subprocess.Popen[bytes], str, int, int]:
    """(process, ipc endpoint, KServe HTTP port, health port)."""
    endpoint = f"ipc://{tmp}/bench.sock"
    http, health = free_tcp_port(), free_tcp_port()
    repo = ROOT / "examples" / "model_repository"
    cmd = [sys.executable, "-m", "inferpool", "serve", "--model-repository", str(repo)]
    cmd += ["--http-port", str(http), "--grpc-port", "0", "--health-port", str(health)]
    cmd += ["--listen", endpoint, "--arena-size", "32M", "--output-arena-size", "16M"]
    proc = subprocess.Popen(
        cmd, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    return proc, endpoint, http, health


async def timed(call: Callable[[], Awaitable[Any]], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await call()
        out.append(time.perf_counter() - t)
    return out


async def measure(endpoint: str, http: int, proxy: int, n: int, rounds: int) -> dict[str, Any]:
    handle = serve.get_app_handle("inferpool")
    async with AsyncClient(endpoint) as client, aiohttp.ClientSession() as session:
        await client.wait_ready(120)

        async def post(port: int, prefix: str) -> None:
            async with session.post(f"http://127.0.0.1:{port}{prefix}{PATH}", json=BODY) as r:
                assert r.status == 200, await r.text()
                await r.read()

        paths: dict[str, Callable[[], Awaitable[Any]]] = {
            "zmq": lambda: client.infer("identity", {"INPUT0": X}),
            "serve handle": lambda: handle.infer.remote("identity", {"INPUT0": X}),
            "kserve http": lambda: post(http, ""),
            "serve http": lambda: post(proxy, "/inferpool"),
        }
        for call in paths.values():  # warm-up: connections, pages, caches
            await timed(call, max(n // 10, 10))
        rounds_of: dict[str, list[list[float]]] = {name: [] for name in paths}
        for _ in range(rounds):
            for name, call in paths.items():
                rounds_of[name].append(await timed(call, n))
    results = {}
    for name, runs in rounds_of.items():
        means = [statistics.fmean(r) for r in runs]
        median = runs[means.index(statistics.median_low(means))]
        results[name] = {
            "mean_us": statistics.fmean(median) * 1e6,
            "p99_us": float(np.percentile(median, 99)) * 1e6,
        }
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default="", help="write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ipb-", dir="/tmp") as tmp:
        proc, endpoint, http, health = serve_broker(tmp)
        try:
            proxy = free_tcp_port()
            ray.init(
                address="local",  # a new one-node cluster, never one found on the machine
                num_cpus=2,
                resources={RESOURCE: 1},
                include_dashboard=False,
                log_to_driver=False,
            )
            serve.start(http_options={"host": "127.0.0.1", "port": proxy})
            app = node_deployment(
                1, endpoint=endpoint, health_url=f"http://127.0.0.1:{health}/readyz"
            )
            serve.run(app, name="inferpool", route_prefix="/inferpool")
            results = asyncio.run(measure(endpoint, http, proxy, args.requests, args.rounds))
        finally:
            try:
                if ray.is_initialized():
                    serve.shutdown()
                    ray.shutdown()
            finally:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(60)
    base = results["zmq"]["mean_us"]
    print(f"{'path':14} {'mean us':>9} {'p99 us':>9} {'vs zmq':>7}")
    for name, row in results.items():
        print(f"{name:14} {row['mean_us']:9.0f} {row['p99_us']:9.0f} {row['mean_us'] / base:7.2f}")
    print(
        f"serve http / kserve http: "
        f"{results['serve http']['mean_us'] / results['kserve http']['mean_us']:.2f}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
