"""Lanes under a hostile client: whatever it does to the regions it can reach (its lane's
region, its server-made input region) or sends in its control messages, the broker lives,
the worker serves on, no death counts toward the model's crash budget, and its requests
get an answer, never a wait to their timeout.

The client here is a raw zmq socket wherever the client library would touch a region the
test shrinks (a real client that shrinks its own mapping dies of it, as it should).
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferpool.client import Client, InferpoolError, ShmClient
from inferpool.client.lane import Lane
from inferpool.wire import lane_records as lr
from inferpool.wire import lane_region as wl
from tests.raw_client import Raw, shrink, shrink_a_lane_then, workers
from tests.support import Server, identity_config, wait_until, write_model


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    tmp = Path(tempfile.mkdtemp(prefix="ipt-", dir="/tmp"))
    repo = tmp / "repo"
    write_model(repo, "plain", identity_config("plain"))
    try:
        # a worker is stopped on purpose below: the liveness check must not kill it meanwhile
        with Server(tmp, repo, "--heartbeat-ms", "5000") as srv:
            yield srv
            assert srv.stop() == 0, srv.log()[-3000:]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def serves(server: Server) -> None:
    with Client(server.endpoint, timeout=10) as c:
        out = c.infer("plain", {"INPUT0": np.arange(3, dtype=np.float32)})
        assert out["OUTPUT0"].tolist() == [0, 1, 2]


@pytest.mark.parametrize("end", ["close_lane", "disconnect", "nothing"])
def test_a_lane_region_its_client_shrank_kills_neither_broker_nor_worker(
    server: Server, end: str
) -> None:
    name = shrink_a_lane_then(server, end)
    assert not os.path.exists(f"/dev/shm/{name}")
    serves(server)


def test_a_lane_request_on_a_shrunk_input_region_is_the_clients_error(server: Server) -> None:
    before = workers(server)
    with ShmClient(server.endpoint, input_bytes=1 << 16, timeout=10) as c:
        c.lane("plain")
        req = c.request("plain", outputs=["OUTPUT0"])
        req.input("INPUT0", (4,), np.float32)[:] = 1
        region = c.session.region
        assert region is not None
        shrink(region.name, 0)
        with pytest.raises(InferpoolError) as err:
            c.run(req)
        assert err.value.code.value == "INVALID_ARG"
        assert f"'/{region.name}' shrank to 0 bytes" in err.value.message
        shrink(region.name, region.size)  # as large again: the lane serves on
        req.input("INPUT0", (4,), np.float32)[:] = 2
        with c.run(req) as result:
            assert result["OUTPUT0"].tolist() == [2, 2, 2, 2]
        assert c.lane("plain").usable
    assert workers(server) == before


def test_a_lane_the_worker_refuses_at_open_ends_for_its_client(server: Server) -> None:
    """A request posted before the worker refused the lane is sent on the broker path as
    soon as the lane is over, not after the client's timeout."""
    [(pid, _, _)] = workers(server).values()
    answer: list[Any] = []
    with ShmClient(server.endpoint, input_bytes=1 << 16, timeout=30) as c:
        req = c.request("plain", outputs=["OUTPUT0"])
        req.input("INPUT0", (3,), np.float32)[:] = 7
        os.kill(pid, signal.SIGSTOP)  # it hears of the lane only once the request is posted
        try:
            lane = c.lane("plain")
            waiting = threading.Thread(target=lambda: answer.append(_run(c, req)))
            waiting.start()
            wait_until(lambda: lane.header[wl.REQ_SEQ] == 1, "the request is posted")
            # the worker refuses a region smaller than its geometry (its header stays)
            shrink(lane.region.name, wl.HEADER_BYTES)
        finally:
            os.kill(pid, signal.SIGCONT)
        waiting.join(40)
    [got] = answer
    assert not isinstance(got, InferpoolError), got
    assert got == [7, 7, 7]
    assert "smaller than its geometry" in server.log()


def _run(client: ShmClient, request: Any) -> Any:
    try:
        with client.run(request) as result:
            return result["OUTPUT0"].tolist()
    except InferpoolError as err:
        return err


