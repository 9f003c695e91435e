"""The KServe v2 gRPC frontend with Triton's own client (tritonclient.grpc), its protobuf
stub for what the client does not send (typed contents), and a decoupled model's stream.

One server for the module (tests/integration/kserve_support.py).
"""

from __future__ import annotations

import base64
import queue
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from inferpool.client import InferpoolError
from inferpool.wire.config_json import config_to_dict
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
from tests.support import Server


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with kserve_server() as s:
        yield s


@pytest.fixture
def client(server: Server) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


def infer_input(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    inp = grpcclient.InferInput(name, list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    return inp


def status_of(err: InferenceServerException) -> str:
    return str(err.status())


# ============================================================================ health, metadata
def test_health_metadata_and_config(server: Server, client: Any) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("identity") and not client.is_model_ready("missing")
    meta = client.get_server_metadata()
    assert meta.name == "triton" and "binary_tensor_data" in meta.extensions
    model = client.get_model_metadata("identity", as_json=True)
    assert model["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": ["-1"]}]
    assert model["versions"] == ["1"] and model["platform"] == "identity"
    config = client.get_model_config("identity_batched").config
    with server.client() as zc:
        assert config_to_dict(config) == zc.model_config("identity_batched")  # Triton's JSON
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("missing")
    assert status_of(err.value) == "StatusCode.NOT_FOUND"
    assert err.value.message() == "Request for unknown model: 'missing' is not found"


# ============================================================================ inference
def test_infer_fp32_int32_and_bytes(client: Any) -> None:
    x = np.linspace(-1, 1, 100, dtype=np.float32)
    result = client.infer("identity", [infer_input("INPUT0", x, "FP32")], request_id="g1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    response = result.get_response()
    assert response.id == "g1" and response.model_version == "1"
    assert response.parameters["param1"].int64_param == 42
    ints = np.arange(12, dtype=np.int32).reshape(3, 4)
    words = np.array([[b"alpha"], [b""], ["gr\u00fc\u00df".encode()]], dtype=np.object_)
    inputs = [infer_input("INPUT0", ints, "INT32"), infer_input("INPUT1", words, "BYTES")]
    result = client.infer("identity_batched", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ints)
    assert result.as_numpy("OUTPUT1").tolist() == words.tolist()


def test_typed_contents_through_the_stub(server: Server) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="identity_batched")
        ints = request.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 3])
        ints.contents.int_contents.extend([7, 8, 9])
        words = request.inputs.add(name="INPUT1", datatype="BYTES", shape=[1, 1])
        words.contents.bytes_contents.append(b"typed")
        response = stub.ModelInfer(request)
        outputs = {o.name: i for i, o in enumerate(response.outputs)}
        raw = response.raw_output_contents
        assert np.frombuffer(raw[outputs["OUTPUT0"]], np.int32).tolist() == [7, 8, 9]
        assert raw[outputs["OUTPUT1"]] == b"\x05\x00\x00\x00typed"
        # typed contents of the wrong type: Triton's words
        bad = service_pb2.ModelInferRequest(model_name="identity")
        bad.inputs.add(name="INPUT0", datatype="FP32", shape=[1]).contents.int_contents.append(1)
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(bad)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details() == (
            "unexpected explicit tensor data for input tensor 'INPUT0' for model 'identity' of "
            "type 'INT32', expected datatype 'FP32'"
        )


