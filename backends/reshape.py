"""Config ``reshape``: what a backend sees against what a client sees.

An input or output with ``reshape`` has two shapes: the config ``dims`` (the client's side of
the contract) and ``reshape.shape`` (the model's).  The worker (and ``BackendHarness``) gives a
backend its inputs in the model's shape and reports its outputs in the config's, as Triton's
core does
(``InferenceResponse::Output::Reshape``): a ``-1`` of ``dims`` takes the sizes of the
``-1`` dimensions of ``reshape.shape``, in order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

OutputReshape = tuple[tuple[int, ...], tuple[int, ...]]  # (reshape.shape, dims)


def output_reshapes(config: Any) -> dict[str, OutputReshape]:
    """Output name -> (the model's shape, the config's dims) for every reshaped output."""
    return {
        t.name: (tuple(t.reshape.shape), tuple(t.dims))
        for t in config.output
        if t.HasField("reshape")
    }


def to_config_shape(shape: Sequence[int], reshape: OutputReshape, batched: bool) -> tuple[int, ...]:
    """``shape`` (as the backend produced it) in the config's dims.

    A shape that does not hold the reshape's rank or element count is returned as it is: the
    client then sees what the backend actually wrote, never a shape its bytes do not fill.
    """
    model_dims, dims = reshape
    lead = tuple(shape[:1]) if batched and shape else ()
    inner = tuple(shape[len(lead) :])
    if len(inner) != len(model_dims):
        return tuple(shape)
    variable = [size for size, d in zip(inner, model_dims, strict=True) if d == -1]
    out = []
    for d in dims:
        if d != -1:
            out.append(d)
        elif variable:
            out.append(variable.pop(0))
        else:
            return tuple(shape)
    if math.prod(out) != math.prod(inner):
        return tuple(shape)
    return (*lead, *out)
