"""How the sequence batcher forms one instance's next batch: Triton's direct and oldest
strategies, over the instance's sequence slots.

An instance has a fixed number of sequence slots (``InstanceSlots``); each holds at most one
sequence, whose queued requests wait in the slot's queue, in order.  A batch takes at most
one request per slot (the next request of a sequence needs the state its predecessor
leaves), and an instance runs one batch at a time, so a sequence never has two requests in
flight.  Either strategy closes a batch before its requests would outgrow one message to
the worker (``BATCH_BYTES``), and takes only requests whose shapes agree with the batch's
first request's (``models.batch_shapes``).

- ``direct`` (the default): a slot is a fixed position in the batch.  The batch holds the
  next request of every slot up to the highest slot that has one; a slot below it without a
  request gets a *null request* (its READY control is false, its answer dropped), so that
  every sequence keeps its position, as models that keep state per batch slot need; so does
  a slot whose next request is shaped otherwise than the batch's first (it waits for a batch
  of its shape).  With ``max_queue_delay_microseconds`` and ``minimum_slot_utilization``
  set, the batch waits until enough slots have a request or the oldest has waited that long.
- ``oldest``: the oldest next requests of the instance's candidate sequences
  (``max_candidate_sequences`` slots), up to ``max_batch_size``, in any position; it waits
  up to ``max_queue_delay_microseconds`` for the largest ``preferred_batch_size`` (or
  ``max_batch_size``), as the dynamic batcher does, and as there a request shaped
  otherwise than the oldest ends the batch, which then goes at once.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

from inferpool.broker.models.request import PendingRequest
from inferpool.wire.worker.protocol import BATCH_BYTES

Taken = list[tuple[int, PendingRequest]]  # (slot, request), in batch order


class InstanceSlots:
    """One instance's sequence slots: the sequence in each and its queued requests."""

    def __init__(self, worker: Any, count: int) -> None:
        self.worker = worker
        self.sequences: list[Any] = [None] * count  # correlation id per slot; None: free
        self.queues: list[deque[PendingRequest]] = [deque() for _ in range(count)]

    def free(self) -> list[int]:
        return [i for i, corr in enumerate(self.sequences) if corr is None]

    def __repr__(self) -> str:
        return f"InstanceSlots({self.worker!r}, {self.sequences})"


class Strategy(Protocol):
    """How a sequence batcher forms batches from its slots."""

    def take(self, slots: InstanceSlots, now_ns: int) -> tuple[Taken, list[int]] | int | None:
        """The next batch and the batch positions of its null requests; or the ns time to
        decide again (waiting for a fuller batch); or None when no slot has a request."""
        ...


class Direct:
    """Triton's direct strategy: each sequence has a batch slot of its own."""

    def __init__(self, config: Any) -> None:
        direct = config.sequence_batching.direct
        self.delay_ns = int(direct.max_queue_delay_microseconds) * 1000
        self.utilization = float(direct.minimum_slot_utilization)
        self.max_batch = max(int(config.max_batch_size), 1)

    def take(self, slots: InstanceSlots, now_ns: int) -> tuple[Taken, list[int]] | int | None:
        queues = slots.queues
        ready = [i for i, queue in enumerate(queues) if queue]
        if not ready:
            return None
        if self.delay_ns and self.utilization:
            oldest = min(queues[i][0].received_ns for i in ready)
            if now_ns - oldest < self.delay_ns and len(ready) / self.max_batch < self.utilization:
                return oldest + self.delay_ns
        taken: Taken = []
        nulls: list[int] = []
        room = BATCH_BYTES
        shapes = queues[ready[0]][0].shape_key
        for i in range(ready[-1] + 1):
            queue = queues[i]
            if not queue or queue[0].shape_key != shapes:
                nulls.append(i)
                room -= len(str(i)) + 1  # its position in the message's nulls
                continue
            if taken and queue[0].wire_bytes > room:
                break  # this slot and those after it go in the next batch
            room -= queue[0].wire_bytes + 1
            taken.append((i, queue.popleft()))
        last = taken[-1][0]
        return taken, [i for i in nulls if i < last]


class Oldest:
    """Triton's oldest strategy: the oldest requests of the sequences waiting form the batch."""

    def __init__(self, config: Any) -> None:
        oldest = config.sequence_batching.oldest
        self.delay_ns = int(oldest.max_queue_delay_microseconds) * 1000
        self.limit = max(int(config.max_batch_size), 1)
        preferred = sorted(int(s) for s in oldest.preferred_batch_size)
        self.target = preferred[-1] if preferred else self.limit

    def take(self, slots: InstanceSlots, now_ns: int) -> tuple[Taken, list[int]] | int | None:
        fronts = sorted(
            ((i, queue[0]) for i, queue in enumerate(slots.queues) if queue),
            key=lambda front: front[1].received_ns,
        )
        if not fronts:
            return None
        first = fronts[0][1]
        shapes = first.shape_key
        count = 0
        ended = False  # by a request shaped otherwise: the batch goes at once
        room = BATCH_BYTES
        for _, req in fronts[: self.limit]:
            if req.shape_key != shapes:
                ended = True
                break
            if count and req.wire_bytes > room:
                break
            room -= req.wire_bytes + 1
            count += 1
        start = first.received_ns
        if not ended and len(fronts) < self.target and now_ns - start < self.delay_ns:
            return start + self.delay_ns  # wait a little longer for a fuller batch
        return [(i, slots.queues[i].popleft()) for i, _ in fronts[:count]], []


def slot_count(config: Any) -> int:
    """Sequence slots per instance: ``max_candidate_sequences`` (oldest) or the batch size."""
    seq = config.sequence_batching
    if seq.HasField("oldest") and seq.oldest.max_candidate_sequences > 0:
        return int(seq.oldest.max_candidate_sequences)
    return max(int(config.max_batch_size), 1)


def strategy_for(config: Any) -> Strategy:
    """The strategy ``config``'s sequence batcher asks for (direct by default)."""
    if config.sequence_batching.HasField("oldest"):
        return Oldest(config)
    return Direct(config)
