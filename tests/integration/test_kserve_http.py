"""The KServe v2 HTTP frontend with Triton's own client (tritonclient.http) and with curl.

One server for the module (tests/integration/kserve_support.py); the health port alone and a
port in use each start their own.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from inferpool.client import InferpoolError
from tests.integration.kserve_support import (
    COUNTS,
    COUNTS_TOP2,
    DOUBLE_CONFIG,
    DOUBLE_FILES,
    SCORES,
    SPARE_BATCHED,
    TOP3,
    classes,
    kserve_server,
)
from tests.support import EXAMPLES, Server, free_tcp_port, write_model


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with kserve_server() as s:
        yield s


@pytest.fixture
def client(server: Server) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(server.http_url)
    yield c
    c.close()


def infer_input(name: str, array: np.ndarray, datatype: str, binary: bool = True) -> Any:
    inp = httpclient.InferInput(name, list(array.shape), datatype)
    inp.set_data_from_numpy(array, binary_data=binary)
    return inp


def curl(*args: str) -> tuple[int, str]:
    """(status, body) of ``curl args``."""
    done = subprocess.run(
        ["curl", "-s", "-o", "-", "-w", "\n%{http_code}", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    body, _, status = done.stdout.rpartition("\n")
    return int(status), body


def zmq_error(server: Server, model: str, inputs: dict[str, np.ndarray]) -> InferpoolError:
    """The error a zmq client gets for the same request."""
    with server.client() as c, pytest.raises(InferpoolError) as err:
        c.infer(model, inputs)
    return err.value


# ============================================================================ health, metadata
def test_health_metadata_and_config(server: Server, client: Any) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("identity") and not client.is_model_ready("missing")
    meta = client.get_server_metadata()
    assert meta["name"] == "triton" and "binary_tensor_data" in meta["extensions"]
    model = client.get_model_metadata("identity_batched")
    assert model == {
        "name": "identity_batched",
        "versions": ["1"],
        "platform": "identity",
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [-1, -1]},
            {"name": "INPUT1", "datatype": "BYTES", "shape": [-1, 1]},
        ],
        "outputs": [
            {"name": "OUTPUT0", "datatype": "INT32", "shape": [-1, -1]},
            {"name": "OUTPUT1", "datatype": "BYTES", "shape": [-1, 1]},
        ],
    }
    with server.client() as zc:
        assert client.get_model_config("identity_batched") == zc.model_config("identity_batched")
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("missing")
    assert err.value.status() == "404"
    assert "Request for unknown model: 'missing' is not found" in err.value.message()


def test_health_and_errors_with_curl(server: Server) -> None:
    base = f"http://{server.http_url}"
    assert curl(f"{base}/v2/health/live") == (200, "")
    assert curl(f"{base}/v2/health/ready") == (200, "")
    assert curl(f"{base}/v2/models/identity/ready") == (200, "")
    assert curl(f"{base}/v2/models/identity/versions/1/ready") == (200, "")
    assert curl(f"{base}/v2/models/missing/ready") == (400, '{"error":"Model version not ready"}')
    assert curl(f"{base}/v2/no/such/path") == (404, '{"error":"Not Found"}')
    assert curl("-X", "POST", f"{base}/v2/health/live") == (405, '{"error":"Method Not Allowed"}')
    status, body = curl("-X", "POST", "-d", "{not json", f"{base}/v2/models/identity/infer")
    assert status == 400 and "failed to parse the request JSON buffer" in json.loads(body)["error"]


# ============================================================================ inference
def test_infer_fp32_binary_and_json(client: Any) -> None:
    x = np.linspace(-1, 1, 100, dtype=np.float32)
    for binary in (True, False):
        out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
        result = client.infer(
            "identity", [infer_input("INPUT0", x, "FP32", binary)], outputs=[out], request_id="r1"
        )
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
        response = result.get_response()
        assert response["id"] == "r1" and response["model_version"] == "1"
        assert response["parameters"]["param1"] == 42  # the backend's response parameters
        assert ("data" in response["outputs"][0]) is not binary


def test_infer_int32_and_bytes(client: Any) -> None:
    ints = np.arange(12, dtype=np.int32).reshape(3, 4)
    words = np.array([[b"alpha"], [b""], ["gr\u00fc\u00df".encode()]], dtype=np.object_)
    for binary in (True, False):
        inputs = [
            infer_input("INPUT0", ints, "INT32", binary),
            infer_input("INPUT1", words, "BYTES", binary),
        ]
        outputs = [
            httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")
        ]
        result = client.infer("identity_batched", inputs, outputs=outputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ints)
        got = [
            [w if isinstance(w, bytes) else w.encode() for w in row]
            for row in result.as_numpy("OUTPUT1").tolist()
        ]
        assert got == words.tolist()


def test_concurrent_requests_get_their_own_answers(server: Server) -> None:
    client = httpclient.InferenceServerClient(server.http_url, concurrency=8)
    try:
        xs = [np.full(4 + i, i, np.float32) for i in range(16)]
        pending = [
            client.async_infer("identity", [infer_input("INPUT0", x, "FP32")], request_id=str(i))
            for i, x in enumerate(xs)
        ]
        for i, (x, request) in enumerate(zip(xs, pending, strict=True)):
            result = request.get_result()
            assert result.get_response()["id"] == str(i)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    finally:
        client.close()


def test_infer_json_with_curl(server: Server) -> None:
    request = {
        "id": "curl-1",
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [[1, 2], [3, 4.5]]}
        ],
    }
    status, body = curl(
        "-X",
        "POST",
        "-d",
        json.dumps(request),
        f"http://{server.http_url}/v2/models/identity/infer",
    )
    assert status == 200
    answer = json.loads(body)
    assert answer["id"] == "curl-1" and answer["model_name"] == "identity"
    assert answer["outputs"] == [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [4], "data": [1.0, 2.0, 3.0, 4.5]}
    ]


def test_admission_errors_carry_the_zmq_message_and_tritons_status(
    server: Server, client: Any
) -> None:
    ints = np.arange(4, dtype=np.int32)
    cases = [
        ("identity", {"INPUT0": ints}, "INT32", "400"),  # wrong datatype
        ("missing", {"INPUT0": ints}, "INT32", "404"),  # unknown model
        ("identity_batched", {"INPUT0": ints}, "INT32", "400"),  # no batch dimension
    ]
    for model, inputs, datatype, http_status in cases:
        expected = zmq_error(server, model, inputs)
        with pytest.raises(InferenceServerException) as err:
            client.infer(model, [infer_input(n, a, datatype) for n, a in inputs.items()])
        assert (err.value.status(), err.value.message()) == (http_status, expected.message), model
    # a decoupled model needs a stream: Triton's HTTP answer is 501
    with pytest.raises(InferenceServerException) as err:
        client.infer("repeat", [infer_input("N", np.array([2], np.int32), "INT32")])
    assert err.value.status() == "501" and "decoupled transaction policy" in err.value.message()
    # an input must bring its data one way only (Triton's words)
    status, body = curl(
        "-X",
        "POST",
        "-d",
        json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1]}]}),
        f"http://{server.http_url}/v2/models/identity/infer",
    )
    assert status == 400 and json.loads(body)["error"].startswith(
        "Input must set only one of the following fields: 'data', 'binary_data_size' in "
        "'parameters', 'shared_memory_region' in 'parameters'. But no field is set"
    )
    # the server is unharmed
    x = np.ones(3, np.float32)
    np.testing.assert_array_equal(
        client.infer("identity", [infer_input("INPUT0", x, "FP32")]).as_numpy("OUTPUT0"), x
    )


# ============================================================================ statistics, repository
def test_statistics_and_repository(server: Server, client: Any) -> None:
    x = np.ones(5, np.float32)
    before = client.get_inference_statistics("identity")["model_stats"][0]["inference_count"]
    for _ in range(3):
        client.infer("identity", [infer_input("INPUT0", x, "FP32")])
    stats = client.get_inference_statistics("identity")["model_stats"]
    assert [s["name"] for s in stats] == ["identity"]
    assert stats[0]["inference_count"] == before + 3
    assert stats[0]["inference_stats"]["success"]["count"] >= 3
    everything = client.get_inference_statistics()["model_stats"]
    assert {"identity", "identity_batched", "repeat"} <= {s["name"] for s in everything}
    index = {m["name"]: m["state"] for m in client.get_model_repository_index()}
    assert index["identity"] == "READY"
    client.unload_model("spare")
    assert not client.is_model_ready("spare")
    client.load_model("spare")
    assert client.is_model_ready("spare")


def test_load_with_config_and_file_overrides(server: Server, client: Any) -> None:
    client.load_model("spare", config=SPARE_BATCHED)
    assert client.get_model_config("spare")["max_batch_size"] == 4
    client.load_model("spare")  # no override: its config.pbtxt again
    assert client.get_model_config("spare").get("max_batch_size", 0) == 0
    client.load_model("double", config=DOUBLE_CONFIG, files=DOUBLE_FILES)
    x = np.array([3, 4], np.int32)
    y = client.infer("double", [infer_input("X", x, "INT32")]).as_numpy("Y")
    np.testing.assert_array_equal(y, x * 2)
    client.unload_model("double")
    status, body = curl(
        "-X",
        "POST",
        "-d",
        '{"parameters": {"config": "{}", "file:1/model.py": "not base64!"}}',
        f"http://{server.http_url}/v2/repository/models/double/load",
    )
    assert status == 400 and "'file:1/model.py' is not valid base64" in body
    with pytest.raises(InferenceServerException, match="Load parameter 'config' must be"):
        client.load_model("double", files=DOUBLE_FILES)


def test_loads_that_fail_answer_as_tritons(server: Server, client: Any) -> None:
    """Triton's status (500) and words; the reason names no path of the server's."""
    load = f"http://{server.http_url}/v2/repository/models/nosuch/load"
    assert curl("-X", "POST", load) == (
        500,
        '{"error":"failed to load \'nosuch\', failed to poll from model repository: model '
        "'nosuch' not found in any model repository\"}",
    )
    with pytest.raises(InferenceServerException) as err:
        client.load_model("spare", config='{"max_batch_size": "x"}')
    assert err.value.message().startswith(
        "failed to load 'spare', failed to poll from model repository: Invalid config override"
    )
    assert client.is_model_ready("spare")  # still serving as it was
    lines = server.log().splitlines()
    assert "Traceback" not in server.log()
    assert [line for line in lines if "'nosuch'" in line] == [
        next(
            line
            for line in lines
            if line.endswith("model 'nosuch' not found in any model repository")
        )
    ]


def test_a_config_override_without_backend_takes_it_from_the_models_files(client: Any) -> None:
    """As Triton: repeat's 1/model.py makes it a python model."""
    config = {
        "input": [{"name": "N", "data_type": "TYPE_INT32", "dims": [1]}],
        "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]}],
        "model_transaction_policy": {"decoupled": True},
    }
    client.load_model("repeat", config=json.dumps(config))
    assert client.get_model_config("repeat")["backend"] == "python"
    client.load_model("repeat")  # its config.pbtxt again


