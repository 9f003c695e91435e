"""The floor of ``bench_models.py``: the runtime called in-process, as a served instance runs.

A served instance runs pinned to its cores, with one intra-op thread per pinned core (the
onnxruntime backend's ``intra_op_thread_count`` 0, openvino's ``INFERENCE_NUM_THREADS``, the
worker's torch and OpenMP threads).  The floor is the same runtime in a process of its own,
pinned to the same cores with the same thread count, called by one Python thread: a floor
on other cores or with other threads compares the cores or the threads, not the paths.  The
process stays up between measurements, so that ``bench_models.py`` can time the floor
between its served runs (interleaved: the load of a shared machine weighs on both alike).

    floor = Floor("onnxruntime", Path("model.onnx"), InputSpec("float32", (3, 224, 224), 0),
                  cores=[1])
    calls = floor.time(batch=8, seconds=2.0)   # (latency, CPU time) of each call, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")  # as the worker's


@dataclass(frozen=True)
class InputSpec:
    """A model's one input past the batch dimension: numpy dtype, dims, and for integer
    inputs the values' bound (token ids below ``high``)."""

    dtype: str
    dims: tuple[int, ...]
    high: int

    @property
    def config_type(self) -> str:
        return {"float32": "TYPE_FP32", "int64": "TYPE_INT64"}[self.dtype]

    def make(self, rows: int) -> np.ndarray:
        rng = np.random.default_rng(rows)
        if self.dtype == "float32":
            return rng.random((rows, *self.dims), dtype=np.float32)
        return rng.integers(0, self.high, (rows, *self.dims), dtype=np.dtype(self.dtype))


class Floor:
    """The runtime in a process pinned to ``cores``, one intra-op thread per core."""

    def __init__(self, backend: str, path: Path, spec: InputSpec, cores: list[int]) -> None:
        threads = len(cores)
        env = {**os.environ, **{var: str(threads) for var in THREAD_ENV}}
        cmd = [sys.executable, __file__, backend, str(path), spec.dtype]
        cmd += [",".join(map(str, spec.dims)), str(spec.high), str(threads)]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            preexec_fn=lambda: os.sched_setaffinity(0, cores),
        )
        self._read()  # "ready": the model is loaded

    def _read(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the floor process ended (exit {self.proc.wait()})")
        return json.loads(line)

    def time(self, batch: int, seconds: float, least: int = 3) -> list[tuple[float, float]]:
        """Calls at ``batch`` rows for ``seconds`` and ``least`` calls: each one's latency
        and the CPU time the floor's process spent in it (all its threads), in seconds."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps([batch, seconds, least]) + "\n")
        self.proc.stdin.flush()
        return [(wall, cpu) for wall, cpu in self._read()]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(60)


def runtime(backend: str, path: str, threads: int) -> Callable[[np.ndarray], Any]:
    """One call of the runtime, configured as the backend configures an instance's."""
    if backend == "onnxruntime":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        return lambda x: session.run(None, {"INPUT__0": x})[0]
    if backend == "openvino":
        import openvino as ov

        compiled = ov.Core().compile_model(path, "CPU", {"INFERENCE_NUM_THREADS": threads})
        request = compiled.create_infer_request()
        return lambda x: request.infer([x], share_inputs=True, share_outputs=True)[0]
    import torch

    torch.set_num_threads(threads)
    module = torch.jit.load(path)

    def call(x: np.ndarray) -> Any:
        with torch.inference_mode():
            return module(torch.from_numpy(x)).numpy()

    return call


def serve_floor() -> None:
    """The floor process: loads the model, then times what each line of stdin asks."""
    parser = argparse.ArgumentParser()
    for arg in ("backend", "path", "dtype", "dims", "high", "threads"):
        parser.add_argument(arg)
    args = parser.parse_args()
    dims = tuple(int(d) for d in args.dims.split(","))
    spec = InputSpec(args.dtype, dims, int(args.high))
    call = runtime(args.backend, args.path, int(args.threads))
    print(json.dumps("ready"), flush=True)
    inputs: dict[int, np.ndarray] = {}
    for line in sys.stdin:
        batch, seconds, least = json.loads(line)
        if batch not in inputs:
            inputs[batch] = spec.make(batch)
            call(inputs[batch])  # warm: the first call at a batch size plans it
            call(inputs[batch])
        x = inputs[batch]
        samples: list[tuple[float, float]] = []
        end = time.perf_counter() + seconds
        while len(samples) < least or time.perf_counter() < end:
            start, cpu = time.perf_counter(), time.process_time()
            call(x)
            samples.append((time.perf_counter() - start, time.process_time() - cpu))
        print(json.dumps(samples), flush=True)


if __name__ == "__main__":
    serve_floor()
