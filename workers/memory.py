"""A worker's view of shared memory: input views and its own output arena.

Regions are mapped once and cached.  The worker allocates outputs inside the region the
broker created for it; the broker sends slots back (``free``) once the client has them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from backends.api import InputTensor, RequestedOutput
from client import wire
from client.errors import Code, InferpoolError
from shm.arena import Allocator, ArenaFull
from shm.region import Region, RegionCache


class WorkerMemory:
    """Implements backends.api.OutputMemory over this worker's output arena."""

    def __init__(self, output_region: str, instance_name: str) -> None:
        self.instance_name = instance_name
        self.inputs = RegionCache(populate=True)
        self.output = Region.attach(output_region, populate=True)
        self.inputs.add(self.output)
        self.allocator = Allocator(self.output.size)

    # ------------------------------------------------------------------ inputs
    def input_tensor(self, spec: list[Any], reshape: tuple[int, ...] | None) -> InputTensor:
        """A read-only view of one input: [name, datatype, shape, region, offset, nbytes]."""
        name, datatype, shape, region, offset, nbytes = spec
        mapping = self.inputs.get(region)
        if offset < 0 or offset + nbytes > mapping.size:
            raise InferpoolError(
                Code.INVALID_ARG, f"input '{name}' lies outside shared-memory region {region!r}"
            )
        if datatype == "BYTES":
            buf = mapping.buf[offset : offset + nbytes]
            data = wire.array_from_buffer(buf, datatype, shape, f"input '{name}'")
        else:
            dtype = wire.numpy_dtype(datatype)
            data = np.frombuffer(
                mapping.buf, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset
            )
            data.flags.writeable = False
            if len(shape) != 1:
                data = data.reshape(shape)
        if reshape is not None:
            data = data.reshape(reshape)
            shape = list(reshape)
        return InputTensor(name, datatype, tuple(shape), data, nbytes)

    # ------------------------------------------------------------------ outputs
    def allocate(self, output: RequestedOutput | None, nbytes: int) -> tuple[str, int, Any]:
        try:
            offset = self.allocator.alloc(nbytes)
        except ArenaFull as exc:
            raise InferpoolError(
                Code.UNAVAILABLE,
                f"output arena of instance '{self.instance_name}' is full: {exc}. Release "
                "output handles sooner or start the server with a larger --output-arena-size",
            ) from None
        return self.output.name, offset, self.output.buf[offset : offset + nbytes]

    def release(self, region: str, offset: int) -> None:
        if region == self.output.name:
            self.allocator.free(offset)

    def free(self, frees: list[list[Any]]) -> None:
        """Slots the broker is done with."""
        name = self.output.name
        for region, offset in frees:
            if region == name:
                self.allocator.free(offset)

    def close(self) -> None:
        self.inputs.close()
