"""Real models served and measured: a ResNet-50-shaped CNN and a BERT-base-shaped encoder.

    python scripts/bench_models.py [--quick] [--models resnet,bert] [--backends onnxruntime,...]

Both models are built here from torch.nn with random weights (no download), exported to ONNX
(served by the onnxruntime and openvino backends) and to TorchScript (the pytorch backend).
Each (model, backend) gets one ``inferpool serve`` with two entries of the same file: one
without batching, one with ``dynamic_batching``.  Rows: one client through ``Client``,
``ShmClient`` and a lane (batch 1), then 8 and 32 concurrent ``Client`` threads, each with
the server's statistics over the row (queue, compute input / infer / output per request, the
batch sizes it formed).  Beside them, the same runtime called in-process by one Python
thread at batch 1 and at each batch size the server formed: the floors.  Printed last:

* batch 1 through a lane: p50 against the runtime's own call (goal: within 1.1x);
* 32 clients with dynamic batching: throughput against the runtime's best in-process
  throughput on the same cores (goal: at least 0.9x), with p99.

The server's workers run on the same two cores as everything else here: the ratios compare
paths measured in this one run; the load average is printed with them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inferpool.client import Client, ShmClient

SEQ = 128


# ----------------------------------------------------------------------------- models
class Bottleneck(nn.Module):
    def __init__(self, cin: int, mid: int, stride: int) -> None:
        super().__init__()
        cout = mid * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
            nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
            nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout),
        )  # fmt: skip
        self.skip = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


def resnet50() -> nn.Module:
    """ResNet-50's layout: a 7x7 stem, bottleneck stages of 3, 4, 6, 3 blocks, 1000 classes."""
    layers: list[nn.Module] = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
    ]  # fmt: skip
    cin = 64
    for mid, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(cin, mid, stride if i == 0 else 1))
            cin = mid * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000)]
    return nn.Sequential(*layers).eval()


class Bert(nn.Module):
    """BERT-base's layout: 12 layers, hidden 768, 12 heads, FFN 3072, a 30522-token vocabulary."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(30522, 768)
        self.positions = nn.Parameter(torch.randn(1, SEQ, 768) * 0.02)
        layer = nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True, activation="gelu")
        self.encoder = nn.TransformerEncoder(layer, 12, enable_nested_tensor=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.tokens(ids) + self.positions)


MODELS: dict[str, tuple[Callable[[], nn.Module], str, Callable[[int], np.ndarray], str, str]] = {
    # name: (build, input name, input maker, input type and dims, output type and dims)
    "resnet": (
        resnet50, "INPUT__0",
        lambda n: np.random.default_rng(0).random((n, 3, 224, 224), dtype=np.float32),
        "TYPE_FP32 dims: [ 3, 224, 224 ]", "TYPE_FP32 dims: [ 1000 ]",
    ),
    "bert": (
        lambda: Bert().eval(), "INPUT__0",
        lambda n: np.random.default_rng(0).integers(0, 30522, (n, SEQ), dtype=np.int64),
        f"TYPE_INT64 dims: [ {SEQ} ]", f"TYPE_FP32 dims: [ {SEQ}, 768 ]",
    ),
}  # fmt: skip


def export(name: str, folder: Path) -> tuple[Path, Path]:
    """``model.onnx`` and ``model.pt`` of model ``name`` in ``folder``."""
    build, _, make, _, _ = MODELS[name]
    module = build()
    x = torch.from_numpy(make(2))
    onnx_path, pt_path = folder / "model.onnx", folder / "model.pt"
    with torch.no_grad():
        torch.onnx.export(
            module, (x,), str(onnx_path), input_names=["INPUT__0"], output_names=["OUTPUT__0"],
            dynamic_axes={"INPUT__0": {0: "batch"}, "OUTPUT__0": {0: "batch"}}, dynamo=False,
        )  # fmt: skip
        torch.jit.trace(module, (x,)).save(str(pt_path))
    return onnx_path, pt_path


# ----------------------------------------------------------------------------- floors
def runtime(backend: str, onnx_path: Path, pt_path: Path) -> Callable[[np.ndarray], Any]:
    """The runtime itself, called in this process with the threads the server's would have."""
    threads = len(os.sched_getaffinity(0))
    if backend == "onnxruntime":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
        return lambda x: session.run(None, {"INPUT__0": x})[0]
    if backend == "openvino":
        import openvino as ov

        compiled = ov.Core().compile_model(
            str(onnx_path), "CPU", {"INFERENCE_NUM_THREADS": threads}
        )
        request = compiled.create_infer_request()
        return lambda x: request.infer([x])[0]
    module = torch.jit.load(str(pt_path))
    torch.set_num_threads(threads)

    def call(x: np.ndarray) -> Any:
        with torch.inference_mode():
            return module(torch.from_numpy(x)).numpy()

    return call


