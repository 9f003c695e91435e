#!/usr/bin/env python3
"""A three-step pipeline (preprocess -> TorchScript MLP -> postprocess, 1 MiB tensors) served
in several ways in one run, against its own steps:

- chain:        the client calls the three models one after another, each step's output sent
                back to the server as the next one's input (what a pipeline replaces);
- chain shm:    the same with the shared-memory client: each input written in place, each
                output read in place and written into the next request's input;
- ensemble:     one request to an ensemble of the three; the broker runs the steps, each
                reading the previous step's output where that step's worker wrote it;
- ensemble shm: the same with the shared-memory client (input written in place, the output
                read in place as a handle);
- ensemble lanes: the same with a shared-memory client whose requests take lanes
                (``lane=True``): the client's library runs the steps, each on a lane to its
                model's worker, each step's output written into the client's region where
                the next step reads it (client.lane_ensemble);
- chain lanes:  the chain shm path over lanes to the three models;
- bls:          one request to a python model that calls the three with pb_utils BLS;
- DAG at 64 B:  an ensemble of three identity steps on 64 B: what a DAG the broker runs adds
                beyond its steps, the steps themselves next to nothing;
- round trip:   a 64 B identity request, the cost of one client -> broker -> worker hop and
                back on this machine at this moment.

The floor is the steps' own execution: the sum of the three models' compute input, infer
and output per request (what Triton's statistics and perf_analyzer call the server's
compute), from the server's statistics, over the requests each path made; the ratio to the
steps' compute infer alone is printed beside it.  Paths take turns in short blocks, in a
rotating order, so that the machine's noise (other processes on its cores) falls on all of
them alike.  ``--against CHECKOUT`` serves the same paths from a second server run by
another checkout's ``.venv`` (main, say), their turns alternating with this one's: an A/B
measured in one run (the client library is this checkout's for both).

    python scripts/bench_pipeline.py [--rounds 40] [--iters 10] [--hidden 64]
    python scripts/bench_pipeline.py --against /work/main
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
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
DAG = "64 B ensemble of three identity steps"
UNCHECKED = (ROUND_TRIP, DAG)  # paths without a pipeline answer or steps of their own
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
    hop = f"input [ {small % 'INPUT0'} ] output [ {small % 'OUTPUT0'} ]"
    model("hop", f'backend: "identity" {hop}', {})
    hops = ", ".join(
        [
            map_step("hop", "INPUT0", "INPUT0", "OUTPUT0", "first"),
            map_step("hop", "INPUT0", "first", "OUTPUT0", "second"),
            map_step("hop", "INPUT0", "second", "OUTPUT0", "OUTPUT0"),
        ]
    )
    model("hops", f'platform: "ensemble" {hop} ensemble_scheduling {{ step [ {hops} ] }}', {})


# ---------------------------------------------------------------------------- the paths
Run = Callable[[np.ndarray], np.ndarray]
STEP_IO = (
    ("pre", "RAW", "INPUT__0"),
    ("mlp", "INPUT__0", "OUTPUT__0"),
    ("post", "OUTPUT__0", "SCORE"),
)


def paths(endpoint: str, stack: contextlib.ExitStack) -> dict[str, Run]:
    c = stack.enter_context(Client(endpoint, timeout=60))
    shm = stack.enter_context(ShmClient(endpoint, timeout=60, input_bytes=8 << 20))
    request = shm.request("pipeline", ["SCORE"])
    raw = request.input("RAW", (ROWS, COLS), np.float32)
    lanes = stack.enter_context(ShmClient(endpoint, timeout=60, input_bytes=16 << 20, lane=True))
    over_lanes = lanes.request("pipeline", ["SCORE"])
    raw_on_lanes = over_lanes.input("RAW", (ROWS, COLS), np.float32)
    steps, step_inputs = chain_requests(shm)
    lane_steps, lane_step_inputs = chain_requests(lanes)

    def chain(x: np.ndarray) -> np.ndarray:
        y = c.infer("pre", {"RAW": x})["INPUT__0"]
        z = c.infer("mlp", {"INPUT__0": y})["OUTPUT__0"]
        return c.infer("post", {"OUTPUT__0": z})["SCORE"]

    def chain_shm(x: np.ndarray) -> np.ndarray:
        return run_chain(shm, steps, step_inputs, x)

    def chain_lanes(x: np.ndarray) -> np.ndarray:
        return run_chain(lanes, lane_steps, lane_step_inputs, x)

    def ensemble_lanes(x: np.ndarray) -> np.ndarray:
        np.copyto(raw_on_lanes, x)
        with lanes.run(over_lanes) as result:
            return np.asarray(result["SCORE"][0, :4]).copy()

    def ensemble(x: np.ndarray) -> np.ndarray:
        return c.infer("pipeline", {"RAW": x})["SCORE"]

    def ensemble_shm(x: np.ndarray) -> np.ndarray:
        np.copyto(raw, x)
        with shm.run(request) as result:
            return np.asarray(result["SCORE"][0, :4]).copy()

    def bls(x: np.ndarray) -> np.ndarray:
        return c.infer("pipeline_bls", {"RAW": x})["SCORE"]

    small = np.zeros(16, np.float32)

    def round_trip(x: np.ndarray) -> np.ndarray:
        return c.infer("hop", {"INPUT0": small})["OUTPUT0"]

    def dag(x: np.ndarray) -> np.ndarray:
        return c.infer("hops", {"INPUT0": small})["OUTPUT0"]

    return {
        "chain": chain,
        "chain shm": chain_shm,
        "ensemble": ensemble,
        "ensemble shm": ensemble_shm,
        "chain lanes": chain_lanes,
        "ensemble lanes": ensemble_lanes,
        "bls": bls,
        ROUND_TRIP: round_trip,
        DAG: dag,
    }


def chain_requests(client: ShmClient) -> tuple[list[Any], list[np.ndarray]]:
    """The chain's three requests and their inputs' arrays, in ``client``'s region."""
    steps = [client.request(model, [out]) for model, _, out in STEP_IO]
    inputs = [
        r.input(inp, (ROWS, COLS), np.float32)
        for r, (_, inp, _) in zip(steps, STEP_IO, strict=True)
    ]
    return steps, inputs


