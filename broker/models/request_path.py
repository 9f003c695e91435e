"""The request path: an admitted request's way through its scheduler and worker to its answer.

A request is queued on its model's scheduler (``submit``), goes to an instance in a batch
(``dispatch``), and is answered from its worker's results (``done``) or with an error
(``reject``).  This is where the "every request gets an answer" rule is kept: a request
leaves ``inflight`` only through ``finish``, after its final response (result or error)
was sent.  Loading and retiring models is the lifecycle's (``models.lifecycle``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

from inferpool.broker.models.call_requests import Calls
from inferpool.broker.models.cancellation import Cancellation, Flags
from inferpool.broker.models.failures import BACKEND, failure_reason, log_failure
from inferpool.broker.models.rate_limiter import Gate, RateLimiter
from inferpool.broker.models.registry import Instance, ModelVersion, Registry, State
from inferpool.broker.models.request import PendingRequest
from inferpool.broker.models.response_cache import ResponseCache
from inferpool.broker.models.scheduler import Scheduler
from inferpool.broker.models.stats import CustomMetrics, response_outcome
from inferpool.broker.models.tracer import Tracer
from inferpool.broker.pool.channel import Garbled
from inferpool.broker.pool.handle import WorkerState
from inferpool.broker.pool.output_regions import OutputRegions
from inferpool.broker.pool.supervisor import Supervisor
from inferpool.shm.arena import Arena
from inferpool.wire.errors import InferpoolError
from inferpool.wire.worker.protocol import (
    Call,
    CancelCall,
    CorrelationId,
    Done,
    Durations,
    Execute,
    Free,
    Items,
    Query,
    Release,
    Result,
    Traced,
    WorkerMessage,
)


class Replies(Protocol):
    """How answers reach clients (the front's responder)."""

    def result(self, req: PendingRequest, item: Result) -> None: ...

    def send_error(
        self, envelope: list[Any], msg_type: str, request_id: Any, err: InferpoolError
    ) -> None: ...


class Lifecycle(Protocol):
    """What the request path asks of the models' lifecycle (``models.lifecycle``)."""

    def stop_idle(self, mv: ModelVersion) -> None:
        """Stop the instances of an unloading version that have nothing left to do."""
        ...

    def scheduled(self) -> list[ModelVersion]:
        """Every version with a queue: those serving and those retiring."""
        ...


class RequestPath:
    """Admitted requests on their way through schedulers and workers to their answers."""

    def __init__(
        self,
        *,
        inflight: dict[int, PendingRequest],
        unmaps: dict[str, list[str]],
        arena: Arena,
        outputs: OutputRegions,
        responder: Replies,
        supervisor: Supervisor[ModelVersion],
        lifecycle: Lifecycle,
        registry: Registry,
        flags: Flags,
        limiter: RateLimiter | None,
        cache: ResponseCache | None,
        tracer: Tracer,
    ) -> None:
        """``inflight``: the admitted requests, by rid, in admission order; ``unmaps``:
        worker identity -> client regions it should stop mapping (sent with its next
        message); ``flags``: where executing requests are marked cancelled; ``limiter``:
        ``--rate-limit execution_count``; ``cache``: ``--cache-size`` above 0; ``tracer``:
        the traces of sampled requests, which end here."""
        self.inflight = inflight
        self.unmaps = unmaps
        self.arena = arena
        self.outputs = outputs
        self.responder = responder
        self.supervisor = supervisor
        self.lifecycle = lifecycle
        self.cache = cache
        self.tracer = tracer
        self.metrics = CustomMetrics()
        self.gate = Gate(self._send, limiter)
        self.cancellation = Cancellation(inflight, flags, self.reject, responder.send_error)
        self.calls = Calls(self, outputs, registry, self.cancellation.cancel_part)
        self.wakes: dict[Scheduler, int] = {}
        self.dispatched: list[Instance] = []  # sent a batch since the loop last looked
        self._gathered: list[Scheduler] | None = None  # while requests arrive together

    # ================================================================== admission
    def submit(self, req: PendingRequest, now_ns: int) -> None:
        if self.cache is not None and self.cache.answer(req):
            if req.trace is not None:  # answered: it ends here
                self.tracer.end(req, time.monotonic_ns())
            return
        self.inflight[req.rid] = req
        scheduler = req.model.scheduler
        assert scheduler is not None
        if self._gathered is not None and not scheduler.gathering:
            scheduler.gathering = True
            self._gathered.append(scheduler)
        wake = scheduler.enqueue(req, now_ns)
        if wake is not None or self.wakes:
            self._note_wake(scheduler, wake)

    def gather(self) -> None:
        """Requests that arrived together are being admitted: they are queued, and batches
        form from all of them at :meth:`dispatch_gathered` (not the first running alone)."""
        self._gathered = []

    def dispatch_gathered(self) -> None:
        """Dispatch what was queued since :meth:`gather`."""
        gathered, self._gathered = self._gathered or [], None
        now = time.monotonic_ns()
        for scheduler in gathered:
            scheduler.gathering = False
            wake = scheduler.pump(now)
            if wake is not None or self.wakes:
                self._note_wake(scheduler, wake)

    # ================================================================== instances
    def idle(self, handle: Instance) -> None:
        """``handle`` can take a batch: its scheduler may give it one."""
        if handle.passive or handle.held or handle.state is not WorkerState.READY:
            return
        scheduler = handle.model.scheduler
        assert scheduler is not None
        wake = scheduler.instance_idle(handle, time.monotonic_ns())
        if wake is not None or self.wakes:  # (no call when there is nothing to note)
            self._note_wake(scheduler, wake)

    def hold(self, handle: Instance) -> None:
        """A lane's execute on ``handle`` made a call: the instance is taken until it ends."""
        handle.held += 1
        assert handle.model.scheduler is not None
        handle.model.scheduler.instance_gone(handle)

    def unhold(self, handle: Instance) -> None:
        """A held call ended: the instance takes batches again once none is left."""
        handle.held -= 1
        if not handle.held and handle.busy is None and handle.state is not WorkerState.STOPPING:
            self._next_batch(handle)

    def fail_requests_of(self, handle: Instance, err: InferpoolError, reason: str = "") -> None:
        """Answer the requests ``handle`` was running with ``err`` (its worker ended)."""
        for req in [r for r in self.inflight.values() if r.worker is handle]:
            self.reject(req, err, reason)

    def _note_wake(self, scheduler: Scheduler, wake: int | None) -> None:
        """When ``scheduler`` wants to be pumped again (None: not by a timer)."""
        if wake is None:
            self.wakes.pop(scheduler, None)
        else:
            self.wakes[scheduler] = wake

    # ================================================================== batches
    def dispatch(
        self,
        handle: Instance,
        batch: list[PendingRequest],
        release: Sequence[CorrelationId] = (),
        nulls: Sequence[int] = (),
    ) -> None:
        now = time.monotonic_ns()
        queued = handle.model.stats.queue
        for req in batch:
            req.dispatched_ns = now
            req.worker = handle
            queued.count += 1  # (Duration.add, inline: per request)
            queued.ns += now - req.received_ns
        handle.busy = batch
        if self.gate.limiter is None:  # no rate limiter: the batch goes at once
            self._send(handle, batch, release, nulls)
        else:
            self.gate.dispatch(handle, batch, release, nulls)

    def _send(
        self,
        handle: Instance,
        batch: list[PendingRequest],
        release: Sequence[CorrelationId],
        nulls: Sequence[int],
    ) -> None:
        handle.began_executing(time.monotonic())
        unmaps = self.unmaps.pop(handle.identity, ()) if self.unmaps else ()
        frees = self.outputs.take_frees(handle.output_region)
        works: list[Any] = []
        for r in batch:
            works.append(r.work if r.wire is None else r.wire)  # as it was sized
        handle.send(Execute(works, frees, unmaps, release, nulls))
        self.dispatched.append(handle)

    # ================================================================== answers
    def reject(self, req: PendingRequest, err: InferpoolError, reason: str = "") -> None:
        """Answer ``req`` with an error (unless it was cancelled: answered) and end it;
        ``reason`` labels the failure in the metrics (failures.FAILURE_REASONS; by default,
        what ``err`` says)."""
        if req.sink is not None:
            req.sink.failed(req, err)
        elif not req.cancelled:
            self.responder.send_error(req.envelope, "infer", req.client_id, err)
        reason = reason or failure_reason(err)
        log_failure(req.client_id, req.model, reason, err)
        self.finish(req, success=False, timing=None, reason=reason)

    def respond(self, req: PendingRequest, item: Result) -> None:
        """Send one response of ``req`` (to its client or its sink, an ensemble's step or a
        BLS call), after the response cache kept it; the final one ends it."""
        if req.cache_key is not None and self.cache is not None:
            self.cache.store(req, item)
        (req.sink or self.responder).result(req, item)
        if item.error is not None:
            log_failure(req.client_id, req.model, BACKEND, InferpoolError.from_wire(item.error))
        decoupled = req.model.decoupled
        if decoupled:  # its durations are the response's (response_stats)
            req.model.stats.response_done(req.responses, response_outcome(item), item.durations)
            req.responses += 1
        if item.final:
            self.finish(req, item.error is None, None if decoupled else item.durations)

    def finish(
        self,
        req: PendingRequest,
        success: bool,
        timing: Durations | None,
        reason: str = BACKEND,
    ) -> None:
        if self.inflight.pop(req.rid, None) is None:
            return
        for slot in req.slots:
            self.arena.free(slot)
        now = time.monotonic_ns()
        if req.trace is not None:
            self.tracer.end(req, now)
        req.model.stats.request_done(success, now - req.received_ns, req.batch_size, timing, reason)

    # ================================================================== from workers
    def done(self, handle: Instance, msg: Done) -> None:
        """A batch's last results and statistics: the message of every request."""
        calls = self.calls
        self._results(calls.passed_on(handle, msg.items) if calls.lent else msg.items)
        self._batch_done(handle, msg)

    def worker_message(self, handle: Instance, msg: WorkerMessage | Garbled) -> None:
        if isinstance(msg, Done):
            self.done(handle, msg)
        elif isinstance(msg, Items):
            self._results(self.calls.passed_on(handle, msg.items))
            handle.exec_started = time.monotonic()  # progress: the execute timeout starts over
        elif isinstance(msg, Call):
            self.calls.call(handle, msg)
        elif isinstance(msg, Release):
            self.calls.release(handle, msg)
        elif isinstance(msg, CancelCall):
            self.calls.cancel(handle, msg)
        elif isinstance(msg, Query):
            self.calls.query(handle, msg)
        elif isinstance(msg, Traced):
            for rid, *instants in msg.stamps:
                self.tracer.executed(rid, instants)
        else:
            self.supervisor.handle_message(handle, msg)

    def _results(self, items: Sequence[Result]) -> None:
        for item in items:
            req = self.inflight.get(item.rid)
            if req is None or req.cancelled:  # answered already: give the memory back
                for out in item.outputs:
                    self.outputs.free(out.region, out.offset, held=False)
                if req is not None and item.final:
                    self.finish(req, False, item.durations)
                continue
            self.respond(req, item)

    def _batch_done(self, handle: Instance, msg: Done) -> None:
        stats = handle.model.stats
        for batch in msg.batches:
            stats.batch_done(batch.batch_size, batch.durations)
        if msg.metrics is not None:
            self.metrics.apply(msg.metrics)
        handle.busy = None
        handle.ended_executing(time.monotonic())
        if handle.state is not WorkerState.STOPPING:
            self._next_batch(handle)
        if self.gate.limiter is not None:  # its next batch competes for what it releases
            self.gate.done(handle)

    def _next_batch(self, handle: Instance) -> None:
        mv = handle.model
        if mv.state is State.UNLOADING:
            assert mv.scheduler is not None
            if mv.scheduler.queue:
                self.idle(handle)  # a graceful unload serves its queue first
            self.lifecycle.stop_idle(mv)
            return
        self.idle(handle)

    # ================================================================== housekeeping
    def tick(self, now_ns: int) -> int | None:
        """Due batching decisions and queue timeouts; returns the next wake time (ns)."""
        nearest: int | None = None
        for scheduler, wake in list(self.wakes.items()):
            if wake <= now_ns:
                self._note_wake(scheduler, scheduler.pump(now_ns))
            wake2 = self.wakes.get(scheduler)
            if wake2 is not None and (nearest is None or wake2 < nearest):
                nearest = wake2
        for mv in self.lifecycle.scheduled():
            if mv.scheduler is not None:
                mv.scheduler.expire(now_ns)
        self.calls.tick(now_ns)
        return nearest

    def unmap_everywhere(self, region: str) -> None:
        """A worker's output region that others read (pipelines) is gone: they unmap it."""
        for handle in self.supervisor.alive():
            if handle.output_region != region:
                self.unmaps.setdefault(handle.identity, []).append(region)

    def flush_frees(self) -> None:
        """Send pending slot frees and unmaps to idle workers (busy ones get them with their
        next batch)."""
        for handle in self.supervisor.alive():
            if handle.busy is None and handle.state is WorkerState.READY:
                frees = self.outputs.take_frees(handle.output_region)
                unmaps = self.unmaps.pop(handle.identity, None) if self.unmaps else None
                if frees or unmaps:
                    handle.send(Free(frees, unmaps or ()))
