"""Tracing requests as Triton does: the timestamps of each stage of a sampled request.

A request the settings sample (``models.trace_settings``) gets a :class:`Trace` at
admission: REQUEST_START (admitted) and QUEUE_START (queued); its worker reports the
instants of its execution (COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START,
COMPUTE_END: the ``Traced`` message, for the requests whose work carries ``FLAG_TRACE``);
REQUEST_END when it ends.  A request that came through a KServe frontend carries the
frontend's receive stamps, and its answer tells the frontend its trace id so that the send
stamps follow (``wire.trace_stamps``).  An ensemble's steps and the calls a model makes
(BLS) get traces of their own whose ``parent_id`` is the request's.  At the TENSORS level
the inputs a request queued with and the outputs its backend answered are recorded too.
A trace is written with its children once it is complete, or once it has waited
:data:`GRACE_NS` for a late part; the settings decide where (``models.trace_file``).
Nothing here runs for a request that is not traced: the request path asks ``Tracer.on``
and ``PendingRequest.trace``, nothing more.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from inferpool.broker.models.registry import Instance
from inferpool.broker.models.request import PendingRequest, Sink
from inferpool.broker.models.trace_file import Record, TraceFile
from inferpool.broker.models.trace_settings import TraceSetting, TraceSettings
from inferpool.wire import codec
from inferpool.wire.errors import InferpoolError
from inferpool.wire.trace_stamps import NAMES, TRACE_ID
from inferpool.wire.worker.protocol import FLAG_TRACE, LaneTracing, Result, TensorRef, encoded

SETTLE_NS = 20_000_000  # an ended trace's worker stamps may follow its last response
GRACE_NS = 2_000_000_000  # how long an ended trace waits for its frontend or children
COMPUTE = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")


class Replies(Protocol):
    """Where a client request's answers go (the front's responder)."""

    def result(self, req: PendingRequest, item: Result) -> None: ...

    def send_error(
        self, envelope: list[Any], msg_type: str, request_id: Any, err: InferpoolError
    ) -> None: ...


class Trace:
    """One traced request: its identity, its timestamps, its tensors, its children."""

    __slots__ = (
        "children",
        "ended_ns",
        "frontend",
        "id",
        "model",
        "parent",
        "request_id",
        "rid",
        "root",
        "setting",
        "stamps",
        "tensors",
        "version",
    )

    def __init__(
        self,
        trace_id: int,
        rid: int,
        setting: TraceSetting,
        model: str,
        version: int,
        request_id: str,
        parent: Trace | None = None,
    ) -> None:
        self.id = trace_id
        self.rid = rid  # its request's
        self.setting = setting
        self.model = model
        self.version = version
        self.request_id = request_id
        self.parent = 0 if parent is None else parent.id
        self.root: Trace = self if parent is None else parent.root
        self.children: list[Trace] = []  # (a root's: every trace under it)
        self.stamps: list[tuple[str, int]] = []
        self.tensors: list[Record] = []
        self.ended_ns = 0
        self.frontend = False  # its frontend's send stamps are still to come

    def records(self) -> list[Record]:
        """Triton's records of this trace: who it is, then one per timestamp, in time
        order, then its tensors."""
        head: Record = {"id": self.id, "model_name": self.model, "model_version": self.version}
        if self.request_id:
            head["request_id"] = self.request_id
        if self.parent:
            head["parent_id"] = self.parent
        stamps = sorted(self.stamps, key=lambda s: s[1])
        return [
            head,
            *({"id": self.id, "timestamps": [{"name": n, "ns": ns}]} for n, ns in stamps),
            *self.tensors,
        ]


class Tracer:
    """The traces of the server's run: sampling, their stamps, writing them out."""

    def __init__(
        self,
        start: TraceSetting,
        model_ready: Callable[[str], bool],
        replies: Replies,
        read: Callable[[TensorRef], Any],
        workers: Callable[[], Iterable[Instance]],
    ) -> None:
        """``start``: the command line's setting; ``model_ready(name)``: whether a model may
        be named in a setting; ``replies``: where a client request's answers go;
        ``read(ref)``: the bytes of a tensor in shared memory the broker maps (None if it
        does not), for TENSORS; ``workers``: the live workers, told how many of their lane
        requests to trace."""
        self.settings = settings = TraceSettings(start, model_ready, self.retired)
        self.file = TraceFile(start.file) if start.file else None
        self.replies = replies
        self.read = read
        self.workers = workers
        self.lane_rates: dict[str, int] = {}  # worker identity -> the rate it was told
        self.on = settings.on  # whether any setting traces: the one question asked per request
        self._ids = itertools.count(1)
        # rid -> the trace of a request, until it is written (a worker's instants of a
        # decoupled model's request may come after its last response)
        self.open: dict[int, Trace] = {}
        self.ended: list[Trace] = []  # roots that ended, until they are complete
        self.unwritten: list[Trace] = []  # roots for the trace file: written at each flush
        self.waiting: dict[int, Trace] = {}  # trace id -> root waiting for its frontend

    # ------------------------------------------------------------------ settings
    def answer(self, model: str, changes: Mapping[str, Any] | None) -> dict[str, Any]:
        """The ``trace_setting`` message's answer, after its changes."""
        try:
            return self.settings.answer(model, changes)
        finally:
            self._changed()

    def _changed(self) -> None:
        """The settings changed (a client, a count that ran out): whether anything is
        traced, and how many of its lane requests each worker traces."""
        self.settings.changed()
        self.on = self.settings.on
        alive = {handle.identity: handle for handle in self.workers()}
        self.lane_rates = {k: v for k, v in self.lane_rates.items() if k in alive}
        for handle in alive.values():
            self._tell(handle)

    def _tell(self, handle: Instance) -> None:
        """Tell ``handle``'s worker the rate its lanes trace at, if that changed."""
        setting = self.settings.of(handle.model.name)
        rate = setting.rate if not setting.why_invalid() else 0
        if self.lane_rates.get(handle.identity, 0) != rate:
            self.lane_rates[handle.identity] = rate
            handle.send(LaneTracing(rate))

    def retired(self, setting: TraceSetting) -> None:
        """A change replaced ``setting``: what it kept goes out (its traces still running
        are written as they end)."""
        setting.retired = True
        self._spill(setting)

    # ------------------------------------------------------------------ starting
    def start(self, req: PendingRequest, frontend: Any, now_ns: int) -> None:
        """Sample a client request as it is queued (``now_ns``); ``frontend``: its KServe
        frontend's receive stamps (name -> ns), if it came through one."""
        setting = self.settings.of(req.model.name)
        if not setting.sample():
            return
        if setting.count == 0:  # the last one it may take
            self._changed()
        trace = self._new(req, setting, None)
        trace.stamps += (("REQUEST_START", req.received_ns), ("QUEUE_START", now_ns))
        if isinstance(frontend, dict):
            for name, ns in frontend.items():
                if name in NAMES and type(ns) is int:
                    trace.stamps.append((name, ns))
                    trace.frontend = True
        self._watch(req, trace, trace.frontend)

    def child(self, req: PendingRequest, parent: Trace, now_ns: int) -> None:
        """``req``, made by the broker for a traced request (an ensemble's step, a model's
        call), is traced as its child as it is queued (``now_ns``)."""
        trace = self._new(req, parent.setting, parent)
        trace.stamps += (("REQUEST_START", req.received_ns), ("QUEUE_START", now_ns))
        self._watch(req, trace, True)  # it ends as it answers, before its parent can

    def _new(self, req: PendingRequest, setting: TraceSetting, parent: Trace | None) -> Trace:
        model = req.model
        trace_id = next(self._ids)
        trace = Trace(trace_id, req.rid, setting, model.name, model.version, req.work.id, parent)
        if parent is not None:
            trace.root.children.append(trace)
        req.trace = trace
        if req.wire is not None:  # its worker reports its execution's instants
            req.work = req.work._replace(flags=req.work.flags | FLAG_TRACE)
            req.wire, _ = encoded(req.work)  # (the same size: the flag is one digit)
        self.open[req.rid] = trace
        return trace

    def _watch(self, req: PendingRequest, trace: Trace, answers: bool) -> None:
        """Hear ``req``'s answers where the trace needs them (``answers``; TENSORS: its
        outputs): it ends as its final answer leaves, and its frontend learns its id."""
        tensors = "TENSORS" in trace.setting.level
        if tensors:
            self._tensors(trace, "TENSOR_QUEUE_INPUT", req.work.inputs)
        if tensors or answers:
            req.sink = TracedAnswers(self, req.sink)

    def _tensors(self, trace: Trace, activity: str, refs: Iterable[TensorRef]) -> None:
        for ref in refs:
            data = self.read(ref)
            trace.tensors.append(
                {
                    "id": trace.id,
                    "activity": activity,
                    "tensor": {
                        "name": ref.name,
                        "data": "" if data is None else tensor_text(data, ref),
                        "shape": ",".join(map(str, ref.shape)),
                        "dtype": ref.datatype,
                    },
                }
            )

    # ------------------------------------------------------------------ reports
    def lane(self, handle: Instance, traces: Iterable[Sequence[int]]) -> None:
        """Lane requests ``handle``'s worker traced (LaneStats): each one a trace, while its
        model's setting traces and its count lasts."""
        model = handle.model
        setting = self.settings.of(model.name)
        for request_id, sent, *instants, end in traces:
            if setting.why_invalid():
                break
            setting.count -= setting.count > 0
            setting.sampled += 1
            trace_id = next(self._ids)
            trace = Trace(trace_id, 0, setting, model.name, model.version, str(request_id))
            trace.stamps += (("REQUEST_START", sent), ("QUEUE_START", sent))
            trace.stamps += (*zip(COMPUTE, instants, strict=False), ("REQUEST_END", end))
            trace.ended_ns = end
            self._collect(trace)
        if setting.count == 0:
            self._changed()
        self._tell(handle)  # (a worker started since the last change learns it here)

    def executed(self, rid: int, instants: Iterable[int]) -> None:
        """A worker's instants of request ``rid``'s execution (the ``Traced`` message)."""
        trace = self.open.get(rid)
        if trace is not None:
            trace.stamps += zip(COMPUTE, instants, strict=False)

    def answered(self, req: PendingRequest, item: Result) -> Result:
        """One answer of a traced request on its way (its outputs at TENSORS; its trace id,
        for its frontend, with the final one)."""
        trace = req.trace
        assert trace is not None
        if "TENSORS" in trace.setting.level and item.error is None:
            self._tensors(trace, "TENSOR_BACKEND_OUTPUT", item.outputs)
        if not item.final:
            return item
        if trace.frontend and item.error is None:
            self.waiting[trace.id] = trace
            item = item._replace(parameters={**(item.parameters or {}), TRACE_ID: trace.id})
        self.end(req, time.monotonic_ns())
        return item

    def sent(self, trace_id: Any, stamps: Any) -> None:
        """A frontend's send stamps of the trace ``trace_id`` (the ``trace_sent`` message)."""
        trace = self.waiting.pop(trace_id, None) if type(trace_id) is int else None
        if trace is None or not isinstance(stamps, dict):
            return
        for name, ns in stamps.items():
            if name in NAMES and type(ns) is int:
                trace.stamps.append((name, ns))
        trace.frontend = False
        if trace.ended_ns and trace in self.ended and _complete(trace):
            self.ended.remove(trace)
            self._collect(trace)

    def end(self, req: PendingRequest, now_ns: int) -> None:
        """``req`` ended (answered, failed or cancelled)."""
        trace = req.trace
        if trace is None or trace.ended_ns:
            return
        trace.stamps.append(("REQUEST_END", now_ns))
        trace.ended_ns = now_ns
        if trace.root is trace:
            if trace.frontend and trace.id not in self.waiting:
                trace.frontend = False  # answered with an error: no send stamps will come
            if _complete(trace) and not req.model.decoupled:
                self._collect(trace)  # (a decoupled model's worker may still report)
            else:
                self.ended.append(trace)

    # ------------------------------------------------------------------ writing
    def flush(self, now_ns: int, final: bool = False) -> None:
        """Write the traces that are complete, and those that waited long enough."""
        keep = []
        for root in self.ended:
            age = now_ns - root.ended_ns
            if final or (_complete(root) and age >= SETTLE_NS) or age >= GRACE_NS:
                self.waiting.pop(root.id, None)
                self._collect(root)
            else:
                keep.append(root)
        self.ended = keep
        if final:
            for setting in self.settings.all():
                self._spill(setting)
        if self.unwritten and self.file is not None:  # one write for all of them
            self.file.append(_records(self.unwritten))
        self.unwritten = []
        if final and self.file is not None:
            self.file.close()

    def _collect(self, root: Trace) -> None:
        """A finished trace and its children, as its setting says (Triton's WriteTrace)."""
        for trace in (root, *root.children):
            self.open.pop(trace.rid, None)
        setting = root.setting
        setting.collected += 1
        setting.pending.append(root)
        if setting.retired:
            self._spill(setting)
        elif setting.log_frequency and len(setting.pending) >= setting.log_frequency:
            self._write(setting, indexed=True)
        elif setting.count == 0 and setting.collected >= setting.sampled:
            self._write(setting, indexed=True)  # its count ran out: all of them, apart
        elif not setting.log_frequency and setting.count < 0:
            self._write(setting, indexed=False)  # (Triton's at shutdown: the same records)

    def _spill(self, setting: TraceSetting) -> None:
        """What ``setting`` still keeps, written: apart if it has a log frequency."""
        self._write(setting, indexed=bool(setting.log_frequency))

    def _write(self, setting: TraceSetting, indexed: bool) -> None:
        """What ``setting`` keeps: to the next indexed file now, or to the trace file with
        the next flush."""
        roots, setting.pending = setting.pending, []
        if not roots or self.file is None:
            return
        if indexed:
            self.file.indexed(_records(roots))
        else:
            self.unwritten += roots