def run_chain(
    client: ShmClient, steps: list[Any], inputs: list[np.ndarray], x: np.ndarray
) -> np.ndarray:
    np.copyto(inputs[0], x)  # the client's producer would write here in the first place
    for i, (_, _, out) in enumerate(STEP_IO[:-1]):
        with client.run(steps[i]) as result:  # read in place, written into the next input
            np.copyto(inputs[i + 1], result[out])
    with client.run(steps[-1]) as result:
        return np.asarray(result["SCORE"][0, :4]).copy()


PARTS = ("compute_input", "compute_infer", "compute_output")


def counters(c: Client) -> dict[str, list[int]]:
    """Per step: [requests, ns of compute input, infer, output], from the statistics."""
    out = {}
    for name in STEPS:
        s = c.statistics(name)["model_stats"][0]["inference_stats"]
        out[name] = [s["success"]["count"], *(s[part]["ns"] for part in PARTS)]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=40, help="turns of every path")
    parser.add_argument("--iters", type=int, default=10, help="requests per path per turn")
    parser.add_argument("--hidden", type=int, default=64, help="the MLP's hidden width")
    parser.add_argument("--threads", type=int, default=1, help="the MLP's intra-op threads")
    parser.add_argument("--pin", choices=("auto", "none"), default="auto", help="the server's")
    parser.add_argument(
        "--against",
        metavar="CHECKOUT",
        help="also serve from this checkout (its .venv's python), turns alternating: an A/B",
    )
    args = parser.parse_args()
    x = np.random.default_rng(0).random((ROWS, COLS), dtype=np.float32)
    expected = np.maximum(_reference(x, args.hidden), 0)  # checks every path's answer
    pythons = {THIS: sys.executable}
    if args.against:
        base = Path(args.against).resolve()
        pythons[base.name if base.name != THIS else BASE] = str(base / ".venv" / "bin" / "python")
    samples: dict[str, list[int]] = {}
    spent: dict[str, dict[str, list[int]]] = {}  # path -> step -> [requests, ns per part]
    load = [os.getloadavg()[0]]
    with (
        tempfile.TemporaryDirectory(prefix="ibp-", dir="/tmp") as tmp,
        contextlib.ExitStack() as st,
    ):
        runs: dict[str, tuple[Client, Run]] = {}
        for server, python in pythons.items():
            repo = Path(tmp) / server / "repo"
            write_repository(repo, args.hidden, args.threads)
            server_args = ("--arena-size", "64M", "--output-arena-size", "64M", "--pin", args.pin)
            control = serve(repo, st, *server_args, python=python)
            for name, run in paths(control.endpoint, st).items():
                runs[label(name, server, len(pythons))] = (control, run)
        for name, (_, run) in runs.items():  # warm up, and check the answers
            for _ in range(20):
                got = run(x)
            if not name.startswith(UNCHECKED):
                want = expected[0, :4] if "shm" in name or "lanes" in name else expected
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=name)
        names = list(runs)
        for turn in range(args.rounds):
            for name in names[turn % len(names) :] + names[: turn % len(names)]:
                control, run = runs[name]
                before = counters(control)
                times = samples.setdefault(name, [])
                for _ in range(args.iters):
                    t0 = time.perf_counter_ns()
                    run(x)
                    times.append(time.perf_counter_ns() - t0)
                after = counters(control)
                mine = spent.setdefault(name, {s: [0] * 4 for s in STEPS})
                for s in STEPS:
                    mine[s] = [
                        m + a - b for m, a, b in zip(mine[s], after[s], before[s], strict=True)
                    ]
        load.append(os.getloadavg()[0])
    report(samples, spent, args, load, list(pythons))


THIS, BASE = "this", "base"


def label(path: str, server: str, servers: int) -> str:
    return path if servers == 1 else f"{path} [{server}]"


def _reference(x: np.ndarray, hidden: int) -> np.ndarray:
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(COLS, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, COLS)
    ).eval()
    with torch.inference_mode():
        return mlp(torch.from_numpy((x - 0.5) * 2.0)).numpy()


