"""ONNX models built by the test, served by the real broker and workers: answers against
ONNX Runtime called directly, over zmq, shared memory and lanes, KServe HTTP (Triton's
client), dynamic batching, sequences with implicit state, ensembles and BLS."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from inferpool.client import Client, ShmClient
from inferpool.wire.errors import Code, InferpoolError
from tests import ragged_batches as rb
from tests.backends.model_formats import onnx_models as om
from tests.support import Server, serving, wait_until

BLS_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            call = pb_utils.InferenceRequest(
                model_name="add_sub",
                requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.Tensor("INPUT0", x.as_numpy()), pb_utils.Tensor("INPUT1", x.as_numpy())],
            )
            reply = call.exec()
            if reply.has_error():
                raise pb_utils.TritonModelException(reply.error().message())
            y = pb_utils.get_output_tensor_by_name(reply, "OUTPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return responses
"""

ENSEMBLE = """
name: "twice" platform: "ensemble" max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling { step [
  { model_name: "add_sub" model_version: -1
    input_map { key: "INPUT0" value: "X" } input_map { key: "INPUT1" value: "X" }
    output_map { key: "OUTPUT0" value: "double" } },
  { model_name: "add_sub" model_version: -1
    input_map { key: "INPUT0" value: "double" } input_map { key: "INPUT1" value: "X" }
    output_map { key: "OUTPUT0" value: "Y" } }
] }
"""

ONE_INSTANCE = "\ninstance_group [ { count: 1 kind: KIND_CPU } ]\n"


def build(repo: Path) -> None:
    batching = "dynamic_batching { max_queue_delay_microseconds: 20000 }"
    om.save(om.add_sub(), repo / "add_sub", om.add_sub_config("add_sub", extra=batching))
    om.save(om.add_sub(np.int32), repo / "simple", om.add_sub_config("simple", "TYPE_INT32"))
    om.save(om.add_sub(object), repo / "strings", om.add_sub_config("strings", "TYPE_STRING"))
    om.save(om.add_sub(np.float16), repo / "half", om.add_sub_config("half", "TYPE_FP16"))
    om.save(om.add_sub(), repo / "completed")  # no config.pbtxt: inferred and completed
    ov_config = om.add_sub_config("ov", extra=batching).replace(
        'platform: "onnxruntime_onnx"', 'backend: "openvino" default_model_filename: "model.onnx"'
    )
    om.save(om.add_sub(), repo / "ov", ov_config)
    om.save(
        om.accumulate(), repo / "accumulate", om.ACCUMULATE_CONFIG.replace('"m"', '"accumulate"')
    )
    # ragged batches of 4 items: a batch goes when full (the delay is long)
    ragged = "dynamic_batching { max_queue_delay_microseconds: 30000000 }"
    om.save(
        om.ragged_batch(),
        repo / "ragged",
        rb.config("ragged", extra=ragged, max_batch_size=4),
    )
    ov_ragged = rb.config(
        "ov_ragged", "openvino", 'default_model_filename: "model.onnx"\n' + ragged, 4
    )
    om.save(om.ragged_batch(), repo / "ov_ragged", ov_ragged)
    # inputs of any length: a batch holds one length (it goes when full: the delay is long)
    varlen = om.add_sub_config("varlen", dims=-1, max_batch_size=4, extra=ragged + ONE_INSTANCE)
    om.save(om.add_sub(dims="n"), repo / "varlen", varlen)
    ov_varlen = varlen.replace(
        '"varlen" platform: "onnxruntime_onnx"', '"ov_varlen" backend: "openvino"'
    )
    om.save(
        om.add_sub(dims="n"), repo / "ov_varlen", ov_varlen + 'default_model_filename: "model.onnx"'
    )
    (repo / "twice" / "1").mkdir(parents=True)
    (repo / "twice" / "config.pbtxt").write_text(ENSEMBLE)
    (repo / "bls" / "1").mkdir(parents=True)
    (repo / "bls" / "1" / "model.py").write_text(BLS_MODEL)
    (repo / "bls" / "config.pbtxt").write_text(
        'backend: "python" max_batch_size: 8\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
    )


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from serving(lambda tmp: _built(tmp / "repo"), kserve=True)


def _built(repo: Path) -> Path:
    build(repo)
    return repo


@pytest.fixture(scope="module")
def repo(server: Server) -> Path:
    return server.log_path.parent / "repo"  # where serving() had the repository built


