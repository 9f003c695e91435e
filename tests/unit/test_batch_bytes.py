"""The batchers close a batch before its requests outgrow one message to the worker: the
dynamic batcher and both sequence strategies (each sequence one request here)."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from inferpool.broker.models.registry import ModelVersion
from inferpool.broker.models.request import (
    FLAG_SEQUENCE_END,
    FLAG_SEQUENCE_START,
    PendingRequest,
)
from inferpool.broker.models.sequencer import scheduler_for
from inferpool.wire.worker.protocol import BATCH_BYTES, Work

CONFIGS = {
    "dynamic": "dynamic_batching { max_queue_delay_microseconds: 1000000 }",
    "direct": "sequence_batching { }",
    "oldest": "sequence_batching { oldest { max_candidate_sequences: 8 } }",
}


@pytest.mark.parametrize("kind", CONFIGS)
def test_batches_stay_within_a_message(kind: str) -> None:
    config = text_format.Parse(
        f'name: "m" backend: "identity" max_batch_size: 8 {CONFIGS[kind]}', pb.ModelConfig()
    )
    model = ModelVersion("m", 1, config, "/nowhere")
    batches: list[list[PendingRequest]] = []
    scheduler = scheduler_for(
        model, lambda worker, batch, release=(), nulls=(): batches.append(batch), print
    )
    worker: Any = type("Worker", (), {"slot": 0, "name": "m_0"})()
    scheduler.instance_idle(worker, 0)  # takes the first request alone, at once
    size = BATCH_BYTES // 3 + 1  # two fit in a message, three do not
    for rid in range(9):
        work = Work(rid, "", rid + 1, FLAG_SEQUENCE_START | FLAG_SEQUENCE_END, {}, [], [])
        req = PendingRequest(rid, [], "", model, work, [], {}, 1, 0, wire_bytes=size)
        scheduler.enqueue(req, 0)
    for now in (0, 0, 0, 2_000_000_000):  # the last batch waits out the queue delay
        scheduler.instance_idle(worker, now)
    assert sorted(len(b) for b in batches) == [1, 2, 2, 2, 2]
    assert all(sum(r.wire_bytes + 1 for r in b) - 1 <= BATCH_BYTES for b in batches)
