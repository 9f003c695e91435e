"""Serving lanes: a client's requests straight from shared memory, no broker on the path.

The broker opens a lane (``LaneOpen``) and closes it (``LaneClose``); the worker's main
thread passes both here.  Each lane is served by a thread of its own, which waits on the
lane's request ring (``shm.bell``: a bounded spin when the client runs on another core, then
a futex), checks each request against the model's inputs and against the client's own
region (the only memory a lane may read inputs from), and executes it on the instance under
the worker's execute lock, with the same Request and Response objects as a broker batch.
Responses go into the lane's response ring; outputs stay in the worker's output region as
leases of the lane, freed when the client releases them or when the lane closes.

What the lanes served is folded and sent to the broker as ``LaneStats`` (at most every
``FLUSH_S``, and when a lane goes quiet), so the broker's statistics count it.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any

from inferpool.backends.api import Request, RequestedOutput, Response, batch_size_of
from inferpool.backends.host import BackendHost
from inferpool.backends.reshape import output_reshapes
from inferpool.shm.bell import apart, bells
from inferpool.shm.region import Region
from inferpool.wire import lane as wl
from inferpool.wire.contract import (
    TensorSpec,
    check_byte_size,
    check_input,
    check_required,
    tensor_spec,
)
from inferpool.wire.errors import Code, InferpoolError, internal, invalid_arg, not_found
from inferpool.wire.worker.link import Link
from inferpool.wire.worker.messages import LaneClosed, LaneOpen, Slot, TensorRef
from inferpool.workers.calls import HoldingThread
from inferpool.workers.lane_stats import Tally
from inferpool.workers.memory import WorkerMemory, host_input, wanted_outputs

log = logging.getLogger("inferpool.worker")
Plan = tuple[list[tuple[TensorRef, "tuple[int, ...] | None"]], dict[str, RequestedOutput]]
SLICE_S = 1.0  # the longest sleep: a lane thread looks at its lane at least this often
FLUSH_S = 0.05  # statistics reach the broker at most this long after a lane goes quiet
PLANS = 16  # request bodies a lane remembers as checked
SWITCH_S = 0.001  # the GIL's switch interval while lanes are open (a busy lane thread
# must let the main thread read the channel soon)


class Contract:
    """The model's tensors as a lane names them: by their index in the configuration."""

    def __init__(self, config: Any, reshapes: dict[str, tuple[int, ...]]) -> None:
        self.model = config.name
        self.max_batch_size = int(config.max_batch_size)
        self.batched = self.max_batch_size > 0
        self.inputs: list[TensorSpec] = [tensor_spec(t, t.optional) for t in config.input]
        self.outputs = [t.name for t in config.output]
        self.required = frozenset(s.name for s in self.inputs if not s.optional)
        self.reshapes = reshapes
        self.all_outputs = {name: RequestedOutput(name) for name in self.outputs}
        self.output_index = {name: i for i, name in enumerate(self.outputs)}
        self.output_reshapes = output_reshapes(config)  # the client sees the config's dims


