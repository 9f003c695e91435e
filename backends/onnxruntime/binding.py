"""One execution's tensors bound to ONNX Runtime where they lie (IO binding).

Inputs are bound by address, where the worker maps them (a view of shared memory): ONNX
Runtime reads them there.  A batch of several requests is one input when the requests'
tensors lie back to back (``backends.spans``); otherwise they are copied into a batch buffer
the instance keeps for that input.  An output whose shape is known before the run (the
model's dimensions are fixed past the batch dimension) is bound to the response's own slot
in the worker's output region, so that ONNX Runtime writes the answer where the client
reads it: the response is a handle, nothing is copied.  Outputs of a batch of several
requests, outputs of variable shape and BYTES tensors are written by ONNX Runtime into its
own memory and copied once into each response.  Every byte copied is counted
(:attr:`Binder.copied`).

A KIND_GPU instance binds GPU inputs and outputs (a client's CUDA region) by their device
address, and host memory by its host address: ONNX Runtime moves what its CUDA execution
provider needs.  Its CUDA provider works on a stream of its own: a batch's GPU inputs are
joined on the device and the join finished before the run; after the run the outputs are
synchronized (``IOBinding.synchronize_outputs``), and copies out of ONNX Runtime's device
memory are finished before the binding lets that memory go.  Outputs ONNX Runtime allocated
are read by their address (``OrtValue.data_ptr``), as every supported version allows.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from inferpool.backends.api import (
    InputTensor,
    Request,
    Response,
    batch_size_of,
    copy_into,
    now_ns,
)
from inferpool.backends.batch_io import BatchIO
from inferpool.backends.onnxruntime.element_types import element_type
from inferpool.backends.spans import Joiner
from inferpool.shm import cuda
from inferpool.wire import codec
from inferpool.wire.errors import internal, invalid_arg


@dataclass(frozen=True)
class OutputSpec:
    """A model output a request may get: its wire datatype and the model's shape (-1 for
    a variable dimension, the batch dimension included)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def known(self, rows: int, batching: bool) -> tuple[int, ...] | None:
        """The output's shape for a batch of ``rows`` rows, when fixed before the run."""
        if self.datatype == "BYTES":
            return None
        dims = self.shape[1:] if batching else self.shape
        if any(d < 0 for d in dims):
            return None
        return (rows, *dims) if batching else dims


def _address(data: Any) -> int:
    if type(data) is np.ndarray:
        return int(data.__array_interface__["data"][0])
    return int(data.__cuda_array_interface__["data"][0])


def _strings(name: str, parts: Sequence[InputTensor], ragged: bool) -> np.ndarray:
    """BYTES inputs as the str array ONNX Runtime takes (UTF-8), joined along the batch
    (one after another, flat, when ``ragged``)."""
    arrays = [BatchIO.flat(p.data) if ragged else p.data for p in parts]
    joined = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
    out = np.empty(joined.shape, dtype=object)
    flat = out.reshape(-1)
    for i, item in enumerate(joined.reshape(-1)):
        try:
            flat[i] = item.decode("utf-8") if isinstance(item, bytes) else str(item)
        except UnicodeDecodeError as exc:
            raise invalid_arg(
                f"element {i} of input '{name}' is not valid UTF-8 ({exc.reason}); ONNX "
                "Runtime strings must be UTF-8"
            ) from None
    return out


