"""The queue a model's requests wait in: Triton's priority levels and queue policies.

``dynamic_batching { priority_levels: N }`` gives a model levels 1..N, served in that order
(1 first); a request's ``priority`` parameter picks its level, and 0 or a value above N
means ``default_priority_level``.  Every level has a queue policy (``default_queue_policy``,
or the level's ``priority_queue_policy`` entry):

- ``max_queue_size``: more requests than that waiting at the level are refused UNAVAILABLE
  ("Exceeds maximum queue size", Triton's words); 0 means no limit;
- ``default_timeout_microseconds``: how long a request may wait (0: for ever);
  ``allow_timeout_override`` lets a request's ``timeout`` parameter shorten it (never
  lengthen it; any timeout shortens "for ever");
- ``timeout_action``: ``REJECT`` answers an expired request UNAVAILABLE ("Request timeout
  expired"), ``DELAY`` moves it behind every unexpired request of its level, where it waits
  without a timeout.

A model without those settings gets a :class:`FifoQueue`: one level, no limit, the cheapest
queue there is.  Without ``dynamic_batching`` a model has no queue policy at all (as in
Triton), and there the request's own ``timeout`` bounds its wait (REJECT).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import model_config_pb2 as pb

from inferpool.broker.models.request import PendingRequest
from inferpool.wire.errors import Code, InferpoolError

Expired = Callable[[PendingRequest, InferpoolError], None]
_NEVER = 0  # a deadline of 0: the request waits as long as it takes


@dataclass(frozen=True, slots=True)
class Policy:
    """One level's ``ModelQueuePolicy``."""

    max_queue_size: int = 0
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    delay: bool = False  # timeout_action DELAY (else REJECT)

    @classmethod
    def of(cls, policy: Any) -> Policy:
        return cls(
            int(policy.max_queue_size),
            int(policy.default_timeout_microseconds),
            bool(policy.allow_timeout_override),
            policy.timeout_action == pb.ModelQueuePolicy.DELAY,
        )

    def timeout_us(self, requested: int) -> int:
        """The request's timeout under this policy (0: none)."""
        default = self.default_timeout_us
        if self.allow_timeout_override and requested and (not default or requested < default):
            return requested
        return default


def timeout_error(req: PendingRequest) -> InferpoolError:
    """Triton's error for a request that waited in the queue past its timeout."""
    return InferpoolError(
        Code.UNAVAILABLE,
        f"Request timeout expired: request '{req.client_id}' for model '{req.model.name}' "
        "waited in the queue longer than its timeout",
    )


def _full_error(req: PendingRequest, level: int, limit: int) -> InferpoolError:
    where = f"at priority level {level}" if level else "in its queue"
    return InferpoolError(
        Code.UNAVAILABLE,
        f"[request id: {req.client_id or '<id_unknown>'}] Exceeds maximum queue size: "
        f"{limit} request(s) for model '{req.model.name}' already wait {where} "
        f"(max_queue_size {limit})",
    )


class FifoQueue(deque[PendingRequest]):
    """One level without a policy: requests in arrival order.  ``request_timeouts``: a
    request's own ``timeout`` bounds its wait (models without dynamic batching)."""

    def __init__(self, request_timeouts: bool) -> None:
        super().__init__()
        self.request_timeouts = request_timeouts
        self.next_deadline = _NEVER
        self.simple = not request_timeouts  # push is append: the scheduler appends itself

    def push(self, req: PendingRequest, now_ns: int) -> None:
        """Queue ``req``, its deadline from its ``timeout`` (``request_timeouts``), or the
        one the broker gave a request it made (an ensemble's step)."""
        if self.request_timeouts and req.work.timeout_us:
            req.deadline_ns = _earliest(req.deadline_ns, now_ns + req.work.timeout_us * 1000)
        deadline = req.deadline_ns
        if deadline and (not self.next_deadline or deadline < self.next_deadline):
            self.next_deadline = deadline
        self.append(req)

    def expire(self, now_ns: int, expired: Expired) -> None:
        """Reject the requests whose deadline has passed (call once ``next_deadline`` has)."""
        gone = [r for r in self if r.deadline_ns and now_ns >= r.deadline_ns]
        for req in gone:
            self.remove(req)
            expired(req, timeout_error(req))
        self.next_deadline = min((r.deadline_ns for r in self if r.deadline_ns), default=_NEVER)

    def take(self, req: PendingRequest) -> bool:
        """Remove ``req`` if it is waiting here."""
        try:
            self.remove(req)
        except ValueError:
            return False
        return True


