"""The client's protocol core, without I/O, the way h11 and wsproto keep protocol state apart
from sockets.

It builds every request a client sends (an :class:`Exchange`: the header and tensor frames,
and how to read an answer), matches each response to its request by ``id``, decodes results
and errors, and knows the client's endpoint and whether a server has answered there.
:class:`~inferpool.client.sync.Client` and :class:`~inferpool.client.aio.AsyncClient` only
move its bytes over a zmq socket and wait the way their callers wait.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypedDict, TypeVar

import numpy as np
import zmq

from inferpool.client.control_calls import Call
from inferpool.client.endpoint import Handshake, parse_endpoint
from inferpool.client.response_plans import (
    PLANS,
    UNPLANNED,
    Key,
    PlannedHeader,
    ResponsePlan,
    split_id,
)
from inferpool.wire import codec
from inferpool.wire.errors import Code, InferpoolError

DEFAULT_TIMEOUT = 60.0
TEMPLATES = 64  # infer signatures a client keeps the header of; all dropped when full
_FIXED = frozenset(codec.numpy_dtype(d) for d in codec.DATATYPES if d != "BYTES")
T = TypeVar("T")
Header = dict[str, Any]
Message = tuple[Header, list[Any]]  # a response: its header and its tensor frames
Inputs = Mapping[str, Any]  # input name -> numpy array, torch tensor, list or scalar
Outputs = Sequence[str] | Sequence[dict[str, Any]] | None  # names, or entries with parameters


class InferOptions(TypedDict, total=False):
    """An infer request's options beyond model, inputs and outputs."""

    version: str | int  # "" (or absent): the highest ready version
    parameters: Mapping[str, Any] | None  # request parameters (sequence_id, priority, ...)
    datatypes: Mapping[str, str] | None  # an input's wire datatype, where numpy's won't do
    timeout: float | None  # seconds to wait for a response (None: the client's timeout)


@dataclass
class InferResult:
    """One response: outputs by name (read-only arrays over the received bytes) and parameters."""

    model_name: str
    model_version: str
    outputs: dict[str, np.ndarray]
    parameters: dict[str, Any] = field(default_factory=dict)
    id: Any = ""

    @property
    def final(self) -> bool:
        return bool(self.parameters.get("triton_final_response", True))

    @property
    def streamed(self) -> bool:
        """Whether a stream yields it: all but an empty final response (the end marker)."""
        return bool(self.outputs) or not self.final

    def as_numpy(self, name: str) -> np.ndarray:
        return self.outputs[name]


def encode_inputs(
    inputs: Inputs, datatypes: Mapping[str, str] | None = None
) -> tuple[list[dict[str, Any]], list[Any]]:
    """Input descriptors and their frames (zero-copy buffers for fixed-size types)."""
    specs: list[dict[str, Any]] = []
    frames: list[Any] = []
    given = datatypes or {}
    for name, value in inputs.items():
        datatype = given.get(name)
        if datatype is None and type(value) is np.ndarray:  # the common case, in one step
            fixed = codec.fixed_datatype(value.dtype)
            if fixed is not None:
                specs.append({"name": name, "datatype": fixed, "shape": list(value.shape)})
                frames.append(np.ascontiguousarray(value).data)
                continue
        arr = codec.as_array(value, datatype)
        datatype = datatype or codec.datatype_of(arr.dtype)
        specs.append({"name": name, "datatype": datatype, "shape": list(arr.shape)})
        frames.append(codec.tensor_bytes(arr, datatype))
    return specs, frames


def infer_header(
    model: str,
    inputs: list[dict[str, Any]],
    outputs: Outputs,
    version: str | int = "",
    parameters: Mapping[str, Any] | None = None,
) -> Header:
    """The header of an ``infer`` message."""
    header: Header = {
        "type": "infer",
        "model_name": model,
        "model_version": str(version) if version not in (None, "") else "",
        "inputs": inputs,
    }
    if outputs:
        header["outputs"] = [o if isinstance(o, dict) else {"name": o} for o in outputs]
    if parameters:
        header["parameters"] = dict(parameters)
    return header


def header_template(header: Header) -> bytes:
    """``header`` encoded up to its ``id``, which goes last: the header frame of a request is
    this, the id (digits) and ``"}``, so a request sent again is encoded only once."""
    if "id" in header:
        header = {k: v for k, v in header.items() if k != "id"}
    body = codec.encode_header(header)
    return body[:-1] + (b',"id":"' if len(body) > 2 else b'"id":"')


