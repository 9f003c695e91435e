"""The floors of scripts/bench_latency.py's lane rows, and what an idle lane costs.

Floors (two bare processes, no inferpool): a POSIX semaphore ping-pong, and a spinning
hand-off (a struct-packed sequence number in shared memory, spun on), each side copying
64 B with numpy per round trip as a lane's two sides do at least.  Beside them the lane
bound: the least Python a lane round trip needs while it keeps the lane's contract
(:func:`_bound_client`, :func:`_bound_worker`).  And what an idle lane to the served
``lane`` model (identity, no batching) costs its two processes over ``IDLE_S``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import struct
import threading
import time
from typing import Any

import numpy as np
import posix_ipc

from inferpool.client import ShmClient
from inferpool.shm.region import Region

LANE_MODEL = "lane"
LANE_CONFIG = """
name: "lane"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_UINT8 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_UINT8 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU host_policy: "bench" } ]
"""
SPIN_US = 100  # the lane's spin budget when spinning (the server's default)
IDLE_S = 10.0
_SEQ = struct.Struct("Q")
_FENCE = threading.Lock()  # shm.futex's barrier: an uncontended lock's acquire and release
# the bound's records: a request (id, sent ns, input offset, byte size, a release token) and
# a response (id, status, output offset, byte size); its region's layout, in bytes
_BOUND_REQ, _BOUND_RESP = struct.Struct("<QQQQq"), struct.Struct("<QIxxxxQQ")
REQ_SEQ, RESP_SEQ, WORKER_SLEEPS, CLIENT_SLEEPS = 0, 64, 72, 136
REQ_AT, RESP_AT, INPUT_AT, OUTPUTS_AT, OUTPUT_SLOTS = 256, 512, 1024, 2048, 8


def pin(cpu: int) -> None:
    cpus = sorted(os.sched_getaffinity(0) | set(range(os.cpu_count() or 1)))
    os.sched_setaffinity(0, {cpu if cpu in cpus else cpus[0]})


# ---------------------------------------------------------------------------- the floors
def _floor_peer(kind: str, name: str, cpu: int, n: int) -> None:
    pin(cpu)
    region = Region.attach(name)
    buf = region.buf
    src = np.frombuffer(buf, np.uint8, 64, 128)
    dst = np.zeros(64, np.uint8)
    if kind == "bound":
        _bound_worker(buf, n)
    elif kind == "spin":
        load, store = _SEQ.unpack_from, _SEQ.pack_into
        for i in range(1, n + 1):
            while load(buf, 0)[0] != i:
                pass
            np.copyto(dst, src)
            store(buf, 64, i)
    else:
        ping, pong = posix_ipc.Semaphore(f"/{name}-a"), posix_ipc.Semaphore(f"/{name}-b")
        for _ in range(n):
            ping.acquire()
            np.copyto(dst, src)
            pong.release()
        ping.close()
        pong.close()
    del src
    region.close()


class _BoundRequest:
    __slots__ = ("id", "inputs")

    def __init__(self, request_id: int, inputs: dict[str, np.ndarray]) -> None:
        self.id = request_id
        self.inputs = inputs


class _BoundResponse:
    __slots__ = ("offset", "output", "request")

    def __init__(self, request: _BoundRequest, offset: int, output: np.ndarray) -> None:
        self.request = request
        self.offset = offset
        self.output = output


def _ring(buf: memoryview, seq: int, value: int, sleeps: int) -> None:
    """Publish ``value``; a full barrier; look whether the peer sleeps (as shm.bell does)."""
    _SEQ.pack_into(buf, seq, value)
    _FENCE.acquire()
    _FENCE.release()
    if buf[sleeps]:  # the bound's two sides spin and never sleep: no wake-up to make
        raise AssertionError("a peer of the lane bound slept")


def _bound_worker(buf: memoryview, n: int) -> None:
    """The worker's least per request: wait, unpack the record, free the released output,
    one request object (its input view planned once), an output slot from a free list, the
    64 B copied, one response object, the response record packed and rung."""
    load, unpack, pack = _SEQ.unpack_from, _BOUND_REQ.unpack_from, _BOUND_RESP.pack_into
    free = list(range(OUTPUTS_AT, OUTPUTS_AT + 64 * OUTPUT_SLOTS, 64))
    outputs = {at: np.frombuffer(buf, np.uint8, 64, at) for at in free}
    planned: dict[tuple[int, int], np.ndarray] = {}
    for i in range(1, n + 1):
        while load(buf, REQ_SEQ)[0] != i:
            pass
        request_id, _sent, at, nbytes, released = unpack(buf, REQ_AT)
        if released >= 0:
            free.append(released)
        view = planned.get((at, nbytes))
        if view is None:
            view = planned[(at, nbytes)] = np.frombuffer(buf, np.uint8, nbytes, at)
        request = _BoundRequest(request_id, {"INPUT0": view})
        offset = free.pop()
        response = _BoundResponse(request, offset, outputs[offset])
        np.copyto(response.output, request.inputs["INPUT0"])
        pack(buf, RESP_AT, request.id, 0, response.offset, nbytes)
        _ring(buf, RESP_SEQ, i, CLIENT_SLEEPS)


def _bound_client(buf: memoryview, n: int) -> list[float]:
    """The client's least per request: the input written into its slot, the request record
    packed and rung, the response record unpacked, the output viewed (leased until the
    next request, which carries its release)."""
    load, pack, unpack = _SEQ.unpack_from, _BOUND_REQ.pack_into, _BOUND_RESP.unpack_from
    payload = np.full(64, 7, np.uint8)
    slot = np.frombuffer(buf, np.uint8, 64, INPUT_AT)
    held, lat = -1, []
    for i in range(1, n + 1):
        t = time.perf_counter()
        np.copyto(slot, payload)
        pack(buf, REQ_AT, i, time.monotonic_ns(), INPUT_AT, 64, held)
        _ring(buf, REQ_SEQ, i, WORKER_SLEEPS)
        while load(buf, RESP_SEQ)[0] != i:
            pass
        request_id, status, offset, nbytes = unpack(buf, RESP_AT)
        if request_id != i or status:
            raise AssertionError(f"the bound answered {request_id} (status {status}) to {i}")
        out = np.frombuffer(buf, np.uint8, nbytes, offset)
        held = offset
        lat.append(time.perf_counter() - t)
        del out
    return lat


def _plain_client(kind: str, buf: memoryview, sems: list[Any], n: int) -> list[float]:
    """The client's side of the spin hand-off or the semaphore ping-pong."""
    out = np.frombuffer(buf, np.uint8, 64, 128)
    payload = np.full(64, 7, np.uint8)
    load, store = _SEQ.unpack_from, _SEQ.pack_into
    lat = []
    for i in range(1, n + 1):
        t = time.perf_counter()
        np.copyto(out, payload)
        if kind == "spin":
            store(buf, 0, i)
            while load(buf, 64)[0] != i:
                pass
        else:
            sems[0].release()
            sems[1].acquire()
        lat.append(time.perf_counter() - t)
    return lat


