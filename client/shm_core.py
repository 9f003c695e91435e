"""What the shared-memory clients (sync and asyncio) share: requests, results, leases.

A session owns the client's input region, which the broker created for it (``inputs``,
mode 0600): requests allocate their inputs in it locally (an ``Allocator``, no round
trip) and the caller writes them in place, so only a small header crosses the socket.
Outputs come back as handles; each handle's region is mapped read-only once per session
and cached, and the result's arrays view it in place until the result is released.
Releases are queued and travel with the next request (or ``flush``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from inferpool.shm.arena import Allocator, ArenaFull
from inferpool.shm.refs import posix_name
from inferpool.shm.region import Region, RegionCache
from inferpool.wire import codec
from inferpool.wire.errors import Code, InferpoolError

INPUT_REGION = "inputs"  # the name of the session's input region, as registered
SWEEP_S = 1.0  # how often mappings of regions the server has unlinked are dropped


@dataclass
class Window:
    """A region this client registered, so outputs written into it can be viewed."""

    kind: str  # "system" or "cuda"
    key: str = ""  # POSIX name (system)
    offset: int = 0
    buffer: Any = None  # shm.cuda.CudaBuffer (cuda)


class ShmSession:
    def __init__(self) -> None:
        self.region: Region | None = None
        self.allocator: Allocator | None = None
        self.mapped = RegionCache(readonly=True)
        self.windows: dict[str, Window] = {}
        self.pending: list[str] = []  # lease tokens to release with the next message
        self.held: dict[str, int] = {}  # mapped region -> leases still held in it
        self._next_sweep = time.monotonic() + SWEEP_S

    # ------------------------------------------------------------------ the input region
    def attach_inputs(self, reply: dict[str, Any]) -> None:
        """Map the region the broker created (``create_shared_memory_region``'s reply)."""
        self.region = Region.attach(posix_name(reply["key"]))
        self.allocator = Allocator(self.region.size)
        self.windows[INPUT_REGION] = Window("system", self.region.name)

    def alloc(self, nbytes: int, what: str) -> int:
        if self.allocator is None:
            raise InferpoolError(
                Code.INVALID_ARG, f"{what}: this client has no input region (input_bytes=0)"
            )
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

    # ------------------------------------------------------------------ results
    def decode(self, header: dict[str, Any], frames: list[Any]) -> ShmResult:
        """A result whose outputs view shared memory (handles) or the received frames."""
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
            outputs[name] = _view(buf, offset, nbytes, spec)
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
        held = self.held
        for token, region in leases:
            self.pending.append(token)
            held[region] -= 1
        now = time.monotonic()
        if now >= self._next_sweep:
            self._next_sweep = now + SWEEP_S
            for region in [r for r, n in held.items() if n <= 0]:
                if not os.path.exists(os.path.join("/dev/shm", region)):
                    del held[region]
                    self.mapped.drop(region)

    def take_releases(self) -> list[str]:
        pending, self.pending = self.pending, []
        return pending

    def close(self) -> None:
        self.mapped.close()
        if self.region is not None:
            self.region.close()
            self.region = None
            self.allocator = None


def _view(buf: Any, offset: int, nbytes: int, spec: dict[str, Any]) -> np.ndarray:
    datatype, shape = spec["datatype"], spec["shape"]
    if datatype == "BYTES":
        view = memoryview(buf)[offset : offset + nbytes]
        return codec.array_from_buffer(view, datatype, shape, f"output '{spec['name']}'")
    dtype = codec.numpy_dtype(datatype)
    count = codec.element_count(shape)
    if count * dtype.itemsize != nbytes:
        raise InferpoolError(
            Code.INTERNAL,
            f"output '{spec['name']}': {nbytes} bytes cannot hold {datatype} {shape}",
        )
    return np.frombuffer(buf, dtype=dtype, count=count, offset=offset).reshape(shape)


def _device_view(buffer: Any, offset: int, nbytes: int, spec: dict[str, Any]) -> Any:
    dtype = codec.numpy_dtype(spec["datatype"])
    return buffer.array(offset, nbytes).view(dtype).reshape(spec["shape"])


class ShmResult:
    """A response whose outputs view shared memory in place: use them, then release.

    ``with client.run(req) as result:`` releases on leaving the block; the arrays must not
    be used after that (the server reuses the memory).
    """

    def __init__(
        self,
        session: ShmSession,
        model_name: str,
        model_version: str,
        outputs: dict[str, Any],
        parameters: dict[str, Any],
        leases: list[tuple[str, str]],
    ) -> None:
        self._session = session
        self.model_name = model_name
        self.model_version = model_version
        self.outputs = outputs
        self.parameters = parameters
        self._leases = leases

    def __getitem__(self, name: str) -> Any:
        return self.outputs[name]

    def as_torch(self, name: str) -> Any:
        """Output ``name`` as a torch tensor over the same memory (DLPack, no copy)."""
        import torch

        return torch.from_dlpack(self.outputs[name])

    @property
    def leases(self) -> list[str]:
        return [token for token, _ in self._leases]

    def release(self) -> None:
        """Give the outputs' memory back (sent with the client's next message)."""
        if self._leases:
            self._session.release(self._leases)
            self._leases = []

    def __enter__(self) -> ShmResult:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class ShmRequest:
    """A reusable request: inputs live in the client's input region, written in place."""

    def __init__(
        self,
        session: ShmSession,
        model: str,
        outputs: Sequence[str],
        version: str | int = "",
        parameters: dict[str, Any] | None = None,
    ) -> None:
        self._session = session
        self._inputs: dict[str, dict[str, Any]] = {}
        self._slots: dict[str, int] = {}  # input -> offset in the session's input region
        self._header: dict[str, Any] = {
            "type": "infer",
            "model_name": model,
            "model_version": str(version),
            "inputs": [],
            "outputs": [{"name": n, "parameters": {"output_handle": True}} for n in outputs],
        }
        if parameters:
            self._header["parameters"] = dict(parameters)

    # ------------------------------------------------------------------ inputs
    def input(self, name: str, shape: Sequence[int], dtype: Any) -> np.ndarray:
        """A writable array for input ``name`` in shared memory: write the tensor into it.

        ``torch.from_numpy`` of the array is a tensor over the same memory.
        """
        dt = np.dtype(_numpy_dtype(dtype))
        datatype = codec.datatype_of(dt)
        if datatype == "BYTES":
            raise InferpoolError(Code.INVALID_ARG, f"input '{name}': use set_input() for BYTES")
        shape = codec.check_shape(list(shape), f"input '{name}'")
        count = codec.element_count(shape)
        offset = self._place(name, datatype, shape, count * dt.itemsize)
        region = self._session.region
        assert region is not None
        return np.frombuffer(region.buf, dtype=dt, count=count, offset=offset).reshape(shape)

    def set_input(self, name: str, value: Any, datatype: str | None = None) -> None:
        """Copy ``value`` (numpy, torch, list; str/bytes for BYTES) into input ``name``."""
        arr = codec.as_array(value, datatype)
        datatype = datatype or codec.datatype_of(arr.dtype)
        if datatype == "BYTES":
            payload = codec.serialize_bytes(arr.reshape(-1))
            offset = self._place(name, datatype, list(arr.shape), len(payload))
            region = self._session.region
            assert region is not None
            region.buf[offset : offset + len(payload)] = payload
        else:
            np.copyto(self.input(name, arr.shape, codec.numpy_dtype(datatype)), arr)

    def input_from(
        self,
        name: str,
        region: str,
        shape: Sequence[int],
        datatype: str,
        byte_size: int,
        offset: int = 0,
    ) -> None:
        """Input ``name`` is already in a region this client registered (system or CUDA)."""
        self._drop(name)
        self._set(name, datatype, list(shape), region, offset, byte_size)

    def _place(self, name: str, datatype: str, shape: list[int], nbytes: int) -> int:
        self._drop(name)
        offset = self._session.alloc(nbytes, f"input '{name}'")
        self._slots[name] = offset
        self._set(name, datatype, shape, INPUT_REGION, offset, nbytes)
        return offset

    def _set(
        self, name: str, datatype: str, shape: list[int], region: str, offset: int, nbytes: int
    ) -> None:
        self._inputs[name] = {
            "name": name,
            "datatype": datatype,
            "shape": shape,
            "parameters": {
                "shared_memory_region": region,
                "shared_memory_offset": offset,
                "shared_memory_byte_size": nbytes,
            },
        }
        self._header["inputs"] = list(self._inputs.values())

    def _drop(self, name: str) -> None:
        offset = self._slots.pop(name, None)
        if offset is not None:
            self._session.free(offset)
        self._inputs.pop(name, None)

    # ------------------------------------------------------------------ outputs
    def output_to(self, name: str, region: str, byte_size: int, offset: int = 0) -> None:
        """Have output ``name`` written into a region this client registered, not a handle."""
        params = {
            "shared_memory_region": region,
            "shared_memory_offset": offset,
            "shared_memory_byte_size": byte_size,
        }
        outputs = [o for o in self._header["outputs"] if o["name"] != name]
        self._header["outputs"] = [*outputs, {"name": name, "parameters": params}]

    # ------------------------------------------------------------------ wire
    def encode(self, request_id: str, releases: list[str]) -> bytes:
        header = self._header
        header["id"] = request_id
        if releases:
            header["release"] = releases
            try:
                return orjson.dumps(header)
            finally:
                del header["release"]
        return orjson.dumps(header)

    def close(self) -> None:
        """Give the inputs' memory back to the client's input region."""
        for name in list(self._slots):
            self._drop(name)

    def __enter__(self) -> ShmRequest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _numpy_dtype(dtype: Any) -> Any:
    """numpy dtypes as they are; torch dtypes through their numpy twin."""
    if type(dtype).__module__ == "torch":
        import torch

        return torch.empty(0, dtype=dtype).numpy().dtype
    return dtype
