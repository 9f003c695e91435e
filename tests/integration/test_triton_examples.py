"""A Triton user's own files: python_backend's examples, byte for byte
(tests/third_party/triton_python_backend), served by inferpool and driven with its clients the way
the examples' client.py scripts drive Triton: add_sub, auto_complete, pytorch, decoupled, and
the BLS examples (examples/bls and examples/bls_decoupled, each with a sync and an async model)
calling them.

``nobatch_auto_complete`` and ``batch_auto_complete`` ship no config.pbtxt: the backend is
inferred from ``1/model.py`` and ``auto_complete_config`` fills the rest.  The served
``model_config`` is Triton's JSON: numbers for int64 fields, defaults printed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from inferpool.client import AsyncClient, InferpoolError
from tests.support import ROOT, Server, copy_models, serving

EXAMPLES = ROOT / "tests" / "third_party" / "triton_python_backend"


def int32(n: int) -> np.ndarray:
    return np.array([n], np.int32)


FP32_IOS = [
    {"name": name, "data_type": "TYPE_FP32", "dims": [4]}
    for name in ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")
]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from serving(lambda tmp: copy_models(tmp, EXAMPLES))  # serving writes __pycache__


def test_every_example_loads(server: Server) -> None:
    with server.client() as c:
        index = {m["name"]: (m["state"], m["reason"]) for m in c.models()}
    assert index == {
        name: ("READY", "")
        for name in (
            "add_sub",
            "batch_auto_complete",
            "bls_async",
            "bls_decoupled_async",
            "bls_decoupled_sync",
            "bls_sync",
            "nobatch_auto_complete",
            "pytorch",
            "repeat_int32",
            "square_int32",
        )
    }


@pytest.mark.parametrize(
    ("model", "max_batch_size"), [("nobatch_auto_complete", 0), ("batch_auto_complete", 4)]
)
def test_auto_complete_without_a_config_file(
    server: Server, model: str, max_batch_size: int
) -> None:
    """What examples/auto_complete/client.py checks, then an inference."""
    with server.client() as c:
        config = c.model_config(model)
        assert config["max_batch_size"] == max_batch_size  # printed, also when 0
        ios = [
            {k: io[k] for k in ("name", "data_type", "dims")}
            for io in config["input"] + config["output"]
        ]
        assert ios == FP32_IOS  # dims as numbers
        assert config["backend"] == "python" and config["name"] == model
        a, b = np.arange(4, dtype=np.float32), np.ones(4, np.float32)
        shape = (1, 4) if max_batch_size else (4,)
        out = c.infer(model, {"INPUT0": a.reshape(shape), "INPUT1": b.reshape(shape)})
    np.testing.assert_array_equal(out["OUTPUT0"].reshape(4), a + b)
    np.testing.assert_array_equal(out["OUTPUT1"].reshape(4), a - b)


def test_the_served_config_is_tritons_json(server: Server) -> None:
    with server.client() as c:
        config = c.model_config("add_sub")
    assert config["input"][0]["dims"] == [4] and config["max_batch_size"] == 0
    assert config["input"][0]["optional"] is False  # defaults are printed
    assert config["instance_group"][0]["count"] == 1
    assert config["version_policy"] == {"latest": {"num_versions": 1}}
    assert config["output"][0]["label_filename"] == ""


@pytest.mark.parametrize("model", ["add_sub", "pytorch"])
def test_add_sub_and_pytorch(server: Server, model: str) -> None:
    a = np.random.default_rng(0).random(4, dtype=np.float32)
    b = np.random.default_rng(1).random(4, dtype=np.float32)
    with server.client() as c:
        out = c.infer(model, {"INPUT0": a, "INPUT1": b})
    np.testing.assert_allclose(out["OUTPUT0"], a + b)
    np.testing.assert_allclose(out["OUTPUT1"], a - b)


def test_both_decoupled_examples_stream(server: Server) -> None:
    """square_client.py's and repeat_client.py's checks, with the sync and asyncio clients."""
    with server.client() as c:
        square = {
            n: [r.outputs["OUT"].tolist() for r in c.stream("square_int32", {"IN": int32(n)})]
            for n in (4, 2, 0, 1)
        }
    assert square == {4: [[4]] * 4, 2: [[2]] * 2, 0: [], 1: [[1]]}

    values = np.array([4, 2, 0, 1], np.int32)
    inputs = {
        "IN": values,
        "DELAY": np.array([1, 2, 3, 4], np.uint32),
        "WAIT": np.array([5], np.uint32),
    }

    async def repeat() -> list[tuple[int, int]]:
        async with AsyncClient(server.endpoint, timeout=10) as c:
            return [
                (int(r.outputs["IDX"][0]), int(r.outputs["OUT"][0]))
                async for r in c.stream("repeat_int32", inputs)
            ]

    assert asyncio.run(repeat()) == [(i, int(v)) for i, v in enumerate(values)]


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