def test_answers_match_onnx_runtime(server: Server, repo: Path) -> None:
    rng = np.random.default_rng(0)
    a, b = rng.random((3, 16), dtype=np.float32), rng.random((3, 16), dtype=np.float32)
    want = om.reference(repo / "add_sub", {"INPUT0": a, "INPUT1": b})
    with server.client() as c:
        out = c.infer("add_sub", {"INPUT0": a, "INPUT1": b})
        np.testing.assert_array_equal(out["OUTPUT0"], want[0])
        np.testing.assert_array_equal(out["OUTPUT1"], want[1])
        h = np.full((1, 16), 0.5, np.float16)
        half = c.infer("half", {"INPUT0": h, "INPUT1": h})
        assert half["OUTPUT0"].dtype == np.float16 and half["OUTPUT0"].tolist() == [[1.0] * 16]
        s = np.array([[b"5"] * 16], dtype=object)
        strings = c.infer("strings", {"INPUT0": s, "INPUT1": s})
        assert strings["OUTPUT0"].tolist() == [[b"10"] * 16]
        assert strings["OUTPUT1"].tolist() == [[b"0"] * 16]


def test_openvino_serves_the_onnx_model_with_dynamic_batching(server: Server, repo: Path) -> None:
    answers: dict[int, dict[str, np.ndarray]] = {}
    rng = np.random.default_rng(1)
    inputs = [rng.random((1 + i % 2, 16), dtype=np.float32) for i in range(6)]

    def call(i: int) -> None:
        with server.client() as c:
            answers[i] = c.infer("ov", {"INPUT0": inputs[i], "INPUT1": inputs[i]})

    threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, x in enumerate(inputs):
        want = om.reference(repo / "ov", {"INPUT0": x, "INPUT1": x})
        np.testing.assert_allclose(answers[i]["OUTPUT0"], want[0], rtol=1e-6)
        np.testing.assert_allclose(answers[i]["OUTPUT1"], want[1], atol=0)


def test_a_model_without_config_is_inferred_and_completed(server: Server) -> None:
    with server.client() as c:
        config = c.model_config("completed")
        assert config["backend"] == "onnxruntime" and config["platform"] == "onnxruntime_onnx"
        assert config["max_batch_size"] == 4 and config["default_model_filename"] == "model.onnx"
        assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]
        x = np.ones((4, 16), np.float32)
        assert (
            c.infer("completed", {"INPUT0": x, "INPUT1": x})["OUTPUT0"].tolist() == [[2.0] * 16] * 4
        )
        with pytest.raises(Exception, match="batch-size must be <= 4"):
            c.infer(
                "completed",
                {"INPUT0": np.ones((5, 16), np.float32), "INPUT1": np.ones((5, 16), np.float32)},
            )


def test_concurrent_clients_are_batched_and_get_their_own_rows(server: Server) -> None:
    answers: dict[int, np.ndarray] = {}

    def call(i: int) -> None:
        with server.client() as c:
            x = np.full((1, 16), i, np.float32)
            answers[i] = c.infer("add_sub", {"INPUT0": x, "INPUT1": x})["OUTPUT1"] + x

    with server.client() as c:
        before = c.statistics("add_sub")["model_stats"][0]["inference_count"]
    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {i: a.tolist() for i, a in answers.items()} == {i: [[float(i)] * 16] for i in range(8)}
    with server.client() as c:
        stats = c.statistics("add_sub")["model_stats"][0]
    assert stats["inference_count"] - before == 8
    assert any(b["batch_size"] > 1 for b in stats["batch_stats"]), stats["batch_stats"]


