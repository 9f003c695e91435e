"""Running an ensemble in the broker, as Triton's ensemble scheduler does.

An ensemble has no workers: each request becomes a *run* of its steps.  A step starts as
soon as every tensor it reads exists (several steps can be in flight), as a request the
broker makes itself (models/internal.py) to the step's model and version, scheduled like a
client's.  A step's outputs stay where its worker wrote them, in that worker's output arena:
the steps that read them name those slots as inputs (read in place, no copy), and the client
gets them as any response's outputs (frames, handles, or written into its own region by the
last step).  Each slot has one owner per step that reads it and one for the response; the
run's own reference is the first owner's and the others are shares (``pool.output_regions.share``),
so a tensor with one reader costs no bookkeeping beyond its one free; it goes back to its
worker once all have finished.

A step that fails fails the run: no further step starts, the steps in flight finish, and the
client gets one error naming the step.  A decoupled step's responses each start the steps
after it again (Triton's iterations); the ensemble answers once per complete set of outputs.
A non-decoupled ensemble answers once every step is done.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from inferpool.broker.models.internal import make_request
from inferpool.broker.models.registry import ModelVersion, Registry, State
from inferpool.broker.models.request import PendingRequest
from inferpool.broker.models.scheduler import Dispatch, Scheduler
from inferpool.broker.models.tracer import Tracer
from inferpool.broker.pool.output_regions import OutputRegions
from inferpool.wire.ensemble_wiring import (
    Step,
    Wiring,
    batch_reshape,
    ensemble_deadlock,
    step_failed,
)
from inferpool.wire.errors import InferpoolError
from inferpool.wire.worker.protocol import Durations, Result, TensorRef, WantedOutput

log = logging.getLogger("inferpool.ensemble")
Key = tuple[str, int]  # (ensemble tensor, iteration)


class Requests(Protocol):
    """What an ensemble's runs ask of the request path (``models.request_path``)."""

    inflight: dict[int, PendingRequest]
    outputs: OutputRegions
    tracer: Tracer

    @property
    def dispatch(self) -> Dispatch: ...

    def submit(self, req: PendingRequest, now_ns: int) -> None: ...

    def respond(self, req: PendingRequest, item: Result) -> None: ...

    def reject(self, req: PendingRequest, err: InferpoolError, reason: str = "") -> None: ...


class EnsembleScheduler(Scheduler):
    """An ensemble version's scheduler: nothing queues here, each request runs at once."""

    def __init__(
        self,
        model: ModelVersion,
        wiring: Wiring,
        requests: Requests,
        registry: Registry,
        version_idle: Callable[[ModelVersion], None],
    ) -> None:
        """``version_idle(model)``: an unloading ensemble ended a request (it may be
        forgotten then)."""
        super().__init__(model, requests.dispatch, requests.reject)
        self.wiring = wiring
        self.requests = requests
        self.registry = registry
        self.version_idle = version_idle
        self.runs: dict[int, _Run] = {}  # by the ensemble request's rid, until it settles

    def enqueue(self, req: PendingRequest, now_ns: int) -> int | None:
        if req.work.timeout_us:  # its steps inherit the request's timeout
            req.deadline_ns = now_ns + req.work.timeout_us * 1000
        run = _Run(self, req)
        self.runs[req.rid] = run
        run.start(now_ns)
        return None

    def parts(self, req: PendingRequest, err: InferpoolError) -> list[PendingRequest]:
        """The run's steps in flight; the run fails with ``err``, so no further step starts
        and its answer, if it still gives one, is ``err``."""
        run = self.runs.get(req.rid)
        if run is None:
            return []
        if run.error is None:
            run.error = err
        return list(run.steps)

    def pump(self, now_ns: int) -> int | None:
        return None


@dataclass(slots=True)
class _Tensor:
    ref: TensorRef | None  # None: an optional input the request left out
    batched: bool  # it has a batch dimension (it came from a batching model or request)
    owed: int  # owners still to finish: steps reading it, the response


class _StepSink:
    """Where one started step's answers go."""

    def __init__(self, run: _Run, step: Step, iteration: int) -> None:
        self.run = run
        self.step = step
        self.iteration = iteration

    def result(self, req: PendingRequest, item: Result) -> None:
        self.run.step_result(self, req, item)

    def failed(self, req: PendingRequest, err: InferpoolError) -> None:
        self.run.step_failed(self, req, err)


