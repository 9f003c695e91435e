"""An ensemble's wiring as the broker and a lane client both read it (wire.ensemble_wiring):
who reads and writes each tensor, when a step may start, the wiring's round trip through an
``open_lane`` answer, the batch dimension between steps, and a run's errors."""

from __future__ import annotations

import orjson

from inferpool.wire.contract import spec_of
from inferpool.wire.ensemble_wiring import (
    Step,
    Wiring,
    batch_reshape,
    ensemble_deadlock,
    step_failed,
)
from inferpool.wire.errors import Code, InferpoolError

FORK = Wiring(
    "fork",
    (
        Step(0, "pre", -1, {"X": "IN"}, {"Y": "a"}),
        Step(1, "pre", 2, {"X": "IN"}, {"Y": "b"}),
        Step(2, "join", -1, {"A": "a", "B": "b", "C": "a"}, {"Y": "OUT", "Z": "SIDE"}),
    ),
    ("IN",),
    ("OUT", "SIDE"),
)


def test_readers_and_writers_of_each_tensor() -> None:
    assert FORK.readers == {"IN": (0, 1), "a": (2,), "b": (2,)}
    assert FORK.writer == {"a": 0, "b": 1, "OUT": 2, "SIDE": 2}
    assert FORK.steps[2].reads == ("a", "b")  # each tensor once, in the map's order
    assert FORK.models() == ["join", "pre"]
    assert FORK.last_writer() == 2


def test_a_step_is_ready_once_every_tensor_it_reads_exists() -> None:
    join = FORK.steps[2]
    assert not join.ready({"IN", "a"}.__contains__)
    assert join.ready({"IN", "a", "b"}.__contains__)
    asked: list[str] = []

    def exists(tensor: str) -> bool:
        asked.append(tensor)
        return True

    assert join.ready(exists)
    assert asked == ["a", "b"]  # a tensor two inputs read is asked for once


def test_the_wiring_crosses_an_open_lane_answer_unchanged() -> None:
    entries = orjson.loads(orjson.dumps(FORK.entries()))
    assert entries[1] == {
        "model_name": "pre",
        "model_version": 2,
        "input_map": {"X": "IN"},
        "output_map": {"Y": "b"},
    }
    assert Wiring.from_entries("fork", entries, ["IN"], ["OUT", "SIDE"]) == FORK


def test_the_batch_dimension_between_a_side_that_batches_and_one_that_does_not() -> None:
    spec = spec_of("X", "FP32", [4])
    assert batch_reshape(spec, True, False, (4,)) == (1, 4)  # into a batching model
    assert batch_reshape(spec, False, True, (1, 4)) == (4,)  # out of one
    assert batch_reshape(spec, False, True, (2, 4)) == (2, 4)  # more than one row: kept
    assert batch_reshape(spec, True, True, (3, 4)) == (3, 4)  # both batch
    assert batch_reshape(spec, False, False, (4,)) == (4,)
    assert batch_reshape(spec_of("X", "FP32", [1, 4]), False, True, (1, 4)) == (1, 4)


def test_a_runs_errors_in_tritons_words() -> None:
    err = step_failed("e", 1, "m", InferpoolError(Code.UNAVAILABLE, "gone"))
    assert (err.code, err.message) == (
        Code.UNAVAILABLE,
        "in ensemble 'e', step 1 (model 'm') failed: gone",
    )
    dead = ensemble_deadlock("e")
    assert dead.code is Code.INVALID_ARG
    assert dead.message == (
        "in ensemble 'e', unexpected deadlock, at least one output is not set while no more "
        "ensemble steps can be made"
    )
