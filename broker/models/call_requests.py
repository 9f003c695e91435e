"""Models' calls to other models (BLS): a worker's ``Call`` becomes a request that the broker
schedules like a client's (dynamic batching included), and its answers go back to the caller
as ``Replies``.

- The called model must be ready, and a decoupled one needs a decoupled call: otherwise the
  caller gets Triton's error at once.
- A reply's outputs stay where the called model wrote them; the caller reads them in place
  and says when it has finished (``Release``), or its end does.
- A call with a timeout is answered TIMEOUT once it has passed; what comes later is dropped.
- No call can deadlock the pool: a call that could only run on instances that are waiting,
  directly or through other calls, for that very call (a model calling itself with one
  instance, two models calling each other) is refused at once (``_progresses``).  A call
  made by a lane's execute (``held``) takes its instance out of scheduling until it ends: the
  broker did not schedule that execute, so it would otherwise see the instance idle.
- A worker may ask what the broker knows of a served model (``Query``: its readiness,
  config and metadata, for a C backend's ``TRITONSERVER_ServerModel*`` calls): answered at
  once, with Triton's error for a model that is not served.
- A caller may give up on a call (``CancelCall``): it is cancelled as a client's request
  is (models/cancellation.py), and the call ends with the answer that brings.
"""

from __future__ import annotations

import heapq
import itertools
import json
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from inferpool.broker.models.ensemble import composing
from inferpool.broker.models.internal import make_request
from inferpool.broker.models.registry import Instance, ModelVersion, Registry
from inferpool.broker.models.request import PendingRequest
from inferpool.broker.models.tracer import Tracer
from inferpool.broker.pool.handle import WorkerState
from inferpool.broker.pool.output_regions import OutputRegions
from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.worker.protocol import Call, CancelCall, Query, Release, Replies, Result

_GONE = (WorkerState.FAILED, WorkerState.STOPPING, WorkerState.STOPPED)
_order = itertools.count()  # ties in the deadline heap


class Requests(Protocol):
    """What calls ask of the request path (``models.request_path``)."""

    inflight: dict[int, PendingRequest]
    tracer: Tracer

    def submit(self, req: PendingRequest, now_ns: int) -> None: ...

    def hold(self, handle: Instance) -> None:
        """A lane's execute on ``handle`` made a call: take the instance until it ends."""
        ...

    def unhold(self, handle: Instance) -> None:
        """A held call ended."""
        ...


class _Call:
    """One call in flight: the request the broker made for it is its sink."""

    def __init__(self, calls: Calls, caller: Instance, call: Call, model: ModelVersion) -> None:
        self.calls = calls
        self.caller = caller
        self.identity = caller.identity  # the process that made it (a respawn is another)
        self.call_id = call.work.rid
        self.model = model
        self.timeout_us = call.timeout_us
        self.held = call.held  # its instance is out of scheduling until the call ends
        self.over = False  # answered finally (or its caller is gone)
        self.req: PendingRequest | None = None  # the request made for it, once made

    def result(self, req: PendingRequest, item: Result) -> None:
        outputs = self.calls.outputs
        if self.over or not self.calls.reply(self, item._replace(rid=self.call_id)):
            for out in item.outputs:
                outputs.free(out.region, out.offset, held=False)
            return
        for out in item.outputs:  # lent to the caller until it releases them
            outputs.lend(out.region)
        if item.final:
            self.calls.ended(self)

    def failed(self, req: PendingRequest, err: InferpoolError) -> None:
        self.answer(err)

    def answer(self, err: InferpoolError) -> None:
        """End the call with an error (unless it is over)."""
        if not self.over:
            self.calls.reply(self, Result(self.call_id, True, [], None, err.to_wire()))
            self.calls.ended(self)


