"""A served model measured over a window: ``bench_models.py``'s server and clients.

:class:`Server` is an ``inferpool serve`` with two entries of one model file, ``plain`` (no
batching) and ``batched`` (``dynamic_batching``, ``max_batch_size`` 32), its broker on the
client cores and its instances on their own cores (a host policy).  :func:`served` runs
``clients`` threads, each with its own ``Client``, ``ShmClient`` or lane, calling back to back,
and measures a window after a warm-up: the latencies of the calls that end in it, the rate,
the server's statistics over it (queue, compute input / infer / output per request, the
batches formed, the share of the window the instance computed) and the CPU time each side
spent in it (this process's clients, the broker, the processes pinned to the instance's
cores).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from bench_torch import stop_server
from real_models import MODELS, ModelSpec

from inferpool.client import Client, ShmClient
from inferpool.wire.errors import InferpoolError

MAX_BATCH = 32
DELAY = "max_queue_delay_microseconds: 5000"
CONFIG = """name: "{name}" {platform} max_batch_size: {max_batch}
input [ {{ name: "INPUT__0" data_type: {input} }} ]
output [ {{ name: "OUTPUT__0" data_type: {output} }} ]
instance_group [ {{ count: 1 kind: KIND_CPU host_policy: "bench" }} ]
{batching}
"""
PLATFORMS = {
    "onnxruntime": 'platform: "onnxruntime_onnx"',
    "openvino": 'backend: "openvino" default_model_filename: "model.onnx"',
    "pytorch": 'platform: "pytorch_libtorch"',
}
NEEDS = {"onnxruntime": "onnxruntime", "openvino": "openvino"}  # backend -> its module
EXTRAS = {"onnxruntime": "'inferpool[onnx]'", "openvino": "'inferpool[openvino]'"}


def check_choices(parser: argparse.ArgumentParser, models: str, backends: str) -> None:
    """``--models`` and ``--backends``: known names, each backend's runtime installed."""
    for name in models.split(","):
        if name not in MODELS:
            parser.error(f"--models: unknown model '{name}' (choose from {', '.join(MODELS)})")
    for backend in backends.split(","):
        if backend not in PLATFORMS:
            parser.error(f"--backends: unknown backend '{backend}' ({', '.join(PLATFORMS)})")
        module = NEEDS.get(backend)
        if module and importlib.util.find_spec(module) is None:
            parser.error(f"--backends {backend} needs {module}: pip install {EXTRAS[module]}")


# ----------------------------------------------------------------------------- the server
class Server:
    """``inferpool serve`` with ``plain`` and ``batched``, its broker on ``client_cores``
    and the instances on ``instance_cores``; stopped with ``stack``."""

    def __init__(self, model: ModelSpec, backend: str, source: Path, cores: list[int],
                 client_cores: list[int], preferred: int,
                 stack: contextlib.ExitStack) -> None:  # fmt: skip
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ipb-", dir="/tmp")))
        sizes = f"preferred_batch_size: [ {preferred} ] " if preferred > 0 else ""
        for name, max_batch, batching in (
            ("plain", 1, ""),  # batch 1 at most: no backend's auto-complete adds batching
            ("batched", MAX_BATCH, f"dynamic_batching {{ {sizes}{DELAY} }}"),
        ):
            (tmp / "repo" / name / "1").mkdir(parents=True)
            (tmp / "repo" / name / "1" / source.name).symlink_to(source)
            (tmp / "repo" / name / "config.pbtxt").write_text(CONFIG.format(
                name=name, platform=PLATFORMS[backend], input=model.input_type,
                output=model.output_type, batching=batching, max_batch=max_batch,
            ))  # fmt: skip
        self.endpoint = f"ipc://{tmp}/broker.sock"
        cmd = [sys.executable, "-m", "inferpool", "serve", "--model-repository", f"{tmp}/repo"]
        cmd += ["--http-port", "0", "--grpc-port", "0", "--allow-metrics", "false"]
        cmd += ["--listen", self.endpoint, "--log-level", "WARNING", "--arena-size", "512M"]
        cmd += ["--output-arena-size", "512M", f"--host-policy=bench,cpu-cores={cpus_text(cores)}"]
        proc = subprocess.Popen(
            cmd,
            start_new_session=True,
            stdout=open(f"{tmp}/server.log", "wb"),  # noqa: SIM115 (the child holds it)
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: os.sched_setaffinity(0, client_cores),
        )
        stack.callback(stop_server, proc)
        self.broker = psutil.Process(proc.pid)
        self.cores = set(cores)
        self.client = stack.enter_context(Client(self.endpoint, timeout=600))
        self._wait_ready(proc, f"{tmp}/server.log")

    def _wait_ready(self, proc: subprocess.Popen[bytes], log: str) -> None:
        deadline = time.monotonic() + 600
        while True:
            try:
                self.client.wait_ready(5)
                return
            except InferpoolError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = Path(log).read_text(errors="replace").strip().splitlines()[-5:]
                    raise SystemExit(
                        "the server did not get ready: " + " / ".join(tail or ["(no log)"])
                    ) from None

    def snapshot(self, entry: str) -> Snapshot:
        """The entry's statistics and each side's CPU time, now."""
        stats: dict[str, Any] = self.client.statistics(entry)["model_stats"][0]
        broker = self.broker.cpu_times()
        instance = 0.0
        for p in self.broker.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if set(p.cpu_affinity() or ()) == self.cores:
                    times = p.cpu_times()
                    instance += times.user + times.system
        return Snapshot(
            time.perf_counter(), stats, time.process_time(), broker.user + broker.system, instance
        )


