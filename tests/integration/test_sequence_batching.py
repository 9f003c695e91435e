"""The sequence batcher, served for real and watched from python models that record what they
got: control inputs of every kind and encoding, initial state from a data file, the state
carried from one request to the next, sequence slots with a backlog, direct batches with null
requests, and oldest batches across sequences."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferpool.client import Client
from tests.integration.recording import Served, model_py, seen, served, wait_seen
from tests.support import write_model

# Y = ACC_OUT = ACC_IN + X; X = -1 holds the request while <model>/hold exists
COUNTER = model_py("""
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.record = Recorder(args)
        self.hold = os.path.join(args["model_repository"], "hold")

    def execute(self, requests):
        responses = []
        for position, request in enumerate(requests):
            get = lambda name: pb_utils.get_input_tensor_by_name(request, name).as_numpy()
            x, acc = get("X"), get("ACC_IN")
            controls = {name: get(name) for name in ("START", "END", "READY", "CORRID")}
            self.record(
                tag=tag(request),
                position=position,
                batch=len(requests),
                acc=acc.tolist(),
                dtypes={name: str(value.dtype) for name, value in controls.items()},
                **{name.lower(): value.tolist() for name, value in controls.items()},
            )
            deadline = time.monotonic() + 20
            while x[0][0] == -1 and os.path.exists(self.hold) and time.monotonic() < deadline:
                time.sleep(0.005)
            total = (acc + x).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", total), pb_utils.Tensor("ACC_OUT", total),
            ]))
        return responses
