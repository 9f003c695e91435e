"""A worker's inference calls to other models (BLS): ``backends.model_calls.InferenceCalls`` over
the worker's channel.

A call goes to the broker as a ``Call`` message and is scheduled there like any request;
its replies come back as ``Replies``.  The channel is read by the main thread only: the
worker's loop between batches, or a call waited for on the main thread while the model
executes, which handles whatever else arrives meanwhile (a Free, a lane, a Stop) as the loop
would.
A call waited for on another thread sleeps until the main thread delivers its reply.  Code
that blocks the main thread without reading (a C backend's execute) runs through
``run_blocked``: a stand-in thread reads meanwhile (workers/call_pump.py).  A call
made on a ``HoldingThread`` (a lane's, whose executes the broker did not schedule) is sent
``held``: the broker keeps the instance to itself until the call ends.

Inputs that already lie in shared memory travel as references; other arrays are copied
once into this worker's output arena and freed when the call's final reply arrives.  A
reply's outputs are read-only views of the called worker's arena, lent until the last view
of each is gone; the broker is told (``Release``) with the next message this worker sends.
"""

from __future__ import annotations

import itertools
import logging
import select
import threading
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from inferpool.backends.model_calls import CallInput, CallReply, CallRequest
from inferpool.backends.request_io import InputTensor
from inferpool.wire import codec
from inferpool.wire.errors import Code, InferpoolError, internal, unavailable
from inferpool.wire.worker.link import Link
from inferpool.wire.worker.protocol import (
    BrokerMessage,
    Call,
    CancelCall,
    Query,
    Release,
    Replies,
    Result,
    Slot,
    Stop,
    TensorRef,
    WantedOutput,
    Work,
)
from inferpool.workers.call_pump import Kept, StandInReader
from inferpool.workers.memory import WorkerMemory

log = logging.getLogger("inferpool.worker")
RELEASE_CHUNK = 1000  # slots per Release message: far below a datagram's limit
OnMessage = Callable[[BrokerMessage], None]
T = TypeVar("T")


class HoldingThread(threading.Thread):
    """A thread that executes on the instance without the broker's knowing (a lane's): the
    calls its executes make say so, or the broker could hand the instance a batch or the
    call itself while the execute waits for it."""


class PendingCall:
    """One call: its replies as they arrive; the inputs it placed, freed with the last."""

    def __init__(self, calls: ChannelCalls, call_id: int, placed: list[Slot], keep: Any):
        self._calls = calls
        self.call_id = call_id
        self._replies: deque[CallReply] = deque()
        self._placed = placed
        self._keep = keep  # the caller's inputs: referenced until the final reply
        self._listener: Callable[[], None] | None = None
        self._taken_final = False

    def next(self) -> CallReply:
        if self._taken_final:
            raise internal("the call has already returned its final reply")
        self._calls.wait_for(self)
        reply = self._replies.popleft()
        self._taken_final = reply.final
        return reply

    def ready(self) -> bool:
        return bool(self._replies)

    def notify(self, listener: Callable[[], None] | None) -> None:
        self._listener = listener

    def cancel(self) -> None:
        """Give up on the call, unless its final reply is in: the broker cancels it; the
        replies up to its end still come (the last may be a CANCELLED error)."""
        if self._taken_final or (self._replies and self._replies[-1].final):
            return
        try:
            self._calls.link.send(CancelCall(self.call_id))
        except (InferpoolError, OSError) as exc:  # the broker is gone: the call ends anyway
            log.warning("the call %d could not be cancelled: %s", self.call_id, exc)

    def add(self, reply: CallReply) -> None:
        """A reply arrived (main thread)."""
        self._replies.append(reply)
        if reply.final:
            self.release()
        if self._listener is not None:
            self._listener()

    def release(self) -> None:
        """The call is over: free the inputs it placed, drop the caller's."""
        for slot in self._placed:
            self._calls.memory.release(slot.region, slot.offset)
        self._placed, self._keep = [], None