def cpus_text(cores: list[int]) -> str:
    return ",".join(map(str, cores))


@dataclass(frozen=True)
class Snapshot:
    at: float
    stats: dict[str, Any]
    clients_cpu: float
    broker_cpu: float
    instance_cpu: float


# ----------------------------------------------------------------------------- served runs
@dataclass
class Window:
    """What one served run measured over its window."""

    latencies: list[float]
    rate: float
    stats: str  # queue / input / infer / output ms per request
    formed: dict[int, int]  # batch size -> batches
    busy: float  # share of the window the instance computed
    compute_ns: int  # the instance's compute over the window
    instance_cpu: float  # seconds of CPU the instance's processes spent over the window
    cpu: str  # ms per request: clients / broker / instance


def _caller(kind: str, endpoint: str, entry: str, x: np.ndarray,
            stack: contextlib.ExitStack) -> Callable[[], Any]:  # fmt: skip
    """One client's call of ``entry``: ``Client``, ``ShmClient`` or ``lane``."""
    if kind == "Client":
        client = stack.enter_context(Client(endpoint, timeout=600))
        return lambda: client.infer(entry, {"INPUT__0": x})
    room = max(1 << 20, 2 * x.nbytes)
    shm = stack.enter_context(ShmClient(endpoint, timeout=600, input_bytes=room))
    if kind == "lane":
        shm.lane(entry)
    req = shm.request(entry, outputs=["OUTPUT__0"])
    req.input("INPUT__0", x.shape, x.dtype)[:] = x

    def call() -> None:
        with shm.run(req) as result:
            result["OUTPUT__0"]

    return call


def served(server: Server, entry: str, kind: str, clients: int, x: np.ndarray,
           warm: float, seconds: float) -> Window:  # fmt: skip
    """``clients`` threads calling ``entry`` back to back; measured over ``seconds`` after
    ``warm`` seconds (only calls that end inside the window count)."""
    done: list[tuple[float, float]] = []
    lock = threading.Lock()
    stop = threading.Event()
    barrier = threading.Barrier(clients + 1)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            with contextlib.ExitStack() as stack:
                call = _caller(kind, server.endpoint, entry, x, stack)
                call()
                barrier.wait()
                mine = []
                while not stop.is_set():
                    start = time.perf_counter()
                    call()
                    end = time.perf_counter()
                    mine.append((end, end - start))
                with lock:
                    done.extend(mine)
        except BaseException as exc:  # reported below, not lost in a thread
            failed.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run) for _ in range(clients)]
    for t in threads:
        t.start()
    try:
        barrier.wait()
        time.sleep(warm)
        before = server.snapshot(entry)
        time.sleep(seconds)
        after = server.snapshot(entry)
    finally:
        stop.set()
        for t in threads:
            t.join()
    if failed:
        raise failed[0]
    latencies = [d for end, d in done if before.at <= end <= after.at]
    return _window(before, after, latencies)


def _window(before: Snapshot, after: Snapshot, latencies: list[float]) -> Window:
    span = after.at - before.at
    a, b = after.stats, before.stats
    n = a["inference_count"] - b["inference_count"] or 1
    parts = []
    for key in ("queue", "compute_input", "compute_infer", "compute_output"):
        ns = a["inference_stats"][key]["ns"] - b["inference_stats"][key]["ns"]
        parts.append(f"{ns / n / 1e6:.1f}")
    earlier = {s["batch_size"]: s for s in b["batch_stats"]}
    formed, compute = {}, 0
    for s in a["batch_stats"]:
        old = earlier.get(s["batch_size"])
        count = s["compute_infer"]["count"] - (old["compute_infer"]["count"] if old else 0)
        if count:
            formed[s["batch_size"]] = count
        for key in ("compute_input", "compute_infer", "compute_output"):
            compute += s[key]["ns"] - (old[key]["ns"] if old else 0)
    per = 1e3 / max(len(latencies), 1)
    cpu = (
        f"{(after.clients_cpu - before.clients_cpu) * per:.1f} / "
        f"{(after.broker_cpu - before.broker_cpu) * per:.1f} / "
        f"{(after.instance_cpu - before.instance_cpu) * per:.1f}"
    )
    busy = compute / 1e9 / span
    instance = after.instance_cpu - before.instance_cpu
    rate = len(latencies) / span
    return Window(latencies, rate, "/".join(parts), formed, busy, compute, instance, cpu)


def pct(samples: list[float], q: float) -> float:
    return float(np.percentile(samples, q)) * 1e3 if samples else float("nan")
