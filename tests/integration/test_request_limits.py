"""No request can kill a worker: what would not fit on a worker's channel is refused at
admission (INVALID_ARG naming the limit), batches are closed before they outgrow it, and
results too large to come back fail alone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import zmq

from inferpool.broker.front.limits import MAX_ID_LENGTH, MAX_PARAMETERS_BYTES
from inferpool.client import InferpoolError
from tests.support import Server, identity_config, write_model

PARAMS_MODEL = """
import json
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            size = json.loads(request.parameters()).get("reply_bytes", 0)
            out = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", out)], parameters={"blob": "r" * size}
                )
            )
        return responses
"""
# long enough for requests sent together to be batched together
SLOW_BATCHES = "dynamic_batching { max_queue_delay_microseconds: 500000 }"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = Path(tmp_path_factory.mktemp("limits"))
    repo = tmp / "repo"
    write_model(repo, "identity", identity_config("identity"))
    write_model(
        repo, "batched", identity_config("batched", dims="[ 4 ]", max_batch=8, extra=SLOW_BATCHES)
    )
    write_model(
        repo,
        "params",
        identity_config("params", dims="[ 4 ]", max_batch=8, extra=SLOW_BATCHES).replace(
            '"identity"', '"python"'
        ),
        files={"1/model.py": PARAMS_MODEL},
    )
    with Server(tmp, repo) as srv:
        yield srv


@pytest.fixture
def workers(server: Server) -> Iterator[dict[str, Any]]:
    """The instances before the test; after it, every one must be the same process."""
    with server.client() as c:
        before = {r["instance"]: r for r in c.status()}
    yield before
    with server.client() as c:
        after = {r["instance"]: r for r in c.status()}
    for name, row in before.items():
        assert after[name]["pid"] == row["pid"], f"worker {name} was replaced: {after[name]}"
        assert after[name]["restarts"] == row["restarts"], after[name]


FOUR = np.arange(4, dtype=np.float32)


def _error(server: Server, **options: Any) -> InferpoolError:
    with server.client() as c, pytest.raises(InferpoolError) as info:
        c.infer("identity", {"INPUT0": FOUR}, **options)
    return info.value


def test_huge_parameters_are_refused(server: Server, workers: dict[str, Any]) -> None:
    err = _error(server, parameters={"big": "p" * 200_000})
    assert err.code == "INVALID_ARG"
    assert f"at most {MAX_PARAMETERS_BYTES} bytes" in err.message, err.message
    with server.client() as c:
        assert c.infer("identity", {"INPUT0": FOUR})["OUTPUT0"].tolist() == FOUR.tolist()


def test_huge_id_is_refused(server: Server, workers: dict[str, Any]) -> None:
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.endpoint)
    try:
        header = {
            "type": "infer",
            "id": "i" * 200_000,
            "model_name": "identity",
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4]}],
        }
        sock.send_multipart([b"", orjson.dumps(header), FOUR.tobytes()])
        assert sock.poll(10_000)
        reply = orjson.loads(sock.recv_multipart()[1])
    finally:
        sock.close()
    assert reply["error"]["code"] == "INVALID_ARG"
    assert f"at most {MAX_ID_LENGTH} characters" in reply["error"]["message"]


def _concurrently(server: Server, model: str, parameters: list[dict[str, Any]]) -> list[dict]:
    """Send every request at once on one DEALER socket (the batcher groups them); replies."""
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.endpoint)
    try:
        for i, params in enumerate(parameters):
            header = {
                "type": "infer",
                "id": str(i),
                "model_name": model,
                "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4]}],
                "parameters": params,
            }
            sock.send_multipart([b"", orjson.dumps(header), FOUR.tobytes()])
        replies = []
        for _ in parameters:
            assert sock.poll(30_000), "a request was not answered"
            replies.append(orjson.loads(sock.recv_multipart()[1]))
    finally:
        sock.close()
    return sorted(replies, key=lambda r: int(r["id"]))


def test_batches_stay_within_the_channel(server: Server, workers: dict[str, Any]) -> None:
    """Eight requests of 30 KB of parameters each fit alone, not together."""
    replies = _concurrently(server, "batched", [{"pad": "b" * 30_000}] * 8)
    assert [r.get("error") for r in replies] == [None] * 8, replies
    with server.client() as c:
        stats = c.statistics("batched")["model_stats"][0]
    assert stats["inference_count"] >= 8
    assert stats["execution_count"] >= 2, "the eight requests cannot travel as one batch"


def test_results_too_large_to_come_back_fail_alone(server: Server, workers: dict[str, Any]) -> None:
    """One response too large for the channel is an error for its request only; a batch whose
    responses fit one by one but not together is answered in full."""
    sizes = [300_000, 60_000, 60_000, 60_000, 10]
    replies = _concurrently(server, "params", [{"reply_bytes": n} for n in sizes])
    assert replies[0]["error"]["code"] == "INTERNAL"
    assert "too large for the worker channel" in replies[0]["error"]["message"]
    for reply, size in zip(replies[1:], sizes[1:], strict=True):
        assert "error" not in reply, reply
        assert reply["parameters"]["blob"] == "r" * size
