"""Ensembles served for real: the broker runs the steps on the composing models' workers.

One server for the module; its repository has a chain (python -> identity -> python) whose
last step reports where its input lay, parallel branches, a step pinned to a version, a
decoupled step, a batching ensemble, a step that fails or crashes on demand, and ensembles
that cannot load (unknown model, mismatched tensors).  Intermediate tensors stay in the
workers' output arenas: the chain's last step reads its input from the previous step's arena.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from inferpool.broker.sched_slice import current_slice_ns
from inferpool.client import Code, InferpoolError, ShmClient
from tests.support import Server, identity_config, serving, write_model

PRE = """
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if x[0] == -1:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("pre refuses -1")))
                continue
            if x[0] == -2:
                os._exit(3)  # a crash mid-pipeline, with the code a worker's failed boot uses
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)]))
        return responses
"""

# Y = X + 1, and where X lay: a region name (the arena, or another worker's output arena)
POST = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            where = np.array([x._shared[0].encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", x.as_numpy() + 1),
                pb_utils.Tensor("SOURCE", where),
            ]))
        return responses
"""

# sleeps, and says when it ran
SLOW = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        start = time.monotonic()
        time.sleep(0.4)
        span = np.array([start, time.monotonic()], np.float64)
        return [
            pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy()),
                pb_utils.Tensor("SPAN", span),
            ])
            for r in requests
        ]
"""

JOIN = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "B").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", a + b)]))
        return out
"""

ADD = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor(
                "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + {add})])
            for r in requests
        ]
"""

REPEAT = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            for i in range(n):
                out = pb_utils.Tensor("OUT", np.array([i], np.int32))
                sender.send(pb_utils.InferenceResponse([out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

SQUARE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor(
                "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() ** 2)])
            for r in requests
        ]
"""


def python_model(repo: Path, name: str, source: str, io: str, extra: str = "") -> None:
    write_model(
        repo, name, f'name: "{name}" backend: "python" {extra} {io}', files={"1/model.py": source}
    )


def tensors(kind: str, *specs: tuple[str, str, str]) -> str:
    body = ", ".join(f'{{ name: "{n}" data_type: {t} dims: {d} }}' for n, t, d in specs)
    return f"{kind} [ {body} ]"


def step(model: str, inputs: dict[str, str], outputs: dict[str, str], version: int = -1) -> str:
    ins = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    outs = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: {version} {ins} {outs} }}'


def ensemble(repo: Path, name: str, io: str, *steps: str, extra: str = "") -> None:
    write_model(
        repo,
        name,
        f'name: "{name}" platform: "ensemble" {extra} {io} '
        f"ensemble_scheduling {{ step [ {', '.join(steps)} ] }}",
    )


F4 = ("TYPE_FP32", "[ 4 ]")


