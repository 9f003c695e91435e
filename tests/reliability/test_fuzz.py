"""Hostile messages, structured and raw: the broker answers every one, refuses every
malformed one by name, loses no worker and holds nothing for them afterwards.

A short run by default (a few seconds); ``INFERPOOL_LONG_TESTS=1`` sends over 100,000.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferpool.client import Client, ShmClient
from inferpool.client.lane import Lane
from inferpool.shm.region import Region
from inferpool.wire import lane_region as wl
from inferpool.wire import lane_responses as lresp
from tests.reliability import hostile, hostile_lanes
from tests.reliability.support import (
    LONG,
    Message,
    Probe,
    Tally,
    record,
    reliability_repo,
    unchanged_workers,
    wait_idle,
)
from tests.support import Server

# (examples, messages per example at least, at most): short, long (>= 100,000 messages)
SIZES = {False: (40, 1, 30), True: (2600, 20, 60)}
EXAMPLES, LEAST, MOST = SIZES[LONG]
CHECK = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = Path(tmp_path_factory.mktemp("fuzz"))
    with Server(tmp, reliability_repo(tmp)) as srv:
        yield srv
        assert srv.stop() == 0, srv.log()[-3000:]


@pytest.fixture(scope="module")
def region() -> Iterator[Region]:
    """The region each probe registers as ``hostile.REGION`` before its shm messages."""
    with Region.create(f"ipt-fuzz-{os.getpid()}", hostile.REGION_BYTES) as r:
        yield r


@pytest.fixture(scope="module")
def figures() -> Iterator[dict[str, Tally]]:
    tallies = {name: Tally() for name in ("structured", "raw", "lane_controls", "lane_records")}
    started = time.monotonic()
    yield tallies
    record(
        "fuzz",
        {
            "seconds": round(time.monotonic() - started, 1),
            **{name: t.as_dict() for name, t in tallies.items()},
        },
    )


def _registration(region: Region) -> Message:
    header = {
        "type": "register_system_shared_memory",
        "id": "reg",
        "name": hostile.REGION,
        "key": f"/{region.name}",
        "offset": 0,
        "byte_size": hostile.REGION_BYTES,
    }
    return Message([b"", json.dumps(header).encode()], "ok", "reg")


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    with server.client() as c, unchanged_workers(c):
        yield c
        wait_idle(c)  # no slot, lease, registration or request is left behind


def test_structured_hostile_messages_are_refused_by_name(
    server: Server, client: Client, region: Region, figures: dict[str, Tally]
) -> None:
    probe = Probe(server.endpoint, figures["structured"])

    @CHECK
    @given(st.lists(hostile.structured, min_size=LEAST, max_size=MOST))
    def check(messages: list[Message]) -> None:
        probe.exchange([_registration(region), *messages])

    check()
    assert client.is_live()


def test_raw_frames_are_answered(server: Server, client: Client, figures: dict[str, Tally]) -> None:
    probe = Probe(server.endpoint, figures["raw"])

    @CHECK
    @given(st.lists(hostile.raw_frames, min_size=LEAST, max_size=MOST))
    def check(messages: list[Message]) -> None:
        probe.exchange(messages)

    check()
    assert client.is_live()
    if LONG:
        sent = sum(t.sent for t in figures.values())
        assert sent >= 100_000, f"only {sent} messages were sent"


def test_hostile_lane_control_messages_are_refused_by_name(
    server: Server, client: Client, figures: dict[str, Tally]
) -> None:
    """open_lane and close_lane with a hostile field: every one answered, none INTERNAL, no
    worker lost (a field reaching a worker unchecked killed it)."""
    probe = Probe(server.endpoint, figures["lane_controls"])

    @CHECK
    @given(st.lists(hostile_lanes.lane_controls(), min_size=LEAST, max_size=MOST))
    def check(messages: list[Message]) -> None:
        probe.exchange([hostile_lanes.create_inputs(), *messages])

    check()
    assert client.is_live()


def test_hostile_lane_records_are_answered_by_the_worker(
    server: Server, client: Client, figures: dict[str, Tally]
) -> None:
    """Whatever a client writes into its lane's request slots, the worker answers each
    request with an error naming the problem (or runs it, if it is valid by chance) and
    serves on; the lane stays open throughout."""
    tally = figures["lane_records"]
    answers = ("", "INVALID_ARG", "NOT_FOUND", "CANCELLED", "UNSUPPORTED")
    with ShmClient(server.endpoint, input_bytes=4096, timeout=20) as c:
        lane = c.lane("identity")
        assert isinstance(lane, Lane)

        @CHECK
        @given(st.lists(hostile_lanes.lane_records(), min_size=LEAST, max_size=MOST))
        def check(records: list[bytes]) -> None:
            for record in records:
                status = _post_raw(lane, record)
                tally.sent += 1
                tally.answered += 1
                tally.codes[wl.code_name(status) if status else "ok"] += 1
                assert wl.CODES[status] in answers, (record[:64], wl.code_name(status))

        check()
        assert lane.usable
    assert client.is_live()


def _post_raw(lane: Lane, record: bytes) -> int:
    """Write ``record`` into the lane's next request slot as it is, post it, and wait for
    its answer; the answer's status."""
    n = lane.sent
    at = lane.request_at[n % lane.slots]
    lane.raw[at : at + len(record)] = record
    lane.sent = (n + 1) & 0xFFFFFFFF
    lane.requests.ring(lane.sent)
    lane._await(n, lane.responses.value(), 20)
    at = lane.response_at[n % lane.slots]
    status = lresp.read_response(lane.region.buf, at, lane.slot_size).status
    lane.read = lane.sent
    lane.words[wl.RESP_DONE >> 2] = lane.sent
    return status
