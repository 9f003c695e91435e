"""Cancelling requests: the ``cancel`` message, and clients that go away.

As Triton's core does: a request that is still queued is taken out of its queue and answered
CANCELLED (for a sequence, the requests queued behind it go too, and the sequence ends); a
request that is executing is marked in the run's cancellation region (``shm.cancel_flags``),
where its backend's ``request.is_cancelled()`` sees it at once, and it is answered CANCELLED
right away (for a decoupled model, that answer counts as a ``cancel`` response in its
response statistics, as the backend's CANCELLED response does in Triton).  Whatever its
worker still sends for it is dropped (``PendingRequest.cancelled``), and its input slots
stay taken until the worker's final result says it is done with them.

Cancelling an ensemble request cancels its steps in flight: a queued step leaves its queue, an
executing one is flagged for its backend, and no further step starts.

A request is found by its routing envelope (the connection it came on; a KServe call's own
tag) and its ``id``: no index is kept on the request path, a cancel looks through the
requests in flight.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from inferpool.broker.models.request import PendingRequest
from inferpool.broker.models.stats import CANCEL
from inferpool.wire.errors import Code, InferpoolError

log = logging.getLogger("inferpool.cancel")


class Flags(Protocol):
    """Where an executing request is marked cancelled for its backend (``shm.cancel_flags``)."""

    def cancel(self, rid: int) -> None: ...


class Cancellation:
    """Cancels requests: by a client's ``cancel``, its disconnect, or a model's call given up."""

    def __init__(
        self,
        inflight: dict[int, PendingRequest],
        flags: Flags,
        reject: Callable[[PendingRequest, InferpoolError], None],
        send_error: Callable[[list[Any], str, Any, InferpoolError], None],
    ) -> None:
        """``inflight``: the request path's requests; ``reject`` answers and ends a request;
        ``send_error`` only answers (the responder's)."""
        self.inflight = inflight
        self.flags = flags
        self.reject = reject
        self.send_error = send_error

    def cancel(self, envelope: list[bytes], request_id: str) -> int:
        """Cancel the requests that came with ``envelope`` (a client's routing frames; the
        KServe frontends add one per call) and have id ``request_id``; how many there were."""
        found = [
            r
            for r in self.inflight.values()
            if r.envelope == envelope and str(r.client_id) == request_id and not r.cancelled
        ]
        for req in found:
            self._cancel(req, "was cancelled")
        return len(found)

    def client_gone(self, client: bytes) -> None:
        """A client disconnected: nothing it asked for is worth running any more."""
        mine = [r for r in self.inflight.values() if r.envelope[:1] == [client] and not r.cancelled]
        for req in mine:
            self._cancel(req, "was cancelled: its client disconnected")
        if mine:
            log.info("client %s disconnected: cancelled %d request(s)", client.hex(), len(mine))

    def clients_gone(self, tag: bytes) -> None:
        """Every client of the socket tagged ``tag`` is gone (the KServe frontends' process
        ended): their requests are cancelled."""
        owners = {r.envelope[0] for r in self.inflight.values() if r.envelope[0].startswith(tag)}
        for owner in owners:
            self.client_gone(owner)

    def cancel_part(self, req: PendingRequest, why: str) -> None:
        """Cancel a request the broker made for another (a model's BLS call): a queued one
        is answered CANCELLED; an executing one is flagged for its backend, whose own answer
        ends it."""
        self._cancel(req, why, part=True)

    def _cancel(self, req: PendingRequest, why: str, part: bool = False) -> None:
        """``part``: a request the broker made for a cancelled one (an ensemble's step),
        flagged for its backend when it executes but not answered here: its backend's answer
        still ends it, and the request it was made for counts on that."""
        if req.rid not in self.inflight:  # ended with an earlier one (its sequence, its run)
            return
        scheduler = req.model.scheduler
        if scheduler is not None:
            for step in scheduler.parts(req, _error(req, why)):
                self._cancel(step, why, part=True)
            if req.rid not in self.inflight:  # its last step's end answered it
                return
        dropped = scheduler.cancel(req) if scheduler is not None else []
        for queued in dropped:  # with it, what of its sequence was queued
            if queued is not req:
                self.reject(queued, _error(queued, why))
        if req.worker is None:
            self.reject(req, _error(req, why))
            return
        self.flags.cancel(req.rid)
        if part:
            return
        req.cancelled = True  # answered now; its worker's late results are dropped
        self.send_error(req.envelope, "infer", req.client_id, _error(req, why))
        if req.model.decoupled:  # the response that ends it is a cancelled one
            req.model.stats.response_done(req.responses, CANCEL, None)
            req.responses += 1


def _error(req: PendingRequest, why: str) -> InferpoolError:
    return InferpoolError(
        Code.CANCELLED, f"request '{req.client_id}' for model '{req.model.name}' {why}"
    )
