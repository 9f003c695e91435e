"""The dynamic batcher's queue: priority levels served in order, each with its policy."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from inferpool.broker.models.queue_policy import FifoQueue, Policy, PriorityQueue, queue_for
from inferpool.broker.models.registry import ModelVersion
from inferpool.broker.models.request import PendingRequest
from inferpool.broker.models.scheduler import Scheduler
from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.worker.protocol import Work

MS = 1_000_000
CONFIG = 'name: "m" backend: "identity" max_batch_size: 8'
MODEL = ModelVersion("m", 1, text_format.Parse(CONFIG, pb.ModelConfig()), "/")


def request(rid: int, priority: int = 0, timeout_us: int = 0) -> PendingRequest:
    work = Work(rid, str(rid), 0, 0, {}, [], [], priority, timeout_us)
    return PendingRequest(rid, [], str(rid), MODEL, work, [], {}, 1, 0)


def config(batching: str) -> Any:
    return text_format.Parse(f"{CONFIG} {batching}", pb.ModelConfig())


def test_which_queue_a_config_gets() -> None:
    plain = queue_for(config(""))
    assert isinstance(plain, FifoQueue) and plain.request_timeouts
    default = queue_for(config("dynamic_batching {}"))
    assert isinstance(default, FifoQueue) and not default.request_timeouts
    levels = queue_for(config("dynamic_batching { priority_levels: 3 default_priority_level: 2 }"))
    assert isinstance(levels, PriorityQueue) and len(levels.levels) == 3
    policy = queue_for(config("dynamic_batching { default_queue_policy { max_queue_size: 2 } }"))
    assert isinstance(policy, PriorityQueue) and policy.levels[0].policy.max_queue_size == 2


def test_a_request_may_shorten_the_default_timeout_never_lengthen_it() -> None:
    assert Policy(default_timeout_us=100).timeout_us(50) == 100  # no override allowed
    shorter = Policy(default_timeout_us=100, allow_timeout_override=True)
    assert shorter.timeout_us(50) == 50
    assert shorter.timeout_us(500) == 100
    assert shorter.timeout_us(0) == 100
    assert Policy(allow_timeout_override=True).timeout_us(50) == 50  # 0: no timeout at all


def test_levels_are_served_in_order_fifo_within_a_level() -> None:
    queue = PriorityQueue(Policy(), {}, levels=3)
    for rid, level in ((1, 3), (2, 2), (3, 3), (4, 1), (5, 2)):
        queue.push(request(rid, level), 0)
    assert [r.rid for r in queue] == [4, 2, 5, 1, 3]
    assert queue[0].rid == 4 and len(queue) == 5
    assert queue.take(request(9, 2)) is False
    five = next(r for r in queue if r.rid == 5)
    assert queue.take(five) and len(queue) == 4
    assert [queue.popleft().rid for _ in range(4)] == [4, 2, 1, 3]
    with pytest.raises(IndexError):
        queue.popleft()


def test_a_full_level_refuses_only_its_own_requests() -> None:
    queue = PriorityQueue(Policy(), {1: Policy(max_queue_size=1)}, levels=2)
    queue.push(request(1, 1), 0)
    with pytest.raises(InferpoolError, match=r"\[request id: 2\] Exceeds maximum queue size") as e:
        queue.push(request(2, 1), 0)
    assert e.value.code is Code.UNAVAILABLE and "priority level 1" in e.value.message
    queue.push(request(3, 2), 0)
    assert [r.rid for r in queue] == [1, 3]


def test_expired_requests_are_rejected_or_delayed_by_their_level_s_action() -> None:
    reject = Policy(default_timeout_us=1000)
    delay = Policy(default_timeout_us=1000, delay=True)
    queue = PriorityQueue(Policy(), {1: delay, 2: reject}, levels=2)
    for rid, level, at in ((1, 1, 0), (2, 1, 5 * MS), (3, 2, 0), (4, 2, 5 * MS)):
        queue.push(request(rid, level), at)
    assert queue.next_deadline == 1 * MS
    gone: list[tuple[int, InferpoolError]] = []
    queue.expire(2 * MS, lambda r, err: gone.append((r.rid, err)))
    assert [rid for rid, _ in gone] == [3]
    assert gone[0][1].code is Code.UNAVAILABLE
    assert gone[0][1].message.startswith("Request timeout expired")
    assert [r.rid for r in queue] == [2, 1, 4]  # 1 waits behind the unexpired 2, untimed
    assert queue.next_deadline == 6 * MS and len(queue) == 3


def test_fifo_queue_honours_request_timeouts_only_without_dynamic_batching() -> None:
    plain, batched = FifoQueue(request_timeouts=True), FifoQueue(request_timeouts=False)
    for queue in (plain, batched):
        queue.push(request(1, timeout_us=1000), 0)
        queue.push(request(2), 0)
    assert plain.next_deadline == 1 * MS and batched.next_deadline == 0
    gone: list[int] = []
    plain.expire(1 * MS, lambda r, err: gone.append(r.rid))
    assert gone == [1] and [r.rid for r in plain] == [2] and plain.next_deadline == 0


@pytest.mark.parametrize(
    "batching",
    [
        "",
        "dynamic_batching {}",
        "dynamic_batching { priority_levels: 2 default_priority_level: 1 }",
    ],
)
def test_a_deadline_the_broker_gave_its_own_request_is_kept(batching: str) -> None:
    """An ensemble's step comes with its request's deadline: every queue expires it, and a
    request timeout or a policy can only bring it nearer."""
    model = ModelVersion("m", 1, config(batching), "/")
    expired: list[tuple[int, str]] = []
    scheduler = Scheduler(model, lambda *_: None, lambda r, e: expired.append((r.rid, e.message)))
    step = request(1)
    step.deadline_ns = 5 * MS
    scheduler.enqueue(step, 0)  # no instance: it waits
    scheduler.expire(4 * MS)
    assert expired == []
    scheduler.expire(5 * MS)
    assert [rid for rid, _ in expired] == [1]
    assert expired[0][1].startswith("Request timeout expired")
