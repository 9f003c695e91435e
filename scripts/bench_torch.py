"""Benchmark the pytorch backend: latency per path, and memory with ENABLE_WEIGHT_SHARING.

    python scripts/bench_torch.py [--iters 2000] [--rounds 40] [--instances 4] [--weights-mb 64]

Latency: a small MLP at batch 1 and 32, timed in one run along each *path* in ``PATHS``:
``torch`` calls the TorchScript module in a loop (the baseline), ``backend`` runs the same
model through the pytorch backend in-process (the lifecycle host of ``BackendHarness``, each
call made as a worker makes it: a request over read-only input memory, request checks, batch
assembly, outputs written into response memory and read in place), ``inferpool`` sends it to
a real ``inferpool serve`` with the zmq ``Client`` (one request at a time), ``lane`` to
another through a lane (``ShmClient(lane=True)``: the input copied into the client's region,
the output read in place; while the lane is timed this process moves to cores that server's
worker is not pinned to, so that both sides may spin).  From the statistics counted while a
path is timed, each request's time is split into the backend's input, the model, the
backend's output and what lies around them (the hops, for a server).  A path is a callable
made from the model repository and an ExitStack (for its clean-up): ``infer(x) -> output``.
The paths are timed in alternating rounds (``--rounds`` chunks each, the order rotating), so
that load coming and going on a shared machine weighs on all alike; p50 ratios against
``torch`` are printed last, with the load average: compare within one run, never across
machines.  With a lane among the paths, the in-process paths (``torch``, ``backend``) run
on the core the lane's worker is pinned to, so that every forward pass compared is made on
one core: on a shared host each core's speed moves in stretches of its own (the batch-1
forward pass runs at 51 us or at 75-90 us for hundreds of calls, one core at a time), and a
baseline timed on the other core compares the two cores, not the paths.  Chunks of 50 calls
(2000 in 40 rounds) keep each path's chunk next to the others' within one such stretch.

Memory: a real ``inferpool serve`` loads the same model as N instances (N workers), with and
without ENABLE_WEIGHT_SHARING, with workers forked from a zygote and started fresh
(``--worker-start``), and the workers' RSS/PSS/USS are read while all are loaded
(:func:`measure_instances`).  Respawn: each instance in turn is SIGKILLed and timed until the
server reports it READY again (a new process serving the model), then it answers a request
(:func:`measure_respawns`); the crash backoff of a first crash is in it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inferpool.backends.api import InputTensor, Request, RequestedOutput, Response, Timestamps
from inferpool.backends.testing import BackendHarness
from inferpool.client import Client, ShmClient
from inferpool.wire.worker.protocol import Durations

Infer = Callable[[np.ndarray], Any]
# How long the lane's client spins for an answer before it sleeps: longer than a forward pass
# of the batches timed here (ShmClient's default, 100 us, is shorter than the batch-1 pass
# plus the backend around it, and a sleeping client pays a wake-up across cores)
LANE_SPIN_US = 2000
MLP_CONFIG = """
name: "mlp"
backend: "pytorch"
max_batch_size: 64
input [{ name: "INPUT__0" data_type: TYPE_FP32 dims: [256] }]
output [{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [16] }]
"""


def save_model(module: torch.nn.Module, repo: Path) -> Path:
    path = repo / "1" / "model.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.save(torch.jit.script(module), str(path))
    return path


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 16),
    ).eval()


# ---------------------------------------------------------------------------- latency paths
def torch_path(repo: Path, stack: contextlib.ExitStack) -> Infer:
    """The baseline: the TorchScript module called directly, as the backend calls it: its
    compiled ``forward`` (no ``nn.Module`` dispatch) under inference mode's C guard (no
    Python context manager around it), the input taken with ``from_numpy``, the output
    read in place (``numpy()``)."""
    forward = torch.jit.load(str(repo / "1" / "model.pt")).forward

    def infer(x: np.ndarray) -> Any:
        with torch._C._InferenceMode(True):
            return forward(torch.from_numpy(x)).numpy()

    return infer


class InProcess:
    """Through the pytorch backend in this process (the real lifecycle host), each call made
    as a worker makes it: a ``Request`` over a read-only view of the input (the caller's
    array, read in place as a worker reads a client's shared memory: writing it there is
    the client's work, and the bare call copies nothing either), the response's output read
    in place and its memory released.  ``stages`` splits the backend's time as its
    statistics report it."""

    def __init__(self, repo: Path, stack: contextlib.ExitStack) -> None:
        harness = BackendHarness("pytorch", MLP_CONFIG, repository_path=str(repo))
        self.host = stack.enter_context(harness).host
        self.memory = harness.memory
        self.wanted = {"OUTPUT__0": RequestedOutput("OUTPUT__0")}
        # (array, its input): a read-only view in one InputTensor, as a worker hands out one
        # for every request naming the same place
        self.viewed: tuple[np.ndarray, InputTensor] | None = None
        self.answers: list[Response | None] = []
        self.stamps: list[Timestamps] = []  # each call's, split into stages after timing

    def _emit(self, request: Request, response: Response | None, final: bool) -> None:
        self.answers.append(response)

    def __call__(self, x: np.ndarray) -> Any:
        if self.viewed is None or self.viewed[0] is not x:
            view = x.view()
            view.flags.writeable = False
            self.viewed = (x, InputTensor("INPUT__0", "FP32", view.shape, view, view.nbytes))
        tensor = self.viewed[1]
        request = Request(
            id="1",
            inputs={"INPUT__0": tensor},
            requested_outputs=self.wanted,
            memory=self.memory,
            emit=self._emit,
        )
        self.host.execute([request])
        timing = self.host.timing_of(request)
        self.host.take_batches()
        response = self.answers.pop()
        assert response is not None and response.error is None and timing is not None
        self.stamps.append(timing.stamps)
        out = response.outputs["OUTPUT__0"]
        value = np.ndarray(out.shape, np.float32, self.memory.read(out.offset))
        response.discard()
        return value

    def stages(self, last: int, p50_us: float) -> str:
        """Where the ``last`` calls' time went: the p50 of each of the backend's stages, as
        its statistics report them, and what the p50 call spent around them."""
        timed = [stamps.durations() for stamps in self.stamps[-last:]]
        p50s = [p50([getattr(d, key) for d in timed]) for key in Durations._fields]
        return (
            f"  p50: input {p50s[0]:.1f} | model {p50s[1]:.1f} | output {p50s[2]:.1f} | "
            f"around the backend {p50_us - sum(p50s):.1f}  (us per request)"
        )


def serve(
    repo: Path, stack: contextlib.ExitStack, *args: str, python: str = sys.executable
) -> Client:
    """A real ``inferpool serve`` over ``repo`` (and ``args``), stopped with ``stack``; its
    ready client.  ``python``: the interpreter (and so the checkout) that serves."""
    endpoint = f"ipc://{repo.parent}/broker.sock"
    cmd = [python, "-m", "inferpool", "serve", "--model-repository", str(repo)]
    cmd += ["--http-port", "0", "--grpc-port", "0", "--allow-metrics", "false"]  # zmq only
    cmd += ["--listen", endpoint, "--log-level", "WARNING", *args]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL)
    stack.callback(stop_server, proc)
    client = stack.enter_context(Client(endpoint, timeout=60))
    client.wait_ready(120)
    return client


def model_repository(model_pt: Path, name: str, config: str, stack: contextlib.ExitStack) -> Path:
    """A temporary repository (removed with ``stack``) holding one model: ``model_pt``."""
    root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ipb-", dir="/tmp")))
    model = root / "repo" / name
    (model / "1").mkdir(parents=True)
    shutil.copy(model_pt, model / "1" / "model.pt")
    (model / "config.pbtxt").write_text(config)
    return root / "repo"


class Served:
    """``infer`` through a real ``inferpool serve`` (one worker, this process's torch threads)."""

    def __init__(self, repo: Path, stack: contextlib.ExitStack, cores: str = "") -> None:
        """``cores``: where the worker is pinned (``--host-policy`` cpu-cores; "": anywhere)."""
        threads = f'{{ string_value: "{torch.get_num_threads()}" }}'
        policy = ' host_policy: "bench"' if cores else ""
        config = (
            f"{MLP_CONFIG}instance_group [{{ count: 1 kind: KIND_CPU{policy} }}]\n"
            f'parameters {{ key: "INTRA_OP_THREAD_COUNT" value: {threads} }}\n'
        )
        served = model_repository(repo / "1" / "model.pt", "mlp", config, stack)
        self.client = serve(
            served, stack, *([f"--host-policy=bench,cpu-cores={cores}"] * bool(cores))
        )

    def __call__(self, x: np.ndarray) -> Any:
        return self.client.infer("mlp", {"INPUT__0": x})["OUTPUT__0"]

    def stats(self) -> dict[str, Any]:
        return dict(self.client.statistics("mlp")["model_stats"][0]["inference_stats"])


class Laned(Served):
    """``infer`` through a lane to the same kind of server: the input written into the
    client's region, the output read in place (and copied out, as the others return it)."""

    def __init__(self, repo: Path, stack: contextlib.ExitStack) -> None:
        cores = sorted(os.sched_getaffinity(0))  # its worker on the last core, where it can
        super().__init__(repo, stack, str(cores[-1]) if len(cores) > 1 else "")
        self.shm = stack.enter_context(
            ShmClient(self.client.endpoint, timeout=60, lane=True, lane_spin_us=LANE_SPIN_US)
        )
        lane = self.shm.lane("mlp")  # raises if the server grants none
        self.worker_cores = os.sched_getaffinity(lane.worker_pid)
        self.requests: dict[int, tuple[Any, np.ndarray]] = {}  # batch -> (request, input)

    @contextlib.contextmanager
    def placed(self) -> Iterator[None]:
        """Moves the process onto cores the worker does not use while the lane is timed, so that
        both sides of it spin (client.lane: a wait spins while its thread runs apart from
        the worker); the other paths run where they ran."""
        mine = os.sched_getaffinity(0)
        if mine - self.worker_cores:
            os.sched_setaffinity(0, mine - self.worker_cores)
        try:
            yield
        finally:
            os.sched_setaffinity(0, mine)

    def __call__(self, x: np.ndarray) -> Any:
        known = self.requests.get(x.shape[0])
        if known is None:
            req = self.shm.request("mlp", outputs=["OUTPUT__0"])
            known = self.requests[x.shape[0]] = (req, req.input("INPUT__0", x.shape, np.float32))
        req, view = known
        np.copyto(view, x)
        with self.shm.run(req) as result:
            return np.array(result["OUTPUT__0"])


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL to its process group if it has not stopped in 30 s."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


Stats = dict[str, dict[str, int]]  # key -> {"count": n, "ns": total}, as inference_stats


def delta(before: Stats, after: Stats, into: Stats) -> None:
    """Add what ``after`` counts beyond ``before`` into ``into``."""
    for key, value in after.items():
        if isinstance(value, dict) and "ns" in value:
            total = into.setdefault(key, {"count": 0, "ns": 0})
            total["count"] += value["count"] - before[key]["count"]
            total["ns"] += value["ns"] - before[key]["ns"]


def breakdown(totals: Stats, mean_us: float) -> str:
    """Where a served request's time goes, from the statistics counted while it was timed
    (means, us): in the backend (its input, the model, its output) and around it."""

    def mean(key: str) -> float:
        total = totals[key]
        return total["ns"] / max(total["count"], 1) / 1e3

    model, served, queue = mean("compute_infer"), mean("success"), mean("queue")
    inputs, outputs = mean("compute_input"), mean("compute_output")
    return (
        f"  mean: input {inputs:.1f} | model {model:.1f} | output {outputs:.1f} | queue "
        f"{queue:.1f} | broker<->worker {served - model - inputs - outputs - queue:.1f} | "
        f"client<->broker {mean_us - served:.1f}  (us per request)"
    )


PATHS: dict[str, Callable[[Path, contextlib.ExitStack], Infer]] = {
    "torch": torch_path,
    "backend": InProcess,
    "inferpool": Served,
    "lane": Laned,
}
IN_PROCESS = ("torch", "backend")  # the paths that run the forward pass in this process


def p50(samples: list[int]) -> float:
    return sorted(samples)[len(samples) // 2] / 1e3


@contextlib.contextmanager
def pinned(cores: set[int]) -> Iterator[None]:
    """Moves the process onto ``cores`` (after a lane's worker there has stopped spinning: it spins
    ``LANE_SPIN_US`` after its last request), then back where it was."""
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    time.sleep(2 * LANE_SPIN_US / 1e6)
    try:
        yield
    finally:
        os.sched_setaffinity(0, mine)


def placement(infer: Infer, cores: set[int] | None) -> contextlib.AbstractContextManager[Any]:
    """Where ``infer`` is timed: its own placement (a lane's), else ``cores`` if given."""
    placed = getattr(infer, "placed", None)
    if placed is not None:
        return placed()
    return pinned(cores) if cores else contextlib.nullcontext()


def time_paths(
    paths: dict[str, Infer],
    batch: int,
    iters: int,
    rounds: int,
    cores: set[int] | None = None,
) -> tuple[dict[str, list[int]], dict[str, Stats]]:
    """Every path timed ``iters`` times in ``rounds`` alternating chunks (the order rotating
    each round), so that load that comes and goes weighs on all alike; the samples (ns) and
    the statistics counted meanwhile, per path.  ``cores``: where the paths without a
    placement of their own run (the in-process ones)."""
    x = np.random.default_rng(0).random((batch, 256), dtype=np.float32)
    for infer in paths.values():
        with placement(infer, cores):
            for _ in range(min(50, iters)):
                infer(x)
    names = list(paths)
    samples: dict[str, list[int]] = {name: [] for name in names}
    totals: dict[str, Stats] = {name: {} for name in names}
    chunk = max(1, iters // rounds)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            infer, got = paths[name], samples[name]
            stats = getattr(infer, "stats", None)
            before = stats() if stats else None
            with placement(infer, cores if name in IN_PROCESS else None):
                for _ in range(chunk):
                    t0 = time.perf_counter_ns()
                    infer(x)
                    got.append(time.perf_counter_ns() - t0)
            if stats and before is not None:
                delta(before, stats(), totals[name])
    return samples, totals


# ---------------------------------------------------------------------------- memory
@dataclass
class InstanceMemory:
    rss: int
    pss: int
    uss: int


def weights_config(share: bool, n_in: int, instances: int) -> str:
    return f"""
name: "weights"
backend: "pytorch"
max_batch_size: 4
input [{{ name: "INPUT__0" data_type: TYPE_FP32 dims: [{n_in}] }}]
output [{{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [-1] }}]
instance_group [{{ count: {instances} kind: KIND_CPU }}]
parameters {{ key: "ENABLE_WEIGHT_SHARING" value: {{ string_value: "{str(share).lower()}" }} }}
parameters {{ key: "INTRA_OP_THREAD_COUNT" value: {{ string_value: "1" }} }}
"""


def measure_instances(
    repo: Path, n_in: int, instances: int, share: bool, start: str
) -> tuple[list[InstanceMemory], list[float]]:
    """Memory of the workers of one served model with ``instances`` instances, all loaded
    (workers started as ``--worker-start`` says), and the seconds each took to serve again
    after a SIGKILL."""
    with contextlib.ExitStack() as stack:
        config = weights_config(share, n_in, instances)
        served = model_repository(repo / "1" / "model.pt", "weights", config, stack)
        client = serve(served, stack, "--worker-start", start)
        x = np.ones((1, n_in), np.float32)
        client.infer("weights", {"INPUT__0": x})
        usage = []
        for row in client.status():
            info = psutil.Process(row["pid"]).memory_full_info()
            usage.append(InstanceMemory(info.rss, info.pss, info.uss))
        return usage, measure_respawns(client, x)


def measure_respawns(client: Client, x: np.ndarray) -> list[float]:
    """SIGKILL each instance's worker in turn; seconds until it is READY again and serves."""
    times = []
    for row in client.status():
        slot, pid = row["slot"], row["pid"]
        t0 = time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        while True:
            now = next(r for r in client.status() if r["slot"] == slot)
            if now["state"] == "READY" and now["pid"] not in (None, pid):
                break
            if time.perf_counter() - t0 > 60:
                raise TimeoutError(f"instance {row['instance']} did not come back: {now}")
            time.sleep(0.002)
        times.append(time.perf_counter() - t0)
        client.infer("weights", {"INPUT__0": x})
    return times


def _report_memory(instances: int, weights_mb: int) -> None:
    n_in = 1024
    n_out = weights_mb * 2**20 // 4 // n_in
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        torch.manual_seed(0)
        save_model(torch.nn.Linear(n_in, n_out, bias=False), repo)
        for share in (False, True):
            for start in ("fresh", "zygote"):
                usage, respawns = measure_instances(repo, n_in, instances, share, start)
                mib = 2**20
                print(
                    f"{instances} instances, {weights_mb} MiB of weights, sharing={share!s:5}, "
                    f"workers {start:6}: PSS {sum(u.pss for u in usage) / mib:7.1f} MiB "
                    f"({sum(u.pss for u in usage) / len(usage) / mib:6.1f} per instance), "
                    f"USS/instance {statistics.fmean(u.uss for u in usage) / mib:6.1f} MiB, "
                    f"RSS/instance {statistics.fmean(u.rss for u in usage) / mib:6.1f} MiB; "
                    "respawn after SIGKILL until READY "
                    + "/".join(f"{t * 1e3:.0f}" for t in respawns)
                    + f" ms (median {statistics.median(respawns) * 1e3:.0f})"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=2000, help="timed calls per path and batch")
    parser.add_argument("--rounds", type=int, default=40, help="alternating chunks of them")
    parser.add_argument(
        "--paths", nargs="+", choices=list(PATHS), default=list(PATHS), help="torch is the base"
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--weights-mb", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument(
        "--part", choices=["latency", "memory", "all"], default="all", help="what to measure"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.part != "latency" and args.instances > 0:
        _report_memory(args.instances, args.weights_mb)
    if args.part == "memory":
        return
    print(f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    ratios: dict[tuple[str, int], float] = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        repo = Path(tmp)
        save_model(mlp(), repo)
        paths = {name: make(repo, stack) for name, make in PATHS.items() if name in args.paths}
        lane = paths.get("lane")
        cores = lane.worker_cores if isinstance(lane, Laned) else None
        if cores is not None:
            print(f"torch and backend run on cpu {sorted(cores)}, where the lane's worker runs")
        for batch in args.batches:
            samples, totals = time_paths(paths, batch, args.iters, args.rounds, cores)
            base = p50(samples["torch"])
            for name, got in samples.items():
                mean_us = statistics.fmean(got) / 1e3
                ratios[name, batch] = p50(got) / base
                print(
                    f"{name:9} batch {batch:3}: p50 {p50(got):8.1f} us  "
                    f"p99 {sorted(got)[int(len(got) * 0.99)] / 1e3:8.1f} us  "
                    f"{batch * 1e6 / mean_us:10.0f} inferences/s"
                )
                path = paths[name]
                if totals[name]:
                    print(breakdown(totals[name], mean_us))
                elif isinstance(path, InProcess):
                    print(path.stages(len(got), p50(got)))
    print(f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    for (name, batch), ratio in ratios.items():
        print(f"{name:9} / torch, batch {batch:3}: p50 x{ratio:5.2f}")


if __name__ == "__main__":
    main()
