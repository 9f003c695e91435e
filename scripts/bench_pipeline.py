#!/usr/bin/env python3
"""A three-step pipeline (preprocess -> TorchScript MLP -> postprocess, 1 MiB tensors) served
three ways in one run, against its own steps:

- chain:      the client calls the three models one after another, each step's output sent
              back to the server as the next one's input (the baseline a pipeline replaces);
- ensemble:   one request to an ensemble of the three; the broker runs the steps, each reading
              the previous step's output where that step's worker wrote it;
- ensemble shm: the same with the shared-memory client (input written in place, the output
              read in place as a handle): the pipeline's own cost, without the client's copies;
- bls:        one request to a python model that calls the three with pb_utils BLS;
- round trip: a 64 B identity request, the cost of one client -> broker -> worker hop and
              back on this machine at this moment (what a pipeline pays per step on top of
              the step's own execution).

The steps' own execution times come from the server's statistics (compute input + infer +
output, per request) over the same run; their sum is the floor every path pays.  Paths are
measured in alternating rounds so that the machine's noise falls on all of them alike.

    python scripts/bench_pipeline.py [--iters 200] [--rounds 5] [--hidden 64]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_torch import serve  # noqa: E402  (scripts/ is on the path when run as a script)

from inferpool.client import Client, ShmClient  # noqa: E402

ROWS, COLS = 256, 1024  # FP32: 1 MiB
STEPS = ("pre", "mlp", "post")
ROUND_TRIP = "64 B round trip"
TENSOR = f"dims: [ {ROWS}, {COLS} ]"

PRE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "RAW").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("INPUT__0", (x - 0.5) * 2.0)]))
        return out
"""

