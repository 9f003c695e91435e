"""The worker loop: receive batches from the broker, run the backend, send results back.

The broker and the worker speak the messages of ``wire.worker.protocol`` over this worker's
channel (``spec.channel_fd``, inherited): Execute, Free and Stop come in; Ready (or Failed)
goes out once, then one Done per batch, Items for results that come between (decoupled
models, backend threads), Mapped ahead of them when their requests opened clients' CUDA
regions, Traced ahead of Done when the batch had traced requests (``FLAG_TRACE``), and
Unmapped once the client regions it was told to unmap are closed.  LogChange changes how it
logs.  A model's
calls to other models (BLS) go out as Call and come back as Replies (workers/call_link.py).
LaneOpen and LaneClose go to the lanes (workers/lanes.py), whose threads execute under the
same lock as the batches.  docs/internals.md describes the exchange.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import select
import threading
from collections.abc import Sequence
from typing import Any

from inferpool.backends.api import Request, RequestedOutput, Response, batch_size_of, now_ns
from inferpool.backends.host import BackendHost
from inferpool.backends.reshape import OutputReshape, output_reshapes
from inferpool.backends.sequence import SequenceInputs
from inferpool.shm.cancel_flags import CancelFlags
from inferpool.wire import logs
from inferpool.wire.errors import InferpoolError, internal
from inferpool.wire.worker.link import Link, TooLarge
from inferpool.wire.worker.protocol import (
    FLAG_TRACE,
    MAX_MESSAGE,
    BatchStats,
    BrokerMessage,
    Done,
    Durations,
    Execute,
    Free,
    Items,
    LaneClose,
    LaneOpen,
    LaneTracing,
    LogChange,
    Mapped,
    Ready,
    Replies,
    Result,
    Slot,
    Stop,
    TensorRef,
    Traced,
    Unmapped,
    Work,
)
from inferpool.wire.worker.spec import WorkerSpec
from inferpool.workers import warmup
from inferpool.workers.call_link import ChannelCalls
from inferpool.workers.gpu_memory_check import check_load_limit
from inferpool.workers.lanes import Lanes
from inferpool.workers.memory import WorkerMemory, wanted_outputs
from inferpool.workers.pinning import cuda_ordinal, read_back
from inferpool.workers.region_link import ChannelRegions
from inferpool.workers.sequence_state import SequenceStates
from inferpool.workers.work_items import RequestPlans

log = logging.getLogger("inferpool.worker")
HOLD_POLL_S = 0.002  # how often the channel is read while a lane's execute holds the instance
_new = tuple.__new__  # a record per batch without its Python-level __new__


class Worker:
    """The worker process's loop: batches from the broker executed, results sent back."""

    def __init__(self, spec: WorkerSpec, link: Link[BrokerMessage]) -> None:
        self.spec = spec
        self.link = link
        # responses emitted from backend threads wake the loop through this pipe
        self._wake_rx, self._wake_tx = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wake_lock = threading.Lock()
        self._items: list[Result] = []  # results of the batch in execution
        self._item_requests: list[Request | None] = []  # their requests, for statistics
        self._async_items: list[Result] = []
        self._response_start: dict[int, int] = {}  # a decoupled request -> its last response
        self._in_execute = False
        self._main_thread = threading.get_ident()
        self.execute_lock = threading.Lock()  # one execute at a time: batches and lanes
        self.memory = WorkerMemory(spec.output_region, spec.instance.name, spec.output_prefault)
        self.flags = CancelFlags.attach(spec.cancel_region) if spec.cancel_region else None
        self._cancelled = self.flags.is_cancelled if self.flags is not None else None
        self.regions = ChannelRegions(link)
        self.calls = ChannelCalls(link, self.memory, self._aside)  # the model's BLS calls
        self.host = BackendHost(
            backend_name=spec.backend,
            model_name=spec.model_name,
            model_version=spec.model_version,
            config_json=spec.config_json,
            repository_path=spec.repository_path,
            artifact_path=spec.artifact_path,
            instance=dataclasses.replace(  # a GPU worker sees only its device
                spec.instance,
                cuda_ordinal=cuda_ordinal(
                    spec.instance.device_id, spec.pinning.cuda_visible_devices
                ),
            ),
            backend_directory=spec.backend_directory,
            backend_config=spec.backend_config,
            shared_regions=self.regions,
            calls=self.calls,
        )
        self.decoupled = False  # the rest is known once the model has completed its config
        self.batching = False
        self.reshapes: dict[str, tuple[int, ...]] = {}
        self.sequence: SequenceInputs | None = None  # control inputs and initial states
        self.output_reshapes: dict[str, OutputReshape] = {}
        self.states: SequenceStates | None = None  # sequence state, if the model keeps any
        self.plans: RequestPlans  # made with the rest
        self.lanes: Lanes | None = None
        self.lane_tracing = 0  # every how many lane requests are traced (LaneTracing)

    # ------------------------------------------------------------------ lifecycle
    def load(self) -> None:
        """Load the model and warm it up (raises InferpoolError, every level that loaded
        finalized)."""
        spec = self.spec
        try:
            self.host.load()
            check_load_limit(  # after the load, as Triton: the limit holds for what it took
                spec.model_name,
                spec.instance.device_id,
                cuda_ordinal(spec.instance.device_id, spec.pinning.cuda_visible_devices),
                spec.gpu_load_limit,
            )
            self._configure()
            warmup.run(
                self.host, self.memory, warmup.samples(self.host.config, spec.repository_path)
            )
        except InferpoolError:
            self.host.close()
            raise

    def serve(self) -> None:
        """Report ready, then serve until the broker says stop or goes away."""
        # the broker serves the config as the backend completed it (auto-complete)
        self.regions.loading = False
        self.link.send(Ready(read_back(), self.host.config_dict(), self.host.stats.memory_usage()))
        logs.serving()
        self.lanes = Lanes(self.host, self.memory, self.link, self.execute_lock, self.reshapes)
        self.lanes.tally.trace_every(self.lane_tracing)
        try:
            self._loop()
        finally:
            self.lanes.close_all()
            with self.execute_lock:  # a lane thread that overstayed is not executing
                self.host.close()
            self.memory.close()
            if self.flags is not None:
                self.flags.close()

    def _configure(self) -> None:
        """Read the loaded model's config: Model.set_config() may have completed it."""
        cfg = self.host.config
        self.decoupled = self.host.decoupled
        self.batching = cfg.max_batch_size > 0
        self.reshapes = {t.name: tuple(t.reshape.shape) for t in cfg.input if t.HasField("reshape")}
        self.output_reshapes = output_reshapes(cfg)
        self.sequence = SequenceInputs.of(cfg, self.spec.model_name, self.spec.repository_path)
        self.states = SequenceStates.of(cfg, self.memory, self.sequence)
        # outputs wanted in this worker's own region: one RequestedOutput each, shared
        wanted = {t.name: RequestedOutput(t.name) for t in cfg.output}
        self.plans = RequestPlans(self.memory, self.reshapes, self.batching, wanted)

    def _loop(self) -> None:
        """One message at a time.  A decoupled model's backend threads may answer between
        messages, so only then is the wake pipe polled beside the socket."""
        poller = select.poll()
        poller.register(self.link.fileno(), select.POLLIN)
        poller.register(self._wake_rx, select.POLLIN)
        sock_fd = self.link.fileno()
        watch_threads = self.decoupled
        while True:
            if watch_threads:
                events = dict(poller.poll())
                if self._wake_rx in events:
                    self._flush_async()
                if sock_fd not in events:
                    continue
            try:
                msg = self.link.recv()
            except InferpoolError as err:
                log.error("%s", err.message)
                continue
            if msg is None:
                log.error("the broker closed the channel; exiting")
                return
            if type(msg) is Execute:
                if msg.free or msg.unmap:
                    self._drop(msg.free, msg.unmap)
                self._execute(msg)
                if self._async_items:
                    self._flush_async()
                self.calls.flush()
                if self.calls.stopping:  # a Stop came while the batch waited for a call
                    return
            elif isinstance(msg, Replies):  # to calls made by the model's own threads
                self.calls.deliver(msg.items)
            elif isinstance(msg, Stop):
                return
            else:
                self._aside(msg)

    def _take_instance(self) -> None:
        """The execute lock.  A lane's execute that holds it may wait for a call's reply,
        which only this thread reads: the channel is read while the lock is waited for."""
        lock = self.execute_lock
        if lock.acquire(False):  # the common case: no lane holds it
            return
        while not lock.acquire(timeout=HOLD_POLL_S):
            self.calls.pump()

    def _aside(self, msg: BrokerMessage) -> None:
        """A message that needs no execute: between batches, or while one waits (for a
        call, or for the instance a lane's execute holds)."""
        if isinstance(msg, Free):
            self._free(msg)
        elif isinstance(msg, LaneOpen):
            assert self.lanes is not None
            self.lanes.open(msg)
        elif isinstance(msg, LaneClose):
            assert self.lanes is not None
            self.lanes.close(msg.lane, msg.free)
        elif isinstance(msg, LogChange):
            logs.apply(logs.settings_from(msg.settings))
        elif isinstance(msg, LaneTracing):
            self.lane_tracing = msg.rate
            if self.lanes is not None:
                self.lanes.tally.trace_every(msg.rate)
        else:
            log.error("unexpected %s message from the broker; ignored", type(msg).__name__)

    def _free(self, msg: Free) -> None:
        self._drop(msg.free, msg.unmap)
        if msg.release and self.states is not None:
            self.states.begin(msg.release)

    def _drop(self, free: Sequence[Slot], unmap: Sequence[str]) -> None:
        if free:
            self.memory.free(free)
        if unmap:
            self.memory.unmap(unmap)
            self.link.send(Unmapped(unmap))  # a CUDA unregister waits for it

    # ------------------------------------------------------------------ execution
    def _execute(self, msg: Execute) -> None:
        exec_start = now_ns()
        self.memory.batch += 1  # client regions are checked again, once each
        if self.states is not None:
            self.states.begin(msg.release)
        requests: list[Request] = []
        traced: list[int] | None = None
        for work in msg.requests:
            if work.flags & FLAG_TRACE:  # inferpool's: the backend sees Triton's flags
                work = work._replace(flags=work.flags ^ FLAG_TRACE)
                traced = [*(traced or ()), work.rid]
            try:
                request = self._request(work)
            except InferpoolError as err:
                self._items.append(Result(work.rid, True, (), None, err.to_wire()))
                self._item_requests.append(None)
                continue
            requests.append(request)
        if self.decoupled:  # a response's compute time runs from the one before it
            for request in requests:
                self._response_start[request.handle] = exec_start
        nulls = [self._null(requests[0]) for _ in msg.nulls] if requests and msg.nulls else ()
        for position, null in zip(msg.nulls, nulls, strict=False):
            requests.insert(min(position, len(requests)), null)
        compute_start = now_ns()
        host = self.host
        self._in_execute = True
        try:
            self._take_instance()
            try:
                if requests:
                    host.execute(requests)
                batches = host.take_batches()
            finally:
                self.execute_lock.release()
        finally:
            self._in_execute = False
        compute_end = now_ns()
        batch = _new(Durations, (compute_start - exec_start, compute_end - compute_start, 0))
        timings = host.stats.timings
        if traced is not None:
            batch_instants = (exec_start, compute_start, compute_end, compute_end)
            self._send_traced(traced, requests, timings, batch_instants)
        for null in nulls:
            timings.pop(id(null), None)
        items = []
        for item, owner in zip(self._items, self._item_requests, strict=True):
            timing = timings.pop(id(owner), None)  # None's id is no request's
            items.append(item.timed(batch if timing is None else timing.stamps.durations()))
        self._items, self._item_requests = [], []
        if not batches:
            size = sum(batch_size_of(r, self.batching) for r in requests) or len(msg.requests)
            batches = [BatchStats(size, batch)]
        self._send_done(items, batches)

    def _send_traced(
        self,
        traced: list[int],
        requests: list[Request],
        timings: dict[int, Any],
        batch: tuple[int, int, int, int],
    ) -> None:
        """The instants of the traced requests' execution, ahead of their results: those
        their backend reported, else the batch's."""
        stamps = []
        for request in requests:
            if request.handle in traced:
                timing = timings.get(id(request))
                stamps.append((request.handle, *(batch if timing is None else timing.stamps)))
        with contextlib.suppress(TooLarge):  # (a batch has at most a few hundred)
            self.link.send(Traced(stamps))

    def _send_done(self, items: list[Result], batches: list[BatchStats]) -> None:
        """One Done; results that would not fit in one datagram go ahead as Items."""
        self._say_opened()
        metrics = self.host.stats.drain_metrics()
        while len(items) > 1:
            try:
                self.link.send(Done(items, batches, metrics))
                return
            except TooLarge:
                half = len(items) // 2
                self._send_items(items[:half])
                items = items[half:]
        try:
            self.link.send(_new(Done, (items, batches, metrics)))
        except TooLarge:
            self.link.send(Done([self._too_large(item) for item in items], batches, metrics))

    def _send_items(self, items: list[Result]) -> None:
        self._say_opened()
        try:
            self.link.send(Items(items))
        except TooLarge:
            if len(items) == 1:
                self.link.send(Items([self._too_large(items[0])]))
                return
            half = len(items) // 2
            self._send_items(items[:half])
            self._send_items(items[half:])

    def _say_opened(self) -> None:
        """Tell the broker of the CUDA regions opened since it was last told, before the
        results of the requests that opened them."""
        if self.memory.opened:
            self.link.send(Mapped(self.memory.take_opened()))

    def _too_large(self, item: Result) -> Result:
        """A result too large for a datagram (its parameters) becomes an error."""
        for out in item.outputs:
            self.memory.release(out.region, out.offset)
        err = internal(
            f"response of request handle {item.rid} is too large for the worker channel "
            f"({MAX_MESSAGE} bytes); send large data as outputs, not parameters"
        )
        return Result(item.rid, item.final, (), None, err.to_wire(), item.durations)

    def _request(self, work: Work) -> Request:
        inputs, wanted = self.plans.of(work)
        if self.sequence is not None:
            self.sequence.add_controls(inputs, work.correlation_id, work.flags, 1, True, work.id)
            if self.states is not None:
                self.states.feed(work, inputs, wanted)
        return Request(
            id=work.id,
            inputs=inputs,
            requested_outputs=wanted,
            memory=self.memory,
            emit=self._emit,
            correlation_id=work.correlation_id,
            flags=work.flags,
            parameters=work.parameters,
            decoupled=self.decoupled,
            priority=work.priority,
            timeout_us=work.timeout_us,
            handle=work.rid,
            cancelled=self._cancelled,
            pass_on_thread=self._main_thread,  # its answers leave before `requests` goes
        )

    def _null(self, like: Request) -> Request:
        """A null request of direct sequence batching: ``like``'s inputs, READY false, its
        answers dropped (it holds a batch slot that has no request); its outputs go to this
        worker's region, never into ``like``'s client's."""
        assert self.sequence is not None
        owned = self.sequence.owned
        inputs = {n: t for n, t in like.inputs.items() if n not in owned}
        self.sequence.add_controls(inputs, 0, 0, ready=False)
        self.sequence.add_initial_states(inputs)
        return Request(
            id="",
            inputs=inputs,
            requested_outputs={n: RequestedOutput(n) for n in like.requested_outputs},
            memory=self.memory,
            emit=_drop_answer,
            decoupled=self.decoupled,
            handle=0,
        )

    def _emit(self, request: Request, response: Response | None, final: bool) -> None:
        """Called by ResponseSender: turn a response into a result for the broker."""
        sent = now_ns() if self.decoupled else 0
        item = self._result(request, response, final)
        if self.decoupled:  # Triton's response statistics: producing it, delivering it
            starts = self._response_start
            begun = starts.pop(request.handle, sent) if final else starts.get(request.handle, sent)
            end = now_ns()
            item = item.timed(Durations(0, sent - begun, end - sent))
            if not final:
                starts[request.handle] = end
        if threading.get_ident() == self._main_thread and self._in_execute:
            if self.decoupled:
                self._send_items([item])
            else:
                self._items.append(item)
                self._item_requests.append(request)
            return
        with self._wake_lock:
            self._async_items.append(item)
        with contextlib.suppress(BlockingIOError):  # a full pipe already means "wake up"
            os.write(self._wake_tx, b"!")

    def _result(self, request: Request, response: Response | None, final: bool) -> Result:
        if self.states is not None:
            self.states.keep(request, response, final)
        if response is None:
            return _new(Result, (request.handle, final, (), None, None, None))
        if response.error is not None:
            response.discard()
            return Result(request.handle, final, (), None, response.error.to_wire())
        outputs = []
        for out, shape in wanted_outputs(
            self.memory, request, response, self.output_reshapes, self.batching
        ):
            ref = (out.name, out.datatype, shape, out.region, out.offset, out.byte_size)
            outputs.append(_new(TensorRef, ref))
        result = (request.handle, final, outputs, response.parameters or None, None, None)
        return _new(Result, result)

    def _flush_async(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_rx, 4096):
                pass
        with self._wake_lock:
            items, self._async_items = self._async_items, []
        if items:
            self._send_items(items)


def _drop_answer(request: Request, response: Response | None, final: bool) -> None:
    if response is not None:
        response.discard()