def extended(template: bytes, name: str, value: Any) -> bytes:
    """A ``header_template`` with one more field (not in its header) before the id: what
    ``header_template({**header, name: value})`` gives, without encoding the rest again."""
    return b"".join((template[:-6], codec.encode_header({name: value})[1:-1], b',"id":"'))


def _framed(
    model: str, inputs: Inputs, outputs: Outputs, version: str | int, stream: bool
) -> tuple[Any, list[Any]]:
    """What an infer request's header follows from (hashable), and its inputs' frames as
    encode_inputs frames them; (None, []) when its inputs are not all numpy arrays of a
    fixed-size native datatype (others, byte-swapped ones among them, are converted as
    they are framed) or its outputs carry parameters."""
    outs: Any = None
    if outputs:
        outs = tuple(outputs)
        if not all(type(o) is str for o in outs):
            return None, []
    key: list[Any] = [model, version, outs, stream]
    frames = []
    for name, value in inputs.items():
        dtype = value.dtype if type(value) is np.ndarray else None
        if dtype not in _FIXED:
            return None, []
        key.append((name, dtype, value.shape))
        frames.append(np.ascontiguousarray(value).data)
    return tuple(key), frames


def decode_result(message: Message) -> InferResult:
    """An infer response as outputs over its frames, or the error it carries, raised (a
    planned header's outputs as its plan says, client.response_plans)."""
    header, frames = message
    outputs = header.plan.arrays(frames) if type(header) is PlannedHeader else None
    if outputs is None:
        outputs = _outputs(header, frames)
    return InferResult(
        header.get("model_name", ""),
        str(header.get("model_version", "")),
        outputs,
        header.get("parameters") or {},
        header.get("id", ""),
    )


def _outputs(header: Header, frames: list[Any]) -> dict[str, np.ndarray]:
    if "error" in header:
        codec.raise_for_error(header)
    outputs: dict[str, np.ndarray] = {}
    specs = header.get("outputs") or ()
    count = len(frames)
    taken = 0
    for spec in specs:
        if spec.get("parameters") and codec.in_shared_memory(spec):
            continue  # it stayed in shared memory: no frame carries it
        if taken == count:
            framed = sum(1 for o in specs if not codec.in_shared_memory(o))
            raise InferpoolError(
                Code.INTERNAL, f"response lists {framed} outputs but carries {count} frames"
            )
        frame = frames[taken]
        taken += 1
        name = spec["name"]
        outputs[name] = codec.array_from_buffer(
            frame.buffer if type(frame) is zmq.Frame else frame,
            spec["datatype"],
            spec["shape"],
            f"output '{name}'",
        )
    return outputs


def checked(message: Message) -> Header:
    """A control response's header, or the error it carries, raised."""
    codec.raise_for_error(message[0])
    return message[0]


def _as_sent(message: Message) -> Message:
    return message


class Exchange(Generic[T]):
    """One request: what to send, how to read a response, how long to wait for one, the
    responses not read yet."""

    __slots__ = (
        "cancellable",
        "done",
        "frames",
        "header",
        "id",
        "limit",
        "read",
        "replies",
        "sent",
    )

    def __init__(
        self,
        request_id: str,
        header: bytes,
        frames: Sequence[Any],
        read: Callable[[Message], T],
        limit: float,
    ) -> None:
        self.id = request_id
        self.header = header  # the encoded header frame (after the empty delimiter)
        self.frames = frames  # the tensor frames, sent without a copy
        self.read = read
        self.limit = limit  # seconds each wait (to send, for a response) may take
        self.replies: list[Message | InferpoolError] = []  # few: a list is cheapest
        self.done = False  # its final response (or an error) has been taken
        self.sent = False  # it left the client (the server may be working on it)
        self.cancellable = False  # an infer request: one given up on is cancelled


