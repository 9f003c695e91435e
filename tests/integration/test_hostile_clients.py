"""Clients that attack the server: names that could crash it, memory that is not theirs.

One real server for the module (identity models of the example repository) on ipc and tcp;
the POSIX objects are made by the test as a client would make them.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from inferpool.client import Client, InferpoolError, ShmClient
from inferpool.shm.region import Region
from tests.support import NOBODY, Server, as_nobody, serving_examples, shm_input


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    # --ipc-access group: user nobody in group root (below) may connect
    yield from serving_examples("--max-client-shm", "8M", "--ipc-access", "group", tcp=True)


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
        "inputs": [shm_input(region, nbytes, offset)],
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


def test_another_users_object_is_refused_under_any_name(server, own_object) -> None:
    """A region of root (this test) mode 0600: user nobody may not register it, however it
    names it, and reads nothing through the server; root itself may."""
    name, fd = own_object
    os.ftruncate(fd, 4096)
    os.pwrite(fd, b"secret!!", 0)
    done = as_nobody(
        f"""
        from inferpool.client import ShmClient, InferpoolError
        with ShmClient({server.ipc!r}, input_bytes=0) as c:
            try:
                c.register_system_shared_memory("theirs", "/{name}", 4096)
            except InferpoolError as err:
                print(err.code.value, err.message)
            else:
                print("REGISTERED")
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("INVALID_ARG"), done.stdout
    assert f"'/{name}'" in done.stdout and f"uid {NOBODY}" in done.stdout, done.stdout
    with ShmClient(server.endpoint, input_bytes=0) as c:  # its owner may
        c.register_system_shared_memory("mine", "/" + name, 4096)


def test_a_world_readable_object_of_another_user_is_theirs_to_share(server, own_object) -> None:
    name, fd = own_object
    os.ftruncate(fd, 4096)
    os.fchmod(fd, 0o666)
    done = as_nobody(
        f"""
        from inferpool.client import ShmClient
        with ShmClient({server.ipc!r}, input_bytes=0) as c:
            c.register_system_shared_memory("shared", "/{name}", 4096)
            print("REGISTERED")
        """
    )
    assert done.stdout.strip() == "REGISTERED", done.stderr


def test_the_servers_own_memory_is_refused_even_under_another_name(server) -> None:
    arena = f"/dev/shm/inferpool-{server.run_id}-arena"
    link = f"/dev/shm/ipt-{os.getpid()}-{secrets.token_hex(3)}"
    with (
        ShmClient(server.endpoint, input_bytes=1 << 20) as a,
        ShmClient(server.endpoint, input_bytes=0) as b,
    ):
        targets = [arena, f"/dev/shm/{a.session.region.name}"]  # the arena, A's server-made region
        for target in targets:
            os.link(target, link)
            try:
                with pytest.raises(InferpoolError, match="the server's own") as err:
                    b.register_system_shared_memory("stolen", link[len("/dev/shm") :], 64)
                assert err.value.code.value == "INVALID_ARG"
            finally:
                os.unlink(link)


def test_plain_tcp_clients_may_register_no_memory(server, own_object) -> None:
    name, fd = own_object
    os.ftruncate(fd, 4096)
    with Client(server.tcp, timeout=10) as c:
        for msg, fields in [
            ("register_system_shared_memory", {"name": "r", "key": "/" + name, "byte_size": 8}),
            ("create_shared_memory_region", {"name": "r", "byte_size": 4096}),
        ]:
            with pytest.raises(InferpoolError, match="CURVE") as err:
                c.call(msg, **fields)
            assert err.value.code.value == "UNSUPPORTED", err.value
        x = np.ones(2, np.float32)  # inference itself is open to it
        np.testing.assert_array_equal(c.infer("identity", {"INPUT0": x})["OUTPUT0"], x)


def test_input_slots_are_scrubbed_once_the_request_is_done(server) -> None:
    pattern = np.full(1 << 18, 1234.5, np.float32)  # 1 MiB
    with server.client() as c:
        np.testing.assert_array_equal(c.infer("identity", {"INPUT0": pattern})["OUTPUT0"], pattern)
    with Region.attach(f"inferpool-{server.run_id}-arena", readonly=True) as arena:
        arena_data = np.frombuffer(arena.buf, np.float32)
        found = int(np.count_nonzero(arena_data == np.float32(1234.5)))
        del arena_data
    assert found == 0, f"{found} values of an earlier request are still in the arena"


def test_only_a_clients_own_process_may_keep_it_alive(server) -> None:
    with ShmClient(server.endpoint, input_bytes=1 << 20) as mine:
        c = mine.routing_id.hex()
        mine.call("keepalive", client=c)  # its own helper socket does this
        done = as_nobody(
            f"""
            from inferpool.client import Client, InferpoolError
            with Client({server.ipc!r}) as c:
                try:
                    c.call("keepalive", client={c!r})
                except InferpoolError as err:
                    print(err.code.value, err.message)
            """
        )
        assert done.stdout.startswith("INVALID_ARG") and "own process" in done.stdout, done


def test_only_the_servers_own_user_may_drain_it(server) -> None:
    with Client(server.tcp, timeout=10) as c, pytest.raises(InferpoolError, match="CURVE") as err:
        c.drain()
    assert err.value.code.value == "UNSUPPORTED" and "drain the server" in err.value.message
    done = as_nobody(
        f"""
        from inferpool.client import Client, InferpoolError
        with Client({server.ipc!r}) as c:
            try:
                c.drain()
            except InferpoolError as err:
                print(err.code.value, err.message)
        """
    )
    assert done.stdout.startswith("UNSUPPORTED") and "only the server's own user" in done.stdout
    with server.client() as c:  # nothing started: the server still takes requests
        assert c.is_ready()
