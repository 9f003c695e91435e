"""Connecting: a client says within seconds that no server answers at its endpoint (and
what to check), reads tritonclient's ``host:port`` as tcp, refuses a malformed endpoint,
and a client made before its server waits for it with ``wait_ready``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferpool.client import AsyncClient, AsyncShmClient, Client, Code, InferpoolError, ShmClient
from tests.support import EXAMPLES, Server


def unavailable(call: Callable[[], Any]) -> tuple[str, float]:
    """The message of the UNAVAILABLE that ``call`` raises, and how long it took."""
    start = time.monotonic()
    with pytest.raises(InferpoolError) as err:
        call()
    assert err.value.code is Code.UNAVAILABLE, err.value
    return err.value.message, time.monotonic() - start


def sync_call(endpoint: str, timeout: float = 60.0) -> None:
    with Client(endpoint, timeout=timeout) as c:
        c.models()


def async_call(endpoint: str, timeout: float = 60.0) -> None:
    async def main() -> None:
        async with AsyncClient(endpoint, timeout=timeout) as c:
            await c.is_live()

    asyncio.run(main())


def async_shm(endpoint: str) -> None:
    async def main() -> None:
        async with AsyncShmClient(endpoint, input_bytes=1 << 20):
            pass

    asyncio.run(main())


def test_no_socket_file_fails_at_once_and_says_what_to_check(short_tmp: Path) -> None:
    endpoint = f"ipc://{short_tmp}/nothing.sock"
    calls = {
        "Client": lambda: sync_call(endpoint),
        "AsyncClient": lambda: async_call(endpoint),
        "ShmClient": lambda: ShmClient(endpoint),
        "AsyncShmClient": lambda: async_shm(endpoint),
    }
    for name, call in calls.items():
        message, took = unavailable(call)
        assert took < 30, f"{name} waited {took:.1f}s of its 60s timeout"
        assert message.startswith(f"no inferpool server answers at {endpoint}: the socket file ")
        assert f"{short_tmp}/nothing.sock does not exist" in message, name
        assert "`inferpool serve`" in message and "$INFERPOOL_ENDPOINT" in message, name


def test_a_stale_socket_file_and_a_closed_port_are_unavailable(short_tmp: Path) -> None:
    stale = short_tmp / "stale.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(stale))  # a socket file nobody listens on, as a killed server leaves it
    message, _ = unavailable(lambda: sync_call(f"ipc://{stale}", timeout=0.5))
    assert f"the socket file {stale} refuses connections" in message
    with socket.socket() as held:  # bound, not listening: refused, and no one else's port
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        message, _ = unavailable(lambda: async_call(f"127.0.0.1:{port}", timeout=0.5))
    assert f"at tcp://127.0.0.1:{port}: the connection was refused" in message


@pytest.fixture
def not_zmq() -> Iterator[int]:
    """A tcp port where something that is not a zmq peer answers (an HTTP server, say)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                with conn:
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n" * 8)

    threading.Thread(target=answer, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def test_a_peer_that_does_not_speak_zmq_is_unavailable(not_zmq: int) -> None:
    message, _ = unavailable(lambda: sync_call(f"localhost:{not_zmq}", timeout=1))
    assert f"at tcp://localhost:{not_zmq}: the peer there does not speak ZeroMQ" in message


@pytest.mark.parametrize("endpoint", ["localhost", "http://127.0.0.1:8000", "tcp://*:8710"])
def test_a_malformed_endpoint_is_invalid_arg_before_any_socket(endpoint: str) -> None:
    for make in (Client, AsyncClient, ShmClient):
        with pytest.raises(InferpoolError) as err:
            make(endpoint)
        assert err.value.code is Code.INVALID_ARG and repr(endpoint) in err.value.message


def test_the_command_line_says_it_in_one_line(short_tmp: Path) -> None:
    for endpoint, code in [
        (f"ipc://{short_tmp}/nothing.sock", "UNAVAILABLE"),
        ("localhost", "INVALID_ARG"),
    ]:
        done = subprocess.run(
            [sys.executable, "-m", "inferpool", "models", "--endpoint", endpoint],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode != 0 and done.stdout == ""
        assert done.stderr.startswith(f"inferpool: {code}: ") and done.stderr.count("\n") == 1


def test_a_client_made_before_its_server_waits_for_it_and_host_port_reaches_it(
    short_tmp: Path,
) -> None:
    endpoint = f"ipc://{short_tmp}/broker.sock"
    with Client(endpoint, timeout=10) as early:
        assert "does not exist" in unavailable(early.is_ready)[0]  # no server yet
        server = Server(short_tmp, EXAMPLES, tcp=True)
        try:
            assert server.endpoint == endpoint
            early.wait_ready(60)  # no server yet, then not ready yet, then ready
            x = np.arange(3, dtype=np.float32)
            assert early.infer("identity", {"INPUT0": x})["OUTPUT0"].tolist() == x.tolist()
            port = server.tcp.rsplit(":", 1)[1]
            for host_port in (f"127.0.0.1:{port}", f"localhost:{port}"):
                with Client(host_port, timeout=10) as c:
                    assert c.endpoint == f"tcp://{host_port}" and c.is_model_ready("identity")
        finally:
            server.wait_started()  # records its run, so its regions are checked
            server.stop()
    assert server.proc.returncode == 0, server.log()
    assert not os.path.exists(short_tmp / "broker.sock")
