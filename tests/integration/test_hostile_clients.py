"""Clients that attack the server: names that could crash it, memory that is not theirs.

One real server for the module (identity models of the example repository) on ipc and tcp;
the POSIX objects are made by the test as a client would make them.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferpool.client import Client, InferpoolError, ShmClient
from tests.support import EXAMPLES, Server


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    tmp = Path(tempfile.mkdtemp(prefix="ipt-", dir="/tmp"))
    try:
        with Server(tmp, EXAMPLES, "--max-client-shm", "8M", tcp=True) as srv:
            yield srv
        assert srv.proc.returncode == 0, srv.log()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def refused(c: Client, **fields: object) -> InferpoolError:
    with pytest.raises(InferpoolError) as err:
        c.call("register_system_shared_memory", name="r", byte_size=8, **fields)
    return err.value


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_keys_that_are_not_posix_names_are_invalid_arg_naming_the_key(server, transport) -> None:
    endpoint = server.ipc if transport == "ipc" else server.tcp
    with Client(endpoint, timeout=10) as c:
        for key in ["/x\u0000y", "\u0000", ".", "..", "/", "//", "/" + "k" * 300]:
            err = refused(c, key=key)
            assert err.code.value == "INVALID_ARG", (key, err)
            assert repr(key) in err.message and "not a valid" in err.message, err.message
        assert c.is_live()
    assert server.proc.poll() is None


@pytest.fixture
def own_object() -> Iterator[tuple[str, int]]:
    """A POSIX object this test (the client) makes: its name and an open fd to resize it."""
    name = f"ipt-{os.getpid()}-{secrets.token_hex(3)}"
    fd = os.open(f"/dev/shm/{name}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        yield name, fd
    finally:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"/dev/shm/{name}")


def infer_from(c: Client, region: str, nbytes: int, offset: int = 0) -> dict[str, Any]:
    """An identity request whose input is in ``region``; the response header."""
    header = {
        "type": "infer",
        "model_name": "identity",
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": [nbytes // 4],
                "parameters": {
                    "shared_memory_region": region,
                    "shared_memory_offset": offset,
                    "shared_memory_byte_size": nbytes,
                },
            }
        ],
    }
    reply, _frames = c._recv(c._send(header), 20)
    return reply


def worker_of(server: Server) -> tuple[int, int]:
    """The identity instance's worker: its pid and restart count."""
    with server.client() as c:
        [row] = [r for r in c.status() if r["model"] == "identity"]
    return row["pid"], row["restarts"]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Rss:"))


def mapped_bytes(pid: int, name: str) -> int:
    """How much of /dev/shm/``name`` the process maps."""
    total = 0
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            if line.rstrip().endswith(f"/dev/shm/{name}"):
                start, end = (int(x, 16) for x in line.split()[0].split("-"))
                total += end - start
    return total


def test_a_region_that_shrank_is_a_request_error_not_a_dead_worker(server, own_object) -> None:
    name, fd = own_object
    os.ftruncate(fd, 4096)
    os.pwrite(fd, np.arange(4, dtype=np.float32).tobytes(), 64)
    before = worker_of(server)
    with ShmClient(server.endpoint, input_bytes=0) as c:
        c.register_system_shared_memory("mine", "/" + name, 4096)
        reply = infer_from(c, "mine", 16, offset=64)
        assert "error" not in reply, reply
        os.ftruncate(fd, 0)  # the client shrinks its object after a first use
        for _ in range(3):
            reply = infer_from(c, "mine", 16, offset=64)
            assert reply["error"]["code"] in ("INVALID_ARG", "UNAVAILABLE"), reply
            assert f"/{name}" in reply["error"]["message"], reply
            assert "shrank" in reply["error"]["message"], reply
        x = np.ones(3, np.float32)
        np.testing.assert_array_equal(c.infer("identity", {"INPUT0": x})["OUTPUT0"], x)
    assert worker_of(server) == before  # the same worker, never restarted


def test_a_small_window_of_a_sparse_gigabyte_maps_only_the_window(server, own_object) -> None:
    name, fd = own_object
    offset = (512 << 20) + 100
    os.ftruncate(fd, 1 << 30)  # sparse: no page is allocated yet
    os.pwrite(fd, np.arange(4, dtype=np.float32).tobytes(), offset)
    pid, _ = worker_of(server)
    rss_before = rss_kib(pid)
    with ShmClient(server.endpoint, input_bytes=0) as c:
        c.register_system_shared_memory("big", "/" + name, 16, offset=offset)
        reply = infer_from(c, "big", 16)
        assert "error" not in reply, reply
        mapped = mapped_bytes(pid, name)
        grown = rss_kib(pid) - rss_before
    assert 0 < mapped <= 2 * mmap.PAGESIZE, mapped  # the page(s) around the window only
    assert grown < 16 << 10, f"the worker's RSS grew by {grown} KiB for a 16-byte window"
