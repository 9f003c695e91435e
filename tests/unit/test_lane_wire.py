"""The lane's bytes (wire/lane_region.py) and its wake-ups (shm/bell.py, shm/futex.py)."""

from __future__ import annotations

import mmap
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from inferpool.client.lane_book import pin_option
from inferpool.shm import bell as bell_module
from inferpool.shm import cores
from inferpool.shm.bell import Bell
from inferpool.wire import lane_records as lr
from inferpool.wire import lane_region as wl
from inferpool.wire import lane_responses as lresp
from inferpool.wire.errors import Code, InferpoolError

GEOMETRY = wl.Geometry(4, 1024)


@pytest.fixture
def region() -> memoryview:
    mapping = mmap.mmap(-1, GEOMETRY.size)
    wl.init_header(memoryview(mapping), GEOMETRY)
    return memoryview(mapping)


def test_a_request_round_trips(region: memoryview) -> None:
    inputs = [
        wl.Tensor(0, wl.DATATYPES["FP32"], 128, 24, (2, 3)),
        wl.Tensor(1, wl.DATATYPES["BYTES"], 4096, 11, (1,)),
    ]
    body = lr.pack_request_body(inputs, [1, 0, 2])
    at = GEOMETRY.request(5)
    assert at == wl.HEADER_BYTES + 1024  # request 5 of 4 slots: slot 1
    lr.write_request(region, at, 1024, 5, 123456789, 0, 2, 3, body, [64, 4160])
    req = lr.read_request(region, at, 1024)
    assert req == wl.LaneRequest(5, 123456789, 0, 2, 3, body, [64, 4160])
    assert lr.parse_body(req.body, 2, 3) == (inputs, [1, 0, 2], {})


def test_outputs_placed_in_the_clients_region_round_trip(region: memoryview) -> None:
    """Outputs 2 and 0 are to be written into windows of the client's region; output 1
    goes into the worker's region as usual."""
    inputs = [wl.Tensor(0, wl.DATATYPES["FP32"], 128, 24, (2, 3))]
    windows = {2: (4096, 64), 0: (8192, 1 << 20)}
    body = lr.pack_request_body(inputs, [2, 1, 0], windows)
    assert len(body) % 8 == 0
    assert lr.parse_body(body, 1, 3) == (inputs, [2, 1, 0], windows)
    assert lr.parse_body(lr.pack_request_body(inputs, [2, 1, 0], {}), 1, 3)[2] == {}
    with pytest.raises(ValueError, match="output windows run past the request"):
        lr.parse_body(body[:-8], 1, 3)
    twice = bytearray(lr.pack_request_body(inputs, [2, 2], {2: (0, 8)}))
    twice += bytes(16)  # index 2 marked twice: a second window for it
    with pytest.raises(ValueError, match="more than one window"):
        lr.parse_body(bytes(twice), 1, 2)


def test_a_response_round_trips_with_every_kind_of_parameter(region: memoryview) -> None:
    outputs = [wl.Tensor(0, wl.DATATYPES["INT64"], 640, 16, (2,))]
    params = {"s": "text", "i": -42, "b": True, "f": 1.5}
    at = GEOMETRY.response(2)
    lresp.write_response(region, at, 1024, 9, outputs, params)
    size = 24 + 32 + 16 + 24 + 16 + 24  # the head, a 1-D tensor, the four parameters
    assert lresp.read_response(region, at, 1024) == wl.LaneResponse(9, 0, outputs, params, "", size)
    lresp.write_response(region, at, 1024, 9, outputs, {"s": "text", "i": -42, "b": 1, "f": 1.5})
    back = lresp.read_response(region, at, 1024).parameters["b"]
    assert type(back) is int and back == 1  # not True: a new encoding
    lresp.write_response(region, at, 1024, 10, (), None, wl.STATUS["INVALID_ARG"], "no such input")
    back = lresp.read_response(region, at, 1024)
    assert (back.status, back.error, wl.code_name(back.status)) == (
        1,
        "no such input",
        "INVALID_ARG",
    )


