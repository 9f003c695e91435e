"""An ensemble's step that waits on its lane for another step's response (``FLAG_AFTER``).

A client running an ensemble over lanes (client.lane_ensemble) may post a step before the
step it reads from has answered: the request names that step's lane and response, and which
of its inputs that response provides.  The worker claims it, sleeps on the other lane's
response word until the response is in (ensemble lanes always wake their waiters), and
runs the step only if that response is this request's, succeeded, and wrote each of those
inputs into the client's region exactly where this request reads it.  So the hand-off from
one step's worker to the next takes one wake-up, not two and the client's turn between.

Nothing the client wrote is trusted beyond its own memory: the other response is only read
for its id, status and where it says it wrote its outputs, in the client's region.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Sequence
from typing import Any

import posix_ipc

from inferpool.shm import futex
from inferpool.shm.bell import Bell
from inferpool.shm.region import Region
from inferpool.wire import lane_records as lr
from inferpool.wire import lane_region as wl
from inferpool.wire import lane_responses as lresp
from inferpool.wire.errors import Code, InferpoolError, invalid_arg

MASK = 0xFFFFFFFF
_U64 = struct.Struct("<Q")
SLICE_S = 0.05  # the longest sleep before the waiting request's lane is looked at again
_now = time.monotonic_ns


class Waker:
    """How an ensemble's lane's answers wake who waits for them: whoever sleeps on the word
    (the client, the other steps' workers), and, while the backend executes
    (``deferring``), only once it has reported its times (``due``, then ``timed`` when the
    statistics have them, or ``wake`` after the execute): a step it wakes may take its
    core, and must not count in this step's time.  Plain attributes: the lane sets them
    around every execute.  (A plain lane's answers wake its client only if it sleeps:
    ``Bell.ring``.)"""

    __slots__ = ("bell", "deferring", "due")

    def __init__(self, bell: Bell) -> None:
        self.bell = bell
        self.deferring = self.due = False

    def ring(self, seq: int) -> None:
        bell = self.bell
        bell.publish(seq)
        if self.deferring:
            self.due = True
        else:
            bell.wake()

    def wake(self) -> None:
        """Wake the waiters of the answer given while deferring."""
        self.due = False
        self.bell.wake()

    def timed(self) -> None:
        """The backend has reported the request's times (``StatsCollector.timed``): its
        answer wakes its waiters now, not once the execute has returned."""
        self.deferring = False
        if self.due:
            self.wake()


class _Sibling:
    """Another lane of the ensemble, mapped to wait on its responses."""

    def __init__(self, name: str) -> None:
        self.region = Region.attach(name, watch=True)  # its client may shrink it: looked at
        try:
            if self.region.size < wl.HEADER_BYTES:
                raise ValueError(f"lane region {name!r} is smaller than a lane's header")
            self.geometry, _, _ = wl.read_header(self.region.buf)
            if self.geometry.size > self.region.size:
                raise ValueError(f"lane region {name!r} is smaller than its geometry")
        except BaseException:
            self.region.close()
            raise
        self.header = wl.Header(self.region.buf)
        self.resp_seq = futex.word(futex.address(self.region.mapping, wl.RESP_SEQ))
        # the last response a request ran on: its record after the id, and that request's
        # body and input mask (a like request on a like record passes as that one did)
        self.passed: tuple[bytes, bytes, int] = (b"", b"", -1)

    def ended(self) -> bool:
        return self.header.revoked or bool(self.header[wl.WORKER_CLOSED])

    def close(self) -> None:
        self.header.release()
        self.region.close()


class Siblings:
    """The ensemble's lanes (their regions, by step) a lane's requests may wait on."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = names
        self._mapped: dict[int, _Sibling] = {}
        self._body: tuple[bytes, list[wl.Tensor]] = (b"", [])  # the last body read: its inputs

    def inputs_of(self, req: wl.LaneRequest) -> list[wl.Tensor]:
        """The inputs of request ``req`` (ValueError if its body is malformed)."""
        body, inputs = self._body
        if body != req.body or not inputs:
            inputs = lr.parse_body(req.body, req.n_inputs, req.n_outputs)[0]
            self._body = (req.body, inputs)
        return inputs

    def wait(
        self,
        after: lr.After,
        req: wl.LaneRequest,
        inputs: Sequence[wl.Tensor],
        stop: Callable[[], str],
    ) -> int:
        """Wait for the response ``after`` names and check it against request ``req``, whose
        inputs are ``inputs`` (InferpoolError to answer the request with instead of running
        it); when it came (monotonic ns).  ``stop`` says why to give up waiting ("": go on):
        the lane ends, the request is cancelled."""
        sibling = self._sibling(after.sibling)
        words, seq, n = sibling.header.words, wl.RESP_SEQ >> 2, after.n
        while True:
            if sibling.region.shrunk():
                raise invalid_arg(
                    f"the region of the lane of step {after.sibling} shrank (its client "
                    f"truncated it): request {req.id} cannot read that step's response"
                )
            head = int(words[seq])
            if (head - n - 1) & MASK < 1 << 31:  # response n is in
                break
            why = stop()
            if why:
                raise InferpoolError(Code.CANCELLED, why)
            if sibling.ended():
                raise InferpoolError(
                    Code.UNAVAILABLE,
                    f"the lane of step {after.sibling}, whose response request {req.id} "
                    "waits for, has ended",
                )
            futex.wait(sibling.resp_seq, head, SLICE_S)
        came = _now()
        at = sibling.geometry.response(n)
        record, body, mask = sibling.passed
        raw = sibling.region.mapping
        if (
            body == req.body
            and mask == after.inputs
            and raw[at + 8 : at + 8 + len(record)] == record
            and _U64.unpack_from(raw, at)[0] == req.id
        ):
            return came  # the answer a like request ran on, to this request
        self._check(after, req, inputs, sibling, at)
        return came

    @staticmethod
    def _check(
        after: lr.After,
        req: wl.LaneRequest,
        inputs: Sequence[wl.Tensor],
        sibling: _Sibling,
        at: int,
    ) -> None:
        """Whether the response at ``at`` of ``sibling`` is ``req``'s, succeeded, and wrote
        each input ``after`` names where ``req`` reads it (InferpoolError if not)."""
        request_id = req.id
        try:
            response = lresp.read_response(sibling.region.buf, at, sibling.geometry.slot_size)
        except ValueError as exc:
            raise invalid_arg(f"malformed response of step {after.sibling}: {exc}") from None
        if response.id != request_id:
            raise invalid_arg(
                f"response {after.n} of step {after.sibling} is request {response.id}'s, not "
                f"request {request_id}'s"
            )
        if response.status:
            raise InferpoolError(
                Code.CANCELLED,
                f"request {request_id} did not run: step {after.sibling}, which it reads "
                "from, failed",
            )
        placed = {
            (t.offset, t.byte_size): t.shape for t in response.outputs if t.position & wl.PLACED
        }
        for i, tensor in enumerate(inputs):
            if after.inputs >> i & 1:
                shape = placed.get((tensor.offset, tensor.byte_size))
                if shape is None or not _alike(shape, tensor.shape):
                    raise InferpoolError(
                        Code.UNAVAILABLE,
                        f"input {i} of request {request_id} is not where step "
                        f"{after.sibling} wrote it",
                    )
        record = bytes(sibling.region.mapping[at + 8 : at + response.size])
        sibling.passed = (record, req.body, after.inputs)

    def _sibling(self, index: int) -> _Sibling:
        sibling = self._mapped.get(index)
        if sibling is None:
            if not 0 <= index < len(self.names):
                raise invalid_arg(f"no step {index} in this lane's ensemble")
            try:
                sibling = self._mapped[index] = _Sibling(self.names[index])
            except (OSError, ValueError, posix_ipc.Error) as exc:
                raise InferpoolError(
                    Code.UNAVAILABLE, f"the lane of step {index} cannot be mapped: {exc}"
                ) from None
        return sibling

    def close(self) -> None:
        for sibling in self._mapped.values():
            sibling.close()
        self._mapped.clear()


def wait_after(
    siblings: Siblings | None,
    buf: Any,
    at: int,
    slot_size: int,
    req: wl.LaneRequest,
    stop: Callable[[], str],
) -> int:
    """``Siblings.wait`` for the request ``req`` in the slot at ``at`` of ``buf`` (with
    FLAG_AFTER): INVALID_ARG on a lane that is not an ensemble's, or a malformed slot."""
    if siblings is None:
        raise invalid_arg(
            "a request that waits for another step's response is only for the lanes of an ensemble"
        )
    try:
        after = lr.read_after(buf, at, slot_size, req)
        inputs = siblings.inputs_of(req)
    except ValueError as exc:
        raise invalid_arg(f"malformed lane request: {exc}") from None
    return siblings.wait(after, req, inputs, stop)


def _alike(made: tuple[int, ...], read: tuple[int, ...]) -> bool:
    """Whether a tensor made as ``made`` is read as ``read``: the same, or a batch of one
    added or removed (the ensemble's batch-dimension rule)."""
    return made == read or made == (1, *read) or (1, *made) == read