class ChannelCalls:
    """A worker's BLS calls over its channel to the broker."""

    def __init__(self, link: Link[BrokerMessage], memory: WorkerMemory, aside: OnMessage) -> None:
        """``aside`` handles what else arrives while a call is waited for on the main thread
        (a Free, a lane opened or closed) as the worker's loop would."""
        self.link = link
        self.memory = memory
        self._aside = aside
        self._main = threading.get_ident()
        self._calls: dict[int, PendingCall] = {}
        self._ids = itertools.count(1)
        self._arrived = threading.Condition()
        self._released: deque[Slot] = deque()  # lent reply slots no longer viewed
        self._viewed: dict[int, tuple[weakref.ref[np.ndarray], Slot]] = {}  # lent, viewed
        self.stopping = False  # a Stop arrived while a call was waited for
        self._closed = False
        self._reader = StandInReader(
            link.fileno(), self._read_kept, lambda: self._closed or self.stopping
        )

    # ------------------------------------------------------------------ calls
    def start(self, request: CallRequest, decoupled: bool) -> PendingCall:
        if self._closed or self.stopping:
            raise unavailable("the worker is stopping: no more calls can be made")
        refs, placed = self._place(request.inputs)
        call_id = next(self._ids)
        pending = PendingCall(self, call_id, placed, request.inputs)
        work = Work(
            call_id,
            request.id,
            request.correlation_id,
            request.flags,
            request.parameters,
            refs,
            [WantedOutput(name) for name in request.requested_outputs],
        )
        held = threading.get_ident() != self._main and isinstance(
            threading.current_thread(), HoldingThread
        )
        msg = Call(
            request.model_name,
            request.model_version,
            work,
            request.timeout_us,
            decoupled,
            held,
            request.parent,
        )
        self._send(pending, msg)
        return pending

    def query(self, model_name: str, model_version: int, labels: bool = False) -> dict[str, Any]:
        if self._closed or self.stopping:
            raise unavailable("the worker is stopping: the server cannot be asked")
        pending = PendingCall(self, next(self._ids), [], None)
        self._send(pending, Query(pending.call_id, model_name, model_version, labels))
        reply = pending.next()
        if reply.error is not None:
            raise reply.error
        return reply.parameters

    def _send(self, pending: PendingCall, msg: Call | Query) -> None:
        self._calls[pending.call_id] = pending
        try:
            self.flush()
            self.link.send(msg)
        except (InferpoolError, OSError) as exc:
            del self._calls[pending.call_id]
            pending.release()
            raise InferpoolError.wrap(
                exc, Code.UNAVAILABLE, "the call could not be sent: "
            ) from None
        if self._reader.blocked:
            self._reader.want()

    def run_blocked(self, function: Callable[..., T], *args: Any) -> T:
        if threading.get_ident() != self._main:  # a lane's thread: the main thread reads
            return function(*args)
        reader = self._reader
        reader.block()
        if self._calls:  # calls made before (by the model's own threads) still wait
            reader.want()
        try:
            return function(*args)
        finally:
            for msg in reader.unblock():
                self._aside(msg)

    def pending(self) -> int:
        return len(self._calls)

    def locate(self, address: int, nbytes: int) -> tuple[str, int] | None:
        return self.memory.locate(address, nbytes)

    def fileno(self) -> int:
        return self.link.fileno()

    def wait_for(self, call: PendingCall) -> None:
        """Until ``call`` has a reply: read the channel on the main thread, else sleep
        (while the main thread is blocked, the stand-in reads)."""
        reader = self._reader
        main = threading.get_ident() == self._main
        if main and not reader.blocked:
            while not call.ready():
                self._read(block=True)
            return
        if reader.is_current():  # a callback the stand-in runs waits: it reads on
            while not call.ready():
                self._read(True, reader.kept.append)
            return
        if main and reader.take():  # blocked, but here in Python: no hand-over needed
            try:
                while not call.ready():
                    self._read(True, reader.kept.append)
            finally:
                reader.give_back()
            if self._calls:  # calls of other threads still wait
                reader.want()
            return
        reader.want()
        with self._arrived:
            self._arrived.wait_for(call.ready)

    # ------------------------------------------------------------------ the channel
    def pump(self) -> None:
        """Handle the message waiting on the channel, if one does (main thread only)."""
        self._read(block=False)

    def _read_kept(self, keep: Kept) -> None:
        """The stand-in's read: messages other than replies are kept for the main thread."""
        self._read(False, keep)

    def _read(self, block: bool, aside: OnMessage | None = None) -> None:
        if not block and not select.select([self.link.fileno()], [], [], 0)[0]:
            return  # another reader took it first (an event loop's stale readiness)
        try:
            msg = self.link.recv()
        except InferpoolError as err:
            log.error("%s", err.message)
            return
        if msg is None:
            self._closed = True
            self._fail_all(unavailable("the broker closed the channel"))
        elif isinstance(msg, Replies):
            self.deliver(msg.items)
        elif isinstance(msg, Stop):
            self.stopping = True
            self._fail_all(unavailable("the worker was told to stop while the call waited"))
        else:
            (aside or self._aside)(msg)

    def deliver(self, items: Sequence[Result]) -> None:
        """Replies from the broker (main thread): each to its call."""
        for item in items:
            pending = self._calls.get(item.rid)
            if pending is None:  # the call was given up: its outputs go straight back
                self._released.extend(Slot(o.region, o.offset) for o in item.outputs)
                continue
            if item.final:
                del self._calls[item.rid]
            pending.add(self._reply(item))
        with self._arrived:
            self._arrived.notify_all()
        self.flush()

    def flush(self) -> None:
        """Tell the broker which lent slots are no longer viewed (any thread)."""
        while self._released:
            slots: list[Slot] = []
            while self._released and len(slots) < RELEASE_CHUNK:
                slots.append(self._released.popleft())
            self.link.send(Release(slots))

    def _fail_all(self, err: InferpoolError) -> None:
        calls, self._calls = self._calls, {}
        for pending in calls.values():
            pending.add(CallReply({}, {}, err, True))
        with self._arrived:
            self._arrived.notify_all()

    # ------------------------------------------------------------------ tensors
    def _reply(self, item: Result) -> CallReply:
        error = None if item.error is None else InferpoolError.from_wire(item.error)
        outputs: dict[str, InputTensor] = {}
        for ref in item.outputs:
            try:
                outputs[ref.name] = self._lent(ref)
            except InferpoolError as err:
                error = error or err
        return CallReply(outputs, dict(item.parameters or {}), error, item.final)

    def _lent(self, ref: TensorRef) -> InputTensor:
        """A lent output as a read-only view; the slot goes back once no view is left."""
        slot = Slot(ref.region, ref.offset)
        try:
            tensor = self.memory.input_tensor(ref, None)
        except InferpoolError:
            self._released.append(slot)
            raise
        if ref.datatype == "BYTES":  # decoded into Python objects: the slot is read already
            self._released.append(slot)
            return tensor
        root = tensor.data
        while isinstance(root.base, np.ndarray):
            root = root.base
        # a bare weak reference with a callback: a tenth of weakref.finalize's cost
        watch = weakref.ref(root, self._unviewed)
        self._viewed[id(watch)] = (watch, slot)
        return tensor

    def _unviewed(self, watch: weakref.ref[np.ndarray]) -> None:
        """The last view of a lent slot is gone (any thread): release it."""
        self._released.append(self._viewed.pop(id(watch))[1])

    def _place(self, inputs: Sequence[CallInput]) -> tuple[list[TensorRef], list[Slot]]:
        """References for the inputs; arrays not in shared memory are copied into it."""
        refs: list[TensorRef] = []
        placed: list[Slot] = []
        try:
            for inp in inputs:
                if inp.region:
                    region, offset, nbytes = inp.region, inp.offset, inp.byte_size
                else:
                    region, offset, nbytes = self._copy_in(inp)
                    placed.append(Slot(region, offset))
                refs.append(
                    TensorRef(inp.name, inp.datatype, list(inp.shape), region, offset, nbytes)
                )
        except BaseException:
            for slot in placed:
                self.memory.release(slot.region, slot.offset)
            raise
        return refs, placed

    def _copy_in(self, inp: CallInput) -> tuple[str, int, int]:
        array = codec.host_array(inp.data)
        if inp.datatype == "BYTES":
            payload = codec.serialize_bytes(np.asarray(array, dtype=np.object_).reshape(-1))
            region, offset, buf = self.memory.allocate(None, len(payload))
            memoryview(buf).cast("B")[:] = payload
            return region, offset, len(payload)
        source = np.ascontiguousarray(array, dtype=codec.numpy_dtype(inp.datatype))
        region, offset, buf = self.memory.allocate(None, source.nbytes)
        np.frombuffer(buf, dtype=np.uint8, count=source.nbytes)[:] = source.reshape(-1).view(
            np.uint8
        )
        return region, offset, source.nbytes
