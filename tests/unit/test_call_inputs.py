"""A C backend's call passes an input by reference where it already lies in shared memory
the broker names (WorkerMemory.locate), and copies it from anywhere else."""

from __future__ import annotations

import os

import numpy as np

from inferpool.shm.region import Region
from inferpool.wire.worker.protocol import TensorRef
from inferpool.workers.memory import WorkerMemory


def test_an_input_in_the_arena_is_found_and_nothing_else_is(memory: WorkerMemory) -> None:
    arena = Region.create(f"inferpool-test-locate-{os.getpid()}", 8192, prefault=False)
    try:
        ref = TensorRef("INPUT0", "UINT8", [16], arena.name, 32, 16)
        address = memory.input_tensor(ref, None).data.ctypes.data
        assert memory.locate(address, 16) == (arena.name, 32)
        assert memory.locate(address + 8, 8) == (arena.name, 40)
        assert memory.locate(address, 8192) is None  # past the region's end
        own = np.frombuffer(memory.output.buf, np.uint8)  # its own outputs go by copy
        assert memory.locate(own.ctypes.data, 16) is None
        assert memory.locate(np.zeros(16, np.uint8).ctypes.data, 16) is None
    finally:
        arena.destroy()
