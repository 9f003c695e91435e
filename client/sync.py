"""The zmq client: inference and control messages over a DEALER socket, one call at a time.

    from inferpool.client import Client
    with Client("ipc:///tmp/inferpool-1000/broker.sock") as c:
        out = c.infer("identity", {"INPUT0": np.arange(4, dtype=np.float32)})

The messages are client.core's; this class sends them and blocks for the answers.  Every
call has a timeout; a server error raises InferpoolError with the server's code, and the
first call says within seconds (UNAVAILABLE) when no server answers at the endpoint.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import zmq

from inferpool.client import control_calls
from inferpool.client.connection import Connection
from inferpool.client.core import Exchange, InferResult, Message, Retry
from inferpool.wire.errors import InferpoolError
from inferpool.wire.zmqio import recv_frames

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from Python 3.11

    from inferpool.client.core import Header, InferOptions, Inputs, Outputs

T = TypeVar("T")
_RCVTIMEO = int(zmq.RCVTIMEO)


class Client(Connection):
    """A synchronous client; one request at a time per Client (use several for concurrency)."""

    _rcvtimeo = -1  # the socket's receive timeout as last set (ms)

    # ------------------------------------------------------------------ transport
    def _run(self, exchange: Exchange[T]) -> T:
        """Send one request, read its (first) response."""
        try:
            self._start(exchange)
            return exchange.read(self._next(exchange))
        except BaseException:
            self._cancel(exchange)  # a timeout, an interrupt: the server stops its work
            raise
        finally:
            self._core.forget(exchange)

    def _start(self, exchange: Exchange[Any]) -> None:
        if self._monitor is not None:
            self._connect(exchange.limit)
        self._send_request(exchange, b"")

    def _next(self, exchange: Exchange[Any]) -> Message:
        """The next response to ``exchange``; others go to the requests they answer.

        The wait is the socket's receive timeout, so a response costs one zmq call.
        """
        core = self._core
        if exchange.replies:
            return core.take(exchange)
        limit = exchange.limit
        deadline = time.monotonic() + limit
        wait_ms = max(1, int(limit * 1000))
        sock = self._sock
        while True:
            if wait_ms != self._rcvtimeo:
                sock.setsockopt(_RCVTIMEO, wait_ms)
                self._rcvtimeo = wait_ms
            try:
                parts = recv_frames(sock)
            except zmq.Again:
                raise core.timed_out("no response from", limit) from None
            if core.receive(parts) is exchange:
                return core.take(exchange)
            wait_ms = max(1, int((deadline - time.monotonic()) * 1000))

    def _connect(self, limit: float) -> None:
        """Once: wait for a server's handshake, or fail fast (UNAVAILABLE) without one."""
        if self._answered():
            return
        self._check_path()
        window = self._core.handshake.window(limit)
        deadline = time.monotonic() + window
        while self._monitor is not None and (left := deadline - time.monotonic()) > 0:
            if self._monitor.poll(max(1, int(left * 1000))) and self._answered():
                return
            if self._core.handshake.refusal:
                break
        raise self._core.handshake.failure(window)

    def _send(self, header: Header, frames: Sequence[Any] = ()) -> str:
        """Send a message as given; its id, for :meth:`_recv` (protocol tests)."""
        exchange = self._core.raw(header, frames)
        self._start(exchange)
        return exchange.id

    def _recv(self, request_id: str, timeout: float | None = None) -> Message:
        """The next response to a message :meth:`_send` sent, errors not raised."""
        exchange = self._core.waiting(request_id)
        exchange.limit = self._core.limit(timeout)
        return exchange.read(self._next(exchange))

    def call(self, msg_type: str, timeout: float | None = None, **fields: Any) -> Header:
        """Send a control message and return its (error-checked) response header."""
        return self._run(self._core.call(msg_type, fields, timeout))

    # ------------------------------------------------------------------ inference
    def infer(
        self, model: str, inputs: Inputs, outputs: Outputs = None, **options: Unpack[InferOptions]
    ) -> dict[str, np.ndarray]:
        """Run one inference; returns the outputs as numpy arrays (options: infer_result's)."""
        return self._run(self._core.infer(model, inputs, outputs, **options)).outputs

    def infer_result(
        self, model: str, inputs: Inputs, outputs: Outputs = None, **options: Unpack[InferOptions]
    ) -> InferResult:
        """Like infer(), with the response's parameters and model version (``options``:
        version, parameters, datatypes, timeout)."""
        return self._run(self._core.infer(model, inputs, outputs, **options))

    def stream(
        self, model: str, inputs: Inputs, outputs: Outputs = None, **options: Unpack[InferOptions]
    ) -> Iterator[InferResult]:
        """Responses of a decoupled model as they arrive, until the final one; that one is
        yielded only if it carries outputs.  ``timeout`` bounds each wait."""
        exchange = self._core.infer(model, inputs, outputs, **options, stream=True)
        try:
            self._start(exchange)
            while not exchange.done:
                result = exchange.read(self._next(exchange))
                if result.streamed:
                    yield result
        finally:
            self._cancel(exchange)  # left before the final response: cancelled on the server

    # ------------------------------------------------------------------ control
    def control(self, call: control_calls.Call[T], timeout: float | None = None) -> T:
        """Run one control call (client.control_calls) and read its answer."""
        return self._run(self._core.control(call, timeout))

    def is_live(self, timeout: float | None = None) -> bool:
        return self.control(control_calls.live(), timeout)

    def is_ready(self, timeout: float | None = None) -> bool:
        return self.control(control_calls.ready(), timeout)

    def is_model_ready(self, model: str, version: str | int = "") -> bool:
        return self.control(control_calls.model_ready(model, version))

    def server_metadata(self) -> dict[str, Any]:
        return self.control(control_calls.server_metadata())

    def model_metadata(self, model: str, version: str | int = "") -> dict[str, Any]:
        return self.control(control_calls.model_metadata(model, version))

    def model_config(self, model: str, version: str | int = "") -> dict[str, Any]:
        return self.control(control_calls.model_config(model, version))

    def models(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return self.control(control_calls.models(ready_only))

    def load_model(
        self,
        model: str,
        timeout: float | None = None,
        *,
        config: str | Mapping[str, Any] | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        """Load (or reload) ``model``; ``config`` and ``files`` override its configuration
        and files as Triton's load API does (docs/PROTOCOL.md)."""
        self.control(control_calls.load(model, config, files), timeout)

    def unload_model(self, model: str, timeout: float | None = None) -> None:
        self.control(control_calls.unload(model), timeout)

    def drain(self) -> dict[str, Any]:
        """Stop the server taking requests, finish those in flight, exit (docs/scale-out.md)."""
        return self.control(control_calls.drain())

    def statistics(self, model: str = "", version: str | int = "") -> dict[str, Any]:
        return self.control(control_calls.statistics(model, version))

    def status(self) -> list[dict[str, Any]]:
        return self.control(control_calls.status())

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until the server answers ready, whether or not it is up yet (else TIMEOUT)."""
        retry = Retry(self.endpoint, timeout)
        while True:
            with retry:
                if self.is_ready(retry.attempt()):
                    return
            time.sleep(retry.pause())

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Say goodbye (the shm client's releases), close the socket."""
        if self._core.closed:
            return
        for exchange in self._core.goodbye():
            try:
                self._run(exchange)
            except InferpoolError:
                break  # the server is gone or busy: it reclaims all when we disconnect
        self._core.close()
        self._close_socket()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
