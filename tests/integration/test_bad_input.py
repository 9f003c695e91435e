"""Bad input gets a clear error, other clients keep being served, nothing leaks."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import zmq

from inferpool.client import InferpoolError
from tests.support import EXAMPLES, Server, copy_models, identity_config, serving, write_model


def raw(endpoint: str, parts: list[Any], timeout_ms: int = 10000) -> list[bytes]:
    """Send raw frames on a fresh DEALER socket and return the reply's frames."""
    ctx: zmq.Context[Any] = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send_multipart(parts)
        assert sock.poll(timeout_ms), "no reply"
        return sock.recv_multipart()
    finally:
        sock.close()


def error_of(reply: list[bytes]) -> dict[str, str]:
    assert reply[0] == b"", reply
    header = orjson.loads(reply[1])
    assert "error" in header, header
    return header["error"]


def infer_header(**kw: Any) -> bytes:
    h = {
        "type": "infer",
        "model_name": "identity",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4]}],
    }
    h.update(kw)
    return orjson.dumps(h)


FOUR = np.arange(4, dtype=np.float32).tobytes()

BAD = [
    ("not json", [b"", b"{nope", FOUR], "INVALID_ARG", "malformed header: not valid UTF-8 JSON"),
    ("not an object", [b"", b"[1, 2]", FOUR], "INVALID_ARG", "expected a JSON object, got list"),
    ("no delimiter", [b"{}"], "INVALID_ARG", "expected [empty delimiter, JSON header"),
    ("unknown type", [b"", b'{"type": "launch"}'], "INVALID_ARG", "unknown message type 'launch'"),
    (
        "old protocol",
        [b"", b'{"type": "health_live", "protocol": 99}'],
        "UNSUPPORTED",
        "protocol version 99",
    ),
    (
        "unknown model",
        [b"", infer_header(model_name="nope"), FOUR],
        "NOT_FOUND",
        "unknown model: 'nope'",
    ),
    (
        "unknown version",
        [b"", infer_header(model_version="9"), FOUR],
        "NOT_FOUND",
        "'identity' version 9 is not found",
    ),
    (
        "bad version",
        [b"", infer_header(model_version="x"), FOUR],
        "INVALID_ARG",
        "model_version must be a version number",
    ),
    (
        "wrong datatype",
        [b"", infer_header(inputs=[{"name": "INPUT0", "datatype": "INT32", "shape": [4]}]), FOUR],
        "INVALID_ARG",
        "inference input 'INPUT0' data-type is 'INT32', but model 'identity' expects 'FP32'",
    ),
    (
        "unknown datatype",
        [b"", infer_header(inputs=[{"name": "INPUT0", "datatype": "FP128", "shape": [4]}]), FOUR],
        "INVALID_ARG",
        "data-type is 'FP128'",
    ),
    (
        "wrong rank",
        [b"", infer_header(inputs=[{"name": "INPUT0", "datatype": "FP32", "shape": [2, 2]}]), FOUR],
        "INVALID_ARG",
        "unexpected shape for input 'INPUT0' for model 'identity'. Expected [-1], got [2,2]",
    ),
    (
        "bad shape",
        [b"", infer_header(inputs=[{"name": "INPUT0", "datatype": "FP32", "shape": [-4]}]), FOUR],
        "INVALID_ARG",
        "shape must be a list of non-negative integers",
    ),
    (
        "byte count",
        [b"", infer_header(), FOUR[:12]],
        "INVALID_ARG",
        "input byte size mismatch for input 'INPUT0' for model 'identity'. Expected 16, got 12",
    ),
    (
        "missing frame",
        [b"", infer_header()],
        "INVALID_ARG",
        "input 'INPUT0' for model 'identity' has no data",
    ),
    (
        "extra frame",
        [b"", infer_header(), FOUR, FOUR],
        "INVALID_ARG",
        "sent 2 tensor frame(s) but its inputs use 1",
    ),
    (
        "unknown input",
        [b"", infer_header(inputs=[{"name": "X", "datatype": "FP32", "shape": [4]}]), FOUR],
        "INVALID_ARG",
        "unexpected inference input 'X' for model 'identity'",
    ),
    (
        "missing input",
        [b"", infer_header(inputs=[])],
        "INVALID_ARG",
        "expected 1 inputs but got 0 inputs for model 'identity'. Got input(s) [], but missing required input(s) ['INPUT0']",
    ),
    (
        "input twice",
        [
            b"",
            infer_header(inputs=[{"name": "INPUT0", "datatype": "FP32", "shape": [4]}] * 2),
            FOUR,
            FOUR,
        ],
        "INVALID_ARG",
        "input 'INPUT0' is given more than once",
    ),
    (
        "unknown output",
        [b"", infer_header(outputs=[{"name": "OUT9"}]), FOUR],
        "INVALID_ARG",
        "unexpected inference output 'OUT9' for model 'identity'",
    ),
    (
        "inputs not a list",
        [b"", infer_header(inputs={"INPUT0": 1}), FOUR],
        "INVALID_ARG",
        "has no 'inputs' list",
    ),
    (
        "bad sequence flag",
        [b"", infer_header(parameters={"sequence_start": "yes"}), FOUR],
        "INVALID_ARG",
        "sequence_start must be a boolean",
    ),
    (
        "too large",
        [
            b"",
            infer_header(inputs=[{"name": "INPUT0", "datatype": "FP32", "shape": [600000]}]),
            np.zeros(600000, np.float32).tobytes(),
        ],
        "INVALID_ARG",
        "exceeds the server limit of 2097152 bytes",
    ),
]


