"""A shared-memory request and its result: inputs written in place, outputs read in place.

A :class:`ShmRequest` places its inputs in the client's input region (the session's
allocator, no round trip) and is sent as a small header, as often as wanted.  A
:class:`ShmResult` views its outputs where the server wrote them until it is released.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from inferpool.client.core import Header, header_template
from inferpool.wire import codec
from inferpool.wire.errors import Code, InferpoolError

if TYPE_CHECKING:
    from inferpool.client.shm_core import ShmSession

INPUT_REGION = "inputs"  # the name of the session's input region, as registered
HANDLE = {"output_handle": True}


class Releaser(Protocol):
    """Who takes a result's leases back: the session (broker path) or the lane."""

    def release(self, leases: list[tuple[Any, str]]) -> None: ...


class ShmResult:
    """A response whose outputs view shared memory in place: use them, then release.

    ``with client.run(req) as result:`` releases on leaving the block; the arrays must not
    be used after that (the server reuses the memory).
    """

    # a lane's result: where each output lies (client.lane's views), set by the lane; the
    # class's empty default spares every other result a list of its own
    layout: Sequence[Any] = ()

    def __init__(
        self,
        session: Releaser,
        model_name: str,
        model_version: str,
        outputs: dict[str, Any],
        parameters: dict[str, Any],
        leases: list[tuple[Any, str]],
    ) -> None:
        self._session = session
        self.model_name = model_name
        self.model_version = model_version
        self.outputs = outputs
        self.parameters = parameters
        self._leases = leases  # (token, region): a lane's tokens are output offsets

    def __getitem__(self, name: str) -> Any:
        return self.outputs[name]

    def as_torch(self, name: str) -> Any:
        """Output ``name`` as a torch tensor over the same memory (DLPack, no copy)."""
        import torch

        return torch.from_dlpack(self.outputs[name])

    @property
    def leases(self) -> list[Any]:
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
    """A reusable request: inputs live in the client's input region, written in place.

    Made by the client's ``request()``, which never waits: with no ``outputs`` given and
    none known for the model yet, the first ``run`` asks the server for them.
    """

    def __init__(
        self,
        session: ShmSession,
        model: str,
        outputs: Sequence[str] | None,
        version: str | int = "",
        parameters: dict[str, Any] | None = None,
    ) -> None:
        self._session = session
        self.model = model
        self.version = str(version)
        self._inputs: dict[str, dict[str, Any]] = {}
        self._slots: dict[str, int] = {}  # input -> offset in the session's input region
        # collected without close(): its blocks go back, with a ResourceWarning (as a file's)
        weakref.finalize(self, _collected, session, model, self._slots).atexit = False
        self._outputs: dict[str, dict[str, Any]] = {}  # output -> its parameters
        self.header: Header = {
            "type": "infer",
            "model_name": model,
            "model_version": self.version,
            "inputs": [],
            "outputs": [],
            "single_response": True,  # a decoupled model is refused up front
        }
        if parameters:
            self.header["parameters"] = dict(parameters)
        self.revision = 0  # bumped whenever an input or output changes
        self._template = (-1, b"")  # (revision, the header encoded up to its id)
        self.lane_cache: Any = None  # what a lane made of this revision (client.lane)
        self.resolve(outputs or ())
        self.resolved = outputs is not None  # whether every wanted output is known

    def resolve(self, outputs: Sequence[str]) -> None:
        """Ask for ``outputs`` as handles (those placed by output_to() stay where they are)."""
        for name in outputs:
            self._outputs.setdefault(name, HANDLE)
        self.resolved = True
        self._update()

    # ------------------------------------------------------------------ inputs
    def input(self, name: str, shape: Sequence[int], dtype: Any) -> np.ndarray:
        """A writable array for input ``name`` in shared memory: write the tensor into it.

        ``torch.from_numpy`` of the array is a tensor over the same memory.  Its dtype is in
        the machine's byte order, as the server reads the tensor: values of a byte-swapped
        ``dtype`` are converted as they are written into it.
        """
        dt = np.dtype(_numpy_dtype(dtype)).newbyteorder("=")
        datatype = codec.datatype_of(dt)
        if datatype == "BYTES":
            raise InferpoolError(Code.INVALID_ARG, f"input '{name}': use set_input() for BYTES")
        shape = codec.check_shape(list(shape), f"input '{name}'")
        count = codec.element_count(shape)
        offset = self._place(name, datatype, shape, count * dt.itemsize)
        return np.frombuffer(self._buffer(), dtype=dt, count=count, offset=offset).reshape(shape)

    def set_input(self, name: str, value: Any, datatype: str | None = None) -> None:
        """Copy ``value`` (numpy, torch, list; str/bytes for BYTES) into input ``name``."""
        arr = codec.as_array(value, datatype)
        datatype = datatype or codec.datatype_of(arr.dtype)
        if datatype == "BYTES":
            payload = codec.serialize_bytes(arr.reshape(-1))
            offset = self._place(name, datatype, list(arr.shape), len(payload))
            self._buffer()[offset : offset + len(payload)] = payload
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

    def _buffer(self) -> memoryview:
        region = self._session.region
        assert region is not None  # _place allocated in it
        return region.buf

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
            "parameters": _window(region, offset, nbytes),
        }
        self.header["inputs"] = list(self._inputs.values())
        self.revision += 1

    def _drop(self, name: str) -> None:
        offset = self._slots.pop(name, None)
        if offset is not None:
            self._session.free(offset)
        if self._inputs.pop(name, None) is not None:
            self.header["inputs"] = list(self._inputs.values())
            self.revision += 1

    # ------------------------------------------------------------------ outputs
    def output_to(self, name: str, region: str, byte_size: int, offset: int = 0) -> None:
        """Have output ``name`` written into a region this client registered, not a handle."""
        self._outputs[name] = _window(region, offset, byte_size)
        self._update()

    def _update(self) -> None:
        self.header["outputs"] = [{"name": n, "parameters": p} for n, p in self._outputs.items()]
        self.revision += 1

    def template(self) -> bytes:
        """The header as ``client.core.header_template`` encodes it, once per revision."""
        revision, template = self._template
        if revision != self.revision:
            template = header_template(self.header)
            self._template = (self.revision, template)
        return template

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Give the inputs' memory back to the client's input region."""
        for name in list(self._slots):
            self._drop(name)

    def __enter__(self) -> ShmRequest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _collected(session: ShmSession, model: str, slots: dict[str, int]) -> None:
    """A request collected without ``close()``: its input blocks go back to the session."""
    if slots:
        session.orphans.extend(slots.values())
        warnings.warn(
            f"a ShmRequest for model '{model}' was never closed: its {len(slots)} input "
            "block(s) are given back now; close() requests, or make them in a with block",
            ResourceWarning,
            stacklevel=2,
        )


def _window(region: str, offset: int, nbytes: int) -> dict[str, Any]:
    return {
        "shared_memory_region": region,
        "shared_memory_offset": offset,
        "shared_memory_byte_size": nbytes,
    }


def _numpy_dtype(dtype: Any) -> Any:
    """numpy dtypes as they are; torch dtypes through their numpy twin."""
    if type(dtype).__module__ == "torch":
        import torch

        return torch.empty(0, dtype=dtype).numpy().dtype
    return dtype


def output_view(
    buf: Any,
    offset: int,
    nbytes: int,
    spec: dict[str, Any],
    typed: tuple[np.dtype[Any], int] | None = None,
) -> np.ndarray:
    """Output ``spec`` as a read-only array over ``nbytes`` of ``buf`` at ``offset``;
    ``typed``: its numpy dtype and element count, where the caller keeps them (a lane)."""
    datatype, shape = spec["datatype"], spec["shape"]
    if datatype == "BYTES":
        view = memoryview(buf)[offset : offset + nbytes]
        return codec.array_from_buffer(view, datatype, shape, f"output '{spec['name']}'")
    dtype, count = typed or (codec.numpy_dtype(datatype), codec.element_count(shape))
    if count * dtype.itemsize != nbytes:
        raise InferpoolError(
            Code.INTERNAL,
            f"output '{spec['name']}': {nbytes} bytes cannot hold {datatype} {shape}",
        )
    array = np.frombuffer(buf, dtype, count, offset)
    return array if len(shape) == 1 else array.reshape(shape)
