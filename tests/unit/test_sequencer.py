"""The sequence batcher's decisions: slots, backlog, direct and oldest batches, loss, idle
release, cancellation."""

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
from inferpool.wire.worker.protocol import Work

START, END = FLAG_SEQUENCE_START, FLAG_SEQUENCE_END
MS = 1_000_000


@dataclass(eq=False)
class Instance:
    slot: int
    name: str


class Recorder:
    """The request path's side: what was dispatched where, and which requests were rejected."""

    def __init__(self, max_batch_size: int = 4, idle_us: int = 0, strategy: str = "") -> None:
        config = text_format.Parse(
            f"""name: "seq" backend: "identity" max_batch_size: {max_batch_size}
            sequence_batching {{ max_sequence_idle_microseconds: {idle_us} {strategy} }}""",
            pb.ModelConfig(),
        )
        self.model = ModelVersion("seq", 1, config, "/nowhere")
        self.dispatched: list[tuple[Instance, list[Any], Sequence[int]]] = []
        self.releases: list[Sequence[Any]] = []
        self.rejected: list[tuple[Any, InferpoolError]] = []
        self.scheduler = scheduler_for(self.model, self.dispatch, self.reject)
        assert isinstance(self.scheduler, SequenceScheduler)
        self.seq = self.scheduler
        self.rid = 0

    def dispatch(
        self,
        worker: Instance,
        batch: list[PendingRequest],
        release: Sequence[Any] = (),
        nulls: Sequence[int] = (),
    ) -> None:
        self.dispatched.append((worker, batch, nulls))
        self.releases.append(release)

    def reject(self, req: PendingRequest, err: InferpoolError) -> None:
        self.rejected.append((req.work.correlation_id, err))

    def submit(
        self, corr: Any, flags: int = 0, now: int = 0, batch: int = 1, timeout_us: int = 0
    ) -> PendingRequest:
        self.rid += 1
        work = Work(self.rid, "", corr, flags, {}, [], [], 0, timeout_us)
        req = PendingRequest(self.rid, [], "", self.model, work, [], {}, batch, now)
        self.scheduler.enqueue(req, now)
        return req

    def batches(self) -> list[tuple[str, list[Any]]]:
        """(instance, [correlation ids, None for a null request]) of each dispatch so far."""
        out = []
        for worker, batch, nulls in self.dispatched:
            corrs: list[Any] = [r.work.correlation_id for r in batch]
            for position in nulls:
                corrs.insert(position, None)
            out.append((worker.name, corrs))
        self.dispatched.clear()
        return out


def test_only_sequence_models_get_the_sequence_batcher() -> None:
    assert isinstance(Recorder().scheduler, SequenceScheduler)
    config = text_format.Parse('name: "m" backend: "identity"', pb.ModelConfig())
    plain = scheduler_for(ModelVersion("m", 1, config, "/"), print, print)
    assert type(plain) is Scheduler


def test_sequences_take_the_lowest_free_slot_then_the_backlog() -> None:
    r = Recorder(max_batch_size=2)  # two slots per instance
    a, b = Instance(0, "a"), Instance(1, "b")
    for corr in (1, 2, 3, 4, 5):
        r.submit(corr, START)
    assert [e.code for _, e in r.rejected] == [Code.UNAVAILABLE] * 5  # nothing serves yet
    r.rejected.clear()
    r.seq.instance_idle(a, 0)
    r.seq.instance_idle(b, 0)
    r.batches()
    for corr in (1, 2, 3, 4, 5):
        r.submit(corr, START)
    assert r.seq.instances[a].sequences == [1, 3] and r.seq.instances[b].sequences == [2, 4]
    assert [b.corr for b in r.seq.backlog] == [5]
    r.submit(5, 0)  # joins its backlogged sequence
    r.submit(1, END)
    assert r.batches() == [("a", [1]), ("b", [2])]  # each dispatched at once, idle then
    r.seq.instance_idle(a, 0)
    assert r.batches() == [("a", [1, 3])]  # slot order: a direct batch
    r.seq.instance_idle(a, 0)  # 1's END ran: its slot went to 5, with both its requests
    assert r.batches() == [("a", [5])]
    assert r.seq.instances[a].sequences == [5, 3] and not r.seq.backlog
    r.seq.instance_idle(a, 0)
    assert r.batches() == [("a", [5])]


def test_direct_batches_keep_each_sequence_in_its_slot_with_null_requests() -> None:
    r = Recorder(max_batch_size=3)
    w = Instance(0, "w")
    r.seq.instance_idle(w, 0)
    r.submit(1, START)
    for corr in (2, 3):
        r.submit(corr, START)
    r.submit(3, 0)
    r.submit(1, END)
    r.seq.instance_idle(w, 0)
    r.seq.instance_idle(w, 0)
    r.seq.instance_idle(w, 0)
    assert r.batches() == [("w", [1]), ("w", [1, 2, 3]), ("w", [None, None, 3])]


def test_direct_waits_for_slot_utilization_or_the_delay() -> None:
    strategy = "direct { max_queue_delay_microseconds: 5000 minimum_slot_utilization: 0.5 }"
    r = Recorder(max_batch_size=4, strategy=strategy)
    w = Instance(0, "w")
    r.seq.instance_idle(w, 0)
    r.seq.idle.clear()  # busy: let requests gather
    r.submit(1, START, now=0)
    assert r.seq.instance_idle(w, 1 * MS) == 5 * MS  # 1 of 4 slots: wait for the delay
    r.submit(2, START, now=2 * MS)  # 2 of 4: enough
    assert r.batches() == [("w", [1, 2])]
    r.submit(1, 0, now=3 * MS)
    r.seq.instance_idle(w, 3 * MS)
    assert r.batches() == [] and r.seq.pump(8 * MS) is None
    assert r.batches() == [("w", [1])]  # the delay has passed


