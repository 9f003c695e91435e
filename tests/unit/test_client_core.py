"""The clients' protocol core without sockets: endpoints, requests and their responses,
what a failed connect says, and the shm session's releases and keep-alive timing."""

from __future__ import annotations

import os
import secrets
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest
import zmq

from inferpool.client.control_calls import live
from inferpool.client.core import ClientCore, Exchange
from inferpool.client.endpoint import CONNECT_TIMEOUT, Handshake, parse_endpoint
from inferpool.client.shm_core import ShmSession
from inferpool.shm.region import Region
from inferpool.wire import codec
from inferpool.wire.errors import Code, InferpoolError


def reply(exchange: Exchange[Any], *frames: bytes, **fields: Any) -> list[zmq.Frame]:
    """The message a server would send in answer to ``exchange``."""
    header = {"type": "x", "id": exchange.id, **fields}
    return [zmq.Frame(b""), zmq.Frame(codec.encode_header(header)), *map(zmq.Frame, frames)]


def sent(exchange: Exchange[Any]) -> dict[str, Any]:
    return orjson.loads(exchange.header)


@pytest.mark.parametrize(
    "text, url, path",
    [
        (
            "ipc:///tmp/inferpool-0/broker.sock",
            "ipc:///tmp/inferpool-0/broker.sock",
            "/tmp/inferpool-0/broker.sock",
        ),
        ("ipc://@abstract", "ipc://@abstract", ""),
        ("tcp://127.0.0.1:8710", "tcp://127.0.0.1:8710", ""),
        ("127.0.0.1:8710", "tcp://127.0.0.1:8710", ""),
        ("localhost:8710", "tcp://localhost:8710", ""),
        (" server.example:08710 ", "tcp://server.example:8710", ""),
        ("[::1]:8710", "tcp://[::1]:8710", ""),
    ],
)
def test_endpoints_and_tritonclient_host_port(text: str, url: str, path: str) -> None:
    endpoint = parse_endpoint(text)
    assert (endpoint.url, endpoint.path) == (url, path)


@pytest.mark.parametrize(
    "text, says",
    [
        ("", "no endpoint given"),
        ("localhost", "is not a host and port"),
        ("tcp://127.0.0.1", "is not a host and port"),
        ("127.0.0.1:99999", "is not a host and port"),
        ("127.0.0.1:port", "is not a host and port"),
        ("tcp://*:8710", "is not a host and port"),
        ("http://127.0.0.1:8000", "is not one inferpool serves"),
        ("ipc://", "names no socket file"),
        ("/tmp/inferpool-0/broker.sock", "a socket file is ipc:///tmp/inferpool-0/broker.sock"),
    ],
)
def test_a_malformed_endpoint_is_invalid_arg(text: str, says: str) -> None:
    with pytest.raises(InferpoolError) as err:
        parse_endpoint(text)
    assert err.value.code is Code.INVALID_ARG and says in err.value.message
    assert "tcp://host:port or host:port" in err.value.message or "ipc://" in err.value.message


def test_responses_reach_their_requests_in_any_order_and_junk_is_dropped() -> None:
    core = ClientCore("ipc:///tmp/x.sock", timeout=5)
    first, second = core.call("health_live", {}), core.infer("m", {"X": np.ones(2, np.float32)})
    assert [sent(first)["id"], sent(second)["id"]] == ["1", "2"]
    assert np.frombuffer(second.frames[0], np.float32).tolist() == [1.0, 1.0]
    y = np.array([3, 4], np.float32).tobytes()
    out = {"name": "Y", "datatype": "FP32", "shape": [2]}
    junk = [[zmq.Frame(b"not a delimiter")], [zmq.Frame(b""), zmq.Frame(b"{not json")]]
    for parts in junk:
        assert core.receive(parts) is None
    assert core.receive(reply(second, y, outputs=[out])) is second
    assert core.receive(reply(first, live=True)) is first
    assert first.read(core.take(first)) == {"type": "x", "id": "1", "live": True}
    assert second.read(core.take(second)).outputs["Y"].tolist() == [3.0, 4.0]
    assert first.done and second.done
    assert core.receive(reply(first, live=True)) is None  # answered already: dropped


