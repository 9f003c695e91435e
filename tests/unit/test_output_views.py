"""Views over output slots, made once per slot (Response.output_view): a view handed out
again always sees the memory the output was just given, in its datatype and shape."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from inferpool.backends.api import OutputMemory, Request, RequestedOutput, Response
from inferpool.backends.testing import HeapMemory
from inferpool.shm.region import Region
from inferpool.wire.errors import InferpoolError
from inferpool.workers.memory import WorkerMemory


class Maker:
    """A view maker that counts the views it made."""

    def __init__(self) -> None:
        self.made = 0

    def __call__(self, array: np.ndarray) -> np.ndarray:
        self.made += 1
        return array.view()


def respond(memory: OutputMemory) -> Response:
    request = Request(
        id="1",
        inputs={},
        requested_outputs={"OUT": RequestedOutput("OUT")},
        memory=memory,
        emit=lambda *args: None,
    )
    return Response(request)


def place(memory: OutputMemory, shape: tuple[int, ...], datatype: str, make: Any) -> Any:
    """One output's view, its slot given back at once (the next output takes it)."""
    response = respond(memory)
    view = response.output_view("OUT", shape, datatype, make)
    response.discard()
    return view


@pytest.mark.parametrize("kind", ["worker", "heap"])
def test_a_slot_taken_again_gets_a_view_of_what_it_holds_now(
    kind: str, memory: WorkerMemory
) -> None:
    mem: OutputMemory = memory if kind == "worker" else HeapMemory()
    make = Maker()
    first = place(mem, (4, 4), "FP32", make)
    assert place(mem, (4, 4), "FP32", make) is first and make.made == 1  # the same slot
    other = place(mem, (2, 8), "FP32", make)  # the same bytes, another shape
    assert other.shape == (2, 8) and other.dtype == np.float32
    typed = place(mem, (4, 4), "INT32", make)  # the same bytes, another datatype
    assert typed.shape == (4, 4) and typed.dtype == np.int32
    assert place(mem, (4, 4), "FP32", Maker()) is not first  # another maker: its own view
    assert make.made == 3


def test_a_kept_view_writes_the_bytes_the_response_names(memory: WorkerMemory) -> None:
    for value in (1.0, 2.0):
        response = respond(memory)
        response.output_view("OUT", (4,), "FP32", Maker())[:] = value
        out = response.outputs["OUT"]
        written = np.frombuffer(memory.output.buf, np.float32, 4, out.offset)
        assert written.tolist() == [value] * 4
        response.discard()


def test_no_view_is_kept_over_a_client_region(memory: WorkerMemory) -> None:
    """A client's region is unmapped when the broker retires it: a view kept over it could
    outlive the mapping, or see another object mapped under the same name."""
    assert memory.slot_views("sys/inferpool-test/1/0/4096") is None
    assert memory.slot_views(memory.output.name) is not None


def test_closing_the_memory_drops_its_views() -> None:
    """The output region is unmapped at close: a view kept past it would read memory no
    longer mapped (a segfault, not an error)."""
    reg = Region.create(f"inferpool-test-views-close-{os.getpid()}", 1 << 16, prefault=False)
    try:
        mem = WorkerMemory(reg.name, "test_0")
        place(mem, (4,), "FP32", Maker())
        assert mem.slot_views(mem.output.name)
        mem.close()
        assert not mem.slot_views(mem.output.name)
    finally:
        reg.destroy()


def test_heap_buffers_dropped_take_their_views_along() -> None:
    mem = HeapMemory()
    make = Maker()
    first = place(mem, (4,), "FP32", make)
    held = [respond(mem) for _ in range(HeapMemory.SPARE + 1)]
    for response in held:  # one more spare buffer than are kept: all are dropped
        response.output("OUT", (2,), "FP32")
    for response in held:
        response.discard()
    assert not mem.slot_views("heap")  # none kept over a buffer no longer held
    assert place(mem, (4,), "FP32", make) is not first  # a new buffer, a new view
    assert make.made == 2


def test_a_full_output_arena_names_the_cause_not_the_caller(memory: WorkerMemory) -> None:
    """The request that finds the arena full may hold nothing of it: the error says what
    fills it (what clients hold) and never tells this caller to release its own."""
    while True:
        try:
            memory.allocate(None, 1 << 20)
        except InferpoolError as err:
            message = err.message
            break
    assert "output arena of instance 'test_0' is full" in message
    assert "the outputs its clients hold take it" in message
    assert "Release output handles" not in message
