"""The KServe frontends under hostile callers: oversized gRPC messages and HTTP bodies, slow
bodies and headers, more bodies at once than the frontend will hold.  Every one is refused by
name (the flag that sets the limit), the memory is let go, and the others are served.

The server's limits here are small (2 MiB a body or message, a 3 MiB budget, 1 s timeouts)
so that the tests stay small and short.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from tests.support import EXAMPLES, Server

MiB = 1 << 20
LIMITS = (
    "--grpc-max-input-size",
    "2M",
    "--http-max-input-size",
    "2M",
    "--http-body-budget",
    "3M",
    "--http-body-timeout",
    "1",
    "--http-header-timeout",
    "1",
)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    tmp = Path(tempfile.mkdtemp(prefix="ipt-", dir="/tmp"))
    try:
        with Server(tmp, EXAMPLES, *LIMITS, kserve=True) as srv:
            yield srv
            assert srv.stop() == 0, srv.log()[-3000:]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def grpc_infer(server: Server, values: np.ndarray) -> np.ndarray:
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        inp = grpcclient.InferInput("INPUT0", list(values.shape), "FP32")
        inp.set_data_from_numpy(values)
        out = c.infer("identity", [inp]).as_numpy("OUTPUT0")
        assert out is not None
        return out


def http_served(server: Server) -> None:
    values = np.arange(4, dtype=np.float32)
    with contextlib.closing(httpclient.InferenceServerClient(server.http_url)) as c:
        inp = httpclient.InferInput("INPUT0", [4], "FP32")
        inp.set_data_from_numpy(values)
        assert c.infer("identity", [inp]).as_numpy("OUTPUT0").tolist() == values.tolist()


def test_a_grpc_message_over_the_limit_is_resource_exhausted(server: Server) -> None:
    with pytest.raises(InferenceServerException) as err:
        grpc_infer(server, np.ones(3 * MiB // 4, np.float32))
    assert err.value.status() == str(grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert str(2 * MiB) in err.value.message(), err.value.message()
    small = np.arange(5, dtype=np.float32)
    assert grpc_infer(server, small).tolist() == small.tolist()


def raw_post(server: Server, length: int, sent: bytes = b"") -> socket.socket:
    """A connection that has sent an inference's headers declaring ``length`` bytes of
    body, and ``sent`` of them."""
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    head = (
        f"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    )
    sock.sendall(head.encode() + sent)
    return sock


def answer(sock: socket.socket) -> tuple[int, dict]:
    """The status and JSON body of the response on ``sock`` (it waits for it)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed without an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return int(head.split()[1]), json.loads(body)


def test_an_http_body_over_the_limit_is_413_naming_the_flag(server: Server) -> None:
    with contextlib.closing(raw_post(server, 3 * MiB)) as sock:
        status, body = answer(sock)
    assert status == 413 and "--http-max-input-size" in body["error"], body
    http_served(server)


def test_a_stalled_body_is_408_after_the_body_timeout(server: Server) -> None:
    with contextlib.closing(raw_post(server, MiB, b"{")) as sock:
        status, body = answer(sock)
    assert status == 408 and "--http-body-timeout" in body["error"], body
    http_served(server)


def test_bodies_past_the_budget_are_refused_and_the_budget_comes_back(server: Server) -> None:
    """Two stalled bodies of 1.2 MiB hold 2.4 MiB of the 3 MiB budget: a third is refused
    at once (503), the first two end with 408, and then the budget serves again."""
    size = 6 * MiB // 5
    stalled = [raw_post(server, size, b"{"), raw_post(server, size, b"{")]
    try:
        with contextlib.closing(raw_post(server, size, b"{")) as third:
            status, body = answer(third)
        assert status == 503 and "--http-body-budget" in body["error"], body
        assert [answer(s)[0] for s in stalled] == [408, 408]
    finally:
        for sock in stalled:
            sock.close()
    http_served(server)


def test_a_connection_that_never_finishes_its_headers_is_closed(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n")
        assert sock.recv(65536) == b""  # closed by the server after --http-header-timeout
    http_served(server)


GARBAGE = b"\xff\xff\xff\xff\x0f"  # a field number 0 with a truncated varint: no protobuf


def test_a_malformed_grpc_message_is_invalid_argument(server: Server) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as err:
            infer(GARBAGE, timeout=20)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
    assert "malformed ModelInfer message" in err.value.details()


def test_a_malformed_stream_message_is_answered_and_the_stream_goes_on(server: Server) -> None:
    request = pb.ModelInferRequest(model_name="identity", id="after")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[2])
    tensor.contents.fp32_contents.extend([1.0, 2.0])
    with grpc.insecure_channel(server.grpc_url) as channel:
        stream = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )
        answers = list(stream(iter([GARBAGE, request.SerializeToString()]), timeout=20))
    assert len(answers) == 2, answers
    assert "malformed ModelStreamInfer message" in answers[0].error_message
    assert not answers[1].error_message and answers[1].infer_response.id == "after"


@pytest.mark.parametrize("where", ["request", "input", "output"])
def test_parameters_that_are_not_an_object_are_400(server: Server, where: str) -> None:
    for bad in ([1], "x", 5, True, 1.5, []):
        body: dict = {
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1]}],
            "outputs": [{"name": "OUTPUT0"}],
        }
        holder = {"request": body, "input": body["inputs"][0], "output": body["outputs"][0]}
        holder[where]["parameters"] = bad
        data = json.dumps(body).encode()
        with contextlib.closing(raw_post(server, len(data), data)) as sock:
            status, answer_body = answer(sock)
        assert status == 400, (bad, answer_body)
        assert "'parameters' of" in answer_body["error"] and "JSON object" in answer_body["error"]