def test_a_response_like_the_last_but_its_id_is_copied_and_a_change_written_anew(
    region: memoryview,
) -> None:
    writer = lresp.ResponseWriter(region, 1024)
    at = GEOMETRY.response(1)
    outputs = [(0, wl.DATATYPES["FP32"], 256, 16, (4,))]
    params = {"a": 1, "b": "x"}
    writer.write(at, 1, outputs, params)
    first = lresp.read_response(region, at, 1024)
    region[at : at + 1024] = bytes(1024)  # a copy must write the whole record
    writer.write(at, 2, outputs, dict(params))
    assert lresp.read_response(region, at, 1024) == first._replace(id=2)
    writer.write(at, 3, outputs, {"a": True, "b": "x"})  # equal to 1, but a bool
    assert lresp.read_response(region, at, 1024).parameters["a"] is True
    writer.write(at, 4, outputs, {"b": "x", "a": 1})  # the same, in another order
    assert list(lresp.read_response(region, at, 1024).parameters) == ["b", "a"]
    writer.write(at, 5, [(0, wl.DATATYPES["FP32"], 512, 16, (4,))], params)  # elsewhere
    assert lresp.read_response(region, at, 1024)[:3] == (5, 0, [wl.Tensor(0, 11, 512, 16, (4,))])
    writer.write(at, 6, outputs, {"a": 1, "b": "".join("x")})  # equal, not the same objects
    assert lresp.read_response(region, at, 1024) == first._replace(id=6)
    writer.write(at, 7, outputs, {"a": 1.0, "b": "x"})  # equal to 1, but a float
    assert type(lresp.read_response(region, at, 1024).parameters["a"]) is float
    writer.write(at, 8, outputs, None)  # no parameters after some
    assert lresp.read_response(region, at, 1024).parameters == {}
    writer.write(at, 9, outputs, {"a": 1})  # a key fewer
    assert lresp.read_response(region, at, 1024).parameters == {"a": 1}


def test_a_request_like_the_last_is_read_whole_and_another_read_anew(region: memoryview) -> None:
    reader = lr.RequestReader(region, 1024)
    body = lr.pack_request_body([wl.Tensor(0, wl.DATATYPES["FP32"], 128, 16, (4,))], [0])
    at = GEOMETRY.request(1)
    for request_id, releases in ((1, [64]), (2, [128]), (3, []), (4, [64, 128]), (5, [192])):
        lr.write_request(region, at, 1024, request_id, 7, 0, 1, 1, body, releases)
        assert reader.read(at) == wl.LaneRequest(request_id, 7, 0, 1, 1, body, releases)
    longer = lr.pack_request_body([wl.Tensor(0, wl.DATATYPES["FP32"], 128, 32, (2, 4))], [0])
    lr.write_request(region, at, 1024, 6, 7, 0, 1, 1, longer, [192])
    assert reader.read(at) == wl.LaneRequest(6, 7, 0, 1, 1, longer, [192])
    region[at + 28 : at + 32] = (5000).to_bytes(4, "little")  # a body longer than the slot
    with pytest.raises(ValueError, match="runs past its slot"):
        reader.read(at)


def test_what_does_not_fit_a_slot_is_refused(region: memoryview) -> None:
    with pytest.raises(ValueError, match="does not fit"):
        lresp.write_response(region, GEOMETRY.response(0), 1024, 1, (), {"big": "x" * 2000})
    with pytest.raises(ValueError, match="does not fit"):
        lr.write_request(region, GEOMETRY.request(0), 1024, 1, 0, 0, 0, 0, b"", [0] * 200)
    with pytest.raises(ValueError, match="is a list"):
        lresp.pack_parameters({"bad": [1]})


def test_a_slot_that_lies_about_its_counts_is_refused(region: memoryview) -> None:
    body = lr.pack_request_body([wl.Tensor(0, 11, 0, 16, (4,))], [])
    at = GEOMETRY.request(0)
    lr.write_request(region, at, 1024, 1, 0, 0, 100, 0, body, [])  # 100 inputs, one there
    req = lr.read_request(region, at, 1024)
    with pytest.raises(ValueError, match="run past the slot"):
        lr.parse_body(req.body, req.n_inputs, req.n_outputs)
    region[at + 28 : at + 32] = (5000).to_bytes(4, "little")  # a body longer than the slot
    with pytest.raises(ValueError, match="runs past its slot"):
        lr.read_request(region, at, 1024)


def test_the_header_carries_geometry_and_revocation(region: memoryview) -> None:
    assert wl.read_header(region) == (GEOMETRY, wl.STATE_OPEN, 0)
    header = wl.Header(region)
    assert not header.revoked
    for offset, data in wl.revocation(wl.STATUS["UNAVAILABLE"], "instance 'm_0' died"):
        region[offset : offset + len(data)] = data
    assert header.revoked and wl.read_header(region)[1:] == (wl.STATE_REVOKED, 3)
    assert header.reason() == ("UNAVAILABLE", "instance 'm_0' died")
    region[0:4] = b"XXXX"
    with pytest.raises(ValueError, match="not a version 1 lane"):
        wl.read_header(region)


