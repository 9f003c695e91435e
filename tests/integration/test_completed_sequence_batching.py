"""A config completed into sequence batching keeps its sequence batcher.

The model's config.pbtxt has no ``sequence_batching``: ``auto_complete_config`` adds it (and
the inputs and outputs).  The broker must then schedule the model as Triton's sequence
batcher does, as it does for a config.pbtxt that says so: every request of a sequence on the
instance that started it (which keeps the sequence's running total), and Triton's checks on
the control parameters.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from inferpool.client import Client, Code, InferpoolError
from tests.support import Server, serving, write_model

COUNTER = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "VALUE", "data_type": "TYPE_INT32", "dims": [1]})
        config.add_output({"name": "STATE", "data_type": "TYPE_STRING", "dims": [1]})
        config.as_dict()["sequence_batching"] = {"max_sequence_idle_microseconds": 60000000}
        return config

    def initialize(self, args):
        self.instance = args["model_instance_name"]
        self.totals = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            corr = request.correlation_id()
            value = int(pb_utils.get_input_tensor_by_name(request, "VALUE").as_numpy()[0])
            total = self.totals[corr] = self.totals.get(corr, 0) + value
            state = json.dumps({"instance": self.instance, "total": total}).encode()
            out = pb_utils.Tensor("STATE", np.array([state], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""


def repo(tmp: Path) -> Path:
    config = """
        name: "counter"
        backend: "python"
        instance_group [ { count: 2 kind: KIND_CPU } ]
    """
    write_model(tmp / "repo", "counter", config, files={"1/model.py": COUNTER})
    return tmp / "repo"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from serving(repo)


def step(c: Client, corr: str, value: int, **flags: bool) -> dict[str, object]:
    parameters = {"sequence_id": corr, **{f"sequence_{k}": v for k, v in flags.items()}}
    out = c.infer("counter", {"VALUE": np.array([value], np.int32)}, parameters=parameters)
    return dict(json.loads(out["STATE"][0]))


def test_the_completed_config_is_served_with_sequence_batching(server: Server) -> None:
    with server.client() as c:
        config = c.model_config("counter")
    assert config["sequence_batching"]["max_sequence_idle_microseconds"] == 60000000
    assert [i["name"] for i in config["input"]] == ["VALUE"]


def test_each_sequence_stays_on_its_instance_and_keeps_its_state(server: Server) -> None:
    with server.client() as c:
        seen: dict[str, set[object]] = {"a": set(), "b": set()}
        totals = {"a": 0, "b": 0}
        order = ["a", "b", "a", "b", "a", "a", "b", "b"]  # interleaved, each ends last
        for value, corr in enumerate(order, start=1):
            start, end = totals[corr] == 0, corr not in order[value:]
            state = step(c, corr, value, start=start, end=end)
            totals[corr] += value
            assert state["total"] == totals[corr], (corr, state)
            seen[corr].add(state["instance"])
    assert all(len(instances) == 1 for instances in seen.values()), seen
    assert seen["a"] != seen["b"]  # two sequences at once: one on each instance


def test_the_sequence_batchers_checks_apply(server: Server) -> None:
    with server.client() as c, pytest.raises(InferpoolError) as info:
        step(c, "never-started", 1)
    assert info.value.code is Code.INVALID_ARG
    assert "must specify the START flag on the first request of the sequence" in str(info.value)