def test_errors_streams_and_requests_given_up_on() -> None:
    core = ClientCore("127.0.0.1:1", timeout=5)
    call = core.control(live(), timeout=0.5)
    assert call.limit == 0.5 and core.call("x", {}).limit == 5
    core.receive(reply(call, error={"code": "NOT_FOUND", "message": "no such thing"}))
    with pytest.raises(InferpoolError, match="NOT_FOUND: no such thing"):
        call.read(core.take(call))
    stream = core.infer("m", {"X": [1]}, stream=True)
    for final in (False, False, True):
        core.receive(reply(stream, parameters={"triton_final_response": final}))
    results = [stream.read(core.take(stream)) for _ in range(3)]
    assert [r.final for r in results] == [False, False, True] and stream.done
    assert sent(core.infer("m", {"X": [1]}))["single_response"] is True  # infer(): one answer
    assert "single_response" not in sent(stream)
    gone = core.call("status", {})
    core.forget(gone)
    assert core.receive(reply(gone)) is None
    assert core.timed_out("no response from", 0.5).message == (
        "no response from tcp://127.0.0.1:1 within 0.5s"
    )


def test_close_cancels_what_waits_and_what_comes() -> None:
    core = ClientCore("ipc:///tmp/x.sock")
    waiting = core.call("health_ready", {})
    assert core.close() == [waiting]
    with pytest.raises(InferpoolError, match="CANCELLED: the client was closed"):
        core.take(waiting)
    with pytest.raises(InferpoolError, match="CANCELLED: the client is closed"):
        core.call("health_ready", {})


def event(kind: int) -> list[zmq.Frame]:
    return [zmq.Frame(struct.pack("=HI", kind, 0)), zmq.Frame(b"ep")]


@pytest.mark.parametrize(
    "endpoint, events, missing, says",
    [
        ("ipc:///run/x/broker.sock", [], True, "the socket file /run/x/broker.sock does not exist"),
        ("ipc:///run/x/broker.sock", [zmq.EVENT_CONNECT_RETRIED], False, "refuses connections"),
        ("localhost:9", [zmq.EVENT_CONNECT_DELAYED, zmq.EVENT_CONNECT_RETRIED], False, "refused"),
        ("localhost:9", [zmq.EVENT_CONNECT_DELAYED], False, "nothing answered within 1.5s"),
        ("localhost:9", [zmq.EVENT_CONNECTED], False, "no ZeroMQ handshake came within 1.5s"),
        (
            "localhost:9",
            [zmq.EVENT_CONNECTED, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL],
            False,
            "does not speak ZeroMQ's protocol",
        ),
    ],
)
def test_a_failed_connect_says_what_was_seen_and_what_to_check(
    endpoint: str, events: list[int], missing: bool, says: str
) -> None:
    handshake = Handshake(parse_endpoint(endpoint))
    for kind in events:
        handshake.event(event(kind))
    assert not handshake.done
    err = handshake.failure(1.5, missing)
    assert err.code is Code.UNAVAILABLE and says in err.message
    url = parse_endpoint(endpoint).url
    assert f"no inferpool server answers at {url}" in err.message
    assert "`inferpool serve`" in err.message and "$INFERPOOL_ENDPOINT" in err.message
    handshake.event(event(zmq.EVENT_HANDSHAKE_SUCCEEDED))
    assert handshake.done
    assert Handshake.window(60) == CONNECT_TIMEOUT and Handshake.window(0.2) == 0.2


@pytest.fixture
def output_region() -> Iterator[Region]:
    """A real POSIX region standing in for a server's output region."""
    region = Region.create(f"ipt-{os.getpid()}-{secrets.token_hex(3)}", 4096, prefault=False)
    np.frombuffer(region.buf, np.float32, 4)[:] = [1, 2, 3, 4]
    try:
        yield region
    finally:
        region.destroy()


