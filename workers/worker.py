"""The worker loop: receive batches from the broker, run the backend, send results back.

Messages are JSON datagrams on this worker's SOCK_SEQPACKET socketpair with the broker
(inherited as ``spec.channel_fd``; the broker's internal protocol):

broker -> worker   {"op": "execute", "requests": [...], "free": [...], "unmap": [...]},
                   {"op": "free", "free": [...], "unmap": [...]}, {"op": "stop"}
worker -> broker   {"op": "ready", "placement": {...}, "config": {...}} (the config as the backend
                   completed it, protobuf JSON), {"op": "failed", "error": {...}},
                   {"op": "items", "items": [...]}            (decoupled, mid-batch)
                   {"op": "unmapped", "refs": [...]}          (mappings of ``unmap`` closed)
                   {"op": "done", "items": [...], "stats": ..., "metrics": ...}

A result item is {"rid", "final", "outputs": [[name, datatype, shape, region, offset,
nbytes]], "params", "error", "t": [compute_input, compute_infer, compute_output] ns}.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
from typing import Any

import orjson

from inferpool.backends.api import Request, RequestedOutput, Response, batch_size_of, now_ns
from inferpool.wire.errors import InferpoolError
from inferpool.workers.gpu_limit import check_load_limit
from inferpool.workers.host import BackendHost
from inferpool.workers.memory import WorkerMemory
from inferpool.workers.pinning import cuda_ordinal, read_back
from inferpool.workers.sequence_state import SequenceStates
from inferpool.workers.spec import EXIT_BOOT_FAILED, EXIT_OK, WorkerSpec

log = logging.getLogger("inferpool.worker")
MAX_MESSAGE = 192 * 1024  # the broker's channel limit (broker/pool/channel.py)


class Worker:
    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.sock = socket.socket(fileno=spec.channel_fd)
        self._buf = bytearray(MAX_MESSAGE)
        # responses emitted from backend threads wake the loop through this pipe
        self._wake_rx, self._wake_tx = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wake_lock = threading.Lock()
        self._items: list[dict[str, Any]] = []  # results of the batch in execution
        self._item_requests: list[Request | None] = []  # their requests, for statistics
        self._async_items: list[dict[str, Any]] = []
        self._in_execute = False
        self._main_thread = threading.get_ident()
        self.memory = WorkerMemory(spec.output_region, spec.instance.name)
        self.host = BackendHost(
            backend_name=spec.backend,
            model_name=spec.model_name,
            model_version=spec.model_version,
            config_json=spec.config_json,
            repository_path=spec.repository_path,
            artifact_path=spec.artifact_path,
            instance={  # backends get the CUDA ordinal: a GPU worker sees only its device
                **vars(spec.instance),
                "cuda_ordinal": cuda_ordinal(
                    spec.instance.device_id, spec.pinning.cuda_visible_devices
                ),
            },
            backend_directory=spec.backend_directory,
            backend_config=spec.backend_config,
        )
        self.decoupled = False  # the rest is known once the model has completed its config
        self.batching = False
        self.reshapes: dict[str, tuple[int, ...]] = {}
        self.states: SequenceStates | None = None  # sequence state, if the model keeps any

    def send(self, msg: dict[str, Any]) -> None:
        self.sock.send(orjson.dumps(msg))

    def recv(self) -> dict[str, Any] | None:
        """The broker's next message; None when the broker is gone (its end closed)."""
        n = self.sock.recv_into(self._buf)
        return orjson.loads(memoryview(self._buf)[:n]) if n else None

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> int:
        spec = self.spec
        try:
            self.host.load()
            check_load_limit(  # after the load, as Triton: the limit holds for what it took
                spec.model_name,
                spec.instance.device_id,
                cuda_ordinal(spec.instance.device_id, spec.pinning.cuda_visible_devices),
                spec.gpu_load_limit,
            )
        except InferpoolError as err:
            self.host.close()
            log.error("%s", err)
            self.send({"op": "failed", "error": err.to_wire()})
            return EXIT_BOOT_FAILED
        self._configure()
        # the broker serves the config as the backend completed it (auto-complete)
        self.send({"op": "ready", "placement": read_back(), "config": self.host.config_dict()})
        try:
            self._loop()
        finally:
            self.host.close()
            self.memory.close()
        return EXIT_OK

    def _configure(self) -> None:
        """Read the loaded model's config: Model.set_config() may have completed it."""
        cfg = self.host.config
        self.decoupled = self.host.decoupled
        self.batching = cfg.max_batch_size > 0
        self.reshapes = {t.name: tuple(t.reshape.shape) for t in cfg.input if t.HasField("reshape")}
        self.states = SequenceStates.of(cfg, self.memory)

    def _loop(self) -> None:
        """One message at a time.  A decoupled model's backend threads may answer between
        messages, so only then is the wake pipe polled beside the socket."""
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        poller.register(self._wake_rx, select.POLLIN)
        sock_fd = self.sock.fileno()
        watch_threads = self.decoupled
        while True:
            if watch_threads:
                events = dict(poller.poll())
                if self._wake_rx in events:
                    self._flush_async()
                if sock_fd not in events:
                    continue
            msg = self.recv()
            if msg is None:
                log.error("the broker closed the channel; exiting")
                return
            frees = msg.get("free")
            if frees:
                self.memory.free(frees)
            unmaps = msg.get("unmap")
            if unmaps:
                self.memory.unmap(unmaps)
                self.send({"op": "unmapped", "refs": unmaps})  # a CUDA unregister waits for it
            op = msg.get("op")
            if op == "execute":
                self._execute(msg["requests"])
                if self._async_items:
                    self._flush_async()
            elif op == "stop":
                return

    # ------------------------------------------------------------------ execution
    def _execute(self, batch: list[dict[str, Any]]) -> None:
        exec_start = now_ns()
        if self.states is not None:
            self.states.begin(batch)
        requests: list[Request] = []
        for work in batch:
            try:
                request = self._request(work)
            except InferpoolError as err:
                self._items.append({"rid": work["rid"], "final": True, "error": err.to_wire()})
                self._item_requests.append(None)
                continue
            requests.append(request)
        compute_start = now_ns()
        self._in_execute = True
        try:
            if requests:
                self.host.execute(requests)
        finally:
            self._in_execute = False
        compute_end = now_ns()
        host = self.host
        batch_timing = [compute_start - exec_start, compute_end - compute_start, 0]
        timings = host.stats.timings
        for item, owner in zip(self._items, self._item_requests, strict=True):
            timing = timings.pop(id(owner), None) if owner is not None else None
            item["t"] = (
                batch_timing
                if timing is None
                else [
                    timing.compute_start - timing.exec_start,
                    timing.compute_end - timing.compute_start,
                    timing.exec_end - timing.compute_end,
                ]
            )
        self._item_requests = []
        batches = host.take_batches()
        if batches:
            stats = [[b[0], b[2] - b[1], b[3] - b[2], b[4] - b[3]] for b in batches]
        else:
            size = sum(batch_size_of(r, self.batching) for r in requests) or len(batch)
            stats = [[size, *batch_timing]]
        msg: dict[str, Any] = {"op": "done", "items": self._items, "stats": stats}
        metrics = host.stats.drain_metrics()
        if metrics:
            msg["metrics"] = metrics
        self._items = []
        self.send(msg)

    def _request(self, work: dict[str, Any]) -> Request:
        reshapes = self.reshapes
        inputs = {}
        for spec in work["inputs"]:
            reshape = reshapes.get(spec[0])
            if reshape is not None and self.batching:
                reshape = (spec[2][0], *reshape)
            tensor = self.memory.input_tensor(spec, reshape)
            inputs[tensor.name] = tensor
        if self.states is not None:
            self.states.feed(work, inputs)
        return Request(
            id=work["id"],
            inputs=inputs,
            requested_outputs={
                name: RequestedOutput(name, target) for name, target in work["outputs"]
            },
            memory=self.memory,
            emit=self._emit,
            correlation_id=work.get("corr", 0),
            flags=work.get("flags", 0),
            parameters=work.get("params"),
            decoupled=self.decoupled,
            handle=work["rid"],
        )

    def _emit(self, request: Request, response: Response | None, final: bool) -> None:
        """Called by ResponseSender: turn a response into a result item for the broker."""
        item = self._item(request, response, final)
        if threading.get_ident() == self._main_thread and self._in_execute:
            if self.decoupled:
                self.send({"op": "items", "items": [item]})
            else:
                self._items.append(item)
                self._item_requests.append(request)
            return
        with self._wake_lock:
            self._async_items.append(item)
        with contextlib.suppress(BlockingIOError):  # a full pipe already means "wake up"
            os.write(self._wake_tx, b"!")

    def _item(self, request: Request, response: Response | None, final: bool) -> dict[str, Any]:
        item: dict[str, Any] = {"rid": request.handle, "final": final}
        if self.states is not None:
            self.states.keep(request, response, final)
        if response is None:
            item["outputs"] = []
            return item
        if response.error is not None:
            response.discard()
            item["error"] = response.error.to_wire()
            return item
        outputs = []
        for name, out in response.outputs.items():
            if name not in request.requested_outputs:
                self.memory.release(out.region, out.offset)
                continue
            outputs.append(
                [name, out.datatype, list(out.shape), out.region, out.offset, out.byte_size]
            )
        item["outputs"] = outputs
        if response.parameters:
            item["params"] = response.parameters
        return item

    def _flush_async(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_rx, 4096):
                pass
        with self._wake_lock:
            items, self._async_items = self._async_items, []
        if items:
            self.send({"op": "items", "items": items})
