"""A lane for an asyncio client: many requests in flight, answered through the event loop.

The loop thread posts requests into the lane (client.lane) and awaits futures.  While the
loop thread runs on a core apart from the worker's (``Lane.apart``), it polls the response
ring between its other callbacks for up to the lane's spin budget after each answer (a
callback that schedules itself again: the loop keeps serving its other work, and no thread
holds the GIL the loop needs).  Otherwise, and once the budget is spent, a thread per lane
sleeps on the lane's response futex while requests are in flight and, when responses
arrive or the lane ends, asks the loop to take them (``call_soon_threadsafe``); the loop
thread alone reads the rings.
"""

from __future__ import annotations

import asyncio
import threading
import time

from inferpool.client.lane import SLICE_S, Lane, LaneRevoked
from inferpool.client.shm_request import ShmResult
from inferpool.wire.errors import Code, InferpoolError

_now = time.monotonic_ns


class AsyncLane:
    """A lane for the asyncio client: requests awaited instead of waited for."""

    def __init__(self, lane: Lane, loop: asyncio.AbstractEventLoop) -> None:
        self.lane = lane
        self.loop = loop
        self._waiting: dict[int, asyncio.Future[ShmResult]] = {}  # request number -> caller
        self._room: list[asyncio.Future[None]] = []  # callers waiting for a free slot
        self._cond = threading.Condition()
        self._closed = False
        self._polling = False  # the loop polls the ring (the watcher thread does not wait)
        self._poll_until = 0  # when the poll's budget ends (monotonic ns)
        self._seen = lane.responses.value()  # the response sequence the loop last saw
        self._thread = threading.Thread(target=self._watch, name="inferpool-lane", daemon=True)
        self._thread.start()

    async def run(self, body: tuple[bytes, int, int], limit: float, flags: int = 0) -> ShmResult:
        lane = self.lane
        while len(self._waiting) >= lane.geometry.slots:
            room = self.loop.create_future()
            self._room.append(room)
            await room
        n = lane.post(body, flags)  # LaneRevoked when the lane has ended
        future = self.loop.create_future()
        self._waiting[n] = future
        if not self._polling and lane.spin_ns and lane.stay():
            self._polling = True
            self._poll_until = _now() + lane.spin_ns
            self.loop.call_soon(self._poll)
        elif not self._polling:
            with self._cond:
                self._cond.notify()
        try:
            return await asyncio.wait_for(asyncio.shield(future), limit)
        except asyncio.TimeoutError:
            self._give_up(n, future)
            raise InferpoolError(
                Code.TIMEOUT,
                f"no response on lane {lane.id} (model '{lane.model}') within {limit:g}s",
            ) from None
        except asyncio.CancelledError:  # the caller's task was cancelled
            self._give_up(n, future)
            raise

    def _give_up(self, n: int, future: asyncio.Future[ShmResult]) -> None:
        """Request ``n``'s caller is gone: the request is cancelled, and its answer, when
        it comes, is settled on a future nobody awaits (``_settle`` gives its outputs back)."""
        future.cancel()
        self.lane.cancel(n)

    # ------------------------------------------------------------------ the loop's side
    def _poll(self) -> None:
        """One look at the response ring; again soon while requests wait, the budget lasts
        (renewed by each answer) and the loop thread runs apart from the worker; else the
        watcher thread waits for the rest."""
        if self._closed:  # the lane is closed (unmapped, or about to be): nothing to read
            self._polling = False
            return
        lane = self.lane
        head = lane.responses.value()
        if head != self._seen:
            self._seen = head
            lane.responses.spun += 1
            self._poll_until = _now() + lane.spin_ns
            self._take()
        if self._waiting and not self._closed:
            if _now() < self._poll_until and lane.stay():
                self.loop.call_soon(self._poll)
                return
            self._polling = False
            with self._cond:
                self._cond.notify()
        else:
            self._polling = False

    def _take(self) -> None:
        """Settle every request whose response is in (or that the lane's end decided)."""
        lane = self.lane
        over = None
        for n in sorted(self._waiting, key=lambda k: (k - lane.read) & 0xFFFFFFFF):
            future = self._waiting[n]
            try:
                if lane.answered(n):
                    result = lane.take(n)
                else:
                    over = lane.over() if over is None else over
                    if not over:
                        break
                    lane.fail(n)
                    result = lane.take(n)
            except (InferpoolError, LaneRevoked) as exc:
                self._settle(n, future, exc)
                continue
            self._settle(n, future, result)
        while self._room and len(self._waiting) < lane.geometry.slots:
            room = self._room.pop(0)
            if not room.done():
                room.set_result(None)

    def _settle(
        self, n: int, future: asyncio.Future[ShmResult], outcome: ShmResult | BaseException
    ) -> None:
        del self._waiting[n]
        if future.done():  # its caller gave up: give the outputs back
            if isinstance(outcome, ShmResult):
                outcome.release()
        elif isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    # ------------------------------------------------------------------ the watcher thread
    def _watch(self) -> None:
        lane = self.lane
        seen = lane.responses.value()
        while True:
            with self._cond:
                while (not self._waiting or self._polling) and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
            head = lane.responses.wait(seen, 0, SLICE_S)
            if head != seen or lane.over():
                seen = head
                self.loop.call_soon_threadsafe(self._take)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self.lane.responses.wake()
        self._thread.join(1.0)
