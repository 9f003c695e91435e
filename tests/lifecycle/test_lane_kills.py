"""Nothing lost on a lane either: SIGKILL the client while its lane is busy, then the broker.

A killed client's lane is revoked (its disconnect), the worker answers what it had taken and
gives back the client's outputs, the lane's region is unlinked, and the worker serves on.  A
killed broker takes its workers with it; a client waiting on a lane hears it within a
second (the worker is gone) and the next start sweeps the lane's region.  (A killed worker:
tests/integration/test_lanes.py.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from inferpool.client import InferpoolError, ShmClient
from inferpool.shm.region import Region
from inferpool.shm.runs import regions_of_run, run_is_alive
from inferpool.wire import lane_region as wl
from tests.lifecycle.test_shm_nothing_leaks import repo
from tests.support import ROOT, Server, wait_until

BUSY_CLIENT = """
import sys
import numpy as np
from inferpool.client import ShmClient

c = ShmClient(sys.argv[1], input_bytes=1 << 20, lane=True)
fast = c.request("fast", outputs=["OUTPUT0"])
fast.input("INPUT0", (4,), np.float32)[:] = 1
held = [c.run(fast) for _ in range(3)]  # outputs held, never released
slow = c.request("slow", outputs=["OUTPUT0"])
slow.input("INPUT0", (4,), np.float32)[:] = 1
lane = c.lane("slow")
print(lane.region.name, flush=True)
c.run(slow)  # killed while the worker runs it
"""


def test_killing_a_busy_lanes_client_then_the_broker_loses_nothing(short_tmp: Path) -> None:
    models = repo(short_tmp)
    first = Server(short_tmp, models)
    with first:
        run, ep = first.run_id, first.endpoint
        # 1. the client, holding outputs on one lane, is killed while its other lane is busy
        client = subprocess.Popen(
            [sys.executable, "-c", BUSY_CLIENT, ep],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
        )
        assert client.stdout is not None
        region = client.stdout.readline().decode().strip()
        assert region.startswith(f"inferpool-{run}-lane")
        with _lane_header(region) as header:  # the worker took the slow (800 ms) request
            wait_until(lambda: header[wl.REQ_DONE] >= 1, what="the worker runs the request")
        client.kill()
        client.wait(10)
        wait_until(lambda: not [r for r in first.regions() if "-lane" in r], what="lanes unlinked")
        assert first.log().count("disconnected") >= 1
        with ShmClient(ep, input_bytes=1 << 20, timeout=10) as c:
            lane = c.lane("slow")
            req = c.request("slow", outputs=["OUTPUT0"])
            req.input("INPUT0", (2,), np.float32)[:] = 3
            with c.run(req) as result:  # the worker serves on
                np.testing.assert_array_equal(result["OUTPUT0"], [3, 3])

            # 2. the broker is killed while the lane is busy
            answer: list[Any] = []
            waiting = threading.Thread(target=lambda: answer.append(_run(c, req)), daemon=True)
            taken = lane.header[wl.REQ_DONE] + 1
            waiting.start()
            wait_until(lambda: lane.header[wl.REQ_DONE] == taken, what="the worker runs it")
            first.proc.send_signal(signal.SIGKILL)
            first.proc.wait(10)
            start = time.monotonic()
            waiting.join(10)
            assert time.monotonic() - start < 3  # the rest of the 800 ms execute, at most
            [got] = answer
            if isinstance(got, InferpoolError):
                assert got.code.value == "UNAVAILABLE"
                assert f"(pid {lane.worker_pid}) exited" in got.message
            else:
                np.testing.assert_array_equal(got["OUTPUT0"], [3, 3])
            wait_until(lambda: not lane.usable, what="the worker closed the lane as it exited")
            assert not run_is_alive(run)
    second = Server(short_tmp, models)
    with second:
        assert regions_of_run(run) == []  # the lane's region was swept with the dead run
    assert second.proc.returncode == 0


@contextlib.contextmanager
def _lane_header(name: str) -> Iterator[wl.Header]:
    """The header of lane region ``name``, mapped for as long as the block runs."""
    region = Region.attach(name, readonly=True)
    header = wl.Header(region.buf)
    try:
        yield header
    finally:
        header.release()
        region.close()


def _run(client: ShmClient, request: Any) -> Any:
    try:
        return client.run(request)
    except InferpoolError as err:
        return err
