"""How a benchmark's requests travel: ``--transport zmq`` (the asyncio client, tensors in
frames) or ``shm`` (the asyncio shared-memory client: inputs written once into the client's
region, outputs left in place as leases).

A transport is a :class:`Transport` subclass registered with :func:`register`; it connects
once and hands out one *sender* per concurrent slot: an async callable that sends one
request and returns when its (last) response has arrived, raising InferpoolError for an
error.  ``http`` and ``grpc`` are in :mod:`inferpool.bench.kserve`; a new transport is one
more class.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from inferpool.client import AsyncClient, AsyncShmClient
from inferpool.client.lane import Lane
from inferpool.usage import UsageError
from inferpool.wire import codec

Sender = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class Workload:
    """What every request carries: the model, its version, inputs and their datatypes."""

    model: str
    version: str
    inputs: dict[str, np.ndarray]
    datatypes: dict[str, str]
    decoupled: bool = False

    @property
    def nbytes(self) -> int:
        """Bytes one request's inputs take in shared memory."""
        return sum(
            codec.serialized_bytes_size(a.reshape(-1)) if a.dtype == object else a.nbytes
            for a in self.inputs.values()
        )


class Transport(ABC):
    """How the benchmark sends requests: one client, one sender per concurrent slot."""

    name: ClassVar[str]

    def __init__(
        self,
        endpoint: str | None,
        timeout: float,
        workload: Workload,
        slots: int,
        url: str | None = None,
    ):
        """``slots``: the most senders that will be asked for (the highest concurrency);
        ``url``: where a transport that does not speak zmq finds the server."""
        self.endpoint = endpoint
        self.url = url
        self.timeout = timeout
        self.workload = workload
        self.slots = slots

    @abstractmethod
    async def open(self) -> None:
        """Connect (and set up what every sender shares)."""

    @abstractmethod
    async def sender(self) -> Sender:
        """One concurrent slot's sender."""

    @abstractmethod
    async def close(self) -> None: ...

    def report(self) -> dict[str, Any]:
        """What the transport has to say about the run, for the report (before close)."""
        return {}


TRANSPORTS: dict[str, type[Transport]] = {}


def register(cls: type[Transport]) -> type[Transport]:
    """Make ``cls`` a transport ``--transport`` can name."""
    TRANSPORTS[cls.name] = cls
    return cls


def transport_named(name: str) -> type[Transport]:
    """The transport called ``name`` (one of ``command.CHOICES``)."""
    if name in ("http", "grpc"):
        from inferpool.bench import kserve  # noqa: F401  (registers them)
    return TRANSPORTS[name]


@register
class ZmqTransport(Transport):
    """Sends over zmq with the asyncio client: tensors in frames."""

    name = "zmq"

    async def open(self) -> None:
        self.client = AsyncClient(self.endpoint, timeout=self.timeout)

    async def sender(self) -> Sender:
        w, client = self.workload, self.client
        if w.decoupled:

            async def stream() -> None:  # a request ends with its final response
                async for _ in client.stream(
                    w.model, w.inputs, version=w.version, datatypes=w.datatypes
                ):
                    pass

            return stream

        async def infer() -> None:
            await client.infer_result(w.model, w.inputs, version=w.version, datatypes=w.datatypes)

        return infer

    async def close(self) -> None:
        await self.client.close()


@register
class ShmTransport(Transport):
    """Sends with the asyncio shared-memory client: inputs written in place."""

    name = "shm"
    lane: ClassVar[bool] = False

    async def open(self) -> None:
        if self.workload.decoupled:
            raise UsageError(f"--transport {self.name} sends to models that answer once: use zmq")
        size = self.slots * (self.workload.nbytes + 4096) + (1 << 20)  # slack for alignment
        self.client = AsyncShmClient(
            self.endpoint,
            timeout=self.timeout,
            input_bytes=size,
            lane=self.lane,
            lane_slots=self.slots if self.lane else 0,
        )
        await self.client.start()

    async def sender(self) -> Sender:
        w, client = self.workload, self.client
        request = client.request(w.model, version=w.version)
        for name, value in w.inputs.items():
            request.set_input(name, value, w.datatypes[name])

        async def run() -> None:
            result = await client.run(request)
            result.release()  # sent with the next request: no round trip of its own

        return run

    async def close(self) -> None:
        await self.client.close()


@register
class LaneTransport(ShmTransport):
    """Sends over a lane of the shared-memory client."""

    name = "lane"
    lane = True

    async def open(self) -> None:
        await super().open()
        try:  # now, so that a model lanes do not serve is refused rather than sent around
            await self.client.lane(self.workload.model, self.workload.version)
        except BaseException:
            await self.close()
            raise

    def report(self) -> dict[str, Any]:
        """How the lane's waits went (answered while spinning, or asleep) and where its two
        ends ran: the event loop's thread (its core at the end of the run) and the worker."""
        lanes = [la for la in self.client.session.lanes.lanes.values() if isinstance(la, Lane)]
        if not lanes:
            return {}
        placed = lanes[0].placement()
        spun, slept = placed["spun"], placed["slept"]
        waits = "spin" if spun and not slept else "sleep" if not spun else "spin and sleep"
        return {"lane": {**placed, "waits": waits}}
