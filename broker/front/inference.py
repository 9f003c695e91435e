"""The ``infer`` and ``cancel`` messages: check a request against its model, place its
inputs, queue it; or cancel one.

Admission (``front.admission``) does the checking and placing; the request then belongs to
the models' request path, which answers it through the responder when its worker is done.  The
shared-memory extension sees each request first: a request may carry the releases of
earlier leases (no extra round trip), and it keeps its sender's leases alive.  A ``cancel``
names an infer request of the same client by its ``id`` (``models.cancellation``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from inferpool.broker.front.admission import Placed, SharedMemoryInputs, admit
from inferpool.broker.front.peers import KSERVE_TAG
from inferpool.broker.front.readiness import Readiness
from inferpool.broker.front.router import Handler
from inferpool.broker.models.failures import failure_reason, log_failure
from inferpool.broker.models.registry import Registry
from inferpool.broker.models.request import PendingRequest
from inferpool.broker.models.tracer import Tracer
from inferpool.shm.arena import Arena
from inferpool.wire.errors import Code, InferpoolError, invalid_arg
from inferpool.wire.trace_stamps import FIELD


class SharedMemoryHook(SharedMemoryInputs, Protocol):
    """What admission asks of the shared-memory extension."""

    def request_arrived(self, client: bytes, header: dict[str, Any]) -> None:
        """Before admission: the leases the request releases, and its sender is alive."""
        ...


class Inference:
    """The ``infer`` and ``cancel`` messages."""

    def __init__(
        self,
        readiness: Readiness,
        registry: Registry,
        arena: Arena,
        shm: SharedMemoryHook,
        submit: Callable[[PendingRequest, int], None],
        limit: int,
        cancel: Callable[[list[bytes], str], int],
        tracer: Tracer,
        placed: tuple[str, int] | None = None,
    ) -> None:
        """``submit`` queues an admitted request (the request path's); ``limit``: the most tensor
        bytes one request may bring; ``cancel(envelope, id)`` cancels what a client sent;
        ``tracer`` samples the requests to trace; ``placed``: the KServe frontends' input
        region (name, size), where their requests' ``placed`` inputs lie."""
        self.readiness = readiness
        self.registry = registry
        self.arena = arena
        self.shm = shm
        self.submit = submit
        self.limit = limit
        self._cancel = cancel
        self.tracer = tracer
        self._placed = placed
        self._next_rid = 0

    def handlers(self) -> dict[str, Handler]:
        return {"infer": self.infer, "cancel": self.cancel}

    def _placed_inputs(self, client: bytes, placed: Any, frames: list[Any]) -> list[Any]:
        """The frames of a request of the KServe frontends' process whose inputs it wrote in
        its input region: ``placed`` lists ``[offset, byte size]`` of each, in the order of
        the inputs that take a frame (a frame where it is ``null``)."""
        if self._placed is None or not client.startswith(KSERVE_TAG):
            raise invalid_arg("'placed' inputs are the KServe frontends' alone")
        if not isinstance(placed, list):
            raise invalid_arg(f"'placed' must be a list, got {placed!r}")
        region, size = self._placed
        out: list[Any] = []
        sent = iter(frames)
        for entry in placed:
            if entry is None:
                out.append(next(sent, b""))
                continue
            ok = isinstance(entry, list) and len(entry) == 2
            ok = ok and all(type(v) is int and v >= 0 for v in entry)
            if not ok or entry[0] + entry[1] > size:
                raise invalid_arg(f"'placed' entry {entry!r} is not a window of {region}")
            out.append(Placed(region, entry[0], entry[1]))
        out.extend(sent)
        return out

    def cancel(self, envelope: list[bytes], header: dict[str, Any], frames: list[Any]) -> Any:
        """Cancel the sender's infer requests with id ``request_id`` (``""``: those sent
        without an id); answers how many."""
        request_id = header.get("request_id")
        if isinstance(request_id, bool) or not isinstance(request_id, str | int):
            raise invalid_arg(
                f"cancel needs 'request_id': the id of an infer request, got {request_id!r}"
            )
        return {"cancelled": self._cancel(envelope, str(request_id))}

    def infer(self, envelope: list[bytes], header: dict[str, Any], frames: list[Any]) -> None:
        client = envelope[0]
        placed = header.pop("placed", None)
        if placed is not None:
            frames = self._placed_inputs(client, placed, frames)
        self.shm.request_arrived(client, header)
        if not self.readiness.admitting:
            raise InferpoolError(
                Code.UNAVAILABLE,
                f"the server is draining ({self.readiness.draining}) and admits no new "
                "requests: send them to another node",
            )
        model = self.registry.resolve(header.get("model_name"), header.get("model_version"))
        if model.decoupled and header.get("single_response"):
            raise InferpoolError(
                Code.UNSUPPORTED,
                f"model '{model.name}' has a decoupled transaction policy (any number of "
                "responses per request) and this request takes exactly one (single_response); "
                "use a stream",
            )
        self._next_rid += 1
        client_id = header.get("id")
        stamps = header.pop(FIELD, None)  # a KServe frontend's (not the request's signature)
        now = time.monotonic_ns()
        try:
            req = admit(
                header,
                frames,
                model,
                self.arena,
                rid=self._next_rid,
                envelope=envelope,
                client=client,
                limit=self.limit,
                now_ns=now,
                shm=self.shm,
            )
        except InferpoolError as err:  # counted as a failure, as Triton counts it
            reason = failure_reason(err)
            model.stats.request_done(False, time.monotonic_ns() - now, 0, None, reason)
            log_failure(client_id, model, reason, err)
            raise
        if self.tracer.on:
            self.tracer.start(req, stamps, time.monotonic_ns())
        self.submit(req, now)
