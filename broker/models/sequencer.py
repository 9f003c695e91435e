"""The sequence batcher: every request of a sequence runs on the instance slot that started it.

A model with ``sequence_batching`` keeps per-sequence state in the instance (the worker
carries implicit state from one response to the next request), so, as Triton's sequence
batcher does, the broker gives a sequence a *slot* of one instance at ``sequence_start`` and
frees it when the sequence's END request runs, when it has been idle longer than
``max_sequence_idle_microseconds`` (the worker drops its state), or when it is cancelled.
An instance has ``sequence_strategies.slot_count`` slots; a sequence that starts when every
slot is taken waits in the *backlog* with the requests that follow it, and takes the first
slot that frees.  A backlogged sequence whose request ``timeout`` passes is answered
UNAVAILABLE, in Triton's words.  How an instance's batch is formed from its slots is the
strategy's (direct or oldest, ``sequence_strategies``).

A sequence whose instance stopped is lost: its requests are answered UNAVAILABLE until it
is started again.  Triton's checks and messages: a correlation id is required, batch size
1, and the first request of a sequence must carry ``sequence_start``.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from inferpool.broker.models.core_defaults import DEFAULT_IDLE_US
from inferpool.broker.models.registry import ModelVersion
from inferpool.broker.models.request import FLAG_SEQUENCE_END, FLAG_SEQUENCE_START, PendingRequest
from inferpool.broker.models.scheduler import Dispatch, Reject, Scheduler
from inferpool.broker.models.sequence_strategies import InstanceSlots, slot_count, strategy_for
from inferpool.wire.errors import Code, InferpoolError, invalid_arg

log = logging.getLogger("inferpool.sequencer")


def scheduler_for(model: ModelVersion, dispatch: Dispatch, reject: Reject) -> Scheduler:
    """The scheduler ``model``'s config asks for."""
    if model.config.HasField("sequence_batching"):
        return SequenceScheduler(model, dispatch, reject)
    return Scheduler(model, dispatch, reject)


def idle_ns(config: Any) -> int:
    """How long a sequence may stay silent before it is ended (ns)."""
    us = int(config.sequence_batching.max_sequence_idle_microseconds) or DEFAULT_IDLE_US
    return us * 1000


@dataclass(eq=False)
class Backlogged:
    """A sequence waiting for a free slot, with every request it has sent so far."""

    corr: Any
    requests: deque[PendingRequest] = field(default_factory=deque)
    expires_ns: int = 0  # the earliest deadline its requests' timeouts give; 0: none