def time_calls(call: Callable[[], Any], count: int) -> list[float]:
    call()  # warm
    out = []
    for _ in range(count):
        t = time.perf_counter()
        call()
        out.append(time.perf_counter() - t)
    return out


def pct(samples: list[float], q: float) -> float:
    return float(np.percentile(samples, q)) * 1e3


# ----------------------------------------------------------------------------- serving
CONFIG = """name: "{name}" {platform} max_batch_size: {max_batch}
input [ {{ name: "INPUT__0" data_type: {input} }} ]
output [ {{ name: "OUTPUT__0" data_type: {output} }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{batching}
"""
PLATFORMS = {
    "onnxruntime": 'platform: "onnxruntime_onnx"',
    "openvino": 'backend: "openvino" default_model_filename: "model.onnx"',
    "pytorch": 'platform: "pytorch_libtorch"',
}


@contextlib.contextmanager
def serving(model: str, backend: str, onnx_path: Path, pt_path: Path) -> Iterator[str]:
    """A server with ``plain`` (no batching) and ``batched`` (dynamic batching): its endpoint."""
    _, _, _, input_type, output_type = MODELS[model]
    with tempfile.TemporaryDirectory(prefix="ipb-", dir="/tmp") as tmp:
        repo = Path(tmp) / "repo"
        # plain: batch 1 at most, so that no backend's auto-complete adds dynamic batching
        for name, max_batch, batching in (
            ("plain", 1, ""),
            ("batched", 32, "dynamic_batching { max_queue_delay_microseconds: 5000 }"),
        ):
            (repo / name / "1").mkdir(parents=True)
            source = pt_path if backend == "pytorch" else onnx_path
            (repo / name / "1" / source.name).symlink_to(source)
            config = CONFIG.format(
                name=name, platform=PLATFORMS[backend], input=input_type, output=output_type,
                batching=batching, max_batch=max_batch,
            )  # fmt: skip
            (repo / name / "config.pbtxt").write_text(config)
        endpoint = f"ipc://{tmp}/broker.sock"
        cmd = [sys.executable, "-m", "inferpool", "serve", "--model-repository", str(repo)]
        cmd += ["--http-port", "0", "--grpc-port", "0", "--allow-metrics", "false"]
        cmd += ["--listen", endpoint, "--log-level", "WARNING", "--arena-size", "512M"]
        cmd += ["--output-arena-size", "256M"]
        proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL)
        try:
            with Client(endpoint, timeout=300) as c:
                c.wait_ready(300)
            yield endpoint
        finally:
            proc.terminate()
            proc.wait(60)


def stats(c: Client, model: str) -> dict[str, Any]:
    found: dict[str, Any] = c.statistics(model)["model_stats"][0]
    return found


def stats_line(before: dict[str, Any], after: dict[str, Any]) -> tuple[str, list[int]]:
    """Per request: queue and compute input / infer / output (ms), and the batches formed."""
    n = after["inference_count"] - before["inference_count"] or 1
    parts = []
    for key in ("queue", "compute_input", "compute_infer", "compute_output"):
        ns = after["inference_stats"][key]["ns"] - before["inference_stats"][key]["ns"]
        parts.append(f"{ns / n / 1e6:.1f}")
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in before["batch_stats"]}
    formed = [
        b["batch_size"]
        for b in after["batch_stats"]
        if b["compute_infer"]["count"] > sizes.get(b["batch_size"], 0)
    ]
    return "/".join(parts), sorted(formed)