def report(
    samples: dict[str, list[int]],
    spent: dict[str, Any],
    args: Any,
    load: list[float],
    servers: list[str],
) -> None:
    def p(name: str, q: float) -> float:
        ordered = sorted(samples[name])
        return ordered[min(len(ordered) - 1, int(len(ordered) * q))] / 1e6

    def mean_ms(steps: dict[str, list[int]], step: str, part: int) -> float:
        return steps[step][1 + part] / max(steps[step][0], 1) / 1e6

    def floor(name: str, parts: Sequence[int] = (0, 1, 2)) -> float:
        """The steps' own execution per request on path ``name``: compute input, infer
        and output (Triton's server compute), or the parts named."""
        return sum(mean_ms(spent[name], s, part) for s in STEPS for part in parts)

    print(
        f"1 MiB FP32 tensors [{ROWS}, {COLS}], MLP {COLS}-{args.hidden}-{COLS} "
        f"({args.threads} thread), {args.rounds} turns x {args.iters} requests per path, "
        f"{os.cpu_count()} cpus, pin {args.pin}, load average {load[0]:.1f} -> {load[1]:.1f}"
    )
    for server in servers:
        ens = spent[label("ensemble", server, len(servers))]
        print(
            f"{server}: steps' compute input / infer / output (server statistics, ensemble "
            "path): "
            + ", ".join(
                f"{s} {' / '.join(f'{mean_ms(ens, s, part):.3f}' for part in range(3))}"
                for s in STEPS
            )
            + f" ms; sum {floor(label('ensemble', server, len(servers))):.3f} ms"
        )
        hop = label(ROUND_TRIP, server, len(servers))
        print(f"{server}: a {ROUND_TRIP} (client -> broker -> worker -> back): {p(hop, 0.5):.3f}")
        dag = p(label(DAG, server, len(servers)), 0.5)
        steps = floor(label("ensemble", server, len(servers)))
        print(
            f"{server}: a {DAG} (what a DAG run by the broker adds, at least): {dag:.3f} ms = "
            f"{dag / steps:.2f} x the steps above (a p50 of 1.2 x the steps leaves 0.2 x them)"
        )
    print(
        "| path | p50 ms | p99 ms | p50 / steps | p50 / steps' infer | chain p50 / p50 "
        "| beyond the steps |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in samples:
        if name.startswith(UNCHECKED):
            continue
        server = name.rpartition("[")[2].rstrip("]") if len(servers) > 1 else servers[0]
        kind = next((k for k in ("shm", "lanes") if k in name), "")
        chain = label(f"chain {kind}".strip(), server, len(servers))
        hop_p50 = p(label(ROUND_TRIP, server, len(servers)), 0.5)
        p50 = p(name, 0.5)
        print(
            f"| {name} | {p50:.3f} | {p(name, 0.99):.3f} | {p50 / floor(name):.2f}x | "
            f"{p50 / floor(name, (1,)):.2f}x | {p(chain, 0.5) / p50:.2f}x | "
            f"{(p50 - floor(name)) / hop_p50:.1f} round trips |"
        )
    for server in servers:
        beyond = {  # each path's time beyond its own steps
            path: p(label(path, server, len(servers)), 0.5)
            - floor(label(path, server, len(servers)))
            for path in ("chain", "chain shm", "chain lanes", "ensemble", "ensemble shm")
        }
        print(
            f"{server}: chain's time beyond its steps / the ensemble's (p50 <= 1.2 x the steps "
            "and 2 x faster than the chain need 7 or more, whatever the steps take): "
            f"Client {beyond['chain'] / beyond['ensemble']:.2f}, ShmClient "
            f"{beyond['chain shm'] / beyond['ensemble shm']:.2f}, the Client chain against the "
            f"ShmClient ensemble {beyond['chain'] / beyond['ensemble shm']:.2f}"
        )
        lanes = label("ensemble lanes", server, len(servers))
        p50 = p(lanes, 0.5)
        print(
            f"{server}: the ensemble over lanes: p50 {p50 / floor(lanes):.2f} x its steps "
            "(goal <= 1.2); the chains' p50 over it (goal >= 2): "
            + ", ".join(
                f"{kind} {p(label(path, server, len(servers)), 0.5) / p50:.2f}x"
                for kind, path in (
                    ("Client", "chain"),
                    ("ShmClient", "chain shm"),
                    ("ShmClient over lanes", "chain lanes"),
                )
            )
        )
    if len(servers) > 1:
        print(f"| path | {servers[1]} p50 ms | {servers[0]} p50 ms | {servers[1]} / {servers[0]} |")
        print("| --- | ---: | ---: | ---: |")
        for path in (n for n in samples if n.endswith(f"[{servers[0]}]")):
            base = path.replace(f"[{servers[0]}]", f"[{servers[1]}]")
            a, b = p(base, 0.5), p(path, 0.5)
            print(f"| {path.rpartition(' [')[0]} | {a:.3f} | {b:.3f} | {a / b:.2f}x |")


if __name__ == "__main__":
    main()