POST = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            y = pb_utils.get_input_tensor_by_name(r, "OUTPUT__0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("SCORE", np.maximum(y, 0))]))
        return out
"""

BLS = """
import triton_python_backend_utils as pb_utils


def step(model, tensor, output):
    r = pb_utils.InferenceRequest(model_name=model, inputs=[tensor],
                                  requested_output_names=[output]).exec()
    if r.has_error():
        raise pb_utils.TritonModelException(r.error().message())
    return pb_utils.get_output_tensor_by_name(r, output)


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = step("pre", pb_utils.get_input_tensor_by_name(r, "RAW"), "INPUT__0")
            y = step("post", step("mlp", x, "OUTPUT__0"), "SCORE")
            out.append(pb_utils.InferenceResponse([y]))
        return out
"""


def tensor(name: str) -> str:
    return f'{{ name: "{name}" data_type: TYPE_FP32 {TENSOR} }}'


def io(inp: str, out: str) -> str:
    return f"input [ {tensor(inp)} ] output [ {tensor(out)} ]"


def map_step(model: str, inp: str, src: str, out: str, dst: str) -> str:
    return (
        f'{{ model_name: "{model}" input_map {{ key: "{inp}" value: "{src}" }} '
        f'output_map {{ key: "{out}" value: "{dst}" }} }}'
    )


def write_repository(repo: Path, hidden: int, threads: int) -> None:
    def model(name: str, config: str, files: dict[str, str]) -> None:
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(f'name: "{name}" {config}')
        for rel, text in files.items():
            (repo / name / rel).write_text(text)

    model("pre", f'backend: "python" {io("RAW", "INPUT__0")}', {"1/model.py": PRE})
    model("post", f'backend: "python" {io("OUTPUT__0", "SCORE")}', {"1/model.py": POST})
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(COLS, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, COLS)
    ).eval()
    (repo / "mlp" / "1").mkdir(parents=True)
    torch.jit.save(torch.jit.script(mlp), str(repo / "mlp" / "1" / "model.pt"))
    (repo / "mlp" / "config.pbtxt").write_text(
        f'name: "mlp" backend: "pytorch" {io("INPUT__0", "OUTPUT__0")} '
        f'parameters {{ key: "INTRA_OP_THREAD_COUNT" value: {{ string_value: "{threads}" }} }}'
    )
    steps = ", ".join(
        [
            map_step("pre", "RAW", "RAW", "INPUT__0", "normalized"),
            map_step("mlp", "INPUT__0", "normalized", "OUTPUT__0", "hidden"),
            map_step("post", "OUTPUT__0", "hidden", "SCORE", "SCORE"),
        ]
    )
    model(
        "pipeline",
        f'platform: "ensemble" {io("RAW", "SCORE")} ensemble_scheduling {{ step [ {steps} ] }}',
        {},
    )
    model("pipeline_bls", f'backend: "python" {io("RAW", "SCORE")}', {"1/model.py": BLS})
    small = '{ name: "%s" data_type: TYPE_FP32 dims: [ 16 ] }'
    model(
        "hop",
        f'backend: "identity" input [ {small % "INPUT0"} ] output [ {small % "OUTPUT0"} ]',
        {},
    )


# ---------------------------------------------------------------------------- the paths
Run = Callable[[np.ndarray], np.ndarray]


def paths(endpoint: str, stack: contextlib.ExitStack) -> dict[str, Run]:
    c = stack.enter_context(Client(endpoint, timeout=60))
    shm = stack.enter_context(ShmClient(endpoint, timeout=60, input_bytes=4 << 20))
    request = shm.request("pipeline", ["SCORE"])
    raw = request.input("RAW", (ROWS, COLS), np.float32)

    def chain(x: np.ndarray) -> np.ndarray:
        y = c.infer("pre", {"RAW": x})["INPUT__0"]
        z = c.infer("mlp", {"INPUT__0": y})["OUTPUT__0"]
        return c.infer("post", {"OUTPUT__0": z})["SCORE"]

    def ensemble(x: np.ndarray) -> np.ndarray:
        return c.infer("pipeline", {"RAW": x})["SCORE"]

    def ensemble_shm(x: np.ndarray) -> np.ndarray:
        np.copyto(raw, x)  # the client's producer would write here in the first place
        with shm.run(request) as result:
            return np.asarray(result["SCORE"][0, :4]).copy()

    def bls(x: np.ndarray) -> np.ndarray:
        return c.infer("pipeline_bls", {"RAW": x})["SCORE"]

    small = np.zeros(16, np.float32)

    def round_trip(x: np.ndarray) -> np.ndarray:
        return c.infer("hop", {"INPUT0": small})["OUTPUT0"]

    return {
        "chain": chain,
        "ensemble": ensemble,
        "ensemble shm": ensemble_shm,
        "bls": bls,
        ROUND_TRIP: round_trip,
    }


def execution_ns(c: Client) -> dict[str, tuple[int, int]]:
    """(requests, ns of compute input + infer + output) per step, from the statistics."""
    out = {}
    for name in STEPS:
        s = c.statistics(name)["model_stats"][0]["inference_stats"]
        ns = s["compute_input"]["ns"] + s["compute_infer"]["ns"] + s["compute_output"]["ns"]
        out[name] = (s["success"]["count"], ns)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=200, help="requests per path per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=64, help="the MLP's hidden width")
    parser.add_argument("--threads", type=int, default=1, help="the MLP's intra-op threads")
    parser.add_argument("--pin", choices=("auto", "none"), default="auto", help="the server's")
    args = parser.parse_args()
    x = np.random.default_rng(0).random((ROWS, COLS), dtype=np.float32)
    expected = np.maximum(_reference(x, args.hidden), 0)  # checks every path's answer
    samples: dict[str, list[float]] = {}
    spent: dict[str, dict[str, list[int]]] = {}  # path -> step -> [requests, ns]
    with (
        tempfile.TemporaryDirectory(prefix="ibp-", dir="/tmp") as tmp,
        contextlib.ExitStack() as st,
    ):
        repo = Path(tmp) / "repo"
        write_repository(repo, args.hidden, args.threads)
        control = serve(
            repo, st, "--arena-size", "64M", "--output-arena-size", "64M", "--pin", args.pin
        )
        runs = paths(control.endpoint, st)
        for name, run in runs.items():  # warm up, and check the answers
            for _ in range(20):
                got = run(x)
            if name != ROUND_TRIP:
                want = expected[0, :4] if name == "ensemble shm" else expected
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=name)
        for _ in range(args.rounds):
            for name, run in runs.items():
                before = execution_ns(control)
                times = samples.setdefault(name, [])
                for _ in range(args.iters):
                    t0 = time.perf_counter_ns()
                    run(x)
                    times.append(time.perf_counter_ns() - t0)
                after = execution_ns(control)
                mine = spent.setdefault(name, {s: [0, 0] for s in STEPS})
                for s in STEPS:
                    mine[s][0] += after[s][0] - before[s][0]
                    mine[s][1] += after[s][1] - before[s][1]
    report(samples, spent, args)


def _reference(x: np.ndarray, hidden: int) -> np.ndarray:
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(COLS, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, COLS)
    ).eval()
    with torch.inference_mode():
        return mlp(torch.from_numpy((x - 0.5) * 2.0)).numpy()


def report(samples: dict[str, list[float]], spent: dict[str, Any], args: Any) -> None:
    def p(name: str, q: float) -> float:
        ordered = sorted(samples[name])
        return ordered[min(len(ordered) - 1, int(len(ordered) * q))] / 1e6

    floor = {  # the steps' own execution, per request, as the server measured it on each path
        name: sum(ns / max(count, 1) for count, ns in steps.values()) / 1e6
        for name, steps in spent.items()
    }
    per_step = {s: spent["ensemble"][s][1] / max(spent["ensemble"][s][0], 1) / 1e6 for s in STEPS}
    print(
        f"1 MiB FP32 tensors [{ROWS}, {COLS}], MLP hidden {args.hidden}, "
        f"{args.rounds} rounds x {args.iters} requests per path, {os.cpu_count()} cpus, "
        f"pin {args.pin}, load average {os.getloadavg()[0]:.1f}"
    )
    print(
        "steps' own execution (server statistics, ensemble path): "
        + ", ".join(f"{s} {ms:.3f} ms" for s, ms in per_step.items())
        + f"; sum {floor['ensemble']:.3f} ms"
    )
    chain, hop = p("chain", 0.5), p(ROUND_TRIP, 0.5)
    print(f"a {ROUND_TRIP} (client -> broker -> worker -> back): p50 {hop:.3f} ms")
    print("| path | p50 ms | p99 ms | p50 / sum of steps | chain p50 / p50 | beyond the steps |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name in samples:
        if name == ROUND_TRIP:
            continue
        p50 = p(name, 0.5)
        print(
            f"| {name} | {p50:.3f} | {p(name, 0.99):.3f} | {p50 / floor[name]:.2f}x | "
            f"{chain / p50:.2f}x | {(p50 - floor[name]) / hop:.1f} round trips |"
        )


if __name__ == "__main__":
    main()
