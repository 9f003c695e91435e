"""Triton's clients in scripts/bench_latency.py's kserve rows, their floors, and the CPU
each process spends per request.

- :func:`kserve_client`: tritonclient.http or tritonclient.grpc, binary tensors both ways;
- :func:`triton_shm_client`: the same clients with Triton's system shared-memory extension:
  an input and an output region made with tritonclient's own helpers, registered through
  the frontend, the input written once, the output read in place (as ShmClient does);
- the echoes: the same client code against servers that do nothing but answer with the
  input (:func:`echo_servers`: a raw asyncio HTTP echo and a grpc.aio echo): at 64 B what
  tritonclient and the least server cost; at large sizes the echoes' own buffering weighs;
- :func:`bulk_http`: a tritonclient.http process sending 64 MiB requests meanwhile, to
  measure the zmq clients beside the frontends' large traffic;
- :func:`cpu_seconds` of :func:`server_processes`: the CPU time the broker, the frontends'
  process and the workers spend per request; each client says its own (``cpu_s``).  On one
  core the latency is at least their sum.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import orjson
import psutil

_HEADER = b"inference-header-content-length:"


def _pin(cpu: int) -> None:
    cpus = sorted(os.sched_getaffinity(0) | set(range(os.cpu_count() or 1)))
    os.sched_setaffinity(0, {cpu if cpu in cpus else cpus[0]})


def timed(once: Callable[[], None], iterations: int, start: Any, out: Any) -> None:
    """Warm up, wait at ``start`` with the other clients, time ``iterations`` calls of
    ``once``; put (start, end, latencies, {"cpu_s": this process's CPU}) on ``out``."""
    for _ in range(max(25, iterations // 10)):  # as bench_latency.warmups
        once()
    start.wait()
    lat = []
    cpu = time.process_time()
    t0 = time.perf_counter()
    for _ in range(iterations):
        t = time.perf_counter()
        once()
        lat.append(time.perf_counter() - t)
    out.put((t0, time.perf_counter(), lat, {"cpu_s": time.process_time() - cpu}))


def _module(protocol: str) -> Any:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    return httpclient if protocol == "http" else grpcclient


def kserve_client(
    protocol: str,
    endpoint: str,
    nbytes: int,
    iterations: int,
    cpu: int,
    start: Any,
    out: Any,
) -> None:
    """tritonclient.http or tritonclient.grpc, binary tensors both ways (their defaults)."""
    _pin(cpu)
    tc = _module(protocol)
    x = np.frombuffer(np.random.bytes(nbytes), dtype=np.uint8).reshape(1, nbytes)
    client = tc.InferenceServerClient(endpoint)
    inp = tc.InferInput("INPUT0", [1, nbytes], "UINT8")
    inp.set_data_from_numpy(x)
    wanted = [tc.InferRequestedOutput("OUTPUT0")]

    def once() -> None:
        client.infer("bench", [inp], outputs=wanted).as_numpy("OUTPUT0")

    timed(once, iterations, start, out)
    client.close()


def triton_shm_client(
    protocol: str,
    endpoint: str,
    nbytes: int,
    iterations: int,
    cpu: int,
    start: Any,
    out: Any,
) -> None:
    """Triton's system shared-memory extension through ``protocol``'s frontend: regions
    made with tritonclient.utils.shared_memory, the input written once, the output read in
    place (its last bytes checked against the input's)."""
    import tritonclient.utils.shared_memory as shm

    _pin(cpu)
    tc = _module(protocol)
    client = tc.InferenceServerClient(endpoint)
    tag = f"ipb{os.getpid()}"
    regions = {
        side: shm.create_shared_memory_region(f"{tag}{side}", f"/{tag}{side}", nbytes)
        for side in ("in", "out")
    }
    try:
        x = np.arange(nbytes, dtype=np.uint64).astype(np.uint8).reshape(1, nbytes)
        shm.set_shared_memory_region(regions["in"], [x])
        for side in regions:
            client.register_system_shared_memory(f"{tag}{side}", f"/{tag}{side}", nbytes)
        inp = tc.InferInput("INPUT0", [1, nbytes], "UINT8")
        inp.set_shared_memory(f"{tag}in", nbytes)
        wanted = tc.InferRequestedOutput("OUTPUT0")
        wanted.set_shared_memory(f"{tag}out", nbytes)

        def once() -> None:
            client.infer("bench", [inp], outputs=[wanted])
            y = shm.get_contents_as_numpy(regions["out"], np.uint8, [1, nbytes])
            if y[0, -1] != x[0, -1]:
                raise SystemExit("Triton shm client: the output differs from the input")

        timed(once, iterations, start, out)
        client.unregister_system_shared_memory()
    finally:
        for region in regions.values():
            shm.destroy_shared_memory_region(region)
        client.close()


def _bulk_http(endpoint: str, nbytes: int, cpu: int, stop: Any) -> None:
    """tritonclient.http sending ``nbytes`` requests back to back until ``stop`` is set."""
    _pin(cpu)
    tc = _module("http")
    client = tc.InferenceServerClient(endpoint, connection_timeout=600, network_timeout=600)
    x = np.frombuffer(np.random.bytes(nbytes), dtype=np.uint8).reshape(1, nbytes)
    inp = tc.InferInput("INPUT0", [1, nbytes], "UINT8")
    inp.set_data_from_numpy(x)
    while not stop.is_set():
        client.infer("bench", [inp]).as_numpy("OUTPUT0")
    client.close()


@contextmanager
def bulk_http(endpoint: str, nbytes: int, cpu: int) -> Iterator[None]:
    """A tritonclient.http process sending ``nbytes`` requests meanwhile (the KServe side's
    large traffic, beside which the zmq clients are measured)."""
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    proc = ctx.Process(target=_bulk_http, args=(endpoint, nbytes, cpu, stop), daemon=True)
    proc.start()
    time.sleep(3.0)  # its first requests are under way
    try:
        yield
    finally:
        stop.set()
        proc.join(120)
        if proc.is_alive():
            proc.kill()


# ============================================================================ the floors
class _Echo(asyncio.Protocol):
    """Answers each binary-tensor inference request with its own tensor, doing nothing
    else: the least an HTTP server can do for tritonclient."""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.buf = bytearray()
        self.need: tuple[int, int] | None = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            if self.need is None:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                length = head = 0
                for line in bytes(self.buf[:end]).lower().split(b"\r\n"):
                    if line.startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                    elif line.startswith(_HEADER):
                        head = int(line[len(_HEADER) :])
                del self.buf[: end + 4]
                self.need = (length, head)
            length, head = self.need
            if len(self.buf) < length:
                return
            body = memoryview(bytes(self.buf[:length]))
            del self.buf[:length]
            self.need = None
            n = length - head
            reply = orjson.dumps(
                {
                    "model_name": "bench",
                    "model_version": "1",
                    "outputs": [
                        {
                            "name": "OUTPUT0",
                            "datatype": "UINT8",
                            "shape": [1, n],
                            "parameters": {"binary_data_size": n},
                        }
                    ],
                }
            )
            self.transport.writelines(
                [
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                    + f"Inference-Header-Content-Length: {len(reply)}\r\n".encode()
                    + f"Content-Length: {len(reply) + n}\r\n\r\n".encode(),
                    reply,
                    body[head:],
                ]
            )


def _http_echo(port: int, cpu: int, ready: Any) -> None:
    _pin(cpu)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(loop.create_server(_Echo, "127.0.0.1", port))
    ready.set()
    loop.run_forever()


def _grpc_echo(port: int, cpu: int, ready: Any) -> None:
    _pin(cpu)
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc.service_pb2_grpc import (
        GRPCInferenceServiceServicer,
        add_GRPCInferenceServiceServicer_to_server,
    )

    class Echo(GRPCInferenceServiceServicer):
        async def ModelInfer(self, request: Any, context: Any) -> Any:
            response = pb.ModelInferResponse(model_name="bench", model_version="1")
            shape = list(request.inputs[0].shape)
            response.outputs.add(name="OUTPUT0", datatype="UINT8", shape=shape)
            response.raw_output_contents.append(request.raw_input_contents[0])
            return response

    async def serve() -> None:
        unlimited = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        server = grpc.aio.server(options=unlimited)
        add_GRPCInferenceServiceServicer_to_server(Echo(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        ready.set()
        await server.wait_for_termination()

    asyncio.run(serve())


@contextmanager
def echo_servers(cpu: int) -> Iterator[dict[str, str]]:
    """The two echo servers, pinned to ``cpu`` (the broker's): their endpoints by protocol."""
    ctx = mp.get_context("spawn")
    procs = []
    endpoints = {}
    for protocol, target in (("http", _http_echo), ("grpc", _grpc_echo)):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ready = ctx.Event()
        proc = ctx.Process(target=target, args=(port, cpu, ready), daemon=True)
        proc.start()
        if not ready.wait(60):
            raise SystemExit(f"the {protocol} echo server did not start")
        procs.append(proc)
        endpoints[protocol] = f"127.0.0.1:{port}"
    try:
        yield endpoints
    finally:
        for proc in procs:
            proc.kill()
            proc.join()


# ============================================================================ CPU per request
def server_processes(server_pid: int) -> dict[str, list[int]]:
    """The server's processes: the broker, the KServe frontends' and the rest (workers and
    their zygotes)."""
    children = psutil.Process(server_pid).children(recursive=True)
    frontends = [c.pid for c in children if "inferpool.broker.kserve.frontends" in c.cmdline()]
    rest = [c.pid for c in children if c.pid not in frontends]
    return {"broker": [server_pid], "frontends": frontends, "workers": rest}


def cpu_seconds(processes: dict[str, list[int]]) -> dict[str, float]:
    """The CPU time (user and system) each group of processes has spent so far."""
    spent = {}
    for group, pids in processes.items():
        total = 0.0
        for pid in pids:
            try:
                times = psutil.Process(pid).cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        spent[group] = total
    return spent