""")

CONTROLS = """
    control_input [
      { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
      { name: "END" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] } ] },
      { name: "READY"
        control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
      { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
    ]
    state [ { input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_FP32 dims: [ 1 ]
              initial_state: { name: "hundred" data_type: TYPE_FP32 dims: [ 1 ]
                               data_file: "hundred.bin" } } ]
"""
IO = """
    backend: "python"
    max_batch_size: 2
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
    instance_group [ { count: 1 kind: KIND_CPU } ]
"""
STRATEGIES = {
    "direct": "",
    "oldest": "oldest { max_candidate_sequences: 3 preferred_batch_size: [ 2 ] }",
}


def write_repository(repo: Path) -> None:
    for name, strategy in STRATEGIES.items():
        config = f'name: "{name}"\n{IO}\nsequence_batching {{ {strategy}\n{CONTROLS} }}'
        model = write_model(repo, name, config, files={"1/model.py": COUNTER})
        (model / "initial_state").mkdir()
        hundred = np.array([100.0], np.float32).tobytes()
        (model / "initial_state" / "hundred.bin").write_bytes(hundred)


@pytest.fixture(scope="module")
def live() -> Iterator[Served]:
    with served("ipsq-", write_repository) as got:
        yield got


def send(c: Client, model: str, tag: str, corr: int, x: float, **flags: bool) -> str:
    return c._send(
        {
            "type": "infer",
            "model_name": model,
            "inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1]}],
            "parameters": {"tag": tag, "sequence_id": corr, **flags},
        },
        [np.array([[x]], np.float32).data],
    )


def y_of(c: Client, request_id: str) -> float:
    header, frames = c._recv(request_id, 20)
    assert "error" not in header, header
    return float(np.frombuffer(frames[0], np.float32)[0])


def start_held(c: Client, model_dir: Path, tag: str, corr: int) -> tuple[str, Path]:
    """Start sequence ``corr`` with a request the model holds (running) until the returned
    file is removed; its id and that file."""
    hold = model_dir / "hold"
    hold.touch()
    request_id = send(c, model_dir.name, tag, corr, -1, sequence_start=True)
    wait_seen(model_dir, {"tag": tag})
    return request_id, hold


def record(model_dir: Path, tag: str) -> dict[str, Any]:
    [event] = [e for e in seen(model_dir) if e["tag"] == tag]
    return event


def test_controls_and_state_reach_a_python_model(live: Served) -> None:
    with live.server.client() as c:
        ys = [
            y_of(c, send(c, "direct", "s1", 7, 1, sequence_start=True)),
            y_of(c, send(c, "direct", "s2", 7, 2)),
            y_of(c, send(c, "direct", "s3", 7, 3, sequence_end=True)),
        ]
    assert ys == [101.0, 103.0, 106.0]  # from the initial state file's 100
    first, middle, last = (record(live.repo / "direct", t) for t in ("s1", "s2", "s3"))
    assert first["dtypes"] == {
        "START": "int32",
        "END": "float32",
        "READY": "bool",
        "CORRID": "uint64",
    }
    assert [first["start"], first["end"], first["ready"], first["corrid"]] == [
        [[1]],
        [[0.0]],
        [[True]],
        [[7]],
    ]
    assert [middle["start"], middle["end"], middle["acc"]] == [[[0]], [[0.0]], [[101.0]]]
    assert [last["start"], last["end"], last["acc"]] == [[[0]], [[1.0]], [[103.0]]]


def test_slots_backlog_and_null_requests(live: Served) -> None:
    model_dir = live.repo / "direct"
    with live.server.client() as c:
        a1, hold = start_held(c, model_dir, "a1", 11)  # slot 0
        b1 = send(c, "direct", "b1", 12, 1, sequence_start=True)  # slot 1
        c1 = send(c, "direct", "c1", 13, 1, sequence_start=True)  # no slot left: backlog
        c2 = send(c, "direct", "c2", 13, 1)
        a2 = send(c, "direct", "a2", 11, 1, sequence_end=True)
        assert c.is_live()  # answered in order: the requests before it are queued
        hold.unlink()
        assert [y_of(c, r) for r in (a1, b1, a2, c1, c2)] == [99, 101, 100, 101, 102]
        b2 = send(c, "direct", "b2", 12, 1)  # slot 1 while slot 0 (13's) has nothing
        assert y_of(c, b2) == 102
    events = seen(model_dir)
    order = [e["tag"] for e in events]
    assert order.index("c1") > order.index("a2")  # 13 got a slot when 11 ended
    assert record(model_dir, "c1")["acc"] == [[100.0]]  # and started from the initial state
    b2_event = record(model_dir, "b2")
    assert (b2_event["position"], b2_event["batch"]) == (1, 2)  # its slot is its position
    [null] = [e for e in events[order.index("b2") - 1 :] if e["position"] == 0]
    assert null["ready"] == [[False]] and null["corrid"] == [[0]] and null["start"] == [[0]]
    with live.server.client() as c:
        for corr in (12, 13):  # end them: the module's other tests start afresh
            y_of(c, send(c, "direct", f"end-{corr}", corr, 0, sequence_end=True))


def test_oldest_batches_across_candidate_sequences(live: Served) -> None:
    model_dir = live.repo / "oldest"
    with live.server.client() as c:
        a1, hold = start_held(c, model_dir, "o-a1", 21)
        queued = [
            send(c, "oldest", "o-b1", 22, 1, sequence_start=True),
            send(c, "oldest", "o-c1", 23, 1, sequence_start=True),
            send(c, "oldest", "o-d1", 24, 1, sequence_start=True),  # 3 candidates: backlog
            send(c, "oldest", "o-a2", 21, 1, sequence_end=True),
        ]
        assert c.is_live()  # answered in order: the requests before it are queued
        hold.unlink()
        assert y_of(c, a1) == 99
        assert [y_of(c, r) for r in queued] == [101, 101, 101, 100]
    b1, c1 = (record(model_dir, f"o-{t}") for t in ("b1", "c1"))
    assert b1["batch"] == c1["batch"] == 2  # the two oldest, together
    order = [e["tag"] for e in seen(model_dir)]
    assert order.index("o-d1") > order.index("o-a2")  # 24 waited for 21 to end


def test_cancelling_a_request_of_a_sequence_ends_the_sequence(live: Served) -> None:
    model_dir = live.repo / "direct"
    with live.server.client() as c:
        first, hold = start_held(c, model_dir, "k1", 31)
        second, third = send(c, "direct", "k2", 31, 1), send(c, "direct", "k3", 31, 1)
        assert c.call("cancel", request_id=third)["cancelled"] == 1
        for request_id in (second, third):  # every queued request of the sequence
            assert c._recv(request_id, 10)[0]["error"]["code"] == "CANCELLED"
        hold.unlink()
        assert y_of(c, first) == 99  # the running one finishes
        header, _ = c._recv(send(c, "direct", "k4", 31, 1), 10)
        assert "must specify the START flag" in header["error"]["message"]
    assert not [e for e in seen(model_dir) if e["tag"] in ("k2", "k3")]