@pytest.mark.parametrize("spin_ns", [0, 5_000_000_000])
def test_a_bell_wakes_its_consumer(region: memoryview, spin_ns: int) -> None:
    """A sleeping consumer (its flag up: the producer makes the wake-up call) and a
    spinning one (it sees the word change without one) both get the new value."""
    header = wl.Header(region)
    consumer = Bell(region, header.words, wl.REQ_SEQ, wl.WORKER_SLEEPING)
    producer = Bell(region, header.words, wl.REQ_SEQ, wl.WORKER_SLEEPING)
    got: list[int] = []

    def wait() -> None:
        seen = 0
        while seen == 0:
            seen = consumer.wait(0, spin_ns, 5.0)
        got.append(seen)

    thread = threading.Thread(target=wait)
    thread.start()
    if not spin_ns:  # asleep, or about to be: its flag is up
        deadline = time.monotonic() + 5
        while not header[wl.WORKER_SLEEPING] and time.monotonic() < deadline:
            time.sleep(0.001)
        assert header[wl.WORKER_SLEEPING] == 1
    start = time.monotonic()
    producer.ring(1)
    thread.join(5)
    assert got == [1] and time.monotonic() - start < 1.0  # woken, not timed out
    assert wl.Header(region)[wl.WORKER_SLEEPING] == 0


def test_threads_that_ring_at_once_all_fence(region: memoryview) -> None:
    """Each lane of a worker rings from its own thread: fences at the same moment take the
    barrier in turn (a try-and-release would release another thread's hold, whose release
    then fails with "release unlocked lock")."""
    bells = [Bell(region, wl.Header(region).words, wl.RESP_SEQ, wl.CLIENT_SLEEPING)] * 4
    errors: list[BaseException] = []

    def ring(bell: Bell) -> None:
        try:
            for i in range(20_000):
                bell.ring(i)
        except BaseException as exc:
            errors.append(exc)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between any two calls
    try:
        threads = [threading.Thread(target=ring, args=(b,)) for b in bells]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    finally:
        sys.setswitchinterval(switch)
    assert errors == []


def test_a_bell_wait_times_out_on_a_quiet_word(region: memoryview) -> None:
    bell = Bell(region, wl.Header(region).words, wl.RESP_SEQ, wl.CLIENT_SLEEPING)
    start = time.monotonic()
    assert bell.wait(0, 1000, 0.05) == 0
    assert 0.04 < time.monotonic() - start < 1.0


def test_a_words_stores_are_never_seen_half_done(region: memoryview) -> None:
    """A reader never sees a word go back: one store each (struct.pack_into zero-fills
    first, which a reader on another core catches now and then)."""
    header = wl.Header(region)
    seen: list[int] = []
    done = threading.Event()

    def read() -> None:
        last = 0
        while not done.is_set():
            value = header[wl.REQ_SEQ]
            if value < last:
                seen.append(value)
            last = value

    reader = threading.Thread(target=read)
    reader.start()
    for i in range(1, 200_000):
        header[wl.REQ_SEQ] = i
    done.set()
    reader.join()
    assert seen == []


def in_thread(work: Callable[[], Any]) -> Any:
    """``work()``'s result, run in a thread of its own (its pinning stays there)."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(work()))
    thread.start()
    thread.join(30)
    return out[0]


def test_a_thread_is_apart_only_on_a_core_its_peer_does_not_run_on() -> None:
    """Where the thread runs is looked at on every call: a peer that may run anywhere is
    never apart; a thread pinned to a peer's core is not; pinned elsewhere, it is."""
    assert cores.Apart(range(cores.CORES)).never
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        pytest.skip("one core: no thread can run apart from a peer here")
    first, second = mine[:2]

    def looks() -> tuple[bool, bool, bool]:
        cores.pin({first})
        shared = cores.Apart({first})
        before = shared()
        cores.pin({second})
        return before, shared(), cores.Apart({second})()

    assert in_thread(looks) == (False, True, False)
    assert sorted(os.sched_getaffinity(0)) == mine  # only the thread was pinned


def test_a_free_core_is_one_no_worker_holds() -> None:
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        pytest.skip("one core: no core is free of the workers here")
    held = set(mine[1:])
    assert in_thread(lambda: cores.free_core(held, held)) == mine[0]
    # every core held: one apart from the lane's own worker will do; else none
    assert in_thread(lambda: cores.free_core(mine, {mine[0]})) in mine[1:]
    assert in_thread(lambda: cores.free_core(mine, mine)) is None


