"""Models at run time: loading versions onto workers, routing batches and their results.

The manager owns the link between a ModelVersion, its scheduler and its worker handles.  It
reacts to the supervisor's events (ready, lost, stopped) and to result messages, and it is
where the "every request gets an answer" rule is kept: a request leaves ``inflight`` only
through ``finish``, after its final response (result or error) was sent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from inferpool.broker.models import completion
from inferpool.broker.models.blame import client_fault
from inferpool.broker.models.calls import Calls
from inferpool.broker.models.config_support import ConfigSupport
from inferpool.broker.models.ensemble_config import is_ensemble
from inferpool.broker.models.ensembles import Ensembles
from inferpool.broker.models.failures import BACKEND, failure_reason, log_failure
from inferpool.broker.models.overrides import Override, Overrides
from inferpool.broker.models.rate_limiter import Gate
from inferpool.broker.models.registry import ModelRecord, ModelVersion, Registry, State
from inferpool.broker.models.reload import replace
from inferpool.broker.models.request import PendingRequest
from inferpool.broker.models.response_cache import ResponseCache
from inferpool.broker.models.scheduler import Scheduler
from inferpool.broker.models.sequencer import scheduler_for
from inferpool.broker.models.stats import CustomMetrics, response_outcome
from inferpool.broker.pool.channel import Garbled
from inferpool.broker.pool.handle import WorkerHandle, WorkerState
from inferpool.broker.pool.outputs import OutputRegions
from inferpool.broker.pool.placement import Planner
from inferpool.broker.pool.supervisor import Events, Supervisor
from inferpool.shm.arena import Arena
from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.worker.messages import (
    Call,
    CancelCall,
    CorrelationId,
    Done,
    Durations,
    Execute,
    Free,
    Items,
    Release,
    Result,
    WorkerMessage,
)

log = logging.getLogger("inferpool.manager")
Waiter = Callable[[InferpoolError | None], None]
Worker = WorkerHandle[ModelVersion]  # the pool's handle of one instance's worker
_DONE = (WorkerState.STOPPING, WorkerState.STOPPED, WorkerState.FAILED)


class LaneEvents(Protocol):
    """What the lanes (front.lanes) hear of instances and versions ending."""

    def instance_gone(self, handle: Worker, err: InferpoolError) -> None: ...

    def crash_blame(self, handle: Worker, code: int) -> str: ...

    def version_retired(self, mv: ModelVersion, why: str) -> None: ...


class Replies(Protocol):
    """How answers reach clients (the front's responder)."""

    def result(self, req: PendingRequest, item: Result) -> None: ...

    def send_error(
        self, envelope: list[Any], msg_type: str, request_id: Any, err: InferpoolError
    ) -> None: ...


class Manager:
    def __init__(
        self,
        repository: str,
        registry: Registry,
        arena: Arena,
        outputs: OutputRegions,
        responder: Replies,
        planner: Planner,
        pool: Callable[[Events[ModelVersion]], Supervisor[ModelVersion]],
    ) -> None:
        """``pool`` makes the supervisor that reports its workers' events to this manager."""
        self.repository = repository
        self.registry = registry
        self.arena = arena
        self.outputs = outputs
        self.responder = responder
        self.planner = planner
        self.supervisor = pool(self)
        self.inflight: dict[int, PendingRequest] = {}
        # worker identity -> client regions it should stop mapping (sent with its next message)
        self.unmaps: dict[str, list[str]] = {}
        self.metrics = CustomMetrics()
        self.cache: ResponseCache | None = None  # --cache-size > 0
        self.overrides = Overrides(repository)  # explicit loads with a config or files
        self.gate = Gate(self._send, None)  # a RateLimiter with --rate-limit execution_count
        self.support = ConfigSupport()  # what the server's flags make work
        self.wakes: dict[Scheduler, int] = {}
        self.pending: dict[str, ModelRecord] = {}  # replacements loading beside their model
        self.retiring: list[ModelRecord] = []  # records whose workers are stopping
        self.load_waiters: dict[str, list[Waiter]] = {}
        self._unload_waiters: dict[int, list[Waiter]] = {}  # id(record) -> waiters
        self.lanes: LaneEvents | None = None
        self.dispatched: list[Worker] = []  # sent a batch since the loop last looked
        self._gathered: list[Scheduler] | None = None  # while requests arrive together
        self.ensembles = Ensembles(self)  # pipelines: ensembles, models' calls (BLS)
        self.calls = Calls(self)
        outputs.on_lent_gone = self._unmap_everywhere

    # ================================================================== loading
    def load(
        self, name: str, waiter: Waiter | None = None, override: Override | None = None
    ) -> None:
        """(Re)load model ``name`` from the repository, or as ``override`` says (models.
        overrides); ``waiter`` hears how it ended.

        A model that is serving is replaced without failing a request (``reload.replace``);
        one that is not (failed, loading, unloading) is unloaded first.
        """
        if name in self.pending:
            if waiter:
                waiter(InferpoolError(Code.UNAVAILABLE, f"model '{name}' is already reloading"))
            return
        self.overrides.use(name, override)
        current = self.registry.records.get(name)
        if current is not None and current.ready_versions():
            replace(self, current, waiter)
            return
        if current is not None and current.versions:
            self.unload(name, lambda _err: self.load(name, waiter, override))
            return
        record = self.build(name)
        self.registry.records[name] = record
        if waiter and record.error is None:
            self.load_waiters.setdefault(name, []).append(waiter)
        elif waiter:
            waiter(record.error)
        self.check_loaded(name)

    def build(self, name: str) -> ModelRecord:
        """A record for the model as it is on disk now, its workers starting."""
        entry = self.overrides.scan(name)
        if entry.config is not None and entry.error is None:
            entry.error = self.support.check(entry.config)  # warns of what it ignores
        record = ModelRecord(name, fingerprint=entry.fingerprint)
        if entry.error is not None or entry.config is None:
            record.error = entry.error
            log.error("%s", entry.error)
            return record
        for version in entry.versions:
            mv = ModelVersion(name, version, entry.config, entry.path)
            record.versions[version] = mv
            if is_ensemble(entry.config):  # runs in the broker; READY with its models
                mv.scheduler = self.ensembles.scheduler(mv)
                continue
            mv.scheduler = scheduler_for(mv, self.dispatch, self.reject)
            try:
                mv.placements = self.planner.plan(entry.config)
                for p in mv.placements:
                    handle = self.supervisor.add(mv, p.instance(), p.pinning)
                    mv.instances.append(handle)
                    self.gate.add(handle, entry.config, p.group, p.device_id)
                for handle in mv.instances:
                    self.supervisor.spawn(handle)
            except InferpoolError as err:
                self._version_failed(mv, err)
        return record

    def unload(self, name: str, waiter: Waiter | None = None, *, graceful: bool = False) -> None:
        """Unload ``name``; queued requests are answered UNAVAILABLE unless ``graceful``,
        when they are served first (a model removed from the repository)."""
        record = self.registry.records.get(name)
        if record is None:
            if waiter:
                waiter(InferpoolError(Code.NOT_FOUND, f"failed to unload '{name}': unknown model"))
            return
        pending = self.pending.pop(name, None)
        if pending is not None:
            for cancelled in self.load_waiters.pop(name, []):
                cancelled(InferpoolError(Code.CANCELLED, f"model '{name}' was unloaded"))
            self.retire(pending, graceful=False)
        if waiter:
            self._unload_waiters.setdefault(id(record), []).append(waiter)
        self.retire(record, graceful)

    def retire(self, record: ModelRecord, graceful: bool, why: str = "is unloading") -> None:
        """Stop a record's versions: new requests no longer reach them, their workers stop
        once nothing is left for them; ``_check_drained`` forgets the record then."""
        if all(r is not record for r in self.retiring):
            self.retiring.append(record)
            for mv in record.versions.values():
                mv.set_state(State.UNLOADING)
                if self.lanes is not None:
                    self.lanes.version_retired(mv, why)
                assert mv.scheduler is not None
                if not graceful:
                    mv.scheduler.drain(
                        InferpoolError(Code.UNAVAILABLE, f"model {mv.label} is unloading")
                    )
                self._stop_idle(mv)
        self._check_drained(record)

    def _stop_idle(self, mv: ModelVersion) -> None:
        """Stop the instances of an unloading version that have nothing left to do."""
        scheduler = mv.scheduler
        assert scheduler is not None
        for handle in mv.instances:
            if handle.busy is not None or handle.held or handle.state in _DONE:
                continue
            if not scheduler.queue or handle.passive or handle.state is not WorkerState.READY:
                scheduler.instance_gone(handle)
                self.supervisor.stop(handle)
        if scheduler.queue and not any(h.state is WorkerState.READY for h in mv.instances):
            scheduler.drain(
                InferpoolError(
                    Code.UNAVAILABLE, f"model {mv.label} is unloading and has no instance left"
                )
            )

    def check_loaded(self, name: str) -> None:
        record = self.pending.get(name) or self.registry.records.get(name)
        if record is None or any(v.state is State.LOADING for v in record.versions.values()):
            return
        failed = [v for v in record.versions.values() if v.state is not State.READY]
        error = (
            InferpoolError(Code.UNAVAILABLE, "; ".join(v.reason for v in failed))
            if failed and len(failed) == len(record.versions)
            else None
        )
        for waiter in self.load_waiters.pop(name, []):
            waiter(error)

    def _check_drained(self, record: ModelRecord | None) -> None:
        """Forget a retiring record once its workers stopped and its requests ended."""
        if record is None:
            return
        for mv in record.versions.values():
            if any(h.state not in _DONE for h in mv.instances):
                return
            if any(r.model is mv for r in self.inflight.values()):
                return
        self.retiring = [r for r in self.retiring if r is not record]
        for mv in record.versions.values():
            for handle in mv.instances:
                self.supervisor.forget(handle)
                self.gate.remove(handle)
            self.planner.release(mv.placements)
            self.overrides.release(mv.path)
        if self.registry.forget(record):
            log.info("unloaded model '%s'", record.name)
        for waiter in self._unload_waiters.pop(id(record), []):
            waiter(None)

    def version_idle(self, mv: ModelVersion) -> None:
        """An unloading version without workers (an ensemble) ended a request."""
        self._check_drained(self._retiring_of(mv))

    def _retiring_of(self, mv: ModelVersion) -> ModelRecord | None:
        return next((r for r in self.retiring if r.versions.get(mv.version) is mv), None)

    def _version_failed(self, mv: ModelVersion, err: InferpoolError) -> None:
        mv.set_state(State.UNAVAILABLE, err.message)
        log.error("model %s is UNAVAILABLE: %s", mv.label, err.message)
        assert mv.scheduler is not None
        mv.scheduler.drain(
            InferpoolError(Code.UNAVAILABLE, f"model {mv.label} is unavailable: {err.message}")
        )
        for handle in mv.instances:
            if handle.proc is not None:
                self.supervisor.stop(handle)

    # ================================================================== supervisor events
    def worker_ready(self, handle: Worker) -> None:
        mv = handle.model
        if mv.state in (State.LOADING, State.READY):
            try:
                if completion.adopt(mv, handle.reported_config, handle.name):
                    # still LOADING, so nothing is queued: schedule by the completed config
                    mv.scheduler = scheduler_for(mv, self.dispatch, self.reject)
            except InferpoolError as err:
                self._version_failed(mv, err)
                self.check_loaded(mv.name)
                return
        if mv.state is State.LOADING:
            if all(h.state is WorkerState.READY for h in mv.instances):
                mv.set_state(State.READY)
                log.info("model %s is READY (%d instance(s))", mv.label, len(mv.instances))
                for h in mv.instances:
                    self._idle(h)
                self.check_loaded(mv.name)
        elif mv.state is State.READY:
            self._idle(handle)
        else:
            self.supervisor.stop(handle)

    def worker_lost(self, handle: Worker, error: InferpoolError, booting: bool) -> None:
        mv = handle.model
        assert mv.scheduler is not None
        mv.scheduler.instance_gone(handle)
        handle.busy = None
        self.calls.worker_gone(handle)
        handle.ended_executing(time.monotonic())
        if self.lanes is not None:
            self.lanes.instance_gone(handle, error)
        for req in [r for r in self.inflight.values() if r.worker is handle]:
            self.reject(req, error, BACKEND)
        self.gate.done(handle, gone=True)
        if mv.state is State.LOADING and (booting or handle.state is WorkerState.FAILED):
            self._version_failed(mv, error)
            self.check_loaded(mv.name)
        elif mv.state is State.READY and all(
            h.state is WorkerState.FAILED for h in mv.instances if not h.passive
        ):
            self._version_failed(mv, error)
        elif mv.state is State.UNLOADING:
            self._stop_idle(mv)  # not respawned to finish a queue it may never get to
            self._check_drained(self._retiring_of(mv))

    def crash_blame(self, handle: Worker, code: int) -> str:
        blame = client_fault(handle.busy, code)
        if not blame and self.lanes is not None:
            blame = self.lanes.crash_blame(handle, code)
        return blame

    def worker_stopped(self, handle: Worker) -> None:
        mv = handle.model
        assert mv.scheduler is not None
        mv.scheduler.instance_gone(handle)
        self.calls.worker_gone(handle)
        handle.ended_executing(time.monotonic())
        if handle.busy is not None:  # a batch the rate limiter never let run
            err = InferpoolError(Code.UNAVAILABLE, f"instance {handle.name} stopped")
            for req in [r for r in self.inflight.values() if r.worker is handle]:
                self.reject(req, err)
            handle.busy = None
        self.gate.done(handle, gone=True)
        if self.lanes is not None:
            stopped = f"instance '{handle.name}' of model {mv.label} stopped"
            self.lanes.instance_gone(handle, InferpoolError(Code.UNAVAILABLE, stopped))
        if mv.state is State.UNLOADING:
            self._check_drained(self._retiring_of(mv))

    def hold(self, handle: Worker) -> None:
        """A lane's execute on ``handle`` made a call: the instance is taken until it ends."""
        handle.held += 1
        assert handle.model.scheduler is not None
        handle.model.scheduler.instance_gone(handle)

    def unhold(self, handle: Worker) -> None:
        """A held call ended: the instance takes batches again once none is left."""
        handle.held -= 1
        if not handle.held and handle.busy is None and handle.state is not WorkerState.STOPPING:
            self._next_batch(handle)

    def _idle(self, handle: Worker) -> None:
        if handle.passive or handle.held or handle.state is not WorkerState.READY:
            return
        scheduler = handle.model.scheduler
        assert scheduler is not None
        wake = scheduler.instance_idle(handle, time.monotonic_ns())
        if wake is not None or self.wakes:  # (no call when there is nothing to note)
            self._note_wake(scheduler, wake)

    def _note_wake(self, scheduler: Scheduler, wake: int | None) -> None:
        """When ``scheduler`` wants to be pumped again (None: not by a timer)."""
        if wake is None:
            self.wakes.pop(scheduler, None)
        else:
            self.wakes[scheduler] = wake

    # ================================================================== requests
    def submit(self, req: PendingRequest, now_ns: int) -> None:
        if self.cache is not None and self.cache.answer(req):
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

    def dispatch(
        self,
        handle: Worker,
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
        handle: Worker,
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
        msg = Execute(works, frees, unmaps, release, nulls)
        self.supervisor.send(handle, msg)
        self.dispatched.append(handle)

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
        req.model.stats.request_done(
            success, time.monotonic_ns() - req.received_ns, req.batch_size, timing, reason
        )

    # ================================================================== results
    def done(self, handle: Worker, msg: Done) -> None:
        """A batch's last results and statistics: the message of every request."""
        calls = self.calls
        self._results(calls.passed_on(handle, msg.items) if calls.lent else msg.items)
        self._batch_done(handle, msg)

    def worker_message(self, handle: Worker, msg: WorkerMessage | Garbled) -> None:
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

    def _batch_done(self, handle: Worker, msg: Done) -> None:
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

    def _next_batch(self, handle: Worker) -> None:
        mv = handle.model
        if mv.state is State.UNLOADING:
            assert mv.scheduler is not None
            if mv.scheduler.queue:
                self._idle(handle)  # a graceful unload serves its queue first
            self._stop_idle(mv)
            return
        self._idle(handle)

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
        retiring = [mv for r in self.retiring for mv in r.versions.values()]
        for mv in self.registry.all_versions() + retiring:
            if mv.scheduler is not None:
                mv.scheduler.expire(now_ns)
        self.calls.tick(now_ns)
        return nearest

    def _unmap_everywhere(self, region: str) -> None:
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
                    self.supervisor.send(handle, Free(frees, unmaps or ()))
