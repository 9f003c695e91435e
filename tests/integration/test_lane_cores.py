"""Where a lane's waits spin: only while the client's thread runs apart from its worker.

A real server pins its worker to a core; a client's thread on that core never spins (it
would take the worker's time), one on another core does, and tells the worker so through
the lane's header; ``pin="auto"`` moves the thread that opens a lane to a core no worker
holds.  The asyncio client polls from its loop under the same rule.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferpool.client import AsyncShmClient, ShmClient
from inferpool.client.lane import Lane
from inferpool.shm import cores
from inferpool.wire import lane_region as wl
from tests.support import Server, identity_config, write_model

REQUESTS = 40
SLOW = 'parameters { key: "execute_delay_ms" value: { string_value: "2" } }'
TWO_CORES = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="one core: no thread can run apart from a worker"
)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    tmp = Path(tempfile.mkdtemp(prefix="ipt-", dir="/tmp"))
    repo = tmp / "repo"
    write_model(repo, "plain", identity_config("plain"))
    write_model(repo, "slow", identity_config("slow", extra=SLOW))  # every answer waited for
    try:
        with Server(tmp, repo) as srv:
            yield srv
        assert srv.proc.returncode == 0, srv.log()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cores_of(server: Server, model: str) -> list[int]:
    """The cores ``model``'s one worker holds, as the server says."""
    with ShmClient(server.endpoint, timeout=10) as c:
        [row] = [r for r in c.status() if r["model"] == model]
    return list(row["placement"]["cpus"])


@pytest.fixture(scope="module")
def worker_cores(server: Server) -> list[int]:
    return cores_of(server, "plain")


def in_thread(work: Callable[[], Any]) -> Any:
    """``work()``'s result, run in a thread of its own (its pinning dies with it)."""
    out: list[Any] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            out.append(work())
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    if failed:
        raise failed[0]
    return out[0]


def run_lane(
    server: Server,
    pin: Any = None,
    where: set[int] | None = None,
    model: str = "plain",
    requests: int = REQUESTS,
) -> dict[str, Any]:
    """``requests`` round trips on a lane to ``model`` from a thread pinned to ``where`` (or
    by ``pin``): the lane's placement, the header's CLIENT_APART and the thread's cores."""

    def work() -> dict[str, Any]:
        if where is not None:
            cores.pin(where)
        with ShmClient(server.endpoint, lane=True, timeout=10, pin=pin) as c:
            req = c.request(model, outputs=["OUTPUT0"])
            req.input("INPUT0", (4,), np.float32)[:] = np.arange(4)
            for _ in range(requests):
                with c.run(req) as result:
                    assert result["OUTPUT0"].tolist() == [0, 1, 2, 3]
            lane = c.lane(model)
            assert isinstance(lane, Lane)
            return {
                **lane.placement(),
                "told": lane.header[wl.CLIENT_APART],
                "thread": sorted(cores.allowed()),
            }

    return dict(in_thread(work))


def test_a_lane_says_where_its_worker_runs(server: Server, worker_cores: list[int]) -> None:
    got = run_lane(server)
    assert worker_cores and got["worker_cores"] == worker_cores
    assert set(worker_cores) <= set(got["held_cores"])
    assert got["spun"] + got["slept"] <= REQUESTS  # (an answer in before a wait: none)


def test_the_grant_names_the_workers_cores(server: Server, worker_cores: list[int]) -> None:
    """open_lane answers the lane's worker's cores and every worker's, as status says."""
    with ShmClient(server.endpoint, timeout=10) as c:
        grant = c.call("open_lane", model_name="plain", pid=os.getpid())
        held = {core for r in c.status() if r["pid"] for core in r["placement"]["cpus"]}
        c.call("close_lane", lane=grant["lane"])
    assert grant["worker_cpus"] == worker_cores
    assert grant["held_cpus"] == sorted(held)


def test_a_thread_on_the_workers_core_never_spins(server: Server) -> None:
    """Every answer is waited for (the model sleeps 2 ms before it answers), and not one
    wait spins: the thread runs where the worker does."""
    where = set(cores_of(server, "slow"))
    got = run_lane(server, where=where, model="slow", requests=10)
    assert got["spun"] == 0 and got["slept"] >= 10
    assert got["told"] == 0 and got["spins"] is False


@TWO_CORES
def test_a_thread_apart_from_the_worker_spins(server: Server, worker_cores: list[int]) -> None:
    other = set(os.sched_getaffinity(0)) - set(worker_cores)
    got = run_lane(server, where=other)
    assert got["spun"] > 0 and got["told"] == 1 and got["spins"] is True
    assert got["client_core"] in other


@TWO_CORES
def test_pin_auto_moves_the_thread_to_a_free_core(server: Server, worker_cores: list[int]) -> None:
    """The thread starts on every core, the worker's included; the lane's first request
    pins it to a core no worker holds (here the two models' workers may hold both: then
    one apart from its own worker), and its waits spin from then on."""
    got = run_lane(server, pin="auto")
    [core] = got["thread"]
    free = set(os.sched_getaffinity(0)) - set(got["held_cores"])
    assert core not in worker_cores and (core in free or not free)
    assert got["spun"] > 0 and got["told"] == 1
    assert sorted(os.sched_getaffinity(0)) == sorted(cores.allowed())  # only its thread moved
    assert len(cores.allowed()) > 1


def run_async(server: Server, where: set[int]) -> dict[str, Any]:
    """REQUESTS requests, eight at a time, from an event loop on a thread pinned to
    ``where``."""

    async def main() -> dict[str, Any]:
        async with AsyncShmClient(server.endpoint, lane=True, timeout=10) as c:
            req = c.request("plain", outputs=["OUTPUT0"])
            req.input("INPUT0", (2,), np.float32)[:] = 7

            async def one() -> None:
                with await c.run(req) as result:
                    assert result["OUTPUT0"].tolist() == [7, 7]

            for _ in range(REQUESTS // 8):
                await asyncio.gather(*(one() for _ in range(8)))
            lane = await c.lane("plain")
            assert isinstance(lane, Lane)
            placement, waiter = lane.placement(), lane.waiter
        waiter._poll()  # a poll the loop still had queued when the lane closed: nothing read
        assert lane.closed and not waiter._polling
        return placement

    def work() -> dict[str, Any]:
        cores.pin(where)
        return asyncio.run(main())

    return dict(in_thread(work))


def test_the_asyncio_loop_on_the_workers_core_never_polls(
    server: Server, worker_cores: list[int]
) -> None:
    got = run_async(server, set(worker_cores))
    assert got["spun"] == 0 and got["slept"] > 0


@TWO_CORES
def test_the_asyncio_loop_apart_from_the_worker_polls(
    server: Server, worker_cores: list[int]
) -> None:
    got = run_async(server, set(os.sched_getaffinity(0)) - set(worker_cores))
    assert got["spun"] > 0
