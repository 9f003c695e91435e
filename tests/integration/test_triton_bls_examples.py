"""Triton's own BLS examples, served unchanged: python_backend's examples/bls (sync and async)
and examples/bls_decoupled (sync and async), with the add_sub, pytorch and square models
they call, their model.py and config.pbtxt copied byte for byte into a repository and driven
with inferpool's client as their client scripts drive Triton (the same inputs, the same
checks, the same printed error for an undefined model).

The examples are Triton's files, not this project's: point ``INFERPOOL_TRITON_PYTHON_BACKEND``
at a checkout of triton-inference-server/python_backend (or at its git directory); without
it the module is skipped.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from inferpool.client import InferpoolError
from tests.support import Server, serving

SOURCE = os.environ.get("INFERPOOL_TRITON_PYTHON_BACKEND", "")
pytestmark = pytest.mark.skipif(
    not SOURCE, reason="set INFERPOOL_TRITON_PYTHON_BACKEND to a python_backend checkout"
)

# repository model -> (its model.py, its config.pbtxt) in python_backend
MODELS = {
    "add_sub": ("examples/add_sub/model.py", "examples/add_sub/config.pbtxt"),
    "pytorch": ("examples/pytorch/model.py", "examples/pytorch/config.pbtxt"),
    "square_int32": (
        "examples/decoupled/square_model.py",
        "examples/decoupled/square_config.pbtxt",
    ),
    "bls_sync": ("examples/bls/sync_model.py", "examples/bls/sync_config.pbtxt"),
    "bls_async": ("examples/bls/async_model.py", "examples/bls/async_config.pbtxt"),
    "bls_decoupled_sync": (
        "examples/bls_decoupled/sync_model.py",
        "examples/bls_decoupled/sync_config.pbtxt",
    ),
    "bls_decoupled_async": (
        "examples/bls_decoupled/async_model.py",
        "examples/bls_decoupled/async_config.pbtxt",
    ),
}


def read_source(path: str) -> bytes:
    """A file of the python_backend checkout (or git directory), as it is there."""
    root = Path(SOURCE)
    if (root / path).is_file():
        return (root / path).read_bytes()
    return subprocess.run(
        ["git", f"--git-dir={root}", "show", f"HEAD:{path}"], check=True, capture_output=True
    ).stdout


def repository(tmp: Path) -> Path:
    """The examples' models and configs, copied byte for byte."""
    for name, (model_py, config) in MODELS.items():
        (tmp / "repo" / name / "1").mkdir(parents=True)
        (tmp / "repo" / name / "1" / "model.py").write_bytes(read_source(model_py))
        (tmp / "repo" / name / "config.pbtxt").write_bytes(read_source(config))
    return tmp / "repo"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from serving(repository)


def test_bls_sync_calls_the_model_its_input_names(server: Server) -> None:
    """examples/bls/sync_client.py: add_sub, then pytorch, then an undefined model."""
    a = np.random.rand(4).astype(np.float32)
    b = np.random.rand(4).astype(np.float32)
    with server.client() as c:
        assert all(m["state"] == "READY" for m in c.models()), c.models()
        for model in ("add_sub", "pytorch"):
            names = np.array([model], dtype=np.object_)
            out = c.infer(
                "bls_sync",
                {"INPUT0": a, "INPUT1": b, "MODEL_NAME": names},
                ["OUTPUT0", "OUTPUT1"],
            )
            assert np.allclose(a + b, out["OUTPUT0"]) and np.allclose(a - b, out["OUTPUT1"])
        with pytest.raises(InferpoolError) as err:
            names = np.array(["undefined_model"], dtype=np.object_)
            c.infer("bls_sync", {"INPUT0": a, "INPUT1": b, "MODEL_NAME": names})
    assert "Failed for execute the inference request. Model 'undefined_model' is not ready." in (
        err.value.message
    )


def test_bls_async_gathers_two_calls(server: Server) -> None:
    """examples/bls/async_client.py."""
    a = np.random.rand(4).astype(np.float32)
    b = np.random.rand(4).astype(np.float32)
    with server.client() as c:
        out = c.infer("bls_async", {"INPUT0": a, "INPUT1": b}, ["OUTPUT0", "OUTPUT1"])
    assert np.allclose(a + b, out["OUTPUT0"]) and np.allclose(a - b, out["OUTPUT1"])


@pytest.mark.parametrize(
    ("model", "times"), [("bls_decoupled_sync", 1), ("bls_decoupled_async", 2)]
)
def test_bls_decoupled_sums_the_streams(server: Server, model: str, times: int) -> None:
    """examples/bls_decoupled/{sync,async}_client.py: the square of IN (twice for async)."""
    with server.client() as c:
        for value in (4, 2, 0, 1):
            data = np.array([value], dtype=np.int32)
            out = c.infer(model, {"IN": data}, ["SUM"])
            assert np.allclose(times * data * data, out["SUM"]), (value, out["SUM"])