class ClientCore:
    """One client's protocol state: request ids, the requests waiting for responses, the
    endpoint and its handshake.  Not thread-safe, like the socket it serves."""

    def __init__(self, endpoint: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.handshake = Handshake(parse_endpoint(endpoint))
        self.endpoint = self.handshake.endpoint.url
        self.timeout = timeout
        self.closed = False
        self._ids = itertools.count(1)
        self._waiting: dict[str, Exchange[Any]] = {}
        self._templates: dict[Any, bytes] = {}  # infer signature -> its header
        self._plans: dict[
            Key, ResponsePlan
        ] = {}  # infer responses' headers (client.response_plans)
        self._unplanned = 0  # infer responses to decode before learning plans again

    # ------------------------------------------------------------------ requests
    def open(
        self,
        header: Header,
        frames: Sequence[Any],
        read: Callable[[Message], T],
        timeout: float | None = None,
    ) -> Exchange[T]:
        """A request with the next id, waiting for its responses from now on."""
        return self.prepared(header_template(header), frames, read, timeout)

    def prepared(
        self,
        template: bytes,
        frames: Sequence[Any],
        read: Callable[[Message], T],
        timeout: float | None = None,
    ) -> Exchange[T]:
        """A request whose header ``header_template`` encoded: it gets the next id."""
        if self.closed:
            raise InferpoolError(Code.CANCELLED, "the client is closed")
        request_id = f"{next(self._ids)}"
        limit = self.timeout if timeout is None else timeout
        header = b"".join((template, request_id.encode(), b'"}'))
        exchange = Exchange(request_id, header, frames, read, limit)
        self._waiting[request_id] = exchange
        return exchange

    def infer(
        self,
        model: str,
        inputs: Inputs,
        outputs: Outputs = None,
        *,
        version: str | int = "",
        parameters: Mapping[str, Any] | None = None,
        datatypes: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stream: bool = False,
    ) -> Exchange[InferResult]:
        """An infer request; fixed-size inputs go as zero-copy frames.  It takes exactly one
        response (``single_response``: the server refuses a decoupled model up front, so no
        response is dropped) unless it is a ``stream``, which reads every response.

        A request like an earlier one (same model, version, outputs, and inputs: numpy
        arrays of the same names, dtypes and shapes; no parameters, no datatypes) reuses
        that one's encoded header: only its inputs' frames and its id are new."""
        key, frames = (
            (None, [])
            if parameters or datatypes
            else _framed(model, inputs, outputs, version, stream)
        )
        template = self._templates.get(key)  # never one for None
        if template is None:
            specs, frames = encode_inputs(inputs, datatypes)
            header = infer_header(model, specs, outputs, version, parameters)
            if not stream:
                header["single_response"] = True
            template = header_template(header)
            if key is not None:
                if len(self._templates) >= TEMPLATES:
                    self._templates.clear()
                self._templates[key] = template
        exchange = self.prepared(template, frames, decode_result, timeout)
        exchange.cancellable = True
        return exchange

    def control(self, call: Call[T], timeout: float | None = None) -> Exchange[T]:
        """A control message (client.control_calls) whose answer is read as ``call`` says."""
        header = {"type": call.type, **call.fields}
        return self.open(header, call.frames, lambda m: call.read(checked(m)), timeout)

    def call(
        self, msg_type: str, fields: Mapping[str, Any], timeout: float | None = None
    ) -> Exchange[Header]:
        """Any control message; its answer is the response header, error-checked."""
        return self.open({"type": msg_type, **fields}, (), checked, timeout)

    def raw(self, header: Header, frames: Sequence[Any] = ()) -> Exchange[Message]:
        """A message as given, answered as received (errors not raised): for protocol tests."""
        return self.open(dict(header), frames, _as_sent)

    def goodbye(self) -> list[Exchange[Any]]:
        """What a closing client sends before it closes (nothing: the shm session says more)."""
        return []

    # ------------------------------------------------------------------ responses
    def receive(self, parts: list[Any]) -> Exchange[Any] | None:
        """File one received message with the request it answers; None when it answers none
        waiting (a request given up on) or is not a message of the protocol.  An infer
        response whose header a plan knows is filed without decoding it (client.response_plans)."""
        if len(parts) < 2 or len(parts[0]) != 0:
            return None
        raw = parts[1].bytes
        split = split_id(raw) if self._plans else None
        if split is not None:
            plan = self._plans.get(split[0])
            if plan is not None and plan.usable:
                request_id = split[1].decode()
                exchange = self._waiting.get(request_id)
                if exchange is None:
                    return None
                if exchange.read is decode_result:
                    exchange.replies.append((plan.header_for(request_id), parts[2:]))
                    return exchange
        try:
            header = codec.decode_header(raw)
        except InferpoolError:
            return None
        exchange = self._waiting.get(str(header.get("id")))
        if exchange is not None:
            exchange.replies.append((header, parts[2:]))
            if exchange.read is decode_result:
                self._learn(raw, header, split)
        return exchange

    def _learn(self, raw: bytes, header: Header, split: tuple[Key, bytes] | None) -> None:
        """Plan the response ``header`` decoded from ``raw``, or confirm a plan learnt from
        one like it; a plan is used once confirmed (client.response_plans says why)."""
        if self._unplanned:  # resting: PLANS different headers filled the plans
            self._unplanned -= 1
            return
        split = split or split_id(raw)
        if split is None:
            return
        key, digits = split
        known = self._plans.get(key)
        if known is not None:
            known.confirm(header, digits)
        elif len(self._plans) < PLANS:
            self._plans[key] = ResponsePlan(header, digits)
        else:  # headers that differ each time (other shapes, parameters): rest a while
            self._plans.clear()
            self._unplanned = UNPLANNED

    def take(self, exchange: Exchange[Any]) -> Message:
        """The next response received for ``exchange`` (it has one); after the final one the
        request waits no more."""
        got = exchange.replies.pop(0)
        if isinstance(got, InferpoolError):
            exchange.done = True
            raise got
        params = got[0].get("parameters")
        if not params or params.get("triton_final_response", True):
            exchange.done = True
            self._waiting.pop(exchange.id, None)
        return got

    def waiting(self, request_id: str) -> Exchange[Any]:
        return self._waiting[request_id]

    def forget(self, exchange: Exchange[Any]) -> None:
        """Stop waiting for ``exchange`` (given up on, or read all that was wanted)."""
        self._waiting.pop(exchange.id, None)

    def cancel(self, exchange: Exchange[Any]) -> bytes | None:
        """Give up on ``exchange``: the header of the ``cancel`` message that stops the
        server's work on it, or None when there is nothing to stop (not an inference, not
        sent, or answered in full).  The message has no ``id``: its answer is not waited
        for, and the CANCELLED answer to the request is dropped with it."""
        self.forget(exchange)
        if exchange.done or not exchange.sent or not exchange.cancellable:
            return None
        exchange.done = True
        return codec.encode_header({"type": "cancel", "request_id": exchange.id})

    def close(self) -> list[Exchange[Any]]:
        """No more requests; every request still waiting gets CANCELLED (returned, to wake)."""
        self.closed = True
        err = InferpoolError(Code.CANCELLED, "the client was closed")
        waiting = list(self._waiting.values())
        for exchange in waiting:
            exchange.replies.append(err)
        self._waiting.clear()
        return waiting

    # ------------------------------------------------------------------ time
    def limit(self, timeout: float | None) -> float:
        return self.timeout if timeout is None else timeout

    def timed_out(self, what: str, limit: float) -> InferpoolError:
        """TIMEOUT: ``what`` ("no response from", "could not send to") the endpoint in time."""
        return InferpoolError(Code.TIMEOUT, f"{what} {self.endpoint} within {limit:g}s")


class Retry:
    """Asking until a server is ready (wait_ready): no answer yet, or no server yet, means
    ask again after a pause, until the deadline.  Use each attempt as a ``with`` block."""

    PAUSE = 0.05

    def __init__(self, endpoint: str, timeout: float) -> None:
        self._endpoint = endpoint
        self._timeout = timeout
        self._deadline = time.monotonic() + timeout

    def attempt(self) -> float:
        """How long one attempt may wait."""
        return min(1.0, max(0.05, self._deadline - time.monotonic()))

    def pause(self) -> float:
        """How long to pause before the next attempt; TIMEOUT once the deadline is past."""
        if time.monotonic() >= self._deadline:
            raise InferpoolError(
                Code.TIMEOUT, f"{self._endpoint} not ready within {self._timeout:g}s"
            )
        return self.PAUSE

    def __enter__(self) -> Retry:
        return self

    def __exit__(self, kind: object, err: BaseException | None, tb: object) -> bool:
        return isinstance(err, InferpoolError) and err.code in (Code.TIMEOUT, Code.UNAVAILABLE)