def floor(kind: str, client_cpu: int, peer_cpu: int, n: int) -> dict[str, float]:
    """p50/p99 (us) of ``n`` round trips between this process on ``client_cpu`` and a peer
    on ``peer_cpu``: ``kind`` "spin" (both spin on a sequence word), "sem" (semaphores) or
    "bound" (the lane bound: both spin, each side does the least a lane must)."""
    pin(client_cpu)
    name = f"ipb-{os.getpid()}-floor"
    region = Region.create(name, 4096)
    sems = []
    if kind == "sem":
        sems = [posix_ipc.Semaphore(f"/{name}-{s}", posix_ipc.O_CREX) for s in "ab"]
    peer = mp.get_context("spawn").Process(target=_floor_peer, args=(kind, name, peer_cpu, n))
    try:
        peer.start()
        buf = region.buf
        time.sleep(0.5)  # the peer is up and waiting
        lat = _bound_client(buf, n) if kind == "bound" else _plain_client(kind, buf, sems, n)
        peer.join(30)
    finally:
        if peer.is_alive():
            peer.kill()
        for sem in sems:
            sem.unlink()
            sem.close()
        region.destroy()
    us = np.array(lat[len(lat) // 10 :]) * 1e6  # the first tenth warms up
    return {"p50_us": float(np.percentile(us, 50)), "p99_us": float(np.percentile(us, 99))}


def floors(layout: dict[str, int], quick: bool) -> dict[str, dict[str, float]]:
    """The floors and the lane bound in ``layout`` (the client's core and the worker's)."""
    client, worker = layout["client"], layout["worker"]
    same = client == worker
    spin_n = 60 if same else (5000 if quick else 20000)  # on one core a spin waits a tick
    sem_n = 2000 if quick else 10000
    return {
        "spin": floor("spin", client, worker, spin_n),
        "bound": floor("bound", client, worker, spin_n),
        "sem": floor("sem", client, worker, sem_n),
    }


# ---------------------------------------------------------------------------- lanes
def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _idle(endpoint: str, cpu: int, seconds: float, out: Any) -> None:
    pin(cpu)
    with ShmClient(endpoint, timeout=60, lane=True) as c:
        req = c.request(LANE_MODEL, outputs=["OUTPUT0"])
        req.input("INPUT0", (64,), np.uint8)[:] = 1
        for _ in range(200):
            with c.run(req):
                pass
        [lane] = c.session.lanes.lanes.values()
        me, worker = os.getpid(), lane.worker_pid
        time.sleep(0.5)  # past the spins and the statistics' flush
        before = cpu_seconds(me), cpu_seconds(worker)
        t = time.monotonic()
        time.sleep(seconds)
        wall = time.monotonic() - t
        after = cpu_seconds(me), cpu_seconds(worker)
    out.put(
        {
            "client_pct": 100 * (after[0] - before[0]) / wall,
            "worker_pct": 100 * (after[1] - before[1]) / wall,
        }
    )


def idle_lane(endpoint: str, cpu: int, seconds: float = IDLE_S) -> dict[str, float]:
    """Percent of a core an open, idle lane costs its client and its worker."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_idle, args=(endpoint, cpu, seconds, out))
    proc.start()
    result: dict[str, float] = out.get(timeout=seconds + 120)
    proc.join(30)
    return result
