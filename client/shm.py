"""The shared-memory client: zero-copy inference for Python callers on the server's machine.

    from inferpool.client import ShmClient
    with ShmClient("ipc:///tmp/inferpool-1000/broker.sock") as c:
        req = c.request("identity", outputs=["OUTPUT0"])
        x = req.input("INPUT0", (4,), np.float32)  # a writable view of shared memory
        x[:] = np.arange(4)
        with c.run(req) as result:                 # only a small header crosses the socket
            y = result["OUTPUT0"]                   # a read-only view of the server's arena

A ShmClient is a :class:`client.Client` (control and metadata calls, frame inference) over
a :class:`~inferpool.client.shm_core.ShmSession`: an input region the server made for it,
output handles and their leases.  A thread sends the keep-alives the session asks for, on a
socket of its own, so a client that holds leases or lanes and is quiet keeps them.

With ``lane=True`` (or after ``client.lane(model)``) requests go through a lane straight to
the model's worker (client.lane) instead of through the broker, falling back to the broker
path when the lane ends.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import zmq

from inferpool.client.lane import LaneRevoked
from inferpool.client.lane_book import AnyLane
from inferpool.client.shm_base import DEFAULT_INPUT_BYTES, ShmBase
from inferpool.client.shm_core import ShmSession
from inferpool.client.shm_request import ShmRequest, ShmResult
from inferpool.client.sync import Client
from inferpool.wire import codec
from inferpool.wire.errors import InferpoolError
from inferpool.wire.zmqio import recv_frames, send_parts

__all__ = ["DEFAULT_INPUT_BYTES", "ShmClient"]


class ShmClient(ShmBase, Client):
    """Made with an input region (``input_bytes``, asked of the server at once) and a
    keep-alive thread (``keepalive``)."""

    def _setup(self) -> None:
        super()._setup()
        self._keeper: _KeepAlive | None = None
        try:
            if self._input_bytes:
                self.control(self.session.create_inputs(self._input_bytes))
            if self._keepalive:
                self._keeper = _KeepAlive(self._ctx, self.session, self.routing_id, self._secure)
                self._keeper.start()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ inference
    def run(self, request: ShmRequest, timeout: float | None = None) -> ShmResult:
        """Send ``request`` (with any queued lease releases) and wait for its result: on
        the model's lane if there is one, else through the broker."""
        if not request.resolved:
            self.control(self.session.describe(request), timeout)
        lane = self._lane_for(request)
        if lane is not None:
            try:
                result = lane.run(request, self._core.limit(timeout))
            except LaneRevoked:
                self.session.lanes.lost(lane)  # it never ran: the broker path takes it
            else:
                if result is not None:
                    return result
        return self._run(self.session.run(request, timeout))

    def lane(self, model: str, version: str | int = "") -> AnyLane:
        """Open a lane to ``model`` (or return the open one): its requests go through it
        from now on.  UNSUPPORTED for a model lanes do not serve (docs/PROTOCOL.md)."""
        lane = self.session.lanes.reuse(model, version)
        return lane or self.control(self.session.lanes.open(model, version))

    def close_lane(self, model: str, version: str | int = "") -> None:
        """Close the lane to ``model``: its requests take the broker path again."""
        self.control(self.session.lanes.close_lane(model, version))

    def _lane_for(self, request: ShmRequest) -> AnyLane | None:
        book = self.session.lanes
        lane = book.lane_for(request)
        if lane is None and book.should_open(request):
            try:
                lane = self.control(book.open(request.model, request.version))
            except InferpoolError as err:
                book.refused(request.model, request.version, err)
        return lane

    def flush(self) -> int:
        """Release queued leases now instead of with the next request (lanes' too)."""
        lanes = [lane for lane in self.session.lanes.lanes.values() if lane.usable]
        count = sum(lane.flush(self.timeout) for lane in lanes)
        exchange = self.session.flush()
        return count + (0 if exchange is None else self._run(exchange))

    def lease_status(self) -> dict[str, Any]:
        return self.call("lease_status")

    # ------------------------------------------------------------------ registered regions
    def register_system_shared_memory(
        self, name: str, key: str, byte_size: int, offset: int = 0
    ) -> None:
        """Register a POSIX object this process created (Triton's system shared memory)."""
        self.control(self.session.register_system(name, key, byte_size, offset))

    def register_cuda_shared_memory(self, name: str, buffer: Any, byte_size: int = 0) -> None:
        """Register a :class:`shm.cuda.CudaBuffer` (device memory, CUDA IPC)."""
        self.control(self.session.register_cuda(name, buffer, byte_size))

    def unregister_system_shared_memory(self, name: str = "") -> list[str]:
        return self.control(self.session.unregister("system", name))

    def unregister_cuda_shared_memory(self, name: str = "") -> list[str]:
        return self.control(self.session.unregister("cuda", name))

    def system_shared_memory_status(self, name: str = "") -> list[dict[str, Any]]:
        return self.control(self.session.region_status("system", name))

    def cuda_shared_memory_status(self, name: str = "") -> list[dict[str, Any]]:
        return self.control(self.session.region_status("cuda", name))

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Release leases, end registrations (the server unlinks the input region), close."""
        if self._keeper is not None:
            self._keeper.stop()
            self._keeper = None
        super().close()

    def __enter__(self) -> ShmClient:
        return self


class _KeepAlive(threading.Thread):
    """Sends the keep-alives the session asks for, naming the client, on a socket of its own
    (the client's socket belongs to the caller's thread)."""

    def __init__(
        self,
        ctx: zmq.Context[Any],
        session: ShmSession,
        routing_id: bytes,
        secure: Callable[[zmq.Socket[Any]], None],
    ) -> None:
        """``secure`` gives its socket the client's CURVE keys."""
        super().__init__(name="inferpool-keepalive", daemon=True)
        self._ctx = ctx
        self._secure = secure
        self._session = session
        self._routing_id = routing_id
        self._halt = threading.Event()

    def run(self) -> None:
        session = self._session
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, 0)  # a server that is gone must not pile them up
        self._secure(sock)
        sock.connect(session.endpoint)
        try:
            while not self._halt.wait(session.keepalive_in()):
                call = session.keepalive(self._routing_id)
                header = {"type": call.type, "id": "keepalive", **call.fields}
                try:
                    send_parts(sock, (b"", codec.encode_header(header)))
                except zmq.Again:
                    continue
                if sock.poll(1000):
                    parts = recv_frames(sock)
                    if len(parts) >= 2:
                        call.read(codec.decode_header(parts[1].bytes))
        except InferpoolError:
            pass  # an unreadable answer: not a server to keep alive
        finally:
            sock.close(0)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)