class SequenceScheduler(Scheduler):
    """The sequence batcher: a sequence's requests go to one instance, in order."""

    def __init__(self, model: ModelVersion, dispatch: Dispatch, reject: Reject) -> None:
        super().__init__(model, dispatch, reject)
        self.idle_ns = idle_ns(model.config)
        self.strategy = strategy_for(model.config)
        self.slot_count = slot_count(model.config)
        self.instances: dict[Any, InstanceSlots] = {}  # serving instances
        self.where: dict[Any, tuple[InstanceSlots, int]] = {}  # sequences taking requests
        self.backlog: deque[Backlogged] = deque()
        self.collecting: dict[Any, Backlogged] = {}  # backlogged sequences taking requests
        self.lost: dict[Any, str] = {}  # correlation id -> why
        self.touched: OrderedDict[Any, int] = OrderedDict()  # least recently used first
        self.released: dict[Any, list[Any]] = {}  # instance -> sequences whose state goes
        self.wake_at: dict[InstanceSlots, int] = {}  # batching decisions put off

    # ------------------------------------------------------------------ instances
    def instance_idle(self, worker: Any, now_ns: int) -> int | None:
        slots = self.instances.get(worker)
        if slots is None:  # a new or respawned instance: free slots for the backlog
            slots = self.instances[worker] = InstanceSlots(worker, self.slot_count)
            for slot in slots.free():
                self._fill(slots, slot)
        self.idle.append(worker)
        return self.pump(now_ns)

    def instance_gone(self, worker: Any) -> None:
        super().instance_gone(worker)
        self.released.pop(worker, None)  # its process, and the state it held, are gone
        slots = self.instances.pop(worker, None)
        if slots is None:
            return
        self.wake_at.pop(slots, None)
        why = f"instance '{worker.name}' of model {self.model.label} stopped"
        for slot, corr in enumerate(slots.sequences):
            if corr is None:
                continue
            if self.where.get(corr, (None,))[0] is slots:
                del self.where[corr]
                self.lost[corr] = why
            for req in slots.queues[slot]:
                self.reject(req, self._lost_error(req.work.correlation_id))

    # ------------------------------------------------------------------ requests
    def enqueue(self, req: PendingRequest, now_ns: int) -> int | None:
        try:
            self._route(req, now_ns)
        except InferpoolError as err:
            self.reject(req, err)
            return None
        return self.pump(now_ns)

    def _route(self, req: PendingRequest, now_ns: int) -> None:
        """Queue ``req`` in its sequence's slot or backlog (updating the tables), or raise
        Triton's error."""
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
        placed = self.where.get(corr)
        backlogged = self.collecting.get(corr)
        if flags & FLAG_SEQUENCE_START:
            if placed is not None or backlogged is not None:
                log.warning(
                    "sequence %s for model '%s' has a conflict: the previous sequence did not end "
                    "before this sequence start; it is ended early",
                    corr,
                    name,
                )
            elif not self.instances:
                raise InferpoolError(
                    Code.UNAVAILABLE,
                    f"no instance of model {self.model.label} is serving: cannot start a sequence",
                )
            else:
                self.lost.pop(corr, None)
                placed = self._start(corr)
                if placed is None:
                    backlogged = self.collecting[corr] = Backlogged(corr)
                    self.backlog.append(backlogged)
        elif placed is None and backlogged is None:
            if corr not in self.lost:
                raise invalid_arg(
                    f"inference request for sequence {corr} to model '{name}' must specify the "
                    "START flag on the first request of the sequence"
                )
            error = self._lost_error(corr)
            if flags & FLAG_SEQUENCE_END:
                self._forget(corr)
            raise error
        self._touch(corr, now_ns)
        ending = flags & FLAG_SEQUENCE_END
        if placed is not None:
            slots, slot = placed
            slots.queues[slot].append(req)
            if ending:  # the slot frees once this request runs; a new START starts afresh
                del self.where[corr]
            return
        assert backlogged is not None
        backlogged.requests.append(req)
        if req.work.timeout_us:
            deadline = now_ns + req.work.timeout_us * 1000
            if not backlogged.expires_ns or deadline < backlogged.expires_ns:
                backlogged.expires_ns = deadline
        if ending:
            del self.collecting[corr]

    def _start(self, corr: Any) -> tuple[InstanceSlots, int] | None:
        """A free slot for a new sequence (the lowest slot of any instance, as Triton), or
        None when every slot is taken or the id's previous sequence has yet to run its END
        (its state is the worker's until then)."""
        if any(corr in slots.sequences for slots in self.instances.values()):
            return None
        best: tuple[int, int, InstanceSlots] | None = None
        for slots in self.instances.values():
            free = slots.free()
            if free and (best is None or (free[0], slots.worker.slot) < best[:2]):
                best = (free[0], slots.worker.slot, slots)
        if best is None:
            return None
        slot, _, slots = best
        slots.sequences[slot] = corr
        self.where[corr] = (slots, slot)
        return slots, slot

    def _lost_error(self, corr: Any) -> InferpoolError:
        return InferpoolError(
            Code.UNAVAILABLE,
            f"sequence {corr} of model '{self.model.name}' was lost: "
            f"{self.lost.get(corr, 'its instance stopped')}; start it again with sequence_start",
        )

    def cancel(self, req: PendingRequest) -> list[PendingRequest]:
        """Cancel ``req``'s sequence: every request of it still queued (Triton's rule; ``req``
        among them unless it is executing), its slot freed, its state dropped."""
        placed = self.where.get(req.work.correlation_id)
        for slots in self.instances.values():
            for slot, queue in enumerate(slots.queues):
                if req in queue or placed == (slots, slot):
                    dropped = list(queue)
                    queue.clear()
                    self._end(slots, slot)
                    return dropped
        for backlogged in self.backlog:
            if req in backlogged.requests:
                self.backlog.remove(backlogged)
                self._forget_backlogged(backlogged)
                return list(backlogged.requests)
        return []

    # ------------------------------------------------------------------ batches
    def pump(self, now_ns: int) -> int | None:
        """Run every idle instance that has work; the ns time of the next decision."""
        if self.gathering:
            return None
        for worker in list(self.idle):
            self._run(self.instances[worker], now_ns)
        return min(self.wake_at.values(), default=None)

    def _run(self, slots: InstanceSlots, now_ns: int) -> None:
        """Dispatch the instance's next batch if its strategy has one ready."""
        got = self.strategy.take(slots, now_ns)
        if not isinstance(got, tuple):
            if got is None:
                self.wake_at.pop(slots, None)
            else:
                self.wake_at[slots] = got
            return
        self.wake_at.pop(slots, None)
        taken, nulls = got
        self.idle.remove(slots.worker)
        for slot, req in taken:
            self._touch(req.work.correlation_id, now_ns)
            if req.work.flags & FLAG_SEQUENCE_END:
                self._free(slots, slot)
        # the worker drops the state of released sequences before it runs this batch
        release = self.released.pop(slots.worker, ())
        self.dispatch(slots.worker, [req for _, req in taken], release, nulls)

    def _end(self, slots: InstanceSlots, slot: int) -> None:
        """End the sequence in ``slot`` early (idle, cancelled): its state goes, its slot
        is free for the backlog."""
        corr = slots.sequences[slot]
        if self.where.get(corr) == (slots, slot):
            del self.where[corr]
        self.touched.pop(corr, None)
        self.released.setdefault(slots.worker, []).append(corr)
        self._free(slots, slot)

    def _free(self, slots: InstanceSlots, slot: int) -> None:
        slots.sequences[slot] = None
        self._fill(slots, slot)

    def _fill(self, slots: InstanceSlots, slot: int) -> None:
        """Give a free slot to the first backlogged sequence, with its queued requests."""
        if not self.backlog:
            return
        backlogged = self.backlog.popleft()
        corr = backlogged.corr
        slots.sequences[slot] = corr
        slots.queues[slot].extend(backlogged.requests)
        if self.collecting.get(corr) is backlogged:
            del self.collecting[corr]
            self.where[corr] = (slots, slot)
        log.info("sequence %s of model '%s' left the backlog for a slot", corr, self.model.name)

    # ------------------------------------------------------------------ time and endings
    def _touch(self, corr: Any, now_ns: int) -> None:
        self.touched[corr] = now_ns
        self.touched.move_to_end(corr)

    def _forget(self, corr: Any) -> None:
        self.where.pop(corr, None)
        self.lost.pop(corr, None)
        self.touched.pop(corr, None)

    def _forget_backlogged(self, backlogged: Backlogged) -> None:
        if self.collecting.get(backlogged.corr) is backlogged:
            del self.collecting[backlogged.corr]
            self.touched.pop(backlogged.corr, None)

    def expire(self, now_ns: int) -> None:
        """Release sequences idle longer than max_sequence_idle_microseconds; answer the
        backlogged sequences whose timeout passed."""
        touched = self.touched
        while touched:
            corr, last = next(iter(touched.items()))
            if now_ns - last <= self.idle_ns:
                break
            placed = self.where.get(corr)
            if corr in self.collecting or (placed and placed[0].queues[placed[1]]):
                self._touch(corr, now_ns)  # waiting for a slot or its instance: not idle
                continue
            if placed is None:
                self._forget(corr)
                continue
            log.info(
                "sequence %s of model '%s' was idle longer than %d us: released",
                corr,
                self.model.name,
                self.idle_ns // 1000,
            )
            self._end(*placed)
        for backlogged in [b for b in self.backlog if b.expires_ns and now_ns >= b.expires_ns]:
            self.backlog.remove(backlogged)
            self._forget_backlogged(backlogged)
            for req in backlogged.requests:
                self.reject(
                    req,
                    InferpoolError(
                        Code.UNAVAILABLE, "timeout of the corresponding sequence has been expired"
                    ),
                )
        self.pump(now_ns)  # slots freed above may have given backlogged sequences work

    def drain(self, error: InferpoolError) -> None:
        super().drain(error)
        for slots in self.instances.values():
            for queue in slots.queues:
                while queue:
                    self.reject(queue.popleft(), error)
        for backlogged in self.backlog:
            for req in backlogged.requests:
                self.reject(req, error)
        self.backlog.clear()
        self.collecting.clear()
