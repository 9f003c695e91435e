"""The frontends' end of the broker's socket: an ipc DEALER driven by an asyncio loop.

Every HTTP or gRPC call becomes one message of the zmq protocol (docs/PROTOCOL.md), sent over
an ipc connection to a ROUTER the broker keeps for the frontends' process alone, so it takes the
zmq clients' own path: the router, admission, the schedulers and the responder.  The
broker's loop reads it like any client's message; nothing here runs in that loop, and
nothing here blocks this one.

Each message names its caller in its first frame (``wire.caller``: the HTTP or gRPC client
it is for, whose registrations and limits it counts against), which the broker believes on
this socket only.  Replies are matched by a tag frame that follows it, before the empty
delimiter: the ROUTER keeps both in the envelope and sends them back unchanged, so the
request's own ``id`` stays the client's.  An inference whose caller goes away (a cancelled
gRPC call, a closed HTTP connection) is cancelled at the broker by a ``cancel`` sent with
its caller and tag.  Tensor frames of 64 KiB and more travel without a copy (the broker
copies them once, into its arena).  Outputs of 64 KiB and more are lent, not sent: the
reply names where the worker wrote them, and :meth:`BrokerChannel.infer` hands them on as
read-only views of the worker's output region (mapped once) in the place of their frames,
then releases their leases once the caller has written them; a reply nobody waits for any
more has its leases released at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import zmq

from inferpool.shm.region import RegionCache
from inferpool.wire import codec
from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.zmqio import NOBLOCK, SNDMORE, recv_frames, send_parts

log = logging.getLogger("inferpool.kserve")
ZERO_COPY_MIN = 64 * 1024
POLLIN = int(zmq.POLLIN)
EVENTS = int(zmq.EVENTS)
_EMPTY = b""
_NO_TAG = bytes(8)  # tags count from 1: the answer to a message sent with this one is dropped
Message = tuple[dict[str, Any], list[Any]]  # a reply: its header and its tensor frames
Listener = Callable[[dict[str, Any], list[Any]], None]


class BrokerChannel:
    """Requests to the broker and their replies, for coroutines of one asyncio loop."""

    def __init__(self, ctx: zmq.Context[Any], endpoint: str) -> None:
        """``endpoint``: the address of the broker's ROUTER for the frontends."""
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)  # never refuse a send: the loop must not block
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.connect(endpoint)
        self._sock = sock
        self._tags = itertools.count(1)
        self._listeners: dict[bytes, Listener] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._regions = RegionCache(readonly=True)  # the workers' output regions
        self._orphans: dict[bytes, Callable[[], None]] = {}  # tag -> what its answer ends

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start reading replies in ``loop`` (the thread that runs it owns the socket)."""
        self._loop = loop
        loop.add_reader(self._sock.getsockopt(zmq.FD), self._drain)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._sock.getsockopt(zmq.FD))
        self._sock.close(0)
        self._listeners.clear()
        self._regions.close()

    # ------------------------------------------------------------------ requests
    async def call(
        self,
        caller: bytes,
        header: dict[str, Any],
        frames: Sequence[Any] = (),
        timeout: float | None = None,
        answered: Callable[[], None] | None = None,
    ) -> Message:
        """Send one request for ``caller`` (``kserve.callers``) and wait for its reply; an
        error reply is raised.  ``answered`` runs once the broker has answered, even when
        the wait was cancelled (then with the late answer)."""
        assert self._loop is not None
        done: asyncio.Future[Message] = self._loop.create_future()

        def settle(reply: dict[str, Any], tensors: list[zmq.Frame]) -> None:
            if not done.done():
                done.set_result((reply, tensors))

        tag = self.open(caller, header, frames, settle)
        try:
            reply, tensors = await asyncio.wait_for(done, timeout)
        except asyncio.TimeoutError:
            raise InferpoolError(
                Code.UNAVAILABLE, f"the server did not answer within {timeout:g}s"
            ) from None
        except asyncio.CancelledError:  # its caller went away (a cancelled RPC, a closed
            if header.get("type") == "infer":  # connection): the broker stops its work
                self.cancel(caller, tag, header.get("id", ""))
            if answered is not None and not done.done():
                self._orphans[tag] = answered
                answered = None
            raise
        finally:
            self.forget(tag)
            if answered is not None:
                answered()
        codec.raise_for_error(reply)
        return reply, tensors

    @contextlib.asynccontextmanager
    async def infer(
        self,
        caller: bytes,
        header: dict[str, Any],
        frames: Sequence[Any] = (),
        answered: Callable[[], None] | None = None,
    ) -> AsyncIterator[Message]:
        """:meth:`call` for an inference: outputs lent come as views in the place of their
        frames, valid until the block ends (their leases are released then)."""
        reply, tensors = await self.call(caller, header, frames, answered=answered)
        tensors, leases = self.borrow(reply, tensors)
        try:
            yield reply, tensors
        finally:
            self.release(caller, leases)

    def borrow(self, reply: dict[str, Any], frames: list[Any]) -> tuple[list[Any], list[str]]:
        """The reply's tensors in order, each output lent as a view of the region it lies
        in (its handle parameters taken out of ``reply``), and the leases to release."""
        tensors: list[Any] = []
        leases: list[str] = []
        it = iter(frames)
        for out in reply.get("outputs", ()):
            params = out.get("parameters")
            if params and "handle_lease" in params:
                region = self._regions.get(params.pop("handle_region"))
                offset = params.pop("handle_offset")
                tensors.append(region.view(offset, params.pop("handle_byte_size")))
                leases.append(params.pop("handle_lease"))
                if not params:
                    del out["parameters"]
            elif not codec.in_shared_memory(out):
                tensors.append(next(it).buffer)
        return tensors, leases

    def release(self, caller: bytes, leases: list[str]) -> None:
        """End ``caller``'s ``leases`` (no answer is awaited)."""
        if leases:
            self.notify(caller, {"type": "release_leases", "leases": leases})

    def open(
        self, caller: bytes, header: dict[str, Any], frames: Sequence[Any], listener: Listener
    ) -> bytes:
        """Send a request for ``caller`` whose replies (several, for a decoupled model) go to
        ``listener`` until :meth:`forget` is called with the tag returned."""
        tag = next(self._tags).to_bytes(8, "little")
        self._listeners[tag] = listener
        sock = self._sock
        sock.send(caller, SNDMORE)
        sock.send(tag, SNDMORE)
        sock.send(_EMPTY, SNDMORE)
        if frames:
            sock.send(codec.encode_header(header), SNDMORE)
            last = len(frames) - 1
            for i, frame in enumerate(frames):
                big = memoryview(frame).nbytes >= ZERO_COPY_MIN
                sock.send(frame, 0 if i == last else SNDMORE, copy=not big)
        else:
            sock.send(codec.encode_header(header))
        self._sent()
        return tag

    def _sent(self) -> None:
        # the socket's fd is edge-triggered: a reply that came in meanwhile raises no new edge
        if self._sock.getsockopt(EVENTS) & POLLIN and self._loop is not None:
            self._loop.call_soon(self._drain)

    def cancel(self, caller: bytes, tag: bytes, request_id: str) -> None:
        """Cancel the infer request sent for ``caller`` as ``tag`` (with id ``request_id``):
        the cancel travels with the same caller and tag, which name that request alone at the
        broker."""
        self.forget(tag)
        header = {"type": "cancel", "request_id": request_id}
        send_parts(self._sock, [caller, tag, _EMPTY, codec.encode_header(header)])
        self._sent()

    def notify(self, caller: bytes, header: dict[str, Any]) -> None:
        """Send a message for ``caller`` that has no answer (``trace_sent``)."""
        send_parts(self._sock, [caller, _NO_TAG, _EMPTY, codec.encode_header(header)])
        self._sent()

    def forget(self, tag: bytes) -> None:
        """No more replies are wanted for ``tag`` (a late one is dropped)."""
        self._listeners.pop(tag, None)

    # ------------------------------------------------------------------ replies
    def _drain(self) -> None:
        sock = self._sock
        while sock.getsockopt(EVENTS) & POLLIN:
            frames = recv_frames(sock, NOBLOCK)  # caller, tag, delimiter, header, tensors
            if len(frames) < 4:
                continue
            listener = self._listeners.get(frames[1].bytes)
            if listener is None:  # its caller went away (a closed HTTP connection, a cancelled
                self._unwanted(frames)  # call): what it was lent goes back
                continue
            try:
                listener(codec.decode_header(frames[3].bytes), frames[4:])
            except Exception:  # one caller's bug must not stop the replies of the others
                log.exception("handling a reply from the broker failed")

    def _unwanted(self, frames: list[zmq.Frame]) -> None:
        """A reply nobody waits for: what it lends goes back, and if it answers an inference
        that was cancelled (not the ``cancel`` itself), what that inference held ends."""
        try:
            reply = codec.decode_header(frames[3].bytes)
        except Exception:
            return
        if reply.get("type") == "infer":
            answered = self._orphans.pop(frames[1].bytes, None)
            if answered is not None:
                answered()
        outputs = reply.get("outputs")
        if isinstance(outputs, list):
            leases = [
                o["parameters"]["handle_lease"]
                for o in outputs
                if isinstance(o, dict) and "handle_lease" in (o.get("parameters") or {})
            ]
            self.release(frames[0].bytes, leases)
