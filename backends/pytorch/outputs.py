"""From the model's result to each request's response, written straight into shared memory.

The result may be a tensor, a ``List[str]`` or a tuple of those (the seed's rules and
messages).  A batched output is split back along the first dimension: each request's rows
are copied once, from the result into the array ``Response.output`` allocates in shared
memory, with no intermediate buffer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from inferpool.backends.api import Response
from inferpool.backends.batch_io import BatchIO
from inferpool.backends.pytorch import dtypes
from inferpool.backends.pytorch.inputs import Prepared
from inferpool.backends.pytorch.naming import OutputSpec
from inferpool.wire.errors import internal, invalid_arg

#: an output, its torch dtype (None: BYTES) and whether a request gets it
Write = tuple[OutputSpec, torch.dtype | None, bool]


def _type_name(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return "Tensor"
    names = {
        bool: "bool",
        int: "int",
        float: "float",
        str: "str",
        list: "List",
        dict: "Dict",
        tuple: "Tuple",
    }
    return names.get(type(value), type(value).__name__)


def _is_strings(value: list[Any]) -> bool:
    return all(isinstance(s, str) for s in value)


def normalize(result: Any) -> list[Any]:
    """The model's outputs as a list of tensors and string lists, or the seed's error."""
    if isinstance(result, tuple):
        outputs = []
        for i, item in enumerate(result):
            if isinstance(item, list) and not _is_strings(item):
                bad = next(s for s in item if not isinstance(s, str))
                raise internal(
                    f"PyTorch execute failure: output at index {i} must be of type Tensor or "
                    f"List[str], received List[{_type_name(bad)}]"
                )
            if not isinstance(item, torch.Tensor | list):
                raise internal(
                    f"PyTorch execute failure: output at index {i} must be of type Tensor or "
                    f"List[str], received {_type_name(item)}"
                )
            outputs.append(item)
        return outputs
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, list):
        if not _is_strings(result):
            bad = next(s for s in result if not isinstance(s, str))
            raise internal(
                "PyTorch execute failure: output must be of type Tensor or List[str], received "
                f"List[{_type_name(bad)}]"
            )
        return [result]
    raise internal(
        "PyTorch execute failure: output must be of type Tensor, List[str] or Tuple containing "
        "one of these two types. It should not be a List / Dictionary of Tensors or a Scalar"
    )


class OutputWriter:
    """Writes the model's outputs into each request's response."""

    def __init__(
        self, model: str, layout: dict[str, OutputSpec], batching: bool, batch_io: BatchIO
    ) -> None:
        self.model = model
        self.batch_io = batch_io
        self.layout = layout
        self.specs = list(layout.values())
        # each output with the torch dtype it must have (None: none, a BYTES output)
        self._typed = [(spec, dtypes.torch_dtype(spec.datatype)) for spec in self.specs]
        self.batching = batching
        self._checked = -1  # an output count check_indices has passed

    def check_indices(self, count: int) -> None:
        for spec in self.specs:
            if not 0 <= spec.index < count:
                raise invalid_arg(
                    f"The output {spec.name} in the model configuration refers to an output "
                    f"index which doesn't exist. This model has {count} outputs"
                )
        self._checked = count

    def writes(self, requested: dict[str, Any]) -> list[Write]:
        """Each output with its torch dtype and whether a lone request asking for the
        outputs ``requested`` gets it (a state always goes back to the sequence batcher)."""
        return [
            (spec, torch_dtype, spec.state or (spec.config_output and spec.name in requested))
            for spec, torch_dtype in self._typed
        ]

    def write(self, outputs: list[Any], batch: list[tuple[Prepared, Response]]) -> None:
        """Fill every response of ``batch``; a mismatch with the config fails the whole batch."""
        if len(batch) == 1 and not self.batch_io.outputs:
            prepared, response = batch[0]
            writes = self.writes(prepared.request.requested_outputs)
            self.write_alone(outputs, prepared.batch, response, writes)
            return
        if len(outputs) != self._checked:
            self.check_indices(len(outputs))
        rows = sum(p.batch for p, _ in batch)
        for spec, torch_dtype in self._typed:
            if spec.state:  # the sequence batcher's, whether or not the client asked
                wanted = batch
            elif not spec.config_output:
                wanted = []
            else:
                wanted = [pr for pr in batch if spec.name in pr[0].request.requested_outputs]
            value = outputs[spec.index]
            if spec.name in self.batch_io.outputs:
                self._check_dtype(spec, torch_dtype, value)
                self._write_scattered(spec, value, batch, wanted)
            elif isinstance(value, torch.Tensor):
                self._check_tensor(spec, torch_dtype, value, rows)
                self._write_tensor(spec, value, batch, wanted)
            else:
                self._check_strings(spec, value, rows)
                self._write_strings(spec, value, batch, wanted)

    def write_alone(
        self, outputs: list[Any], rows: int, response: Response, writes: list[Write]
    ) -> None:
        """The outputs of a batch of one request (``rows`` rows) into its ``response``, each
        checked against the config; ``writes``: what :meth:`writes` said of the request.
        A tensor goes through a tensor over its slot, made once per slot where the memory
        keeps views (``Response.output_view``; only copied into here, never kept)."""
        if len(outputs) != self._checked:
            self.check_indices(len(outputs))
        for spec, torch_dtype, asked in writes:
            value = outputs[spec.index]
            if isinstance(value, torch.Tensor):
                shape = self._check_tensor(spec, torch_dtype, value, rows)
                if asked:
                    view = response.output_view(spec.name, shape, spec.datatype, dtypes.as_tensor)
                    view.copy_(value)
            else:
                self._check_strings(spec, value, rows)
                if asked:
                    response.set_output(spec.name, _strings(value), "BYTES")

    def _check_tensor(
        self, spec: OutputSpec, torch_dtype: torch.dtype | None, value: torch.Tensor, rows: int
    ) -> torch.Size:
        """The output's shape (read once: each read of a tensor's is a call into torch),
        or the error why the output does not fit the config."""
        self._check_dtype(spec, torch_dtype, value)
        shape = value.shape
        if not shape:
            raise invalid_arg(f"output '{spec.name}' is a scalar which is not supported.")
        if self.batching and shape[0] != rows:
            raise invalid_arg(
                f"output '{spec.name}' of model '{self.model}' has {shape[0]} rows in its "
                f"batch dimension, but the batch holds {rows}"
            )
        return shape

    def _check_dtype(self, spec: OutputSpec, torch_dtype: torch.dtype | None, value: Any) -> None:
        if not isinstance(value, torch.Tensor) or value.dtype is not torch_dtype:
            provided = (
                f"TYPE_{dtypes.datatype_of(value.dtype)}"
                if isinstance(value, torch.Tensor)
                else "List[str]"
            )
            raise invalid_arg(
                f"configuration expects datatype {spec.config_type} for output '{spec.name}', "
                f"model provides {provided}"
            )

    def _check_strings(self, spec: OutputSpec, value: list[str], rows: int) -> None:
        if spec.datatype != "BYTES":
            raise invalid_arg(
                f"configuration expects datatype {spec.config_type} for output '{spec.name}', "
                "model provides List[str]"
            )
        if self.batching and len(value) != rows:
            raise invalid_arg(
                f"output '{spec.name}' of model '{self.model}' has {len(value)} strings, but "
                f"the batch holds {rows}"
            )

    def _slices(self, batch: list[tuple[Prepared, Response]]) -> dict[int, slice]:
        out, row = {}, 0
        for p, _ in batch:
            out[id(p)] = slice(row, row + p.batch) if self.batching else slice(None)
            row += p.batch
        return out

    def _write_tensor(
        self,
        spec: OutputSpec,
        value: torch.Tensor,
        batch: list[tuple[Prepared, Response]],
        wanted: list[tuple[Prepared, Response]],
    ) -> None:
        """Each request's rows of a batch's output, through views of their slots as
        :meth:`write_alone` writes them."""
        slices = self._slices(batch)
        name, datatype, as_tensor = spec.name, spec.datatype, dtypes.as_tensor
        for p, response in wanted:
            part = value[slices[id(p)]]
            response.output_view(name, part.shape, datatype, as_tensor).copy_(part)

    def _write_scattered(
        self,
        spec: OutputSpec,
        value: torch.Tensor,
        batch: list[tuple[Prepared, Response]],
        wanted: list[tuple[Prepared, Response]],
    ) -> None:
        """A batch output: each request's part shaped by its source input (batch_io)."""
        parts = self.batch_io.scatter(spec.name, value, [p.request for p, _ in batch])
        asked = {id(p) for p, _ in wanted}
        name, datatype, as_tensor = spec.name, spec.datatype, dtypes.as_tensor
        for (p, response), part in zip(batch, parts, strict=True):
            if id(p) in asked:
                response.output_view(name, part.shape, datatype, as_tensor).copy_(part)

    def _write_strings(
        self,
        spec: OutputSpec,
        value: list[str],
        batch: list[tuple[Prepared, Response]],
        wanted: list[tuple[Prepared, Response]],
    ) -> None:
        slices = self._slices(batch)
        for p, response in wanted:
            response.set_output(spec.name, _strings(value[slices[id(p)]]), "BYTES")


def _strings(value: list[str]) -> np.ndarray:
    """A list of str as the object array ``Response.set_output`` takes for BYTES."""
    strings = np.empty(len(value), dtype=object)
    strings[:] = value
    return strings
