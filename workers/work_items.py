"""What a batch's work item asks of this worker, worked out once for a stream of like items.

The worker's reader (wire/worker/reader.py) decodes a work item whose inputs and wanted
outputs repeat the last one's to the very same records: such items share a plan, made for
the first of them (with the pieces the worker used before: ``WorkerMemory.batch_input``,
the shared RequestedOutputs), and found again with an ``is`` on those records.  A plan
holds the inputs' views of host memory and the outputs the item wants, each in the order
the item names them; each request gets dicts of its own (the sequence state adds to them,
and so may a backend).  What cannot be kept is made for each request, as before: BYTES
elements (decoded copies) and device arrays.  A client's window is still checked once per
batch (``WorkerMemory.check``: an object that shrank is the request's error).

A plan cannot outlive what it views: it holds the records it was made for (so ``is`` never
meets another item's records under a reused id), and it is dropped before any unmap
(``WorkerMemory.hold_views``), so a retired region's mapping goes with its views and a
reference mapped again is read through its new mapping.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from inferpool.backends.api import InputTensor, RequestedOutput
from inferpool.wire.worker.protocol import TensorRef, WantedOutput, Work
from inferpool.workers.memory import WorkerMemory, lasting

Inputs = dict[str, InputTensor]
Wanted = dict[str, RequestedOutput]
# an input of a plan: its view (None: made for each request), where it lies, its reshape
Planned = tuple["InputTensor | None", TensorRef, "tuple[int, ...] | None"]


class Plan(NamedTuple):
    """How a request's inputs were viewed, kept for the next request that names the same places."""

    refs: Sequence[TensorRef]  # the item's inputs and wanted outputs, as the reader made
    outs: Sequence[WantedOutput]  # them: the plan's key, compared with ``is``
    inputs: Inputs  # every input's view, when each can be kept
    planned: list[Planned] | None  # else every input, in order
    windows: tuple[str, ...]  # the clients' windows the inputs lie in
    wanted: Wanted


class RequestPlans:
    """The plan of the latest work item; the worker's main thread asks for it."""

    def __init__(
        self,
        memory: WorkerMemory,
        reshapes: dict[str, tuple[int, ...]],
        batching: bool,
        shared: Wanted,
    ) -> None:
        """``reshapes``: the config's input reshapes; ``shared``: the outputs wanted in this
        worker's own region, one RequestedOutput each."""
        self.memory = memory
        self.reshapes = reshapes
        self.batching = batching
        self.shared = shared
        self._last: Plan | None = None
        memory.hold_views(self.clear)

    def clear(self) -> None:
        self._last = None

    def of(self, work: Work) -> tuple[Inputs, Wanted]:
        """The inputs and requested outputs of ``work``'s request (InferpoolError for an
        input it cannot read)."""
        plan = self._last
        memory = self.memory
        if plan is None or work.inputs is not plan.refs or work.outputs is not plan.outs:
            plan = self._last = self._make(work)
        else:
            for region in plan.windows:
                memory.check(region)
        if plan.planned is None:
            return dict(plan.inputs), dict(plan.wanted)
        inputs = {}
        for tensor, ref, reshape in plan.planned:
            inputs[ref.name] = memory.batch_input(ref, reshape) if tensor is None else tensor
        return inputs, dict(plan.wanted)

    def _make(self, work: Work) -> Plan:
        memory, reshapes = self.memory, self.reshapes
        planned: list[Planned] = []
        for ref in work.inputs:
            reshape = reshapes.get(ref.name)
            if reshape is not None and self.batching:
                reshape = (ref.shape[0], *reshape)
            tensor = memory.batch_input(ref, reshape)
            planned.append((tensor if lasting(tensor) else None, ref, reshape))
        kept = all(p[0] is not None for p in planned)
        inputs = {ref.name: tensor for tensor, ref, _ in planned if tensor is not None}
        windows = tuple({ref.region for ref in work.inputs if memory.checks(ref.region)})
        shared = self.shared
        wanted = {
            out.name: shared.get(out.name) or RequestedOutput(out.name)
            if out.window is None
            else RequestedOutput(out.name, out.window)
            for out in work.outputs
        }
        return Plan(
            work.inputs,
            work.outputs,
            inputs,
            None if kept else planned,
            windows,
            wanted,
        )