# ============================================================================ pipelines
def test_an_ensemble_and_a_bls_model(client: Any) -> None:
    raw = np.array([0.5, 3.0, 1.0, -2.0], np.float32)
    z = (raw - raw.mean()) / (raw.std() + 1e-6)
    expected = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    models = ("probabilities", "normalize", "softmax", "top_class")

    def counts() -> dict[str, int]:
        stats = client.get_inference_statistics()["model_stats"]
        return {s["name"]: s["inference_stats"]["success"]["count"] for s in stats}

    before = counts()
    probs = client.infer("probabilities", [infer_input("RAW", raw, "FP32")]).as_numpy("PROBS")
    np.testing.assert_allclose(probs, expected, rtol=1e-5)
    top = client.infer("top_class", [infer_input("RAW", raw, "FP32", binary=False)])
    assert top.as_numpy("CLASS").tolist() == [1] and top.as_numpy("PROB")[0] == probs[1]
    after = counts()
    # the ensemble ran twice (once called by top_class), each of its steps with it
    assert [after[m] - before[m] for m in models] == [2, 2, 2, 1]
    assert client.get_model_metadata("probabilities")["platform"] == "ensemble"
    index = {m["name"]: m["state"] for m in client.get_model_repository_index()}
    assert index["probabilities"] == index["repeated"] == "READY"
    with pytest.raises(InferenceServerException) as err:  # checked as any model's inputs
        client.infer("probabilities", [infer_input("RAW", np.ones(4, np.int32), "INT32")])
    assert err.value.status() == "400" and "data-type is 'INT32'" in err.value.message()


