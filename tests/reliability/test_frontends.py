"""The KServe frontends under hostile bodies: malformed HTTP requests and gRPC messages,
broken streams, bodies and messages over the limits, bodies that stall.  Every request is
answered (an HTTP status below 500, a gRPC status other than UNKNOWN and INTERNAL), the
broker's memory comes back after the big and the slow ones, and good requests are served
throughout.

Short by default; ``INFERPOOL_LONG_TESTS=1`` sends thousands.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from tests.reliability.hostile import json_values
from tests.reliability.support import LONG, record, reliability_repo
from tests.support import Server

MiB = 1 << 20
LIMIT = 4 * MiB
LIMITS = (
    ("--http-max-input-size", "4M"),
    ("--grpc-max-input-size", "4M"),
    ("--http-body-budget", "8M"),
    ("--http-body-timeout", "1"),
    ("--http-header-timeout", "1"),
)
CHECK = settings(
    max_examples=1500 if LONG else 40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
BIG = 24 if LONG else 4  # messages and bodies over the limit, each size
STALLED = 12 if LONG else 4  # bodies that stall at once
INFER = "/v2/models/identity/infer"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = Path(tmp_path_factory.mktemp("frontends"))
    args = [a for pair in LIMITS for a in pair]
    with Server(tmp, reliability_repo(tmp), *args, kserve=True) as srv:
        yield srv
        assert srv.stop() == 0, srv.log()[-3000:]


@pytest.fixture(scope="module")
def figures() -> Iterator[dict[str, Any]]:
    data: dict[str, Any] = {"limits": dict(LIMITS)}
    yield data
    record("frontends", data)


def rss(server: Server) -> int:
    return int(psutil.Process(server.proc.pid).memory_info().rss)


def good_body(n: int = 2) -> dict[str, Any]:
    return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [n], "data": [1.0] * n}]}


def post(conn: http.client.HTTPConnection, body: bytes, headers: dict[str, str]) -> int:
    conn.request("POST", INFER, body=body, headers={"Content-Type": "application/json", **headers})
    response = conn.getresponse()
    response.read()
    return int(response.status)


def served_over_http(server: Server) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=20)
    with contextlib.closing(conn):
        assert post(conn, json.dumps(good_body()).encode(), {}) == 200


# ---------------------------------------------------------------------------- HTTP bodies
KINDS = ["parameters", "in_params", "out_params", "inputs", "datatype", "shape", "data"]
KINDS += ["id", "outputs", "binary", "text", "deep"]


@st.composite
def http_bodies(draw: st.DrawFn) -> tuple[bytes, dict[str, str]]:
    """An inference body with one defect (or none, by chance), and its extra headers."""
    body: Any = good_body(draw(st.integers(1, 4)))
    headers: dict[str, str] = {}
    kind = draw(st.sampled_from(KINDS))
    value = draw(json_values)
    inp = body["inputs"][0]
    if kind == "parameters":
        body["parameters"] = value
    elif kind == "in_params":
        inp["parameters"] = value
    elif kind == "out_params":
        body["outputs"] = [{"name": "OUTPUT0", "parameters": value}]
    elif kind == "inputs":
        body["inputs"] = value
    elif kind in ("datatype", "shape", "data"):
        inp[kind] = value
    elif kind == "id":
        body["id"] = value
    elif kind == "outputs":
        body["outputs"] = value
    elif kind == "binary":
        payload = draw(st.binary(max_size=64))
        inp.pop("data")
        inp["parameters"] = {"binary_data_size": draw(st.integers(-8, 80) | json_values)}
        text = json.dumps(body).encode()
        junk = st.text("0123456789-+.xe ", max_size=6)
        length = draw(st.one_of(st.just(len(text)), st.integers(-4, 400), junk))
        headers["Inference-Header-Content-Length"] = str(length)
        return text + payload, headers
    elif kind == "text":
        return draw(st.binary(max_size=200)), headers
    else:
        depth = draw(st.integers(2, 300))
        body["inputs"][0]["shape"] = json.loads("[" * depth + "]" * depth)
    return json.dumps(body).encode(), headers


def test_hostile_http_bodies_are_answered_below_500(server, figures) -> None:
    statuses: Counter[int] = Counter()
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=20)

    @CHECK
    @given(http_bodies())
    def check(sent: tuple[bytes, dict[str, str]]) -> None:
        status = post(conn, *sent)
        statuses[status] += 1
        assert status < 500 or status == 503, (status, sent[0][:200])

    with contextlib.closing(conn):
        check()
    figures["http bodies"] = {str(k): n for k, n in sorted(statuses.items())}
    served_over_http(server)


# ---------------------------------------------------------------------------- gRPC messages
BAD_STATUS = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}


def valid_request(tag: str) -> bytes:
    request = pb.ModelInferRequest(model_name="identity", id=tag)
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
    tensor.contents.fp32_contents.append(1.0)
    return request.SerializeToString()


def test_hostile_grpc_messages_and_broken_streams_are_answered(server, figures) -> None:
    """Random bytes as ModelInfer (INVALID_ARGUMENT, or a request that parses and is refused
    by its fields), and streams of random messages between valid ones: each message gets one
    answer in the stream, each valid one its result."""
    codes: Counter[str] = Counter()
    stream_answers: Counter[str] = Counter()
    with grpc.insecure_channel(server.grpc_url) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        stream = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )

        @CHECK
        @given(st.lists(st.binary(min_size=1, max_size=80), min_size=1, max_size=6))
        def check(messages: list[bytes]) -> None:
            for data in messages:
                try:
                    infer(data, timeout=20)
                    codes["OK"] += 1
                except grpc.RpcError as err:
                    assert err.code() not in BAD_STATUS, (err, data)
                    codes[err.code().name] += 1
            sent = [valid_request("first"), *messages, valid_request("last")]
            answers = list(stream(iter(sent), timeout=20))
            assert len(answers) == len(sent), answers
            ids = {a.infer_response.id for a in answers if not a.error_message}
            assert {"first", "last"} <= ids
            for a in answers:
                stream_answers["error" if a.error_message else "result"] += 1

        check()
    figures["grpc messages"] = dict(codes)
    figures["grpc stream answers"] = dict(stream_answers)


# ---------------------------------------------------------------------------- sizes, slowness
def test_big_messages_and_bodies_are_refused_and_the_memory_comes_back(server, figures) -> None:
    before = rss(server)
    refused: Counter[str] = Counter()
    over = b"\x0a" + b"\xff" * (2 * LIMIT)  # twice the limit
    with grpc.insecure_channel(
        server.grpc_url, options=[("grpc.max_send_message_length", -1)]
    ) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        for _ in range(BIG):
            with pytest.raises(grpc.RpcError) as err:
                infer(over, timeout=30)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            refused["gRPC RESOURCE_EXHAUSTED"] += 1
    body = b"[" + b" " * (2 * LIMIT) + b"]"
    for _ in range(BIG):
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
        with contextlib.closing(conn):
            try:
                status = post(conn, body, {})
            except (ConnectionError, http.client.HTTPException):
                status = 413  # answered before the whole body was sent, then closed
        assert status == 413
        refused["HTTP 413"] += 1
    served_over_http(server)
    figures["big"] = {
        "refused": dict(refused),
        "each (MiB)": 2 * LIMIT // MiB,
        "broker RSS growth (MiB)": round((rss(server) - before) / MiB, 1),
    }


def test_stalled_bodies_are_bounded_in_memory_and_time(server, figures) -> None:
    """STALLED bodies of 3 MiB declared and stalled at once: the 8 MiB budget takes two, the
    rest are refused at once (503); the two end with 408 after the body timeout."""
    before = rss(server)
    started = time.monotonic()
    socks = []
    for _ in range(STALLED):
        sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
        head = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {3 * MiB}\r\n\r\n"
        sock.sendall(head.encode() + b"{" + b" " * (MiB - 1))
        socks.append(sock)
    statuses: Counter[int] = Counter()
    try:
        for sock in socks:
            reply = sock.recv(4096)
            statuses[int(reply.split()[1])] += 1
    finally:
        for sock in socks:
            sock.close()
    assert statuses == Counter({503: STALLED - 2, 408: 2}), statuses
    served_over_http(server)
    figures["stalled"] = {
        "bodies": STALLED,
        "statuses": {str(k): n for k, n in sorted(statuses.items())},
        "seconds to the last answer": round(time.monotonic() - started, 2),
        "broker RSS growth (MiB)": round((rss(server) - before) / MiB, 1),
    }