def test_admission_errors_carry_the_zmq_message_and_tritons_code(
    server: Server, client: Any
) -> None:
    ints = np.arange(4, dtype=np.int32)
    cases = [
        ("identity", "StatusCode.INVALID_ARGUMENT"),  # wrong datatype
        ("missing", "StatusCode.NOT_FOUND"),
        ("identity_batched", "StatusCode.INVALID_ARGUMENT"),  # no batch dimension
    ]
    for model, status in cases:
        with server.client() as zc, pytest.raises(InferpoolError) as expected:
            zc.infer(model, {"INPUT0": ints})
        with pytest.raises(InferenceServerException) as err:
            client.infer(model, [infer_input("INPUT0", ints, "INT32")])
        assert (status_of(err.value), err.value.message()) == (status, expected.value.message)
    with pytest.raises(InferenceServerException) as err:
        client.infer("repeat", [infer_input("N", np.array([2], np.int32), "INT32")])
    assert status_of(err.value) == "StatusCode.UNIMPLEMENTED"
    assert "decoupled transaction policy" in err.value.message()


# ============================================================================ streaming
def test_stream_of_a_decoupled_model(client: Any) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        n = infer_input("N", np.array([3], np.int32), "INT32")
        client.async_stream_infer("repeat", [n], request_id="s1")
        got = [answers.get(timeout=30) for _ in range(3)]
        assert [e for _, e in got] == [None, None, None]
        assert [r.as_numpy("OUT").tolist() for r, _ in got] == [[0], [1], [2]]
        final = [r.get_response().parameters["triton_final_response"].bool_param for r, _ in got]
        assert final == [False, False, False] and got[0][0].get_response().id == "s1"
        # an error travels in the stream, which goes on
        client.async_stream_infer("repeat", [infer_input("N", np.array([1.0], np.float32), "FP32")])
        result, error = answers.get(timeout=30)
        assert result is None and "data-type is 'FP32', but model 'repeat' expects" in str(error)
        # the empty final response, when asked for
        client.async_stream_infer("repeat", [n], enable_empty_final_response=True)
        got = [answers.get(timeout=30) for _ in range(4)]
        assert [
            r.get_response().parameters["triton_final_response"].bool_param for r, _ in got
        ] == [
            False,
            False,
            False,
            True,
        ]
        assert got[-1][0].get_response().outputs == []
        # a model that is not decoupled answers once in the stream
        x = np.ones(2, np.float32)
        client.async_stream_infer("identity", [infer_input("INPUT0", x, "FP32")])
        result, error = answers.get(timeout=30)
        assert error is None and result.as_numpy("OUTPUT0").tolist() == [1.0, 1.0]
    finally:
        client.stop_stream()
    assert answers.empty()


def test_stream_of_a_decoupled_ensemble(client: Any) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        count = infer_input("COUNT", np.array([3], np.int32), "INT32")
        client.async_stream_infer("repeated", [count], enable_empty_final_response=True)
        got = [answers.get(timeout=30) for _ in range(4)]
        assert [e for _, e in got] == [None] * 4
        assert [r.as_numpy("VALUE").tolist() for r, _ in got[:3]] == [[0], [1], [2]]
        assert got[3][0].get_response().outputs == []  # the ensemble's last word
        x = np.array([0.0, 1.0], np.float32)  # an ensemble that is not decoupled: one answer
        client.async_stream_infer("probabilities", [infer_input("RAW", x, "FP32")])
        result, error = answers.get(timeout=30)
        assert error is None and result.as_numpy("PROBS").argmax() == 1
    finally:
        client.stop_stream()
    assert answers.empty()


# ============================================================================ classification
def requested(*counts: tuple[str, int]) -> list[grpcclient.InferRequestedOutput]:
    return [grpcclient.InferRequestedOutput(name, class_count=n) for name, n in counts]


