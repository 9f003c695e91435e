"""The shared-memory client for asyncio: the same requests and results, many in flight.

    async with AsyncShmClient(endpoint) as c:
        req = await c.request("identity", outputs=["OUTPUT0"])
        req.input("INPUT0", (4,), np.float32)[:] = np.arange(4)
        with await c.run(req) as result:
            y = result["OUTPUT0"]

One task reads every response and hands it to the request that waits for it (matched by
``id``); messages go through a plain (synchronous) view of the same socket, so a request
costs no more zmq calls than with the blocking client.  A keep-alive task keeps leases of
a quiet client.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Sequence
from typing import Any

import zmq
import zmq.asyncio

from inferpool.client.shm import DEFAULT_INPUT_BYTES
from inferpool.client.shm_core import INPUT_REGION, ShmRequest, ShmResult, ShmSession
from inferpool.client.sync import DEFAULT_TIMEOUT, default_endpoint
from inferpool.wire import codec
from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.zmqio import NOBLOCK, recv_frames, send_parts


class AsyncShmClient:
    def __init__(
        self,
        endpoint: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        input_bytes: int = DEFAULT_INPUT_BYTES,
        keepalive: bool = True,
    ) -> None:
        self.endpoint = endpoint or default_endpoint()
        self.timeout = timeout
        self.session = ShmSession()
        self._input_bytes = input_bytes
        self._keepalive = keepalive
        self._ctx = zmq.asyncio.Context()
        self._async = self._ctx.socket(zmq.DEALER)
        self._async.setsockopt(zmq.LINGER, 0)
        self._async.connect(self.endpoint)
        self._sock: zmq.Socket[bytes] = zmq.Socket.shadow(self._async.underlying)  # plain calls
        self._ids = itertools.count(1)
        self._waiting: dict[str, asyncio.Future[tuple[dict[str, Any], list[Any]]]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._outputs: dict[tuple[str, str], list[str]] = {}
        self._lease_timeout = 0.0

    async def start(self) -> AsyncShmClient:
        """Start reading responses, create the input region, start the keep-alive."""
        self._tasks.append(asyncio.ensure_future(self._read()))
        try:
            if self._input_bytes:
                reply = await self.call(
                    "create_shared_memory_region", name=INPUT_REGION, byte_size=self._input_bytes
                )
                self.session.attach_inputs(reply)
            if self._keepalive:
                self._lease_timeout = float((await self.call("keepalive"))["lease_timeout"])
                self._tasks.append(asyncio.ensure_future(self._keep_alive()))
        except BaseException:
            await self.close()
            raise
        return self

    # ------------------------------------------------------------------ transport
    async def _read(self) -> None:
        sock = self._sock
        while True:
            await self._async.poll()  # readable
            while True:
                try:
                    parts = recv_frames(sock, NOBLOCK)
                except zmq.Again:
                    break
                if len(parts) < 2 or len(parts[0]) != 0:
                    continue
                try:
                    header = codec.decode_header(parts[1].bytes)
                except InferpoolError:
                    continue
                waiter = self._waiting.pop(str(header.get("id", "")), None)
                if waiter is not None and not waiter.done():
                    waiter.set_result((header, parts[2:]))

    async def _exchange(
        self, data: bytes, request_id: str, timeout: float | None
    ) -> tuple[dict[str, Any], list[Any]]:
        waiter = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = waiter
        send_parts(self._sock, (b"", data))
        limit = self.timeout if timeout is None else timeout
        try:
            return await asyncio.wait_for(waiter, limit)
        except asyncio.TimeoutError:
            raise InferpoolError(
                Code.TIMEOUT, f"no response from {self.endpoint} within {limit:g}s"
            ) from None
        finally:
            self._waiting.pop(request_id, None)

    async def call(self, msg_type: str, timeout: float | None = None, **fields: Any) -> Any:
        """Send a control message and return its (error-checked) response header."""
        request_id = f"{next(self._ids)}"
        data = codec.encode_header({"type": msg_type, "id": request_id, **fields})
        header, _ = await self._exchange(data, request_id, timeout)
        codec.raise_for_error(header)
        return header

    # ------------------------------------------------------------------ inference
    async def request(
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
                meta = await self.call(
                    "model_metadata", model_name=model, model_version=str(version)
                )
                self._outputs[key] = [o["name"] for o in meta["outputs"]]
            outputs = self._outputs[key]
        return ShmRequest(self.session, model, outputs, version, parameters)

    async def run(self, request: ShmRequest, timeout: float | None = None) -> ShmResult:
        """Send ``request`` (with any queued lease releases) and wait for its result."""
        request_id = f"{next(self._ids)}"
        data = request.encode(request_id, self.session.take_releases())
        header, frames = await self._exchange(data, request_id, timeout)
        return self.session.decode(header, frames)

    async def flush(self) -> int:
        """Release queued leases now instead of with the next request."""
        releases = self.session.take_releases()
        if not releases:
            return 0
        return int((await self.call("release_leases", leases=releases))["released"])

    async def _keep_alive(self) -> None:
        interval = max(0.05, self._lease_timeout / 3)
        while True:
            await asyncio.sleep(interval)
            with contextlib.suppress(InferpoolError):
                await self.call("keepalive", timeout=interval)

    # ------------------------------------------------------------------ lifetime
    async def close(self) -> None:
        """Release leases, end registrations, stop the tasks, close the socket."""
        for task in self._tasks[1:]:
            task.cancel()
        if self._tasks:
            with contextlib.suppress(InferpoolError):
                await self.flush()
                await self.call("unregister_system_shared_memory", timeout=2.0)
            self._tasks[0].cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        self.session.close()
        self._async.close(0)
        self._ctx.term()

    async def __aenter__(self) -> AsyncShmClient:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