@pytest.mark.parametrize("pid", [2**31, 2**63, 2**22 + 1, 0, -1, True, 1.5, "1", None])
def test_an_open_lane_with_a_hostile_pid_is_refused_by_the_broker(server: Server, pid: Any) -> None:
    before = workers(server)
    raw = Raw(server.endpoint)
    with contextlib.closing(raw):
        for _ in range(7):  # more than the crashes that would make the model FAILED
            reply = raw.open_lane(pid=pid)
            assert reply["error"]["code"] == "INVALID_ARG", reply
            assert "'pid'" in reply["error"]["message"]
            raw.call("unregister_system_shared_memory", name="inputs")
    assert workers(server) == before
    serves(server)


VICTIM = """
import sys
import numpy as np
from inferpool.client import Client

with Client(sys.argv[1], timeout=20) as c:
    for _ in range(4):
        out = c.infer("plain", {"INPUT0": np.ones(1 << 18, np.float32)})
        assert out["OUTPUT0"].shape == (1 << 18,)
print("served", flush=True)
"""


def test_lane_outputs_count_in_the_clients_output_share(server: Server) -> None:
    """A lane client that keeps every result is refused once it holds its share (half the
    16 MiB output region here), not the other clients; it holds what it kept, and goes on
    once it releases."""
    with ShmClient(server.endpoint, input_bytes=2 << 20, timeout=20) as hog:
        share = hog.lease_status()["output_share"]
        hog.lane("plain")
        req = hog.request("plain", outputs=["OUTPUT0"])
        req.input("INPUT0", (1 << 18,), np.float32)[:] = 1  # 1 MiB out each time
        kept = []
        with pytest.raises(InferpoolError) as err:
            for _ in range(2 * share >> 20):
                kept.append(hog.run(req))
        assert err.value.code.value == "UNAVAILABLE"
        assert "--client-output-share" in err.value.message, err.value.message
        assert share <= len(kept) << 20 < share + (1 << 20)
        wait_until(lambda: hog.lease_status()["output_held"] == len(kept) << 20, "held counted")
        victim = subprocess.run(
            [sys.executable, "-c", VICTIM, server.endpoint],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert victim.stdout == "served\n", victim.stderr[-2000:]
        for result in kept:
            result.release()
        with hog.run(req) as result:  # its releases ride on this request
            assert result["OUTPUT0"].shape == (1 << 18,)
        # (the last result's release waits for the lane's next request)
        held = lambda: hog.lease_status()["output_held"]  # noqa: E731
        wait_until(lambda: held() == 1 << 20, "the hog's releases counted")


def test_a_negative_lane_dimension_is_named(server: Server) -> None:
    with ShmClient(server.endpoint, input_bytes=1 << 16, timeout=10) as c:
        lane = c.lane("plain")
        assert isinstance(lane, Lane)
        tensor = wl.Tensor(0, wl.DATATYPES["FP32"], 0, 16, (-4,))
        body = lr.pack_request_body([tensor], [0])
        with pytest.raises(InferpoolError) as err:
            lane.result(lane.post((body, 1, 1)), 10)
    assert err.value.code.value == "INVALID_ARG"
    assert "has a negative dimension: shape [-4]" in err.value.message, err.value.message


def test_a_request_collected_unclosed_gives_its_inputs_back(server: Server) -> None:
    with ShmClient(server.endpoint, input_bytes=1 << 16, timeout=10) as c:
        req = c.request("plain", outputs=["OUTPUT0"])
        req.input("INPUT0", (6 << 10,), np.float32)[:] = 1  # 24 KiB of the 64
        with pytest.warns(ResourceWarning, match="was never closed"):
            del req
            gc.collect()
        again = c.request("plain", outputs=["OUTPUT0"])
        again.input("INPUT0", (12 << 10,), np.float32)[:] = 2  # 48 KiB: fits again
        with c.run(again) as result:
            assert result["OUTPUT0"][-1] == 2
        again.close()