def test_classification_of_a_batch_with_and_without_labels(client: Any) -> None:
    """Triton's classification extension: BYTES [batch, N], "value:index[:label]"."""
    assert "classification" in client.get_server_metadata().extensions
    inputs = [infer_input("INPUT0", SCORES, "FP32"), infer_input("INPUT1", COUNTS, "INT32")]
    result = client.infer("labelled", inputs, outputs=requested(("OUTPUT0", 3), ("OUTPUT1", 2)))
    answer = result.get_output("OUTPUT0")
    assert (answer.datatype, list(answer.shape)) == ("BYTES", [2, 3])
    assert classes(result.as_numpy("OUTPUT0")) == TOP3
    assert classes(result.as_numpy("OUTPUT1")) == COUNTS_TOP2
    one = client.infer("labelled", inputs, outputs=requested(("OUTPUT0", 1), ("OUTPUT1", 0)))
    assert classes(one.as_numpy("OUTPUT0")) == [row[:1] for row in TOP3]
    np.testing.assert_array_equal(one.as_numpy("OUTPUT1"), COUNTS)
    flat = [infer_input("INPUT0", SCORES[1], "FP32")]
    unbatched = client.infer("labelled_flat", flat, outputs=requested(("OUTPUT0", 9)))
    assert list(unbatched.get_output("OUTPUT0").shape) == [5]  # at most the classes there are
    assert classes(unbatched.as_numpy("OUTPUT0")) == [*TOP3[1], "0.250000:2", "0.125000:3:three"]


