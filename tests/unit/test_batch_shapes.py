"""Triton's equal-shape rule: requests share a batch only where every input that is not ragged
has the same shape past the batch dimension, in the dynamic batcher and in both sequence
strategies; a request shaped otherwise ends the batch, which goes at once."""

from __future__ import annotations

from typing import Any

import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from inferpool.broker.models.batch_shapes import ANY
from inferpool.broker.models.internal import make_request
from inferpool.broker.models.registry import ModelVersion
from inferpool.broker.models.request import PendingRequest
from inferpool.broker.models.scheduler import Scheduler
from inferpool.broker.models.sequence_strategies import Direct, InstanceSlots, Oldest
from inferpool.wire.errors import InferpoolError
from inferpool.wire.worker.protocol import TensorRef

MS = 1_000_000
INPUTS = """
input [
  { name: "X" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "F" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "R" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }
]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def model(text: str) -> ModelVersion:
    config = text_format.Parse(f'name: "m" backend: "identity" {text}', pb.ModelConfig())
    return ModelVersion("m", 1, config, "/nowhere")


class Sink:
    def result(self, req: PendingRequest, item: Any) -> None: ...

    def failed(self, req: PendingRequest, err: InferpoolError) -> None: ...


def request(mv: ModelVersion, now_ns: int = 0, **shapes: tuple[int, ...]) -> PendingRequest:
    """A request the broker makes itself (models.internal), its inputs of ``shapes``."""
    refs = [
        TensorRef(name, "FP32", list(shape), "r", 0, 4 * int(np.prod(shape)))
        for name, shape in shapes.items()
    ]
    return make_request(
        mv,
        refs,
        [],
        Sink(),
        request_id="",
        correlation_id=0,
        flags=0,
        parameters={},
        now_ns=now_ns,
    )


def test_the_key_holds_the_variable_shapes_that_are_not_ragged() -> None:
    mv = model(f"max_batch_size: 8 {INPUTS}")
    key = request(mv, X=(1, 3), F=(1, 4), R=(1, 7)).shape_key
    # rows, the ragged input's shape and the inputs' order do not matter
    assert request(mv, R=(2, 9), F=(2, 4), X=(2, 3)).shape_key == key
    assert request(mv, X=(1, 5), F=(1, 4), R=(1, 7)).shape_key != key
    # nothing to compare: fixed dims only, or a model that does not batch
    fixed = model('max_batch_size: 8 input [ { name: "F" data_type: TYPE_FP32 dims: [ 4 ] } ]')
    assert request(fixed, F=(3, 4)).shape_key == ANY
    alone = model(INPUTS)
    assert request(alone, X=(3,), F=(4,), R=(7,)).shape_key == ANY


def test_with_optional_inputs_the_inputs_given_must_agree() -> None:
    mv = model(
        'max_batch_size: 8 input [ { name: "F" data_type: TYPE_FP32 dims: [ 4 ] },'
        ' { name: "O" data_type: TYPE_FP32 dims: [ 4 ] optional: true } ]'
    )
    both = request(mv, F=(1, 4), O=(1, 4)).shape_key
    assert request(mv, O=(2, 4), F=(2, 4)).shape_key == both
    assert request(mv, F=(1, 4)).shape_key != both


def dynamic_batches(shapes: list[int], now_ns: int) -> list[list[int]]:
    """The batches (their requests' X lengths) one instance gets at ``now_ns``, idle again
    after each, with requests of X ``shapes`` queued at 0 ns."""
    mv = model(
        f"max_batch_size: 8 {INPUTS} dynamic_batching {{ max_queue_delay_microseconds: 1000 }}"
    )
    got: list[list[PendingRequest]] = []
    scheduler = Scheduler(mv, lambda worker, batch, release=(), nulls=(): got.append(batch), print)
    scheduler.gathering = True  # all queued before any batch forms
    for i, n in enumerate(shapes):
        scheduler.enqueue(request(mv, X=(1, n), F=(1, 4), R=(1, i + 1)), 0)
    scheduler.gathering = False
    for _ in shapes:
        done = len(got)
        scheduler.instance_idle("worker", now_ns)
        if len(got) == done:
            break
    return [[r.work.inputs[0].shape[1] for r in batch] for batch in got]


def test_the_dynamic_batcher_ends_a_batch_at_a_request_shaped_otherwise() -> None:
    """Before the delay: [3, 3] goes at once (a 5 ends it), so does [5] (a 3 ends it); the
    last 3 waits for more.  Past the delay the last one goes too."""
    assert dynamic_batches([3, 3, 5, 3], 0) == [[3, 3], [5]]
    assert dynamic_batches([3, 3, 5, 3], MS) == [[3, 3], [5], [3]]
    # the ragged input differs in every request: one batch, once the delay has passed
    assert dynamic_batches([4, 4, 4], MS) == [[4, 4, 4]]


def sequence_model(strategy: str) -> ModelVersion:
    return model(f"max_batch_size: 4 {INPUTS} sequence_batching {{ {strategy} }}")


def queued(mv: ModelVersion, lengths: list[int | None]) -> InstanceSlots:
    """An instance's slots, slot i holding a request of X length ``lengths[i]`` (None:
    none), received i ns after 0."""
    slots = InstanceSlots("worker", len(lengths))
    for i, n in enumerate(lengths):
        if n is not None:
            slots.sequences[i] = i + 1
            slots.queues[i].append(request(mv, i, X=(1, n), F=(1, 4), R=(1, 1)))
    return slots


def test_the_oldest_strategy_ends_a_batch_at_a_request_shaped_otherwise() -> None:
    mv = sequence_model("oldest { max_queue_delay_microseconds: 1000 }")
    strategy = Oldest(mv.config)
    slots = queued(mv, [3, 5, 3])
    first = strategy.take(slots, 10)
    assert isinstance(first, tuple) and [slot for slot, _ in first[0]] == [0]  # at once
    second = strategy.take(slots, 10)
    assert isinstance(second, tuple) and [slot for slot, _ in second[0]] == [1]
    assert strategy.take(slots, 10) == 2 + MS  # the last waits for more, as usual


def test_the_direct_strategy_gives_a_slot_shaped_otherwise_a_null_request() -> None:
    mv = sequence_model("direct {}")
    strategy = Direct(mv.config)
    slots = queued(mv, [3, 5, 3])
    first = strategy.take(slots, 0)
    assert isinstance(first, tuple)
    assert [slot for slot, _ in first[0]] == [0, 2] and first[1] == [1]
    second = strategy.take(slots, 0)  # slot 1 keeps its position: slot 0 is a null request
    assert isinstance(second, tuple) and [slot for slot, _ in second[0]] == [1]
    assert second[1] == [0] and strategy.take(slots, 0) is None
