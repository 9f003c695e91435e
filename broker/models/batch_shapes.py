"""Which requests may share a batch: Triton's equal-shape rule.

A backend runs a batch as one tensor per input, so requests go in one batch only when each
input has the same shape past the batch dimension.  An input whose dims are all fixed always
has (admission checks it); an input with a variable dimension (-1) is compared, unless it
sets ``allow_ragged_batch`` (its requests may differ: ``backends.batch_io``).  In a model
with optional inputs, requests go together only when they give the same inputs.

Each request carries the key of its shapes (:meth:`BatchShapes.key`), worked out once per
request signature at admission (``front.admission_plans``) or once per request the broker
makes (``models.internal``).  The batchers (``models.scheduler``,
``models.sequence_strategies``) end a batch at the first request whose key differs from
that of the batch's first request.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

ShapeKey = tuple[tuple[str, tuple[int, ...] | None], ...]
ANY: ShapeKey = ()  # the key of every request of a model whose requests all batch together


class BatchShapes:
    """What of a request's inputs must agree with the rest of its batch, for one config."""

    def __init__(self, config: Any) -> None:
        self.compared = frozenset(
            io.name for io in config.input if not io.allow_ragged_batch and -1 in io.dims
        )
        self.optional = any(io.optional for io in config.input)
        # without batching a batch is one request: nothing to compare
        self.needed = config.max_batch_size > 0 and bool(self.compared or self.optional)

    def key(self, inputs: Iterable[tuple[str, Sequence[int]]]) -> ShapeKey:
        """The key of a request with ``inputs`` (name, shape with the batch dimension):
        requests of equal keys may share a batch.  Inputs are taken by name, in any order."""
        if not self.needed:
            return ANY
        compared = self.compared
        parts = [
            (name, tuple(shape[1:]) if name in compared else None)
            for name, shape in inputs
            if self.optional or name in compared
        ]
        parts.sort()
        return tuple(parts)
