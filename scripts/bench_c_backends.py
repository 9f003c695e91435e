#!/usr/bin/env python3
"""A C backend next to a Python one, in one run: Triton's C API host against the floor of
the Python identity backend on the same paths.

- ``c_identity``: scripts/bench_c_identity.c, built here with the system compiler against
  the project's headers: what Triton's identity backend calls per request and per batch;
- ``py_identity``: the built-in identity backend (backends/identity), same config.

Paths: the broker path (``Client``) at 64 B and 64 MiB, and a lane (``ShmClient(lane=True)``)
at 64 B; the models are measured in alternating rounds.  BLS: ``c_bls``
(scripts/bench_c_bls.c: Triton's bls example for one model, through
``TRITONSERVER_ServerInferAsync``) against ``py_bls``, a Python model making the same call
with ``pb_utils.InferenceRequest(...).exec()``; both call ``py_identity`` (64 B, broker
path).  The 64 MiB difference is set against one numpy copy of 64 MiB measured in the same
run (the goal: no extra copy on the C path).  Then the C backend times the API in place (a
request with the parameter "probe"): the median ns of each call it can repeat, and the calls
it makes per request and per batch.

    python scripts/bench_c_backends.py            # about a minute
    python scripts/bench_c_backends.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from inferpool.backends.cabi.library import include_dir  # noqa: E402
from inferpool.client import Client, ShmClient  # noqa: E402

MODELS = ("py_identity", "c_identity")
BLS = ("py_bls", "c_bls")
PY_BLS = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            call = pb_utils.InferenceRequest(
                model_name="py_identity", inputs=[x], requested_output_names=["OUTPUT0"]
            )
            out = pb_utils.get_output_tensor_by_name(call.exec(), "OUTPUT0")
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""
CONFIG = """
name: "{name}"
backend: "{backend}"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_UINT8 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_UINT8 dims: [ -1 ] }} ]
instance_group [ {{ kind: KIND_CPU host_policy: "bench" }} ]
"""
ROUNDS = 5
LAYOUT = {"client": 0, "broker": 0, "worker": 1}  # the worker on its own core


def pin(cpu: int) -> None:
    if hasattr(os, "sched_setaffinity") and cpu < (os.cpu_count() or 1):
        os.sched_setaffinity(0, {cpu})


def repository(tmp: Path) -> Path:
    repo = tmp / "repo"
    for name, backend in (
        ("py_identity", "identity"),
        ("c_identity", "c_identity"),
        ("py_bls", "python"),
        ("c_bls", "c_bls"),
    ):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, backend=backend))
    (repo / "py_bls" / "1" / "model.py").write_text(PY_BLS)
    for name in ("c_identity", "c_bls"):
        subprocess.run(
            ["cc", "-shared", "-fPIC", "-O2", "-pthread", f"-I{include_dir()}", "-o",
             str(repo / name / f"libtriton_{name}.so"), str(ROOT / "scripts" / f"bench_{name}.c")],
            check=True,
        )  # fmt: skip
    return repo


def serve(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    endpoint = f"ipc://{tmp}/b.sock"
    cmd = [
        sys.executable, "-m", "inferpool", "serve", "--model-repository", str(repository(tmp)),
        "--listen", endpoint, "--arena-size", "512M", "--output-arena-size", "512M",
        "--max-request-bytes", "128M", f"--host-policy=bench,cpu-cores={LAYOUT['worker']}",
        "--http-port", "0", "--grpc-port", "0", "--allow-metrics", "false",
        "--log-level", "WARNING",
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=ROOT, preexec_fn=lambda: pin(LAYOUT["broker"]), stdout=subprocess.DEVNULL
    )
    with Client(endpoint, timeout=5) as c:
        c.wait_ready(120)
    return proc, endpoint


def p50_us(lat: list[float]) -> float:
    return float(np.percentile(np.array(lat) * 1e6, 50))


def broker_path(
    endpoint: str, nbytes: int, n: int, models: tuple[str, str] = MODELS
) -> dict[str, float]:
    x = np.frombuffer(np.random.bytes(nbytes), np.uint8)
    lat: dict[str, list[float]] = {m: [] for m in models}
    with Client(endpoint, timeout=120) as c:
        for model in models:  # answers checked, and warmed up
            if not np.array_equal(c.infer(model, {"INPUT0": x})["OUTPUT0"], x):
                raise SystemExit(f"{model}: the output differs from the input")
        for _ in range(ROUNDS):
            for model in models:
                for _ in range(n):
                    t = time.perf_counter()
                    c.infer(model, {"INPUT0": x})
                    lat[model].append(time.perf_counter() - t)
    return {m: p50_us(v) for m, v in lat.items()}


def lane(endpoint: str, nbytes: int, n: int) -> dict[str, float]:
    lat: dict[str, list[float]] = {m: [] for m in MODELS}
    with ShmClient(endpoint, timeout=60, input_bytes=nbytes + (1 << 20), lane=True) as c:
        requests = {}
        for model in MODELS:
            req = requests[model] = c.request(model, outputs=["OUTPUT0"])
            req.input("INPUT0", (nbytes,), np.uint8)[:] = 7
            for _ in range(50):
                with c.run(req) as result:
                    result["OUTPUT0"]
        if len(c.session.lanes.lanes) != len(MODELS):
            raise SystemExit("a lane was not granted")
        for _ in range(ROUNDS):
            for model in MODELS:
                req = requests[model]
                for _ in range(n):
                    t = time.perf_counter()
                    with c.run(req) as result:
                        result["OUTPUT0"]
                    lat[model].append(time.perf_counter() - t)
    return {m: p50_us(v) for m, v in lat.items()}


def copy_us(nbytes: int, n: int) -> float:
    src, dst = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    np.copyto(dst, src)
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        np.copyto(dst, src)
        lat.append(time.perf_counter() - t)
    return p50_us(lat)


def probe(endpoint: str) -> dict[str, Any]:
    with Client(endpoint, timeout=60) as c:
        result = c.infer_result(
            "c_identity", {"INPUT0": np.zeros(64, np.uint8)}, parameters={"probe": True}
        )
    return {k: v for k, v in result.parameters.items() if not k.startswith("param")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--json", default="bench-c-backends.json", help="where to write results")
    args = parser.parse_args()
    n_small, n_large = (100, 2) if args.quick else (1000, 6)
    pin(LAYOUT["client"])
    out: dict[str, Any] = {"load_average": os.getloadavg(), "layout": LAYOUT}
    with tempfile.TemporaryDirectory(prefix="ipb-", dir="/tmp") as tmp:
        proc, endpoint = serve(Path(tmp))
        try:
            out["broker 64 B"] = broker_path(endpoint, 64, n_small)
            out["lane 64 B"] = lane(endpoint, 64, n_small)
            out["broker 64 MiB"] = broker_path(endpoint, 64 << 20, n_large)
            out["copy 64 MiB us"] = copy_us(64 << 20, max(n_large, 5))
            out["bls 64 B"] = broker_path(endpoint, 64, n_small // 4, BLS)
            out["api"] = probe(endpoint)
        finally:
            proc.terminate()
            proc.wait(60)
    print(f"load average {out['load_average'][0]:.2f}; layout {LAYOUT}")
    print(f"{'path':<16}{'python p50 us':>15}{'C p50 us':>12}{'C / python':>12}")
    for path in ("broker 64 B", "lane 64 B", "broker 64 MiB"):
        py, c = out[path]["py_identity"], out[path]["c_identity"]
        print(f"{path:<16}{py:>15.1f}{c:>12.1f}{c / py:>12.2f}")
    bls = out["bls 64 B"]
    py, c = bls["py_bls"], bls["c_bls"]
    print(f"{'bls 64 B':<16}{py:>15.1f}{c:>12.1f}{c / py:>12.2f}  (a call to py_identity)")
    big = out["broker 64 MiB"]
    extra = big["c_identity"] - big["py_identity"]
    print(f"64 MiB: C - python = {extra:.0f} us; one 64 MiB copy = {out['copy 64 MiB us']:.0f} us")
    api = out["api"]
    print(f"API calls: {api.pop('calls_per_request'):.1f} per request, "
          f"{api.pop('calls_per_batch'):.1f} per batch")  # fmt: skip
    for name, ns in sorted(api.items()):
        print(f"  {name[3:]:<44}{ns:>9.0f} ns")
    Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
