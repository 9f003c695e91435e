"""From a batch of requests to the model's forward arguments.

Each request is checked on its own first (inputs present, datatypes, shapes, batch size,
UTF-8 strings), so a bad request gets its own error and the rest still run.  The good ones
are then joined along the batch dimension:

* one request: its shared-memory views become tensors as they are (``torch.from_numpy``),
  then go to the device inputs are gathered on if they are elsewhere;
* several requests whose inputs lie back to back in one buffer (as a batcher that places a
  batch in consecutive arena slots leaves them): one view over the whole span, no copy;
* otherwise one copy of each request into a batch tensor on the instance's device.

A ragged input's requests may differ in shape: each is flattened and they are joined one
after another; the batch inputs are built for the batch (``backends.batch_io``).

Inputs are gathered on the instance's GPU for KIND_GPU, on the CPU for KIND_CPU and
KIND_MODEL (a KIND_MODEL model moves them itself).  Copies to a GPU are queued on the
instance's stream (the forward pass follows on it); a copy from a GPU to the CPU (an input
in a client's CUDA region sent to a KIND_CPU or KIND_MODEL instance) blocks, as the forward
pass reads it on the CPU at once.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from inferpool.backends.api import InputTensor, Request, checked_batch_size
from inferpool.backends.batch_io import BatchIO
from inferpool.backends.pytorch import dtypes
from inferpool.backends.pytorch.naming import InputLayout, TensorSpec
from inferpool.backends.sequence import Control, State
from inferpool.backends.spans import contiguous_span
from inferpool.wire.errors import InferpoolError, invalid_arg


def _shape_str(shape: Any) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _matches(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    return len(shape) == len(dims) and all(
        d < 0 or d == s for s, d in zip(shape, dims, strict=True)
    )


class Prepared(NamedTuple):
    """A request that passed its checks: batch size and every forward value it feeds."""

    request: Request
    batch: int
    values: dict[str, Any]  # name -> ndarray, GPU tensor or list[str]


_prepared = tuple.__new__  # built per request: without NamedTuple's Python-level __new__


class InputAssembler:
    """Turns a batch's requests into the forward call's arguments."""

    def __init__(
        self,
        model: str,
        inputs: list[TensorSpec],
        controls: list[Control],
        states: list[State],
        layout: InputLayout,
        max_batch_size: int,
        device: torch.device,
        batch_io: BatchIO,
    ) -> None:
        self.model = model
        self.batch_io = batch_io
        self.device = device  # where inputs are gathered (the instance's)
        self.on_gpu = device.type != "cpu"  # asked once: a device's type is a new string
        self.inputs = inputs
        self.controls = controls
        self.states = states
        self.layout = layout
        self.max_batch_size = max_batch_size
        self.batching = max_batch_size > 0
        self.specs: dict[str, TensorSpec] = {s.name: s for s in inputs}
        for state in states:
            self.specs[state.input_name] = TensorSpec(
                state.input_name, state.config_type, state.dims
            )
        for control in controls:
            self.specs[control.name] = TensorSpec(control.name, control.config_type, (1,))
        self.names = {s.name for s in inputs}  # what a request without sequence inputs gives
        # (name, forward argument position, reshape) of each forward value
        self.positions = [
            (n, i, self.specs[n].reshape) for n, i in layout.index.items() if n in self.specs
        ]
        self.built = [(n, i) for n, i in layout.index.items() if n not in self.specs]

    # ------------------------------------------------------------------ one request
    def prepare(self, request: Request) -> Prepared:
        """Check ``request`` and collect its values; InferpoolError for this request only."""
        given = request.inputs
        if given.keys() != self.names:  # not exactly the config's inputs: say what is wrong
            self._check_names(request)
        batch = (
            checked_batch_size(given[self.inputs[0].name], self.max_batch_size, self.model)
            if self.batching
            else 1
        )
        value = self._value
        values = {s.name: value(given[s.name], s, batch) for s in self.inputs}
        prepared = _prepared(Prepared, (request, batch, values))
        if self.controls or self.states:
            self._sequence_values(request, prepared)
        return prepared

    def _check_names(self, request: Request) -> None:
        given = request.inputs
        missing = [s.name for s in self.inputs if s.name not in given]
        if missing:
            raise invalid_arg(
                f"expected {len(self.inputs)} inputs but got {len(request.inputs)} inputs for "
                f"model '{self.model}'. Got input(s) {sorted(request.inputs)}, but missing "
                f"required input(s) {missing}. Please provide all required input(s)."
            )
        for name in given:
            if name not in self.specs:
                raise invalid_arg(f"unexpected inference input '{name}' for model '{self.model}'")

    def _sequence_values(self, request: Request, prepared: Prepared) -> None:
        """The sequence batcher's control inputs and the states (backends.sequence)."""
        for control in self.controls:
            prepared.values[control.name] = self._value(
                request.input(control.name), self.specs[control.name], prepared.batch
            )
        for state in self.states:  # the initial value or its predecessor's
            if not request.has_input(state.input_name):
                raise invalid_arg(
                    f"request '{request.id}' of a sequence of model '{self.model}' carries no "
                    f"state input '{state.input_name}'; each request must feed the "
                    f"'{state.output_name}' its predecessor returned"
                )
            prepared.values[state.input_name] = self._value(
                request.input(state.input_name), self.specs[state.input_name], prepared.batch
            )

    def _value(self, tensor: InputTensor, spec: TensorSpec, batch: int) -> Any:
        if tensor.datatype != spec.datatype:
            raise invalid_arg(
                f"inference input '{spec.name}' data-type is '{tensor.datatype}', but model "
                f"'{self.model}' expects '{spec.datatype}'"
            )
        shape = tensor.shape
        if self.batching:
            if not shape or shape[0] != batch:
                raise invalid_arg(
                    f"input '{spec.name}' has shape {_shape_str(shape)}, but the request's "
                    f"batch size is {batch} (from input '{self.inputs[0].name}'): every input "
                    f"of a request shares the batch dimension (model '{self.model}')"
                )
            shape = shape[1:]
        if shape != spec.dims and not (
            _matches(shape, spec.dims) or _matches(shape, spec.model_dims)
        ):
            expected = ((-1,) if self.batching else ()) + spec.dims
            raise invalid_arg(
                f"unexpected shape for input '{spec.name}' for model '{self.model}'. Expected "
                f"{_shape_str(expected)}, got {_shape_str(tensor.shape)}"
            )
        if tensor.memory != "cpu":
            return dtypes.as_tensor(tensor.data)
        if tensor.datatype == "BYTES":
            return _strings(tensor)
        return tensor.data

    # ------------------------------------------------------------------ the batch
    def split_uniform(
        self, batch: list[Prepared]
    ) -> tuple[list[Prepared], list[tuple[Prepared, InferpoolError]]]:
        """Keep the requests whose non-batch shapes agree with the first; fail the others."""
        if len(batch) < 2:
            return batch, []
        ragged = self.batch_io.ragged
        reference = {name: _tail(v, self.batching) for name, v in batch[0].values.items()}
        kept, rejected = [batch[0]], []
        for p in batch[1:]:
            for name, value in p.values.items():
                if name in ragged:  # its requests may differ in shape
                    continue
                tail = _tail(value, self.batching)
                if tail != reference[name]:
                    rejected.append(
                        (
                            p,
                            invalid_arg(
                                f"input '{name}' of request '{p.request.id}' has shape "
                                f"{_shape_str(tail)} past the batch dimension, other requests "
                                f"of the batch have {_shape_str(reference[name])}; requests of "
                                f"different shapes cannot be batched (model '{self.model}')"
                            ),
                        )
                    )
                    break
            else:
                kept.append(p)
        return kept, rejected

    def forward_args(self, batch: list[Prepared]) -> list[Any]:
        """The positional forward arguments (a single dict for a Dict[str, Tensor] model)."""
        join = self._join
        built = self._built(batch) if self.built else {}
        if self.layout.is_dict:
            values = {name: join(name, reshape, batch) for name, _, reshape in self.positions}
            return [{**values, **built}]
        args: list[Any] = [None] * self.layout.arg_count
        for name, position, reshape in self.positions:
            args[position] = join(name, reshape, batch)
        for name, position in self.built:
            args[position] = built[name]
        return args

    def _built(self, batch: list[Prepared]) -> dict[str, torch.Tensor]:
        """The batch inputs of ``batch``, on the device inputs are gathered on."""
        built = self.batch_io.build([p.request for p in batch])
        return {
            name: torch.from_numpy(value).to(self.device, non_blocking=self.on_gpu)
            for name, value in built.items()
        }

    def _join(
        self,
        name: str,
        reshape: tuple[int, ...] | None,
        batch: list[Prepared],
    ) -> Any:
        """Input ``name`` of every request of ``batch`` as one value (reshaped as configured;
        a ragged input flat)."""
        if name in self.batch_io.ragged:
            return self._join_ragged(name, batch)
        if len(batch) == 1:
            value = batch[0].values[name]
            if isinstance(value, list):
                return value
            tensor = dtypes.as_tensor(value)
            if self.on_gpu:
                tensor = tensor.to(self.device, non_blocking=True)
            elif type(value) is not np.ndarray:  # a GPU input gathered on the CPU: blocks
                tensor = tensor.to(self.device)
        else:
            parts = [p.values[name] for p in batch]
            if isinstance(parts[0], list):
                return [s for part in parts for s in part]
            if (
                all(isinstance(p, np.ndarray) for p in parts)
                and (span := contiguous_span(parts)) is not None
            ):
                tensor = dtypes.as_tensor(span).to(self.device, non_blocking=self.on_gpu)
            else:
                tensor = _copy_into_batch(parts, self.device)
        if reshape is not None:
            tensor = tensor.reshape((tensor.shape[0], *reshape) if self.batching else reshape)
        return tensor

    def _join_ragged(self, name: str, batch: list[Prepared]) -> Any:
        """A ragged input: every request's elements one after another, one dimension."""
        parts = [p.values[name] for p in batch]
        if isinstance(parts[0], list):
            return [s for part in parts for s in part]
        flat = [dtypes.as_tensor(BatchIO.flat(p)) for p in parts]
        if len(flat) == 1:
            return flat[0].to(self.device, non_blocking=self.on_gpu)
        return _copy_into_batch(flat, self.device)


