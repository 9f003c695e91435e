"""What a backend adds to its runtime on a real model, with the machine's drift taken out.

    python scripts/bench_backend_cost.py [--quick] [--models resnet,bert]
                                         [--backends onnxruntime,...] [--batches 1,8]
                                         [--rounds 40]

One process pinned to the last core, one intra-op thread (as a served instance on that core
runs): the backend's ``execute`` of a batch of N one-row requests, as the dynamic batcher
hands it over (``BackendHarness``: the real lifecycle host, over process memory), against
the runtime called at batch N (``runtime_floor.runtime``), call by call in alternating order.
The CPU time of each call is compared with its neighbour's, so a machine whose speed moves
between timings (``bench_models.py``'s floor is timed apart from its windows) weighs on both
alike.  Printed per row: the median and quartiles of the per-pair ratio, and the runtime's
own CPU per row across the run (its spread is the machine's drift).
"""

from __future__ import annotations

import os

os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[-1:])  # before any runtime starts

from runtime_floor import THREAD_ENV, runtime  # noqa: E402  (the pinning above comes first)

os.environ.update({name: "1" for name in THREAD_ENV})  # before torch and the runtimes load

import argparse  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from real_models import ModelSpec, export, spec  # noqa: E402
from served_runs import MAX_BATCH, PLATFORMS, check_choices  # noqa: E402

from inferpool.backends.testing import BackendHarness  # noqa: E402


def harness_config(model: ModelSpec, backend: str) -> str:
    return f"""name: "m" {PLATFORMS[backend]} max_batch_size: {MAX_BATCH} dynamic_batching {{ }}
input [ {{ name: "INPUT__0" data_type: {model.input_type} }} ]
output [ {{ name: "OUTPUT__0" data_type: {model.output_type} }} ]"""


def cpu_of(fn: Callable[[], object]) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def compare(model: ModelSpec, backend: str, repo: Path, batch: int, rounds: int) -> str:
    """The backend against its runtime at ``batch``, ``rounds`` alternating pairs; ``repo``
    is the model's directory, its file in ``1/``."""
    [source] = (repo / "1").iterdir()
    rows = [model.input.make(1) for _ in range(batch)]
    joined = np.concatenate(rows)
    call = runtime(backend, str(source), 1)
    with BackendHarness(backend, harness_config(model, backend), repository_path=str(repo)) as h:

        def served() -> np.ndarray:
            h.responses.clear()
            h.execute([h.request({"INPUT__0": r}) for r in rows])
            return h.outputs_of(h.responses[-1][1])["OUTPUT__0"]

        if not np.allclose(served()[0], np.asarray(call(joined))[-1], rtol=1e-3, atol=1e-3):
            raise SystemExit(f"{model.name}/{backend}: the backend and its runtime disagree")
        for _ in range(2):  # warm both
            served()
            call(joined)

        def floor() -> None:
            call(joined)

        ratios, runtime_cpu = [], []
        for i in range(rounds):  # the order turns each round
            if i % 2:
                backend_cpu, floor_cpu = cpu_of(served), cpu_of(floor)
            else:
                floor_cpu, backend_cpu = cpu_of(floor), cpu_of(served)
            ratios.append(backend_cpu / floor_cpu)
            runtime_cpu.append(floor_cpu / batch * 1e3)
    low, _, high = statistics.quantiles(ratios, n=4)
    return (
        f"{model.name}/{backend}, batch {batch} ({batch} one-row requests): backend CPU / "
        f"runtime's = {statistics.median(ratios):.3f} (quartiles {low:.3f}-{high:.3f}, "
        f"{rounds} pairs); the runtime {statistics.median(runtime_cpu):.2f} ms per row "
        f"(from {min(runtime_cpu):.2f} to {max(runtime_cpu):.2f} over the run)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="resnet,bert")
    parser.add_argument("--backends", default="onnxruntime,openvino,pytorch")
    parser.add_argument("--batches", default="1,8", help="batch sizes, comma-separated")
    parser.add_argument("--rounds", type=int, default=40, help="alternating pairs per row")
    parser.add_argument("--quick", action="store_true", help="narrower models")
    args = parser.parse_args()
    check_choices(parser, args.models, args.backends)
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        parser.error(f"--batches: '{args.batches}' is not a list of sizes like 1,8")
    if not all(0 < b <= MAX_BATCH for b in batches) or args.rounds < 4:
        parser.error(f"--batches from 1 to {MAX_BATCH}, --rounds at least 4")
    print(f"core {os.sched_getaffinity(0)}; load average before: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="ipb-cost-") as tmp:
        for name in args.models.split(","):
            model = spec(name, args.quick)
            folder = Path(tmp) / name / "files"
            folder.mkdir(parents=True)
            onnx_path, pt_path = export(model, folder)
            for backend in args.backends.split(","):
                source = pt_path if backend == "pytorch" else onnx_path
                repo = Path(tmp) / name / backend
                (repo / "1").mkdir(parents=True)
                (repo / "1" / source.name).symlink_to(source)
                for batch in batches:
                    print(compare(model, backend, repo, batch, args.rounds), flush=True)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
