"""A worker's view of an input in shared memory: the request's bytes, read-only, and never
outside the region its reference names."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest

from inferpool.shm.region import Region
from inferpool.wire.errors import InferpoolError
from inferpool.wire.worker.protocol import TensorRef
from inferpool.workers.memory import WorkerMemory, host_input


@pytest.fixture
def region() -> Iterator[Region]:
    reg = Region.create(f"inferpool-test-inputs-{os.getpid()}", 8192, prefault=False)
    yield reg
    reg.destroy()


def test_an_input_is_a_read_only_view_of_its_bytes(region: Region) -> None:
    region.buf[4096 : 4096 + 8] = np.arange(8, dtype=np.uint8).tobytes()
    ref = TensorRef("INPUT0", "UINT8", [2, 4], region.name, 4096, 8)
    tensor = host_input(region, ref, None)
    assert tensor.shape == (2, 4) and tensor.byte_size == 8
    assert tensor.data.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert not tensor.data.flags.writeable
    with pytest.raises(ValueError):
        tensor.data[0, 0] = 9
    region.buf[4096] = 7  # a view, not a copy
    assert tensor.data[0, 0] == 7
    assert host_input(region, ref, (8,)).data.shape == (8,)  # the config's reshape


def test_an_input_outside_its_region_is_refused(region: Region) -> None:
    ref = TensorRef("INPUT0", "FP32", [4], region.name, 8192 - 8, 16)
    with pytest.raises(InferpoolError, match="lies outside shared-memory region"):
        host_input(region, ref, None)


def test_a_place_named_again_gets_the_same_view_until_its_region_is_unmapped(
    region: Region, memory: WorkerMemory
) -> None:
    region.buf[0:8] = np.arange(8, dtype=np.uint8).tobytes()
    ref = TensorRef("INPUT0", "UINT8", [2, 4], region.name, 0, 8)
    first = memory.batch_input(ref, None)
    assert memory.batch_input(ref, None) is first
    assert first.data.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    region.buf[0] = 9  # the view shows what the slot holds now
    assert memory.batch_input(ref, None).data[0, 0] == 9
    assert memory.batch_input(ref._replace(shape=[8]), None) is not first  # another shape
    assert memory.batch_input(ref, (8,)).shape == (8,)  # another reshape
    memory.unmap([ref.region])
    assert memory.batch_input(ref, None) is not first


def test_bytes_inputs_are_decoded_for_every_request(region: Region, memory: WorkerMemory) -> None:
    region.buf[0:6] = (2).to_bytes(4, "little") + b"ab"
    ref = TensorRef("INPUT0", "BYTES", [1], region.name, 0, 6)
    first = memory.batch_input(ref, None)
    assert first.data.tolist() == [b"ab"]
    assert memory.batch_input(ref, None) is not first
