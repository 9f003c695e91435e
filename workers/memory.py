"""A worker's view of shared memory: input views, its own output arena, client regions.

Regions are mapped once and cached: the broker's arena and this worker's output region by
their POSIX names, regions clients registered by their reference (``shm.refs``), which the
broker retires with an ``unmap`` once no request can use them any more.  Of a client's
object only the registered window is mapped, and it is checked once per batch that uses
it (``shm.window``): a client that shrank its object gets a request error, not a worker
killed by SIGBUS.  Another worker's output region (an ensemble step's or a BLS call's
tensor, read in place) is mapped read-only by its name and unmapped the same way once its
worker is gone.  The worker
allocates outputs inside the region the broker created for it, or writes them into a
client's registered window when the request asked so; the broker sends arena slots back
(``free``) once the client has them.  The output region is populated ahead of the
allocations that reach new parts of it (``shm.warm``); other regions are mapped without
populating: their pages fault in once, as they are first read.  The CUDA regions it opens
are listed (``take_opened``) for the broker, which waits only for the workers that opened
a CUDA region before it answers the region's unregister.  Lane threads
(workers/lanes.py) allocate and free outputs too, hence the allocator's lock.

A worker runs cold (woken after other processes went through the caches), and every object
it builds per request costs there, so an input's view is made once per place (region,
offset, size, datatype, shape) and handed out again when a request names the same place: a
pipeline's steps and a client's region name the same slots request after request (a lane
hands out its plan's views the same way); a view a backend makes of an output slot
(``Response.output_view``: the pytorch backend's tensor over it) is kept for the slot of
this worker's output region, which stays mapped at one address until ``close``, under the
slot's offset, datatype, shape and maker.  The slots the broker frees with a batch are
given back before the batch runs, so its outputs reuse the slot the last request's outputs
took: one slot in rotation, not two (giving them back after the answer saved 20 us that did
not show end to end, and doubled the slots in use).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import posix_ipc

from inferpool.backends.api import InputTensor, OutputTensor, Request, RequestedOutput, Response
from inferpool.backends.reshape import OutputReshape, to_config_shape
from inferpool.shm.arena import Allocator, ArenaFull
from inferpool.shm.cuda import CudaRegion, CudaUnavailable, RegionTooLarge
from inferpool.shm.refs import parse_ref
from inferpool.shm.region import Region, ShmExhausted
from inferpool.shm.warm import Warm
from inferpool.shm.window import ObjectChanged, ObjectWindow
from inferpool.wire import codec
from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.worker.protocol import Slot, TensorRef, Window

VIEWS = 64  # input views kept per region, at most (then they are made afresh)
ViewKey = tuple[str, int, int, str, tuple[int, ...], "tuple[int, ...] | None"]


class WorkerMemory:
    """Implements backends.api.OutputMemory over this worker's output arena."""

    def __init__(self, output_region: str, instance_name: str, prefault: int = 0) -> None:
        """``prefault``: how much of the output region to populate now."""
        self.instance_name = instance_name
        self.output = Region.attach(output_region)
        self._regions: dict[str, Mapped] = {self.output.name: self.output}
        self.allocator = Allocator(self.output.size)
        self.batch = 0  # advanced by the worker before each batch
        self._holders: list[Callable[[], None]] = []  # drop what else keeps input views
        self._lock = threading.Lock()
        self._views: dict[str, dict[ViewKey, InputTensor]] = {}  # by region, then place
        # views over slots of the output region (Response.output_view): it stays mapped,
        # at one address, until close()
        self._slot_views: dict[Any, Any] = {}
        self.opened: list[str] = []  # CUDA regions opened since take_opened (any thread)
        try:
            self.warm = Warm(self.output, prefault, f"the output region of '{instance_name}'")
        except ShmExhausted as exc:
            self.output.close()
            raise InferpoolError(Code.UNAVAILABLE, str(exc)) from None

    def _region(self, ref: str) -> Mapped:
        region = self._regions.get(ref)
        if region is None:
            region = self._regions[ref] = _open(ref)
            if type(region) is CudaRegion:
                with self._lock:
                    self.opened.append(ref)
        if type(region) is ObjectWindow:
            try:
                region.check(self.batch)
            except ObjectChanged as exc:
                raise InferpoolError(Code.INVALID_ARG, str(exc)) from None
        return region

    def locate(self, address: int, nbytes: int) -> tuple[str, int] | None:
        """Where ``nbytes`` at ``address`` lie, as (region, offset), when they are in a
        region the broker names that outlives this worker's answers (its arena, another
        worker's outputs); None elsewhere (this worker's own outputs, clients' regions,
        private memory)."""
        for ref, region in list(self._regions.items()):
            if type(region) is not Region or region is self.output or region.closed:
                continue
            base = np.frombuffer(region.buf, np.uint8).ctypes.data
            if base <= address and address + nbytes <= base + region.size:
                return ref, address - base
        return None

    def take_opened(self) -> list[str]:
        """The CUDA regions opened since the last call (the broker is told of them)."""
        with self._lock:
            opened, self.opened = self.opened, []
        return opened

    def hold_views(self, drop: Callable[[], None]) -> None:
        """``drop`` lets go of the input views its caller keeps: called before any unmap."""
        self._holders.append(drop)

    def checks(self, ref: str) -> bool:
        """Whether region ``ref`` is a client's window, checked again once per batch."""
        return type(self._regions.get(ref)) is ObjectWindow

    def check(self, ref: str) -> None:
        """Check a client's window once this batch (INVALID_ARG if its object shrank)."""
        self._region(ref)

    # ------------------------------------------------------------------ inputs
    def input_tensor(self, ref: TensorRef, reshape: tuple[int, ...] | None) -> InputTensor:
        """A read-only view of one input (or of a held sequence state)."""
        mapping = self._region(ref.region)
        if isinstance(mapping, CudaRegion):
            return _device_input(mapping, ref, reshape)
        return host_input(mapping, ref, reshape)

    def batch_input(self, ref: TensorRef, reshape: tuple[int, ...] | None) -> InputTensor:
        """An input of a batch's request: :meth:`input_tensor`, the same object each time
        a request names the same place (not for BYTES, whose elements are decoded copies,
        nor for a call's reply, whose slot goes back when its view is dropped)."""
        if ref.datatype == "BYTES":
            return self.input_tensor(ref, reshape)
        views = self._views.get(ref.region)
        key = (ref.name, ref.offset, ref.byte_size, ref.datatype, tuple(ref.shape), reshape)
        if views is not None:
            tensor = views.get(key)
            if tensor is not None:
                self._region(ref.region)  # a client's window is still checked once a batch
                return tensor
        tensor = self.input_tensor(ref, reshape)
        if lasting(tensor):
            if views is None or len(views) >= VIEWS:
                views = self._views[ref.region] = {}
            views[key] = tensor
        return tensor

    # ------------------------------------------------------------------ outputs
    def allocate(self, output: RequestedOutput | None, nbytes: int) -> tuple[str, int, Any]:
        if output is not None and output.target is not None:
            return self._in_window(output.name, output.target, nbytes)
        with self._lock:  # a lane thread allocates too
            try:
                offset = self.allocator.alloc(nbytes)
            except ArenaFull as exc:
                raise InferpoolError(
                    Code.UNAVAILABLE,
                    f"output arena of instance '{self.instance_name}' is full ({exc}): the "
                    "outputs its clients hold take it (responses not read yet, output handles "
                    "and lane results not released yet); retry once they are released, or "
                    "start the server with a larger --output-arena-size",
                ) from None
            if offset + nbytes > self.warm.upto:
                try:
                    self.warm.cover(offset + nbytes)
                except ShmExhausted as exc:
                    self.allocator.free(offset)
                    raise InferpoolError(Code.UNAVAILABLE, str(exc)) from None
        return self.output.name, offset, self.output.buf[offset : offset + nbytes]

    def _in_window(self, name: str, window: Window, nbytes: int) -> tuple[str, int, Any]:
        """Output ``name`` goes into the part of a client's region the request named."""
        ref, offset, size = window.ref, window.offset, window.byte_size
        if nbytes > size:
            raise InferpoolError(
                Code.INVALID_ARG,
                f"output '{name}' needs {nbytes} bytes but its shared-memory window holds "
                f"only {size} (shared_memory_byte_size)",
            )
        region = self._region(ref)
        if isinstance(region, CudaRegion):
            return ref, offset, region.array(offset, nbytes)
        local = offset - region.base
        if local < 0 or local + nbytes > region.size:
            raise InferpoolError(
                Code.INVALID_ARG, f"output '{name}' lies outside its shared-memory region"
            )
        return ref, offset, region.buf[local : local + nbytes]

    def slot_views(self, region: str) -> dict[Any, Any] | None:
        """The views kept over this worker's output slots; none over a client's region
        (unmapped when the broker retires it, and written rarely)."""
        return self._slot_views if region == self.output.name else None

    def release(self, region: str, offset: int) -> None:
        if region == self.output.name:
            with self._lock:
                self.allocator.free(offset)

    def free(self, slots: Sequence[Slot]) -> None:
        """Slots the broker (or a lane's client) is done with."""
        name, free = self.output.name, self.allocator.free
        with self._lock:
            for region, offset in slots:
                if region == name:
                    free(offset)

    def output_sizes(self, offsets: Iterable[int]) -> tuple[tuple[int, int], ...]:
        """(offset, size) of each block of this worker's output region at ``offsets``."""
        with self._lock:
            return tuple((offset, self.allocator.block_size(offset)) for offset in offsets)

    def free_outputs(self, offsets: Iterable[int]) -> None:
        """Blocks of this worker's output region, under one taking of the lock."""
        with self._lock:
            for offset in offsets:
                self.allocator.free(offset)

    def unmap(self, refs: Sequence[str]) -> None:
        """Client regions the broker retired: no request will name them again."""
        for drop in self._holders:  # what keeps views of them lets go first
            drop()
        for ref in refs:
            self._views.pop(ref, None)  # the views first: they keep the mapping alive
            region = self._regions.pop(ref, None)
            if region is not None:
                region.close()

    def close(self) -> None:
        for drop in self._holders:
            drop()
        self._views.clear()  # the views first: they keep the mappings alive
        self._slot_views.clear()
        for region in self._regions.values():
            region.close()
        self._regions.clear()


