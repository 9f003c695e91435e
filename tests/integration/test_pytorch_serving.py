"""The pytorch backend served for real: TorchScript models built here, one server for all.

Real ``inferpool serve``, real workers importing torch, requests over zmq.  Sequence models
are in test_pytorch_sequences.py, weight sharing in test_pytorch_weight_sharing.py.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from inferpool.client import InferpoolError, ShmClient
from tests.backends.pytorch import torch_models as tm
from tests.integration.pytorch_support import (
    ONE_THREAD,
    cpu_instances,
    model_dir,
    result,
    send,
    serving,
)
from tests.support import ROOT, Server

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")

LINEAR_IO = [tm.inp("INPUT__0", "TYPE_FP32", [4])], [tm.out("OUTPUT__0", "TYPE_FP32", [2])]


def build_repository(repo: Path) -> None:
    def cfg(name: str, inputs: list[str], outputs: list[str], mbs: int = 0, extra: str = "") -> str:
        return tm.config(
            inputs,
            outputs,
            max_batch_size=mbs,
            name=name,
            extra=f"{cpu_instances(1)}\n{ONE_THREAD}\n{extra}",
        )

    for example in ("linear", "accumulate"):  # the example repository's models, as committed
        shutil.copytree(ROOT / "examples" / "pytorch_repository" / example, repo / example)
    batcher = "dynamic_batching { max_queue_delay_microseconds: 500000 }"
    batched = cfg("batched", *LINEAR_IO, mbs=8, extra=batcher)
    platform = batched.replace('backend: "pytorch"', 'platform: "pytorch_libtorch"')
    model_dir(repo, "batched", platform, tm.Linear())
    model_dir(
        repo,
        "addsub",
        cfg(
            "addsub",
            [tm.inp("INPUT__1", "TYPE_FP32", [-1]), tm.inp("INPUT__0", "TYPE_FP32", [-1])],
            [tm.out("OUTPUT__1", "TYPE_FP32", [-1]), tm.out("OUTPUT__0", "TYPE_FP32", [-1])],
        ),
        tm.AddSub(),
    )
    model_dir(
        repo,
        "dict_in",
        cfg(
            "dict_in",
            [tm.inp("x", "TYPE_INT64", [3]), tm.inp("y", "TYPE_INT64", [3])],
            [tm.out("OUTPUT__0", "TYPE_INT64", [3])],
            mbs=4,
        ),
        tm.DictInput(),
    )
    model_dir(
        repo,
        "upper",
        cfg(
            "upper",
            [tm.inp("INPUT__0", "TYPE_STRING", [1], "reshape: { shape: [] }")],
            [
                tm.out("OUTPUT__0", "TYPE_STRING", [1], "reshape: { shape: [] }"),
                tm.out("OUTPUT__1", "TYPE_INT64", [1]),
            ],
            mbs=8,
        ),
        tm.Upper(),
    )
    grows = [tm.inp("INPUT__0", "TYPE_FP32", [4])], [tm.out("OUTPUT__0", "TYPE_FP32", [4])]
    model_dir(repo, "grows", cfg("grows", *grows, mbs=8), tm.GrowsItsInput())
    model_dir(repo, "nofile", cfg("nofile", *LINEAR_IO), None)
    bad = 'parameters { key: "INFERENCE_MODE" value: { string_value: "maybe" } }'
    model_dir(repo, "badparam", cfg("badparam", *LINEAR_IO, extra=bad), tm.Linear())


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with serving(build_repository, "--exit-on-error=false") as srv:  # with models that fail
        yield srv


def linear(x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return tm.Linear()(torch.from_numpy(x)).numpy()


# ---------------------------------------------------------------------------- inference
def test_dynamic_batching_splits_outputs_back_per_request(server: Server) -> None:
    rng = np.random.default_rng(1)
    rows = [1, 2, 1, 2, 1, 1]  # 8 rows: the batcher's target, so it dispatches at once
    xs = [rng.random((n, 4), dtype=np.float32) for n in rows]
    clients = [server.client() for _ in xs]
    try:
        before = clients[0].statistics("batched")["model_stats"][0]["execution_count"]
        ids = [send(c, "batched", {"INPUT__0": x}) for c, x in zip(clients, xs, strict=True)]
        for c, rid, x in zip(clients, ids, xs, strict=True):
            np.testing.assert_allclose(result(c, rid)["OUTPUT__0"], linear(x), rtol=1e-5)
        stats = clients[0].statistics("batched")["model_stats"][0]
    finally:
        for c in clients:
            c.close()
    assert stats["execution_count"] - before < len(xs)
    assert max(b["batch_size"] for b in stats["batch_stats"]) > 1
    assert stats["inference_stats"]["compute_infer"]["ns"] > 0


def test_platform_pytorch_libtorch_without_backend(server: Server) -> None:
    with server.client() as c:
        assert c.model_metadata("batched")["platform"] == "pytorch_libtorch"
        config = c.model_config("batched")
        assert config["backend"] == "pytorch"  # implied by the platform, as in Triton


def test_multiple_inputs_and_outputs_by_index(server: Server) -> None:
    a, b = np.array([5, 7, 9], np.float32), np.array([1, 2, 3], np.float32)
    with server.client() as c:
        out = c.infer("addsub", {"INPUT__0": a, "INPUT__1": b})
        np.testing.assert_array_equal(out["OUTPUT__0"], a + b)
        np.testing.assert_array_equal(out["OUTPUT__1"], a - b)
        assert list(c.infer("addsub", {"INPUT__0": a, "INPUT__1": b}, ["OUTPUT__1"])) == [
            "OUTPUT__1"
        ]


def test_dict_input(server: Server) -> None:
    x, y = np.arange(6).reshape(2, 3), np.full((2, 3), 10)
    with server.client() as c:
        np.testing.assert_array_equal(c.infer("dict_in", {"x": x, "y": y})["OUTPUT__0"], x * 2 + y)


def test_strings_in_and_out(server: Server) -> None:
    words = np.array([[b"ab"], ["\u00e9t\u00e9".encode()], [b""]], dtype=object)
    with server.client() as c:
        out = c.infer("upper", {"INPUT__0": words})
        assert out["OUTPUT__0"].tolist() == [[b"AB"], ["\u00e9T\u00e9".encode()], [b""]]
        assert out["OUTPUT__1"].tolist() == [[2], [5], [0]]  # TorchScript len() counts bytes
        with pytest.raises(
            InferpoolError, match="element 0 of input 'INPUT__0' is not valid UTF-8"
        ):
            c.infer("upper", {"INPUT__0": np.array([[b"\xff"]], dtype=object)})


def test_load_failures_name_the_file_and_the_parameter(server: Server) -> None:
    with server.client() as c:
        index = {m["name"]: m for m in c.models()}
        nofile = index["nofile"]
        assert nofile["state"] == "UNAVAILABLE"
        path = Path(server.log_path).parent / "repo" / "nofile" / "1" / "model.pt"
        assert f"unable to find '{path}' for model instance 'nofile_0_0'" in nofile["reason"]
        assert index["badparam"]["state"] == "UNAVAILABLE"
        assert "INFERENCE_MODE" in index["badparam"]["reason"]
        assert "maybe" in index["badparam"]["reason"]
        with pytest.raises(InferpoolError, match="unable to find") as err:
            c.infer("nofile", {"INPUT__0": np.ones(4, np.float32)})
        assert err.value.code.value == "UNAVAILABLE"
        # the other models are served all the same
        assert c.infer(
            "addsub", {"INPUT__0": np.ones(1, np.float32), "INPUT__1": np.ones(1, np.float32)}
        )


def test_sequence_flags_to_a_model_without_sequence_batching_are_passed_on(server: Server) -> None:
    """As Triton's default and dynamic schedulers: no affinity, no error."""
    a, b = np.ones(2, np.float32), np.full(2, 2, np.float32)
    with server.client() as c:
        for flags in ({"sequence_start": True}, {}, {"sequence_end": True}):
            out = c.infer(
                "addsub", {"INPUT__0": a, "INPUT__1": b}, parameters={"sequence_id": 9, **flags}
            )
            np.testing.assert_array_equal(out["OUTPUT__0"], a + b)


