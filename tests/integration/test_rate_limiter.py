"""The rate limiter across models, on a real server: instances that need the one resource
there is never execute at the same time; a model the server could never run fails its load
with Triton's words."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.integration.pytorch_support import serving
from tests.support import write_model

TIMED_PY = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        start = time.monotonic()
        time.sleep(0.2)
        span = np.array([start, time.monotonic()], np.float64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SPAN", span)]) for _ in requests]
"""


def timed(name: str, resources: str) -> str:
    return f"""
        name: "{name}" backend: "python"
        input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [ {{ name: "SPAN" data_type: TYPE_FP64 dims: [ 2 ] }} ]
        instance_group [ {{ count: 1 kind: KIND_CPU rate_limiter {{ {resources} }} }} ]
    """


def build(repo: Path) -> None:
    one = 'resources [ { name: "R" global: true count: 1 } ]'
    for name in ("first", "second"):
        write_model(repo, name, timed(name, one), files={"1/model.py": TIMED_PY})
    greedy = 'resources [ { name: "R" global: true count: 3 } ]'
    write_model(repo, "greedy", timed("greedy", greedy), files={"1/model.py": TIMED_PY})


@pytest.fixture(scope="module")
def server() -> Iterator:
    # greedy cannot load with R:1, by design: the others are served
    args = (
        "--rate-limit",
        "execution_count",
        "--rate-limit-resource",
        "R:1",
        "--exit-on-error=false",
    )
    with serving(build, *args) as s:
        yield s


def test_instances_that_need_the_one_resource_never_run_together(server) -> None:
    spans: list[np.ndarray] = []

    def call(model: str) -> None:
        with server.client() as c:
            for _ in range(3):
                spans.append(c.infer(model, {"X": np.zeros(1, np.int32)})["SPAN"])

    threads = [threading.Thread(target=call, args=(m,)) for m in ("first", "second")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(spans) == 6
    ordered = sorted(spans, key=lambda s: s[0])
    for earlier, later in itertools.pairwise(ordered):
        assert earlier[1] <= later[0], "two instances held the one R at once"
    with server.client() as c:  # both models ran: the resource went round
        executions = [
            c.statistics(m)["model_stats"][0]["execution_count"] for m in ("first", "second")
        ]
    assert executions == [3, 3]


def test_an_instance_that_needs_more_than_there_is_fails_its_load(server) -> None:
    with server.client() as c:
        row = next(r for r in c.models() if r["name"] == "greedy")
    assert row["state"] == "UNAVAILABLE"
    assert (
        'Resource count for "R" is limited to 1 which will prevent scheduling of one or more '
        "model instances, the minimum required count is 3" in row["reason"]
    )
