"""Models at run time: loading versions onto workers, replacing and retiring them.

The lifecycle owns the link between a ModelVersion, its scheduler and its worker handles, and
reacts to the supervisor's events (ready, lost, stopped).  The requests themselves go
through the request path (``models.request_path``), which it builds with the supervisor.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from inferpool.broker.models import completion
from inferpool.broker.models.blame import client_fault
from inferpool.broker.models.cancellation import Flags
from inferpool.broker.models.config_support import ConfigSupport
from inferpool.broker.models.core_defaults import add_core_defaults
from inferpool.broker.models.ensemble_config import is_ensemble
from inferpool.broker.models.ensembles import Ensembles
from inferpool.broker.models.failures import BACKEND
from inferpool.broker.models.labels import Labels, read_labels
from inferpool.broker.models.overrides import Override, Overrides
from inferpool.broker.models.rate_limiter import RateLimiter
from inferpool.broker.models.registry import Instance, ModelRecord, ModelVersion, Registry, State
from inferpool.broker.models.reload import Waiter, replace
from inferpool.broker.models.repository import poll_failure
from inferpool.broker.models.request import PendingRequest
from inferpool.broker.models.request_path import Replies, RequestPath
from inferpool.broker.models.response_cache import ResponseCache
from inferpool.broker.models.sequencer import scheduler_for
from inferpool.broker.models.tracer import Tracer
from inferpool.broker.pool.handle import WorkerState
from inferpool.broker.pool.output_regions import OutputRegions
from inferpool.broker.pool.placement import Planner
from inferpool.broker.pool.supervisor import Events, Supervisor
from inferpool.shm.arena import Arena
from inferpool.wire.errors import Code, InferpoolError

log = logging.getLogger("inferpool.lifecycle")
_DONE = (WorkerState.STOPPING, WorkerState.STOPPED, WorkerState.FAILED)


class LaneEvents(Protocol):
    """What the lanes (front.lane_grants) hear of instances and versions ending."""

    def instance_gone(self, handle: Instance, err: InferpoolError) -> None: ...

    def crash_blame(self, handle: Instance, code: int) -> str: ...

    def version_retired(self, mv: ModelVersion, why: str) -> None: ...


class ModelLifecycle:
    """The models' lifecycle: loads, replacements and unloads, and what the supervisor reports of
    their workers."""

    def __init__(
        self,
        *,
        repository: str,
        registry: Registry,
        planner: Planner,
        pool: Callable[[Events[ModelVersion]], Supervisor[ModelVersion]],
        lanes: LaneEvents,
        support: ConfigSupport,
        arena: Arena,
        outputs: OutputRegions,
        responder: Replies,
        flags: Flags,
        limiter: RateLimiter | None,
        cache: ResponseCache | None,
        inflight: dict[int, PendingRequest],
        unmaps: dict[str, list[str]],
        tracer: Tracer,
        auto_complete: bool = True,
    ) -> None:
        """``pool`` makes the supervisor that reports its workers' events to this lifecycle;
        ``support``: what the server's flags make work; ``auto_complete``: whether configs
        may be completed (``--disable-auto-complete-config``).  The rest builds the request
        path (``models.request_path.RequestPath``)."""
        self.repository = repository
        self.registry = registry
        self.planner = planner
        self.lanes = lanes
        self.support = support
        self.supervisor = pool(self)
        self.requests = RequestPath(
            inflight=inflight,
            unmaps=unmaps,
            arena=arena,
            outputs=outputs,
            responder=responder,
            supervisor=self.supervisor,
            lifecycle=self,
            registry=registry,
            flags=flags,
            limiter=limiter,
            cache=cache,
            tracer=tracer,
        )
        self.ensembles = Ensembles(registry, self, self.requests)  # run in the broker
        # explicit loads with a config or files
        self.overrides = Overrides(repository, auto_complete)
        self.pending: dict[str, ModelRecord] = {}  # replacements loading beside their model
        self.retiring: list[ModelRecord] = []  # records whose workers are stopping
        self.load_waiters: dict[str, list[Waiter]] = {}
        self._unload_waiters: dict[int, list[Waiter]] = {}  # id(record) -> waiters

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
        elif waiter and record.error is not None:
            waiter(poll_failure(name, record.error))
        self.check_loaded(name)

    def build(self, name: str) -> ModelRecord:
        """A record for the model as it is on disk now, its workers starting."""
        entry = self.overrides.scan(name)
        labels = Labels()
        if entry.config is not None and entry.error is None:
            entry.error = self.support.check(entry.config)  # warns of what it ignores
        if entry.config is not None and entry.error is None:
            try:
                labels = read_labels(entry.config, entry.path)
            except InferpoolError as err:
                entry.error = err
        record = ModelRecord(name, fingerprint=entry.fingerprint)
        if entry.error is not None or entry.config is None:
            record.error = entry.error
            log.error("%s", entry.error)
            return record
        add_core_defaults(entry.config)  # after the check: what the core adds is no user's
        self.planner.complete(entry.config)
        for version in entry.versions:
            mv = ModelVersion(name, version, entry.config, entry.path)
            mv.file_labels = mv.labels = labels
            record.versions[version] = mv
            if is_ensemble(entry.config):  # runs in the broker; READY with its models
                mv.scheduler = self.ensembles.scheduler(mv)
                continue
            mv.scheduler = scheduler_for(mv, self.requests.dispatch, self.requests.reject)
            try:
                mv.placements = self.planner.plan(entry.config)
                for p in mv.placements:
                    handle = self.supervisor.add(mv, p.instance(), p.pinning)
                    mv.instances.append(handle)
                    self.requests.gate.add(handle, entry.config, p.group, p.device_id)
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
                self.lanes.version_retired(mv, why)
                assert mv.scheduler is not None
                if not graceful:
                    mv.scheduler.drain(
                        InferpoolError(Code.UNAVAILABLE, f"model {mv.label} is unloading")
                    )
                self.stop_idle(mv)
        self._check_drained(record)

    def stop_idle(self, mv: ModelVersion) -> None:
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
            if any(r.model is mv for r in self.requests.inflight.values()):
                return
        self.retiring = [r for r in self.retiring if r is not record]
        for mv in record.versions.values():
            for handle in mv.instances:
                self.supervisor.forget(handle)
                self.requests.gate.remove(handle)
            self.planner.release(mv.placements)
            self.overrides.release(mv.path)
        if self.registry.forget(record):
            log.info("unloaded model '%s'", record.name)
        for waiter in self._unload_waiters.pop(id(record), []):
            waiter(None)

    def scheduled(self) -> list[ModelVersion]:
        """Every version with a queue: those serving and those retiring."""
        retiring = [mv for r in self.retiring for mv in r.versions.values()]
        return self.registry.all_versions() + retiring

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
    def worker_ready(self, handle: Instance) -> None:
        mv = handle.model
        if mv.state in (State.LOADING, State.READY):
            try:
                if completion.adopt(mv, handle.reported_config, handle.name):
                    # still LOADING, so nothing is queued: schedule by the completed config
                    mv.scheduler = scheduler_for(mv, self.requests.dispatch, self.requests.reject)
            except InferpoolError as err:
                self._version_failed(mv, err)
                self.check_loaded(mv.name)
                return
        if mv.state is State.LOADING:
            if all(h.state is WorkerState.READY for h in mv.instances):
                mv.set_state(State.READY)
                log.info("model %s is READY (%d instance(s))", mv.label, len(mv.instances))
                for h in mv.instances:
                    self.requests.idle(h)
                self.check_loaded(mv.name)
        elif mv.state is State.READY:
            self.requests.idle(handle)
        else:
            self.supervisor.stop(handle)

    def worker_lost(self, handle: Instance, error: InferpoolError, booting: bool) -> None:
        mv = handle.model
        requests = self.requests
        assert mv.scheduler is not None
        mv.scheduler.instance_gone(handle)
        handle.busy = None
        requests.calls.worker_gone(handle)
        handle.ended_executing(time.monotonic())
        self.lanes.instance_gone(handle, error)
        requests.fail_requests_of(handle, error, BACKEND)
        requests.gate.done(handle, gone=True)
        if mv.state is State.LOADING and (booting or handle.state is WorkerState.FAILED):
            self._version_failed(mv, error)
            self.check_loaded(mv.name)
        elif mv.state is State.READY and all(
            h.state is WorkerState.FAILED for h in mv.instances if not h.passive
        ):
            failed = f"every instance is FAILED, the last: {handle.last_error}"
            self._version_failed(mv, InferpoolError(error.code, failed))
        elif mv.state is State.UNLOADING:
            self.stop_idle(mv)  # not respawned to finish a queue it may never get to
            self._check_drained(self._retiring_of(mv))

    def crash_blame(self, handle: Instance, code: int) -> str:
        blame = client_fault(handle.busy, code)
        if not blame:
            blame = self.lanes.crash_blame(handle, code)
        return blame

    def worker_stopped(self, handle: Instance) -> None:
        mv = handle.model
        requests = self.requests
        assert mv.scheduler is not None
        mv.scheduler.instance_gone(handle)
        requests.calls.worker_gone(handle)
        handle.ended_executing(time.monotonic())
        if handle.busy is not None:  # a batch the rate limiter never let run
            err = InferpoolError(Code.UNAVAILABLE, f"instance {handle.name} stopped")
            requests.fail_requests_of(handle, err)
            handle.busy = None
        requests.gate.done(handle, gone=True)
        stopped = f"instance '{handle.name}' of model {mv.label} stopped"
        self.lanes.instance_gone(handle, InferpoolError(Code.UNAVAILABLE, stopped))
        if mv.state is State.UNLOADING:
            self._check_drained(self._retiring_of(mv))