def write_repository(repo: Path) -> None:
    xy = tensors("input", ("X", *F4)) + tensors("output", ("Y", *F4))
    python_model(repo, "pre", PRE, xy)
    write_model(repo, "mid", identity_config("mid", dims="[ 4 ]"))
    python_model(
        repo,
        "post",
        POST,
        tensors("input", ("X", *F4))
        + tensors("output", ("Y", *F4), ("SOURCE", "TYPE_STRING", "[ 1 ]")),
    )
    ensemble(
        repo,
        "chain",
        tensors("input", ("IN", *F4))
        + tensors("output", ("OUT", *F4), ("SOURCE", "TYPE_STRING", "[ 1 ]")),
        step("pre", {"X": "IN"}, {"Y": "doubled"}),
        step("mid", {"INPUT0": "doubled"}, {"OUTPUT0": "same"}),
        step("post", {"X": "same"}, {"Y": "OUT", "SOURCE": "SOURCE"}),
    )
    spans = tensors("output", ("Y", *F4), ("SPAN", "TYPE_FP64", "[ 2 ]"))
    python_model(
        repo,
        "slow",
        SLOW,
        tensors("input", ("X", *F4)) + spans,
        extra="instance_group [ { count: 2 kind: KIND_CPU } ]",
    )
    ab = tensors("input", ("A", *F4), ("B", *F4)) + tensors("output", ("Y", *F4))
    python_model(repo, "join", JOIN, ab)
    ensemble(
        repo,
        "fork",
        tensors("input", ("IN", *F4))
        + tensors(
            "output",
            ("OUT", *F4),
            ("SPAN_A", "TYPE_FP64", "[ 2 ]"),
            ("SPAN_B", "TYPE_FP64", "[ 2 ]"),
        ),
        step("slow", {"X": "IN"}, {"Y": "a", "SPAN": "SPAN_A"}),
        step("slow", {"X": "IN"}, {"Y": "b", "SPAN": "SPAN_B"}),
        step("join", {"A": "a", "B": "b"}, {"Y": "OUT"}),
    )
    config = f'name: "ver" backend: "python" version_policy {{ all {{ }} }} {xy}'
    write_model(
        repo,
        "ver",
        config,
        versions=(1, 2),
        files={"1/model.py": ADD.format(add=10), "2/model.py": ADD.format(add=20)},
    )
    ensemble(
        repo,
        "pinned",
        tensors("input", ("IN", *F4)) + tensors("output", ("OUT", *F4)),
        step("ver", {"X": "IN"}, {"Y": "OUT"}, version=1),
    )
    i1 = ("TYPE_INT32", "[ 1 ]")
    python_model(
        repo,
        "repeat",
        REPEAT,
        tensors("input", ("N", *i1)) + tensors("output", ("OUT", *i1)),
        extra="model_transaction_policy { decoupled: true }",
    )
    python_model(
        repo, "square", SQUARE, tensors("input", ("X", *i1)) + tensors("output", ("Y", *i1))
    )
    ensemble(
        repo,
        "squares",
        tensors("input", ("N", *i1)) + tensors("output", ("OUT", *i1)),
        step("repeat", {"N": "N"}, {"OUT": "i"}),
        step("square", {"X": "i"}, {"Y": "OUT"}),
    )
    ensemble(  # streams as its decoupled step does: a cache cannot keep that
        repo,
        "squares_cached",
        tensors("input", ("N", *i1)) + tensors("output", ("OUT", *i1)),
        step("repeat", {"N": "N"}, {"OUT": "OUT"}),
        extra="response_cache { enable: true }",
    )
    write_model(
        repo,
        "mid_b",
        identity_config("mid_b", dims="[ 4 ]", max_batch=8, extra="dynamic_batching { }"),
    )
    ensemble(
        repo,
        "batched",
        tensors("input", ("IN", *F4)) + tensors("output", ("OUT", *F4)),
        step("mid_b", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}),
        extra="max_batch_size: 8",
    )
    ensemble(  # a batching ensemble around a step that does not batch
        repo,
        "mixed",
        tensors("input", ("IN", *F4)) + tensors("output", ("OUT", *F4)),
        step("mid", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}),
        extra="max_batch_size: 8",
    )
    ensemble(
        repo,
        "unknown",
        tensors("input", ("IN", *F4)) + tensors("output", ("OUT", *F4)),
        step("nosuch", {"X": "IN"}, {"Y": "OUT"}),
    )
    ensemble(
        repo,
        "mismatch",
        tensors("input", ("IN", "TYPE_INT32", "[ 4 ]")) + tensors("output", ("OUT", *F4)),
        step("mid", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}),
    )


def repository(tmp: Path) -> Path:
    write_repository(tmp / "repo")
    return tmp / "repo"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from serving(repository, "--exit-on-error=false")  # with ensembles that cannot run


