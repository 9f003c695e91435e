"""One array over the inputs of a batch: a view where they lie back to back, else a copy.

A batcher that places a batch's inputs in consecutive arena slots leaves each input's rows
one after another: a view over the whole span is the batch's input, with no copy.  Every
backend that joins requests along the batch dimension asks here first; :class:`Joiner`
copies the others into a buffer it keeps between batches.
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


class Joiner:
    """Joins one input's parts of a batch into one array: a view over them where they lie
    back to back, else a copy into a buffer the joiner keeps from batch to batch.

    A fresh array for every batch would fault in its pages anew each time (a batch of 32
    ResNet images is 19 MiB: some 4,700 page faults, as long as the copy itself on a busy
    machine); the kept buffer is faulted once and grows to the largest batch seen.  What
    :meth:`join` returns is valid until the next call.
    """

    def __init__(self) -> None:
        self._buffer = np.empty(0, np.uint8)

    def join(self, arrays: list[np.ndarray]) -> tuple[np.ndarray, int]:
        """The batch of ``arrays`` (joined along the first dimension) and the bytes copied."""
        span = contiguous_span(arrays)
        if span is not None:
            return span, 0
        first = arrays[0]
        rows = sum(a.shape[0] for a in arrays)
        nbytes = sum(a.nbytes for a in arrays)
        if self._buffer.nbytes < nbytes:
            self._buffer = np.empty(nbytes, np.uint8)
        out = self._buffer[:nbytes].view(first.dtype).reshape((rows, *first.shape[1:]))
        np.concatenate(arrays, out=out)
        return out, nbytes
