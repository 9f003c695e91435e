"""The shared-memory client for asyncio: the same requests and results, many in flight.

    async with AsyncShmClient(endpoint) as c:
        req = c.request("identity", outputs=["OUTPUT0"])
        req.input("INPUT0", (4,), np.float32)[:] = np.arange(4)
        with await c.run(req) as result:
            y = result["OUTPUT0"]

An :class:`~inferpool.client.aio.AsyncClient` over a
:class:`~inferpool.client.shm_core.ShmSession`, as ShmClient is a Client over one; its
input region is made by ``start()`` (``async with`` calls it), and a task sends the
keep-alives the session asks for.  With ``lane=True`` (or after ``await c.lane(model)``)
requests go through lanes (client.lane_async), many in flight on each.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from inferpool.client.aio import AsyncClient
from inferpool.client.lane import RELEASE_ONLY, Lane, LaneRevoked
from inferpool.client.lane_async import AsyncLane
from inferpool.client.lane_book import AnyLane
from inferpool.client.lane_ensemble import EnsembleLane
from inferpool.client.shm_base import ShmBase
from inferpool.client.shm_core import CLOSE_TIMEOUT
from inferpool.client.shm_request import ShmRequest, ShmResult
from inferpool.wire.errors import InferpoolError
from inferpool.wire.lane_region import FLAG_RELEASE_ONLY


class AsyncShmClient(ShmBase, AsyncClient):
    """The asyncio shared-memory client: inputs written in place, outputs read in place."""

    LANE_SLOTS = 8

    def _setup(self) -> None:
        super()._setup()
        self._keeper: asyncio.Task[None] | None = None
        self._opening: dict[tuple[str, str], asyncio.Future[AnyLane]] = {}

    async def start(self) -> AsyncShmClient:
        """Create the input region, start the keep-alives."""
        try:
            if self._input_bytes:
                await self.control(self.session.create_inputs(self._input_bytes))
            if self._keepalive:
                self._keeper = asyncio.ensure_future(self._keep_alive())
        except BaseException:
            await self.close()
            raise
        return self

    # ------------------------------------------------------------------ inference
    async def run(self, request: ShmRequest, timeout: float | None = None) -> ShmResult:
        """Send ``request`` (with any queued lease releases) and wait for its result: on
        the model's lane if there is one, else through the broker."""
        if not request.resolved:
            await self.control(self.session.describe(request), timeout)
        lane = await self._lane_for(request)
        if lane is not None:
            try:
                result = await self._on_lane(lane, request, self._core.limit(timeout))
            except LaneRevoked:
                self.session.lanes.lost(lane)  # it never ran: the broker path takes it
            else:
                if result is not None:
                    return result
        return await self._run(self.session.run(request, timeout))

    async def _on_lane(self, lane: AnyLane, request: ShmRequest, limit: float) -> ShmResult | None:
        """``request`` over ``lane`` (an ensemble's lanes: its steps run from here), or None
        if it cannot take it."""
        if isinstance(lane, EnsembleLane):
            return await lane.run_async(request, limit, self._async_lane)
        body = lane.body(request)
        return None if body is None else await self._async_lane(lane).run(body, limit)

    async def lane(self, model: str, version: str | int = "") -> AnyLane:
        """Open a lane to ``model`` (or return the open one): its requests go through it
        from now on.  UNSUPPORTED for a model lanes do not serve (docs/PROTOCOL.md)."""
        lane = self.session.lanes.reuse(model, version)
        return lane or await self._open_lane(model, str(version))

    async def close_lane(self, model: str, version: str | int = "") -> None:
        """Close the lane to ``model``: its requests take the broker path again."""
        await self.control(self.session.lanes.close_lane(model, version))

    async def _lane_for(self, request: ShmRequest) -> AnyLane | None:
        book = self.session.lanes
        lane = book.lane_for(request)
        if lane is None and book.should_open(request):
            try:
                lane = await self._open_lane(request.model, request.version)
            except InferpoolError as err:
                book.refused(request.model, request.version, err)
        return lane

    async def _open_lane(self, model: str, version: str) -> AnyLane:
        """One open_lane per model at a time, however many callers ask at once."""
        key = (model, version)
        opening = self._opening.get(key)
        if opening is None:
            opening = asyncio.ensure_future(self.control(self.session.lanes.open(model, version)))
            self._opening[key] = opening
            opening.add_done_callback(lambda _f: self._opening.pop(key, None))
        return await asyncio.shield(opening)

    @staticmethod
    def _async_lane(lane: Lane) -> AsyncLane:
        if lane.waiter is None:
            lane.waiter = AsyncLane(lane, asyncio.get_running_loop())
            lane.closers.append(lane.waiter.close)
        waiter: AsyncLane = lane.waiter
        return waiter

    async def flush(self) -> int:
        """Release queued leases now instead of with the next request (lanes' too)."""
        count = 0
        opened = [la for la in self.session.lanes.lanes.values() if la.usable]
        for lane in [one for la in opened for one in _lanes(la)]:
            count += len(lane.releases)
            while lane.releases:
                waiter = self._async_lane(lane)
                (await waiter.run(RELEASE_ONLY, self.timeout, FLAG_RELEASE_ONLY)).release()
        exchange = self.session.flush()
        return count + (0 if exchange is None else await self._run(exchange))

    async def lease_status(self) -> dict[str, Any]:
        return await self.call("lease_status")

    async def _keep_alive(self) -> None:
        session = self.session
        while True:
            await asyncio.sleep(session.keepalive_in())
            if session.keepalive_in() == 0:
                with contextlib.suppress(InferpoolError):
                    await self.control(session.keepalive(), CLOSE_TIMEOUT)

    # ------------------------------------------------------------------ registered regions
    async def register_system_shared_memory(
        self, name: str, key: str, byte_size: int, offset: int = 0
    ) -> None:
        """Register a POSIX object this process created (Triton's system shared memory)."""
        await self.control(self.session.register_system(name, key, byte_size, offset))

    async def register_cuda_shared_memory(self, name: str, buffer: Any, byte_size: int = 0) -> None:
        """Register a :class:`shm.cuda.CudaBuffer` (device memory, CUDA IPC)."""
        await self.control(self.session.register_cuda(name, buffer, byte_size))

    async def unregister_system_shared_memory(self, name: str = "") -> list[str]:
        return await self.control(self.session.unregister("system", name))

    async def unregister_cuda_shared_memory(self, name: str = "") -> list[str]:
        return await self.control(self.session.unregister("cuda", name))

    async def system_shared_memory_status(self, name: str = "") -> list[dict[str, Any]]:
        return await self.control(self.session.region_status("system", name))

    async def cuda_shared_memory_status(self, name: str = "") -> list[dict[str, Any]]:
        return await self.control(self.session.region_status("cuda", name))

    # ------------------------------------------------------------------ lifetime
    async def close(self) -> None:
        """Stop the keep-alives, release leases, end registrations (the server unlinks the
        input region), close."""
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
            self._keeper = None
        await super().close()

    async def __aenter__(self) -> AsyncShmClient:
        return await self.start()


def _lanes(lane: AnyLane) -> list[Lane]:
    """The lanes under ``lane``: itself, or an ensemble's, one per step."""
    return lane.lanes if isinstance(lane, EnsembleLane) else [lane]
