#!/usr/bin/env python3
"""CPU per request, per process: where a 64 B identity round trip spends its time.

Every process on one core (``--cpu``), one client at a time: the lean pyzmq relay
(client -> broker -> worker -> back, the floor of the broker path), inferpool's ``Client``
and ``ShmClient`` through the broker, and a lane (``ShmClient(lane=True)``, no broker).  For
each, the CPU time of the client, the broker and the worker process over ``--requests``
round trips, from the kernel's per-thread accounting (``/proc/<pid>/task/*/schedstat``, in
ns; zmq's I/O threads and the lane threads included), divided by the requests.

    python scripts/bench_cpu.py                 # 20000 requests each
    python scripts/bench_cpu.py --json cpu.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_latency as bl

from inferpool.client import Client, ShmClient
from inferpool.wire.zmqio import recv_frames, send_parts


def cpu_ns(pid: int, main_only: bool = False) -> int:
    """CPU time of every thread of process ``pid`` so far (or of its main thread), in ns."""
    total = 0
    for task in [str(pid)] if main_only else os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/schedstat") as f:
            total += int(f.read().split()[0])
    return total


def per_request(call: Callable[[], Any], pids: dict[str, int], n: int) -> dict[str, float]:
    """Each process's CPU (us) per call of ``call``, over ``n`` calls after a warm-up."""
    for _ in range(min(500, n // 10)):
        call()
    me = os.getpid()
    before = {name: cpu_ns(pid) for name, pid in pids.items()}
    mine = cpu_ns(me, main_only=True)
    t = time.perf_counter()
    for _ in range(n):
        call()
    wall = time.perf_counter() - t
    mine = cpu_ns(me, main_only=True) - mine
    after = {name: cpu_ns(pid) for name, pid in pids.items()}
    out = {name: (after[name] - before[name]) / n / 1e3 for name in pids}
    out["client py"] = mine / n / 1e3  # the client's own thread (the rest: zmq's, lanes')
    out["wall"] = wall / n * 1e6
    return out


@contextlib.contextmanager
def lean_relay(tmp: Path, cpu: int) -> Iterator[tuple[str, dict[str, int]]]:
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    front, back = f"ipc://{tmp}/relay-front", f"ipc://{tmp}/relay-back"
    broker = ctx.Process(target=bl.relay_broker, args=(front, back, cpu, ready, True), daemon=True)
    broker.start()
    ready.wait()
    worker = ctx.Process(target=bl.relay_worker, args=(back, cpu, True), daemon=True)
    worker.start()
    time.sleep(0.5)
    try:
        yield front, {"broker": broker.pid or 0, "worker": worker.pid or 0}
    finally:
        broker.kill()
        worker.kill()


def measure(n: int, cpu: int) -> dict[str, dict[str, float]]:
    bl.pin(cpu)
    me = os.getpid()
    results: dict[str, dict[str, float]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="ipb-", dir="/tmp"))
    layout = {"client": cpu, "broker": cpu, "worker": cpu}
    try:
        with lean_relay(tmp, cpu) as (front, pids):
            ctx = zmq.Context()
            sock = ctx.socket(zmq.DEALER)
            sock.connect(front)
            payload = np.random.bytes(64)

            def relay() -> None:
                send_parts(sock, [b"", b"{}", payload], copy=False)
                recv_frames(sock)

            results["lean relay"] = per_request(relay, {"client": me, **pids}, n)
            sock.close(0)
            ctx.term()
        server, endpoint = bl.start_inferpool(tmp, layout)
        try:
            with Client(endpoint, timeout=30) as c:
                rows = c.status()
                worker = {r["model"]: r["pid"] for r in rows}
                pids = {"client": me, "broker": server.pid, "worker": worker["bench"]}
                x = np.zeros((1, 64), np.uint8)
                results["Client"] = per_request(lambda: c.infer("bench", {"INPUT0": x}), pids, n)
            with ShmClient(endpoint, timeout=30) as s:
                req = s.request("bench", outputs=["OUTPUT0"])
                req.input("INPUT0", (1, 64), np.uint8)[:] = 1
                results["ShmClient"] = per_request(lambda: s.run(req).release(), pids, n)
            with ShmClient(endpoint, timeout=30, lane=True) as s:
                req = s.request("lane", outputs=["OUTPUT0"])
                req.input("INPUT0", (64,), np.uint8)[:] = 1
                pids = {"client": me, "broker": server.pid, "worker": worker["lane"]}
                results["lane"] = per_request(lambda: s.run(req).release(), pids, n)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(60)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--cpu", type=int, default=0)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    results = measure(args.requests, args.cpu)
    print(f"CPU per 64 B round trip, us (all processes on cpu {args.cpu}):")
    print("(client py: the client's own thread; the rest of its column is zmq's I/O thread)")
    head = ("client", "client py", "broker", "worker", "total", "wall")
    print(f"{'path':11} " + " ".join(f"{h:>9}" for h in head))
    for name, r in results.items():
        total = sum(r.get(k, 0.0) for k in ("client", "broker", "worker"))
        row = (r["client"], r["client py"], r.get("broker", 0.0), r["worker"], total, r["wall"])
        print(f"{name:11} " + " ".join(f"{v:9.1f}" for v in row))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