FAILING = ("nobackend", "noversion", "badnames", "mismatch", "nobody")


def four(
    name: str, backend: str = "identity", input_name: str = "INPUT0", output_type: str = "TYPE_FP32"
) -> str:
    """A config of one FP32 input and one output of 4 elements (no backend line: ``""``)."""
    line = f'backend: "{backend}"' if backend else ""
    return f"""
        name: "{name}"
        {line}
        input [ {{ name: "{input_name}" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        output [ {{ name: "OUTPUT0" data_type: {output_type} dims: [ 4 ] }} ]
    """


def repository(tmp: Path) -> Path:
    """Every test's models in one repository: the example identity, a batching pair, and a
    good model beside five that fail to load, each for another reason."""
    repo = copy_models(tmp, EXAMPLES, "identity")
    write_model(
        repo,
        "pair",
        """
        name: "pair"
        backend: "identity"
        max_batch_size: 4
        dynamic_batching { max_queue_delay_microseconds: 300000 }
        input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 2 ] },
                { name: "INPUT1" data_type: TYPE_INT32 dims: [ 2 ] optional: true } ]
        output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 2 ] },
                 { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 2 ] } ]
        parameters { key: "execute_delay_ms" value: { string_value: "50" } }
    """,
    )
    write_model(repo, "good", identity_config("good"))
    write_model(repo, "nobackend", four("nobackend", backend=""))
    write_model(repo, "noversion", identity_config("noversion"), versions=())
    write_model(repo, "badnames", four("badnames", input_name="IN0"))
    write_model(repo, "mismatch", four("mismatch", output_type="TYPE_INT32"))
    write_model(repo, "nobody", identity_config("nobody").replace('"identity"', '"nosuchbackend"'))
    return repo


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """One server for the module: its tests send what no other test sees (each compares the
    arena before and after, or uses a model of its own)."""
    # models that fail to load are part of the repository: the others are served
    yield from serving(repository, "--max-request-bytes", "2M", "--exit-on-error=false")


def test_each_bad_request_gets_a_named_error_and_nothing_leaks(server: Server) -> None:
    with server.client() as c:
        free_before = c.statistics()["arena"]["free"]
    for what, parts, code, text in BAD:
        err = error_of(raw(server.endpoint, parts))
        assert err["code"] == code, (what, err)
        assert text in err["message"], (what, err["message"])
    with server.client() as c:
        stats = c.statistics()
        assert stats["arena"]["free"] == free_before
        assert stats["inflight"] == 0
        np.testing.assert_array_equal(
            c.infer("identity", {"INPUT0": np.ones(3, np.float32)})["OUTPUT0"], 1
        )