def ring_from_a_child(bell: Bell, value: int, after: float) -> int:
    """A forked process rings ``value`` on ``bell`` ``after`` seconds from now (another
    process: a thread would need this one's GIL); its pid."""
    pid = os.fork()
    if pid == 0:
        time.sleep(after)
        bell.ring(value)
        os._exit(0)
    return pid


def test_a_bell_spins_only_while_it_may_stay(region: memoryview) -> None:
    """Told to leave (its thread landed on the peer's core), a wait sleeps at once; told to
    stay, it catches the change spinning, without a sleep."""
    bell = Bell(region, wl.Header(region).words, wl.RESP_SEQ, wl.CLIENT_SLEEPING)
    assert bell.wait(0, 10**9, 0.01, lambda: False) == 0
    assert (bell.spun, bell.slept) == (0, 1)
    child = ring_from_a_child(bell, 1, 0.005)
    assert bell.wait(0, 10**9, 0.01, lambda: True) == 1
    os.waitpid(child, 0)
    assert (bell.spun, bell.slept) == (1, 1)
    looks = iter([True, True, False])  # it moved while it spun: the spin ends there
    assert bell.wait(1, 10**9, 0.01, lambda: next(looks)) == 1
    assert (bell.spun, bell.slept, bell.misses) == (1, 2, 0)


def test_spins_that_keep_missing_are_tried_again_now_and_then(region: memoryview) -> None:
    """After MISSES spins in a row ran out, only every TRY_EVERY-th wait spins; a try that
    catches the change makes every wait spin again."""
    bell = Bell(region, wl.Header(region).words, wl.RESP_SEQ, wl.CLIENT_SLEEPING)
    bell.misses = bell_module.MISSES
    looks: list[int] = []

    def look() -> bool:
        """Count the looks; the word never moves."""
        looks.append(1)
        return True

    for _ in range(bell_module.TRY_EVERY):  # a spin of 1 ns: out at its first look
        bell.wait(0, 1, 0.001, look)
    assert len(looks) == 1 and bell.misses == bell_module.MISSES + 1  # one try, missed
    bell._skipped = bell_module.TRY_EVERY - 1  # the next wait is a try
    child = ring_from_a_child(bell, 1, 0.005)
    assert bell.wait(0, 10**9, 0.01, lambda: True) == 1
    os.waitpid(child, 0)
    assert (bell.misses, bell.spun) == (0, 1)
    bell.wait(1, 1, 0.001, look)
    assert len(looks) == 2  # spinning on every wait again


@pytest.mark.parametrize("pin", ["fast", [], [-1], 1.5, [0, "1"]])
def test_a_bad_pin_is_refused(pin: Any) -> None:
    with pytest.raises(InferpoolError) as err:
        pin_option(pin)
    assert err.value.code is Code.INVALID_ARG
    assert "pin must be 'auto', a core or cores, or None" in err.value.message


def test_pins_that_name_cores() -> None:
    assert [pin_option(p) for p in (None, "auto", 3, [0, 1])] == [None, "auto", (3,), (0, 1)]


def test_a_cancelled_mark_is_read_for_its_own_request_only(region: memoryview) -> None:
    at = GEOMETRY.request(3)
    body = lr.pack_request_body([], [])
    lr.write_request(region, at, 1024, 3, 0, wl.FLAG_RELEASE_ONLY, 0, 0, body, [])
    assert not lr.request_cancelled(region, at, 3)
    lr.cancel_request(region, at)
    assert lr.request_cancelled(region, at, 3)
    assert lr.read_request(region, at, 1024).flags == wl.FLAG_RELEASE_ONLY | wl.FLAG_CANCELLED
    assert not lr.request_cancelled(region, at, 7)  # the slot holds another request
    lr.write_request(region, at, 1024, 7, 0, 0, 0, 0, body, [])  # taken over: unmarked
    assert not lr.request_cancelled(region, at, 7)


def test_a_lane_token_names_its_lane_and_offset_and_nothing_else_parses_as_one() -> None:
    assert wl.lane_token(7, 4096) == "lane7.4096"
    assert wl.parse_lane_token(wl.lane_token(7, 4096)) == (7, 4096)
    for other in ("f0c2f635c5.1", "lane7", "lane.4096", "lanex.1", "lane7.-1", "lane².1", 7, None):
        assert wl.parse_lane_token(other) is None, other
