"""The dynamic batcher forms batches of the preferred sizes as Triton's does: never past the
largest one, a preferred size at once, anything else only once the queue delay has passed."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from inferpool.broker.models.registry import ModelVersion
from inferpool.broker.models.request import PendingRequest
from inferpool.broker.models.scheduler import Scheduler
from inferpool.wire.worker.protocol import Work

DELAY_NS = 1_000_000


def batches(preferred: str, rows: list[int], idle_at: int) -> list[list[int]]:
    """The batches (their requests' rows) an instance gets when it becomes idle at
    ``idle_at`` ns, then again at once after each batch, with ``rows`` queued at 0 ns."""
    config = text_format.Parse(
        f'name: "m" backend: "identity" max_batch_size: 32 dynamic_batching {{ '
        f"{preferred} max_queue_delay_microseconds: {DELAY_NS // 1000} }}",
        pb.ModelConfig(),
    )
    model = ModelVersion("m", 1, config, "/nowhere")
    got: list[list[PendingRequest]] = []
    scheduler = Scheduler(
        model, lambda worker, batch, release=(), nulls=(): got.append(batch), print
    )
    for rid, n in enumerate(rows):
        work = Work(rid, "", 0, 0, {}, [], [])
        scheduler.enqueue(PendingRequest(rid, [], "", model, work, [], {}, n, 0), 0)
    worker: Any = type("Worker", (), {"slot": 0, "name": "m_0"})()
    for _ in range(len(rows)):
        done = len(got)
        scheduler.instance_idle(worker, idle_at)
        if len(got) == done:  # nothing went: the worker waits in the idle list
            scheduler.idle.clear()
            break
    return [[r.batch_size for r in batch] for batch in got]


def test_batches_never_pass_the_largest_preferred_size() -> None:
    """32 queued, preferred 8: four batches of 8 (not one of 32, max_batch_size)."""
    assert batches("preferred_batch_size: [ 8 ]", [1] * 32, 0) == [[1] * 8] * 4


def test_a_preferred_size_goes_at_once_the_largest_met() -> None:
    """6 queued, preferred 4 and 8: the 4 go before the delay, the other 2 wait for it."""
    assert batches("preferred_batch_size: [ 4, 8 ]", [1] * 6, 0) == [[1] * 4]


def test_past_the_delay_what_is_queued_goes_as_it_is() -> None:
    assert batches("preferred_batch_size: [ 4, 8 ]", [1] * 6, DELAY_NS) == [[1] * 6]


@pytest.mark.parametrize(
    ("preferred", "expected"), [("", [[3, 5]]), ("preferred_batch_size: [ 8 ]", [[3, 5]])]
)
def test_requests_of_several_rows_count_their_rows(
    preferred: str, expected: list[list[int]]
) -> None:
    """Rows, not requests, make a batch's size: 3 + 5 rows reach preferred 8 at once; without
    preferred sizes they wait for max_batch_size or the delay."""
    assert batches(preferred, [3, 5], DELAY_NS if not preferred else 0) == expected


def test_a_request_past_the_largest_preferred_size_runs_alone() -> None:
    """A request of 12 rows with preferred 8 (max_batch_size 32) runs, on its own."""
    assert batches("preferred_batch_size: [ 8 ]", [12, 1], 0) == [[12]]


def test_without_preferred_sizes_the_batch_fills_to_max_batch_size() -> None:
    assert batches("", [1] * 40, 0) == [[1] * 32]
