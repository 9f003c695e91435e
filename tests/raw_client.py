"""Test support for hostile clients: a client that is a bare socket (it maps nothing, so
shrinking a region under it cannot kill it), and looks at regions from outside."""

from __future__ import annotations

import json
import os
from typing import Any

import zmq

from inferpool.client import Client
from inferpool.wire import lane_region as wl
from tests.support import Server, wait_until


class Raw:
    """A client that is a bare DEALER socket: it never maps anything."""

    def __init__(self, endpoint: str) -> None:
        self.sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def call(self, msg_type: str, **fields: Any) -> dict[str, Any]:
        self.sock.send_multipart([b"", json.dumps({"type": msg_type, **fields}).encode()])
        assert self.sock.poll(20_000), f"no reply to {msg_type}"
        reply: dict[str, Any] = json.loads(self.sock.recv_multipart()[1])
        return reply

    def open_lane(self, model: str = "plain", **fields: Any) -> dict[str, Any]:
        made = self.call("create_shared_memory_region", name="inputs", byte_size=4096)
        assert "error" not in made, made
        fields.setdefault("pid", os.getpid())
        return self.call("open_lane", model_name=model, **fields)

    def close(self) -> None:
        self.sock.close()


def workers(server: Server) -> dict[str, tuple[int, int, str]]:
    """Each instance's (pid, restarts, state)."""
    with Client(server.endpoint, timeout=10) as c:
        return {r["instance"]: (r["pid"], r["restarts"], r["state"]) for r in c.status()}


def lanes_open(server: Server) -> int:
    with Client(server.endpoint, timeout=10) as c:
        return int(c.statistics()["resources"]["lanes"])


def asleep_on(name: str) -> bool:
    """Whether the worker sleeps on lane region ``name`` (its flag read off the file)."""
    with open(f"/dev/shm/{name}", "rb") as region:
        return os.pread(region.fileno(), 4, wl.WORKER_SLEEPING) == b"\1\0\0\0"


def shrink(name: str, size: int) -> None:
    os.truncate(f"/dev/shm/{name}", size)


def shrink_a_lane_then(server: Server, end: str) -> str:
    """Open a lane on model 'plain' from a bare socket, shrink its region to nothing while
    the worker sleeps on it, then ``end``: ``close_lane`` it, ``disconnect``, or do
    ``nothing`` (the worker finds out when it wakes); once the lane is gone, the region's
    name.  The broker must live through it and the worker stay the same process."""
    before = workers(server)
    raw = Raw(server.endpoint)
    try:
        grant = raw.open_lane()
        name = str(grant["key"][1:])
        wait_until(lambda: asleep_on(name), "the worker waits on the lane")
        shrink(name, 0)
        if end == "close_lane":
            assert raw.call("close_lane", lane=grant["lane"]) == {"type": "close_lane", "id": ""}
        elif end == "nothing":
            wait_until(lambda: lanes_open(server) == 0, "the worker ended the lane")
    finally:
        raw.close()
    wait_until(lambda: lanes_open(server) == 0, "the lane ended")
    assert server.proc.poll() is None
    assert workers(server) == before  # the same process, no restart counted
    return name