class Binder:
    """Binds and runs one batch at a time on one session (an instance's)."""

    def __init__(
        self,
        session: Any,
        run_options: Any,
        outputs: dict[str, OutputSpec],
        batching: bool,
        on_gpu: bool,
        ordinal: int,
        bound: bool,
        batch_io: BatchIO,
    ) -> None:
        """``bound``: whether tensors are bound where they lie (IO binding, which ONNX
        Runtime offers only for models without BYTES tensors); ``batch_io``: the model's
        ragged inputs, batch inputs and batch outputs."""
        self.session = session
        self.run_options = run_options
        self.outputs = outputs
        self.batching = batching
        self.on_gpu = on_gpu
        self.ordinal = ordinal
        self.device = ("cuda", ordinal)
        self.bound = bound
        self.batch_io = batch_io
        self.binding = session.io_binding()
        self.copied = 0  # bytes copied, in all
        self.joiners: dict[str, Joiner] = {}  # by input name: the buffers batches are joined in
        self.device_reads = False  # an output in ONNX Runtime's device memory was read

    def _gather(self, parts: Sequence[InputTensor]) -> Any:
        """One input of every request of the batch, as one array where they lie (a ragged
        input's parts flat, one after another)."""
        first = parts[0]
        ragged = first.name in self.batch_io.ragged
        if first.datatype == "BYTES":
            return _strings(first.name, parts, ragged)
        on_host = all(p.memory == "cpu" for p in parts)
        if len(parts) == 1:
            data = BatchIO.flat(first.data) if ragged else first.data
        else:
            arrays = [BatchIO.flat(p.data) if ragged else p.data for p in parts]
            if on_host:
                data, copied = self.joiners.setdefault(first.name, Joiner()).join(arrays)
                self.copied += copied
            else:  # parts on a GPU: the device joins them, before ONNX Runtime reads them
                import cupy

                data = cupy.concatenate([cuda.as_cupy(a) for a in arrays])
                cupy.cuda.get_current_stream().synchronize()
                self.copied += data.nbytes
        if not on_host and not (self.on_gpu and self.bound):  # GPU memory, read on the host
            data = codec.host_array(data)
            self.copied += data.nbytes
        return data

    def run(self, group: Sequence[Request], responses: Sequence[Response], rows: int) -> int:
        """Run ``group`` (requests of one signature, ``rows`` rows in all) and fill
        ``responses``; return when the inputs were ready (the compute start)."""
        names = list(group[0].inputs)
        inputs = [self._gather([r.inputs[n] for r in group]) for n in names]
        if self.batch_io.inputs:  # built in host memory, as Triton's backends build them
            built = self.batch_io.build(group)
            names.extend(built)
            inputs.extend(built.values())
        wanted = [spec for name, spec in self.outputs.items() if _wanted(name, group)]
        if not self.bound:  # a model with BYTES tensors: ONNX Runtime's run()
            compute_start = now_ns()
            values = self._call(
                self.session.run, [s.name for s in wanted], dict(zip(names, inputs, strict=True))
            )
            for spec, value in zip(wanted, values, strict=True):
                self._scatter(spec, value, group, responses)
            return compute_start
        binding = self.binding
        try:
            for name, data in zip(names, inputs, strict=True):
                device, ordinal = ("cpu", 0) if type(data) is np.ndarray else self.device
                dtype = element_type(data.dtype)
                binding.bind_input(name, device, ordinal, dtype, data.shape, _address(data))
            pending = [(spec, self._bind_output(spec, group, responses, rows)) for spec in wanted]
            compute_start = now_ns()
            self._call(self.session.run_with_iobinding, binding, self.run_options)
            if self.on_gpu:
                binding.synchronize_outputs()
            for (spec, target), value in zip(pending, binding.get_outputs(), strict=True):
                if target is None:
                    self._scatter(spec, value, group, responses)
                elif target is not _PLACED:
                    copy_into(target, self._readable(spec, value))
                    self.copied += target.nbytes
            if self.device_reads:  # copies out of ONNX Runtime's device memory end before
                self.device_reads = False  # the binding frees it
                cuda.synchronize([self.ordinal])
            return compute_start
        finally:
            binding.clear_binding_inputs()
            binding.clear_binding_outputs()

    def _call(self, run: Any, *args: Any) -> Any:
        try:
            return run(*args) if run is not self.session.run else run(*args, self.run_options)
        except Exception as exc:
            raise internal(f"onnx runtime error: {exc}") from None

    def _bind_output(
        self, spec: OutputSpec, group: Sequence[Request], responses: Sequence[Response], rows: int
    ) -> Any:
        """Bind output ``spec`` to its response's slot where it can be (one request, a known
        shape): :data:`_PLACED`.  Else ONNX Runtime writes it into its own memory, to be
        copied after the run into each response (None), or into the slot already taken (a
        GPU slot a CPU instance cannot write): that slot."""
        alone = len(group) == 1 and spec.name not in self.batch_io.outputs
        shape = spec.known(rows, self.batching) if alone else None
        if shape is None:
            self.binding.bind_output(spec.name, "cuda" if self.on_gpu else "cpu", self.ordinal)
            return None
        target = responses[0].output(spec.name, shape, spec.datatype)
        on_host = type(target) is np.ndarray
        if not on_host and not self.on_gpu:
            self.binding.bind_output(spec.name, "cpu", 0)
            return target
        device, ordinal = ("cpu", 0) if on_host else ("cuda", self.ordinal)
        dtype = element_type(target.dtype)
        self.binding.bind_output(spec.name, device, ordinal, dtype, shape, _address(target))
        return _PLACED

    def _scatter(
        self, spec: OutputSpec, value: Any, group: Sequence[Request], responses: Sequence[Response]
    ) -> None:
        """Copy an output ONNX Runtime wrote into its own memory into each response that
        asked for it (its rows of the batch)."""
        data = self._readable(spec, value)
        if spec.name in self.batch_io.outputs:  # split by its source input's shapes
            parts = self.batch_io.scatter(spec.name, data, group)
            for request, response, part in zip(group, responses, parts, strict=True):
                if spec.name in request.requested_outputs:
                    self._write(spec, part, response)
            return
        shape = tuple(data.shape)
        rows = sum(batch_size_of(r, True) for r in group) if self.batching else 0
        if self.batching and (not shape or shape[0] != rows):
            raise internal(
                f"output '{spec.name}' has shape {list(shape)}, but the batch holds {rows} rows"
            )
        row = 0
        for request, response in zip(group, responses, strict=True):
            n = batch_size_of(request, True) if self.batching else 0
            part = data[row : row + n] if self.batching else data
            row += n
            if spec.name in request.requested_outputs:
                self._write(spec, part, response)

    def _write(self, spec: OutputSpec, part: Any, response: Response) -> None:
        """Copy a request's part of output ``spec`` into its response."""
        if spec.datatype == "BYTES":
            response.set_output(spec.name, part, "BYTES")
            return
        target = response.output(spec.name, part.shape, spec.datatype)
        copy_into(target, part)
        self.copied += target.nbytes

    def _readable(self, spec: OutputSpec, value: Any) -> Any:
        """An output ONNX Runtime allocated (an ``OrtValue``), as an array over its memory,
        valid while ``value`` lives (BYTES: a copy).  Read by its address, not by DLPack:
        the ``OrtValue`` of ONNX Runtime before 1.24 (the last for Python 3.10 is 1.23) has
        no ``__dlpack__``."""
        if isinstance(value, np.ndarray):  # run() returns arrays
            return value
        if spec.datatype == "BYTES":
            return value.numpy()
        dtype = codec.numpy_dtype(spec.datatype)
        shape = tuple(value.shape())
        nbytes = math.prod(shape) * dtype.itemsize
        if value.device_name() != "cpu":
            self.device_reads = True
            raw = cuda.device_bytes(value.data_ptr(), nbytes, value, self.ordinal)
            return raw.view(dtype).reshape(shape)
        if nbytes == 0:
            return np.empty(shape, dtype)
        raw = (ctypes.c_char * nbytes).from_address(value.data_ptr())
        return np.frombuffer(raw, dtype=dtype).reshape(shape)


_PLACED = object()  # an output bound to its response's slot: nothing to copy


def _wanted(name: str, group: Sequence[Request]) -> bool:
    return any(name in r.requested_outputs for r in group)
