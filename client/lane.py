"""The client's end of a lane (``wire.lane_region``): requests into the ring, results out of it.

A :class:`Lane` posts a :class:`~inferpool.client.shm_request.ShmRequest` (its inputs are
already in the client's input region; only a small struct crosses) and reads the answer as
a :class:`~inferpool.client.shm_request.ShmResult` whose outputs view the worker's output
region in place, leased until released (releases ride on the lane's next request).  How it
waits: a bounded spin while the waiting thread runs on a core the worker may not run on
(looked at on every turn: ``shm.cores.Apart``; the lane's header tells the worker, which
then spins for the next request too), then a futex, in slices after each of which it looks
whether the lane was revoked or the worker died.

When the lane ends (revoked by the broker, or the worker gone), a request the worker had not
taken raises :class:`LaneRevoked`: nothing ran, and the client sends it on the broker path.
A request the worker had taken is answered if the worker answered it, else it fails with
UNAVAILABLE naming why the lane ended.
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from inferpool.client.shm_request import (
    HANDLE,
    INPUT_REGION,
    ShmRequest,
    ShmResult,
    output_view,
)
from inferpool.shm import cores
from inferpool.shm.bell import bells
from inferpool.shm.refs import posix_name
from inferpool.shm.region import Region
from inferpool.wire import codec
from inferpool.wire import lane_records as lr
from inferpool.wire import lane_region as wl
from inferpool.wire import lane_responses as lresp
from inferpool.wire.errors import Code, InferpoolError

if TYPE_CHECKING:
    from inferpool.client.shm_core import ShmSession

SLICE_S = 0.05  # the longest sleep before the lane and the worker are looked at again
MASK = 0xFFFFFFFF
RELEASE_ONLY = (b"", 0, 0)  # the body of a request that only carries releases
VIEWS = 64  # output shapes a lane remembers how to view
_now = time.monotonic_ns
# the header's words a client reads on every request
STATE, WORKER_CLOSED, RESP_DONE = wl.STATE >> 2, wl.WORKER_CLOSED >> 2, wl.RESP_DONE >> 2
CLIENT_APART = wl.CLIENT_APART >> 2
RESP_SEQ = wl.RESP_SEQ >> 2


_frombuffer = np.frombuffer
# A response record read before: its size, its bytes after the id, its outputs' views (name,
# offset, byte size, spec, numpy dtype and count or None for BYTES, shape unless 1-D,
# whether the request placed it in the client's own region),
# its parameters, its leases
Known = tuple[int, "bytes | None", list[Any], dict[str, Any], tuple[tuple[int, str], ...]]


class LaneRevoked(Exception):
    """The lane ended before the worker took the request: it never ran."""


class Lane:
    """One lane to one worker instance of a model, opened by ``open_lane`` (``grant``)."""

    def __init__(self, session: ShmSession, grant: dict[str, Any], spin_us: int) -> None:
        self.session = session
        self.id: int = grant["lane"]
        self.model: str = grant["model_name"]
        self.version: str = grant["model_version"]
        self.instance: str = grant["instance"]
        self.worker_pid: int = grant["worker_pid"]
        self.output_region: str = grant["output_region"]
        self.inputs = {d["name"]: i for i, d in enumerate(grant["inputs"])}
        self.outputs: list[str] = list(grant["outputs"])
        self._output_index = {name: i for i, name in enumerate(self.outputs)}
        self.region = Region.attach(posix_name(grant["key"]))
        buf = self.region.buf
        try:
            self.geometry, header, self.request_at, self.response_at = wl.layout(
                buf, self.region.size
            )
            self._pidfd = _pidfd(self.worker_pid)
        except BaseException:
            self.region.close()
            raise
        self.header = header
        self.words = header.words
        self.raw = self.region.mapping  # slots are read and written through the mapping
        self.requests, self.responses = bells(buf, header.words, wl.BELLS)
        self.slots, self.slot_size = self.geometry.slots, self.geometry.slot_size
        self._views: dict[tuple[int, int, tuple[int, ...]], Any] = {}
        self._known: Known = (0, None, [], {}, ())  # the last response record read: _take
        self.worker_cores = cores.of(self.worker_pid)  # the cores the worker may run on
        self.held_cores = frozenset(grant.get("held_cpus", ()))  # every worker's, pinned
        self.apart = cores.Apart(self.worker_cores)
        self.spin_ns = spin_us * 1000 if spin_us > 0 and not self.apart.never else 0
        self._told = False  # what the header's CLIENT_APART says
        self.sent = 0  # requests posted
        self.read = 0  # responses taken
        self.releases: list[int] = []  # tokens to send with the next request
        self.ended = ""  # why the lane is over ("": it is not)
        self.closers: list[Callable[[], None]] = []  # run before the lane is unmapped
        self.waiter: Any = None  # the asyncio client's AsyncLane over it, once it has one
        self.closed = False  # unmapped (close)
        self.kept = False  # revoked KEPT: its releases go through the broker

    # ------------------------------------------------------------------ requests
    def body(self, request: ShmRequest) -> tuple[bytes, int, int] | None:
        """The request's fixed part as this lane encodes it, or None when the request cannot
        travel on a lane (inputs outside the input region, outputs into windows,
        parameters): the broker path takes it."""
        cached = request.lane_cache
        if cached is not None and cached[0] == (self.id, request.revision):
            return cached[1]
        encoded = self._encode(request)
        request.lane_cache = ((self.id, request.revision), encoded)
        return encoded

    def _encode(self, request: ShmRequest) -> tuple[bytes, int, int] | None:
        header = request.header
        if "parameters" in header:
            return None
        inputs = []
        for spec in header["inputs"]:
            params = spec["parameters"]
            known = self.inputs.get(spec["name"])
            if params["shared_memory_region"] != INPUT_REGION or known is None:
                return None
            datatype = wl.DATATYPES.get(spec["datatype"], 0)
            offset, nbytes = params["shared_memory_offset"], params["shared_memory_byte_size"]
            inputs.append(wl.Tensor(known, datatype, offset, nbytes, tuple(spec["shape"])))
        outputs = []
        for spec in header["outputs"]:
            index = self._output_index.get(spec["name"])
            if spec["parameters"] != HANDLE or index is None:
                return None
            outputs.append(index)
        return lr.pack_request_body(inputs, outputs), len(inputs), len(outputs)

    def post(
        self,
        body: tuple[bytes, int, int],
        flags: int = 0,
        after: lr.After | None = None,
        request_id: int | None = None,
    ) -> int:
        """Put a request into the ring and ring the worker; its number (and its id, unless
        ``request_id`` says otherwise).  ``after``: it runs once that response of another
        lane of its ensemble is in (client.lane_ensemble).  LaneRevoked if the lane has
        ended (nothing was posted)."""
        words = self.words
        if self.ended or words[STATE] or words[WORKER_CLOSED]:
            self._end()
            raise LaneRevoked(self.ended)
        n = self.sent
        slots = self.slots
        if (n - self.read) & MASK >= slots:
            raise InferpoolError(Code.UNAVAILABLE, f"lane {self.id} has {slots} requests in flight")
        releases = self.releases
        if releases:
            room = (self.slot_size - 80 - len(body[0])) // 8
            releases, self.releases = releases[:room], releases[room:]
        lr.write_request(
            self.raw,
            self.request_at[n % slots],
            self.slot_size,
            n if request_id is None else request_id,
            _now(),
            flags if after is None else flags | wl.FLAG_AFTER,
            body[1],
            body[2],
            body[0],
            releases,
            after,
        )
        self.sent = (n + 1) & MASK
        self.requests.ring(self.sent)
        return n

    def run(self, request: ShmRequest, limit: float) -> ShmResult | None:
        """``request``'s round trip within ``limit`` seconds, or None if it cannot travel
        on a lane (``body``)."""
        body = self.body(request)
        return None if body is None else self.call(body, limit)

    def call(self, body: tuple[bytes, int, int], limit: float, flags: int = 0) -> ShmResult:
        """A request's round trip for a caller that waits for it (the blocking client),
        within ``limit`` seconds.  LaneRevoked when the lane has ended before the request
        was posted."""
        if (self.sent - self.read) & MASK >= self.slots:
            limit = self.make_room(limit)
        return self.result(self.post(body, flags), limit)

    def make_room(self, limit: float) -> float:
        """Requests given up on fill the ring: await their answers (they were cancelled,
        and end soon if their backend asks) and drop them, within ``limit`` seconds; what
        is left of it.  Returns at once when the lane is over (``post`` then says so)."""
        deadline = time.monotonic() + limit
        while (self.sent - self.read) & MASK >= self.slots:
            oldest = self.read
            if not self.answered(oldest):
                try:
                    left = max(0.0, deadline - time.monotonic())
                    self._await(oldest, self.words[RESP_SEQ], left)
                except LaneRevoked:
                    break
                except InferpoolError as err:
                    if err.code is Code.TIMEOUT:
                        raise
                    break  # the worker died running it: the lane is over too
            self._drop(oldest)
        return max(0.0, deadline - time.monotonic())

    # ------------------------------------------------------------------ responses
    def result(self, n: int, limit: float) -> ShmResult:
        """The answer to request ``n``, waited for at most ``limit`` seconds."""
        head = self.words[RESP_SEQ]
        if not 0 < (head - n) & MASK <= self.slots:
            self._await(n, head, limit)
        return self._take(n) if self.read == n else self.take(n)

    def _await(self, n: int, head: int, limit: float) -> None:
        """Wait until response ``n`` is in: a spin, then sleeps of at most SLICE_S after
        each of which the lane and the worker are looked at (raises what ``fail`` says
        when the lane is over, TIMEOUT after ``limit``)."""
        responses = self.responses
        deadline = time.monotonic() + limit
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.cancel(n)
                raise InferpoolError(
                    Code.TIMEOUT,
                    f"no response on lane {self.id} (model '{self.model}') within {limit:g}s",
                )
            head = responses.wait(head, self.spin_ns, min(SLICE_S, left), self.stay)
            if 0 < (head - n) & MASK <= self.slots:  # answered
                return
            if self.over():
                self.fail(n)
                return

    def stay(self) -> bool:
        """Whether a wait may spin on: the calling thread runs on a core the worker may not
        run on.  The header tells the worker (CLIENT_APART) whenever that changes."""
        apart = self.apart()
        if apart is not self._told:
            self._told = apart
            self.words[CLIENT_APART] = apart
        return apart

    def placement(self) -> dict[str, Any]:
        """Where the lane's ends run and how its waits went: the cores the worker may run
        on, the cores the server's workers hold, the calling thread's core now and the
        cores it may run on, whether a wait of this thread spins now, and how many waits
        were answered while spinning and how many slept."""
        return {
            "worker_cores": sorted(self.worker_cores),
            "held_cores": sorted(self.held_cores),
            "client_core": cores.current(),
            "client_cores": sorted(cores.allowed()),
            "spins": bool(self.spin_ns) and self.apart(),
            "spun": self.responses.spun,
            "slept": self.responses.slept,
        }

    def cancel(self, n: int) -> bool:
        """Cancel request ``n`` (posted, unanswered), which its caller gave up on: its
        backend's ``is_cancelled()`` turns true, a request not yet taken never runs, and its
        response is dropped when it comes (``take``).  Whether it was marked: not when the
        lane is over or closed, or the request answered."""
        with contextlib.suppress(ValueError):  # unmapped meanwhile: nothing to cancel
            if not self.ended and not self.answered(n):
                lr.cancel_request(self.raw, self.request_at[n % self.slots])
                return True
        return False

    def answered(self, n: int, head: int | None = None) -> bool:
        """Whether the response to request ``n`` is in the ring."""
        if head is None:
            head = self.responses.value()
        return 0 < (head - n) & MASK <= self.slots

    def over(self) -> bool:
        """Whether no response will come any more: the lane ended (revoked, or the worker
        died) and the worker has stopped (it answered what it had taken) or is dead."""
        header = self.header
        if not (self.ended or header.revoked or not self._worker_alive()):
            return False
        self._end()
        return bool(header[wl.WORKER_CLOSED]) or not self._worker_alive()

    def fail(self, n: int) -> None:
        """Raise what request ``n`` of a lane that is over comes to: answered after all, or
        LaneRevoked if the worker never took it (it never ran), or UNAVAILABLE."""
        if self.answered(n):
            return
        claimed = self.header[wl.REQ_DONE]
        if not 0 < (claimed - n) & MASK <= self.slots:
            raise LaneRevoked(self.ended)
        raise InferpoolError(Code.UNAVAILABLE, self.ended)

    def take(self, n: int) -> ShmResult:
        """Response ``n``, which is in the ring; responses before it that nobody waits for
        any more (their requests timed out) are dropped, their outputs released."""
        while self.read != n:
            self._drop(self.read)
        return self._take(n)

    def _take(self, n: int) -> ShmResult:
        """Response ``n``: a record whose bytes (all but the id) equal the last one read
        is known by them, its checked plan used as it is (``_learn``)."""
        at = self.response_at[n % self.slots]
        raw = self.raw
        known = self._known
        if raw[at + 8 : at + known[0]] != known[1]:
            known = self._learn(n, at)
        self.read = read = (n + 1) & MASK
        self.words[RESP_DONE] = read
        _, _, views, parameters, leases = known
        mapped, own = self._bufs()
        outputs: dict[str, Any] = {}
        for name, offset, nbytes, spec, typed, shape, placed in views:
            buf = own if placed else mapped  # placed: in the client's own region
            if typed is None:  # BYTES: decoded afresh (its elements are copies)
                outputs[name] = output_view(buf, offset, nbytes, spec)
            else:
                array = _frombuffer(buf, typed[0], typed[1], offset)
                outputs[name] = array if shape is None else array.reshape(shape)
        self.session.hold(self.output_region, len(leases))
        result = ShmResult(self, self.model, self.version, outputs, dict(parameters), list(leases))
        result.layout = views
        return result

    def _learn(self, n: int, at: int) -> Known:
        """Read the response record at ``at`` in full: an error is raised (response ``n``
        taken), a success checked once (each output's view made as ``output_view`` makes
        it) and remembered as the plan of records with the same bytes."""
        response = lresp.read_response(self.raw, at, self.slot_size)
        if response.status:
            self.read = read = (n + 1) & MASK
            self.words[RESP_DONE] = read
            raise InferpoolError(wl.code_name(response.status), response.error)
        bufs = self._bufs()
        views = []
        for t in response.outputs:
            spec, typed = self._views.get((t.position, t.datatype, t.shape)) or self._view(t)
            placed = bool(t.position & wl.PLACED)
            output_view(bufs[placed], t.offset, t.byte_size, spec, typed)  # raises if it cannot
            shape = None if len(t.shape) == 1 else t.shape
            views.append((spec["name"], t.offset, t.byte_size, spec, typed, shape, placed))
        region = self.output_region
        leases = tuple((t.offset, region) for t in response.outputs if not t.position & wl.PLACED)
        record = bytes(self.raw[at + 8 : at + response.size])
        self._known = known = (response.size, record, views, response.parameters, leases)
        return known

    def _bufs(self) -> tuple[Any, Any]:
        """Where outputs lie: the worker's output region, or (placed there as the request
        asked) the client's own input region."""
        own = self.session.region
        return self.session.mapped.get(self.output_region).buf, own.buf if own else None

    def _view(self, t: wl.Tensor) -> tuple[dict[str, Any], tuple[Any, int] | None]:
        """The spec of an output of this position, datatype and shape, and its numpy dtype
        and element count (None for BYTES): worked out once (``_take`` looks in ``_views``
        first), a lane's outputs keep theirs."""
        datatype = wl.DATATYPE_NAMES[t.datatype]
        shape = list(t.shape)
        spec = {"name": self.outputs[t.position & ~wl.PLACED], "datatype": datatype, "shape": shape}
        typed = (
            None
            if datatype == "BYTES"
            else (codec.numpy_dtype(datatype), codec.element_count(shape))
        )
        if len(self._views) >= VIEWS:
            self._views.clear()
        known = self._views[(t.position, t.datatype, t.shape)] = (spec, typed)
        return known

    def _drop(self, n: int) -> None:
        """A response nobody waits for (its request timed out): release its outputs."""
        with contextlib.suppress(InferpoolError):
            self.release(self._take(n)._leases)

    def release(self, leases: list[tuple[Any, str]]) -> None:
        """ShmResult's: the tokens go with the lane's next request, or, once the lane is
        revoked, through the broker (``_hand_over``)."""
        if self.closed or self.words[STATE]:
            self._hand_over([token for token, _ in leases])
        else:
            releases = self.releases
            for token, _ in leases:
                releases.append(token)
        self.session.unhold(leases)

    def _hand_over(self, tokens: list[int]) -> None:
        """Releases of a revoked lane: through the broker, which made the outputs this
        client's leases (``KEPT``: the broker ends a lane so while its client lives), or
        nowhere (its worker died with them)."""
        if not self.closed:
            self.kept = bool(self.header[wl.KEPT])
        if self.kept:
            self.session.pending.extend(wl.lane_token(self.id, token) for token in tokens)

    def flush(self, limit: float) -> int:
        """Send queued releases now, on a request of their own; how many."""
        count = len(self.releases)
        while self.releases:
            self.call(RELEASE_ONLY, limit, wl.FLAG_RELEASE_ONLY).release()
        return count

    # ------------------------------------------------------------------ the lane's end
    def _worker_alive(self) -> bool:
        if self._pidfd < 0:
            return True
        readable, _, _ = select.select([self._pidfd], [], [], 0)
        return not readable

    def _end(self) -> None:
        """Note why the lane is over: the broker's reason, or the worker's death; the
        releases not sent yet go through the broker."""
        if self.ended:
            return
        if self.header.revoked:
            self._hand_over(self.releases)
            self.releases = []
            self.ended = f"lane {self.id} to model '{self.model}' ended: {self.header.reason()[1]}"
        elif not self._worker_alive():
            self.ended = (
                f"lane {self.id} to model '{self.model}' ended: instance '{self.instance}' "
                f"(pid {self.worker_pid}) exited"
            )

    @property
    def usable(self) -> bool:
        words = self.words
        return not (self.ended or words[STATE] or words[WORKER_CLOSED])

    def close(self) -> None:
        """Unmap the lane (results already taken keep their outputs' mapping)."""
        while self.closers:
            self.closers.pop()()
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1
        if not self.closed and self.header.revoked:
            self._hand_over(self.releases)
            self.releases = []
        self.closed = True
        self.header.release()
        self.region.close()


def _pidfd(pid: int) -> int:
    """A descriptor that becomes readable when ``pid`` exits (-1 where the kernel has none)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return -1