# ============================================================================ classification
def classified(client: Any, model: str, inputs: list[Any], *counts: tuple[str, int]) -> Any:
    """The result of ``model`` for ``inputs``, each output of ``counts`` asked for as that
    many classes (0: its own tensor)."""
    outputs = [httpclient.InferRequestedOutput(name, class_count=n) for name, n in counts]
    return client.infer(model, inputs, outputs=outputs)


def test_classification_of_a_batch_with_and_without_labels(server: Server, client: Any) -> None:
    """Triton's classification extension: BYTES [batch, N], "value:index[:label]"."""
    assert "classification" in client.get_server_metadata()["extensions"]
    inputs = [infer_input("INPUT0", SCORES, "FP32"), infer_input("INPUT1", COUNTS, "INT32")]
    for binary in (True, False):
        outputs = [
            httpclient.InferRequestedOutput(name, binary_data=binary, class_count=n)
            for name, n in (("OUTPUT0", 3), ("OUTPUT1", 2))
        ]
        result = client.infer("labelled", inputs, outputs=outputs)
        answer = result.get_output("OUTPUT0")
        assert (answer["datatype"], answer["shape"]) == ("BYTES", [2, 3])
        assert ("data" in answer) is not binary
        assert classes(result.as_numpy("OUTPUT0")) == TOP3
        assert classes(result.as_numpy("OUTPUT1")) == COUNTS_TOP2
    one = classified(client, "labelled", inputs, ("OUTPUT0", 1), ("OUTPUT1", 0))
    assert classes(one.as_numpy("OUTPUT0")) == [row[:1] for row in TOP3]
    np.testing.assert_array_equal(one.as_numpy("OUTPUT1"), COUNTS)  # 0: its own tensor
    ensemble_inputs = [infer_input("X", SCORES, "FP32"), infer_input("N", COUNTS, "INT32")]
    ensemble = classified(client, "labelled_ensemble", ensemble_inputs, ("SCORES", 3))
    assert classes(ensemble.as_numpy("SCORES")) == TOP3  # the labels of its step's output
    # a large output, lent from the worker's region, classified where it lies
    row = np.random.default_rng(3).random((1, 100_000), dtype=np.float32)
    inputs[0] = infer_input("INPUT0", row, "FP32")
    inputs[1] = infer_input("INPUT1", np.zeros((1, 1), np.int32), "INT32")
    top = classes(classified(client, "labelled", inputs, ("OUTPUT0", 2)).as_numpy("OUTPUT0"))
    best = np.argsort(row[0])[::-1][:2]
    assert top == [[f"{row[0, i]:f}:{i}" for i in best]]
    with server.client() as c:
        assert c.call("lease_status")["total"] == 0  # the lent output was given back