class Lanes:
    """The worker's lanes, opened and closed by its main thread."""

    def __init__(
        self,
        host: BackendHost,
        memory: WorkerMemory,
        link: Link[Any],
        execute_lock: threading.Lock,
        reshapes: dict[str, tuple[int, ...]],
    ) -> None:
        self.host = host
        self.memory = memory
        self.link = link
        self.execute_lock = execute_lock
        self.reshapes = reshapes
        self.tally = Tally()
        self.spinner = threading.Lock()  # one lane thread spins at a time
        self._servers: dict[int, LaneServer] = {}
        self._lock = threading.Lock()
        self._contract: Contract | None = None
        self._switch = sys.getswitchinterval()

    @property
    def contract(self) -> Contract:
        if self._contract is None:
            self._contract = Contract(self.host.config, self.reshapes)
        return self._contract

    def open(self, msg: LaneOpen) -> None:
        try:
            server = LaneServer(self, msg)
        except (InferpoolError, OSError, ValueError) as exc:
            err = InferpoolError.wrap(exc, Code.UNAVAILABLE, f"lane {msg.lane}: ")
            log.error("%s", err.message)
            self.link.send(LaneClosed(msg.lane, err.to_wire()))
            return
        with self._lock:
            self._servers[msg.lane] = server
            sys.setswitchinterval(min(self._switch, SWITCH_S))
        server.start()

    def close(self, lane: int, free: bool) -> None:
        with self._lock:
            server = self._servers.get(lane)
        if server is not None:
            server.close(free)

    def close_all(self, timeout: float = 5.0) -> None:
        """Stop serving every lane (the worker is stopping): each answers what it claimed."""
        with self._lock:
            servers = list(self._servers.values())
        for server in servers:
            server.close(free=False)  # the outputs go with the worker
        deadline = time.monotonic() + timeout
        for server in servers:
            server.join(max(0.0, deadline - time.monotonic()))

    def closed(self, lane: int, error: InferpoolError | None) -> None:
        """A lane thread's last word."""
        with self._lock:
            self._servers.pop(lane, None)
            if not self._servers:
                sys.setswitchinterval(self._switch)
        self.flush()
        self._send(LaneClosed(lane, error.to_wire() if error else None))

    def flush(self) -> None:
        stats = self.tally.take(self.host.stats.drain_metrics())
        if stats is not None:
            self._send(stats)

    def _send(self, msg: Any) -> None:
        try:
            self.link.send(msg)
        except OSError as exc:  # the broker is gone: the worker is on its way out too
            log.warning("lane message not sent: %s", exc)


