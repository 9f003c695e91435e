"""What a backend's execute() sees and produces: requests, their inputs, and responses.

Inputs are zero-copy views of shared memory; a response allocates its outputs in shared
memory (through the worker's OutputMemory) and the backend writes into them in place.
Every response leaves through Request._deliver, which keeps the answer-exactly-once rule
and, when outputs were written into device memory (a client's CUDA region), first waits
for the device to finish writing them: copies on a GPU are queued on a stream, and the
client must not be told its outputs are there before they are.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from inferpool.shm import cuda
from inferpool.wire import codec
from inferpool.wire.errors import Code, InferpoolError, internal, invalid_arg, not_found
from inferpool.wire.worker.protocol import FLAG_SEQUENCE_END, FLAG_SEQUENCE_START

ParameterValue = str | int | bool | float


now_ns = time.monotonic_ns  # the clock of every statistic a backend reports
_NO_DEVICES: frozenset[int] = frozenset()


@dataclass(eq=False)  # no slots: a plan holds it weakly (weakref_slot needs Python 3.11)
class InputTensor:
    """One input of a request.

    ``data`` is a zero-copy view of shared memory: a read-only numpy array for CPU memory
    (an object array of ``bytes`` for BYTES), or a device array for GPU memory.  An input
    is a view of one place: two are the same input only when they are the same object (the
    worker hands out one object for every request that names the same place, until the
    memory is unmapped: ``WorkerMemory.batch_input``, a lane's plan).
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: Any
    byte_size: int
    memory: str = "cpu"  # "cpu" or "gpu"
    device_id: int = 0
    #: where the bytes lie in shared memory ("" when nowhere shared), so that a model's
    #: inference call (BLS) can pass the input on without copying it
    region: str = ""
    offset: int = 0
    #: what a backend made of ``data`` (the pytorch backend: ``(data, maker, tensor)``), kept
    #: with this object and so for as long as its view: made once per place, not per request
    made: Any = field(default=None, repr=False)

    def as_numpy(self) -> np.ndarray:
        if self.memory != "cpu":
            raise InferpoolError(Code.UNSUPPORTED, f"input '{self.name}' is in GPU memory")
        return self.data


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for; ``target`` places it in a client-registered region."""

    name: str
    target: Any = None  # set by the worker for outputs written into a client's region
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class OutputTensor:
    """An output a response carries: where its bytes live in shared memory."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    region: str
    offset: int
    byte_size: int
    memory: str = "cpu"


class OutputMemory(Protocol):
    """Where responses put outputs: the worker's output arena (or a client's region)."""

    def allocate(self, output: RequestedOutput | None, nbytes: int) -> tuple[str, int, Any]:
        """Return (region name, offset, writable buffer of ``nbytes``) or raise InferpoolError."""
        ...

    def release(self, region: str, offset: int) -> None: ...

    def slot_views(self, region: str) -> dict[Any, Any] | None:
        """Views over the outputs allocated in ``region`` that may be kept and made once
        per slot (:meth:`Response.output_view`), or None where none may be kept.  The
        memory drops the dict whenever the memory its views see stops being that slot's
        (the region unmapped, a buffer given up)."""
        ...


# ============================================================================ responses
_SIZES: dict[tuple[str, Any], tuple[np.dtype[Any], int, tuple[int, ...]]] = {}
_REMEMBERED = 64  # output shapes whose size is kept
_SLOT_VIEWS = 64  # views a region's slots keep, at most (then they are made afresh)
_V = TypeVar("_V")


def _size(
    name: str, datatype: str, shape: Sequence[int]
) -> tuple[np.dtype[Any], int, tuple[int, ...]]:
    """The numpy dtype, byte size and shape (of ints) of output ``name``, kept under the
    shape as ints: any tuple equal to it finds it then (a torch.Size, a numpy shape)."""
    if datatype == "BYTES":
        raise invalid_arg(f"output '{name}': use set_output() for BYTES tensors")
    ints = tuple(map(int, shape))
    dtype = codec.numpy_dtype(datatype)
    known = dtype, dtype.itemsize * math.prod(ints), ints
    if len(_SIZES) >= _REMEMBERED:
        _SIZES.clear()
    _SIZES[(datatype, ints)] = known
    return known


class Response:
    """The answer to one request: outputs written in place, parameters, or an error.

    Made for every request on every path: slots, no instance dict."""

    __slots__ = ("_request", "devices", "error", "outputs", "parameters")

    def __init__(self, request: Request, error: InferpoolError | None = None) -> None:
        self._request = request
        self.outputs: dict[str, OutputTensor] = {}
        self.parameters: dict[str, ParameterValue] = {}
        self.error = error
        # GPUs outputs were written on, waited for on delivery: a set once there is one
        self.devices: set[int] | frozenset[int] = _NO_DEVICES

    @classmethod
    def from_error(cls, request: Request, error: BaseException | str) -> Response:
        if isinstance(error, str):
            error = InferpoolError(Code.INTERNAL, error)
        return cls(request, InferpoolError.wrap(error))

    def output(self, name: str, shape: Sequence[int], datatype: str) -> np.ndarray:
        """Allocate output ``name`` in shared memory and return a writable array over it.

        Write the result straight into the returned array: no further copy is made.  When
        the client asked for the output in its CUDA region this is a device (cupy) array.
        """
        try:  # a shape given as a tuple (torch.Size is one), met before: worked out then
            dtype, nbytes, dims = _SIZES[(datatype, shape)]
        except (KeyError, TypeError):  # TypeError: a list (unhashable), always worked out
            dtype, nbytes, dims = _size(name, datatype, shape)
        return _array(self._place(name, datatype, dims, nbytes)[2], dtype, dims)

    def output_view(
        self, name: str, shape: Sequence[int], datatype: str, make: Callable[[Any], _V]
    ) -> _V:
        """:meth:`output` as ``make(array)``: another view of the same memory
        (``torch.from_numpy``), made once per output slot where the memory keeps views
        (``OutputMemory.slot_views``) and handed out again whenever an output of the same
        datatype and shape takes that slot.  Only write the output's elements through it:
        the object is shared with the slot's later outputs, so never change it (its
        shape, its storage) nor keep it after the response is sent."""
        try:
            dtype, nbytes, dims = _SIZES[(datatype, shape)]
        except (KeyError, TypeError):
            dtype, nbytes, dims = _size(name, datatype, shape)
        region, offset, buf = self._place(name, datatype, dims, nbytes)
        views = self._request._memory.slot_views(region)
        if views is None:
            return make(_array(buf, dtype, dims))
        # the slot (its offset in this region's views), what it holds and how it is viewed:
        # all that decides the view's memory and shape
        key = (offset, datatype, dims, make)
        view = views.get(key)
        if view is None:
            if len(views) >= _SLOT_VIEWS:
                views.clear()
            view = views[key] = make(_array(buf, dtype, dims))
        return view

    def set_output(self, name: str, value: Any, datatype: str | None = None) -> None:
        """Copy an array (or a list of str/bytes for BYTES) into output ``name``.

        A device array (cupy, torch on a GPU) is copied by the device, never through numpy.
        BYTES are serialized in host memory and copied as they are to where the output goes:
        into a client's CUDA region too, as Triton's backends write strings.
        """
        if codec.device_of(value) is not None:
            datatype = datatype or codec.datatype_of(value.dtype)
            if datatype == "BYTES":
                raise invalid_arg(f"output '{name}': BYTES tensors cannot be in GPU memory")
            copy_into(self.output(name, tuple(value.shape), datatype), value)
            return
        arr = codec.as_array(value, datatype)
        datatype = datatype or codec.datatype_of(arr.dtype)
        if datatype == "BYTES":
            payload = codec.serialize_bytes(arr.reshape(-1))
            buf = self._place(name, datatype, arr.shape, len(payload))[2]
            if type(buf) is memoryview or not hasattr(buf, "__cuda_array_interface__"):
                memoryview(buf).cast("B")[: len(payload)] = payload
            else:  # a client's CUDA region: awaited before the answer, as any GPU write
                copy_into(buf, np.frombuffer(payload, np.uint8))
        else:
            copy_into(self.output(name, arr.shape, datatype), arr)

    def pass_on(self, name: str, datatype: str, data: Any, lent: tuple[str, int, int]) -> bool:
        """Answer output ``name`` with ``data``, a BLS reply's output (host memory) lying at
        ``lent`` (region, offset, byte size), where it lies: no copy.  False, with nothing
        done, where the answer cannot name another worker's memory (a lane's request, a
        response sent from another thread than the worker's, an output into a client's
        region): copy it then (:meth:`set_output`).  The request keeps ``data`` until it is
        over, so that the slot is not given back before the broker has the response."""
        request = self._request
        if request.pass_on_thread != threading.get_ident() or name in self.outputs:
            return False
        wanted = request.requested_outputs.get(name)
        if wanted is not None and wanted.target is not None:
            return False
        region, offset, nbytes = lent
        self.outputs[name] = OutputTensor(name, datatype, data.shape, region, offset, nbytes)
        if request.kept is None:
            request.kept = []
        request.kept.append(data)
        return True

    def allocate(self, name: str, datatype: str, shape: Sequence[int], nbytes: int) -> Any:
        """Allocate ``nbytes`` for output ``name`` and return its buffer (a C backend's
        TRITONBACKEND_OutputBuffer): a memoryview of host memory, or a device array.  For
        BYTES the size is the serialized tensor's; for the other types it must be the
        shape's."""
        if datatype != "BYTES":
            try:  # a shape met before (a tuple): worked out then
                expected = _SIZES[(datatype, shape)][1]
            except (KeyError, TypeError):
                expected = _size(name, datatype, shape)[1]
            if nbytes != expected:
                raise invalid_arg(
                    f"output '{name}': {nbytes} bytes asked for a {datatype} tensor of shape "
                    f"{list(shape)}, which holds {expected}"
                )
        return self._place(name, datatype, tuple(map(int, shape)), nbytes)[2]

    def set_parameter(self, name: str, value: ParameterValue) -> None:
        if not isinstance(value, str | int | bool | float):
            raise invalid_arg(f"response parameter '{name}' must be str, int, bool or float")
        self.parameters[name] = value

    def _place(
        self, name: str, datatype: str, shape: tuple[int, ...], nbytes: int
    ) -> tuple[str, int, Any]:
        """Allocate ``nbytes`` for output ``name`` of ``shape`` (a tuple of ints, kept as it
        is): its region, offset and buffer."""
        if name in self.outputs:
            raise invalid_arg(f"output '{name}' was already set in this response")
        requested = self._request.requested_outputs.get(name)
        placed = self._request._memory.allocate(requested, nbytes)
        region, offset, buf = placed
        self.outputs[name] = OutputTensor(name, datatype, shape, region, offset, nbytes)
        if type(buf) is not memoryview:  # host memory comes as a memoryview: no device
            device = codec.device_of(buf)
            if device is not None:
                self.devices = {*self.devices, device}
        return placed

    def discard(self) -> None:
        """Give back every output's memory (used when a response is not sent)."""
        for out in self.outputs.values():
            self._request._memory.release(out.region, out.offset)
        self.outputs.clear()


def _array(buf: Any, dtype: np.dtype[Any], dims: tuple[int, ...]) -> Any:
    """An output's buffer as an array of its dtype and shape: numpy over host memory (one
    call: frombuffer and reshape cost two), cupy over a client's CUDA region."""
    if type(buf) is not memoryview and hasattr(buf, "__cuda_array_interface__"):
        return buf.view(dtype).reshape(dims)
    return np.ndarray(dims, dtype, buf)


class ResponseSender:
    """Sends responses for one request from any thread: one final response, or a stream
    when the model is decoupled."""

    def __init__(self, request: Request) -> None:
        self._request = request
        self._lock = threading.Lock()

    def send(self, response: Response | None = None, final: bool = False) -> None:
        """Send ``response`` (may be None with ``final``); ``final`` closes the request."""
        with self._lock:
            self._request._deliver(response, final)

    def fail(self, error: InferpoolError) -> None:
        with self._lock:
            self._request._close_with(error)

    @property
    def final(self) -> bool:
        return self._request._final

    def is_cancelled(self) -> bool:
        """Whether the client cancelled the request (TRITONBACKEND_ResponseFactoryIsCancelled)."""
        return self._request.is_cancelled()


class Request:
    """A request as the backend sees it: inputs as views of shared memory, outputs to fill."""

    __slots__ = (
        "_cancelled",
        "_emit",
        "_final",
        "_memory",
        "_sender",
        "_sent",
        "correlation_id",
        "decoupled",
        "flags",
        "handle",
        "id",
        "inputs",
        "kept",
        "parameters",
        "pass_on_thread",
        "priority",
        "requested_outputs",
        "timeout_us",
    )

    def __init__(
        self,
        *,
        id: str,
        inputs: dict[str, InputTensor],
        requested_outputs: dict[str, RequestedOutput],
        memory: OutputMemory,
        emit: Callable[[Request, Response | None, bool], None],
        correlation_id: int | str = 0,
        flags: int = 0,
        parameters: dict[str, Any] | None = None,
        decoupled: bool = False,
        priority: int = 0,
        timeout_us: int = 0,
        handle: Any = None,
        cancelled: Callable[[Any], bool] | None = None,
        pass_on_thread: int = 0,
    ) -> None:
        """``cancelled(handle)`` says whether the client has cancelled the request (the
        worker's reads the broker's marks, shm.cancel_flags); None: it cannot be.
        ``pass_on_thread``: the thread whose responses may answer with a BLS reply's
        outputs in place (:meth:`Response.pass_on`; 0: none may)."""
        self.id = id
        self.handle = handle  # opaque to backends: the worker's key for routing the answer
        self.inputs = inputs
        self.requested_outputs = requested_outputs
        self.correlation_id = correlation_id
        self.flags = flags
        self.parameters = parameters or {}
        self.decoupled = decoupled
        self.priority = priority
        self.timeout_us = timeout_us
        self._memory = memory
        self._emit = emit
        self._cancelled = cancelled
        self.pass_on_thread = pass_on_thread
        self.kept: list[Any] | None = None  # views of BLS replies its responses pass on
        self._sender: ResponseSender | None = None  # made (with its lock) only when asked for
        self._sent = 0
        self._final = False

    def _deliver(self, response: Response | None, final: bool) -> None:
        """The one place a response leaves: checks the answer-exactly-once contract, and
        waits for outputs written on a GPU before they are announced."""
        if self._final:
            raise internal(f"request '{self.id}' already received its final response")
        if response is None:
            if not final:
                raise invalid_arg("send() needs a response or final=True")
        elif self._sent and not self.decoupled:
            raise internal(f"request '{self.id}' is not decoupled: only one response is allowed")
        else:
            self._sent += 1
            if response.devices:
                response = _settled(response)
        self._final = final
        self._emit(self, response, final)

    def _close_with(self, error: InferpoolError) -> None:
        if not self._final:
            self._final = True
            self._emit(self, Response(self, error), True)

    def is_cancelled(self) -> bool:
        """Whether the client has cancelled this request (TRITONBACKEND_RequestIsCancelled).

        Cheap enough to ask between steps of a long execute: a backend that sees True may
        stop and answer with a CANCELLED error; the client has its answer already.
        """
        return self._cancelled is not None and self._cancelled(self.handle)

    def input(self, name: str) -> InputTensor:
        try:
            return self.inputs[name]
        except KeyError:
            raise not_found(f"request '{self.id}' has no input '{name}'") from None

    def has_input(self, name: str) -> bool:
        return name in self.inputs

    def output_requested(self, name: str) -> bool:
        return name in self.requested_outputs

    def response(self) -> Response:
        """A new, empty response for this request."""
        return Response(self)

    def response_sender(self) -> ResponseSender:
        """Take over answering this request (decoupled streams, or answering later)."""
        if self._sender is None:
            self._sender = ResponseSender(self)
        return self._sender

    @property
    def sender_taken(self) -> bool:
        return self._sender is not None

    @property
    def answered(self) -> bool:
        return self._final

    def respond(self, response: Response) -> None:
        """Send the one, final response (what execute()'s returned list does per request)."""
        if self._sender is None:
            self._deliver(response, True)
        else:
            self._sender.send(response, final=True)

    def fail(self, error: InferpoolError) -> None:
        """Answer with an error (final) unless already answered; used by the worker."""
        if self._sender is None:
            self._close_with(error)
        else:
            self._sender.fail(error)

    @property
    def sequence_start(self) -> bool:
        return bool(self.flags & FLAG_SEQUENCE_START)

    @property
    def sequence_end(self) -> bool:
        return bool(self.flags & FLAG_SEQUENCE_END)


def _settled(response: Response) -> Response:
    """``response`` once the GPUs have finished writing its outputs, or the error why not."""
    devices, response.devices = response.devices, _NO_DEVICES
    try:
        cuda.synchronize(devices)
    except Exception as exc:  # a failed kernel surfaces here: the outputs are not valid
        response.discard()
        return Response.from_error(
            response._request, internal(f"writing outputs on the GPU failed: {exc}")
        )
    return response


def copy_into(dst: Any, src: Any) -> None:
    """Copy ``src`` into ``dst``; either may be in device memory, as GPU inputs, torch CUDA
    tensors and outputs into a client's CUDA region are.

    Copies between host and device block; a copy from device to device is queued on the
    device, and the response waits for it before it leaves.
    """
    if type(src) is np.ndarray and type(dst) is np.ndarray:  # the common case: host to host
        np.copyto(dst, src, casting="same_kind")
    elif isinstance(dst, np.ndarray):
        same = codec.device_of(src) is not None and (src.dtype, src.shape) == (dst.dtype, dst.shape)
        if same and callable(getattr(src, "get", None)):
            src.get(out=dst)  # cupy: device -> host, straight into place (blocks)
        else:
            np.copyto(dst, codec.host_array(src), casting="same_kind")
    elif codec.device_of(src) is None:
        dst.set(np.ascontiguousarray(codec.host_array(src), dtype=dst.dtype))  # host -> device
    else:
        dst[...] = cuda.as_cupy(src)
