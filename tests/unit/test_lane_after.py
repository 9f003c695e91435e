"""A step that waits for another step's answer (workers/lane_after.py), on real lane regions:
a like request on a like answer passes as the last one did, and anything that differs from
it (the answer's id, where it wrote, the request's body or mask) is checked in full."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from inferpool.shm.region import Region
from inferpool.wire import lane_records as lr
from inferpool.wire import lane_region as wl
from inferpool.wire import lane_responses as lresp
from inferpool.wire.errors import Code, InferpoolError
from inferpool.workers.lane_after import Siblings

GEOMETRY = wl.Geometry(4, 1024)
FP32 = wl.DATATYPES["FP32"]
WINDOW = (4096, 64)  # where step 0 writes its output in the client's region
SHAPE = (16,)


@pytest.fixture
def step0() -> Iterator[Region]:
    region = Region.create(f"ipt-after-{os.getpid()}", GEOMETRY.size)
    wl.init_header(region.buf, GEOMETRY)
    yield region
    region.destroy()


def answer(region: Region, n: int, request_id: int, offset: int = WINDOW[0]) -> None:
    """Step 0's answer ``n``: one output placed at ``offset`` of the client's region."""
    out = (0 | wl.PLACED, FP32, offset, WINDOW[1], SHAPE)
    at = GEOMETRY.response(n)
    lresp.write_response(region.buf, at, GEOMETRY.slot_size, request_id, [out], None)
    wl.Header(region.buf)[wl.RESP_SEQ] = n + 1


def waiting(
    request_id: int, offset: int = WINDOW[0], mask: int = 1
) -> tuple[lr.After, wl.LaneRequest]:
    """A request of step 1 reading its input 0 at ``offset``, waiting for answer 0 of
    step 0."""
    body = lr.pack_request_body([wl.Tensor(0, FP32, offset, WINDOW[1], SHAPE)], [0])
    req = wl.LaneRequest(request_id, 0, wl.FLAG_AFTER, 1, 1, body, [])
    return lr.After(0, 0, mask), req


def check(siblings: Siblings, after: lr.After, req: wl.LaneRequest) -> None:
    siblings.wait(after, req, siblings.inputs_of(req), lambda: "")


def test_a_like_request_passes_on_a_like_answer_and_every_difference_is_checked(
    step0: Region,
) -> None:
    siblings = Siblings([step0.name])
    try:
        answer(step0, 0, 7)
        check(siblings, *waiting(7))  # checked in full, then remembered
        check(siblings, *waiting(7))  # the same: passes as it did
        with pytest.raises(InferpoolError, match="input 0 of request 7 is not where step 0"):
            check(siblings, *waiting(7, offset=8192))  # the same answer, another body
        with pytest.raises(InferpoolError, match="is request 7's, not request 8's"):
            check(siblings, *waiting(8))
        answer(step0, 0, 8, offset=8192)  # written elsewhere this time
        with pytest.raises(InferpoolError, match="input 0 of request 8 is not where step 0"):
            check(siblings, *waiting(8))
        check(siblings, *waiting(8, offset=8192))  # a request that reads it there passes
        answer(step0, 0, 9)
        with pytest.raises(InferpoolError, match="input 0 of request 9 is not where step 0"):
            check(siblings, *waiting(9, offset=8192))  # the body it passed with, a new answer
        check(siblings, *waiting(9, offset=8192, mask=0))  # not step 0's to make: unchecked
        with pytest.raises(InferpoolError, match="input 0 of request 9 is not where step 0"):
            check(siblings, *waiting(9, offset=8192))  # the same, but step 0's to make
        lresp.write_response(
            step0.buf, GEOMETRY.response(0), GEOMETRY.slot_size, 9, [], None, 3, "it failed"
        )
        with pytest.raises(InferpoolError) as err:
            check(siblings, *waiting(9))
        assert err.value.code is Code.CANCELLED
        assert "did not run: step 0, which it reads from, failed" in err.value.message
    finally:
        siblings.close()