def test_releases_ride_on_the_next_request_and_keepalives_come_while_leases_are_held(
    output_region: Region,
) -> None:
    session = ShmSession("ipc:///tmp/x.sock", timeout=5)
    assert session.keepalive_in() == 0  # the first keep-alive asks the lease timeout
    ask = session.keepalive(b"\x01\x02")
    assert ask.type == "keepalive" and ask.fields == {"client": "0102"}
    assert ask.read({"lease_timeout": 0.6}) == 0.6
    assert session.keepalive_in() == pytest.approx(0.2)  # holding nothing: not due
    request = session.request("m", ["Y"])
    run = session.run(request)
    assert sent(run)["outputs"] == [{"name": "Y", "parameters": {"output_handle": True}}]
    handle = {
        "handle_region": output_region.name,
        "handle_offset": 4,
        "handle_byte_size": 8,
        "handle_lease": "lease-1",
    }
    out = {"name": "Y", "datatype": "FP32", "shape": [2], "parameters": handle}
    session.receive(reply(run, outputs=[out]))
    result = run.read(session.take(run))
    assert result["Y"].tolist() == [2.0, 3.0] and result.leases == ["lease-1"]
    assert 0 < session.keepalive_in() <= 0.2  # holding a lease: due a third of 0.6 s on
    result.release()
    again = session.run(request)
    assert sent(again)["release"] == ["lease-1"] and "release" not in request.header
    assert session.pending == [] and session.flush() is None
    result.release()  # once only
    handle["handle_lease"] = "lease-2"
    session.receive(reply(again, outputs=[out]))
    with again.read(session.take(again)):  # released on leaving the block
        pass
    flush = session.flush()
    assert flush is not None and sent(flush) == {
        "type": "release_leases",
        "leases": ["lease-2"],
        "id": flush.id,
    }
    assert [sent(e)["type"] for e in session.goodbye()] == []  # nothing registered, queued
    session.close()
    assert output_region.name not in session.mapped


def test_a_request_like_an_earlier_one_reuses_its_encoded_header() -> None:
    core = ClientCore("ipc:///tmp/inferpool-test/none.sock")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    first = core.infer("m", {"INPUT0": x}, ["OUTPUT0"])
    again = core.infer("m", {"INPUT0": x + 1}, ["OUTPUT0"])
    assert sent(first) == {
        "type": "infer",
        "model_name": "m",
        "model_version": "",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 3]}],
        "outputs": [{"name": "OUTPUT0"}],
        "single_response": True,
        "id": first.id,
    }
    assert sent(again) == {**sent(first), "id": again.id} and first.id != again.id
    assert bytes(again.frames[0]) == (x + 1).tobytes()  # the new request's own data
    assert len(core._templates) == 1
    # another shape, dtype, version, stream or parameters: another header, never the old one
    core.infer("m", {"INPUT0": x[:1]}, ["OUTPUT0"])
    core.infer("m", {"INPUT0": x.astype(np.int8)}, ["OUTPUT0"])
    core.infer("m", {"INPUT0": x}, ["OUTPUT0"], version=2)
    streamed = core.infer("m", {"INPUT0": x}, ["OUTPUT0"], stream=True)
    assert "single_response" not in sent(streamed)
    with_params = core.infer("m", {"INPUT0": x}, ["OUTPUT0"], parameters={"priority": 1})
    assert sent(with_params)["parameters"] == {"priority": 1}
    listed = core.infer("m", {"INPUT0": [1, 2]}, ["OUTPUT0"])  # not numpy: encoded each time
    assert sent(listed)["inputs"][0]["shape"] == [2]
    assert len(core._templates) == 5
    assert sent(core.infer("m", {"INPUT0": x[:1]}, ["OUTPUT0"]))["inputs"][0]["shape"] == [1, 3]


def test_a_byte_swapped_input_is_converted_every_time() -> None:
    """Its frame is a native copy, not the array's bytes: no header template may skip that."""
    core = ClientCore("ipc:///tmp/inferpool-test/none.sock")
    x = np.arange(4, dtype=">f4")
    for _ in range(3):
        exchange = core.infer("m", {"INPUT0": x}, ["OUTPUT0"])
        assert sent(exchange)["inputs"][0]["datatype"] == "FP32"
        assert bytes(exchange.frames[0]) == x.astype("<f4").tobytes()


def test_any_header_gets_its_id_last() -> None:
    core = ClientCore("ipc:///tmp/inferpool-test/none.sock")
    assert sent(core.raw({})) == {"id": "1"}
    assert sent(core.raw({"type": "x", "id": "mine", "n": 1})) == {"type": "x", "n": 1, "id": "2"}
