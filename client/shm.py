"""The shared-memory client: zero-copy inference for Python callers on the server's machine.

    from inferpool.client import ShmClient
    with ShmClient("ipc:///tmp/inferpool-1000/broker.sock") as c:
        req = c.request("identity", outputs=["OUTPUT0"])
        x = req.input("INPUT0", (4,), np.float32)  # a writable view of shared memory
        x[:] = np.arange(4)
        with c.run(req) as result:                 # only a small header crosses the socket
            y = result["OUTPUT0"]                   # a read-only view of the server's arena

A ShmClient is a :class:`client.Client` (control and metadata calls, frame inference) with
an input region the server made for it and output handles.  A background thread sends
keep-alive messages, so a client that is quiet but alive keeps its leases.
"""

from __future__ import annotations

import base64
import secrets
import threading
from collections.abc import Sequence
from typing import Any

import zmq

from inferpool.client.shm_core import INPUT_REGION, ShmRequest, ShmResult, ShmSession, Window
from inferpool.client.sync import DEFAULT_TIMEOUT, Client
from inferpool.shm.refs import posix_name
from inferpool.wire import codec
from inferpool.wire.errors import InferpoolError
from inferpool.wire.zmqio import recv_frames, send_parts

DEFAULT_INPUT_BYTES = 64 << 20


class ShmClient(Client):
    def __init__(
        self,
        endpoint: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        input_bytes: int = DEFAULT_INPUT_BYTES,
        keepalive: bool = True,
        context: zmq.Context[Any] | None = None,
    ) -> None:
        """``input_bytes``: size of the input region the server creates for this client
        (0: none, for callers that only read outputs as handles)."""
        self.routing_id = b"shm." + secrets.token_bytes(12)
        super().__init__(endpoint, timeout=timeout, context=context, routing_id=self.routing_id)
        self.session = ShmSession()
        self._outputs: dict[tuple[str, str], list[str]] = {}
        self._keepalive: _KeepAlive | None = None
        try:
            if input_bytes:
                reply = self.call(
                    "create_shared_memory_region", name=INPUT_REGION, byte_size=input_bytes
                )
                self.session.attach_inputs(reply)
            if keepalive:
                self._keepalive = _KeepAlive(self._ctx, self.endpoint, self.routing_id)
                self._keepalive.start()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ inference
    def request(
        self,
        model: str,
        outputs: Sequence[str] | None = None,
        *,
        version: str | int = "",
        parameters: dict[str, Any] | None = None,
    ) -> ShmRequest:
        """A reusable request; ``outputs`` default to every output of the model."""
        if outputs is None:
            key = (model, str(version))
            if key not in self._outputs:
                meta = self.model_metadata(model, version)
                self._outputs[key] = [o["name"] for o in meta["outputs"]]
            outputs = self._outputs[key]
        return ShmRequest(self.session, model, outputs, version, parameters)

    def run(self, request: ShmRequest, timeout: float | None = None) -> ShmResult:
        """Send ``request`` (with any queued lease releases) and wait for its result."""
        request_id = f"{next(self._ids)}"
        data = request.encode(request_id, self.session.take_releases())
        send_parts(self._sock, (b"", data))
        header, frames = self._recv(request_id, timeout)
        return self.session.decode(header, frames)

    def flush(self) -> int:
        """Release queued leases now instead of with the next request."""
        releases = self.session.take_releases()
        if not releases:
            return 0
        return int(self.call("release_leases", leases=releases)["released"])

    def lease_status(self) -> dict[str, Any]:
        return self.call("lease_status")

    # ------------------------------------------------------------------ registered regions
    def register_system_shared_memory(
        self, name: str, key: str, byte_size: int, offset: int = 0
    ) -> None:
        """Register a POSIX object this process created (Triton's system shared memory)."""
        self.call(
            "register_system_shared_memory", name=name, key=key, offset=offset, byte_size=byte_size
        )
        self.session.windows[name] = Window("system", posix_name(key), offset)

    def register_cuda_shared_memory(self, name: str, buffer: Any, byte_size: int = 0) -> None:
        """Register a :class:`shm.cuda.CudaBuffer` (device memory, CUDA IPC)."""
        self.call(
            "register_cuda_shared_memory",
            name=name,
            raw_handle=base64.b64encode(buffer.handle).decode(),
            device_id=buffer.device_id,
            byte_size=byte_size or buffer.nbytes,
        )
        self.session.windows[name] = Window("cuda", buffer=buffer)

    def unregister_system_shared_memory(self, name: str = "") -> list[str]:
        return self._unregister("unregister_system_shared_memory", name)

    def unregister_cuda_shared_memory(self, name: str = "") -> list[str]:
        return self._unregister("unregister_cuda_shared_memory", name)

    def _unregister(self, msg_type: str, name: str) -> list[str]:
        names = list(self.call(msg_type, name=name)["unregistered"])
        for n in names:
            self.session.windows.pop(n, None)
        return names

    def system_shared_memory_status(self, name: str = "") -> list[dict[str, Any]]:
        return list(self.call("system_shared_memory_status", name=name)["regions"])

    def cuda_shared_memory_status(self, name: str = "") -> list[dict[str, Any]]:
        return list(self.call("cuda_shared_memory_status", name=name)["regions"])

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Release leases, end registrations (the server unlinks the input region), close."""
        if self._keepalive is not None:
            self._keepalive.stop()
            self._keepalive = None
        try:
            self.flush()
            self.call("unregister_system_shared_memory", timeout=2.0)
            self.call("unregister_cuda_shared_memory", timeout=2.0)
        except InferpoolError:
            pass  # the server is gone or busy: it reclaims everything when we disconnect
        self.session.close()
        super().close()

    def __enter__(self) -> ShmClient:
        return self


class _KeepAlive(threading.Thread):
    """Tells the server, on a socket of its own, that the client is alive though quiet."""

    def __init__(self, ctx: zmq.Context[Any], endpoint: str, routing_id: bytes) -> None:
        super().__init__(name="inferpool-keepalive", daemon=True)
        self._ctx = ctx
        self._endpoint = endpoint
        self._header = codec.encode_header(
            {"type": "keepalive", "id": "keepalive", "client": routing_id.hex()}
        )
        self._halt = threading.Event()

    def run(self) -> None:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, 0)  # a server that is gone must not pile them up
        sock.connect(self._endpoint)
        interval = 0.0  # the first one asks the server's lease timeout
        try:
            while not self._halt.wait(interval):
                interval = 1.0
                try:
                    send_parts(sock, (b"", self._header))
                except zmq.Again:
                    continue
                if sock.poll(1000):
                    parts = recv_frames(sock)
                    if len(parts) >= 2:
                        reply = codec.decode_header(parts[1].bytes)
                        timeout = reply.get("lease_timeout")
                        if isinstance(timeout, int | float) and timeout > 0:
                            interval = max(0.05, timeout / 3)
        finally:
            sock.close(0)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)
