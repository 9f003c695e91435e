"""The KServe frontends' own process: large tensors through its input region and lent
outputs, its socket kept to itself, a crash restarted (its end with the broker's:
tests/lifecycle/test_stop_and_crash.py).

One server for the module (tests/integration/kserve_support.py).
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import zmq

from inferpool.client import InferpoolError
from inferpool.shm.runs import SHM_DIR
from inferpool.wire import caller, codec
from tests.integration.kserve_support import kserve_server
from tests.support import Server

LARGE = 1 << 18  # FP32 elements: 1 MiB, far above the 64 KiB from which tensors are placed


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with kserve_server() as s:
        yield s


def frontends_pid(server: Server) -> int:
    """The pid of the server's KServe frontends' process."""
    for child in psutil.Process(server.proc.pid).children():
        if "inferpool.broker.kserve.frontends" in " ".join(child.cmdline()):
            return int(child.pid)
    raise AssertionError("no KServe frontends' process")


def _identity(module: Any, client: Any, x: np.ndarray) -> np.ndarray:
    inp = module.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    wanted = [module.InferRequestedOutput("OUTPUT0")]
    return np.asarray(client.infer("identity", [inp], outputs=wanted).as_numpy("OUTPUT0"))


def test_large_tensors_are_written_in_the_frontends_region(server: Server) -> None:
    """A large input is read from the socket into the region the broker made for the
    frontends (its pages are taken only then), over HTTP and over gRPC; the large output is
    lent and answered whole."""
    region = Path(SHM_DIR) / f"inferpool-{server.run_id}-kserve-in"
    assert region.exists(), server.regions()
    x = np.random.default_rng(1).random(LARGE, dtype=np.float32)
    with httpclient.InferenceServerClient(server.http_url) as http:
        np.testing.assert_array_equal(_identity(httpclient, http, x), x)
    assert region.stat().st_blocks * 512 >= x.nbytes  # written there, not sent in a frame
    with grpcclient.InferenceServerClient(server.grpc_url) as grpc:
        np.testing.assert_array_equal(_identity(grpcclient, grpc, x[::-1].copy()), x[::-1])
    with server.client() as c:
        assert c.call("lease_status")["total"] == 0  # every lent output was given back


def test_the_frontends_allocate_messages_from_their_heap(server: Server) -> None:
    """glibc's allocator in the frontends' process keeps large blocks on its heap (no
    mapping made and unmade for each message) and keeps freed heap mapped."""
    environ = psutil.Process(frontends_pid(server)).environ()
    assert environ.get("MALLOC_MMAP_MAX_") == "0"
    assert int(environ.get("MALLOC_TRIM_THRESHOLD_", "0")) >= 256 << 20


def test_placed_inputs_are_the_frontends_alone(server: Server) -> None:
    """A zmq client naming windows of the frontends' region gets INVALID_ARG."""
    header = {
        "model_name": "identity",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4]}],
        "placed": [[0, 16]],
    }
    with server.client() as c, pytest.raises(InferpoolError) as err:
        c.call("infer", **header)
    assert err.value.code.name == "INVALID_ARG" and "KServe frontends'" in err.value.message


def test_another_process_on_the_frontends_socket_is_dropped(server: Server) -> None:
    """A message on the frontends' socket from any process but theirs is never handled,
    whatever caller it names."""
    path = Path(tempfile.gettempdir(), f"inferpool-{os.getuid()}", f"kserve-{server.proc.pid}.sock")
    assert path.exists() and path.stat().st_mode & 0o777 == 0o600
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"ipc://{path}")
        header = codec.encode_header({"type": "health_live"})
        sock.send_multipart([caller.identified(0, [0]), bytes(8), b"", header])
        deadline = time.monotonic() + 30
        while "from another process" not in server.log():
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.05)
        assert sock.poll(0) == 0  # dropped, not answered
    finally:
        ctx.destroy(0)


def test_a_crashed_frontends_process_is_restarted(server: Server) -> None:
    """SIGKILL the frontends' process: the broker says so, starts another, and Triton's
    clients are served again on the same ports; a process that ends soon after its start
    again waits twice as long (a crash loop is not restarted at full speed)."""
    for count, delay in ((1, "0.5s"), (2, "1s")):
        old = frontends_pid(server)
        os.kill(old, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while server.log().count("restarting the KServe frontends") < count:
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.05)
        ended = "KServe frontends' process exited (killed by SIGKILL)"
        assert f"{ended}: its calls in flight failed; restarting it in {delay}" in server.log()
        x = np.arange(4, dtype=np.float32)
        while True:
            try:
                with httpclient.InferenceServerClient(server.http_url) as http:
                    np.testing.assert_array_equal(_identity(httpclient, http, x), x)
                break
            except Exception:
                assert time.monotonic() < deadline, server.log()
                time.sleep(0.1)
        assert frontends_pid(server) != old