class _Run:
    """One ensemble request: the tensors it has, its steps, its answer."""

    def __init__(self, scheduler: EnsembleScheduler, top: PendingRequest) -> None:
        self.scheduler = scheduler
        self.requests = scheduler.requests
        self.wiring = scheduler.wiring
        self.top = top
        self.tensors: dict[Key, _Tensor] = {}
        self.iterations: defaultdict[str, int] = defaultdict(int)
        self.started: set[tuple[int, int]] = set()  # (step index, iteration)
        self.steps: set[PendingRequest] = set()  # the step requests in flight
        self.in_flight = 0
        self.depth = 0  # > 0 while the run is starting steps (a step may end at once)
        self.error: InferpoolError | None = None
        self.ended = False
        self.wanted = tuple(top.outputs)
        self.windows = {w.name: w.window for w in top.work.outputs if w.window is not None}
        self.complete: list[int] = []  # iterations whose outputs are all there, unanswered
        self.whole: set[int] = set()  # iterations whose outputs have all been there
        self.queue_ns = 0
        self.durations = [0, 0, 0]

    # ------------------------------------------------------------------ progress
    def start(self, now_ns: int) -> None:
        model = self.scheduler.model
        given = {ref.name: ref for ref in self.top.work.inputs}
        batched = model.max_batch_size > 0
        for name in self.wiring.inputs:
            self._add(name, given.get(name), batched)
        self._advance([(name, 0) for name in self.wiring.inputs], now_ns)

    def step_result(self, sink: _StepSink, req: PendingRequest, item: Result) -> None:
        outputs = self.requests.outputs
        step = sink.step
        if item.error is not None:
            self._fail(step, InferpoolError.from_wire(item.error))
        updated: list[Key] = []
        for out in item.outputs:
            tensor = step.outputs.get(out.name)
            if tensor is None or self.error is not None:
                outputs.free(out.region, out.offset, held=False)
                continue
            ref = TensorRef(tensor, out.datatype, out.shape, out.region, out.offset, out.byte_size)
            updated.append(self._add(tensor, ref, req.model.max_batch_size > 0))
        if updated:
            self._advance(updated, time.monotonic_ns())
        if item.final:
            self.steps.discard(req)
            if req.dispatched_ns:
                self.queue_ns += req.dispatched_ns - req.received_ns
            if item.durations is not None:
                for i, ns in enumerate(item.durations):
                    self.durations[i] += ns
            self._step_over(sink)

    def step_failed(self, sink: _StepSink, req: PendingRequest, err: InferpoolError) -> None:
        self.steps.discard(req)
        self._fail(sink.step, err)
        self._step_over(sink)

    def _step_over(self, sink: _StepSink) -> None:
        self.in_flight -= 1
        self._settle()  # the answer leaves first: the step's inputs are freed after it
        for tensor in sink.step.reads:
            self._owed((tensor, sink.iteration))

    def _advance(self, updated: Sequence[Key], now_ns: int) -> None:
        """Start every step whose inputs have all arrived; note complete outputs."""
        wiring = self.wiring
        tensors = self.tensors
        self.depth += 1
        try:
            for tensor, k in updated:
                exists = _in_iteration(tensors, k)
                for i in wiring.readers.get(tensor, ()):
                    if self.error is not None:
                        return
                    step = wiring.steps[i]
                    if (i, k) in self.started or not step.ready(exists):
                        continue
                    self.started.add((i, k))
                    self._start_step(step, k, now_ns)
                if tensor in self.wanted and k not in self.whole and self._all_there(k):
                    self.whole.add(k)
                    self.complete.append(k)
            if self.scheduler.model.decoupled:  # answered as they come
                while self.complete and self.error is None:
                    self._respond(self.complete.pop(0), final=False)
        finally:
            self.depth -= 1
        self._settle()

    def _start_step(self, step: Step, k: int, now_ns: int) -> None:
        top = self.top
        try:
            model = self.scheduler.registry.resolve(
                step.model_name, step.model_version if step.model_version > 0 else ""
            )
            inputs = [
                _as_input(model, name, self.tensors[(tensor, k)])
                for name, tensor in step.inputs.items()
                if self.tensors[(tensor, k)].ref is not None
            ]
            wanted = [
                WantedOutput(name, None if model.decoupled else self.windows.get(tensor))
                for name, tensor in step.outputs.items()
            ]
            req = make_request(
                model,
                inputs,
                wanted,
                _StepSink(self, step, k),
                request_id=top.work.id,
                correlation_id=top.work.correlation_id,
                flags=top.work.flags,
                parameters=top.work.parameters,
                now_ns=now_ns,
                deadline_ns=top.deadline_ns,
            )
        except InferpoolError as err:
            self._fail(step, err)
            for tensor in step.reads:
                self._owed((tensor, k))
            return
        outputs = self.requests.outputs
        for ref in inputs:  # the step's worker maps the regions it reads
            outputs.lend(ref.region)
        self.in_flight += 1
        self.steps.add(req)
        if top.trace is not None:  # its steps are traced as its children
            self.requests.tracer.child(req, top.trace, now_ns)
        self.requests.submit(req, now_ns)

    # ------------------------------------------------------------------ tensors
    def _add(self, tensor: str, ref: TensorRef | None, batched: bool) -> Key:
        k = self.iterations[tensor]
        self.iterations[tensor] = k + 1
        owners = len(self.wiring.readers.get(tensor, ())) + (tensor in self.wanted)
        if not owners:  # an output nobody asked for
            if ref is not None:
                self.requests.outputs.free(ref.region, ref.offset, held=False)
            return (tensor, k)
        self.tensors[(tensor, k)] = _Tensor(ref, batched, owners)
        if ref is not None and owners > 1:  # the first owner has the run's own reference
            self.requests.outputs.share(ref.region, ref.offset, owners - 1)
        return (tensor, k)

    def _owed(self, key: Key, freed: bool = True) -> None:
        """One owner of a tensor has finished (``freed``: its share goes back here; else
        the responder gives it back); the last one's is the run's own reference."""
        entry = self.tensors.get(key)
        if entry is None:
            return
        entry.owed -= 1
        ref = entry.ref
        if ref is not None and freed:
            self.requests.outputs.free(ref.region, ref.offset, held=False)
        if entry.owed <= 0:
            del self.tensors[key]

    def _all_there(self, k: int) -> bool:
        return all((name, k) in self.tensors for name in self.wanted)

    # ------------------------------------------------------------------ the answer
    def _respond(self, k: int, final: bool) -> None:
        """Answer with iteration ``k``'s outputs; the responder frees their shares."""
        model = self.scheduler.model
        outs = []
        for name in self.wanted:
            entry = self.tensors[(name, k)]
            if entry.ref is not None:
                spec = model.outputs[name]
                batching = model.max_batch_size > 0
                shape = batch_reshape(spec, batching, entry.batched, entry.ref.shape)
                outs.append(entry.ref._replace(shape=list(shape)))
        durations = Durations(*self.durations) if final else None
        if self.top.rid in self.requests.inflight:
            self.requests.respond(
                self.top, Result(self.top.rid, final, outs, None, None, durations)
            )
        else:  # the request was answered already (the server is stopping): drop the outputs
            for out in outs:
                self.requests.outputs.free(out.region, out.offset, held=False)
        for name in self.wanted:
            self._owed((name, k), freed=False)

    def _fail(self, step: Step, err: InferpoolError) -> None:
        if self.error is None:
            self.error = step_failed(self.wiring.name, step.index, step.model_name, err)

    def _settle(self) -> None:
        if self.depth or self.in_flight or self.ended:
            return
        self.ended = True
        self.scheduler.runs.pop(self.top.rid, None)
        top, requests, model = self.top, self.requests, self.scheduler.model
        if self.error is None and not model.decoupled and not self.complete:
            self.error = ensemble_deadlock(self.wiring.name)
        if self.error is not None:
            if top.rid in requests.inflight:
                requests.reject(top, self.error)
        else:
            if self.complete:
                self._respond(self.complete.pop(0), final=True)
            elif top.rid in requests.inflight:  # a decoupled ensemble's last word
                requests.respond(
                    top, Result(top.rid, True, [], None, None, Durations(*self.durations))
                )
            model.stats.queue.add(self.queue_ns)  # after the answer, before the next message
            model.stats.batch_done(top.batch_size, Durations(*self.durations))
        for key in list(self.tensors):  # what failed steps never read, an unsent answer
            while key in self.tensors:
                self._owed(key)
        if model.state is State.UNLOADING:
            self.scheduler.version_idle(model)


def _in_iteration(tensors: dict[Key, _Tensor], k: int) -> Callable[[str], bool]:
    """Whether a tensor of iteration ``k`` exists."""
    return lambda tensor: (tensor, k) in tensors


def _as_input(model: ModelVersion, name: str, entry: _Tensor) -> TensorRef:
    """A tensor as the step model's input ``name``, its batch dimension added or removed
    where one side batches and the other does not (Triton's ReshapeTensorDims)."""
    ref = entry.ref
    assert ref is not None
    spec = model.inputs.get(name)
    shape = ref.shape
    if spec is not None:
        shape = batch_reshape(spec, model.max_batch_size > 0, entry.batched, shape)
    return TensorRef(name, ref.datatype, list(shape), ref.region, ref.offset, ref.byte_size)


def composing(mv: ModelVersion, registry: Registry) -> list[ModelVersion] | None:
    """The versions an ensemble's steps run on now; None for a model that is not one."""
    scheduler = mv.scheduler
    if not isinstance(scheduler, EnsembleScheduler):
        return None
    found = []
    for step in scheduler.wiring.steps:
        version = step.model_version if step.model_version > 0 else ""
        try:
            found.append(registry.resolve(step.model_name, version))
        except InferpoolError:
            continue
    return found
