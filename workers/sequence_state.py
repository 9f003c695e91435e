"""Implicit sequence state, kept by the worker between the requests of a sequence.

Triton's sequence batcher keeps a stateful model's ``sequence_batching.state`` outputs and
feeds each back as the state input of the sequence's next request.  The broker sends every
request of a sequence to one instance (broker/models/sequencer.py), so that instance's worker keeps
them: a state output stays where the backend wrote it, in this worker's output arena, and
the next request of the same correlation id gets a read-only view of it as its state input
(no copy, no round trip through the broker; clients never see state tensors).

A sequence's state is dropped at its START, after its END, and when the broker releases it
(idle or cancelled: ``Execute.release``); a request that finds none gets the initial state
(``backends.sequence``: ``initial_state`` data, else zeros).  Slots that the current batch
may still read are freed when the next batch begins.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from inferpool.backends.api import (
    FLAG_SEQUENCE_START,
    InputTensor,
    Request,
    RequestedOutput,
    Response,
)
from inferpool.backends.sequence import SequenceInputs
from inferpool.wire.worker.protocol import CorrelationId, TensorRef, Work
from inferpool.workers.memory import WorkerMemory


class SequenceStates:
    """The implicit state of each sequence a worker serves."""

    def __init__(
        self, inputs_of: dict[str, str], memory: WorkerMemory, sequence: SequenceInputs
    ) -> None:
        self.inputs_of = inputs_of  # state output name -> state input name
        # the state outputs every request asks for: one RequestedOutput each, shared
        self.outputs = {name: RequestedOutput(name) for name in inputs_of}
        self.memory = memory
        self.sequence = sequence
        self.held: dict[CorrelationId, dict[str, TensorRef]] = {}  # -> state input -> slot
        self.retired: list[TensorRef] = []

    @classmethod
    def of(
        cls, config: Any, memory: WorkerMemory, sequence: SequenceInputs | None
    ) -> SequenceStates | None:
        """The state keeper a model config needs, or None for a model without state."""
        if sequence is None or not sequence.states:
            return None
        return cls(
            {s.output_name: s.input_name for s in config.sequence_batching.state}, memory, sequence
        )

    def begin(self, released: Sequence[CorrelationId]) -> None:
        """Before a batch: free what earlier batches no longer read, drop released sequences."""
        for ref in self.retired:
            self.memory.release(ref.region, ref.offset)
        self.retired = []
        for corr in released:
            self._drop(corr)

    def feed(
        self, work: Work, inputs: dict[str, InputTensor], wanted: dict[str, RequestedOutput]
    ) -> None:
        """Give a request its sequence's state inputs, and ask the backend for its state
        outputs, before the backend sees it."""
        wanted.update(self.outputs)
        corr = work.correlation_id
        held = self.held.get(corr)
        if held is None or work.flags & FLAG_SEQUENCE_START:
            self._drop(corr)
            self.sequence.add_initial_states(inputs)
            return
        for name, ref in held.items():
            if name not in inputs:
                inputs[name] = self.memory.input_tensor(ref, None)
        self.sequence.add_initial_states(inputs)  # a state the last response did not return

    def keep(self, request: Request, response: Response | None, final: bool) -> None:
        """Take the state outputs out of ``response`` and hold them for the next request."""
        corr = request.correlation_id
        if not corr:
            return
        if response is not None and response.error is None:
            for out_name, in_name in self.inputs_of.items():
                out = response.outputs.pop(out_name, None)
                if out is None:
                    continue
                held = self.held.setdefault(corr, {})
                old = held.get(in_name)
                if old is not None:
                    self.retired.append(old)
                held[in_name] = TensorRef(
                    in_name, out.datatype, out.shape, out.region, out.offset, out.byte_size
                )
        if final and request.sequence_end:
            self._drop(corr)

    def _drop(self, corr: CorrelationId) -> None:
        self.retired.extend(self.held.pop(corr, {}).values())
