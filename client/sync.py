"""The zmq client: inference and control messages over a DEALER socket.

    from inferpool.client import Client
    with Client("ipc:///tmp/inferpool-1000/broker.sock") as c:
        out = c.infer("identity", {"INPUT0": np.arange(4, dtype=np.float32)})

Every call has a timeout; a server error raises InferpoolError with the server's code.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import zmq

from inferpool.client import control
from inferpool.wire import codec
from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.paths import default_endpoint
from inferpool.wire.zmqio import recv_frames, send_parts

DEFAULT_TIMEOUT = 60.0
T = TypeVar("T")


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
    inputs: Mapping[str, Any], datatypes: Mapping[str, str] | None = None
) -> tuple[list[dict[str, Any]], list[Any]]:
    """Input descriptors and their frames (zero-copy buffers for fixed-size types)."""
    specs: list[dict[str, Any]] = []
    frames: list[Any] = []
    for name, value in inputs.items():
        datatype = (datatypes or {}).get(name)
        arr = codec.as_array(value, datatype)
        datatype = datatype or codec.datatype_of(arr.dtype)
        specs.append({"name": name, "datatype": datatype, "shape": list(arr.shape)})
        frames.append(codec.tensor_bytes(arr, datatype))
    return specs, frames


def infer_header(
    model: str,
    inputs: list[dict[str, Any]],
    outputs: Sequence[str] | Sequence[dict[str, Any]] | None,
    version: str | int,
    parameters: Mapping[str, Any] | None,
) -> dict[str, Any]:
    header: dict[str, Any] = {
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


def prepare(
    model: str,
    inputs: Mapping[str, Any],
    outputs: Sequence[str] | None = None,
    *,
    version: str | int = "",
    parameters: Mapping[str, Any] | None = None,
    datatypes: Mapping[str, str] | None = None,
) -> tuple[dict[str, Any], list[Any]]:
    """An infer request's header and tensor frames (what every client sends)."""
    specs, frames = encode_inputs(inputs, datatypes)
    return infer_header(model, specs, outputs, version, parameters), frames


def decode_result(header: dict[str, Any], frames: list[Any]) -> InferResult:
    codec.raise_for_error(header)
    outputs: dict[str, np.ndarray] = {}
    specs = header.get("outputs") or []
    framed = [o for o in specs if not codec.in_shared_memory(o)]
    if len(framed) > len(frames):
        raise InferpoolError(
            Code.INTERNAL, f"response lists {len(framed)} outputs but carries {len(frames)} frames"
        )
    for spec, frame in zip(framed, frames, strict=False):
        outputs[spec["name"]] = codec.array_from_buffer(
            frame.buffer if hasattr(frame, "buffer") else frame,
            spec["datatype"],
            spec["shape"],
            f"output '{spec['name']}'",
        )
    return InferResult(
        header.get("model_name", ""),
        str(header.get("model_version", "")),
        outputs,
        header.get("parameters") or {},
        header.get("id", ""),
    )


