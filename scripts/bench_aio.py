#!/usr/bin/env python3
"""AsyncClient next to the sync Client, in one run, as ratios to the sync client.

Two peers, so that the client's own cost shows through the server's:

- echo:    a bare ROUTER in another process that returns each message as it came (what the
           client costs on its own);
- server:  ``inferpool serve`` with the example repository, the identity model (end to end).

Against each, the same identity request (16 FP32 values) goes through:

- sync:         client.Client, one request at a time (the baseline, 1.00);
- async:        client.AsyncClient, one request at a time (what the loop integration costs);
- async x8:     client.AsyncClient with 8 requests in flight on its one socket;
- zmq.asyncio:  the same messages through pyzmq's zmq.asyncio socket, one at a time (the
                design AsyncClient does not build on, see client/aio.py).

Rounds alternate the clients; the median round is reported.  ``--json`` writes the results.

    python scripts/bench_aio.py --requests 2000 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zmq
import zmq.asyncio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from inferpool.client import AsyncClient, Client  # noqa: E402
from inferpool.client.core import encode_inputs, infer_header  # noqa: E402
from inferpool.wire import codec  # noqa: E402
from inferpool.wire.zmqio import SNDMORE, recv_frames, send_parts  # noqa: E402

X = {"INPUT0": np.arange(16, dtype=np.float32)}


def run_sync(endpoint: str, n: int) -> float:
    with Client(endpoint) as c:
        t = time.perf_counter()
        for _ in range(n):
            c.infer("identity", X)
        return time.perf_counter() - t


async def run_async(endpoint: str, n: int, in_flight: int) -> float:
    async with AsyncClient(endpoint) as c:
        t = time.perf_counter()
        if in_flight == 1:
            for _ in range(n):
                await c.infer("identity", X)
        else:
            for _ in range(n // in_flight):
                await asyncio.gather(*(c.infer("identity", X) for _ in range(in_flight)))
        return time.perf_counter() - t


async def run_zmq_asyncio(endpoint: str, n: int) -> float:
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    specs, frames = encode_inputs(X)
    try:
        t = time.perf_counter()
        for i in range(n):
            header = infer_header("identity", specs, None, "", None)
            header["id"] = str(i)
            parts = [b"", codec.encode_header(header), *frames]
            for j, part in enumerate(parts):
                await sock.send(part, SNDMORE if j < len(parts) - 1 else 0, copy=False)
            frame = await sock.recv(0, copy=False)
            while frame.more:
                frame = await sock.recv(0, copy=False)
        return time.perf_counter() - t
    finally:
        sock.close(0)
        ctx.term()


def echo(endpoint: str, bound: Any) -> None:
    """The bare peer: every message goes back as it came."""
    sock = zmq.Context().socket(zmq.ROUTER)
    sock.bind(endpoint)
    bound.set()
    while True:
        send_parts(sock, recv_frames(sock), copy=False)


def serve(tmp: str) -> tuple[subprocess.Popen[bytes], str]:
    endpoint = f"ipc://{tmp}/bench.sock"
    repo = ROOT / "examples" / "model_repository"
    cmd = [sys.executable, "-m", "inferpool", "serve", "--model-repository", str(repo)]
    cmd += ["--http-port", "0", "--grpc-port", "0"]  # the zmq path only
    cmd += ["--listen", endpoint, "--arena-size", "32M", "--output-arena-size", "16M"]
    cmd += ["--allow-metrics", "false"]  # no port of its own to take
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    with Client(endpoint) as c:
        c.wait_ready(120)
    return proc, endpoint


def measure(endpoint: str, n: int, rounds: int) -> dict[str, float]:
    """Seconds per request of each client: the median over alternating rounds."""
    clients: dict[str, Callable[[], float]] = {
        "sync": lambda: run_sync(endpoint, n),
        "async": lambda: asyncio.run(run_async(endpoint, n, 1)),
        "async x8": lambda: asyncio.run(run_async(endpoint, n, 8)),
        "zmq.asyncio": lambda: asyncio.run(run_zmq_asyncio(endpoint, n)),
    }
    run_sync(endpoint, n // 10)  # warm-up: workers, pages, caches
    times: dict[str, list[float]] = {name: [] for name in clients}
    for _ in range(rounds):
        for name, run in clients.items():
            times[name].append(run() / n)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default="", help="write the results here")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ipb-", dir="/tmp") as tmp:
        spawn = mp.get_context("spawn")
        bound = spawn.Event()
        peer = spawn.Process(target=echo, args=(f"ipc://{tmp}/echo.sock", bound))
        peer.start()
        bound.wait(60)  # a client finds out at once when nothing listens yet
        try:
            results["echo"] = measure(f"ipc://{tmp}/echo.sock", args.requests, args.rounds)
        finally:
            peer.kill()
        proc, endpoint = serve(tmp)
        try:
            results["server"] = measure(endpoint, args.requests, args.rounds)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)
    for peer_name, row in results.items():
        base = row["sync"]
        print(f"\n{peer_name:7} {'client':12} {'us/request':>10} {'vs sync':>8}")
        for name, seconds in row.items():
            print(f"{'':7} {name:12} {seconds * 1e6:10.1f} {seconds / base:8.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