def test_other_clients_are_served_during_a_burst_of_garbage(server: Server) -> None:
    failures: list[str] = []
    stop = threading.Event()

    def good_client() -> None:
        with server.client(timeout=10) as c:
            i = 0
            while not stop.is_set():
                x = np.full(16, i, np.float32)
                out = c.infer("identity", {"INPUT0": x})["OUTPUT0"]
                if not np.array_equal(out, x):
                    failures.append(f"wrong answer {out}")
                i += 1

    t = threading.Thread(target=good_client)
    t.start()
    try:
        for _ in range(20):
            for _what, parts, code, _text in BAD:
                assert error_of(raw(server.endpoint, parts))["code"] == code
    finally:
        stop.set()
        t.join(20)
    assert not failures
    with server.client() as c:
        assert c.statistics()["arena"]["free"] == c.statistics()["arena"]["size"]


def test_backend_errors_do_not_sink_the_batch(server: Server) -> None:
    """identity answers a request that asks for an output of a missing, non-optional input
    with an error, and the other requests of the same batch still get their results."""
    c1, c2 = server.client(), server.client()
    try:
        a = np.array([[1, 2]], np.int32)
        r1 = c1._send(
            {
                "type": "infer",
                "model_name": "pair",
                "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 2]}],
            },
            [a.data],
        )
        r2 = c2._send(
            {
                "type": "infer",
                "model_name": "pair",
                "inputs": [
                    {"name": "INPUT0", "datatype": "INT32", "shape": [1, 2]},
                    {"name": "INPUT1", "datatype": "INT32", "shape": [1, 2]},
                ],
            },
            [a.data, a.data],
        )
        h1, f1 = c1._recv(r1, 10)
        h2, f2 = c2._recv(r2, 10)
        assert "error" not in h1 and "error" not in h2
        assert np.frombuffer(f1[1].buffer, np.int32).tolist() == [0, 0]  # optional -> zeros
        assert np.frombuffer(f2[1].buffer, np.int32).tolist() == [1, 2]
        only_optional = {"name": "INPUT1", "datatype": "INT32", "shape": [1, 2]}
        for _ in range(2):  # checked in full, then as an input the model has seen
            r3 = c1._send(
                {"type": "infer", "model_name": "pair", "inputs": [only_optional]}, [a.data]
            )
            h3, _ = c1._recv(r3, 10)
            assert h3["error"]["code"] == "INVALID_ARG"
            assert "missing required input(s) ['INPUT0']" in h3["error"]["message"]
    finally:
        c1.close()
        c2.close()


def test_model_that_fails_to_load_is_unavailable_with_its_reason(server: Server) -> None:
    with server.client() as c:
        assert not c.is_ready()  # strict readiness: not every model loaded
        rows = {r["name"]: r for r in c.models()}
        assert rows["good"]["state"] == "READY"
        assert (
            "Could not determine backend for model 'nobackend' with no backend in model configuration"
            in rows["nobackend"]["reason"]
        )
        assert "Add a backend line to config.pbtxt" in rows["nobackend"]["reason"]
        assert (
            "at least one version must be available under the version policy of model 'noversion'"
            in rows["noversion"]["reason"]
        )
        assert (
            "expected input name to follow INPUT<index> pattern, got 'IN0'"
            in rows["badnames"]["reason"]
        )
        assert "TRITONBACKEND_ModelInitialize" in rows["badnames"]["reason"]
        assert (
            "expected input and output datatype to match, got TYPE_FP32 and TYPE_INT32"
            in rows["mismatch"]["reason"]
        )
        assert "unable to find backend 'nosuchbackend'" in rows["nobody"]["reason"]
        for name in FAILING:
            assert rows[name]["state"] == "UNAVAILABLE", rows[name]
        with pytest.raises(InferpoolError, match="badnames") as err:
            c.infer("badnames", {"INPUT0": np.ones(4, np.float32)})
        assert err.value.code.value == "UNAVAILABLE"
        np.testing.assert_array_equal(
            c.infer("good", {"INPUT0": np.ones(4, np.float32)})["OUTPUT0"], 1
        )
        # no worker is left running for the failed models, and none is respawned
        states = {r["instance"]: r["state"] for r in c.status()}
        assert states["good_0"] == "READY"
        assert all(
            v in ("FAILED", "STOPPED") for k, v in states.items() if k.rsplit("_", 2)[0] in FAILING
        )
