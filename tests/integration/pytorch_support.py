"""Helpers for serving TorchScript models built by a test: repositories, pipelined requests."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from inferpool.client import Client
from inferpool.shm.runs import regions_of_run
from tests.backends.pytorch import torch_models as tm
from tests.support import Server

ONE_THREAD = 'parameters { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "1" } }'


def cpu_instances(count: int) -> str:
    return f"instance_group [{{ count: {count} kind: KIND_CPU }}]"


def model_dir(repo: Path, name: str, config: str, module: torch.nn.Module | None) -> Path:
    """``<repo>/<name>/config.pbtxt`` and, unless ``module`` is None, ``1/model.pt``."""
    d = repo / name
    (d / "1").mkdir(parents=True)
    (d / "config.pbtxt").write_text(config)
    if module is not None:
        tm.save(module, d)
    return d


@contextlib.contextmanager
def serving(build: Callable[[Path], None], *args: str) -> Iterator[Server]:
    """A server over the repository ``build`` writes; on exit, checks nothing of it is left."""
    tmp = Path(tempfile.mkdtemp(prefix="ipt-", dir="/tmp"))  # ipc paths must stay short
    try:
        build(tmp / "repo")
        with Server(tmp, tmp / "repo", *args) as server:
            run = server.run_id
            yield server
        assert server.proc.returncode == 0, server.log()
        assert regions_of_run(run) == []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def send(c: Client, model: str, inputs: dict[str, np.ndarray], **parameters: object) -> str:
    """Send an FP32 infer request without waiting for the response; returns its id."""
    specs = [{"name": n, "datatype": "FP32", "shape": list(a.shape)} for n, a in inputs.items()]
    header = {"type": "infer", "model_name": model, "inputs": specs, "parameters": parameters}
    return c._send(header, [a.data for a in inputs.values()])


def result(c: Client, rid: str) -> dict[str, np.ndarray]:
    """The FP32 outputs of the response to ``rid`` (fails on an error response)."""
    header, frames = c._recv(rid, 30)
    assert "error" not in header, header
    return {
        o["name"]: np.frombuffer(f.buffer, np.float32).reshape(o["shape"])
        for o, f in zip(header["outputs"], frames, strict=True)
    }