class Calls:
    """The calls workers make to other models (BLS), from the call to its last reply."""

    def __init__(
        self,
        requests: Requests,
        outputs: OutputRegions,
        registry: Registry,
        cancel_request: Callable[[PendingRequest, str], None],
    ) -> None:
        """``cancel_request``: how a request is cancelled for whoever made it
        (``Cancellation.cancel_part``)."""
        self.requests = requests
        self.outputs = outputs
        self.registry = registry
        self.cancel_request = cancel_request
        self.waiting: dict[Instance, dict[int, _Call]] = {}  # caller -> calls not answered
        self.lent: dict[Instance, dict[tuple[str, int], int]] = {}  # caller -> slots it reads
        self._deadlines: list[tuple[int, int, _Call]] = []

    # ------------------------------------------------------------------ from workers
    def call(self, caller: Instance, msg: Call) -> None:
        """A worker's call: checked, then queued on the called model."""
        now = time.monotonic_ns()
        name = msg.model_name
        try:
            model = self._model(name, msg.model_version, msg.decoupled)
        except InferpoolError as err:
            self._refuse(caller, msg, err)
            return
        call = _Call(self, caller, msg, model)
        self.waiting.setdefault(caller, {})[call.call_id] = call
        if call.held:
            self.requests.hold(caller)
        work = msg.work
        deadline = now + msg.timeout_us * 1000 if msg.timeout_us > 0 else 0
        try:
            if not self._progresses(model, frozenset()):
                raise InferpoolError(
                    Code.UNAVAILABLE,
                    f"the call from instance '{caller.name}' of model '{caller.model.name}' "
                    f"would never run: every instance of model '{name}' is waiting, directly "
                    "or through other BLS calls, for it to finish (a model that calls itself, "
                    "or models that call each other, need an instance that is not waiting: "
                    "raise the instance_group count)",
                )
            req = make_request(
                model,
                work.inputs,
                work.outputs,
                call,
                request_id=work.id,
                correlation_id=work.correlation_id,
                flags=work.flags,
                parameters=work.parameters,
                now_ns=now,
                deadline_ns=deadline,
            )
        except InferpoolError as err:
            self.ended(call)
            self._refuse(caller, msg, err)
            return
        call.req = req
        outputs = self.outputs
        for ref in work.inputs:  # the called worker maps the regions it reads
            outputs.lend(ref.region)
        if deadline:
            heapq.heappush(self._deadlines, (deadline, next(_order), call))
        parent = self.requests.inflight.get(msg.parent) if msg.parent else None
        if parent is not None and parent.trace is not None and parent.worker is caller:
            self.requests.tracer.child(req, parent.trace, now)  # trace=request.trace()
        self.requests.submit(req, now)

    def query(self, caller: Instance, msg: Query) -> None:
        """What the broker knows of the model ``msg`` names, or the error Triton gives."""
        try:
            model = self.registry.resolve(msg.model_name, msg.model_version)
        except InferpoolError as err:
            caller.send(Replies([Result(msg.call, True, [], None, err.to_wire())]))
            return
        metadata = model.metadata()
        record = self.registry.records[model.name]
        metadata["versions"] = [v.version_str for v in record.ready_versions()]
        facts = {
            "ready": True,  # resolve() gives ready versions only
            "decoupled": model.decoupled,
            "max_batch_size": model.max_batch_size,
            "version": model.version,
            "config": json.dumps(model.config_dict()),
            "metadata": json.dumps(metadata),
        }
        if msg.labels:
            facts["labels"] = dict(model.labels.by_output)
        caller.send(Replies([Result(msg.call, True, [], facts)]))

    def cancel(self, caller: Instance, msg: CancelCall) -> None:
        """The caller gave up on a call (a decoupled call's ``cancel()``, as in Triton): its
        request leaves its queue (answered CANCELLED), or its backend sees ``is_cancelled()``
        and its own answer ends the call.  A call already answered is left alone."""
        call = self.waiting.get(caller, {}).get(msg.call)
        if call is None or call.over or call.req is None:
            return
        self.cancel_request(call.req, "was cancelled by the model that called it")

    def release(self, caller: Instance, msg: Release) -> None:
        """The caller has finished reading lent slots."""
        lent = self.lent.get(caller, {})
        outputs = self.outputs
        for slot in msg.slots:
            key = (slot.region, slot.offset)
            count = lent.get(key, 0)
            if count:
                lent[key] = count - 1
                if count == 1:
                    del lent[key]
                outputs.free(slot.region, slot.offset, held=False)

    def passed_on(self, caller: Instance, items: Sequence[Result]) -> Sequence[Result]:
        """A caller's results, where it answers with a reply's outputs in place: each such
        slot gets one more owner (the response) and goes back to its worker once both the
        response and the caller are done with it.  An output in memory neither the
        caller's nor lent to it fails its result (the worker must not name it), and so does
        a reply whose region went with its worker (the called instance died since: a lent
        slot does not keep the region); an output written into a client's registered
        region is the client's and passes as it is."""
        lent = self.lent.get(caller)
        if lent is None:  # no reply lent to it: nothing to pass on
            return items
        own = caller.output_region
        outputs = self.outputs
        checked = list(items)
        for i, item in enumerate(checked):
            # the broker's regions go by bare names, a client's by a reference ("sys/...")
            foreign = [o for o in item.outputs if o.region != own and "/" not in o.region]
            if not foreign:
                continue
            if not all(lent.get((o.region, o.offset), 0) > 0 for o in foreign):
                err = InferpoolError(
                    Code.INTERNAL,
                    f"instance '{caller.name}' answered with an output in memory that is "
                    "neither its own nor a reply lent to it",
                )
            elif gone := [o.name for o in foreign if o.region not in outputs]:
                err = InferpoolError(
                    Code.UNAVAILABLE,
                    f"instance '{caller.name}' answered with output '{gone[0]}' as a call "
                    "returned it, but the instance that computed it has exited since and "
                    "its memory is gone",
                )
            else:
                for out in foreign:
                    outputs.share(out.region, out.offset, 1)
                continue
            for out in item.outputs:
                if out.region == own:
                    outputs.free(out.region, out.offset, held=False)
            checked[i] = Result(item.rid, item.final, [], None, err.to_wire(), item.durations)
        return checked

    def worker_gone(self, caller: Instance) -> None:
        """A caller's process ended: its calls are dropped, what it read goes back."""
        for call in list(self.waiting.pop(caller, {}).values()):
            call.over = True
        caller.held = 0
        outputs = self.outputs
        for (region, offset), count in self.lent.pop(caller, {}).items():
            for _ in range(count):
                outputs.free(region, offset, held=False)

    def tick(self, now_ns: int) -> None:
        """Calls whose timeout has passed are answered TIMEOUT."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now_ns:
            _, _, call = heapq.heappop(deadlines)
            call.answer(
                InferpoolError(
                    Code.TIMEOUT,
                    f"Request timeout expired: the call to model '{call.model.name}' did not "
                    f"finish within its timeout of {call.timeout_us} us",
                )
            )

    # ------------------------------------------------------------------ replies
    def reply(self, call: _Call, item: Result) -> bool:
        """Send ``item`` to the caller; False if the caller is gone."""
        caller = call.caller
        if caller.identity != call.identity or caller.channel is None:
            self.ended(call)
            return False
        lent = self.lent.setdefault(caller, {})
        for out in item.outputs:
            key = (out.region, out.offset)
            lent[key] = lent.get(key, 0) + 1
        caller.exec_started = time.monotonic()  # progress: its execute timeout starts over
        caller.send(Replies([item]))
        return True

    def ended(self, call: _Call) -> None:
        call.over = True
        mine = self.waiting.get(call.caller)
        if mine is not None and mine.get(call.call_id) is call:
            del mine[call.call_id]
            if not mine:
                del self.waiting[call.caller]
            if call.held:
                self.requests.unhold(call.caller)

    def _refuse(self, caller: Instance, msg: Call, err: InferpoolError) -> None:
        text = f"Model {msg.model_name} - Error when running inference: {err.message}"
        error = InferpoolError(err.code, text).to_wire()
        caller.send(Replies([Result(msg.work.rid, True, [], None, error)]))

    # ------------------------------------------------------------------ checks
    def _model(self, name: str, version: int, decoupled: bool) -> ModelVersion:
        try:
            model = self.registry.resolve(name, "" if version < 0 else version)
        except InferpoolError as err:
            if err.code is Code.INVALID_ARG:
                raise
            raise InferpoolError(
                err.code,
                f"Failed for execute the inference request. Model '{name}' is not ready.",
            ) from None
        if model.decoupled and not decoupled:
            raise InferpoolError(
                Code.INVALID_ARG,
                f"Model {name} is using the decoupled. The current BLS request call doesn't "
                "support models using the decoupled transaction policy. Please use "
                "'decoupled=True' argument to the 'exec' or 'async_exec' calls for decoupled "
                "models.'",
            )
        return model

    def _progresses(self, model: ModelVersion, path: frozenset[Any]) -> bool:
        """Whether a request of ``model`` can run some day: some instance is not waiting for
        calls, or waits only for calls that can (``path``: instances already waited upon)."""
        steps = composing(model, self.registry)
        if steps is not None:  # an ensemble runs when each of its steps can
            return all(self._progresses(step, path) for step in steps)
        for handle in model.instances:
            if handle.passive or handle.state in _GONE:
                continue
            taken = handle.busy is not None or handle.held
            calls = self.waiting.get(handle) if taken else None
            if not calls:
                return True
            if handle in path:
                continue
            inner = path | {handle}
            if all(self._progresses(c.model, inner) for c in calls.values()):
                return True
        return False
