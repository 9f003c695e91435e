"""The sequence batcher's decisions: affinity, per-sequence FIFO batches, loss, idle release."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from inferpool.broker.models.registry import ModelVersion
from inferpool.broker.models.request import FLAG_SEQUENCE_END, FLAG_SEQUENCE_START, PendingRequest
from inferpool.broker.models.scheduler import Scheduler
from inferpool.broker.models.sequencer import SequenceScheduler, scheduler_for
from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.worker.messages import Work

START, END = FLAG_SEQUENCE_START, FLAG_SEQUENCE_END
MS = 1_000_000


@dataclass(eq=False)
class Instance:
    slot: int
    name: str


class Recorder:
    """The manager's side: what was dispatched where, and which requests were rejected."""

    def __init__(self, max_batch_size: int = 4, idle_us: int = 0) -> None:
        config = text_format.Parse(
            f"""name: "seq" backend: "identity" max_batch_size: {max_batch_size}
            sequence_batching {{ max_sequence_idle_microseconds: {idle_us} }}""",
            pb.ModelConfig(),
        )
        self.model = ModelVersion("seq", 1, config, "/nowhere")
        self.dispatched: list[tuple[Instance, list[Any]]] = []
        self.releases: list[Sequence[Any]] = []
        self.rejected: list[tuple[Any, InferpoolError]] = []
        self.scheduler = scheduler_for(self.model, self.dispatch, self.reject)
        self.rid = 0

    def dispatch(
        self, worker: Instance, batch: list[PendingRequest], release: Sequence[Any] = ()
    ) -> None:
        self.dispatched.append((worker, batch))
        self.releases.append(release)

    def reject(self, req: PendingRequest, err: InferpoolError) -> None:
        self.rejected.append((req.work.correlation_id, err))

    def submit(self, corr: Any, flags: int = 0, now: int = 0, batch: int = 1) -> PendingRequest:
        self.rid += 1
        work = Work(self.rid, "", corr, flags, {}, [], [])
        req = PendingRequest(self.rid, [], "", self.model, work, [], {}, batch, now)
        self.scheduler.enqueue(req, now)
        return req

    def batches(self) -> list[tuple[str, list[Any]]]:
        """(instance, [correlation ids]) of each dispatch so far, then forgotten."""
        out = [(w.name, [r.work.correlation_id for r in b]) for w, b in self.dispatched]
        self.dispatched.clear()
        return out


def test_only_sequence_models_get_the_sequence_batcher() -> None:
    assert isinstance(Recorder().scheduler, SequenceScheduler)
    config = text_format.Parse('name: "m" backend: "identity"', pb.ModelConfig())
    plain = scheduler_for(ModelVersion("m", 1, config, "/"), print, print)
    assert type(plain) is Scheduler


def test_a_sequence_stays_on_the_instance_that_started_it() -> None:
    r = Recorder()
    a, b = Instance(0, "a"), Instance(1, "b")
    for w in (b, a):
        r.scheduler.instance_idle(w, 0)
    r.submit(1, START)  # least loaded, lowest slot: a
    r.submit(2, START)  # b
    r.submit(3, START)  # a and b have one each: a
    assert r.batches() == [("a", [1]), ("b", [2])]
    r.scheduler.instance_idle(a, 0)
    assert r.batches() == [("a", [3])]
    r.scheduler.instance_idle(b, 0)
    r.submit(2)
    r.submit(2, END)
    r.scheduler.instance_idle(a, 0)
    assert r.batches() == [("b", [2])]  # b's queue: one request of a sequence per batch
    r.scheduler.instance_idle(b, 0)
    assert r.batches() == [("b", [2])]
    r.submit(2)  # ended: the next request must start it again
    [(corr, err)] = r.rejected
    assert corr == 2 and err.code is Code.INVALID_ARG
    assert "sequence 2 to model 'seq' must specify the START flag" in err.message


def test_a_batch_takes_the_oldest_request_of_each_sequence() -> None:
    r = Recorder(max_batch_size=3)
    w = Instance(0, "w")
    r.scheduler.instance_idle(w, 0)
    r.submit(1, START)  # dispatched at once; the rest queue behind it
    for corr, flags in [(1, 0), (2, START), (1, 0), (3, START), (4, START), (2, END)]:
        r.submit(corr, flags)
    order = []
    while True:
        r.scheduler.instance_idle(w, 0)
        batches = r.batches()
        if not batches:
            break
        order += [corrs for _, corrs in batches]
    assert order == [[1], [1, 2, 3], [1, 4, 2]]


def test_an_instance_that_stops_loses_its_sequences() -> None:
    r = Recorder()
    a, b = Instance(0, "a"), Instance(1, "b")
    r.scheduler.instance_idle(a, 0)
    r.scheduler.instance_idle(b, 0)
    r.submit(1, START)
    r.submit(1)  # queued behind the first on a
    r.scheduler.instance_gone(a)
    [(corr, err)] = r.rejected
    assert corr == 1 and err.code is Code.UNAVAILABLE
    assert err.message == (
        "sequence 1 of model 'seq' was lost: instance 'a' of model 'seq' version 1 stopped; "
        "start it again with sequence_start"
    )
    r.submit(1, END)  # still lost; the end forgets it
    r.submit(1)
    assert [e.code for _, e in r.rejected] == [Code.UNAVAILABLE] * 2 + [Code.INVALID_ARG]
    r.batches()
    r.submit(1, START)  # starts again on an instance that serves
    assert r.batches() == [("b", [1])]


def test_starting_needs_a_serving_instance_a_correlation_id_and_batch_size_1() -> None:
    r = Recorder()
    r.submit(1, START)
    r.scheduler.instance_idle(Instance(0, "a"), 0)
    r.submit(0)
    r.submit(2, START, batch=2)
    messages = [e.message for _, e in r.rejected]
    assert messages == [
        "no instance of model 'seq' version 1 is serving: cannot start a sequence",
        "inference request to model 'seq' must specify a non-zero or non-empty correlation ID",
        "inference request to model 'seq' must specify batch-size 1 due to requirements of "
        "sequence batcher",
    ]


@pytest.mark.parametrize("idle_us", [0, 5000])
def test_an_idle_sequence_is_released_and_its_instance_told(idle_us: int) -> None:
    r = Recorder(idle_us=idle_us)
    limit = (idle_us or 1_000_000) * 1000
    w = Instance(0, "w")
    r.scheduler.instance_idle(w, 0)
    r.submit("x", START, now=0)
    r.submit("y", START, now=0)  # queued: pending requests never idle out
    r.scheduler.expire(limit + 1)  # x was idle too long; y waits for its instance
    r.scheduler.instance_idle(w, limit + 1)  # y runs now, and its clock restarts
    r.scheduler.expire(limit + 2)
    r.scheduler.instance_idle(w, limit + 2)
    r.submit("y", 0, now=limit + 2)  # y is still known
    assert len(r.dispatched) == 3
    assert r.releases == [(), ["x"], ()]  # the worker drops x's state before the second batch
    r.submit("x", 0, now=limit + 3)
    [(corr, err)] = r.rejected
    assert corr == "x" and "must specify the START flag" in err.message
