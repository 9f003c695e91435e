"""The sequence batcher: every request of a sequence runs on the instance that started it.

A model with ``sequence_batching`` keeps per-sequence state in the instance (the worker
carries implicit state from one response to the next request), so, as Triton's sequence
batcher does, the broker pins a correlation id to one instance at ``sequence_start`` and
releases it at ``sequence_end`` or after ``max_sequence_idle_microseconds`` without a request.
Each instance has its own FIFO queue; a batch takes at most one request per sequence (the
next one needs the state the previous one leaves), up to ``max_batch_size`` sequences.
A sequence whose instance stopped is lost: its requests are answered UNAVAILABLE until it
is started again.  Triton's checks and messages: a correlation id is required, batch size
1, and the first request of a sequence must carry ``sequence_start``.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from typing import Any

from inferpool.broker.models.registry import ModelVersion
from inferpool.broker.models.request import FLAG_SEQUENCE_END, FLAG_SEQUENCE_START, PendingRequest
from inferpool.broker.models.scheduler import Dispatch, Reject, Scheduler
from inferpool.wire.errors import Code, InferpoolError, invalid_arg
from inferpool.wire.worker.messages import BATCH_BYTES

log = logging.getLogger("inferpool.sequencer")
DEFAULT_IDLE_US = 1_000_000  # Triton's default max_sequence_idle_microseconds
_NOT_STARTED = object()


def scheduler_for(model: ModelVersion, dispatch: Dispatch, reject: Reject) -> Scheduler:
    """The scheduler ``model``'s config asks for."""
    if model.config.HasField("sequence_batching"):
        return SequenceScheduler(model, dispatch, reject)
    return Scheduler(model, dispatch, reject)


def idle_ns(config: Any) -> int:
    us = int(config.sequence_batching.max_sequence_idle_microseconds) or DEFAULT_IDLE_US
    return us * 1000


