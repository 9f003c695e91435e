"""Stateful TorchScript models through the broker's sequence batcher.

Requests carry ``parameters: {sequence_id, sequence_start, sequence_end}``; the broker pins
each sequence to one of the two instances, the backend builds the control tensors from the
flags and the correlation id, and the instance's worker carries the implicit state from one
request of a sequence to the next.  The model's idle timeout is Triton's default (1 s).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from inferpool.client import Client, InferpoolError
from tests.backends.pytorch import torch_models as tm
from tests.integration.pytorch_support import (
    ONE_THREAD,
    cpu_instances,
    model_dir,
    result,
    send,
    serving,
)
from tests.support import Server, wait_until

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


def build_repository(repo: Path) -> None:
    config = tm.accumulate_config(4, name="accumulate")
    model_dir(repo, "accumulate", f"{config}\n{cpu_instances(2)}\n{ONE_THREAD}", tm.Accumulate())


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with serving(build_repository) as srv:
        yield srv


def step(c: Client, corr: object, value: float, *, start: bool = False, end: bool = False) -> str:
    params = {"sequence_id": corr, "sequence_start": start, "sequence_end": end}
    return send(c, "accumulate", {"INPUT__0": np.array([[value]], np.float32)}, **params)


def total(c: Client, rid: str) -> float:
    return float(result(c, rid)["OUTPUT__0"][0, 0])


def test_sequences_keep_their_state_on_their_instance(server: Server) -> None:
    """Eight sequences at once, each pipelining all its requests: per-sequence FIFO, state
    carried by the instance that started it, controls from the request's parameters."""
    values = [1.0, 2.0, 3.0, 4.0]
    clients = [server.client() for _ in range(8)]
    try:
        ids = [
            [
                step(c, 100 + s, v * (s + 1), start=i == 0, end=i == len(values) - 1)
                for i, v in enumerate(values)
            ]
            for s, c in enumerate(clients)
        ]
        for s, (c, rids) in enumerate(zip(clients, ids, strict=True)):
            expected = 0.0
            for i, rid in enumerate(rids):
                out = result(c, rid)
                expected += values[i] * (s + 1)
                assert out["OUTPUT__0"].tolist() == [[expected]]
                assert list(out) == ["OUTPUT__0", "CONTROLS__1"]  # state stays in the server
                start, end = float(i == 0), float(i == len(values) - 1)
                assert out["CONTROLS__1"].tolist() == [[start, end, 1.0, 100 + s]]
    finally:
        for c in clients:
            c.close()


def test_a_restarted_sequence_starts_from_zero(server: Server) -> None:
    with server.client() as c:
        assert total(c, step(c, "7", 5.0, start=True)) == 5.0
        assert total(c, step(c, "7", 1.0)) == 6.0
        assert total(c, step(c, "7", 2.0, start=True)) == 2.0
        assert total(c, step(c, "7", 1.0, end=True)) == 3.0


@pytest.mark.parametrize(
    ("inputs", "parameters", "message"),
    [
        ({}, {}, "inference request to model 'accumulate' must specify a non-zero or non-empty "
         "correlation ID"),
        ({}, {"sequence_id": 555}, "inference request for sequence 555 to model 'accumulate' "
         "must specify the START flag on the first request of the sequence"),
        ({"INPUT__0": np.ones((2, 1), np.float32)}, {"sequence_id": 5, "sequence_start": True},
         "inference request to model 'accumulate' must specify batch-size 1 due to requirements "
         "of sequence batcher"),
        ({"STATE_IN__5": np.ones((1, 1), np.float32)}, {"sequence_id": 5, "sequence_start": True},
         "unexpected inference input 'STATE_IN__5' for model 'accumulate'"),
        ({}, {"sequence_id": "abc", "sequence_start": True},
         "model 'accumulate': correlation id 'abc' of request '1' is not an integer, but "
         "CONTROL_SEQUENCE_CORRID is TYPE_INT64"),
    ],
)  # fmt: skip
def test_sequence_errors(server: Server, inputs, parameters, message) -> None:
    with server.client() as c:
        with pytest.raises(InferpoolError) as err:
            c.infer(
                "accumulate",
                {"INPUT__0": np.ones((1, 1), np.float32), **inputs},
                parameters=parameters,
            )
        assert err.value.code.value == "INVALID_ARG"
        assert message in err.value.message
        # the server goes on serving sequences
        assert total(c, step(c, 42, 1.0, start=True, end=True)) == 1.0


def test_an_idle_sequence_is_released(server: Server) -> None:
    with server.client() as c:
        assert total(c, step(c, 8, 1.0, start=True)) == 1.0
        wait_until(  # max_sequence_idle_microseconds defaults to 1 s
            lambda: "sequence 8 of model 'accumulate' was idle longer than" in server.log(),
            "the idle sequence released",
        )
        with pytest.raises(InferpoolError, match="must specify the START flag") as err:
            c.infer(
                "accumulate",
                {"INPUT__0": np.ones((1, 1), np.float32)},
                parameters={"sequence_id": 8},
            )
        assert err.value.code.value == "INVALID_ARG"
        assert total(c, step(c, 8, 2.0, start=True, end=True)) == 2.0


def test_a_sequence_whose_instance_died_is_unavailable_others_go_on(server: Server) -> None:
    """Runs last: it kills a worker.  New sequences go to the least loaded instance, lowest
    slot first, so on an idle server A lands on accumulate_0_0 and B on accumulate_0_1."""
    with server.client() as c:
        assert total(c, step(c, 1001, 1.0, start=True)) == 1.0
        assert total(c, step(c, 1002, 10.0, start=True)) == 10.0

        def pid() -> int | None:
            [row] = [r for r in c.status() if r["instance"] == "accumulate_0_0"]
            return row["pid"]

        victim = pid()
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: pid() != victim, "the broker noticed the dead worker")
        with pytest.raises(InferpoolError) as err:
            c.infer(
                "accumulate",
                {"INPUT__0": np.ones((1, 1), np.float32)},
                parameters={"sequence_id": 1001},
            )
        assert err.value.code.value == "UNAVAILABLE"
        assert err.value.message.startswith(
            "sequence 1001 of model 'accumulate' was lost: instance 'accumulate_0_0' of model "
            "'accumulate' version 1 stopped"
        )
        assert total(c, step(c, 1002, 5.0, end=True)) == 15.0  # B's instance kept its state
        assert total(c, step(c, 1001, 3.0, start=True, end=True)) == 3.0  # A starts again
