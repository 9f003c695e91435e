"""The levels of a benchmark: for each concurrency N, N senders send back to back, first for
the warm-up, then for the measured window (a duration or a number of requests).

The window starts and ends with nothing in flight, and the statistics API is read just
before and just after it, once it counts every request sent so far (a lane's requests are
counted when its worker reports them, a moment after they were answered), so the server's
counts of the window are exactly the requests the senders made in it (when no one else uses
the model meanwhile).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from inferpool.bench.results import Level, Server
from inferpool.bench.transports import Sender
from inferpool.wire.errors import InferpoolError

TICK_S = 0.1  # how often the progress display hears how far a phase is
SETTLE_S = 5.0  # the longest the statistics are waited for to count what was sent


def counted(stats: dict[str, Any]) -> int:
    """The requests a ``model_stats`` entry has counted, successes and failures."""
    inference = stats["inference_stats"]
    return int(inference["success"]["count"]) + int(inference["fail"]["count"])


@dataclass(frozen=True)
class Plan:
    """The levels to measure and how long each lasts."""

    concurrency: tuple[int, ...]
    duration: float  # seconds each measured window lasts (0: ``requests`` decides)
    requests: int  # requests each measured window sends (0: ``duration`` decides)
    warmup: float  # seconds of requests before each window, not measured


class Progress(Protocol):
    """What a display is told while the benchmark runs."""

    def phase(self, concurrency: int, what: str, total: float, unit: str) -> None:
        """A phase ("warm-up" or "measure") begins; it lasts ``total`` of ``unit``
        ("s" or "requests")."""

    def advance(self, answered: int, elapsed: float) -> None: ...

    def level_done(self, level: Level) -> None: ...


class Runner:
    """Measures each concurrency level with its senders and the server's statistics."""

    def __init__(
        self,
        senders: list[Sender],
        statistics: Callable[[], Awaitable[dict[str, Any]]],
        plan: Plan,
        batch_size: int,
        progress: Progress,
    ) -> None:
        """``statistics``: the model's ``model_stats`` entry, read from the server."""
        self.senders = senders
        self.statistics = statistics
        self.plan = plan
        self.batch_size = batch_size
        self.progress = progress
        self._sent = 0  # requests the server's statistics will have counted

    async def run(self) -> list[Level]:
        self._sent = counted(await self.statistics())
        levels = []
        for n in self.plan.concurrency:
            level = await self._level(n)
            self.progress.level_done(level)
            levels.append(level)
        return levels

    async def _level(self, n: int) -> Level:
        plan = self.plan
        if plan.warmup > 0:
            await self._drive(n, "warm-up", plan.warmup, 0)
        before = await self._settled()
        latencies, errors, seconds = await self._drive(n, "measure", plan.duration, plan.requests)
        after = await self._settled()
        server = Server.between(before, after)
        return Level.measured(n, latencies, errors, seconds, self.batch_size, server)

    async def _settled(self) -> dict[str, Any]:
        """The statistics once they count every request sent so far (or after SETTLE_S)."""
        deadline = time.monotonic() + SETTLE_S
        while True:
            stats = await self.statistics()
            if counted(stats) >= self._sent or time.monotonic() > deadline:
                return stats
            await asyncio.sleep(0.01)

    async def _drive(
        self, n: int, phase: str, duration: float, requests: int
    ) -> tuple[list[int], int, float]:
        """N senders until the duration is over (or ``requests`` were sent); the latency of
        each answered request (ns), the number that failed, and the seconds it all took."""
        latencies: list[int] = []
        errors: list[InferpoolError] = []
        issued = 0
        start = time.perf_counter()
        deadline = start + duration if not requests else math.inf

        def another() -> bool:
            nonlocal issued
            if (requests and issued >= requests) or time.perf_counter() >= deadline:
                return False
            issued += 1
            return True

        async def slot(send: Sender) -> None:
            clock = time.perf_counter_ns
            while another():
                sent = clock()
                try:
                    await send()
                except InferpoolError as err:
                    errors.append(err)
                    continue
                latencies.append(clock() - sent)

        async def tick() -> None:
            while True:
                await asyncio.sleep(TICK_S)
                self.progress.advance(len(latencies) + len(errors), time.perf_counter() - start)

        if requests:
            self.progress.phase(n, phase, requests, "requests")
        else:
            self.progress.phase(n, phase, duration, "s")
        ticker = asyncio.ensure_future(tick())
        try:
            await asyncio.gather(*(slot(send) for send in self.senders[:n]))
        finally:
            ticker.cancel()
        seconds = time.perf_counter() - start
        self._sent += len(latencies) + len(errors)
        self.progress.advance(len(latencies) + len(errors), seconds)
        if errors and not latencies:
            raise errors[0]  # every request failed: the first says why
        return latencies, len(errors), seconds
