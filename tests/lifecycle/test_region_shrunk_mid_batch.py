"""A client that shrinks its registered object while a batch reads it kills the worker with
SIGBUS (nothing in user space prevents that): the broker blames the client's region, not the
instance, so the death does not count towards FAILED, and the request is told why."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from inferpool.client import InferpoolError, ShmClient
from tests.support import Server, wait_until, write_model

READER = """
import os, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            print("reader has its input", flush=True)
            while not os.path.exists(MARKER):
                time.sleep(0.01)
            total = np.array([x.sum()], dtype=np.float32)  # reads the pages
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", total)]))
        return responses
"""


@pytest.fixture
def server(short_tmp: Path) -> Iterator[Server]:
    repo = short_tmp / "repo"
    marker = short_tmp / "go"
    write_model(
        repo,
        "reader",
        """
        name: "reader"
        backend: "python"
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
        """,
        files={"1/model.py": READER.replace("MARKER", repr(str(marker)))},
    )
    with Server(short_tmp, repo, "--max-restarts", "0") as srv:
        yield srv


def test_a_region_shrunk_while_read_is_blamed_not_the_instance(server, short_tmp) -> None:
    name = f"ipt-{os.getpid()}-{secrets.token_hex(3)}"
    path = f"/dev/shm/{name}"
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 1 << 20)
        with ShmClient(server.endpoint, input_bytes=0) as c:
            c.register_system_shared_memory("mine", "/" + name, 1 << 20)
            req = c.request("reader", outputs=["OUTPUT0"])
            req.input_from("INPUT0", "mine", [1 << 18], "FP32", 1 << 20)
            with ThreadPoolExecutor(1) as pool:
                answer = pool.submit(c.run, req, 30)
                wait_until(
                    lambda: "reader has its input" in server.log(), "the reader took its input"
                )
                os.ftruncate(fd, 0)  # shrunk under the batch that reads it
                (short_tmp / "go").touch()
                with pytest.raises(InferpoolError) as err:
                    answer.result(60)
            message = err.value.message
            assert "SIGBUS" in message and f"'/{name}'" in message, message
        # not counted (with --max-restarts 0 a counted crash is FAILED): it serves again
        with server.client() as plain:
            wait_until(lambda: plain.is_model_ready("reader"), "the reader ready again")
            out = plain.infer("reader", {"INPUT0": np.ones(4, np.float32)})
            assert out["OUTPUT0"].tolist() == [4.0]
    finally:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def test_an_input_region_shrunk_while_a_lane_reads_it_is_blamed_too(server, short_tmp) -> None:
    """The same over a lane: the worker dies of SIGBUS reading the client's server-made input
    region, the broker blames that region (not counted: the model stays READY), and the
    client gets no lanes any more."""
    with ShmClient(server.endpoint, input_bytes=1 << 20, timeout=60) as c:
        c.lane("reader")
        req = c.request("reader", outputs=["OUTPUT0"])
        req.input("INPUT0", [1 << 18], np.float32)[:] = 1
        region = c.session.region
        assert region is not None
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(c.run, req, 30)
            wait_until(lambda: "reader has its input" in server.log(), "the reader took its input")
            os.truncate(f"/dev/shm/{region.name}", 0)  # shrunk under the lane that reads it
            (short_tmp / "go").touch()
            with pytest.raises(InferpoolError) as err:
                answer.result(60)
        message = err.value.message
        assert "SIGBUS" in message and f"'/{region.name}'" in message, message
        with pytest.raises(InferpoolError) as refused:
            c.lane("reader")
        assert refused.value.code.value == "UNSUPPORTED"
        assert "gets no lanes any more" in refused.value.message
    with server.client() as plain:
        wait_until(lambda: plain.is_model_ready("reader"), "the reader ready again")
        out = plain.infer("reader", {"INPUT0": np.ones(4, np.float32)})
        assert out["OUTPUT0"].tolist() == [4.0]


def test_a_model_whose_instances_failed_says_so(server) -> None:
    """Not 'unknown model ... has no available versions': the model is there, its
    instance is FAILED, and the answer says why."""
    with server.client() as c:
        [pid] = [r["pid"] for r in c.status()]
        os.kill(pid, signal.SIGKILL)  # with --max-restarts 0: FAILED at once
        wait_until(lambda: not c.is_model_ready("reader"), "the reader is not ready")
        with pytest.raises(InferpoolError) as err:
            c.infer("reader", {"INPUT0": np.ones(4, np.float32)})
    message = err.value.message
    assert "unknown model" not in message, message
    assert "model 'reader' has no version ready to serve: version 1 is UNAVAILABLE" in message
    assert "every instance is FAILED" in message and "SIGKILL" in message, message
    assert "not restarting" in message, message
