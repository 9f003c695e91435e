"""Limits one client cannot step around: shared memory per client process and for the whole
server, and a share of output memory per client, with real clients in real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import numpy as np
import pytest

from inferpool.client import Client, InferpoolError, ShmClient
from tests.support import Server, serving_examples, wait_until

MiB = 1 << 20


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    limits = ["--max-client-shm", "4M", "--max-shm-total", "6M", "--client-output-share", "4M"]
    yield from serving_examples(*limits)


def client_process(server: Server, code: str) -> subprocess.Popen[str]:
    """A client in a process of its own; it says what it saw on stdout, and ends when its
    stdin closes."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )


def test_server_made_memory_is_limited_per_process_not_per_connection(server) -> None:
    clients = []
    try:
        for _ in range(4):  # 4 x 1 MiB: this process's whole --max-client-shm
            clients.append(ShmClient(server.endpoint, input_bytes=MiB))
        with pytest.raises(InferpoolError, match="--max-client-shm") as err:
            ShmClient(server.endpoint, input_bytes=MiB)  # a fifth connection: still this process
        assert f"process {os.getpid()}" in err.value.message
        # another process has its own limit, but the server's total is 6 MiB
        other = client_process(
            server,
            f"""
            from inferpool.client import ShmClient, InferpoolError
            got = []
            try:
                for _ in range(3):
                    got.append(ShmClient({server.endpoint!r}, input_bytes=1 << 20))
            except InferpoolError as err:
                print(len(got), err.code.value, err.message, flush=True)
            """,
        )
        out, _ = other.communicate(timeout=60)
        assert out.startswith("2 UNAVAILABLE") and "--max-shm-total" in out, out
    finally:
        for c in clients:
            c.close()


FLOOD = """
import sys, time, zmq, numpy as np
from inferpool.client import Client
from inferpool.wire import codec

ctx = zmq.Context()
header = codec.encode_header({
    "type": "infer", "model_name": "identity",
    "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1 << 18]}],
})
data = np.ones(1 << 18, np.float32)  # 1 MiB in, 1 MiB out
socks = []
for _ in range(16):  # 16 connections, 4 requests each, replies never read
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVHWM, 1)  # zmq itself stops reading for us: the replies stay queued
    s.setsockopt(zmq.RCVBUF, 4096)  # in the server, as with a client that is stuck
    s.connect(ENDPOINT)
    for _ in range(4):
        s.send_multipart([b"", header, data])
    socks.append(s)
# While the server works through the flood, libzmq hands some replies on and frees them, so
# what this process holds can dip under its share between two requests: a request may be
# served then. Once every flooded request is answered the share stays held, and from then on
# each request of this process is refused.
outcome = "NEVER REFUSED"
with Client(ENDPOINT, timeout=30) as c:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if c.call("lease_status")["output_held"] < SHARE:  # the server holds our share
            time.sleep(0.01)
            continue
        try:
            c.infer("identity", {"INPUT0": data})
        except Exception as err:
            outcome = f"REFUSED {err}"
            break
print(outcome, flush=True)
print("FLOODED", flush=True)
sys.stdin.read()  # hold on, never reading, until the test is done
for s in socks:
    s.close()
ctx.term()
"""


def test_a_client_that_never_reads_cannot_starve_the_others(server) -> None:
    flood = client_process(
        server, FLOOD.replace("ENDPOINT", repr(server.endpoint)).replace("SHARE", str(4 * MiB))
    )
    assert flood.stdout is not None and flood.stdin is not None
    try:
        lines = [flood.stdout.readline(), flood.stdout.readline()]
        assert lines[1].strip() == "FLOODED", lines
        assert lines[0].startswith("REFUSED UNAVAILABLE"), lines
        assert "--client-output-share" in lines[0], lines
        x = np.arange(1 << 18, dtype=np.float32)
        with Client(server.endpoint, timeout=30) as c:
            for _ in range(8):  # 8 MiB of outputs, one at a time: the arena has room for them
                np.testing.assert_array_equal(c.infer("identity", {"INPUT0": x})["OUTPUT0"], x)
            deadline = time.monotonic() + 10  # the last send is freed once libzmq is done
            while c.call("lease_status")["output_held"] and time.monotonic() < deadline:
                time.sleep(0.01)
            assert c.call("lease_status")["output_held"] == 0
    finally:
        flood.stdin.close()
        try:
            flood.wait(30)
        except subprocess.TimeoutExpired:
            flood.kill()
            flood.wait()


def test_a_lanes_region_counts_as_the_clients_server_made_memory(server) -> None:
    """A lane's region is server-made memory of its client's process: past --max-client-shm
    it is refused, naming the limit, and its bytes count until the lane is gone."""
    room = 256 << 10  # left under the limit: a lane of 16 slots (128 KiB + a header), not two
    ep = server.endpoint
    with (
        ShmClient(ep, input_bytes=4 * MiB - room - (64 << 10), lane_slots=64) as big,
        ShmClient(ep, input_bytes=64 << 10, lane_slots=16) as small,
    ):
        with pytest.raises(InferpoolError, match="--max-client-shm") as err:
            big.lane("identity")  # 64 slots: 512 KiB
        assert "lane to model 'identity' version 1 of 528384 bytes" in err.value.message
        small.lane("identity")
        with pytest.raises(InferpoolError, match="--max-client-shm"):
            small.lane("add_sub")
        small.close_lane("identity")

        def opened() -> bool:
            try:
                small.lane("add_sub")
            except InferpoolError as refused:
                assert "--max-client-shm" in refused.message
                return False
            return True

        wait_until(opened, "the closed lane's bytes to count no more", 10)