def test_a_chain_passes_tensors_in_place_and_counts_every_model(server: Server) -> None:
    x = np.array([1, 2, 3, 4], np.float32)
    with server.client() as c:
        rows = {m["name"]: m["state"] for m in c.models()}
        assert rows["chain"] == "READY"  # ensembles are in the repository index
        before = {m: _count(c, m) for m in ("chain", "pre", "mid", "post")}
        for _ in range(3):
            out = c.infer("chain", {"IN": x})
            np.testing.assert_array_equal(out["OUT"], x * 2 + 1)
        # the last step read its input where the identity step wrote it: that worker's arena
        source = out["SOURCE"][0].decode()
        assert source.startswith(f"inferpool-{server.run_id}-out"), source
        direct = c.infer("post", {"X": x})["SOURCE"][0].decode()
        assert direct == f"inferpool-{server.run_id}-arena"  # a client's input: the arena
        after = {m: _count(c, m) for m in ("chain", "pre", "mid", "post")}
        assert {m: after[m] - before[m] for m in after} == {
            "chain": 3,
            "pre": 3,
            "mid": 3,
            "post": 4,
        }
        stats = c.statistics("chain")["model_stats"][0]
        assert stats["execution_count"] >= 3
        composed = stats["inference_stats"]
        assert composed["compute_infer"]["ns"] > 0 and composed["queue"]["count"] >= 3
        meta = c.model_metadata("chain")
        assert meta["platform"] == "ensemble" and [i["name"] for i in meta["inputs"]] == ["IN"]


def _count(c: object, model: str) -> int:
    stats = c.statistics(model)["model_stats"][0]  # type: ignore[attr-defined]
    return int(stats["inference_stats"]["success"]["count"])


def test_parallel_branches_run_at_the_same_time(server: Server) -> None:
    x = np.arange(4, dtype=np.float32)
    with server.client() as c:
        out = c.infer("fork", {"IN": x})
    np.testing.assert_array_equal(out["OUT"], 2 * x)
    (a0, a1), (b0, b1) = out["SPAN_A"], out["SPAN_B"]
    assert a0 < b1 and b0 < a1, "the two branches did not overlap"


def test_a_step_runs_the_version_it_names(server: Server) -> None:
    x = np.zeros(4, np.float32)
    with server.client() as c:
        assert c.infer("pinned", {"IN": x})["OUT"].tolist() == [10] * 4
        assert c.infer("ver", {"X": x})["Y"].tolist() == [20] * 4  # latest, called directly


def test_a_decoupled_step_makes_a_streaming_ensemble(server: Server) -> None:
    with server.client() as c:
        assert c.model_config("squares")["model_transaction_policy"] == {"decoupled": True}
        results = list(c.stream("squares", {"N": np.array([5], np.int32)}))
        assert list(c.stream("squares", {"N": np.array([0], np.int32)})) == []
    assert sorted(int(r.outputs["OUT"][0]) for r in results) == [0, 1, 4, 9, 16]


def test_a_batching_ensemble(server: Server) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    with server.client() as c:
        np.testing.assert_array_equal(c.infer("batched", {"IN": x})["OUT"], x)
        with pytest.raises(InferpoolError, match="batch-size must be <= 8"):
            c.infer("batched", {"IN": np.zeros((9, 4), np.float32)})


def test_a_batch_of_one_passes_through_a_step_that_does_not_batch(server: Server) -> None:
    with server.client() as c:
        out = c.infer("mixed", {"IN": np.arange(4, dtype=np.float32).reshape(1, 4)})
        assert out["OUT"].shape == (1, 4) and out["OUT"].tolist() == [[0, 1, 2, 3]]
        with pytest.raises(InferpoolError) as err:  # as in Triton: only a batch of one
            c.infer("mixed", {"IN": np.zeros((2, 4), np.float32)})
        assert "in ensemble 'mixed', step 0 (model 'mid') failed: unexpected shape for input " in (
            err.value.message
        )


