"""Models at run time: loading versions onto workers, routing batches and their results.

The manager owns the link between a ModelVersion, its scheduler and its worker handles.  It
reacts to the supervisor's events (ready, lost, stopped) and to result messages, and it is
where the "every request gets an answer" rule is kept: a request leaves ``inflight`` only
through ``finish``, after its final response (result or error) was sent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import orjson
import zmq

from broker import repository
from broker.admission import PendingRequest
from broker.models import ModelRecord, ModelVersion, Registry, State
from broker.options import ServerOptions
from broker.outputs import OutputRegions
from broker.placement import CoreUsage, HostPolicy, Topology, plan_instances
from broker.responder import Responder
from broker.scheduler import Scheduler
from broker.stats import CustomMetrics
from broker.supervisor import Supervisor, WorkerHandle, WorkerState
from client.errors import Code, InferpoolError
from client.zmqio import send_parts
from shm.arena import Arena

log = logging.getLogger("inferpool.manager")
Waiter = Callable[[InferpoolError | None], None]


class Manager:
    def __init__(
        self,
        options: ServerOptions,
        registry: Registry,
        arena: Arena,
        outputs: OutputRegions,
        responder: Responder,
        backend_socket: zmq.Socket[Any],
    ) -> None:
        self.options = options
        self.registry = registry
        self.arena = arena
        self.outputs = outputs
        self.responder = responder
        self.backend = backend_socket
        self.supervisor: Supervisor  # set by the broker once both exist
        self.inflight: dict[int, PendingRequest] = {}
        # worker identity -> client regions it should stop mapping (sent with its next message)
        self.unmaps: dict[bytes, list[str]] = {}
        self.metrics = CustomMetrics()
        self.wakes: dict[Scheduler, int] = {}
        self.topology = Topology.discover()
        self.policies: dict[str, HostPolicy] = {}
        self.core_usage = CoreUsage()
        self._load_waiters: dict[str, list[Waiter]] = {}
        self._unload_waiters: dict[str, list[Waiter]] = {}

    # ================================================================== loading
    def load(self, name: str, waiter: Waiter | None = None) -> None:
        """(Re)load model ``name`` from the repository; ``waiter`` hears how it ended."""
        record = self.registry.records.get(name)
        if record is not None and record.versions:
            self.unload(name, lambda _err: self.load(name, waiter))
            return
        entry = repository.scan_model(self.options.model_repository, name)
        record = ModelRecord(name)
        self.registry.records[name] = record
        if entry.error is not None or entry.config is None:
            record.error = entry.error
            log.error("%s", entry.error)
            if waiter:
                waiter(entry.error)
            return
        if waiter:
            self._load_waiters.setdefault(name, []).append(waiter)
        for version in entry.versions:
            mv = ModelVersion(name, version, entry.config, entry.path)
            record.versions[version] = mv
            mv.scheduler = Scheduler(mv, self.dispatch, self.reject)
            try:
                mv.placements = plan_instances(
                    entry.config,
                    self.topology,
                    self.policies,
                    self.core_usage,
                    pin=self.options.pin,
                )
                for p in mv.placements:
                    mv.instances.append(self.supervisor.add(mv, p.instance(), p.pinning))
                for handle in mv.instances:
                    self.supervisor.spawn(handle)
            except InferpoolError as err:
                self._version_failed(mv, err)
        self._check_loaded(name)

    def unload(self, name: str, waiter: Waiter | None = None) -> None:
        record = self.registry.records.get(name)
        if record is None:
            if waiter:
                waiter(InferpoolError(Code.NOT_FOUND, f"failed to unload '{name}': unknown model"))
            return
        if waiter:
            self._unload_waiters.setdefault(name, []).append(waiter)
        for mv in record.versions.values():
            mv.set_state(State.UNLOADING)
            assert mv.scheduler is not None
            mv.scheduler.drain(InferpoolError(Code.UNAVAILABLE, f"model {mv.label} is unloading"))
            for handle in mv.instances:
                if handle.busy is None:
                    self.supervisor.stop(handle, self.send_worker)
        self._check_unloaded(name)

    def _check_loaded(self, name: str) -> None:
        record = self.registry.records.get(name)
        if record is None or any(v.state is State.LOADING for v in record.versions.values()):
            return
        failed = [v for v in record.versions.values() if v.state is not State.READY]
        error = (
            InferpoolError(Code.UNAVAILABLE, "; ".join(v.reason for v in failed))
            if failed and len(failed) == len(record.versions)
            else None
        )
        for waiter in self._load_waiters.pop(name, []):
            waiter(error)

    def _check_unloaded(self, name: str) -> None:
        record = self.registry.records.get(name)
        if record is None:
            return
        for mv in record.versions.values():
            if any(h.state not in (WorkerState.STOPPED, WorkerState.FAILED) for h in mv.instances):
                return
            if any(r.model is mv for r in self.inflight.values()):
                return
        for mv in record.versions.values():
            for handle in mv.instances:
                self.supervisor.forget(handle)
            self.core_usage.release(mv.placements)
        del self.registry.records[name]
        log.info("unloaded model '%s'", name)
        for waiter in self._unload_waiters.pop(name, []):
            waiter(None)

    def _version_failed(self, mv: ModelVersion, err: InferpoolError) -> None:
        mv.set_state(State.UNAVAILABLE, err.message)
        log.error("model %s is UNAVAILABLE: %s", mv.label, err.message)
        assert mv.scheduler is not None
        mv.scheduler.drain(
            InferpoolError(Code.UNAVAILABLE, f"model {mv.label} is unavailable: {err.message}")
        )
        for handle in mv.instances:
            if handle.proc is not None:
                self.supervisor.stop(handle, self.send_worker)

    # ================================================================== supervisor events
    def worker_ready(self, handle: WorkerHandle) -> None:
        mv = handle.model
        if mv.state is State.LOADING:
            if all(h.state is WorkerState.READY for h in mv.instances):
                mv.set_state(State.READY)
                log.info("model %s is READY (%d instance(s))", mv.label, len(mv.instances))
                for h in mv.instances:
                    self._idle(h)
                self._check_loaded(mv.name)
        elif mv.state is State.READY:
            self._idle(handle)
        else:
            self.supervisor.stop(handle, self.send_worker)

    def worker_lost(self, handle: WorkerHandle, error: InferpoolError, booting: bool) -> None:
        mv = handle.model
        assert mv.scheduler is not None
        mv.scheduler.instance_gone(handle)
        handle.busy = None
        for req in [r for r in self.inflight.values() if r.worker is handle]:
            self.reject(req, error)
        if mv.state is State.LOADING and (booting or handle.state is WorkerState.FAILED):
            self._version_failed(mv, error)
            self._check_loaded(mv.name)
        elif mv.state is State.READY and all(h.state is WorkerState.FAILED for h in mv.instances):
            self._version_failed(mv, error)
        elif mv.state is State.UNLOADING:
            self._check_unloaded(mv.name)

    def worker_stopped(self, handle: WorkerHandle) -> None:
        mv = handle.model
        assert mv.scheduler is not None
        mv.scheduler.instance_gone(handle)
        if mv.state is State.UNLOADING:
            self._check_unloaded(mv.name)

    def _idle(self, handle: WorkerHandle) -> None:
        if handle.passive or handle.state is not WorkerState.READY:
            return
        mv = handle.model
        assert mv.scheduler is not None
        self._note_wake(mv.scheduler, mv.scheduler.instance_idle(handle, time.monotonic_ns()))

    def _note_wake(self, scheduler: Scheduler, wake: int | None) -> None:
        if wake is None:
            self.wakes.pop(scheduler, None)
        else:
            self.wakes[scheduler] = wake

    # ================================================================== requests
    def submit(self, req: PendingRequest, now_ns: int) -> None:
        self.inflight[req.rid] = req
        scheduler = req.model.scheduler
        assert scheduler is not None
        self._note_wake(scheduler, scheduler.enqueue(req, now_ns))

    def dispatch(self, handle: WorkerHandle, batch: list[PendingRequest]) -> None:
        now = time.monotonic_ns()
        stats = handle.model.stats
        for req in batch:
            req.dispatched_ns = now
            req.worker = handle
            stats.queue.add(now - req.received_ns)
        handle.busy = batch
        handle.exec_started = time.monotonic()
        msg: dict[str, Any] = {"op": "execute", "requests": [r.work for r in batch]}
        frees = self.outputs.take_frees(handle.output_region)
        if frees:
            msg["free"] = frees
        if self.unmaps:
            unmaps = self.unmaps.pop(handle.identity, None)
            if unmaps:
                msg["unmap"] = unmaps
        self.send_worker(handle, msg)

    def send_worker(self, handle: WorkerHandle, msg: dict[str, Any]) -> None:
        send_parts(self.backend, (handle.identity, orjson.dumps(msg)))

    def reject(self, req: PendingRequest, err: InferpoolError) -> None:
        """Answer ``req`` with an error and end it."""
        self.responder.send_error(req.envelope, "infer", req.client_id, err)
        self.finish(req, success=False, timing=None)

    def finish(self, req: PendingRequest, success: bool, timing: list[int] | None) -> None:
        if self.inflight.pop(req.rid, None) is None:
            return
        for slot in req.slots:
            self.arena.free(slot)
        req.model.stats.request_done(
            success, time.monotonic_ns() - req.received_ns, req.batch_size, timing
        )

    # ================================================================== results
    def worker_message(self, handle: WorkerHandle, msg: dict[str, Any]) -> None:
        op = msg.get("op")
        if op in ("done", "items"):
            self._results(msg.get("items") or ())
            if op == "done":
                self._batch_done(handle, msg)
        else:
            self.supervisor.handle_message(handle, msg)

    def _results(self, items: Any) -> None:
        responder = self.responder
        for item in items:
            req = self.inflight.get(item["rid"])
            if req is None:  # answered already (e.g. timed out): just give the memory back
                for out in item.get("outputs") or ():
                    self.outputs.free(out[3], out[4], held=False)
                continue
            responder.result(req, item)
            if item.get("final", True):
                self.finish(req, "error" not in item, item.get("t"))

    def _batch_done(self, handle: WorkerHandle, msg: dict[str, Any]) -> None:
        mv = handle.model
        for size, *timing in msg.get("stats") or ():
            mv.stats.batch_done(size, timing)
        if "metrics" in msg:
            self.metrics.apply(msg["metrics"])
        handle.busy = None
        if handle.state is WorkerState.STOPPING:
            return
        if mv.state is State.UNLOADING:
            self.supervisor.stop(handle, self.send_worker)
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
        for mv in self.registry.all_versions():
            if mv.scheduler is not None:
                mv.scheduler.expire(now_ns)
        return nearest

    def flush_frees(self) -> None:
        """Send pending slot frees and unmaps to idle workers (busy ones get them with their
        next batch)."""
        for handle in self.supervisor.alive():
            if handle.busy is None and handle.state is WorkerState.READY:
                frees = self.outputs.take_frees(handle.output_region)
                unmaps = self.unmaps.pop(handle.identity, None) if self.unmaps else None
                if frees or unmaps:
                    self.send_worker(handle, {"op": "free", "free": frees, "unmap": unmaps})