def lasting(tensor: InputTensor) -> bool:
    """Whether ``tensor`` may serve every request that names its place until the region is
    unmapped: a view of host memory (BYTES elements are decoded copies; a device array is
    made for each request)."""
    return tensor.memory == "cpu" and tensor.datatype != "BYTES"


def wanted_outputs(
    memory: WorkerMemory,
    request: Request,
    response: Response,
    reshapes: dict[str, OutputReshape],
    batched: bool,
) -> list[tuple[OutputTensor, tuple[int, ...]]]:
    """The outputs of ``response`` its client asked for, each with the shape the client sees
    (a reshaped output in the config's dims); the others are released as they go by."""
    wanted = request.requested_outputs
    found = []
    for name, out in response.outputs.items():
        if name not in wanted:
            memory.release(out.region, out.offset)
        elif reshapes and name in reshapes:
            found.append((out, tuple(to_config_shape(out.shape, reshapes[name], batched))))
        else:
            found.append((out, tuple(out.shape)))
    return found


def host_input(
    mapping: Region | ObjectWindow, ref: TensorRef, reshape: tuple[int, ...] | None
) -> InputTensor:
    """A read-only view of an input in host memory; INVALID_ARG if it is not inside
    ``mapping`` (an offset or size a client made up never reads past its region)."""
    name, datatype, nbytes = ref.name, ref.datatype, ref.byte_size
    offset = ref.offset - mapping.base  # a window of a client's object starts at its base
    if offset < 0 or nbytes < 0 or offset + nbytes > mapping.size:
        raise InferpoolError(
            Code.INVALID_ARG,
            f"input '{name}' lies outside shared-memory region {ref.region!r}",
        )
    if datatype == "BYTES":
        buf = mapping.buf[offset : offset + nbytes]
        data = codec.array_from_buffer(buf, datatype, ref.shape, f"input '{name}'")
    else:
        dtype = codec.numpy_dtype(datatype)  # read-only: a view of a read-only buffer
        data = np.frombuffer(mapping.buf.toreadonly(), dtype, nbytes // dtype.itemsize, offset)
        if len(ref.shape) != 1:
            data = data.reshape(ref.shape)
    if reshape is not None:
        data = data.reshape(reshape)
    return InputTensor(
        name, datatype, tuple(data.shape), data, nbytes, region=ref.region, offset=ref.offset
    )


Mapped = Region | ObjectWindow | CudaRegion


def _open(ref: str) -> Mapped:
    """Map the region a work item names (once: the caller caches it)."""
    try:
        parsed = parse_ref(ref)
    except ValueError as exc:
        raise InferpoolError(Code.INVALID_ARG, str(exc)) from None
    if parsed.kind == "cuda":
        try:
            return CudaRegion(parsed.handle, parsed.byte_size, parsed.gpu)
        except CudaUnavailable as exc:
            raise InferpoolError(Code.UNSUPPORTED, f"CUDA shared memory: {exc}") from None
        except RegionTooLarge as exc:  # Triton refuses it at registration, as INVALID_ARG
            raise InferpoolError(
                Code.INVALID_ARG, f"invalid CUDA shared-memory registration: {exc}"
            ) from None
        except Exception as exc:  # cupy's CUDARuntimeError: a bad or foreign handle
            raise InferpoolError(
                Code.INVALID_ARG, f"cannot open the CUDA IPC handle of a region: {exc}"
            ) from None
    try:
        if parsed.kind == "sys":
            return ObjectWindow(parsed.name, parsed.inode, parsed.offset, parsed.byte_size)
        # the broker's own regions (its arena, other workers' outputs) are only read
        return Region.attach(parsed.name, readonly=parsed.kind == "posix")
    except (posix_ipc.ExistentialError, FileNotFoundError):
        raise InferpoolError(
            Code.NOT_FOUND, f"shared-memory object '/{parsed.name}' no longer exists"
        ) from None
    except ObjectChanged as exc:  # replaced, or shrunk since it was registered
        raise InferpoolError(Code.INVALID_ARG, str(exc)) from None
    except (posix_ipc.Error, OSError, ValueError) as exc:
        raise InferpoolError(
            Code.INVALID_ARG, f"cannot map shared-memory object '/{parsed.name}': {exc}"
        ) from None


def _device_input(
    region: CudaRegion, ref: TensorRef, reshape: tuple[int, ...] | None
) -> InputTensor:
    """An input in a client's CUDA region: a cupy array over device memory, no copy; BYTES,
    which have no device form, decoded from a copy in host memory (as Triton's backends
    gather strings)."""
    if ref.datatype == "BYTES":
        host = region.array(ref.offset, ref.byte_size).get()  # blocks until it is here
        data = codec.array_from_buffer(host, "BYTES", ref.shape, f"input '{ref.name}'")
        if reshape is not None:
            data = data.reshape(reshape)
        return InputTensor(ref.name, "BYTES", tuple(data.shape), data, ref.byte_size)
    shape = tuple(reshape if reshape is not None else ref.shape)
    data = region.array(ref.offset, ref.byte_size).view(codec.numpy_dtype(ref.datatype))
    return InputTensor(
        ref.name, ref.datatype, shape, data.reshape(shape), ref.byte_size, "gpu", region.device
    )