def test_oldest_batches_the_oldest_requests_of_its_candidate_sequences() -> None:
    strategy = (
        "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] "
        "max_queue_delay_microseconds: 5000 }"
    )
    r = Recorder(max_batch_size=2, strategy=strategy)
    w = Instance(0, "w")
    r.seq.instance_idle(w, 0)
    r.seq.idle.clear()
    for corr, now in ((3, 1), (1, 2), (2, 3), (4, 4)):
        r.submit(corr, START, now=now * MS)
    r.submit(5, START, now=5 * MS)  # 4 candidates already: the backlog
    r.submit(3, END, now=6 * MS)
    assert r.seq.instance_idle(w, 7 * MS) is None
    assert r.batches() == [("w", [3, 1])]  # oldest first, any slot, max_batch_size 2
    r.seq.instance_idle(w, 7 * MS)
    assert r.batches() == [("w", [2, 4])]
    assert r.seq.instance_idle(w, 7 * MS) == 11 * MS  # only 3's END: wait for a second one
    assert r.seq.pump(11 * MS) is None
    assert r.batches() == [("w", [3])]  # it ran: its slot went to 5
    r.seq.instance_idle(w, 11 * MS)
    assert r.batches() == [("w", [5])]  # waited long enough already
    r.submit(1, 0, now=12 * MS)
    assert r.seq.instance_idle(w, 12 * MS) == 17 * MS
    assert r.seq.pump(17 * MS) is None
    assert r.batches() == [("w", [1])]


def test_an_instance_that_stops_loses_its_sequences() -> None:
    r = Recorder()
    a, b = Instance(0, "a"), Instance(1, "b")
    r.seq.instance_idle(a, 0)
    r.seq.instance_idle(b, 0)
    r.submit(1, START)
    r.submit(1)  # queued behind the first on a
    r.seq.instance_gone(a)
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
    r.seq.instance_idle(Instance(0, "a"), 0)
    r.submit(0)
    r.submit(2, START, batch=2)
    r.submit(3)
    messages = [e.message for _, e in r.rejected]
    assert messages == [
        "no instance of model 'seq' version 1 is serving: cannot start a sequence",
        "inference request to model 'seq' must specify a non-zero or non-empty correlation ID",
        "inference request to model 'seq' must specify batch-size 1 due to requirements of "
        "sequence batcher",
        "inference request for sequence 3 to model 'seq' must specify the START flag on the "
        "first request of the sequence",
    ]


@pytest.mark.parametrize("idle_us", [0, 5000])
def test_an_idle_sequence_is_released_its_slot_freed_and_its_instance_told(idle_us: int) -> None:
    r = Recorder(max_batch_size=1, idle_us=idle_us)  # one slot
    limit = (idle_us or 1_000_000) * 1000
    w = Instance(0, "w")
    r.seq.instance_idle(w, 0)
    r.submit("x", START, now=0)
    r.submit("y", START, now=0)  # backlogged: waiting sequences never idle out
    r.seq.instance_idle(w, 1)
    r.seq.expire(limit + 1)  # x was idle too long: y takes its slot and runs
    r.seq.instance_idle(w, limit + 2)
    r.submit("y", 0, now=limit + 2)  # y is still known
    assert r.batches() == [("w", ["x"]), ("w", ["y"]), ("w", ["y"])]
    assert r.releases == [(), ["x"], ()]  # the worker drops x's state before the second batch
    r.submit("x", 0, now=limit + 3)
    [(corr, err)] = r.rejected
    assert corr == "x" and "must specify the START flag" in err.message


def test_a_backlogged_sequence_whose_timeout_passes_is_answered() -> None:
    r = Recorder(max_batch_size=1)
    w = Instance(0, "w")
    r.seq.instance_idle(w, 0)
    r.submit(1, START, now=0)
    r.submit(2, START, now=0, timeout_us=1000)
    r.submit(2, 0, now=0)
    r.seq.expire(2 * MS)
    assert [(c, e.code) for c, e in r.rejected] == [(2, Code.UNAVAILABLE)] * 2
    assert r.rejected[0][1].message == "timeout of the corresponding sequence has been expired"
    assert not r.seq.backlog and 2 not in r.seq.collecting


def test_cancelling_a_request_ends_its_sequence() -> None:
    r = Recorder(max_batch_size=1)
    w = Instance(0, "w")
    r.seq.instance_idle(w, 0)
    r.submit(1, START)  # runs
    second, third = r.submit(1), r.submit(1)
    r.submit(2, START)  # backlogged
    backlogged = r.submit(2)
    assert r.seq.cancel(third) == [second, third]  # every queued request of the sequence
    assert r.seq.instances[w].sequences == [2]  # the slot went to the backlog
    r.seq.instance_idle(w, 0)
    assert r.batches() == [("w", [1]), ("w", [2])]
    assert r.releases[-1] == [1]  # the worker drops 1's state first
    assert r.seq.cancel(backlogged) == [backlogged]
    r.submit(1)
    assert "must specify the START flag" in r.rejected[-1][1].message
