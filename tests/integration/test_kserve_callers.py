"""Who may register what over HTTP and gRPC: the caller's user, as the kernel says.

One server for the module, HTTP bound to every address (so a client can come from this
host's non-loopback address too), gRPC to loopback (callers of a wildcard gRPC listener are
not identified), a zmq tcp endpoint, and a small share of output memory per client.  The other user is nobody, in a process of its own running
tritonclient.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import zmq
from tritonclient.utils import InferenceServerException

from inferpool.wire import caller, codec
from tests.support import EXAMPLES, NOBODY, Server, as_nobody

SHARE = 8 << 20
KSERVE_TAG = b"\x00kserve:"  # the frontends' owner keys (broker.front.peers)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    tmp = Path(tempfile.mkdtemp(prefix="ipk-", dir="/tmp"))
    args = ["--http-address", "0.0.0.0"]
    args += ["--output-arena-size", "64M", "--client-output-share", str(SHARE)]
    try:
        with Server(tmp, EXAMPLES, *args, tcp=True, kserve=True) as s:
            yield s
        assert s.proc.returncode == 0, s.log()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def root_object() -> Iterator[str]:
    """A 64-byte POSIX object of root (this test), mode 0600; its key."""
    key = f"/ipk-root-{secrets.token_hex(4)}"
    fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.ftruncate(fd, 64)
    os.close(fd)
    yield key
    os.unlink(f"/dev/shm{key}")


def failure(call: Any) -> list[str] | None:
    """[status, message] of a tritonclient call that fails; None if it succeeds."""
    try:
        call()
    except InferenceServerException as err:
        return [str(err.status()), err.message()]
    return None


def test_each_user_registers_what_it_could_open_and_sees_only_its_own(
    server: Server, root_object: str
) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    mine = f"/ipk-nobody-{secrets.token_hex(4)}"
    try:
        http.register_system_shared_memory("roots", root_object, 64)
        done = as_nobody(
            f"""
            import json
            import os
            import numpy as np
            import tritonclient.grpc as grpcclient
            import tritonclient.http as httpclient
            from tritonclient.utils import InferenceServerException

            def failure(call):
                try:
                    call()
                except InferenceServerException as err:
                    return [str(err.status()), err.message()]

            http = httpclient.InferenceServerClient({server.http_url!r})
            grpc = grpcclient.InferenceServerClient({server.grpc_url!r})
            seen = {{
                "status": http.get_system_shared_memory_status(),
                "http": failure(lambda: http.register_system_shared_memory(
                    "theirs", {root_object!r}, 64)),
                "grpc": failure(lambda: grpc.register_system_shared_memory(
                    "theirs", {root_object!r}, 64)),
            }}
            inp = httpclient.InferInput("INPUT0", [16], "FP32")
            inp.set_shared_memory("roots", 64)
            seen["use_roots"] = failure(lambda: http.infer("identity", [inp]))
            x = np.arange(16, dtype=np.float32)
            fd = os.open("/dev/shm" + {mine!r}, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            os.write(fd, x.tobytes())  # nobody's own object
            os.close(fd)
            http.register_system_shared_memory("mine", {mine!r}, 64)  # over HTTP ...
            inp = grpcclient.InferInput("INPUT0", [16], "FP32")
            inp.set_shared_memory("mine", 64)
            out = grpc.infer("identity", [inp]).as_numpy("OUTPUT0")  # ... used over gRPC
            seen["mine"] = out.tolist() == x.tolist()
            print(json.dumps(seen))
            """
        )
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout)
        assert seen["status"] == []  # root's region is not nobody's
        assert seen["http"][0] == "400", seen  # INVALID_ARG, as for a zmq client over ipc
        assert f"'{root_object}'" in seen["http"][1] and f"(uid {NOBODY})" in seen["http"][1]
        assert seen["grpc"][0] == "StatusCode.INVALID_ARGUMENT", seen
        assert seen["grpc"][1] == seen["http"][1]
        assert seen["use_roots"][0] == "404" and "'roots'" in seen["use_roots"][1], seen
        assert seen["mine"] is True
        assert [r["name"] for r in http.get_system_shared_memory_status()] == ["roots"]
        with grpcclient.InferenceServerClient(server.grpc_url) as grpc:
            assert list(grpc.get_system_shared_memory_status().regions) == ["roots"]
    finally:
        http.unregister_system_shared_memory()
        http.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"/dev/shm{mine}")


def other_address() -> str:
    """The host's address on its default route, or skip: a client coming from it is not
    over loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: the route is looked up
        except OSError:
            pytest.skip("this host has no address but loopback")
        address = str(probe.getsockname()[0])
    if address.startswith("127."):
        pytest.skip("this host has no address but loopback")
    return address


def test_a_client_from_another_address_infers_but_registers_nothing(
    server: Server, root_object: str
) -> None:
    host = other_address()
    x = np.arange(16, dtype=np.float32)
    with httpclient.InferenceServerClient(f"{host}:{server.http_port}") as http:
        err = failure(lambda: http.register_system_shared_memory("r", root_object, 64))
        assert err is not None and err[0] == "501", err
        assert f"cannot identify (host {host} over HTTP/gRPC)" in err[1], err
        inp = httpclient.InferInput("INPUT0", [16], "FP32")
        inp.set_data_from_numpy(x)
        np.testing.assert_array_equal(http.infer("identity", [inp]).as_numpy("OUTPUT0"), x)
        assert http.get_system_shared_memory_status() == []


def test_a_zmq_client_posing_as_the_frontends_gets_nothing(
    server: Server, root_object: str
) -> None:
    as_root = caller.identified(0, [0])
    register = {"type": "register_system_shared_memory", "key": root_object, "byte_size": 64}
    ctx = zmq.Context()
    dropped = server.log().count("poses as another socket's client")
    try:
        posers = []
        # the frontends' keys for root's callers (two: the ROUTER takes an id only once)
        for endpoint, groups in [(server.tcp, [0]), (server.ipc, [0, 1])]:
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.ROUTING_ID, KSERVE_TAG + caller.identified(0, groups))
            sock.connect(endpoint)
            sock.send_multipart([b"", codec.encode_header({**register, "name": "posed"})])
            posers.append(sock)
        deadline = time.monotonic() + 30
        while server.log().count("poses as another socket's client") < dropped + 2:
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.05)
        assert all(sock.poll(0) == 0 for sock in posers)  # dropped, not answered
        # the caller frame alone, as a routing id, names just another plain tcp client
        plain = ctx.socket(zmq.DEALER)
        plain.setsockopt(zmq.LINGER, 0)
        plain.setsockopt(zmq.ROUTING_ID, as_root)
        plain.connect(server.tcp)
        plain.send_multipart([b"", codec.encode_header({**register, "name": "plain"})])
        assert plain.poll(30_000), "no answer"
        reply = codec.decode_header(plain.recv_multipart()[1])
        assert reply["error"]["code"] == "UNSUPPORTED", reply
    finally:
        ctx.destroy(0)
    with httpclient.InferenceServerClient(server.http_url) as http:
        assert http.get_system_shared_memory_status() == []