def _queued(device: torch.device) -> bool:
    """Whether a copy to ``device`` may be queued: only on a GPU, whose stream orders it
    before the forward pass; a copy to the CPU must have landed before the CPU reads it."""
    return device.type != "cpu"


def _strings(tensor: InputTensor) -> list[str]:
    """A BYTES input as the List[str] a TorchScript model takes (UTF-8)."""
    out = []
    for i, item in enumerate(tensor.data.reshape(-1)):
        try:
            out.append(item.decode("utf-8") if isinstance(item, bytes) else str(item))
        except UnicodeDecodeError as exc:
            raise invalid_arg(
                f"element {i} of input '{tensor.name}' is not valid UTF-8 ({exc.reason}); "
                "TorchScript strings must be UTF-8"
            ) from None
    return out


def _tail(value: Any, batching: bool) -> tuple[int, ...]:
    if isinstance(value, list):
        return ()
    shape = tuple(value.shape)
    return shape[1:] if batching else shape


def _copy_into_batch(parts: list[Any], device: torch.device) -> torch.Tensor:
    tensors = [dtypes.as_tensor(p) for p in parts]
    rows = sum(t.shape[0] for t in tensors)
    out = torch.empty((rows, *tensors[0].shape[1:]), dtype=tensors[0].dtype, device=device)
    row = 0
    for t in tensors:
        out[row : row + t.shape[0]].copy_(t, non_blocking=_queued(device))
        row += t.shape[0]
    return out
