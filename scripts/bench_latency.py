#!/usr/bin/env python3
"""Identity round trip through inferpool next to the floor: a raw pyzmq two-hop relay.

In one run, with the same pinning for both:

- relay:     client DEALER -> broker ROUTER | ROUTER -> worker DEALER (echo) -> back,
             three processes, a Poller loop in the middle (what the broker path costs at least),
             written with pyzmq's multipart API (send_multipart/recv_multipart);
- lean relay: the same relay with the cheapest pyzmq calls there are (wire/zmqio.py: plain
             int flags, Frame.more), the stricter floor;
- inferpool: client.Client -> broker -> identity worker -> back (the real server);
- shm:       client.ShmClient, inputs written in place once, outputs read as handles (views)
             and released with the next request; next to it, one numpy copy of each size
             (the identity backend's own copy, input -> output, is the only copy allowed);
- kserve:    Triton's clients (tritonclient.http, tritonclient.grpc; binary tensors) through
             the same server's KServe v2 frontends, next to the zmq client and to the same
             clients against servers that only echo (at 64 B their floor), at every size; 8 client
             processes of each at 64 B; Triton's system shared memory through both frontends
             next to ShmClient at 1 and 64 MiB; the CPU the broker, the frontends' process
             and the workers spend per request (scripts/bench_kserve.py);
- trace:     the zmq client and tritonclient.http at 64 B with the server's tracing off and
             on (TIMESTAMPS, every request traced), next to the relay: what tracing costs
             (the server always runs with a trace file, tracing off unless a part turns it on);
- lanes:     ShmClient(lane=True) straight to the worker (scripts/bench_lanes.py), spinning
             and not, next to its floors measured in the same run: a POSIX semaphore
             ping-pong and a bare spin hand-off between two processes (64 B copied on each
             side), the lane bound (the least Python a lane round trip needs: records
             packed and unpacked, one request and one response object, an output slot
             from a free list, the 64 B copied, the output viewed), and what an idle lane
             costs over 10 s.

Sizes 64 B, 1 MiB, 16 MiB, 64 MiB (shm also 256 MiB); 1 and 4 concurrent client processes.
The systems are measured in alternating rounds (noise on a shared machine hits them alike).
The served model is identity with the dynamic batcher on (requests queued together while
the instance is busy run as one batch: what a Triton user would configure).
Prints tables, writes JSON (``--json``, default bench-latency.json).  Layouts (``--layout``):
``one``: every process on core 0; ``split``: clients and broker on core 0, worker on core 1.

    python scripts/bench_latency.py --quick          # a short smoke run
    python scripts/bench_latency.py --part shm       # the shared-memory client table only
    python scripts/bench_latency.py --part kserve    # HTTP and gRPC next to zmq
    python scripts/bench_latency.py --part kserve --sizes 16MiB   # one size
    python scripts/bench_latency.py --part lanes     # the lanes and their floors only
    python scripts/bench_latency.py --part trace     # tracing off and on
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import zmq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import bench_kserve  # noqa: E402
import bench_lanes  # noqa: E402

from inferpool.client import Client, ShmClient  # noqa: E402
from inferpool.shm import cores  # noqa: E402
from inferpool.shm.region import Region  # noqa: E402
from inferpool.wire.zmqio import NOBLOCK, recv_frames, send_parts  # noqa: E402

SIZES = [("64 B", 64), ("1 MiB", 1 << 20), ("16 MiB", 16 << 20), ("64 MiB", 64 << 20)]
ITERATIONS = {64: 3000, 1 << 20: 300, 16 << 20: 40, 64 << 20: 15, 256 << 20: 8}
SHM_SIZES = [*SIZES, ("256 MiB", 256 << 20)]
LAYOUTS = {
    "one": {"client": 0, "broker": 0, "worker": 0},
    "split": {"client": 0, "broker": 0, "worker": 1},
}


WARMUP = 25  # round trips every client makes before it is timed, whatever the size


def warmups(iterations: int) -> int:
    """Untimed round trips before a chunk's ``iterations``: a fresh client process's first
    round trips run cold (its code, the peer's caches) for about twenty of them, and a chunk
    of a large size has few iterations (1 MiB: twenty in --quick), so a tenth of them alone
    would time the warm-up at large sizes and not at 64 B."""
    return max(WARMUP, iterations // 10)


def pin(cpu: int) -> None:
    cpus = sorted(os.sched_getaffinity(0) | set(range(os.cpu_count() or 1)))
    os.sched_setaffinity(0, {cpu if cpu in cpus else cpus[0]})


# ============================================================================ the relays
def _recv(sock: zmq.Socket[Any], lean: bool, flags: int = 0) -> list[Any]:
    return recv_frames(sock, flags) if lean else sock.recv_multipart(flags, copy=False)


def _send(sock: zmq.Socket[Any], parts: list[Any], lean: bool) -> None:
    if lean:
        send_parts(sock, parts, copy=False)
    else:
        sock.send_multipart(parts, copy=False)


def relay_broker(front: str, back: str, cpu: int, ready: Any, lean: bool) -> None:
    pin(cpu)
    ctx = zmq.Context()
    fe, be = ctx.socket(zmq.ROUTER), ctx.socket(zmq.ROUTER)
    fe.bind(front)
    be.bind(back)
    poller = zmq.Poller()
    poller.register(fe, zmq.POLLIN)
    poller.register(be, zmq.POLLIN)
    worker = None
    ready.set()
    while True:  # one message per readiness
        events = dict(poller.poll())
        if be in events:
            msg = _recv(be, lean, NOBLOCK)
            if worker is None:
                worker = msg[0].bytes
            else:
                _send(fe, msg[1:], lean)  # [client id, b"", payload...]
        if fe in events and worker is not None:
            _send(be, [worker, *_recv(fe, lean, NOBLOCK)], lean)


def relay_worker(back: str, cpu: int, lean: bool) -> None:
    pin(cpu)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(back)
    sock.send(b"hello")
    while True:
        _send(sock, _recv(sock, lean), lean)


def relay_client(
    endpoint: str, nbytes: int, iterations: int, cpu: int, start: Any, out: Any, lean: bool
) -> None:
    pin(cpu)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    payload = np.random.bytes(nbytes)
    for _ in range(warmups(iterations)):  # warm-up
        _send(sock, [b"", b"{}", payload], lean)
        _recv(sock, lean)
    start.wait()
    lat = []
    t0 = time.perf_counter()
    for _ in range(iterations):
        t = time.perf_counter()
        _send(sock, [b"", b"{}", payload], lean)
        _recv(sock, lean)
        lat.append(time.perf_counter() - t)
    out.put((t0, time.perf_counter(), lat))


# ============================================================================ inferpool
def inferpool_client(
    endpoint: str, nbytes: int, iterations: int, cpu: int, start: Any, out: Any
) -> None:
    pin(cpu)
    x = np.frombuffer(np.random.bytes(nbytes), dtype=np.uint8).reshape(1, nbytes)
    with Client(endpoint, timeout=60) as c:
        bench_kserve.timed(lambda: c.infer("bench", {"INPUT0": x}), iterations, start, out)


BENCH_CONFIG = """
name: "bench"
backend: "identity"
max_batch_size: 8
dynamic_batching { }
input [ { name: "INPUT0" data_type: TYPE_UINT8 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_UINT8 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU host_policy: "bench" } ]
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_inferpool(tmp: Path, layout: dict[str, int]) -> tuple[subprocess.Popen[bytes], str]:
    """The server, with its KServe frontends on free ports (``kserve_endpoints``)."""
    repo = tmp / "repo"
    (repo / "bench" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "bench" / "config.pbtxt").write_text(BENCH_CONFIG)
    (repo / "lane" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "lane" / "config.pbtxt").write_text(bench_lanes.LANE_CONFIG)
    endpoint = f"ipc://{tmp}/b.sock"
    KSERVE.update(http=f"127.0.0.1:{free_port()}", grpc=f"127.0.0.1:{free_port()}")
    cmd = [
        sys.executable,
        "-m",
        "inferpool",
        "serve",
        "--model-repository",
        str(repo),
        "--listen",
        endpoint,
        "--arena-size",
        "640M",
        "--output-arena-size",
        "640M",
        "--max-request-bytes",
        "128M",
        f"--host-policy=bench,cpu-cores={layout['worker']}",
        "--http-port",
        KSERVE["http"].rpartition(":")[2],
        "--grpc-port",
        KSERVE["grpc"].rpartition(":")[2],
        "--log-level",
        "WARNING",
        "--allow-metrics",
        "false",
        "--trace-config",  # tracing is off (level OFF) until the trace part turns it on
        f"triton,file={tmp}/trace.json",
        "--trace-config",
        "rate=1",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,  # this checkout's inferpool, whatever the caller's directory
        preexec_fn=lambda: pin(layout["broker"]),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
    )
    with Client(endpoint, timeout=5) as c:
        c.wait_ready(120)
    SERVER["pid"] = proc.pid
    return proc, endpoint


# ============================================================================ measuring
ROUNDS = 3  # each system is measured in this many alternating chunks
KSERVE: dict[str, str] = {}  # protocol -> host:port of the running server's frontend
SERVER: dict[str, int] = {}  # the running server's broker pid


def _chunk(
    target: Any, endpoint: str, nbytes: int, iterations: int, clients: int, cpu: int
) -> tuple[list[float], float, list[dict[str, Any]]]:
    """One chunk: ``clients`` processes each doing ``iterations`` round trips at once; the
    latencies, the wall time, and what each client says of its waits (lane clients)."""
    ctx = mp.get_context("spawn")
    # every client waits at the barrier after its warm-up: all start timing together
    start, out = ctx.Barrier(clients + 1, timeout=600), ctx.Queue()
    procs = [
        ctx.Process(target=target, args=(endpoint, nbytes, iterations, cpu, start, out))
        for _ in range(clients)
    ]
    for p in procs:
        p.start()
    start.wait()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    wall = max(r[1] for r in results) - min(r[0] for r in results)
    return [x for r in results for x in r[2]], wall, [r[3] for r in results if len(r) > 3]


def measure(
    systems: dict[str, tuple[Any, str]],
    nbytes: int,
    clients: int,
    cpu: int,
    processes: dict[str, list[int]] | None = None,
) -> dict[str, dict[str, Any]]:
    """p50/p99 and requests/s of each system, measured in alternating rounds; with
    ``processes`` (groups of the server's), the CPU each group spent per request."""
    total = ITERATIONS[nbytes] if clients == 1 else max(10, ITERATIONS[nbytes] // 2)
    per_round = max(5, total // ROUNDS)
    lat: dict[str, list[float]] = {name: [] for name in systems}
    wall = dict.fromkeys(systems, 0.0)
    waits: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
    spent: dict[str, dict[str, float]] = {name: {} for name in systems}
    for _ in range(ROUNDS):
        for name, (target, endpoint) in systems.items():
            before = bench_kserve.cpu_seconds(processes) if processes else {}
            samples, seconds, said = _chunk(target, endpoint, nbytes, per_round, clients, cpu)
            if processes:
                after = bench_kserve.cpu_seconds(processes)
                for group in after:
                    spent[name][group] = spent[name].get(group, 0.0) + after[group] - before[group]
            lat[name] += samples
            wall[name] += seconds
            waits[name] += said
    out: dict[str, dict[str, Any]] = {}
    for name in systems:
        us = np.array(lat[name]) * 1e6
        out[name] = {
            "p50_us": float(np.percentile(us, 50)),
            "p99_us": float(np.percentile(us, 99)),
            "rps": len(us) / wall[name],
            "requests": len(us),
        }
        if spent[name]:  # (the warm-up round trips, as many per chunk, are counted too)
            count = len(us) + ROUNDS * clients * warmups(per_round)
            out[name]["cpu_us"] = {g: t / count * 1e6 for g, t in spent[name].items()}
        said = waits[name]
        if said and "cpu_s" in said[0]:  # what the client processes spent, per request
            out[name]["client_cpu_us"] = sum(w["cpu_s"] for w in said) / len(us) * 1e6
        if said and "spun" in said[0]:
            out[name]["waits"] = {
                "spun": sum(w["spun"] for w in waits[name]),
                "slept": sum(w["slept"] for w in waits[name]),
                "cores": sorted({c for w in waits[name] for c in w["cores"]}),
            }
    return out


@contextlib.contextmanager
def started(layout: dict[str, int]) -> Iterator[dict[str, str]]:
    """Both relays and inferpool, pinned as ``layout`` says: their client endpoints."""
    tmp = Path(tempfile.mkdtemp(prefix="ipb-", dir="/tmp"))
    ctx = mp.get_context("spawn")
    procs = []
    endpoints = {}
    try:
        for name, lean in (("relay", False), ("lean", True)):
            ready = ctx.Event()
            front, back = f"ipc://{tmp}/{name}-front", f"ipc://{tmp}/{name}-back"
            broker = ctx.Process(
                target=relay_broker, args=(front, back, layout["broker"], ready, lean), daemon=True
            )
            broker.start()
            procs.append(broker)
            ready.wait()
            worker = ctx.Process(
                target=relay_worker, args=(back, layout["worker"], lean), daemon=True
            )
            worker.start()
            procs.append(worker)
            endpoints[name] = front
        time.sleep(0.3)
        server, endpoints["inferpool"] = start_inferpool(tmp, layout)
        try:
            yield {**endpoints, **KSERVE}
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(60)
    finally:
        for p in procs:
            p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def relay_systems(endpoints: dict[str, str]) -> dict[str, tuple[Any, str]]:
    return {
        "relay": (functools.partial(relay_client, lean=False), endpoints["relay"]),
        "lean": (functools.partial(relay_client, lean=True), endpoints["lean"]),
    }


def run_layout(
    name: str, layout: dict[str, int], sizes: list[tuple[str, int]], clients_list: list[int]
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with started(layout) as endpoints:
        systems = {
            **relay_systems(endpoints),
            "inferpool": (inferpool_client, endpoints["inferpool"]),
        }
        for label, nbytes in sizes:
            for clients in clients_list:
                m = measure(systems, nbytes, clients, layout["client"])
                ours = m["inferpool"]
                rows.append(
                    {
                        "layout": name,
                        "size": label,
                        "bytes": nbytes,
                        "clients": clients,
                        **m,
                        "p50_ratio": ours["p50_us"] / m["relay"]["p50_us"],
                        "rps_ratio": ours["rps"] / m["relay"]["rps"],
                        "p50_ratio_lean": ours["p50_us"] / m["lean"]["p50_us"],
                        "rps_ratio_lean": ours["rps"] / m["lean"]["rps"],
                    }
                )
                print_row(rows[-1])
    return rows


HEADER = (
    f"{'layout':6} {'size':>7} {'cl':>2} | {'relay p50':>9} {'req/s':>6} | "
    f"{'lean p50':>9} {'req/s':>6} | {'inferpool p50':>13} {'p99':>8} {'req/s':>6} | "
    f"{'p50 x':>5} {'rps x':>5} | {'x lean':>6} {'rps x':>5}"
)


def print_row(r: dict[str, Any]) -> None:
    a, lean, b = r["relay"], r["lean"], r["inferpool"]
    print(
        f"{r['layout']:6} {r['size']:>7} {r['clients']:>2} | "
        f"{a['p50_us']:7.0f}us {a['rps']:6.0f} | {lean['p50_us']:7.0f}us {lean['rps']:6.0f} | "
        f"{b['p50_us']:11.0f}us {b['p99_us']:6.0f}us {b['rps']:6.0f} | "
        f"{r['p50_ratio']:5.2f} {r['rps_ratio']:5.2f} | "
        f"{r['p50_ratio_lean']:6.2f} {r['rps_ratio_lean']:5.2f}",
        flush=True,
    )


# ============================================================================ the shm client
def shm_client(
    endpoint: str,
    nbytes: int,
    iterations: int,
    cpu: int,
    start: Any,
    out: Any,
    lane_spin_us: int | None = None,
    pinned: bool = True,
) -> None:
    """Inputs written in place once; each round trip reads the output as a handle (a view).
    ``lane_spin_us``: through a lane to the ``lane`` model, spinning that long (None: the
    broker path to the ``bench`` model); ``pinned``: on ``cpu`` (else wherever the
    scheduler puts it).  A lane client says how its waits went and where it ran."""
    if pinned:
        pin(cpu)
    lane = lane_spin_us is not None
    seen: set[int] = set()
    with ShmClient(
        endpoint,
        timeout=60,
        input_bytes=nbytes + (1 << 20),
        lane=lane,
        lane_spin_us=lane_spin_us or 0,
    ) as c:
        req = c.request("lane" if lane else "bench", outputs=["OUTPUT0"])
        x = req.input("INPUT0", (nbytes,) if lane else (1, nbytes), np.uint8)
        x[:] = np.arange(nbytes, dtype=np.uint64).astype(np.uint8).reshape(x.shape)
        with c.run(req) as result:  # the identity really answers with the input, in place
            if not np.array_equal(result["OUTPUT0"][..., -4096:], x[..., -4096:]):
                raise SystemExit("shm client: the output differs from the input")
        if lane and not c.session.lanes.lanes:
            raise SystemExit("shm client: no lane was granted")
        for _ in range(warmups(iterations)):
            with c.run(req) as result:
                result["OUTPUT0"]
        start.wait()
        lat = []
        lanes = list(c.session.lanes.lanes.values())
        before = [(la.responses.spun, la.responses.slept) for la in lanes]
        t0 = time.perf_counter()
        for i in range(iterations):
            t = time.perf_counter()
            with c.run(req) as result:
                result["OUTPUT0"]
            lat.append(time.perf_counter() - t)
            if i & 63 == 0:
                seen.add(cores.current())
        t1 = time.perf_counter()
    if not lane:
        out.put((t0, t1, lat))
        return
    spun = sum(la.responses.spun - b[0] for la, b in zip(lanes, before, strict=True))
    slept = sum(la.responses.slept - b[1] for la, b in zip(lanes, before, strict=True))
    out.put((t0, t1, lat, {"spun": spun, "slept": slept, "cores": sorted(seen)}))


def lane_systems(endpoint: str) -> dict[str, tuple[Any, str]]:
    """The lane, spinning (``bench_lanes.SPIN_US``) and not, and spinning in a client
    nobody pinned."""
    spin = functools.partial(shm_client, lane_spin_us=bench_lanes.SPIN_US)
    return {
        "lane spin": (spin, endpoint),
        "lane sleep": (functools.partial(shm_client, lane_spin_us=0), endpoint),
        "lane unpinned": (functools.partial(spin, pinned=False), endpoint),
    }


def copy_p50_us(nbytes: int, cpu: int) -> dict[str, float]:
    """p50 of one numpy copy of ``nbytes``: between shared-memory regions (what the identity
    backend's copy is: 4 KiB pages) and between private arrays (transparent huge pages)."""
    pin(cpu)
    iterations = max(5, ITERATIONS[nbytes])

    def p50(dst: np.ndarray, src: np.ndarray) -> float:
        np.copyto(dst, src)  # faults every page in before timing
        lat = []
        for _ in range(iterations):
            t = time.perf_counter()
            np.copyto(dst, src)
            lat.append(time.perf_counter() - t)
        return float(np.percentile(np.array(lat) * 1e6, 50))

    src, dst = (Region.create(f"ipb-{os.getpid()}-copy{i}", nbytes) for i in range(2))
    try:
        a, b = (np.frombuffer(r.buf, np.uint8, nbytes) for r in (src, dst))
        shared = p50(b, a)
        del a, b
    finally:
        src.destroy()
        dst.destroy()
    return {"shm": shared, "private": p50(np.zeros(nbytes, np.uint8), np.ones(nbytes, np.uint8))}


def run_shm_layout(
    name: str, layout: dict[str, int], sizes: list[tuple[str, int]]
) -> list[dict[str, Any]]:
    """The shm client at every size next to the copy of that size and the 64 B relay."""
    rows: list[dict[str, Any]] = []
    with started(layout) as endpoints:
        relays = measure(relay_systems(endpoints), 64, 1, layout["client"])
        relay = relays["relay"]
        for label, nbytes in sizes:
            shm = measure(
                {"shm": (shm_client, endpoints["inferpool"])}, nbytes, 1, layout["client"]
            )["shm"]
            rows.append(
                {
                    "layout": name,
                    "size": label,
                    "bytes": nbytes,
                    "shm": shm,
                    "copy_us": copy_p50_us(nbytes, layout["worker"]),
                    "relay_64B": relay,
                    "lean_relay_64B": relays["lean"],
                }
            )
    base = rows[0]["shm"]["p50_us"]
    for r in rows:
        r["bound_us"] = base + 1.5 * r["copy_us"]["shm"]
        r["within_bound"] = r["shm"]["p50_us"] <= r["bound_us"]
        r["p50_over_relay"] = r["shm"]["p50_us"] / relay["p50_us"]
        r["p50_over_lean_relay"] = r["shm"]["p50_us"] / relays["lean"]["p50_us"]
        print_shm_row(r)
    return rows


SHM_HEADER = (
    f"{'layout':6} {'size':>7} | {'shm p50':>10} {'p99':>9} | {'copy shm':>9} {'private':>9} | "
    f"{'bound':>10} {'ok':>3} | {'x relay 64 B p50':>16} {'x lean relay':>20}"
)


def print_shm_row(r: dict[str, Any]) -> None:
    s = r["shm"]
    ok = "yes" if r["within_bound"] else "NO"
    print(
        f"{r['layout']:6} {r['size']:>7} | {s['p50_us']:8.0f}us {s['p99_us']:7.0f}us | "
        f"{r['copy_us']['shm']:7.0f}us {r['copy_us']['private']:7.0f}us | "
        f"{r['bound_us']:8.0f}us {ok:>3}"
        f" | {r['p50_over_relay']:6.2f} (relay {r['relay_64B']['p50_us']:.0f}us)"
        f" {r['p50_over_lean_relay']:6.2f} (lean {r['lean_relay_64B']['p50_us']:.0f}us)",
        flush=True,
    )


# ============================================================================ KServe frontends
KSERVE_SHM_SIZES = [("1 MiB", 1 << 20), ("64 MiB", 64 << 20)]
KSERVE_GOALS = {"64 B": 1.5, "1 MiB": 2.0, "16 MiB": 2.0, "64 MiB": 2.0}  # p50 x zmq, at most
MANY_GOAL = 0.7  # 8 tritonclient processes' req/s over 8 zmq Clients', at least
SHM_GOAL = 1.2  # Triton's shared-memory extension's p50 over ShmClient's, at most


def run_kserve_layout(
    name: str, layout: dict[str, int], sizes: list[tuple[str, int]]
) -> dict[str, Any]:
    """tritonclient over HTTP and gRPC next to the zmq client, the relay and the same code
    against servers that only echo, same server, at every size; 8 client processes of each
    at 64 B; the zmq client at 64 B beside tritonclient's 64 MiB requests; Triton's system
    shared memory through both frontends next to ShmClient; the CPU each process spends per
    request."""
    cpu = layout["client"]
    load = os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    with started(layout) as endpoints, bench_kserve.echo_servers(layout["broker"]) as echo:
        procs = bench_kserve.server_processes(SERVER["pid"])
        tc = bench_kserve.kserve_client
        systems = {
            "relay": (functools.partial(relay_client, lean=False), endpoints["relay"]),
            "zmq": (inferpool_client, endpoints["inferpool"]),
            "http": (functools.partial(tc, "http"), endpoints["http"]),
            "grpc": (functools.partial(tc, "grpc"), endpoints["grpc"]),
            "http echo": (functools.partial(tc, "http"), echo["http"]),
            "grpc echo": (functools.partial(tc, "grpc"), echo["grpc"]),
        }
        for label, nbytes in sizes:
            m = measure(systems, nbytes, 1, cpu, procs)
            row: dict[str, Any] = {"layout": name, "size": label, "bytes": nbytes, **m}
            zmq_p50 = m["zmq"]["p50_us"]
            for protocol in ("http", "grpc"):
                row[f"{protocol}_over_zmq"] = m[protocol]["p50_us"] / zmq_p50
                row[f"{protocol}_echo_over_zmq"] = m[f"{protocol} echo"]["p50_us"] / zmq_p50
                row[f"{protocol}_client_over_zmq"] = m[protocol]["client_cpu_us"] / zmq_p50
            rows.append(row)
            print_kserve_row(row)
        many = measure({k: systems[k] for k in ("zmq", "http", "grpc")}, 64, MANY, cpu)
        with bench_kserve.bulk_http(endpoints["http"], 64 << 20, cpu):
            beside = measure({"zmq": systems["zmq"]}, 64, 1, cpu)["zmq"]
        shm_rows = []
        for label, nbytes in KSERVE_SHM_SIZES:
            shm = measure(
                {
                    "shm": (shm_client, endpoints["inferpool"]),
                    "http shm": (
                        functools.partial(bench_kserve.triton_shm_client, "http"),
                        endpoints["http"],
                    ),
                    "grpc shm": (
                        functools.partial(bench_kserve.triton_shm_client, "grpc"),
                        endpoints["grpc"],
                    ),
                },
                nbytes,
                1,
                cpu,
            )
            shm_rows.append({"size": label, "bytes": nbytes, **shm})
    result = {
        "layout": name,
        "load": [load, os.getloadavg()[0]],
        "rows": rows,
        "many": many,
        "beside_bulk": beside,
        "shm": shm_rows,
    }
    print_kserve_goals(result)
    return result


KSERVE_HEADER = (
    f"{'layout':6} {'size':>7} | {'relay p50':>9} | {'zmq p50':>8} | {'http p50':>8} {'x zmq':>5} "
    f"{'echo x':>6} | {'grpc p50':>8} {'x zmq':>5} {'echo x':>6} | CPU us per request "
    "(client/broker/frontends/workers): zmq; http; grpc"
)


def _cpu_text(x: dict[str, Any]) -> str:
    c = {"client": x.get("client_cpu_us", 0), **x.get("cpu_us", {})}
    return "/".join(f"{c.get(g, 0):.0f}" for g in ("client", "broker", "frontends", "workers"))


def print_kserve_row(r: dict[str, Any]) -> None:
    print(
        f"{r['layout']:6} {r['size']:>7} | {r['relay']['p50_us']:7.0f}us | "
        f"{r['zmq']['p50_us']:6.0f}us | "
        f"{r['http']['p50_us']:6.0f}us {r['http_over_zmq']:5.2f} {r['http_echo_over_zmq']:6.2f} | "
        f"{r['grpc']['p50_us']:6.0f}us {r['grpc_over_zmq']:5.2f} {r['grpc_echo_over_zmq']:6.2f} | "
        f"{_cpu_text(r['zmq'])}; {_cpu_text(r['http'])}; {_cpu_text(r['grpc'])}",
        flush=True,
    )


def print_kserve_goals(result: dict[str, Any]) -> None:
    """Every goal's ratio, met or not, with the load average before and after."""
    load = result["load"]
    print(f"{result['layout']:6} goals (load average {load[0]:.2f} -> {load[1]:.2f}):")
    for r in result["rows"]:
        goal = KSERVE_GOALS[r["size"]]
        for protocol in ("http", "grpc"):
            ratio = r[f"{protocol}_over_zmq"]
            print(
                f"  {r['size']:>7} {protocol:4} p50 / zmq p50 {ratio:5.2f} (<= {goal}: "
                f"{'yes' if ratio <= goal else 'NO'}; tritonclient's own CPU per request "
                f"alone: {r[f'{protocol}_client_over_zmq']:.2f} x zmq p50; against an echo "
                f"server: {r[f'{protocol}_echo_over_zmq']:.2f})"
            )
    many = result["many"]
    for protocol in ("http", "grpc"):
        ratio = many[protocol]["rps"] / many["zmq"]["rps"]
        print(
            f"  {MANY} x {protocol:4} 64 B: {many[protocol]['rps']:.0f} req/s / {MANY} zmq "
            f"Clients' {many['zmq']['rps']:.0f} = {ratio:.2f} (>= {MANY_GOAL}: "
            f"{'yes' if ratio >= MANY_GOAL else 'NO'})"
        )
    beside = result["beside_bulk"]
    alone = [r["zmq"] for r in result["rows"] if r["bytes"] == 64]  # (not with --sizes)
    print(
        f"  zmq Client 64 B beside tritonclient.http sending 64 MiB requests: p50 "
        f"{beside['p50_us']:.0f}us p99 {beside['p99_us']:.0f}us {beside['rps']:.0f} req/s"
        + "".join(
            f" (alone: p50 {a['p50_us']:.0f}us p99 {a['p99_us']:.0f}us {a['rps']:.0f} req/s)"
            for a in alone
        )
    )
    for r in result["shm"]:
        for protocol in ("http", "grpc"):
            ratio = r[f"{protocol} shm"]["p50_us"] / r["shm"]["p50_us"]
            print(
                f"  {r['size']:>7} Triton system shm over {protocol:4}: p50 "
                f"{r[f'{protocol} shm']['p50_us']:.0f}us / ShmClient {r['shm']['p50_us']:.0f}us "
                f"= {ratio:.2f} (<= {SHM_GOAL}: {'yes' if ratio <= SHM_GOAL else 'NO'})"
            )


# ============================================================================ tracing
def with_tracing(level: list[str], server: str, target: Any, endpoint: str, *args: Any) -> None:
    """``target``'s chunk with the server's trace level set to ``level`` first (over the
    zmq endpoint ``server``)."""
    with Client(server, timeout=60) as c:
        c.call("trace_setting", settings={"trace_level": level})
    target(endpoint, *args)


def run_trace_layout(name: str, layout: dict[str, int]) -> dict[str, Any]:
    """The zmq client and tritonclient.http at 64 B, tracing off and on, in one run."""
    with started(layout) as endpoints:
        server = endpoints["inferpool"]
        systems: dict[str, tuple[Any, str]] = {"relay": relay_systems(endpoints)["relay"]}
        for label, client, endpoint in (
            ("zmq", inferpool_client, server),
            ("http", functools.partial(bench_kserve.kserve_client, "http"), endpoints["http"]),
        ):
            for state, level in (("off", ["OFF"]), ("on", ["TIMESTAMPS"])):
                target = functools.partial(with_tracing, level, server, client)
                systems[f"{label} {state}"] = (target, endpoint)
        m = measure(systems, 64, 1, layout["client"])
    row = {"layout": name, "load": os.getloadavg()[0], **m}
    relay = m["relay"]["p50_us"]
    parts = [f"{name:6} load {row['load']:.2f} | relay p50 {relay:.0f}us"]
    for label in ("zmq", "http"):
        off, on = m[f"{label} off"]["p50_us"], m[f"{label} on"]["p50_us"]
        row[f"{label}_on_over_off"] = on / off
        parts.append(
            f"{label}: off {off:.0f}us ({off / relay:.2f} x relay), on {on:.0f}us "
            f"({on / off:.2f} x off)"
        )
    print(" | ".join(parts), flush=True)
    return row


# ============================================================================ lanes
def run_lane_layout(name: str, layout: dict[str, int], quick: bool) -> dict[str, Any]:
    """The lanes at 64 B (spinning pinned and not, and asleep) beside both relays, 8 lane
    clients beside 8 zmq Clients, the large sizes against the copy bound, the idle cost,
    and the floors, all pinned as ``layout`` says (but the unpinned lane client)."""
    floors = bench_lanes.floors(layout, quick)
    load = os.getloadavg()[0]
    with started(layout) as endpoints:
        ep = endpoints["inferpool"]
        lanes = lane_systems(ep)
        small = measure({**relay_systems(endpoints), **lanes}, 64, 1, layout["client"])
        many = measure(
            {
                "zmq": (inferpool_client, ep),
                "lane spin": lanes["lane spin"],
                "lane unpinned": lanes["lane unpinned"],
            },
            64,
            MANY,
            layout["client"],
        )
        sizes: list[dict[str, Any]] = []
        for label, nbytes in SIZES[1:] if not quick else SIZES[1:2]:
            if nbytes > 64 << 20:
                continue
            big = measure({"lane spin": lanes["lane spin"]}, nbytes, 1, layout["client"])
            sizes.append(
                {
                    "size": label,
                    "bytes": nbytes,
                    "lane": big["lane spin"],
                    "copy_us": copy_p50_us(nbytes, layout["worker"]),
                }
            )
        idle = bench_lanes.idle_lane(ep, layout["client"], 3.0 if quick else bench_lanes.IDLE_S)
    spin, sleep = small["lane spin"], small["lane sleep"]
    for row in sizes:
        row["bound_us"] = spin["p50_us"] + 1.5 * row["copy_us"]["shm"]
        row["within_bound"] = row["lane"]["p50_us"] <= row["bound_us"]
    row = {
        "layout": name,
        "load": [load, os.getloadavg()[0]],
        "floors": floors,
        "small": small,
        "many": many,
        "sizes": sizes,
        "idle": idle,
        "spin_x_floor": spin["p50_us"] / floors["spin"]["p50_us"],
        "bound_x_floor": floors["bound"]["p50_us"] / floors["spin"]["p50_us"],
        "spin_x_bound": spin["p50_us"] / floors["bound"]["p50_us"],
        "unpinned_x_pinned": small["lane unpinned"]["p50_us"] / spin["p50_us"],
        "relay_over_spin": small["relay"]["p50_us"] / spin["p50_us"],
        "sleep_x_sem": sleep["p50_us"] / floors["sem"]["p50_us"],
        "many_x_zmq": many["lane spin"]["rps"] / many["zmq"]["rps"],
        "many_unpinned_x_zmq": many["lane unpinned"]["rps"] / many["zmq"]["rps"],
    }
    print_lane_row(row)
    return row


MANY = 8  # client processes in the lanes' throughput row


def waits_text(x: dict[str, Any]) -> str:
    """How a lane client's waits went, and the cores it ran on."""
    w = x.get("waits")
    if not w:
        return ""
    return f"; waits spun {w['spun']}, slept {w['slept']}; client on core(s) {w['cores']}"


def print_lane_row(r: dict[str, Any]) -> None:
    f, s, m = r["floors"], r["small"], r["many"]
    print(
        f"{r['layout']:6} load average {r['load'][0]:.2f} -> {r['load'][1]:.2f}; floors: spin "
        f"hand-off p50 {f['spin']['p50_us']:.1f}us, semaphore ping-pong p50 "
        f"{f['sem']['p50_us']:.1f}us; relay p50 {s['relay']['p50_us']:.0f}us, lean relay "
        f"{s['lean']['p50_us']:.0f}us"
    )
    print(
        f"{r['layout']:6} lane bound (the least Python a lane round trip needs): p50 "
        f"{f['bound']['p50_us']:.1f}us = {r['bound_x_floor']:.2f} x the spin floor"
    )
    for key in ("lane spin", "lane unpinned", "lane sleep"):
        x = s[key]
        print(
            f"{r['layout']:6}   {key:13} 64 B: p50 {x['p50_us']:7.1f}us p99 {x['p99_us']:7.1f}us "
            f"{x['rps']:7.0f} req/s{waits_text(x)}"
        )
    for key in ("zmq", "lane spin", "lane unpinned"):
        x = m[key]
        print(
            f"{r['layout']:6}   {MANY} x {key:13} 64 B: p50 {x['p50_us']:7.1f}us "
            f"{x['rps']:7.0f} req/s{waits_text(x)}"
        )
    print(
        f"{r['layout']:6}   goals: lane spin / bound {r['spin_x_bound']:.2f} (<= 3); unpinned / "
        f"pinned {r['unpinned_x_pinned']:.2f} (<= 1.5); lane sleep / semaphore floor "
        f"{r['sleep_x_sem']:.2f} (<= 3); pinned {s['lane spin']['rps']:.0f} req/s (>= 30000); "
        f"{MANY} lanes / {MANY} zmq Clients req/s {r['many_x_zmq']:.2f} (>= 3; unpinned "
        f"{r['many_unpinned_x_zmq']:.2f})"
    )
    print(
        f"{r['layout']:6}   (issue 10's: lane spin / spin floor {r['spin_x_floor']:.2f}, relay / "
        f"lane spin {r['relay_over_spin']:.1f})"
    )
    for z in r["sizes"]:
        ok = "yes" if z["within_bound"] else "NO"
        print(
            f"{r['layout']:6}   lane spin {z['size']:>7}: p50 {z['lane']['p50_us']:8.0f}us, copy "
            f"{z['copy_us']['shm']:7.0f}us, bound {z['bound_us']:8.0f}us: {ok}"
        )
    i = r["idle"]
    print(
        f"{r['layout']:6}   idle lane: client {i['client_pct']:.3f}% and worker "
        f"{i['worker_pct']:.3f}% of a core (goal < 1%)",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layout", choices=[*LAYOUTS, "both"], default="both")
    parser.add_argument(
        "--quick", action="store_true", help="64 B and 1 MiB only, fewer iterations"
    )
    parser.add_argument(
        "--part", choices=["frames", "shm", "kserve", "lanes", "trace", "all"], default="all"
    )
    parser.add_argument("--json", default="bench-latency.json")
    parser.add_argument(
        "--sizes",
        nargs="+",
        choices=[label.replace(" ", "") for label, _ in SIZES],
        help="only these sizes (the frames and kserve parts), e.g. --sizes 16MiB 64MiB",
    )
    args = parser.parse_args()
    sizes = SIZES[:2] if args.quick else SIZES
    if args.sizes:
        sizes = [(label, n) for label, n in SIZES if label.replace(" ", "") in args.sizes]
    shm_sizes = SHM_SIZES[:2] if args.quick else SHM_SIZES
    if args.quick:
        for k in ITERATIONS:
            ITERATIONS[k] = max(10, ITERATIONS[k] // 5)
    layouts = list(LAYOUTS) if args.layout == "both" else [args.layout]
    print(
        f"cores: {sorted(os.sched_getaffinity(0))}; layouts: "
        + "; ".join(
            f"{n}: client/broker/worker on cpu {LAYOUTS[n]['client']}/{LAYOUTS[n]['broker']}/"
            f"{LAYOUTS[n]['worker']}"
            for n in layouts
        )
    )
    rows: list[dict[str, Any]] = []
    shm_rows: list[dict[str, Any]] = []
    if args.part in ("frames", "all"):
        print(
            "p50 x / rps x = inferpool p50 / req/s over the relay's; x lean: the same over the "
            "lean relay (goals, 64 B on one core: p50 <= 1.2 x relay and <= 1.5 x lean; "
            "4 clients: req/s >= 0.8 x lean)"
        )
        print(HEADER)
        rows = [r for name in layouts for r in run_layout(name, LAYOUTS[name], sizes, [1, 4])]
    if args.part in ("shm", "all"):
        print(
            "shm client: bound = p50(64 B) + 1.5 x copy shm(size), a numpy copy between "
            "shared-memory regions like the identity backend's (goal: every size within); "
            "x relay = p50 / relay p50 at 64 B (goal <= 1.2 for 64 B)"
        )
        print(SHM_HEADER)
        shm_rows = [r for name in layouts for r in run_shm_layout(name, LAYOUTS[name], shm_sizes)]
    kserve_rows: list[dict[str, Any]] = []
    if args.part in ("kserve", "all"):
        print(
            "KServe frontends: tritonclient (binary tensors) through the same server as the zmq "
            "client; x zmq = p50 / zmq p50; echo x = the same client against a server that "
            "only echoes, over zmq p50"
        )
        print(KSERVE_HEADER)
        kserve_rows = [run_kserve_layout(name, LAYOUTS[name], sizes) for name in layouts]
    trace_rows: list[dict[str, Any]] = []
    if args.part in ("trace", "all"):
        print("tracing: 64 B, p50 off over the relay's, p50 on (every request traced) over off")
        trace_rows = [run_trace_layout(name, LAYOUTS[name]) for name in layouts]
    lane_rows: list[dict[str, Any]] = []
    if args.part in ("lanes", "all"):
        print("lanes: ShmClient(lane=True) to the identity model, the floors beside them")
        lane_rows = [run_lane_layout(name, LAYOUTS[name], args.quick) for name in layouts]
    Path(args.json).write_text(
        json.dumps(
            {
                "rows": rows,
                "shm_rows": shm_rows,
                "kserve_rows": kserve_rows,
                "lane_rows": lane_rows,
                "trace_rows": trace_rows,
                "cores": sorted(os.sched_getaffinity(0)),
            },
            indent=1,
        )
    )
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
