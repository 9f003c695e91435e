"""Serving lanes: a client's requests straight from shared memory, no broker on the path.

The broker opens a lane (``LaneOpen``) and closes it (``LaneClose``); the worker's main
thread passes both here.  Each lane is served by a thread of its own, which waits on the
lane's request ring (``shm.bell``: a bounded spin while the client's waiting thread, as the
lane's header says, runs on a core apart from the worker's, then a futex), checks each
request against the model's inputs and against the client's own region (the only memory a
lane may read inputs from; ``workers.lane_bodies``, once per distinct body), and executes it
on the instance under the worker's execute lock, with the same Request and Response objects
as a broker batch.  Responses go into the lane's response ring; outputs stay in the
worker's output region as leases of the lane, freed when the client releases them or when
the lane closes.

What the lanes served is folded and sent to the broker as ``LaneStats`` (at most every
``FLUSH_NS``, and when a lane goes quiet), so the broker's statistics count it.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import time
from typing import Any

from inferpool.backends.api import Request, Response, batch_size_of
from inferpool.backends.host import BackendHost
from inferpool.shm.bell import bells
from inferpool.shm.region import Region
from inferpool.wire import lane_records as lr
from inferpool.wire import lane_region as wl
from inferpool.wire import lane_responses as lresp
from inferpool.wire.errors import Code, InferpoolError, internal, invalid_arg, not_found
from inferpool.wire.worker.link import Link
from inferpool.wire.worker.protocol import LaneClosed, LaneOpen
from inferpool.workers.call_link import HoldingThread
from inferpool.workers.lane_after import Siblings, Waker, wait_after
from inferpool.workers.lane_bodies import Contract, Plans
from inferpool.workers.lane_stats import Tally
from inferpool.workers.memory import WorkerMemory, wanted_outputs

log = logging.getLogger("inferpool.worker")
SLICE_S = 1.0  # the longest sleep: a lane thread looks at its lane at least this often
FLUSH_NS = 50_000_000  # statistics reach the broker at most this long after a lane goes quiet
MASK = 0xFFFFFFFF
_now = time.monotonic_ns
REQ_DONE = wl.REQ_DONE >> 2  # the word the worker counts claimed requests in
HELD_KIB = wl.HELD_KIB >> 2  # the broker's: what the client's principal holds (KiB)
CLIENT_APART = wl.CLIENT_APART >> 2  # the client says its thread runs apart from the worker
SWITCH_S = 0.001  # the GIL's switch interval while lanes are open (a busy lane thread
# must let the main thread read the channel soon)


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
        except Exception as exc:  # a region gone or shrunk, a bad field: the lane's, not ours
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
            server.close(free=False)  # the client's leases now, freed when it releases them
        deadline = time.monotonic() + timeout
        for server in servers:
            server.join(max(0.0, deadline - time.monotonic()))

    def closed(
        self, lane: int, error: InferpoolError | None, kept: tuple[tuple[int, int], ...]
    ) -> None:
        """A lane thread's last word (``kept``: the outputs its client still holds)."""
        with self._lock:
            self._servers.pop(lane, None)
            if not self._servers:
                sys.setswitchinterval(self._switch)
        self.flush()
        self._send(LaneClosed(lane, error.to_wire() if error else None, kept))

    def flush(self) -> None:
        """Send what the lanes served, and the output bytes each lane's client holds where
        that changed (the broker counts them in the client's share)."""
        with self._lock:
            changed = [s for s in self._servers.values() if s.held != s.reported]
        held = []
        for server in changed:
            server.reported = server.held
            held.append((server.lane, server.reported))
        stats = self.tally.take(self.host.stats.drain_metrics(), held)
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
        self.region = Region.attach(msg.region, populate=True, watch=True)
        try:
            buf = self.region.buf
            try:
                self.geometry, header, self.request_at, self.response_at = wl.layout(
                    buf, self.region.size
                )
            except ValueError as exc:
                raise ValueError(f"lane region {msg.region!r}: {exc}") from None
            # read-only views and placed outputs; watched as the lane region is: the client
            # may shrink either, and a touch past the end would be SIGBUS
            self.inputs = Region.attach(msg.inputs, watch=True)
        except BaseException:
            self.region.close()
            raise
        self.header = header
        self.words = header.words
        self.raw = self.region.mapping  # slots are read and written through the mapping
        self.requests, self.responses = bells(buf, header.words, wl.BELLS)
        self.requests.shrunk = self.region.shrunk  # its client may shrink it while we sleep
        self._client_apart = functools.partial(self.words.__getitem__, CLIENT_APART)
        self.slots, self.slot_size = self.geometry.slots, self.geometry.slot_size
        self.reader = lr.RequestReader(self.raw, self.slot_size)
        self.writer = lresp.ResponseWriter(self.raw, self.slot_size)
        self.spin_ns = msg.spin_us * 1000 if msg.spin_us > 0 else 0
        self.part = msg.lane if msg.siblings else 0  # counted apart too: an ensemble's step
        self.leases: dict[int, int] = {}  # output offsets the client holds -> their bytes
        self.held = 0  # their bytes together
        self.reported = 0  # what the broker was told of them last
        self.share = msg.share or 1 << 62  # what the client may hold (its broker path too)
        self._closing = False
        self._free = True  # give back the client's outputs when the lane closes
        self._mapped = True
        self._map_lock = threading.Lock()
        self._current = (0, 0)  # (request number, client's id) being executed
        self.plans = Plans(self.contract, self.inputs, self.memory, self._emit, self._cancelled)
        self.siblings = Siblings(msg.siblings) if msg.siblings else None
        self.waker = Waker(self.responses)
        self._ring = self.waker.ring if msg.siblings else self.responses.ring  # answered
        self._timed = self.waker.timed if msg.siblings else None  # the times are reported
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
        except Exception as exc:
            shrunk = self._shrunk()
            if shrunk:  # its client's doing: the lane ends, the worker serves on
                log.warning("%s", shrunk)
                error = invalid_arg(shrunk)
            else:  # a bug here must not take the worker down
                log.exception("lane %d failed", self.lane)
                error = InferpoolError.wrap(exc, Code.INTERNAL, f"lane {self.lane} failed: ")
        finally:
            kept = self._finish()
            self.lanes.closed(self.lane, error, kept)

    def _serve(self) -> None:
        header = self.header
        lanes = self.lanes
        tally = lanes.tally
        requests = self.requests
        slots = self.geometry.slots
        n = 0
        flush_at = 0  # when the statistics folded so far are due (monotonic ns)
        seek, fd, size = os.lseek, self.region.fd, self.region.size
        while not self._closing:
            if seek(fd, 0, 2) < size:  # shrunk by its client: never touched again
                raise invalid_arg(self._shrunk())
            if header.revoked:
                break
            head = requests.value()
            if head == n:
                due = tally.pending or self.held != self.reported
                head = self._wait(n, (flush_at - _now()) / 1e9 if due else SLICE_S)
                if head == n:
                    if due and _now() >= flush_at:
                        lanes.flush()
                    continue
            if (head - n) & MASK > slots:
                raise InferpoolError(
                    Code.INVALID_ARG,
                    f"the client posted more than {slots} requests "
                    f"(request {head} while the worker is at {n})",
                )
            end = self._serve_one(n)
            n = (n + 1) & MASK
            if end >= flush_at:
                if tally.pending or self.held != self.reported:
                    lanes.flush()
                flush_at = end + FLUSH_NS

    def _wait(self, n: int, limit: float) -> int:
        """The request sequence once it passes ``n``, or after at most ``limit`` seconds:
        spinning first while nothing else runs (one lane spins at a time) and the client's
        thread runs apart from this worker's cores (it says so in the header), then asleep."""
        lanes = self.lanes
        spinning = (
            self.spin_ns
            and self.words[CLIENT_APART]
            and not lanes.execute_lock.locked()
            and lanes.spinner.acquire(blocking=False)
        )
        try:
            spin = self.spin_ns if spinning else 0
            return self.requests.wait(n, spin, max(0.0, limit), self._client_apart)
        finally:
            if spinning:
                lanes.spinner.release()

    def _serve_one(self, n: int) -> int:
        """Claim request ``n``, execute it, answer it; when it was done (monotonic ns)."""
        claimed = _now()
        words = self.words
        try:
            req = self.reader.read(self.request_at[n % self.slots])
        except ValueError as exc:  # nothing of it can be trusted: not even its id
            words[REQ_DONE] = (n + 1) & MASK
            self._answer_error(n, 0, invalid_arg(f"malformed lane request: {exc}"), claimed)
            return claimed
        words[REQ_DONE] = (n + 1) & MASK  # claimed: it will be answered
        sent = req.sent_ns if 0 < req.sent_ns <= claimed else claimed
        try:
            if req.releases:
                self._release(req.releases)
            if req.flags & wl.FLAG_RELEASE_ONLY:
                self._write(n, req.id, (), None)
                return claimed
            if req.flags & wl.FLAG_CANCELLED:  # given up on before it was taken: never run
                raise InferpoolError(Code.CANCELLED, self._cancelled_text(req.id))
            if req.flags & wl.FLAG_AFTER:  # an ensemble's step: once the step before answers
                sent = claimed = self._after(n, req)  # queued from then on
            if self.inputs.shrunk():  # before any view of it is read
                raise invalid_arg(self._inputs_shrunk())
            if self._over():  # the hog is refused, not the others
                raise InferpoolError(Code.UNAVAILABLE, self._over_text())
            request = self.plans.request(n, req)
        except InferpoolError as err:
            self._answer_error(n, req.id, err, sent)
            return claimed
        lanes = self.lanes
        host = lanes.host
        self._current = (n, req.id)
        self._ok = False
        waker, stats = self.waker, host.stats
        with lanes.execute_lock:
            exec_start = _now()
            waker.deferring = True  # (a backend that raises ends the lane: _finish wakes)
            stats.timed = self._timed
            try:
                host.execute([request])
            finally:
                stats.timed = None  # (the main thread's executes report to nobody)
            timing = host.timing_of(request)
            batches = host.take_stamps()
            waker.deferring = False
        if waker.due:
            waker.wake()
        end = _now()
        if lanes.tally.trace_rate and self._ok:  # (Triton's trace of a lane request)
            instants = timing.stamps if timing is not None else (exec_start, exec_start, end, end)
            lanes.tally.trace(req.id, sent, instants, end)
        lanes.tally.add(
            self._ok,
            end - sent,
            claimed - sent,
            batch_size_of(request, self.contract.batched),
            timing.stamps if timing is not None else None,
            batches,
            end - exec_start,
            self.part,
        )
        self.plans.prepare()
        return end

    def _release(self, tokens: list[int]) -> None:
        """Free the outputs the client is done with; NOT_FOUND for a token it does not hold
        (the others are freed)."""
        leases = self.leases
        if len(tokens) == 1 and tokens[0] in leases:  # the common case: the last result's
            self.held -= leases.pop(tokens[0])
            self.memory.free_outputs(tokens)
            return
        held = [t for t in set(tokens) if t in leases]
        for token in held:
            self.held -= leases.pop(token)
        self.memory.free_outputs(held)
        if len(held) != len(tokens):  # a token not held, or one given twice
            bad = list(tokens)
            for token in held:
                bad.remove(token)  # its first occurrence: a second one is not held
            raise not_found(
                f"{len(bad)} lease(s) not held on this lane: {bad[:5]} (released already or "
                f"never granted); {len(tokens) - len(bad)} other lease(s) were released"
            )

    def _over(self) -> bool:
        """Whether the client holds its share: on this lane, as the worker knows it now, and
        elsewhere, as the broker last said (what it counted for this lane taken out)."""
        held = self.held
        return (
            held >= self.share or (self.words[HELD_KIB] << 10) - self.reported + held >= self.share
        )

    def _over_text(self) -> str:
        if self.held >= self.share:
            held = f"holds {self.held} bytes of output memory on lane {self.lane}"
        else:
            held = "holds its whole share of output memory (on its lanes and connections)"
        return (
            f"this client {held}, its share is {self.share} bytes (--client-output-share): "
            "read its responses and release the results it holds, then retry"
        )

    def _cancelled_text(self, request_id: int) -> str:
        return (
            f"request {request_id} on lane {self.lane} for model '{self.contract.model}' was "
            "cancelled"
        )

    def _after(self, n: int, req: wl.LaneRequest) -> int:
        """Wait for the response request ``n`` runs after (FLAG_AFTER); when it came."""
        at = self.request_at[n % self.slots]

        def stop() -> str:
            if self._closing or self.header.revoked:
                return f"lane {self.lane} ended while request {req.id} waited"
            return (
                self._cancelled_text(req.id) if lr.request_cancelled(self.raw, at, req.id) else ""
            )

        return wait_after(self.siblings, self.raw, at, self.slot_size, req, stop)

    def _cancelled(self, n: int) -> bool:
        """``Request.is_cancelled`` of lane request ``n``: whether the client has marked it
        cancelled in its slot (only the request in execution can be: the others are
        answered)."""
        current, request_id = self._current
        if n != current:
            return False
        with self._map_lock:
            at = self.request_at[n % self.slots]
            intact = self._mapped and not self.region.shrunk()
            return intact and lr.request_cancelled(self.raw, at, request_id)

    def _emit(self, request: Request, response: Response | None, final: bool) -> None:
        """The backend's answer to the request in execution, into the response ring."""
        n, request_id = self._current
        if response is not None and response.error is not None:
            response.discard()
            self._ok = False
            self._write_error(n, request_id, response.error)
            return
        outputs = []  # wire.lane_region.Tensor's fields, as plain tuples
        contract = self.contract
        if response is not None:
            index, datatypes, ours = contract.output_index, wl.DATATYPES, self.output_region
            for out, shape in wanted_outputs(
                self.memory, request, response, contract.output_reshapes, contract.batched
            ):
                at = index[out.name] if out.region == ours else index[out.name] | wl.PLACED
                outputs.append((at, datatypes[out.datatype], out.offset, out.byte_size, shape))
        try:
            self._write(n, request_id, outputs, response.parameters if response else None)
        except ValueError as exc:
            self.memory.free_outputs(t[2] for t in outputs if not t[0] & wl.PLACED)
            self._ok = False
            self._write_error(n, request_id, internal(f"response too large for the lane: {exc}"))
            return
        leases = self.leases
        for t in outputs:
            if not t[0] & wl.PLACED:  # one in the client's region is the client's already
                leases[t[2]] = t[3]
                self.held += t[3]
        self._ok = True

    def _write(self, n: int, request_id: int, outputs: Any, parameters: Any) -> None:
        if self.region.shrunk():
            return  # nowhere to answer: the lane ends (``_serve``), its outputs reported
        self.writer.write(self.response_at[n % self.slots], request_id, outputs, parameters)
        self._ring(n + 1)

    def _write_error(self, n: int, request_id: int, err: InferpoolError) -> None:
        if self.region.shrunk():
            return
        at = self.geometry.response(n)
        status = wl.STATUS.get(err.code.value, wl.STATUS["UNKNOWN"])
        message = err.message.encode()[: self.geometry.slot_size - 64].decode(errors="ignore")
        lresp.write_response(
            self.region.buf, at, self.geometry.slot_size, request_id, (), None, status, message
        )
        self._ring(n + 1)

    def _answer_error(self, n: int, request_id: int, err: InferpoolError, sent: int) -> None:
        self._write_error(n, request_id, err)
        self.lanes.tally.fail_one(time.monotonic_ns() - sent, self.part)

    def _shrunk(self) -> str:
        """Why the lane cannot go on when its client shrank its region ("" if it did not)."""
        region = self.region
        size = region.now_size()
        if size >= region.size:
            return ""
        return (
            f"lane {self.lane}: its region '/{region.name}' shrank to {size} of its "
            f"{region.size} bytes (its client truncated it); the lane is closed"
        )

    def _inputs_shrunk(self) -> str:
        inputs = self.inputs
        return (
            f"shared-memory object '/{inputs.name}' shrank to {inputs.now_size()} bytes: it no "
            f"longer covers the lane's input region of {inputs.size} bytes (its client "
            "truncated it; a region the server made keeps its size)"
        )

    def _finish(self) -> tuple[tuple[int, int], ...]:
        """Claim nothing more, say so, give back the outputs the client held unless told
        they stay (its client lives: they become its leases, the broker frees them when it
        releases them); those that stay, with their sizes.  A region its client shrank is
        not touched: what it held is reported, and the broker decides."""
        kept: tuple[tuple[int, int], ...] = ()
        intact = not self._shrunk()
        if intact:
            self.header[wl.WORKER_CLOSED] = 1
        self.responses.wake()
        if intact and self._free and not self.header[wl.KEPT]:  # (KEPT: before LaneClose)
            self.memory.free_outputs(self.leases)
        else:
            kept = self.memory.output_sizes(sorted(self.leases))
        self.leases.clear()
        self.plans.clear()  # their input views go before the client's region is unmapped
        if self.siblings is not None:
            self.siblings.close()
        with self._map_lock:
            self._mapped = False
            self.header.release()
            self.region.close()
            self.inputs.close()
        return kept
