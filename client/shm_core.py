"""The shared-memory clients' protocol core (sync and asyncio alike), without I/O.

A session is a :class:`~inferpool.client.core.ClientCore` that also owns the client's input
region, which the broker created for it (``inputs``, mode 0600): requests allocate their
inputs in it locally and the caller writes them in place, so only a small header crosses
the socket.  Outputs come back as handles; each handle's region is mapped read-only once
per session and cached, and a result's arrays view it in place until it is released.
Releases are queued and travel with the next request (or ``flush``).  The server reclaims
the leases of a client it has not heard from for its lease timeout, so the session also
says when a keep-alive is due: while leases are held and the client is quiet.
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from inferpool.client.control_calls import Call
from inferpool.client.core import ClientCore, Exchange, Header, Message, extended
from inferpool.client.lane_book import LaneBook, Pin
from inferpool.client.shm_request import INPUT_REGION, ShmRequest, ShmResult, output_view
from inferpool.shm.arena import Allocator, ArenaFull
from inferpool.shm.refs import posix_name
from inferpool.shm.region import Region, RegionCache
from inferpool.wire import codec
from inferpool.wire.errors import Code, InferpoolError

CLOSE_TIMEOUT = 2.0  # seconds each goodbye message may take: a server that is gone cleans up
SWEEP_S = 1.0  # how often mappings of regions the server has unlinked are dropped
KEEPALIVE_S = 1.0  # the keep-alive interval until the server has said its lease timeout


@dataclass
class Window:
    """A region this client registered, so outputs written into it can be viewed."""

    kind: str  # "system" or "cuda"
    key: str = ""  # POSIX name (system)
    offset: int = 0
    buffer: Any = None  # shm.cuda.CudaBuffer (cuda)


class ShmSession(ClientCore):
    """A shared-memory client's state: its regions, handles and lanes (sans I/O)."""

    def __init__(
        self,
        endpoint: str,
        timeout: float,
        lane: bool = False,
        lane_spin_us: int = 0,
        lane_slots: int = 0,
        pin: Pin = None,
    ) -> None:
        """``lane``: a lane (client.lane) to every model it runs; ``lane_spin_us``: how long
        a lane's wait spins; ``lane_slots``: how many requests one lane holds in flight;
        ``pin``: where the thread that opens a lane is pinned (client.lane_book)."""
        super().__init__(endpoint, timeout)
        self.region: Region | None = None
        self.allocator: Allocator | None = None
        # input blocks of requests collected unclosed: freed at the next allocation, in the
        # session's own thread (a finalizer may run in any thread)
        self.orphans: list[int] = []
        self.mapped = RegionCache(readonly=True)
        self.windows: dict[str, Window] = {}
        self.pending: list[str] = []  # lease tokens to release with the next message
        self.held: dict[str, int] = {}  # mapped region -> leases still held in it
        self.outputs: dict[tuple[str, str], list[str]] = {}  # a model's outputs, once asked
        self._leases = 0  # leases held, released or not
        self._next_sweep = time.monotonic() + SWEEP_S
        self._interval = 0.0  # between keep-alives: a third of the lease timeout; 0: ask it
        self._heard = time.monotonic()  # when the server last heard from this client
        self.lanes = LaneBook(self, lane, lane_spin_us, lane_slots or 1, pin)

    # ------------------------------------------------------------------ the input region
    def create_inputs(self, byte_size: int) -> Call[None]:
        """Ask the server for an input region of ``byte_size`` and map it."""
        return Call(
            "create_shared_memory_region",
            self._attach_inputs,
            {"name": INPUT_REGION, "byte_size": byte_size},
        )

    def _attach_inputs(self, reply: Header) -> None:
        self.region = Region.attach(posix_name(reply["key"]))
        self.allocator = Allocator(self.region.size)
        self.windows[INPUT_REGION] = Window("system", self.region.name)

    def alloc(self, nbytes: int, what: str) -> int:
        if self.allocator is None:
            raise InferpoolError(
                Code.INVALID_ARG, f"{what}: this client has no input region (input_bytes=0)"
            )
        while self.orphans:
            self.allocator.free(self.orphans.pop())
        try:
            return self.allocator.alloc(nbytes)
        except ArenaFull as exc:
            raise InferpoolError(
                Code.UNAVAILABLE,
                f"{what} ({nbytes} bytes) does not fit in the client's input region: {exc}; "
                "close requests you no longer need or create the client with a larger "
                "input_bytes",
            ) from None

    def free(self, offset: int) -> None:
        if self.allocator is not None:
            self.allocator.free(offset)

    # ------------------------------------------------------------------ requests
    def request(
        self,
        model: str,
        outputs: Sequence[str] | None,
        version: str | int = "",
        parameters: dict[str, Any] | None = None,
    ) -> ShmRequest:
        """A reusable request; ``outputs`` default to every output of the model."""
        if outputs is None:
            outputs = self.outputs.get((model, str(version)))
        return ShmRequest(self, model, outputs, version, parameters)

    def describe(self, request: ShmRequest) -> Call[None]:
        """Ask the model's outputs for a request made without them."""

        def read(meta: Header) -> None:
            names = self.outputs[(request.model, request.version)] = [
                o["name"] for o in meta["outputs"]
            ]
            request.resolve(names)

        fields = {"model_name": request.model, "model_version": request.version}
        return Call("model_metadata", read, fields)

    def run(self, request: ShmRequest, timeout: float | None = None) -> Exchange[ShmResult]:
        """``request`` (resolved), with the releases queued since the last message."""
        template = request.template()
        if self.pending:
            template = extended(template, "release", self.pending)
            self.pending = []
        self._heard = time.monotonic()
        exchange = self.prepared(template, (), self.decode, timeout)
        exchange.cancellable = True
        return exchange

    def flush(self, timeout: float | None = None) -> Exchange[int] | None:
        """The queued releases as a message of their own; None when none are queued."""
        if not self.pending:
            return None
        leases, self.pending = self.pending, []
        self._heard = time.monotonic()
        return self.open({"type": "release_leases", "leases": leases}, (), _released, timeout)

    # ------------------------------------------------------------------ results
    def decode(self, message: Message) -> ShmResult:
        """A result whose outputs view shared memory (handles) or the received frames."""
        header, frames = message
        codec.raise_for_error(header)
        outputs: dict[str, Any] = {}
        leases: list[tuple[str, str]] = []
        framed = iter(frames)
        for spec in header.get("outputs") or ():
            name = spec["name"]
            params = spec.get("parameters") or {}
            if "handle_region" in params:
                region = params["handle_region"]
                leases.append((params["handle_lease"], region))
                self.held[region] = self.held.get(region, 0) + 1
                buf = self.mapped.get(region).buf
                offset, nbytes = params["handle_offset"], params["handle_byte_size"]
            elif "shared_memory_region" in params:
                buf, base = self._window(params["shared_memory_region"], spec)
                offset = base + params.get("shared_memory_offset", 0)
                nbytes = params["shared_memory_byte_size"]
                if not isinstance(buf, memoryview):  # device memory: a cupy array
                    outputs[name] = _device_view(buf, offset, nbytes, spec)
                    continue
            else:
                frame = next(framed, None)
                if frame is None:
                    raise InferpoolError(Code.INTERNAL, f"output '{name}' has no frame")
                buf, offset = frame.buffer if hasattr(frame, "buffer") else frame, 0
                nbytes = memoryview(buf).nbytes
            outputs[name] = output_view(buf, offset, nbytes, spec)
        self._leases += len(leases)
        return ShmResult(
            self,
            header.get("model_name", ""),
            str(header.get("model_version", "")),
            outputs,
            header.get("parameters") or {},
            leases,
        )

    def _window(self, name: str, spec: dict[str, Any]) -> tuple[Any, int]:
        window = self.windows.get(name)
        if window is None:
            raise InferpoolError(
                Code.INTERNAL,
                f"output '{spec['name']}' was written into region '{name}', which this "
                "client did not register",
            )
        if window.kind == "cuda":
            return window.buffer, window.offset
        return self.mapped.get(window.key).buf, window.offset

    def release(self, leases: list[tuple[str, str]]) -> None:
        """Queue ``leases`` for release; drop mappings the server has since unlinked."""
        self.pending.extend([token for token, _ in leases])
        self.unhold(leases)

    def hold(self, region: str, count: int) -> None:
        """``count`` more leases (a lane's) keep ``region`` mapped."""
        self.held[region] = self.held.get(region, 0) + count
        self._leases += count

    def unhold(self, leases: list[tuple[Any, str]]) -> None:
        """Leases given back (to be released on whichever path granted them)."""
        held = self.held
        for _, region in leases:
            held[region] -= 1
        self._leases -= len(leases)
        now = time.monotonic()
        if now >= self._next_sweep:
            self._next_sweep = now + SWEEP_S
            for region in [r for r, n in held.items() if n <= 0]:
                if not os.path.exists(os.path.join("/dev/shm", region)):
                    del held[region]
                    self.mapped.drop(region)

    # ------------------------------------------------------------------ registered regions
    def register_system(self, name: str, key: str, byte_size: int, offset: int) -> Call[None]:
        """Register a POSIX object the caller created (Triton's system shared memory)."""
        window = Window("system", posix_name(key), offset)
        fields = {"name": name, "key": key, "offset": offset, "byte_size": byte_size}
        return Call("register_system_shared_memory", self._add(name, window), fields)

    def register_cuda(self, name: str, buffer: Any, byte_size: int) -> Call[None]:
        """Register a :class:`shm.cuda.CudaBuffer` (device memory, CUDA IPC)."""
        fields = {
            "name": name,
            "raw_handle": base64.b64encode(buffer.handle).decode(),
            "device_id": buffer.device_id,
            "byte_size": byte_size or buffer.nbytes,
        }
        return Call(
            "register_cuda_shared_memory", self._add(name, Window("cuda", buffer=buffer)), fields
        )

    def _add(self, name: str, window: Window) -> Callable[[Header], None]:
        """Reads a registration's answer: outputs written into ``name`` can be viewed now."""

        def read(reply: Header) -> None:
            self.windows[name] = window

        return read

    def unregister(self, kind: str, name: str = "") -> Call[list[str]]:
        """End a registration of ``kind`` ("system" or "cuda"), or all of them (no name)."""

        def read(reply: Header) -> list[str]:
            names = list(reply["unregistered"])
            for n in names:
                self.windows.pop(n, None)
            return names

        return Call(f"unregister_{kind}_shared_memory", read, {"name": name})

    @staticmethod
    def region_status(kind: str, name: str = "") -> Call[list[dict[str, Any]]]:
        return Call(f"{kind}_shared_memory_status", lambda h: list(h["regions"]), {"name": name})

    def goodbye(self) -> list[Exchange[Any]]:
        """What a closing client sends: its queued releases, the end of its registrations
        (the server unlinks the input region), each given CLOSE_TIMEOUT."""
        flush = self.flush(CLOSE_TIMEOUT)
        lanes = [self.control(call, CLOSE_TIMEOUT) for call in self.lanes.close_calls()]
        kinds = sorted({w.kind for w in self.windows.values()})
        unregister = [self.control(self.unregister(kind), CLOSE_TIMEOUT) for kind in kinds]
        return [flush, *lanes, *unregister] if flush else [*lanes, *unregister]

    # ------------------------------------------------------------------ keep-alive
    def keepalive_in(self) -> float:
        """Seconds until a keep-alive is due (0: now): the first asks the server's lease
        timeout; then one whenever leases are held and the server has not heard from this
        client for a third of that timeout."""
        if not self._interval:
            return 0.0
        if not (self._leases or self.pending or self.lanes):
            return self._interval
        return max(0.0, self._heard + self._interval - time.monotonic())

    def keepalive(self, client: bytes = b"") -> Call[float]:
        """The keep-alive message (for the client with routing id ``client`` when it comes
        from another socket); its answer, the lease timeout, sets the interval."""
        self._heard = time.monotonic()
        self._interval = self._interval or KEEPALIVE_S
        return Call("keepalive", self._lease_timeout, {"client": client.hex()} if client else {})

    def _lease_timeout(self, reply: Header) -> float:
        timeout = reply.get("lease_timeout")
        if isinstance(timeout, int | float) and timeout > 0:
            self._interval = max(0.05, timeout / 3)
            return float(timeout)
        return 0.0

    def close(self) -> list[Exchange[Any]]:
        """Cancel what waits, unmap every region."""
        waiting = super().close()
        self.lanes.close()
        self.mapped.close()
        if self.region is not None:
            self.region.close()
            self.region = None
            self.allocator = None
        return waiting


def _released(message: Message) -> int:
    header = message[0]
    codec.raise_for_error(header)
    return int(header["released"])


def _device_view(buffer: Any, offset: int, nbytes: int, spec: dict[str, Any]) -> Any:
    """An output in a CUDA region: a cupy array over it; BYTES, which have no device form,
    as the host object array of their strings (copied out of the region)."""
    if spec["datatype"] == "BYTES":
        return output_view(buffer.array(offset, nbytes).get(), 0, nbytes, spec)
    dtype = codec.numpy_dtype(spec["datatype"])
    return buffer.array(offset, nbytes).view(dtype).reshape(spec["shape"])