def _records(roots: Iterable[Trace]) -> Iterator[Record]:
    """Triton's records of finished traces, each with its children."""
    for root in roots:
        for trace in (root, *root.children):
            yield from trace.records()


def _complete(root: Trace) -> bool:
    """Whether an ended trace has every part it waits for: its frontend's send stamps, its
    children's ends."""
    return not root.frontend and all(child.ended_ns for child in root.children)


class TracedAnswers:
    """A traced request's answers pass here on their way to its client or its sink."""

    def __init__(self, tracer: Tracer, inner: Sink | None) -> None:
        self.tracer = tracer
        self.inner = inner

    def result(self, req: PendingRequest, item: Result) -> None:
        item = self.tracer.answered(req, item)
        (self.inner or self.tracer.replies).result(req, item)

    def failed(self, req: PendingRequest, err: InferpoolError) -> None:
        self.tracer.end(req, time.monotonic_ns())
        if self.inner is not None:
            self.inner.failed(req, err)
        elif not req.cancelled:
            self.tracer.replies.send_error(req.envelope, "infer", req.client_id, err)


def tensor_text(data: Any, ref: TensorRef) -> str:
    """A tensor's elements as Triton's trace writes them: comma-separated (BYTES elements
    quoted; FP16 and BF16 left empty, as Triton leaves them)."""
    if ref.datatype in ("FP16", "BF16"):
        return ""
    count = codec.element_count(ref.shape)
    if ref.datatype == "BYTES":
        values = codec.deserialize_bytes(data, count)
        return ",".join('"' + v.decode("utf-8", "replace") + '"' for v in values)
    array = codec.array_from_buffer(data, ref.datatype, ref.shape, ref.name)
    if ref.datatype == "BOOL":
        return ",".join("1" if v else "0" for v in array.ravel().tolist())
    return ",".join(map(str, array.ravel().tolist()))