class Client:
    """A synchronous client; one request at a time per Client (use several for concurrency)."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        context: zmq.Context[Any] | None = None,
        routing_id: bytes | None = None,
    ) -> None:
        self.endpoint = endpoint or default_endpoint()
        self.timeout = timeout
        self._own_ctx = context is None
        self._ctx = context or zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        if routing_id:  # how the server knows this client (its leases, its regions)
            self._sock.setsockopt(zmq.ROUTING_ID, routing_id)
        self._sock.connect(self.endpoint)
        self._ids = itertools.count(1)
        self._rcvtimeo = -1

    # ------------------------------------------------------------------ transport
    def _send(self, header: dict[str, Any], frames: Sequence[Any] = ()) -> str:
        request_id = f"{next(self._ids)}"
        header["id"] = request_id
        # copy=False: large tensors go zero-copy (pyzmq still copies parts under 64 KiB)
        send_parts(self._sock, [b"", codec.encode_header(header), *frames], copy=False)
        return request_id

    def _recv(self, request_id: str, timeout: float | None) -> tuple[dict[str, Any], list[Any]]:
        """The next response to ``request_id``; responses to abandoned requests are dropped.

        The wait is the socket's receive timeout, so a response costs one zmq call.
        """
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        sock = self._sock
        wait_ms = max(1, int(limit * 1000))
        while True:
            if wait_ms != self._rcvtimeo:
                sock.setsockopt(zmq.RCVTIMEO, wait_ms)
                self._rcvtimeo = wait_ms
            try:
                parts = recv_frames(sock)
            except zmq.Again:
                raise InferpoolError(
                    Code.TIMEOUT, f"no response from {self.endpoint} within {limit:g}s"
                ) from None
            if len(parts) >= 2 and len(parts[0]) == 0:
                header = codec.decode_header(parts[1].bytes)
                if header.get("id") == request_id:
                    return header, parts[2:]
            wait_ms = max(1, int((deadline - time.monotonic()) * 1000))

    def call(self, msg_type: str, timeout: float | None = None, **fields: Any) -> dict[str, Any]:
        """Send a control message and return its (error-checked) response header."""
        request_id = self._send({"type": msg_type, **fields})
        header, _ = self._recv(request_id, timeout)
        codec.raise_for_error(header)
        return header

    # ------------------------------------------------------------------ inference
    def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        outputs: Sequence[str] | None = None,
        **options: Any,
    ) -> dict[str, np.ndarray]:
        """Run one inference; returns the outputs as numpy arrays (options: infer_result's)."""
        return self.infer_result(model, inputs, outputs, **options).outputs

    def infer_result(
        self,
        model: str,
        inputs: Mapping[str, Any],
        outputs: Sequence[str] | None = None,
        *,
        version: str | int = "",
        parameters: Mapping[str, Any] | None = None,
        datatypes: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> InferResult:
        """Like infer(), with the response's parameters and model version."""
        request_id = self._send(
            *prepare(
                model, inputs, outputs, version=version, parameters=parameters, datatypes=datatypes
            )
        )
        header, parts = self._recv(request_id, timeout)
        return decode_result(header, parts)

    def stream(
        self,
        model: str,
        inputs: Mapping[str, Any],
        outputs: Sequence[str] | None = None,
        *,
        timeout: float | None = None,
        **request: Any,
    ) -> Iterator[InferResult]:
        """Responses of a decoupled model as they arrive, until the final one
        (``request``: version, parameters, datatypes as for infer_result()).

        The final response is yielded only if it carries outputs.
        """
        request_id = self._send(*prepare(model, inputs, outputs, **request))
        while True:
            header, parts = self._recv(request_id, timeout)
            result = decode_result(header, parts)
            if result.streamed:
                yield result
            if result.final:
                return

    # ------------------------------------------------------------------ control
    def control(self, call: control.Call[T], timeout: float | None = None) -> T:
        """Run one control call (client.control) and read its answer."""
        return call.read(self.call(call.type, timeout, **call.fields))

    def is_live(self, timeout: float | None = None) -> bool:
        return self.control(control.live(), timeout)

    def is_ready(self, timeout: float | None = None) -> bool:
        return self.control(control.ready(), timeout)

    def is_model_ready(self, model: str, version: str | int = "") -> bool:
        return self.control(control.model_ready(model, version))

    def server_metadata(self) -> dict[str, Any]:
        return self.control(control.server_metadata())

    def model_metadata(self, model: str, version: str | int = "") -> dict[str, Any]:
        return self.control(control.model_metadata(model, version))

    def model_config(self, model: str, version: str | int = "") -> dict[str, Any]:
        return self.control(control.model_config(model, version))

    def models(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return self.control(control.models(ready_only))

    def load_model(self, model: str, timeout: float | None = None) -> None:
        self.control(control.load(model), timeout)

    def unload_model(self, model: str, timeout: float | None = None) -> None:
        self.control(control.unload(model), timeout)

    def statistics(self, model: str = "", version: str | int = "") -> dict[str, Any]:
        return self.control(control.statistics(model, version))

    def status(self) -> list[dict[str, Any]]:
        return self.control(control.status())

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until the server answers ready (or raise TIMEOUT)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.is_ready(timeout=min(1.0, max(0.05, deadline - time.monotonic()))):
                    return
            except InferpoolError as err:
                if err.code is not Code.TIMEOUT:
                    raise
            if time.monotonic() >= deadline:
                raise InferpoolError(Code.TIMEOUT, f"{self.endpoint} not ready within {timeout:g}s")
            time.sleep(0.05)

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        self._sock.close(0)
        if self._own_ctx:
            self._ctx.term()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
