"""AsyncClient against a scripted peer (a real ROUTER socket, no broker): responses reach the
request they answer whatever their order, junk is dropped, and every wait ends."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from inferpool.client import AsyncClient, Code, InferpoolError
from inferpool.wire import codec
from inferpool.wire.zmqio import recv_frames, send_parts
from tests.support import free_tcp_port

Script = Callable[[zmq.Socket[Any], list[list[zmq.Frame]]], None]


class Peer:
    """A ROUTER that collects ``expect`` requests, then answers them as ``script`` says."""

    def __init__(self, tmp: Path, expect: int, script: Script, endpoint: str = "") -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.endpoint = endpoint or f"ipc://{tmp}/peer.sock"
        self.handshakes = self.sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self.sock.bind(self.endpoint)
        self.thread = threading.Thread(target=self._run, args=(expect, script), daemon=True)
        self.thread.start()

    def _run(self, expect: int, script: Script) -> None:
        requests = [recv_frames(self.sock) for _ in range(expect)]
        script(self.sock, requests)

    def shook_hands(self) -> None:
        """Until a client has completed zmq's handshake with this peer."""
        assert self.handshakes.poll(10_000), "no client shook hands within 10 s"

    def close(self) -> None:
        self.thread.join(10)
        self.sock.disable_monitor()
        self.handshakes.close(0)
        self.sock.close(0)
        self.ctx.term()


def answer(sock: zmq.Socket[Any], request: list[zmq.Frame], value: float) -> None:
    header = codec.decode_header(request[2].bytes)
    reply = {
        "type": "infer",
        "id": header["id"],
        "model_name": "m",
        "model_version": "1",
        "outputs": [{"name": "Y", "datatype": "FP32", "shape": [1]}],
    }
    send_parts(
        sock, [request[0], b"", codec.encode_header(reply), np.array([value], np.float32).tobytes()]
    )


@pytest.fixture
def peer_factory(short_tmp: Path) -> Iterator[Callable[[int, Script], Peer]]:
    peers: list[Peer] = []

    def make(expect: int, script: Script, endpoint: str = "") -> Peer:
        peers.append(Peer(short_tmp, expect, script, endpoint))
        return peers[-1]

    yield make
    for peer in peers:
        peer.close()


def test_answers_in_any_order_reach_their_requests_and_junk_is_dropped(peer_factory) -> None:
    def script(sock: zmq.Socket[Any], requests: list[list[zmq.Frame]]) -> None:
        envelope = requests[0][0]
        send_parts(sock, [envelope, b"", b"not json"])
        send_parts(sock, [envelope, b"", codec.encode_header({"type": "infer", "id": "999"})])
        send_parts(sock, [envelope, b"no delimiter"])
        for i, request in reversed(list(enumerate(requests))):
            answer(sock, request, float(i))

    peer = peer_factory(3, script)

    async def main() -> list[float]:
        async with AsyncClient(peer.endpoint, timeout=10) as c:
            outs = await asyncio.gather(*(c.infer("m", {"X": np.ones(1)}) for _ in range(3)))
            return [float(o["Y"][0]) for o in outs]

    assert asyncio.run(main()) == [0.0, 1.0, 2.0]


def test_calls_made_before_the_server_is_up_are_sent_in_order_once_it_is(peer_factory) -> None:
    endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"

    def script(sock: zmq.Socket[Any], requests: list[list[zmq.Frame]]) -> None:
        for i, request in enumerate(requests):  # each answer: the request's place on arrival
            answer(sock, request, float(i))

    async def main() -> list[float]:
        async with AsyncClient(endpoint, timeout=10) as c:
            calls = [asyncio.create_task(c.infer("m", {"X": np.ones(1)})) for _ in range(8)]
            await asyncio.sleep(0)  # every call now waits for a server's handshake
            assert not any(call.done() for call in calls)
            peer = peer_factory(9, script, endpoint)  # the server comes up and shakes
            peer.shook_hands()  # hands before this loop has heard of it: a call made now
            calls.append(asyncio.create_task(c.infer("m", {"X": np.ones(1)})))  # goes last
            return [float(out["Y"][0]) for out in await asyncio.gather(*calls)]

    assert asyncio.run(main()) == [float(i) for i in range(9)]


def test_every_wait_times_out(peer_factory) -> None:
    peer = peer_factory(1, lambda sock, requests: None)  # never answers

    async def main() -> None:
        async with AsyncClient(peer.endpoint, timeout=0.2) as c:
            with pytest.raises(InferpoolError) as err:
                await c.is_ready()
            assert err.value.code is Code.TIMEOUT
            assert err.value.message == f"no response from {peer.endpoint} within 0.2s"
            with pytest.raises(InferpoolError, match=r"within 0\.1s"):
                async for _ in c.stream("m", {"X": np.ones(1)}, timeout=0.1):
                    pass

    asyncio.run(main())


def test_close_cancels_waiting_calls_and_later_ones(peer_factory) -> None:
    peer = peer_factory(1, lambda sock, requests: None)

    async def main() -> None:
        c = AsyncClient(peer.endpoint, timeout=10)
        waiting = asyncio.create_task(c.infer("m", {"X": np.ones(1)}))
        deadline = time.monotonic() + 10
        while peer.thread.is_alive():  # until the peer has the request: the call is waiting
            assert time.monotonic() < deadline, "the request never reached the peer"
            await asyncio.sleep(0.01)
        await c.close()
        with pytest.raises(InferpoolError) as err:
            await waiting
        assert err.value.code is Code.CANCELLED
        with pytest.raises(InferpoolError, match="the client is closed"):
            await c.is_live()

    asyncio.run(main())


def test_a_client_serves_one_event_loop(peer_factory) -> None:
    def script(sock: zmq.Socket[Any], requests: list[list[zmq.Frame]]) -> None:
        answer(sock, requests[0], 1.0)

    peer = peer_factory(1, script)
    c = AsyncClient(peer.endpoint, timeout=10)
    assert asyncio.run(c.infer("m", {"X": np.ones(1)}))["Y"].tolist() == [1.0]
    with pytest.raises(InferpoolError, match="serves the event loop it was first used in"):
        asyncio.run(c.is_live())
    asyncio.run(c.close())