@pytest.mark.parametrize("model", ["ragged", "ov_ragged"])
def test_requests_of_ragged_shapes_are_batched_together(server: Server, model: str) -> None:
    """Concurrent requests whose ragged input differs in shape form one batch (the batcher
    waits for 4 items): each answer is its part of that batch, worked out with numpy."""
    shapes = [(1, 2, 3), (2, 1, 2), (1, 5, 1)]  # 6, 4 and 5 elements: told apart by count
    answers: dict[int, dict[str, np.ndarray]] = {}
    with server.client() as c:  # a batch input is the backend's to build, never a client's
        x = np.ones((1, 2, 2), np.float32)
        with pytest.raises(InferpoolError, match="unexpected inference input 'COUNT'") as info:
            c.infer(model, {"RAGGED": x, "COUNT": np.ones((1, 1), np.float32)})
        assert info.value.code == Code.INVALID_ARG

    def call(i: int) -> None:
        x = np.arange(np.prod(shapes[i]), dtype=np.float32).reshape(shapes[i])
        with server.client() as c:
            answers[i] = c.infer(model, {"RAGGED": x})

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(shapes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with server.client() as c:
        stats = c.statistics(model)["model_stats"][0]
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [
        (4, 1)
    ]
    # the batch's requests in the order the batcher took them: by the element counts it saw
    counts = answers[0]["COUNT_OUT"][0].tolist()
    order = {i: counts.index(np.prod(shape)) for i, shape in enumerate(shapes)}
    assert sorted(order.values()) == [0, 1, 2]
    batch = [shapes[i] for i in sorted(order, key=order.__getitem__)]
    expected = rb.expected(batch)
    for i, answer in answers.items():
        want = expected[order[i]]
        assert set(answer) == set(want)
        for name, value in want.items():
            np.testing.assert_array_equal(answer[name], value, err_msg=f"{model} {i} {name}")


@pytest.mark.parametrize("model", ["varlen", "ov_varlen"])
def test_requests_of_different_shapes_run_in_batches_of_one_shape(
    server: Server, model: str
) -> None:
    """Three requests of length 3 wait for a fourth row; the first of four requests of length
    5 ends their batch, which goes at once; the four fill the next.  Each answer is its own
    (a batch of mixed shapes would fail in the openvino backend)."""
    rng = np.random.default_rng(2)
    lengths = [3, 3, 3, 5, 5, 5, 5]
    inputs = [(rng.random((1, n), np.float32), rng.random((1, n), np.float32)) for n in lengths]
    answers: dict[int, dict[str, np.ndarray]] = {}

    def call(i: int) -> None:
        with server.client() as c:
            answers[i] = c.infer(model, {"INPUT0": inputs[i][0], "INPUT1": inputs[i][1]})

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(lengths))]
    with server.client() as c:
        for t in threads[:3]:
            t.start()
        wait_until(lambda: c.statistics()["inflight"] == 3, "three requests queued")
        for t in threads[3:]:
            t.start()
        for t in threads:
            t.join()
        stats = c.statistics(model)["model_stats"][0]
    for i, (a, b) in enumerate(inputs):
        np.testing.assert_allclose(answers[i]["OUTPUT0"], a + b, rtol=1e-6)
        np.testing.assert_allclose(answers[i]["OUTPUT1"], a - b, rtol=1e-6)
    batches = sorted((b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"])
    assert batches == [(3, 1), (4, 1)]


def test_shared_memory_client_and_lane(server: Server) -> None:
    x = np.arange(16, dtype=np.float32)[None]
    with ShmClient(server.endpoint) as c:
        out = c.infer("add_sub", {"INPUT0": x, "INPUT1": x})
        assert out["OUTPUT0"].tolist() == (2 * x).tolist()
    with ShmClient(server.endpoint, lane=True, timeout=10) as c:
        c.lane("simple")
        req = c.request("simple", outputs=["OUTPUT0", "OUTPUT1"])
        for i in range(3):
            req.input("INPUT0", (1, 16), np.int32)[:] = i
            req.input("INPUT1", (1, 16), np.int32)[:] = 1
            with c.run(req) as result:
                assert result["OUTPUT0"].tolist() == [[i + 1] * 16]
                assert result["OUTPUT1"].tolist() == [[i - 1] * 16]
        assert c.session.lanes.lanes[("simple", "")].sent == 3  # all through the lane


def test_sequences_carry_implicit_state(server: Server) -> None:
    with server.client() as c:

        def step(corr: int, value: float, start: bool = False, end: bool = False) -> float:
            params = {"sequence_id": corr, "sequence_start": start, "sequence_end": end}
            x = np.array([[value]], np.float32)
            return float(c.infer("accumulate", {"INPUT": x}, parameters=params)["OUTPUT"][0, 0])

        assert step(5, 1.0, start=True) == 1.0
        assert step(6, 10.0, start=True) == 10.0
        assert step(5, 2.0) == 3.0
        assert step(6, 5.0) == 15.0
        assert step(5, 4.0, end=True) == 7.0
        assert step(5, 1.0, start=True, end=True) == 1.0


def test_ensembles_and_bls_calls_run_onnx_steps(server: Server) -> None:
    x = np.arange(16, dtype=np.float32)[None]
    with server.client() as c:
        assert c.infer("twice", {"X": x})["Y"].tolist() == (3 * x).tolist()
        assert c.infer("bls", {"X": x})["Y"].tolist() == (2 * x).tolist()


def test_tritons_http_client_runs_the_simple_example(server: Server) -> None:
    """What Triton's simple_http_infer_client.py does against its ``simple`` ONNX model."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http_url)
    a = np.arange(16, dtype=np.int32)[None]
    b = np.ones((1, 16), np.int32)
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "INT32"),
        httpclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a, binary_data=False)
    inputs[1].set_data_from_numpy(b, binary_data=True)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=False),
    ]
    result = client.infer("simple", inputs, outputs=outputs)
    assert result.as_numpy("OUTPUT0").tolist() == (a + b).tolist()
    assert result.as_numpy("OUTPUT1").tolist() == (a - b).tolist()
    metadata = client.get_model_metadata("simple")
    assert metadata["platform"] == "onnxruntime_onnx"
    client.close()


def test_a_bad_request_gets_an_error_and_the_model_serves_on(server: Server) -> None:
    with Client(server.endpoint) as c:
        with pytest.raises(Exception, match="INPUT1"):
            c.infer("add_sub", {"INPUT0": np.ones((1, 16), np.float32)})
        with pytest.raises(Exception, match="data-type"):
            c.infer("add_sub", {"INPUT0": np.ones((1, 16)), "INPUT1": np.ones((1, 16))})
        x = np.ones((1, 16), np.float32)
        assert c.infer("add_sub", {"INPUT0": x, "INPUT1": x})["OUTPUT0"].tolist() == [[2.0] * 16]