def concurrent(endpoint: str, model: str, make: Callable[[int], np.ndarray], clients: int,
               per_client: int) -> tuple[list[float], float]:  # fmt: skip
    """``clients`` threads, each with its own Client, ``per_client`` requests each."""
    latencies: list[float] = []
    lock = threading.Lock()
    x = make(1)
    barrier = threading.Barrier(clients + 1)

    def run() -> None:
        with Client(endpoint, timeout=600) as c:
            c.infer(model, {"INPUT__0": x})
            barrier.wait()
            mine = []
            for _ in range(per_client):
                t = time.perf_counter()
                c.infer(model, {"INPUT__0": x})
                mine.append(time.perf_counter() - t)
            with lock:
                latencies.extend(mine)

    threads = [threading.Thread(target=run) for _ in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return latencies, len(latencies) / (time.perf_counter() - start)


def bench(model: str, backend: str, onnx_path: Path, pt_path: Path, n: int) -> list[str]:
    make = MODELS[model][2]
    call = runtime(backend, onnx_path, pt_path)
    one = make(1)
    floor1 = time_calls(lambda: call(one), n)
    rows = [f"| {model} | {backend} | in-process, batch 1 | 1 | {pct(floor1, 50):.1f} | "
            f"{pct(floor1, 99):.1f} | {1e3 / pct(floor1, 50):.1f} | | |"]  # fmt: skip
    best = (1e3 / pct(floor1, 50), 1)
    lane_p50 = 0.0
    batches: set[int] = set()
    with serving(model, backend, onnx_path, pt_path) as endpoint, Client(endpoint) as c:
        x = make(1)
        paths: list[tuple[str, Callable[[], Any]]] = [
            ("Client", lambda: c.infer("plain", {"INPUT__0": x}))
        ]
        shm = ShmClient(endpoint, timeout=300)
        paths.append(("ShmClient", lambda: shm.infer("plain", {"INPUT__0": x})))
        laned = ShmClient(endpoint, timeout=300, lane=True)
        laned.lane("plain")
        req = laned.request("plain", outputs=["OUTPUT__0"])
        req.input("INPUT__0", x.shape, x.dtype)[:] = x

        def via_lane() -> None:
            with laned.run(req) as result:
                result["OUTPUT__0"]

        paths.append(("lane", via_lane))
        for label, path in paths:
            before = stats(c, "plain")
            samples = time_calls(path, n)
            line, _ = stats_line(before, stats(c, "plain"))
            p50 = pct(samples, 50)
            lane_p50 = p50 if label == "lane" else lane_p50
            rows.append(f"| {model} | {backend} | {label}, no batching | 1 | {p50:.1f} | "
                        f"{pct(samples, 99):.1f} | {1e3 / p50:.1f} | {line} | 1 |")  # fmt: skip
        shm.close()
        laned.close()
        for entry in ("plain", "batched"):
            for clients in (8, 32):
                before = stats(c, entry)
                lat, tput = concurrent(endpoint, entry, make, clients, max(2, n // 2))
                line, formed = stats_line(before, stats(c, entry))
                if entry == "batched":
                    batches.update(formed)
                label = "dynamic batching" if entry == "batched" else "no batching"
                rows.append(
                    f"| {model} | {backend} | Client, {label} | {clients} | {pct(lat, 50):.1f} | "
                    f"{pct(lat, 99):.1f} | {tput:.1f} | {line} | "
                    f"{','.join(map(str, sorted(set(formed))[-4:]))} |"
                )
                if entry == "batched" and clients == 32:
                    served32 = tput, pct(lat, 99)
    for size in sorted(batches - {1}):
        floor = time_calls(lambda size=size: call(make(size)), max(2, n // 4))  # type: ignore[misc]
        rate = size * 1e3 / pct(floor, 50)
        rows.append(f"| {model} | {backend} | in-process, batch {size} | 1 | {pct(floor, 50):.1f} "
                    f"| {pct(floor, 99):.1f} | {rate:.1f} | | |")  # fmt: skip
        best = max(best, (rate, size))
    RATIOS.append(
        f"{model}/{backend}: lane p50 {lane_p50:.1f} ms = {lane_p50 / pct(floor1, 50):.2f}x the "
        f"runtime's {pct(floor1, 50):.1f} ms; 32 clients batched {served32[0]:.1f}/s = "
        f"{served32[0] / best[0]:.2f}x its best in-process {best[0]:.1f}/s (batch {best[1]}), "
        f"p99 {served32[1]:.1f} ms"
    )
    return rows


RATIOS: list[str] = []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="resnet,bert")
    parser.add_argument("--backends", default="onnxruntime,openvino,pytorch")
    parser.add_argument("--quick", action="store_true", help="few requests per row (2 cores)")
    parser.add_argument("--requests", type=int, default=0, help="timed calls per path")
    args = parser.parse_args()
    n = args.requests or (6 if args.quick else 30)
    print(f"load average before: {os.getloadavg()}")
    header = (
        "| model | backend | path | clients | p50 ms | p99 ms | req/s | queue/input/infer/output"
        " ms per request | batches formed |\n|---|---|---|---|---|---|---|---|---|"
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="ipb-models-") as tmp:
        for model in args.models.split(","):
            folder = Path(tmp) / model
            folder.mkdir()
            onnx_path, pt_path = export(model, folder)
            for backend in args.backends.split(","):
                rows += bench(model, backend, onnx_path, pt_path, n)
                print("\n".join(rows[-1:]), flush=True)
    print(header)
    print("\n".join(rows))
    print()
    print("\n".join(RATIOS))
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