class SequenceScheduler(Scheduler):
    def __init__(self, model: ModelVersion, dispatch: Dispatch, reject: Reject) -> None:
        super().__init__(model, dispatch, reject)
        self.idle_ns = idle_ns(model.config)
        self.owner: dict[Any, Any] = {}  # correlation id -> instance; None: lost with it
        self.lost: dict[Any, str] = {}  # correlation id -> why
        self.touched: OrderedDict[Any, int] = OrderedDict()  # least recently used first
        self.pending: dict[Any, int] = {}  # correlation id -> requests queued, not dispatched
        self.queues: dict[Any, deque[PendingRequest]] = {}
        self.up: set[Any] = set()  # instances that are serving
        self.released: dict[Any, list[Any]] = {}  # instance -> idle sequences to drop

    # ------------------------------------------------------------------ instances
    def instance_idle(self, worker: Any, now_ns: int) -> int | None:
        self.up.add(worker)
        self.idle.append(worker)
        self._run(worker, now_ns)
        return None

    def instance_gone(self, worker: Any) -> None:
        super().instance_gone(worker)
        self.up.discard(worker)
        self.released.pop(worker, None)  # its process, and the state it held, are gone
        why = f"instance '{worker.name}' of model {self.model.label} stopped"
        for corr, owner in self.owner.items():
            if owner is worker:
                self.owner[corr] = None
                self.lost[corr] = why
        for req in self.queues.pop(worker, ()):
            self.pending.pop(req.work.correlation_id, None)
            self.reject(req, self._lost_error(req.work.correlation_id))

    # ------------------------------------------------------------------ requests
    def enqueue(self, req: PendingRequest, now_ns: int) -> int | None:
        try:
            worker = self._route(req)
        except InferpoolError as err:
            self.reject(req, err)
            return None
        corr = req.work.correlation_id
        self.pending[corr] = self.pending.get(corr, 0) + 1
        self._touch(corr, now_ns)
        self.queues.setdefault(worker, deque()).append(req)
        if worker in self.idle:
            self._run(worker, now_ns)
        return None

    def _route(self, req: PendingRequest) -> Any:
        """The instance for ``req`` (updating the sequence table), or Triton's error."""
        name = self.model.name
        corr, flags = req.work.correlation_id, req.work.flags
        if not corr:
            raise invalid_arg(
                f"inference request to model '{name}' must specify a non-zero or non-empty "
                "correlation ID"
            )
        if req.batch_size > 1:
            raise invalid_arg(
                f"inference request to model '{name}' must specify batch-size 1 due to "
                "requirements of sequence batcher"
            )
        owner = self.owner.get(corr, _NOT_STARTED)
        if flags & FLAG_SEQUENCE_START:
            if owner is None or owner is _NOT_STARTED:
                owner = self._least_loaded()
                self.owner[corr] = owner
                self.lost.pop(corr, None)
            else:
                log.warning(
                    "sequence %s for model '%s' has a conflict: the previous sequence did not end "
                    "before this sequence start; it is ended early",
                    corr,
                    name,
                )
        elif owner is _NOT_STARTED:
            raise invalid_arg(
                f"inference request for sequence {corr} to model '{name}' must specify the "
                "START flag on the first request of the sequence"
            )
        elif owner is None:
            error = self._lost_error(corr)
            if flags & FLAG_SEQUENCE_END:
                self._forget(corr)
            raise error
        if flags & FLAG_SEQUENCE_END:
            del self.owner[corr]
        return owner

    def _least_loaded(self) -> Any:
        if not self.up:
            raise InferpoolError(
                Code.UNAVAILABLE,
                f"no instance of model {self.model.label} is serving: cannot start a sequence",
            )
        load = dict.fromkeys(self.up, 0)
        for owner in self.owner.values():
            if owner in load:
                load[owner] += 1
        return min(load, key=lambda w: (load[w], w.slot))

    def _lost_error(self, corr: Any) -> InferpoolError:
        return InferpoolError(
            Code.UNAVAILABLE,
            f"sequence {corr} of model '{self.model.name}' was lost: "
            f"{self.lost.get(corr, 'its instance stopped')}; start it again with sequence_start",
        )

    # ------------------------------------------------------------------ batches
    def _run(self, worker: Any, now_ns: int) -> None:
        """Dispatch ``worker``'s next batch if it is idle and has work."""
        queue = self.queues.get(worker)
        if not queue or worker not in self.idle:
            return
        batch = self._take_from(queue)
        self.idle.remove(worker)
        for req in batch:
            corr = req.work.correlation_id
            left = self.pending[corr] - 1
            if left:
                self.pending[corr] = left
            else:
                del self.pending[corr]
            self._touch(corr, now_ns)
        # the worker drops the state of released sequences before it runs this batch
        self.dispatch(worker, batch, self.released.pop(worker, ()))

    def _take_from(self, queue: deque[PendingRequest]) -> list[PendingRequest]:
        """The oldest request of each sequence, oldest first, up to max_batch_size (and as
        many as fit in one message to the worker)."""
        limit = max(self.model.max_batch_size, 1)
        batch: list[PendingRequest] = []
        seen: set[Any] = set()
        rest: deque[PendingRequest] = deque()
        room = BATCH_BYTES
        for req in queue:
            corr = req.work.correlation_id
            if len(batch) < limit and corr not in seen and req.wire_bytes <= room:
                batch.append(req)
                room -= req.wire_bytes + 1
            else:
                rest.append(req)
            seen.add(corr)
        queue.clear()
        queue.extend(rest)
        return batch

    # ------------------------------------------------------------------ time and endings
    def _touch(self, corr: Any, now_ns: int) -> None:
        self.touched[corr] = now_ns
        self.touched.move_to_end(corr)

    def _forget(self, corr: Any) -> None:
        self.owner.pop(corr, None)
        self.lost.pop(corr, None)
        self.touched.pop(corr, None)

    def expire(self, now_ns: int) -> None:
        """Release sequences idle longer than max_sequence_idle_microseconds."""
        touched = self.touched
        while touched:
            corr, last = next(iter(touched.items()))
            if now_ns - last <= self.idle_ns:
                return
            if corr in self.pending:  # still waiting for its instance: not idle
                self._touch(corr, now_ns)
                continue
            owner = self.owner.get(corr)
            if owner is not None:
                self.released.setdefault(owner, []).append(corr)
                log.info(
                    "sequence %s of model '%s' was idle longer than %d us: released",
                    corr,
                    self.model.name,
                    self.idle_ns // 1000,
                )
            self._forget(corr)

    def drain(self, error: InferpoolError) -> None:
        super().drain(error)
        for queue in self.queues.values():
            while queue:
                self.reject(queue.popleft(), error)
        self.queues.clear()
        self.pending.clear()
