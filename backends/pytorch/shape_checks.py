"""Checked once per request signature: what a lone request of a known shape skips.

A client sends the same inputs (names, datatypes, shapes, memory) and asks for the same
outputs over and over.  Everything ``InputAssembler.prepare`` checks of a request follows
from that signature, and so does everything ``forward_args`` and ``OutputWriter.writes``
decide for it: the rows, which input feeds which forward argument and how it becomes a
tensor, which outputs are written.  The first lone request of a signature runs the full
checks; a :class:`Plan` keeps what they decided, and the next request of the signature is
checked by one tuple built and one dict lookup (:meth:`Plans.get`), then runs through the
same execution as any batch with the plan's answers in place of the per-request work.

Only what the signature decides is planned: host-memory tensors, for a model without
sequence controls or states, on an instance that runs on the CPU alone (the instance asks
before it makes or uses a plan).  BYTES inputs (whose strings are checked per request), GPU
memory, sequences and batches of several requests take the general path every time.  The
model's outputs are checked on every execution: the signature decides what the model is
given, not what it returns.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable
from typing import Any

import torch

from inferpool.backends.api import InputTensor, Request
from inferpool.backends.pytorch import dtypes
from inferpool.backends.pytorch.inputs import InputAssembler, Prepared
from inferpool.backends.pytorch.outputs import OutputWriter, Write

#: how many signatures are kept: a model with variable dimensions sees many; past this
#: many the oldest are forgotten (and checked again when they come back)
LIMIT = 64

_INPUT_KEY = operator.attrgetter("name", "datatype", "shape", "memory")
_deref = weakref.ref.__call__  # a weak reference's object (None once it is gone)


def signature(request: Request) -> tuple[Any, ...]:
    """What every check of a request depends on: its inputs' names, datatypes, shapes and
    memory (in the request's order), and the outputs it asks for."""
    return tuple(map(_INPUT_KEY, request.inputs.values())), tuple(request.requested_outputs)


def _converter(datatype: str) -> Callable[[Any], torch.Tensor]:
    """How a host-memory input of ``datatype`` becomes a tensor over the same memory."""
    if datatype == "BF16" or not dtypes.FROM_NUMPY_READ_ONLY:
        return dtypes.as_tensor
    return torch.from_numpy


def over(given: InputTensor, convert: Callable[[Any], torch.Tensor]) -> torch.Tensor:
    """``convert(given.data)``, made once and kept with the input (``InputTensor.made``):
    the worker hands out the same input object for every request naming the same place,
    and a new one once the memory there is another (a region unmapped and mapped again),
    so a tensor kept with it sees the memory its ``data`` sees, and goes with it.  It is
    taken only for the very ``data`` and ``convert`` it was made of (never another
    datatype's or shape's)."""
    data = given.data
    made = given.made
    if made is None or made[0] is not data or made[1] is not convert:
        made = given.made = (data, convert, convert(data))
    return made[2]


class Plan:
    """What the checks of one signature decided: the request's rows, the forward arguments
    (input name, how it becomes a tensor, the shape a configured reshape gives it) in
    forward order, and each output with whether the request asked for it."""

    __slots__ = ("is_dict", "rows", "takes", "writes")

    def __init__(
        self,
        rows: int,
        takes: list[tuple[str, Callable[[Any], torch.Tensor], tuple[int, ...] | None]],
        is_dict: bool,
        writes: list[Write],
    ) -> None:
        self.rows = rows
        self.takes = takes
        self.is_dict = is_dict
        self.writes = writes

    def forward_args(self, inputs: dict[str, InputTensor]) -> list[Any]:
        """The forward arguments of a request of this signature, over its inputs' memory:
        each a tensor of its own (``detach``: a shape the model changes in place is not
        the next request's), a view of the tensor made once per input place (:func:`over`)."""
        args = []
        for name, convert, shape in self.takes:
            tensor = over(inputs[name], convert)
            args.append(tensor.detach() if shape is None else tensor.reshape(shape))
        if self.is_dict:
            return [{name: tensor for (name, _, _), tensor in zip(self.takes, args, strict=True)}]
        return args


class Plans:
    """The plans of the signatures an instance has seen, up to :data:`LIMIT` of them."""

    def __init__(self, assembler: InputAssembler, writer: OutputWriter) -> None:
        self.assembler = assembler
        self.writer = writer
        # what no signature changes: inputs gathered on the CPU, no sequence inputs
        self.enabled = not assembler.on_gpu and not (assembler.controls or assembler.states)
        self._known: dict[tuple[Any, ...], Plan] = {}
        # the plan found last, with the inputs (weakly: their memory is not kept mapped for
        # it) and the output names of the request it was found for
        self._last: tuple[tuple[weakref.ref[InputTensor], ...], tuple[str, ...], Plan] | None
        self._last = None

    def get(self, request: Request) -> Plan | None:
        """The plan of ``request``'s signature, if one was made.  A request with the very
        inputs of the last one found (the same objects, alive, in the same order) asking
        for the same outputs has its signature: an input object keeps its name, datatype,
        shape and memory (a worker hands out one per place); it skips the lookup."""
        last = self._last
        if last is not None:
            refs, wanted, plan = last
            inputs = tuple(request.inputs.values())  # InputTensor: equal only when the same
            if tuple(map(_deref, refs)) == inputs and tuple(request.requested_outputs) == wanted:
                return plan
        found = self._known.get(signature(request)) if self._known else None
        if found is not None:
            refs = tuple(map(weakref.ref, request.inputs.values()))
            self._last = (refs, tuple(request.requested_outputs), found)
        return found

    def add(self, prepared: Prepared) -> None:
        """Keep the plan of a lone request that passed every check, if its signature
        decides all of its execution."""
        request = prepared.request
        if not self.enabled or any(
            t.memory != "cpu" or t.datatype == "BYTES" for t in request.inputs.values()
        ):
            return
        known = self._known
        if len(known) >= LIMIT:
            del known[next(iter(known))]
        assembler = self.assembler
        layout = assembler.layout
        takes = []
        for name, _, reshape in sorted(assembler.positions, key=lambda p: p[1]):
            shape = None
            if reshape is not None:
                shape = (prepared.batch, *reshape) if assembler.batching else reshape
            takes.append((name, _converter(request.inputs[name].datatype), shape))
        writes = self.writer.writes(request.requested_outputs)
        known[signature(request)] = Plan(prepared.batch, takes, layout.is_dict, writes)