class _Level:
    __slots__ = ("delayed", "level", "policy", "waiting")

    def __init__(self, level: int, policy: Policy) -> None:
        self.level = level
        self.policy = policy
        self.waiting: deque[PendingRequest] = deque()  # unexpired, in arrival order
        self.delayed: deque[PendingRequest] = deque()  # expired under DELAY: served last

    def __len__(self) -> int:
        return len(self.waiting) + len(self.delayed)


class PriorityQueue:
    """Levels 1..N (or the one level 0), each with its policy; iterated, and taken from, in
    the order the batcher serves: level by level, each level's waiting requests then its
    delayed ones."""

    def __init__(self, default: Policy, policies: dict[int, Policy], levels: int) -> None:
        self.levels = [_Level(n, policies.get(n, default)) for n in range(1, levels + 1)] or [
            _Level(0, default)
        ]
        self.count = 0
        self.next_deadline = _NEVER
        self.simple = False

    def _level(self, req: PendingRequest) -> _Level:
        return self.levels[req.work.priority - 1] if req.work.priority else self.levels[0]

    def push(self, req: PendingRequest, now_ns: int) -> None:
        """Queue ``req`` at its level; UNAVAILABLE if the level is full."""
        level = self._level(req)
        policy = level.policy
        if policy.max_queue_size and len(level) >= policy.max_queue_size:
            raise _full_error(req, level.level, policy.max_queue_size)
        timeout_us = policy.timeout_us(req.work.timeout_us)
        if timeout_us:
            req.deadline_ns = _earliest(req.deadline_ns, now_ns + timeout_us * 1000)
        deadline = req.deadline_ns
        if deadline and (not self.next_deadline or deadline < self.next_deadline):
            self.next_deadline = deadline
        level.waiting.append(req)
        self.count += 1

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[PendingRequest]:
        for level in self.levels:
            yield from level.waiting
            yield from level.delayed

    def __getitem__(self, index: int) -> PendingRequest:
        """The request served first (``index`` 0: the only one asked for)."""
        if index == 0:
            for level in self.levels:
                if level.waiting:
                    return level.waiting[0]
                if level.delayed:
                    return level.delayed[0]
        raise IndexError(index)

    def popleft(self) -> PendingRequest:
        for level in self.levels:
            if level.waiting:
                self.count -= 1
                return level.waiting.popleft()
            if level.delayed:
                self.count -= 1
                return level.delayed.popleft()
        raise IndexError("pop from an empty queue")

    def take(self, req: PendingRequest) -> bool:
        level = self._level(req)
        for queue in (level.waiting, level.delayed):
            try:
                queue.remove(req)
            except ValueError:
                continue
            self.count -= 1
            return True
        return False

    def expire(self, now_ns: int, expired: Expired) -> None:
        """Apply each level's timeout action to the requests whose deadline has passed."""
        nearest = _NEVER
        for level in self.levels:
            keep: deque[PendingRequest] = deque()
            for req in level.waiting:
                deadline = req.deadline_ns
                if not deadline or now_ns < deadline:
                    keep.append(req)
                    if deadline and (not nearest or deadline < nearest):
                        nearest = deadline
                elif level.policy.delay:
                    req.deadline_ns = _NEVER
                    level.delayed.append(req)
                else:
                    self.count -= 1
                    expired(req, timeout_error(req))
            level.waiting = keep
        self.next_deadline = nearest


RequestQueue = FifoQueue | PriorityQueue


def _earliest(given: int, computed: int) -> int:
    """A deadline the broker already gave the request (an ensemble step's), if earlier."""
    return min(given, computed) if given else computed


def queue_for(config: Any) -> RequestQueue:
    """The queue ``config`` asks for: a priority queue where levels or a policy are set."""
    if not config.HasField("dynamic_batching"):
        return FifoQueue(request_timeouts=True)
    dyn = config.dynamic_batching
    default = Policy.of(dyn.default_queue_policy)
    levels = int(dyn.priority_levels)
    if not levels and default == Policy():
        return FifoQueue(request_timeouts=False)
    policies = {int(n): Policy.of(p) for n, p in dyn.priority_queue_policy.items()}
    return PriorityQueue(default, policies, levels)