class LaneServer(HoldingThread):
    """One lane: its thread claims the client's requests in order and answers each."""

    def __init__(self, lanes: Lanes, msg: LaneOpen) -> None:
        super().__init__(name=f"inferpool-lane-{msg.lane}", daemon=True)
        self.lanes = lanes
        self.lane = msg.lane
        self.contract = lanes.contract
        self.memory = lanes.memory
        self.output_region = self.memory.output.name
        self.region = Region.attach(msg.region, populate=True)
        try:
            buf = self.region.buf
            self.geometry, _, _ = wl.read_header(buf)
            if self.geometry.size > self.region.size:
                raise ValueError(f"lane region {msg.region!r} is smaller than its geometry")
            self.inputs = Region.attach(msg.inputs, readonly=True)
        except BaseException:
            self.region.close()
            raise
        self.header = header = wl.Header(buf)
        self.requests, self.responses = bells(buf, header.words, wl.BELLS)
        self.spin_ns = msg.spin_us * 1000 if msg.spin_us > 0 and apart(msg.client_pid) else 0
        self.leases: set[int] = set()  # output offsets the client holds
        self._closing = False
        self._free = True  # give back the client's outputs when the lane closes
        self._mapped = True
        self._map_lock = threading.Lock()
        self._current = (0, 0)  # (request number, client's id) being executed
        self._plans: dict[tuple[int, int, bytes], Plan] = {}
        self._ok = False

    # ------------------------------------------------------------------ from the main thread
    def close(self, free: bool) -> None:
        with self._map_lock:
            self._closing = True
            self._free = free
            if self._mapped:
                self.requests.wake()

    # ------------------------------------------------------------------ the lane's thread
    def run(self) -> None:
        error: InferpoolError | None = None
        try:
            self._serve()
        except Exception as exc:  # a bug here must not take the worker down
            log.exception("lane %d failed", self.lane)
            error = InferpoolError.wrap(exc, Code.INTERNAL, f"lane {self.lane} failed: ")
        finally:
            self._finish()
            self.lanes.closed(self.lane, error)

    def _serve(self) -> None:
        header = self.header
        lanes = self.lanes
        tally = lanes.tally
        execute_lock = lanes.execute_lock
        n = 0
        flush_at = 0.0
        while not self._closing and not header.revoked:
            spinning = (
                self.spin_ns and not execute_lock.locked() and lanes.spinner.acquire(blocking=False)
            )
            wait_s = SLICE_S if not tally.pending else max(0.0, flush_at - time.monotonic())
            try:
                head = self.requests.wait(n, self.spin_ns if spinning else 0, wait_s)
            finally:
                if spinning:
                    lanes.spinner.release()
            if head == n:
                if tally.pending and time.monotonic() >= flush_at:
                    lanes.flush()
                continue
            if (head - n) & 0xFFFFFFFF > self.geometry.slots:
                raise InferpoolError(
                    Code.INVALID_ARG,
                    f"the client posted more than {self.geometry.slots} requests "
                    f"(request {head} while the worker is at {n})",
                )
            self._serve_one(n)
            n = (n + 1) & 0xFFFFFFFF
            if not tally.pending:
                flush_at = time.monotonic() + FLUSH_S
            elif time.monotonic() >= flush_at:
                lanes.flush()
                flush_at = time.monotonic() + FLUSH_S

    def _serve_one(self, n: int) -> None:
        geometry = self.geometry
        claimed = time.monotonic_ns()
        try:
            req = wl.read_request(self.region.buf, geometry.request(n), geometry.slot_size)
        except ValueError as exc:  # nothing of it can be trusted: not even its id
            self.header[wl.REQ_DONE] = n + 1
            self._answer_error(n, 0, invalid_arg(f"malformed lane request: {exc}"), claimed)
            return
        self.header[wl.REQ_DONE] = n + 1  # claimed: it will be answered
        sent = req.sent_ns if 0 < req.sent_ns <= claimed else claimed
        try:
            if req.releases:
                self._release(req.releases)
            if req.flags & wl.FLAG_RELEASE_ONLY:
                self._write(n, req.id, (), None)
                return
            request = self._request(n, req)
        except InferpoolError as err:
            self._answer_error(n, req.id, err, sent)
            return
        host = self.lanes.host
        self._current = (n, req.id)
        self._ok = False
        with self.lanes.execute_lock:
            exec_start = time.monotonic_ns()
            host.execute([request])
            timing = host.timing_of(request)
            batches = host.take_batches()
        end = time.monotonic_ns()
        self.lanes.tally.add(
            self._ok,
            end - sent,
            claimed - sent,
            batch_size_of(request, self.contract.batched),
            timing.stamps.durations() if timing is not None else None,
            batches,
            exec_start,
            end,
        )

    def _request(self, n: int, req: wl.LaneRequest) -> Request:
        """The Request a backend sees (as on the broker path).  A client sends the same body
        over and over: it is checked once, and its plan kept."""
        key = (req.n_inputs, req.n_outputs, req.body)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan(req)
            if len(self._plans) >= PLANS:
                self._plans.clear()
            self._plans[key] = plan
        refs, wanted = plan
        region = self.inputs
        return Request(
            id=str(req.id),
            inputs={ref.name: host_input(region, ref, reshape) for ref, reshape in refs},
            requested_outputs=wanted,
            memory=self.memory,
            emit=self._emit,
            handle=n,
        )

    def _plan(self, req: wl.LaneRequest) -> Plan:
        """Check a request body against the model and the client's region (INVALID_ARG in
        the broker's words): where its inputs are, which outputs it wants."""
        contract = self.contract
        model = contract.model
        specs = contract.inputs
        try:
            tensors, outputs = wl.parse_body(req.body, req.n_inputs, req.n_outputs)
        except ValueError as exc:
            raise invalid_arg(f"malformed lane request: {exc}") from None
        refs: list[tuple[TensorRef, tuple[int, ...] | None]] = []
        seen: set[str] = set()
        batch = 0
        for t in tensors:
            spec = specs[t.position] if t.position < len(specs) else None
            if spec is None:
                raise invalid_arg(f"unexpected inference input {t.position} for model '{model}'")
            name = spec.name
            if name in seen:
                raise invalid_arg(f"input '{name}' is given more than once for model '{model}'")
            seen.add(name)
            datatype = wl.DATATYPE_NAMES.get(t.datatype, str(t.datatype))
            batch, expected = check_input(
                model, spec, datatype, t.shape, contract.max_batch_size, batch
            )
            check_byte_size(model, name, expected, t.byte_size)
            reshape = contract.reshapes.get(name)
            if reshape is not None and contract.max_batch_size > 0:
                reshape = (t.shape[0], *reshape)
            ref = TensorRef(name, datatype, t.shape, self.inputs.name, t.offset, t.byte_size)
            host_input(self.inputs, ref, reshape)  # inside the client's region, or INVALID_ARG
            refs.append((ref, reshape))
        check_required(model, contract.required, seen)
        if not outputs:
            return refs, contract.all_outputs
        names = contract.outputs
        if any(i >= len(names) for i in outputs):
            raise invalid_arg(f"unexpected inference output index for model '{model}'")
        return refs, {names[i]: RequestedOutput(names[i]) for i in outputs}

    def _release(self, tokens: list[int]) -> None:
        """Free the outputs the client is done with; NOT_FOUND for a token it does not hold
        (the others are freed)."""
        leases = self.leases
        mine = [t for t in tokens if t in leases]
        leases.difference_update(mine)
        self.memory.free([Slot(self.output_region, t) for t in mine])
        if len(mine) != len(tokens):
            bad = [t for t in tokens if t not in mine]
            raise not_found(
                f"{len(bad)} lease(s) not held on this lane: {bad[:5]} (released already or "
                f"never granted); {len(mine)} other lease(s) were released"
            )

    def _emit(self, request: Request, response: Response | None, final: bool) -> None:
        """The backend's answer to the request in execution, into the response ring."""
        n, request_id = self._current
        if response is not None and response.error is not None:
            response.discard()
            self._ok = False
            self._write_error(n, request_id, response.error)
            return
        outputs = []
        contract = self.contract
        if response is not None:
            wanted = wanted_outputs(
                self.memory, request, response, contract.output_reshapes, contract.batched
            )
            index, datatypes = contract.output_index, wl.DATATYPES
            outputs = [
                wl.Tensor(
                    index[out.name], datatypes[out.datatype], out.offset, out.byte_size, shape
                )
                for out, shape in wanted
            ]
        try:
            self._write(n, request_id, outputs, response.parameters if response else None)
        except ValueError as exc:
            for t in outputs:
                self.memory.release(self.output_region, t.offset)
            self._ok = False
            self._write_error(n, request_id, internal(f"response too large for the lane: {exc}"))
            return
        self.leases.update(t.offset for t in outputs)
        self._ok = True

    def _write(self, n: int, request_id: int, outputs: Any, parameters: Any) -> None:
        at = self.geometry.response(n)
        wl.write_response(
            self.region.buf, at, self.geometry.slot_size, request_id, outputs, parameters
        )
        self.responses.ring(n + 1)

    def _write_error(self, n: int, request_id: int, err: InferpoolError) -> None:
        at = self.geometry.response(n)
        status = wl.STATUS.get(err.code.value, wl.STATUS["UNKNOWN"])
        message = err.message.encode()[: self.geometry.slot_size - 64].decode(errors="ignore")
        wl.write_response(
            self.region.buf, at, self.geometry.slot_size, request_id, (), None, status, message
        )
        self.responses.ring(n + 1)

    def _answer_error(self, n: int, request_id: int, err: InferpoolError, sent: int) -> None:
        self._write_error(n, request_id, err)
        self.lanes.tally.fail_one(time.monotonic_ns() - sent)

    def _finish(self) -> None:
        """Claim nothing more, say so, give back the outputs the client held (unless told
        they stay: this worker is retiring and they go with it)."""
        self.header[wl.WORKER_CLOSED] = 1
        self.responses.wake()
        if self._free:
            self.memory.free([Slot(self.output_region, t) for t in self.leases])
        self.leases.clear()
        with self._map_lock:
            self._mapped = False
            self.header.release()
            self.region.close()
            self.inputs.close()
