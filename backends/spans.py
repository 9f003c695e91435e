"""One array over the inputs of a batch that lie back to back in one buffer.

A batcher that places a batch's inputs in consecutive arena slots leaves each input's rows
one after another: a view over the whole span is the batch's input, with no copy.  Every
backend that joins requests along the batch dimension asks here first.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _root(array: np.ndarray) -> Any:
    base: Any = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def contiguous_span(arrays: list[np.ndarray]) -> np.ndarray | None:
    """One array over ``arrays`` when they lie back to back in one buffer, else None."""
    first = arrays[0]
    root = _root(first)
    address = first.__array_interface__["data"][0]
    start = address
    for a in arrays:
        if (
            not a.flags.c_contiguous
            or a.dtype != first.dtype
            or a.shape[1:] != first.shape[1:]
            or a.__array_interface__["data"][0] != address
            or _root(a) is not root
        ):
            return None
        address += a.nbytes
    try:
        whole = np.frombuffer(root, dtype=np.uint8)
    except (TypeError, ValueError):
        return None
    offset = start - whole.__array_interface__["data"][0]
    if offset < 0 or offset + (address - start) > whole.nbytes:
        return None
    rows = sum(a.shape[0] for a in arrays)
    return (
        whole[offset : offset + (address - start)]
        .view(first.dtype)
        .reshape((rows, *first.shape[1:]))
    )
