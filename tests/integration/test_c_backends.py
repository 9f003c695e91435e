"""C backends built against the project's headers, served by the real broker and workers:
the answer's bytes and parameters, the statistics and custom metrics the backend reports,
and nothing of the run left in /dev/shm after stop."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.cabi_support import compiler, install
from tests.integration.test_metrics import scrape
from tests.support import Server, free_tcp_port, serving, write_model

ECHO = """
    name: "echo"
    backend: "echo"
    max_batch_size: 8
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
            { name: "INPUT1" data_type: TYPE_INT64 dims: [ -1 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
             { name: "OUTPUT1" data_type: TYPE_INT64 dims: [ -1 ] } ]
"""
METRICS_PORT = free_tcp_port()


def _repository(tmp: Path) -> Path:
    compiler()
    repo = tmp / "repo"
    write_model(repo, "echo", ECHO)
    install("echo", repo / "echo")
    return repo


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from serving(_repository, "--metrics-port", str(METRICS_PORT))


def test_every_request_and_response_function(server: Server) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    y = np.array([[1, -2, 3], [4, 5, -6]], dtype=np.int64)
    parameters = {"text": "hello", "number": 7, "flag": True, "ratio": 0.25}
    with server.client() as c:
        result = c.infer_result("echo", {"INPUT0": x, "INPUT1": y}, parameters=parameters)
        only = c.infer("echo", {"INPUT0": x, "INPUT1": y}, ["OUTPUT1"])
    np.testing.assert_array_equal(result.outputs["OUTPUT0"], x)
    np.testing.assert_array_equal(result.outputs["OUTPUT1"], y)
    assert list(only) == ["OUTPUT1"]
    np.testing.assert_array_equal(only["OUTPUT1"], y)
    p = result.parameters
    assert (p["echo_text"], p["echo_number"], p["echo_flag"], p["echo_ratio"]) == (
        "hello", 7, True, 0.25
    )  # fmt: skip
    assert (p["param0"], p["param1"], p["param2"], p["param3"]) == (
        "an example string parameter", 42, False, 123.123
    )  # fmt: skip


def test_statistics_and_custom_metric(server: Server) -> None:
    x = np.ones((1, 4), np.float32)
    y = np.ones((1, 2), np.int64)
    with server.client() as c:
        before = c.statistics("echo")["model_stats"][0]
        for _ in range(3):
            c.infer("echo", {"INPUT0": x, "INPUT1": y})
        after = c.statistics("echo")["model_stats"][0]
    success = (
        after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    )
    assert success == 3
    assert after["execution_count"] - before["execution_count"] == 3
    assert (
        after["inference_stats"]["compute_infer"]["ns"]
        > before["inference_stats"]["compute_infer"]["ns"]
    )
    got = scrape(METRICS_PORT)
    labels = (("model", "echo"), ("version", "1"))
    assert got[("TYPE echo_input_bytes", ())] == "counter"
    assert got[("echo_input_bytes", labels)] >= 3 * (x.nbytes + y.nbytes)
