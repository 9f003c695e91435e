"""Shared memory end to end: registered regions, output handles and leases, the shm clients.

One real server for the module (identity models of the example repository), real POSIX
objects made by the test as a Triton client would make them, real worker processes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from inferpool.client import AsyncShmClient, Client, InferpoolError, ShmClient
from inferpool.shm import cuda
from inferpool.shm.region import Region
from tests.support import Server, serving_examples, shm_input, wait_until


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from serving_examples("--max-client-shm", "8M")


@pytest.fixture
def user_region() -> Iterator[Region]:
    """A POSIX object of 4096 bytes that the test (the client) created and will unlink."""
    region = Region.create(f"ipt-{os.getpid()}-{secrets.token_hex(3)}", 4096, prefault=False)
    try:
        yield region
    finally:
        region.destroy()


def exchange(c: Client, header: dict[str, Any], frames: list[Any] | None = None) -> Any:
    rid = c._send(dict(header), frames or [])
    return c._recv(rid, 10)


def infer(c: Client, inputs: list[Any], outputs: list[Any] | None = None, **kw: Any) -> Any:
    header = {"type": "infer", "model_name": "identity", "inputs": inputs, **kw}
    if outputs is not None:
        header["outputs"] = outputs
    return exchange(c, header)


def error(reply: Any) -> tuple[str, str]:
    header, _ = reply
    assert "error" in header, header
    return header["error"]["code"], header["error"]["message"]


def address(arr: Any) -> int:
    return int(arr.__array_interface__["data"][0])


def inside(arr: np.ndarray, region: Region) -> bool:
    base = address(np.frombuffer(region.buf, np.uint8))
    return base <= address(arr) and address(arr) + arr.nbytes <= base + region.size


def test_the_extensions_are_advertised(server: Server) -> None:
    with server.client() as c:
        extensions = c.server_metadata()["extensions"]
    assert {"system_shared_memory", "cuda_shared_memory", "output_handles"} <= set(extensions)


def test_inputs_from_and_outputs_into_a_registered_region(server: Server, user_region) -> None:
    data = np.frombuffer(user_region.buf, np.float32)
    data[:8] = np.arange(8, dtype=np.float32)
    with ShmClient(server.endpoint, input_bytes=0) as c:
        c.register_system_shared_memory("data", "/" + user_region.name, 4096)
        assert c.system_shared_memory_status() == [
            {"name": "data", "key": "/" + user_region.name, "offset": 0, "byte_size": 4096}
        ]
        window = {"shared_memory_region": "data", "shared_memory_offset": 1024}
        header, frames = infer(
            c,
            [shm_input("data", 32)],
            [{"name": "OUTPUT0", "parameters": {**window, "shared_memory_byte_size": 64}}],
        )
        assert frames == [] and "error" not in header, header
        [out] = header["outputs"]
        assert out["parameters"] == {**window, "shared_memory_byte_size": 32}
        np.testing.assert_array_equal(data[256:264], np.arange(8))

        # the same through the shm client's request object: the result views the region
        req = c.request("identity", outputs=[])
        req.input_from("INPUT0", "data", [4], "FP32", 16, offset=4)
        req.output_to("OUTPUT0", "data", 16, offset=2048)
        with c.run(req) as result:
            np.testing.assert_array_equal(result["OUTPUT0"], [1, 2, 3, 4])
            np.testing.assert_array_equal(data[512:516], [1, 2, 3, 4])

        assert c.unregister_system_shared_memory("data") == ["data"]
        code, message = error(infer(c, [shm_input("data", 32)]))
        assert code == "NOT_FOUND" and "unable to find shared memory region: 'data'" in message


def test_bad_shared_memory_requests_get_clear_errors(server: Server, user_region) -> None:
    with (
        ShmClient(server.endpoint, input_bytes=0) as a,
        ShmClient(server.endpoint, input_bytes=0) as b,
    ):
        a.register_system_shared_memory("mine", user_region.name, 64, offset=128)
        b.register_system_shared_memory("theirs", user_region.name, 4096)
        handle = {"name": "OUTPUT0", "parameters": {"output_handle": True}}
        small_window = {"shared_memory_region": "mine", "shared_memory_byte_size": 8}
        small = {"name": "OUTPUT0", "parameters": small_window}
        cases = [
            (
                [shm_input("theirs", 16)],
                None,
                "NOT_FOUND",
                "unable to find shared memory region: 'theirs'",
            ),
            (
                [shm_input("mine", 16, shared_memory_byte_size=12)],
                None,
                "INVALID_ARG",
                "make 16 bytes",
            ),
            (
                [shm_input("mine", 16, offset=56)],
                None,
                "INVALID_ARG",
                "outside region 'mine' of 64 bytes",
            ),
            ([shm_input("mine", 16, shared_memory_offset=-8)], None, "INVALID_ARG", "non-negative"),
            (
                [shm_input("mine", 16)],
                [small],
                "INVALID_ARG",
                "needs 16 bytes but its shared-memory window holds only 8",
            ),
            (
                [shm_input("mine", 16)],
                [{"name": "OUTPUT0", "parameters": {"output_handle": "yes"}}],
                "INVALID_ARG",
                "must be a boolean",
            ),
            (
                [shm_input("mine", 16)],
                [{"name": "OUTPUT0", "parameters": {**small_window, "output_handle": True}}],
                "INVALID_ARG",
                "choose one",
            ),
            ([shm_input("mine", 16)], [handle], "NOT_FOUND", "not held by this client"),
        ]
        for inputs, outputs, code, text in cases:
            extra = {"release": ["forged-token"]} if outputs == [handle] else {}
            got_code, message = error(infer(a, inputs, outputs, **extra))
            assert (got_code, text in message) == (code, True), (inputs, outputs, message)
        with pytest.raises(InferpoolError, match="already registered") as err:
            a.register_system_shared_memory("mine", user_region.name, 8)
        assert err.value.code.value == "ALREADY_EXISTS"
        with pytest.raises(InferpoolError, match="does not exist"):
            a.register_system_shared_memory("gone", "/ipt-no-such-object", 8)
        with pytest.raises(InferpoolError, match="reserved for the server"):
            a.register_system_shared_memory("arena", f"/inferpool-{server.run_id}-arena", 8)
        with pytest.raises(InferpoolError, match="--max-client-shm"):
            ShmClient(server.endpoint, input_bytes=64 << 20)
        with pytest.raises(InferpoolError, match="routing id in hex"):
            a.call("keepalive", client="not hex")
        with pytest.raises(InferpoolError, match="a list of lease tokens"):
            a.call("release_leases", leases="0123456789.1")
        with pytest.raises(InferpoolError, match="needs 'byte_size'"):
            a.call("create_shared_memory_region", name="x", byte_size=-5)
        # every client is still served, and nothing is held
        x = np.arange(3, dtype=np.float32)
        np.testing.assert_array_equal(b.infer("identity", {"INPUT0": x})["OUTPUT0"], x)
        assert a.lease_status()["total"] == 0


def test_output_handles_and_their_leases(server: Server) -> None:
    x = np.arange(6, dtype=np.float32)
    handle = [{"name": "OUTPUT0", "parameters": {"output_handle": True}}]
    frame_input = [{"name": "INPUT0", "datatype": "FP32", "shape": [6]}]
    with Client(server.endpoint) as owner, Client(server.endpoint) as other:
        header, frames = exchange(
            owner,
            {"type": "infer", "model_name": "identity", "inputs": frame_input, "outputs": handle},
            [x.data],
        )
        assert frames == []
        [out] = header["outputs"]
        p = out["parameters"]
        assert (out["datatype"], out["shape"], p["handle_byte_size"]) == ("FP32", [6], 24)
        assert p["handle_region"].startswith(f"inferpool-{server.run_id}-out")
        with Region.attach(p["handle_region"], readonly=True) as region:
            view = np.frombuffer(region.buf, np.float32, 6, p["handle_offset"])
            np.testing.assert_array_equal(view, x)
            assert not view.flags.writeable
            del view
        token = p["handle_lease"]
        assert owner.call("lease_status")["leases"] == 1

        for forged in (token, token + "0", "0123456789.1"):  # not the other client's to end
            with pytest.raises(InferpoolError, match="not held by this client") as err:
                other.call("release_leases", leases=[forged])
            assert err.value.code.value == "NOT_FOUND"
        assert owner.call("lease_status")["leases"] == 1
        # piggybacked on the next request, then stale
        header, _ = exchange(
            owner,
            {"type": "infer", "model_name": "identity", "inputs": frame_input, "release": [token]},
            [x.data],
        )
        assert "error" not in header and owner.call("lease_status")["total"] == 0
        with pytest.raises(InferpoolError, match="released already"):
            owner.call("release_leases", leases=[token])
        # a plain client asking for a handle still decodes the rest of the response
        out = owner.infer("identity", {"INPUT0": x}, outputs=handle)
        assert out == {}
        ints = np.arange(4, dtype=np.int32).reshape(2, 2)
        words = np.array([[b"a"], [b"bc"]], dtype=object)
        out = owner.infer(
            "identity_batched",
            {"INPUT0": ints, "INPUT1": words},
            outputs=[handle[0], "OUTPUT1"],  # one handle, one frame
        )
        assert list(out) == ["OUTPUT1"] and out["OUTPUT1"].tolist() == words.tolist()
        assert owner.call("lease_status")["leases"] == 2  # released when owner disconnects


def test_shm_client_is_zero_copy_with_numpy_and_torch(server: Server) -> None:
    with ShmClient(server.endpoint, input_bytes=1 << 20) as c:
        assert os.stat(f"/dev/shm/{c.session.region.name}").st_mode & 0o777 == 0o600
        req = c.request("identity")
        x = req.input("INPUT0", (1000,), np.float32)
        assert inside(x, c.session.region) and x.flags.writeable
        torch.from_numpy(x).copy_(torch.linspace(0, 1, 1000))  # written in place via torch
        with c.run(req) as result:
            y = result["OUTPUT0"]
            np.testing.assert_array_equal(y, x)
            assert not y.flags.writeable
            [region] = [c.session.mapped.get(r) for _, r in result._leases]
            assert inside(y, region)
            t = result.as_torch("OUTPUT0")
            assert t.data_ptr() == address(y) and torch.equal(t, torch.from_numpy(x))
            assert result.parameters["param1"] == 42
            del y, t
        assert c.lease_status()["leases"] == 1  # released with the next message
        x[:] = 7
        with c.run(req) as result:
            assert float(result["OUTPUT0"][0]) == 7.0
            assert c.session.pending == []
        assert c.flush() == 1 and c.lease_status()["leases"] == 0
        req.close()
        assert c.session.allocator.used_blocks == 0


def test_an_input_of_a_byte_swapped_dtype_holds_its_values(server: Server) -> None:
    """The server reads tensors in the machine's byte order: the input's array is in it,
    and values written into it arrive as written (a big-endian view sent garbage)."""
    with ShmClient(server.endpoint, input_bytes=1 << 20) as c, c.request("identity") as req:
        x = req.input("INPUT0", (4,), ">f4")
        x[:] = [0.5, 1, 2, 3]
        assert x.dtype == np.float32 and x.dtype.isnative
        with c.run(req) as result:
            assert result["OUTPUT0"].tolist() == [0.5, 1, 2, 3]


def test_shm_client_bytes_batches_and_default_outputs(server: Server) -> None:
    with ShmClient(server.endpoint, input_bytes=1 << 20) as c:
        with c.request("identity_batched") as req:  # outputs: every output of the model
            ints = np.arange(6, dtype=np.int32).reshape(2, 3)
            words = np.array([[b"alpha"], ["\u00fcber".encode()]], dtype=object)
            req.set_input("INPUT0", torch.from_numpy(ints))
            req.set_input("INPUT1", words)
            with c.run(req) as result:
                np.testing.assert_array_equal(result["OUTPUT0"], ints)
                assert result["OUTPUT1"].tolist() == words.tolist()
                assert len(result.leases) == 2
        assert c.session.allocator.used_blocks == 0


def test_async_client_with_many_requests_in_flight(server: Server) -> None:
    async def main() -> list[list[float]]:
        async with AsyncShmClient(server.endpoint, input_bytes=1 << 20) as c:
            reqs = []
            for i in range(8):  # a plain call; without outputs, the first run asks for them
                req = c.request("identity", outputs=["OUTPUT0"] if i % 2 else None)
                req.input("INPUT0", (3,), np.float32)[:] = i
                reqs.append(req)
            results = await asyncio.gather(*(c.run(r) for r in reqs))
            values = [r["OUTPUT0"].tolist() for r in results]
            for r in results:
                r.release()
            assert await c.flush() == 8
            assert (await c.call("lease_status"))["leases"] == 0
            return values

    assert asyncio.run(main()) == [[float(i)] * 3 for i in range(8)]


def test_async_client_registers_regions_as_the_sync_one_does(server: Server, user_region) -> None:
    data = np.frombuffer(user_region.buf, np.float32)
    data[:4] = [5, 6, 7, 8]

    async def main() -> None:
        async with AsyncShmClient(server.endpoint, input_bytes=0) as c:
            await c.register_system_shared_memory("data", "/" + user_region.name, 4096)
            [status] = await c.system_shared_memory_status("data")
            assert status["key"] == "/" + user_region.name
            req = c.request("identity", outputs=[])
            req.input_from("INPUT0", "data", [4], "FP32", 16)
            req.output_to("OUTPUT0", "data", 16, offset=64)
            with await c.run(req) as result:
                assert result["OUTPUT0"].tolist() == [5, 6, 7, 8]
            assert data[16:20].tolist() == [5, 6, 7, 8]
            assert await c.unregister_system_shared_memory() == ["data"]
            assert await c.cuda_shared_memory_status() == []

    asyncio.run(main())


@pytest.mark.skipif(cuda.unavailable_reason() is None, reason="this machine has a GPU")
def test_cuda_registration_says_why_it_is_unavailable(server: Server) -> None:
    with server.client() as c, pytest.raises(InferpoolError) as err:
        c.call(
            "register_cuda_shared_memory",
            name="g",
            raw_handle=base64.b64encode(bytes(64)).decode(),
            device_id=0,
            byte_size=64,
        )
    assert err.value.code.value == "UNSUPPORTED"
    assert "CUDA shared memory is not available" in err.value.message


def test_a_closed_client_leaves_nothing_mapped_or_linked(server: Server) -> None:
    with ShmClient(server.endpoint, input_bytes=1 << 20) as c:
        name = c.session.region.name
        req = c.request("identity")
        req.input("INPUT0", (4,), np.float32)[:] = 1
        with c.run(req):
            pass
        workers = server.worker_pids()
        assert any(name in Path(f"/proc/{pid}/maps").read_text() for pid in workers)
    wait_until(
        lambda: (
            not os.path.exists(f"/dev/shm/{name}")
            and not any(name in Path(f"/proc/{pid}/maps").read_text() for pid in workers)
        ),
        f"{name} unlinked and mapped by no worker",
    )
    with contextlib.closing(server.client()) as c:
        assert c.call("lease_status")["registrations"] == 0