def test_classification_unbatched_and_after_a_reload(server: Server, client: Any) -> None:
    """[N], N at most the classes there are; a reload with other labels serves them."""
    inputs = [infer_input("INPUT0", SCORES[0], "FP32")]

    def labels(**known: int) -> dict[str, Any]:
        with server.client() as c:
            return dict(c.call("model_labels", model_name="labelled_flat", **known))

    def top(model: str, count: int) -> list[Any]:
        result = classified(client, model, inputs, ("OUTPUT0", count))
        assert result.get_output("OUTPUT0")["shape"] == [min(count, 5)]
        return classes(result.as_numpy("OUTPUT0"))

    assert top("labelled_flat", 3) == TOP3[0]
    first = labels()
    assert first["labels"] == {"OUTPUT0": ["zero", "one", "", "three"]}
    assert first["max_batch_size"] == 0 and first["model_version"] == "1"
    assert "labels" not in labels(serial=first["serial"])  # the caller has them already
    assert top("identity", 10) == [
        "0.900000:3",
        "0.700000:1",
        "0.200000:2",
        "0.100000:0",
        "0.050000:4",
    ]
    config = client.get_model_config("labelled_flat")
    config["output"][0]["label_filename"] = "other.txt"
    client.load_model("labelled_flat", config=json.dumps(config))
    try:
        assert top("labelled_flat", 2) == ["0.900000:3:d", "0.700000:1:b"]
        assert labels(serial=first["serial"])["labels"] == {"OUTPUT0": list("abcde")}
    finally:
        client.load_model("labelled_flat")  # its config.pbtxt again
    assert top("labelled_flat", 1) == ["0.900000:3:three"]
    # a label file that cannot be read fails the load, in Triton's words; the model serves on
    model_dir = r"/\S+/labelled_flat"
    for name, why in [
        ("none.txt", f"failed to open text file for read {model_dir}/none.txt: No such file"),
        (
            "../identity/config.pbtxt",
            f"label file path '{model_dir}/../identity/config.pbtxt' for output 'OUTPUT0' in "
            "model 'labelled_flat' is outside model directory",
        ),
    ]:
        config["output"][0]["label_filename"] = name
        with pytest.raises(InferenceServerException) as err:
            client.load_model("labelled_flat", config=json.dumps(config))
        prefix = "failed to load 'labelled_flat', failed to poll from model repository: "
        assert re.match(re.escape(prefix) + why, err.value.message()), err.value.message()
    assert top("labelled_flat", 1) == ["0.900000:3:three"]


