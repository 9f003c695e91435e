"""Requests, responses, errors and response senders as ``triton_python_backend_utils`` has them.

Each class wraps the backend API's object (:mod:`inferpool.backends.api`); :func:`to_api_response`
turns a model's ``InferenceResponse`` into an API response whose outputs live in shared memory.
"""

from __future__ import annotations

import json
from typing import Any

from inferpool.backends.api import (
    FLAG_SEQUENCE_END,
    FLAG_SEQUENCE_START,
    InputTensor,
    Request,
    Response,
    ResponseSender,
)
from inferpool.backends.model_calls import CallInput, CallRequest
from inferpool.backends.python.tensor import Tensor, TritonModelException
from inferpool.wire import codec
from inferpool.wire.errors import TRITON_CODES, InferpoolError

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = FLAG_SEQUENCE_START
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = FLAG_SEQUENCE_END


class TritonError(Exception):
    """An error for one response: ``TritonError(msg, code=TritonError.INTERNAL)``."""

    # TRITONSERVER_Error_Code numbers, as pb_utils exposes them.
    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE = 0, 1, 2, 3, 4
    UNSUPPORTED, ALREADY_EXISTS, CANCELLED = 5, 6, 7
    _CODES = TRITON_CODES

    def __init__(self, msg: str, code: int = INTERNAL) -> None:
        if not 0 <= code < len(self._CODES):
            raise TritonModelException(f"unknown TritonError code {code}")
        super().__init__(msg)
        self._msg = msg
        self._code = code

    def message(self) -> str:
        return self._msg

    def code(self) -> int:
        return self._code

    def to_inferpool(self) -> InferpoolError:
        return InferpoolError(self._CODES[self._code], self._msg)