def test_output_memory_counts_per_user_not_for_all_http_clients(server: Server) -> None:
    """Root's HTTP client that reads nothing holds its share of output memory: root's next
    requests are refused until it reads, and nobody's are served meanwhile."""
    big = np.ones(SHARE // 4, np.float32)  # one response fills root's share
    body = httpclient.InferenceServerClient.generate_request_body(
        [_input(big)], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
    )
    payload, header_length = body
    head = (
        f"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n"
        f"Content-Length: {len(payload)}\r\n"
        f"Inference-Header-Content-Length: {header_length}\r\n\r\n"
    ).encode()
    small = _input(np.ones(4, np.float32))
    with (
        socket.socket() as stuck,
        httpclient.InferenceServerClient(server.http_url) as http,
    ):
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect
        stuck.connect(("127.0.0.1", server.http_port))
        stuck.sendall(head + payload)  # and never reads the answer
        deadline = time.monotonic() + 30
        while (err := failure(lambda: http.infer("identity", [small]))) is None:
            assert time.monotonic() < deadline, "the unread response never filled the share"
            time.sleep(0.05)
        assert err[0] == "503" and "uid 0 over HTTP/gRPC holds" in err[1], err
        done = as_nobody(
            f"""
            import numpy as np
            import tritonclient.http as httpclient
            http = httpclient.InferenceServerClient({server.http_url!r})
            inp = httpclient.InferInput("INPUT0", [4], "FP32")
            inp.set_data_from_numpy(np.ones(4, np.float32))
            print(http.infer("identity", [inp]).as_numpy("OUTPUT0").tolist())
            """
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "[1.0, 1.0, 1.0, 1.0]"
    with httpclient.InferenceServerClient(server.http_url) as http:  # read (closed): served
        deadline = time.monotonic() + 30
        while failure(lambda: http.infer("identity", [small])) is not None:
            assert time.monotonic() < deadline, "the share was never given back"
            time.sleep(0.05)


def _input(x: np.ndarray) -> Any:
    inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    return inp
