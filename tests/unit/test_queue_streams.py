"""The dynamic batcher's priority queue against a plain model of it, over drawn streams of
pushes, pops, takes and expiries (levels, sizes, timeouts, REJECT and DELAY drawn too): the
queue always holds what the model holds, in the model's order, and refuses and expires the
same requests."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from inferpool.broker.models.queue_policy import Policy, PriorityQueue
from inferpool.wire.errors import InferpoolError
from tests.unit.test_queue_policy import request

policies = st.builds(
    Policy,
    st.integers(0, 3),  # max_queue_size (0: no limit)
    st.sampled_from([0, 5, 20]),  # default_timeout_us
    st.booleans(),  # allow_timeout_override
    st.booleans(),  # delay
)
OPS = st.lists(
    st.tuples(
        st.sampled_from(["push", "push", "push", "pop", "take", "expire"]),
        st.integers(0, 3),  # the level asked for (0: the default one, level 1)
        st.sampled_from([0, 3, 10, 50]),  # a request's timeout parameter, or a time step
    ),
    max_size=50,
)


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 3), policies, st.dictionaries(st.integers(1, 3), policies), OPS)
def test_the_queue_holds_what_a_plain_model_of_it_holds(
    levels: int, default: Policy, per_level: dict[int, Policy], ops: list[tuple[str, int, int]]
) -> None:
    queue = PriorityQueue(default, per_level, levels)
    policy = {n: per_level.get(n, default) for n in range(1, levels + 1)}
    waiting: dict[int, list[Any]] = {n: [] for n in policy}  # [request, deadline] per level
    delayed: dict[int, list[Any]] = {n: [] for n in policy}
    expired: list[int] = []  # what the queue expired (REJECT), and what the model did
    model_expired: list[int] = []
    now, rid = 0, 0

    def order() -> list[int]:
        return [e[0].rid for n in sorted(policy) for e in waiting[n] + delayed[n]]

    for kind, level, value in ops:
        level = min(level, levels)
        if kind == "push":
            rid += 1
            req = request(rid, level, value)
            n = level or 1
            full = policy[n].max_queue_size and (
                len(waiting[n]) + len(delayed[n]) >= policy[n].max_queue_size
            )
            try:
                queue.push(req, now)
            except InferpoolError:
                assert full, "refused a request its level had room for"
                continue
            assert not full, "took a request its level had no room for"
            timeout = policy[n].timeout_us(value)
            waiting[n].append([req, now + timeout * 1000 if timeout else 0])
        elif kind == "pop" and order():
            first = order()[0]
            assert queue.popleft().rid == first
            for lists in (waiting, delayed):
                for n in lists:
                    lists[n] = [e for e in lists[n] if e[0].rid != first]
        elif kind == "take" and order():
            target = order()[value % len(order())]
            req = next(e[0] for n in policy for e in waiting[n] + delayed[n] if e[0].rid == target)
            assert queue.take(req)
            assert not queue.take(req)
            for lists in (waiting, delayed):
                for n in lists:
                    lists[n] = [e for e in lists[n] if e[0].rid != target]
        elif kind == "expire":
            now += value * 1000
            queue.expire(now, lambda r, err: expired.append(r.rid))
            for n in policy:
                keep = []
                for entry in waiting[n]:
                    if not entry[1] or now < entry[1]:
                        keep.append(entry)
                    elif policy[n].delay:
                        delayed[n].append([entry[0], 0])
                    else:
                        model_expired.append(entry[0].rid)
                waiting[n] = keep
        assert [r.rid for r in queue] == order() and len(queue) == len(order())
        assert expired == model_expired