class InferenceResponse:
    """Output tensors (or an error) and optional parameters for one request."""

    def __init__(
        self,
        output_tensors: list[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        if output_tensors is None:
            output_tensors = []
        if not isinstance(output_tensors, list):
            raise TritonModelException('"output_tensors" must be a list.')
        self._output_tensors = output_tensors
        self._error = error
        self._parameters: dict[str, Any] = dict(
            json.loads(parameters) if isinstance(parameters, str) else parameters or {}
        )

    def output_tensors(self) -> list[Tensor]:
        return self._output_tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return json.dumps(self._parameters)


def to_api_response(request: Request, response: InferenceResponse) -> Response:
    """Write a model's response into shared-memory outputs (requested outputs only).

    A problem with one response becomes that response's error, never the batch's.
    """
    if response.has_error():
        error = response.error()
        assert error is not None
        return Response(request, error.to_inferpool())
    out = request.response()
    try:
        for tensor in response.output_tensors():
            if not isinstance(tensor, Tensor):
                raise TritonModelException(
                    f"output_tensors holds a {type(tensor).__name__}, not a pb_utils.Tensor"
                )
            if not request.output_requested(tensor.name()):
                continue
            if tensor._lent and tensor._shared is not None:  # a BLS reply's: in place
                lent = tensor._shared
                if out.pass_on(tensor.name(), tensor.datatype(), tensor._data, lent):
                    continue
            data = tensor.as_numpy() if tensor.is_cpu() else tensor._data
            out.set_output(tensor.name(), data, tensor.datatype())
        for key, value in response._parameters.items():
            out.set_parameter(key, value)
    except Exception as exc:
        out.discard()
        return Response.from_error(request, exc)
    return out


class InferenceResponseSender:
    """Sends one request's responses: a stream when decoupled, closed by the FINAL flag."""

    def __init__(self, request: Request, sender: ResponseSender) -> None:
        self._request = request
        self._sender = sender

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        final = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        api_response = None if response is None else to_api_response(self._request, response)
        try:
            self._sender.send(api_response, final=final)
        except InferpoolError as err:
            if api_response is not None:
                api_response.discard()
            raise TritonModelException(err.message) from None

    def is_cancelled(self) -> bool:
        """Whether the client cancelled the request; the FINAL flag is still to be sent."""
        return self._sender.is_cancelled()


class InferenceTrace:
    """Triton's ``pb_utils.InferenceTrace``: what ``request.trace()`` gives, to pass as a
    BLS request's ``trace`` so that the call is traced as the request's child (when the
    request is traced)."""

    def __init__(self, handle: Any = 0) -> None:
        self._handle = handle if type(handle) is int else 0

    def get_context(self, mode: str = "opentelemetry") -> str | None:
        """OpenTelemetry's context of the trace: none (inferpool traces in Triton's mode)."""
        return None


class InferenceRequest:
    """A request: the model's view of one it was sent, or one it makes to another model
    (BLS: ``InferenceRequest(model_name=..., inputs=..., requested_output_names=...)``,
    then ``exec()`` or ``await async_exec()``; see backends/python/bls.py)."""

    _request: Request | CallRequest
    _sender: InferenceResponseSender | None
    _cpu_only: bool
    _inputs: list[Tensor] | None

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: list[Tensor] | None = None,
        requested_output_names: list[str] | None = None,
        model_name: str | bytes = "",
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: Any = None,
        trace: Any = None,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        if isinstance(model_name, bytes):  # as_numpy() of a TYPE_STRING input gives bytes
            model_name = model_name.decode("utf-8")
        if not isinstance(model_name, str) or not model_name:
            raise TritonModelException("InferenceRequest needs a model_name")
        tensors = list(inputs or [])
        for tensor in tensors:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(
                    f"Input tensor for request with id '{request_id}' and model name "
                    f"'{model_name}' should not be empty."
                )
        outputs = [str(n) for n in requested_output_names or []]
        if any(not n for n in outputs):
            raise TritonModelException(
                f"Requested output name for request with id '{request_id}' and model name "
                f"'{model_name}' should not be empty."
            )
        if isinstance(correlation_id, bool) or not isinstance(correlation_id, int | str):
            raise TritonModelException("Correlation ID must be integer or string")
        self._request = CallRequest(
            model_name,
            [_call_input(t) for t in tensors],
            outputs,
            int(model_version),
            str(request_id),
            correlation_id,
            int(flags),
            _call_parameters(parameters or {}),
            int(timeout),
            trace._handle if isinstance(trace, InferenceTrace) else 0,
        )
        self._sender = None
        self._cpu_only = True
        self._inputs = tensors

    @classmethod
    def _wrap(cls, request: Request, cpu_only: bool = True) -> InferenceRequest:
        """``cpu_only``: GPU inputs are copied to host memory first, as Triton does unless
        FORCE_CPU_ONLY_INPUT_TENSORS is "no"."""
        wrapped = cls.__new__(cls)
        wrapped._request = request
        wrapped._sender = None
        wrapped._cpu_only = cpu_only
        wrapped._inputs = None
        return wrapped

    def inputs(self) -> list[Tensor]:
        if self._inputs is None:  # GPU inputs are copied once, on first use
            assert isinstance(self._request, Request)
            self._inputs = [self._tensor(t) for t in self._request.inputs.values()]
        return list(self._inputs)

    def _tensor(self, tensor: InputTensor) -> Tensor:
        if tensor.memory == "cpu":
            shared = (tensor.region, tensor.offset, tensor.byte_size) if tensor.region else None
            return Tensor._wrap(tensor.name, tensor.datatype, tensor.data, True, shared)
        if not self._cpu_only:
            return Tensor._wrap(tensor.name, tensor.datatype, tensor.data, False)
        host = codec.host_array(tensor.data)  # a blocking copy out of the GPU
        host.flags.writeable = False  # read-only, as every input a model gets
        return Tensor._wrap(tensor.name, tensor.datatype, host, cpu=True)

    def request_id(self) -> str:
        return self._request.id

    def correlation_id(self) -> int | str:
        return self._request.correlation_id

    def flags(self) -> int:
        return self._request.flags

    def timeout(self) -> int:
        """The request's timeout in microseconds (0: none)."""
        return self._request.timeout_us

    def requested_output_names(self) -> list[str]:
        return list(self._request.requested_outputs)

    def parameters(self) -> str:
        """The request's parameters as a JSON string, as Triton gives them."""
        return json.dumps(self._request.parameters)

    def trace(self) -> InferenceTrace:
        """The request's trace, for the requests it makes (``trace=request.trace()``)."""
        request = self._request
        if isinstance(request, CallRequest):
            return InferenceTrace(request.parent)
        return InferenceTrace(request.handle)

    def get_response_sender(self) -> InferenceResponseSender:
        request = self._request
        if not isinstance(request, Request):
            raise TritonModelException("a request made with BLS has no response sender")
        if self._sender is None:
            self._sender = InferenceResponseSender(request, request.response_sender())
        return self._sender

    def is_cancelled(self) -> bool:
        """Whether the client cancelled the request (its answer, CANCELLED, has gone); a
        request the model builds for a BLS call is never cancelled."""
        request = self._request
        return isinstance(request, Request) and request.is_cancelled()

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on its model and wait: an InferenceResponse, or with
        ``decoupled`` an iterator of the responses (the final, maybe empty, one last)."""
        from inferpool.backends.python import bls

        return bls.execute(self._bls(), decoupled)

    def async_exec(self, decoupled: bool = False) -> Any:
        """As :meth:`exec`, awaitable (from ``async def execute``)."""
        from inferpool.backends.python import bls

        return bls.execute_async(self._bls(), decoupled)

    def _bls(self) -> CallRequest:
        if not isinstance(self._request, CallRequest):
            raise TritonModelException(
                "exec() runs a request the model made (pb_utils.InferenceRequest(...)), not "
                "one it was sent"
            )
        return self._request


def _call_input(tensor: Tensor) -> CallInput:
    """A Tensor as a call's input: a reference where its bytes lie in shared memory (the
    data stays referenced, so that memory lent to this process stays lent while the call
    runs)."""
    shape = tuple(tensor._data.shape)
    if tensor._shared is not None:
        region, offset, nbytes = tensor._shared
        return CallInput(
            tensor.name(), tensor.datatype(), shape, tensor._data, region, offset, nbytes
        )
    return CallInput(tensor.name(), tensor.datatype(), shape, tensor._data)


def _call_parameters(parameters: dict[str, Any]) -> dict[str, Any]:
    """Triton's checks of a BLS request's parameters: str keys, bool/int/str values."""
    if not isinstance(parameters, dict):
        raise TritonModelException("parameters must be a dict")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(
                f"Expect parameters keys to have type str, found type {type(key)}"
            )
        if not isinstance(value, bool | int | str):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(value)}"
            )
    return dict(parameters)
