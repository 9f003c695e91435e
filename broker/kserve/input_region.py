"""Where the frontends' process writes request tensors: its input region, which workers read.

The broker makes the region at start (``inferpool-<run>-kserve-in``, as large as the arena)
and names it to the process.  A tensor of ``PLACE_MIN`` bytes or more is written there, in
a block of this process's own allocator, instead of travelling in a frame: an HTTP body's
binary part is read from the socket straight into its block, a gRPC raw input is copied in
once.  The request then lists where each one lies (``placed``, docs/kserve.md), the broker
checks the windows and hands them to the worker as they are, and the block is freed once
the broker has answered (a cancelled request's block waits for that answer too: its worker
may still be reading).  A freed block is zeroed, as the arena's are.  When the region has
no room, the tensors go in frames as before (the broker copies them into its arena).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from inferpool.shm.arena import Arena, ArenaFull, Slot
from inferpool.shm.region import Region, ShmExhausted

log = logging.getLogger("inferpool.kserve")
PLACE_MIN = 64 * 1024  # smaller tensors cost less in a frame than a block's bookkeeping


class Inputs:
    """The process's input region and its allocator."""

    def __init__(self, name: str) -> None:
        self.arena = Arena(Region.attach(name))

    def take(self, nbytes: int) -> Slot | None:
        """A block of ``nbytes``, or None when the region has no room for it now."""
        try:
            return self.arena.alloc(nbytes)
        except (ArenaFull, ShmExhausted):
            return None

    def view(self, slot: Slot) -> memoryview:
        return self.arena.view(slot)

    def free(self, slot: Slot) -> None:
        self.arena.free(slot)

    def place(self, frames: Sequence[Any]) -> tuple[list[Any] | None, list[Any], Slot | None]:
        """Copy the frames of ``PLACE_MIN`` bytes or more into one block: the ``placed``
        list (None: nothing placed), the frames left to send, and the block."""
        sizes = [memoryview(f).nbytes for f in frames]
        total = sum(n for n in sizes if n >= PLACE_MIN)
        slot = self.take(total) if total else None
        if slot is None:
            return None, list(frames), None
        view = self.view(slot)
        at = 0
        placed: list[Any] = []
        left = []
        for frame, nbytes in zip(frames, sizes, strict=True):
            if nbytes < PLACE_MIN:
                placed.append(None)
                left.append(frame)
                continue
            data = memoryview(frame).cast("B")
            view[at : at + len(data)] = data
            placed.append([slot.offset + at, len(data)])
            at += len(data)
        return placed, left, slot

    def close(self) -> None:
        self.arena.destroy()