def test_outputs_as_handles_and_slots_given_back(server: Server) -> None:
    """1 MiB tensors through the chain, outputs read in place: far more than the 16 MiB
    output arenas hold, so every intermediate and final slot went back."""
    with ShmClient(server.endpoint, input_bytes=4 << 20) as c:
        req = c.request("chain", ["OUT"])
        x = req.input("IN", (4,), np.float32)
        x[:] = [1, 2, 3, 4]
        with c.run(req) as result:
            assert result["OUT"].tolist() == [3, 5, 7, 9]
    big = np.ones((1 << 18,), np.float32)  # 1 MiB
    with server.client() as c:
        for _ in range(40):
            out = c.infer("batched", {"IN": big.reshape(-1, 4)[:8]})
            assert out["OUT"].shape == (8, 4)
            assert c.infer("chain", {"IN": big[:4]})["OUT"].tolist() == [3.0] * 4


def test_a_failing_step_fails_the_request_by_name_and_others_go_on(server: Server) -> None:
    with server.client() as c:
        with pytest.raises(InferpoolError) as err:
            c.infer("chain", {"IN": np.array([-1, 0, 0, 0], np.float32)})
        assert err.value.code is Code.INTERNAL
        assert "in ensemble 'chain', step 0 (model 'pre') failed: pre refuses -1" in (
            err.value.message
        )
        assert c.infer("chain", {"IN": np.ones(4, np.float32)})["OUT"].tolist() == [3] * 4


def test_a_crashed_composing_model_fails_the_request_and_comes_back(server: Server) -> None:
    with server.client() as c:
        with pytest.raises(InferpoolError) as err:
            c.infer("chain", {"IN": np.array([-2, 0, 0, 0], np.float32)})
        assert err.value.code is Code.UNAVAILABLE
        assert "in ensemble 'chain', step 0 (model 'pre') failed: instance 'pre_0'" in (
            err.value.message
        )
        assert "died with exit code 3" in err.value.message
        assert "boot failed" not in err.value.message  # it was ready: the model's own exit
        _wait_instance_ready(c, "pre")
        assert c.infer("chain", {"IN": np.ones(4, np.float32)})["OUT"].tolist() == [3] * 4
        assert c.is_model_ready("chain")


def _wait_instance_ready(c: object, model: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        states = [s["state"] for s in c.status() if s["model"] == model]  # type: ignore[attr-defined]
        if states and all(s == "READY" for s in states):
            return
        time.sleep(0.05)
    raise AssertionError(f"{model} did not come back")


def test_ensembles_that_cannot_run_are_unavailable_with_the_reason(server: Server) -> None:
    with server.client() as c:
        rows = {m["name"]: (m["state"], m["reason"]) for m in c.models()}
        assert rows["unknown"] == (
            "UNAVAILABLE",
            "ensemble unknown contains models that are not available or ambiguous: nosuch",
        )
        state, reason = rows["mismatch"]
        assert state == "UNAVAILABLE"
        assert (
            "in ensemble mismatch, ensemble tensor IN: inconsistent data type: TYPE_INT32 is "
            "inferred from model mismatch while TYPE_FP32 is inferred from model mid" in reason
        )
        assert rows["squares_cached"] == (
            "UNAVAILABLE",
            "Response Cache does not currently support model squares_cached with 'decoupled' "
            "transaction policy. Please disable the response cache.",
        )
        with pytest.raises(InferpoolError) as err:
            c.infer("unknown", {"IN": np.zeros(4, np.float32)})
        assert err.value.code is Code.UNAVAILABLE and "not available or ambiguous" in (
            err.value.message
        )


def test_the_servers_processes_ask_for_a_short_slice(server: Server) -> None:
    """Each hand-off between the steps wakes a process: the broker asked the kernel for a
    300 us slice (the default), and its workers inherited it."""
    if current_slice_ns(server.proc.pid) != 300_000:
        pytest.skip("this kernel keeps its own slices (custom slices came with Linux 6.12)")
    pids = server.worker_pids("pre")
    assert pids and all(current_slice_ns(pid) == 300_000 for pid in pids)