def test_classification_refused_in_tritons_words(server: Server, client: Any) -> None:
    url = f"http://{server.http_url}/v2/models/identity/infer"
    tensor = {"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]}

    def ask(**params: Any) -> tuple[int, Any]:
        body = {"inputs": [tensor], "outputs": [{"name": "OUTPUT0", "parameters": params}]}
        status, answer = curl("-X", "POST", "-d", json.dumps(body), url)
        return status, json.loads(answer)

    not_a_count = (
        "Unable to set 'classification': attempt to access JSON non-unsigned-integer as "
        "unsigned-integer"
    )
    for bad in (-1, 1.5, "2", True):
        assert ask(classification=bad) == (400, {"error": not_a_count})
    region = {"shared_memory_region": "r", "shared_memory_byte_size": 8}
    assert ask(classification=1, **region) == (
        400,
        {"error": "Output can't set both 'shared_memory_region' and 'classification'"},
    )
    status, answer = ask(classification=0)  # Triton: the output's own tensor
    assert status == 200 and answer["outputs"][0]["data"] == [1.0, 2.0]
    words = np.array([[b"w"]], dtype=np.object_)
    inputs = [infer_input("INPUT0", COUNTS[:1], "INT32"), infer_input("INPUT1", words, "BYTES")]
    with pytest.raises(InferenceServerException) as err:
        classified(client, "identity_batched", inputs, ("OUTPUT1", 1))
    assert err.value.status() == "400"
    assert err.value.message() == (
        "class result not available for output due to unsupported type 'BYTES'"
    )
    assert client.is_server_live() and client.is_model_ready("identity_batched")
    result = classified(client, "identity_batched", inputs, ("OUTPUT0", 1))
    assert classes(result.as_numpy("OUTPUT0")) == [COUNTS_TOP2[0][:1]]


# ============================================================================ shared memory
def test_system_shared_memory_inputs_and_outputs(server: Server, client: Any) -> None:
    x = np.arange(16, dtype=np.float32)
    key_in, key_out = f"/ipk-in-{id(x)}", f"/ipk-out-{id(x)}"
    h_in = shm.create_shared_memory_region("in", key_in, x.nbytes)
    h_out = shm.create_shared_memory_region("out", key_out, x.nbytes)
    try:
        shm.set_shared_memory_region(h_in, [x])
        client.unregister_system_shared_memory("in")  # none yet: no error, as Triton's QA expects
        client.register_system_shared_memory("in", key_in, x.nbytes)
        client.register_system_shared_memory("out", key_out, x.nbytes)
        status = {r["name"]: r for r in client.get_system_shared_memory_status()}
        assert status["in"] == {"name": "in", "key": key_in, "offset": 0, "byte_size": 64}
        with grpcclient.InferenceServerClient(server.grpc_url) as other:  # shared, as in Triton
            assert set(other.get_system_shared_memory_status().regions) == {"in", "out"}
        with pytest.raises(InferenceServerException) as err:
            client.register_system_shared_memory("in", key_in, x.nbytes)
        assert err.value.status() == "400"  # ALREADY_EXISTS
        inp = httpclient.InferInput("INPUT0", [16], "FP32")
        inp.set_shared_memory("in", x.nbytes)
        out = httpclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("out", x.nbytes)
        result = client.infer("identity", [inp], outputs=[out])
        written = result.get_output("OUTPUT0")  # in the region, not in the body
        assert "data" not in written and written["parameters"]["shared_memory_byte_size"] == 64
        np.testing.assert_array_equal(shm.get_contents_as_numpy(h_out, np.float32, [16]), x)
        client.unregister_system_shared_memory()
        assert client.get_system_shared_memory_status() == []
    finally:
        shm.destroy_shared_memory_region(h_in)
        shm.destroy_shared_memory_region(h_out)


# ============================================================================ ports
def test_health_port_alone_when_the_kserve_frontends_are_off(short_tmp: Path) -> None:
    repo = short_tmp / "repo"
    shutil.copytree(EXAMPLES / "identity", repo / "identity")
    port = free_tcp_port()
    with Server(short_tmp, repo, "--health-port", str(port)) as server:
        base = f"http://127.0.0.1:{port}"
        assert curl(f"{base}/v2/health/live") == (200, "")
        assert curl(f"{base}/v2/health/ready") == (200, "")
        assert curl(f"{base}/v2/models/identity/ready") == (200, "")
        assert curl(f"{base}/v2") == (404, '{"error":"Not Found"}')  # health only
    assert server.proc.returncode == 0, server.log()


@pytest.mark.parametrize("stem,what", [("http", "HTTP"), ("grpc", "gRPC")])
def test_a_port_in_use_fails_the_start_with_one_line(short_tmp: Path, stem: str, what: str) -> None:
    write_model(short_tmp / "repo", "m", 'name: "m"\nbackend: "identity"\n')
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = {"--http-port": "0", "--grpc-port": "0", f"--{stem}-port": str(port)}
        command = [sys.executable, "-m", "inferpool", "serve", "--model-repository"]
        command += [str(short_tmp / "repo"), "--listen", f"ipc://{short_tmp}/b.sock"]
        command += [word for pair in ports.items() for word in pair]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=short_tmp)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"inferpool: UNAVAILABLE: cannot serve {what} on 127.0.0.1:{port}: Address already in use "
        f"(choose another --{stem}-port or --{stem}-address, or --{stem}-port 0 to turn it off)"
    )
    assert "Traceback" not in done.stderr
