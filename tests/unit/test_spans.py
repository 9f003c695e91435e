"""A batch's input as one array: a view where its parts lie back to back, else a copy into
a buffer kept from batch to batch."""

from __future__ import annotations

import numpy as np

from inferpool.backends.spans import Joiner


def rows(n: int, start: int = 0) -> list[np.ndarray]:
    return [np.full((1, 4), start + i, np.float32) for i in range(n)]


def test_parts_back_to_back_are_viewed_not_copied() -> None:
    whole = np.arange(12, dtype=np.float32).reshape(3, 4)
    batch, copied = Joiner().join([whole[i : i + 1] for i in range(3)])
    assert copied == 0
    assert np.shares_memory(batch, whole) and batch.tolist() == whole.tolist()


def test_separate_parts_are_copied_into_one_kept_buffer() -> None:
    """The second batch of the same size lands where the first did: no new memory per batch
    (its pages are faulted once); a larger batch grows the buffer, a smaller one reuses it."""
    joiner = Joiner()
    first, copied = joiner.join(rows(3))
    assert copied == 3 * 16 and first[:, 0].tolist() == [0, 1, 2]
    address = first.__array_interface__["data"][0]
    second, _ = joiner.join(rows(3, start=10))
    assert second.__array_interface__["data"][0] == address
    assert second[:, 0].tolist() == [10, 11, 12]
    larger, _ = joiner.join(rows(5))
    assert larger.shape == (5, 4) and larger[:, 0].tolist() == [0, 1, 2, 3, 4]
    smaller, _ = joiner.join(rows(2, start=7))
    assert smaller.__array_interface__["data"][0] == larger.__array_interface__["data"][0]
    assert smaller.shape == (2, 4) and smaller[:, 0].tolist() == [7, 8]


def test_parts_of_several_rows_and_another_dtype() -> None:
    parts = [np.arange(6, dtype=np.int64).reshape(2, 3), np.arange(3, dtype=np.int64)[None]]
    batch, copied = Joiner().join(parts)
    assert batch.dtype == np.int64 and batch.shape == (3, 3) and copied == 9 * 8
    assert batch.tolist() == [[0, 1, 2], [3, 4, 5], [0, 1, 2]]
