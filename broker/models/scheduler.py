"""Scheduling one model version onto its instances: the default and the dynamic batcher.

Each instance has at most one batch in flight (as Triton's backend threads), so requests
wait here, where queue time is measured and batches can form.  Without ``dynamic_batching``
a batch is one request; with it, queued requests are grouped as Triton's dynamic batcher
groups them: up to the largest ``preferred_batch_size`` (``max_batch_size`` without one); a
batch that reaches a preferred size goes at once, the largest such one while the oldest
request has waited less than ``max_queue_delay_microseconds``; otherwise the batch waits for
more requests until that delay has passed, then goes as it is.  A batch is also closed
before its requests would outgrow one message to the worker (``BATCH_BYTES``), and at the
first request whose shapes differ from its first request's (``models.batch_shapes``): the
batch then goes at once, and that request starts the next one.  The queue itself (priority
levels, queue policies, timeouts) is ``models.queue_policy``'s.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from inferpool.broker.models.queue_policy import queue_for
from inferpool.broker.models.registry import ModelVersion
from inferpool.broker.models.request import PendingRequest
from inferpool.wire.errors import InferpoolError
from inferpool.wire.worker.protocol import BATCH_BYTES, CorrelationId


class Dispatch(Protocol):
    """Send ``batch`` to ``worker``; ``release`` names sequences whose state it drops first,
    ``nulls`` the batch positions where it adds null requests (direct sequence batching)."""

    def __call__(
        self,
        worker: Any,
        batch: list[PendingRequest],
        release: Sequence[CorrelationId] = (),
        nulls: Sequence[int] = (),
        /,
    ) -> None: ...


Reject = Callable[[PendingRequest, InferpoolError], None]


class Scheduler:
    """The default and dynamic batcher of one model version."""

    def __init__(self, model: ModelVersion, dispatch: Dispatch, reject: Reject) -> None:
        self.model = model
        self.dispatch = dispatch
        self.reject = reject
        self.queue = queue_for(model.config)
        self.idle: deque[Any] = deque()
        cfg = model.config
        self.batching = cfg.HasField("dynamic_batching") and model.max_batch_size > 0
        dyn = cfg.dynamic_batching
        self.delay_ns = int(dyn.max_queue_delay_microseconds) * 1000 if self.batching else 0
        preferred = {int(s) for s in dyn.preferred_batch_size} if self.batching else set()
        self.preferred = frozenset(preferred)
        self.target = max(preferred, default=model.max_batch_size)
        self.gathering = False  # requests are arriving together: pump once all are queued

    # ------------------------------------------------------------------ instances
    def instance_idle(self, worker: Any, now_ns: int) -> int | None:
        self.idle.append(worker)
        return self.pump(now_ns)

    def instance_gone(self, worker: Any) -> None:
        with contextlib.suppress(ValueError):
            self.idle.remove(worker)

    # ------------------------------------------------------------------ requests
    def enqueue(self, req: PendingRequest, now_ns: int) -> int | None:
        queue = self.queue
        if queue.simple and not req.deadline_ns:
            # one level, no policy, no deadline (the broker gives one only to an ensemble's
            # steps): the request path's common case
            queue.append(req)  # type: ignore[union-attr]
        else:
            try:
                queue.push(req, now_ns)
            except InferpoolError as err:  # its priority level is full
                self.reject(req, err)
                return None
        return None if self.gathering else self.pump(now_ns)

    def cancel(self, req: PendingRequest) -> list[PendingRequest]:
        """Take ``req`` out of the queue: the requests that will not run (none if it is not
        queued here)."""
        return [req] if self.queue.take(req) else []

    def parts(self, req: PendingRequest, err: InferpoolError) -> list[PendingRequest]:
        """The requests made on ``req``'s behalf, which ``req`` ending with ``err`` ends too
        (an ensemble's steps in flight); none here."""
        return []

    def pump(self, now_ns: int) -> int | None:
        """Dispatch what can go now; returns the ns time of the next batching decision."""
        if self.gathering:
            return None
        deadline = self.queue.next_deadline
        if deadline and now_ns >= deadline:
            self.queue.expire(now_ns, self.reject)
        while self.queue and self.idle:
            batch = self._take(now_ns)
            if batch is None:
                return self.queue[0].received_ns + self.delay_ns
            worker = self.idle.popleft()
            self.dispatch(worker, batch)
        return None

    def _take(self, now_ns: int) -> list[PendingRequest] | None:
        queue = self.queue
        if not self.batching:
            return [queue.popleft()]
        total = 0
        count = 0
        preferred = 0  # the requests of the largest preferred batch met on the way
        limit = self.target
        room = BATCH_BYTES
        shapes = queue[0].shape_key
        for taken, req in enumerate(queue, 1):
            if total + req.batch_size > limit or req.wire_bytes > room or req.shape_key != shapes:
                break
            total += req.batch_size
            room -= req.wire_bytes + 1
            count = taken
            if total in self.preferred:
                preferred = taken
        waited = not self.delay_ns or now_ns - queue[0].received_ns >= self.delay_ns
        if preferred and not waited:
            count = preferred  # a preferred size, before the delay: the largest one at once
        elif total < self.target and count == len(queue) and not waited:
            return None  # wait a little longer for a fuller batch
        count = max(count, 1)
        popleft = queue.popleft
        batch = [popleft()]
        for _ in range(count - 1):
            batch.append(popleft())
        return batch

    def expire(self, now_ns: int) -> None:
        """Apply the queue policy to queued requests whose timeout has passed."""
        deadline = self.queue.next_deadline
        if deadline and now_ns >= deadline:
            self.queue.expire(now_ns, self.reject)

    def drain(self, error: InferpoolError) -> None:
        while self.queue:
            self.reject(self.queue.popleft(), error)