def test_the_example_pytorch_repository(server: Server) -> None:
    """examples/pytorch_repository as documented: its committed model.pt files and configs."""
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    with server.client() as c:
        np.testing.assert_allclose(
            c.infer("linear", {"INPUT__0": x})["OUTPUT__0"], linear(x), rtol=1e-5
        )
        totals = []
        for i, value in enumerate([1.0, 2.0, 3.0]):
            flags = {"sequence_id": 17, "sequence_start": i == 0, "sequence_end": i == 2}
            out = c.infer(
                "accumulate", {"INPUT__0": np.array([[value]], np.float32)}, parameters=flags
            )
            totals.append(out["OUTPUT__0"].item())
        assert totals == [1.0, 3.0, 6.0]


def test_a_lane_request_reads_its_slot_anew_and_the_models_shape_changes_stay_its_own(
    server: Server,
) -> None:
    """The worker keeps one tensor over a lane's input slot (InputTensor.made) and gives
    each request a view of its own: what the client writes there is read every time, and
    the shape the model changes in place (unsqueeze_) is not the next request's."""
    with ShmClient(server.endpoint, timeout=30) as c:
        c.lane("grows")
        req = c.request("grows", outputs=["OUTPUT__0"])
        slot = req.input("INPUT__0", (1, 4), np.float32)
        for k in range(4):
            slot[:] = np.arange(4) + k
            with c.run(req) as result:
                got = np.array(result["OUTPUT__0"])
            assert got.shape == (1, 4)
            np.testing.assert_array_equal(got, (np.arange(4, dtype=np.float32) + k)[None] * 2)