def test_classification_in_a_stream(client: Any) -> None:
    """Classes in the stream's answers; one that cannot be classified is an error there,
    and the stream goes on."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        inputs = [infer_input("X", SCORES, "FP32"), infer_input("N", COUNTS, "INT32")]
        client.async_stream_infer("labelled_ensemble", inputs, outputs=requested(("SCORES", 3)))
        result, error = answers.get(timeout=30)
        assert error is None and classes(result.as_numpy("SCORES")) == TOP3  # its step's labels
        words = np.array([[b"w"]], dtype=np.object_)
        inputs = [infer_input("INPUT0", COUNTS[:1], "INT32"), infer_input("INPUT1", words, "BYTES")]
        client.async_stream_infer("identity_batched", inputs, outputs=requested(("OUTPUT1", 1)))
        result, error = answers.get(timeout=30)
        assert result is None
        assert error.message() == (
            "class result not available for output due to unsupported type 'BYTES'"
        )
        client.async_stream_infer("identity_batched", inputs, outputs=requested(("OUTPUT0", 1)))
        result, error = answers.get(timeout=30)
        assert error is None and classes(result.as_numpy("OUTPUT0")) == [COUNTS_TOP2[0][:1]]
    finally:
        client.stop_stream()
    assert answers.empty()


def test_classification_refused_in_tritons_words(server: Server, client: Any) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

        def refusal(**param: Any) -> tuple[Any, str]:
            request = service_pb2.ModelInferRequest(model_name="identity")
            x = request.inputs.add(name="INPUT0", datatype="FP32", shape=[2])
            x.contents.fp32_contents.extend([1, 2])
            out = request.outputs.add(name="OUTPUT0")
            for key, value in param.items():
                kind = "string_param" if isinstance(value, str) else "int64_param"
                setattr(out.parameters[key], kind, value)
            with pytest.raises(grpc.RpcError) as err:
                stub.ModelInfer(request)
            return err.value.code(), err.value.details()

        invalid = grpc.StatusCode.INVALID_ARGUMENT
        assert refusal(classification="2") == (
            invalid,
            "invalid value type for 'classification' parameter, expected int64_param",
        )
        for bad in (0, -1):
            assert refusal(classification=bad) == (
                invalid,
                "invalid value for 'classification' parameter, expected >= 0",
            )
        assert refusal(classification=1, shared_memory_region="r") == (
            invalid,
            "output can't set both 'shared_memory_region' and 'classification'",
        )
    assert client.is_server_live() and client.is_model_ready("identity")
    flat = [infer_input("INPUT0", SCORES[0], "FP32")]
    result = client.infer("identity", flat, outputs=requested(("OUTPUT0", 1)))
    assert classes(result.as_numpy("OUTPUT0")) == ["0.900000:3"]


# ============================================================================ statistics, repository
def test_statistics_and_repository(client: Any) -> None:
    x = np.ones(5, np.float32)
    before = client.get_inference_statistics("identity").model_stats[0].inference_count
    for _ in range(3):
        client.infer("identity", [infer_input("INPUT0", x, "FP32")])
    stats = client.get_inference_statistics("identity").model_stats
    assert [s.name for s in stats] == ["identity"] and stats[0].inference_count == before + 3
    index = {m.name: m.state for m in client.get_model_repository_index().models}
    assert index["repeat"] == "READY"
    client.unload_model("spare")
    assert not client.is_model_ready("spare")
    client.load_model("spare")
    assert client.is_model_ready("spare")


def test_load_with_config_and_file_overrides(client: Any) -> None:
    client.load_model("spare", config=SPARE_BATCHED)
    assert client.get_model_config("spare").config.max_batch_size == 4
    client.load_model("spare")  # no override: its config.pbtxt again
    assert client.get_model_config("spare").config.max_batch_size == 0
    client.load_model("double", config=DOUBLE_CONFIG, files=DOUBLE_FILES)
    x = np.array([3, 4], np.int32)
    y = client.infer("double", [infer_input("X", x, "INT32")]).as_numpy("Y")
    np.testing.assert_array_equal(y, x * 2)
    client.unload_model("double")
    with pytest.raises(InferenceServerException, match="Load parameter 'config' must be"):
        client.load_model("double", files=DOUBLE_FILES)
    with pytest.raises(InferenceServerException) as err:
        client.load_model("nosuch")
    assert err.value.status() == "StatusCode.INTERNAL"  # Triton's, and its words:
    assert "failed to load 'nosuch', failed to poll from model repository" in err.value.message()


# ============================================================================ shared memory
def test_system_shared_memory_inputs_and_outputs(client: Any) -> None:
    x = np.arange(16, dtype=np.int32).reshape(1, 16)
    key_in, key_out = f"/ipk-gin-{id(x)}", f"/ipk-gout-{id(x)}"
    h_in = shm.create_shared_memory_region("gin", key_in, x.nbytes)
    h_out = shm.create_shared_memory_region("gout", key_out, x.nbytes)
    try:
        shm.set_shared_memory_region(h_in, [x])
        client.register_system_shared_memory("gin", key_in, x.nbytes)
        client.register_system_shared_memory("gout", key_out, x.nbytes)
        regions = client.get_system_shared_memory_status().regions
        assert regions["gin"].key == key_in and regions["gin"].byte_size == x.nbytes
        inp = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
        inp.set_shared_memory("gin", x.nbytes)
        out = grpcclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("gout", x.nbytes)
        client.infer("identity_batched", [inp], outputs=[out])
        np.testing.assert_array_equal(shm.get_contents_as_numpy(h_out, np.int32, [1, 16]), x)
        client.unregister_system_shared_memory("gin")
        assert list(client.get_system_shared_memory_status().regions) == ["gout"]
        client.unregister_system_shared_memory()
        with pytest.raises(InferenceServerException) as err:
            client.infer("identity_batched", [inp], outputs=[out])
        assert status_of(err.value) == "StatusCode.NOT_FOUND"
    finally:
        shm.destroy_shared_memory_region(h_in)
        shm.destroy_shared_memory_region(h_out)


def test_cuda_shared_memory_registration(client: Any) -> None:
    """Without a GPU (or cupy) the server says so; with one it keeps the registration."""
    try:
        # tritonclient takes the handle base64-encoded, as cuda_shared_memory gives it
        client.register_cuda_shared_memory("dev", base64.b64encode(b"\x01" * 64), 0, 1024)
    except InferenceServerException as err:
        assert status_of(err) == "StatusCode.UNIMPLEMENTED"
        assert "CUDA shared memory is not available on this server" in err.message()
        return
    assert client.get_cuda_shared_memory_status().regions["dev"].byte_size == 1024
    client.unregister_cuda_shared_memory("dev")
    assert not client.get_cuda_shared_memory_status().regions
