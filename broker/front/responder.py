"""Turning worker results into client responses on the frontend socket.

Small outputs are copied into the zmq message (cheaper than tracking); large ones are sent
zero-copy straight from the worker's output region, and their slots are freed only when
libzmq reports it is done with the memory: until then they count against the client's share
of output memory (``front.shares``), and a client over its share gets copies instead.
Outputs that stay in shared memory (handles, client regions) carry no frame:
``front.handles`` describes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import zmq

from inferpool.broker.front.handles import Handles
from inferpool.broker.front.peers import KSERVE_TAG
from inferpool.broker.front.response_header import described, plain_header, response_header
from inferpool.broker.models.request import PendingRequest
from inferpool.broker.pool.output_regions import OutputRegions
from inferpool.wire import codec
from inferpool.wire.errors import InferpoolError
from inferpool.wire.worker.protocol import Result, TensorRef
from inferpool.wire.zmqio import SNDMORE, send_parts

ZERO_COPY_MIN = 64 * 1024
_EMPTY = b""
_InFlight = tuple[list[zmq.MessageTracker], list[tuple[str, int]], bytes, int]


class Responder:
    """Sends answers to clients: headers, output frames without a copy, handles."""

    def __init__(
        self,
        socket: zmq.Socket[Any],
        outputs: OutputRegions,
        handles: Handles,
        tagged: Mapping[bytes, zmq.Socket[Any]],
    ) -> None:
        """``handles`` describes the outputs that stay in shared memory; ``tagged``: the
        other sockets by their tag (``front.peers``): the owner keys of their clients start
        with it, and their routing frames follow."""
        self.socket = socket
        self.tagged = dict(tagged)
        self.outputs = outputs
        self.handles = handles
        self.shares = handles.shares
        # zero-copy sends still in libzmq's hands: (trackers, [(region, offset)], client, bytes)
        self.sending: list[_InFlight] = []

    # ------------------------------------------------------------------ plain messages
    def _route(self, envelope: list[Any]) -> tuple[zmq.Socket[Any], list[Any]]:
        """The socket a client's answers go out on, and its routing frames there."""
        if envelope:
            for tag, sock in self.tagged.items():
                if envelope[0].startswith(tag):
                    return sock, envelope[1:]
        return self.socket, envelope

    def send(self, envelope: list[Any], header: dict[str, Any]) -> None:
        sock, envelope = self._route(envelope)
        send_parts(sock, [*envelope, _EMPTY, codec.encode_header(header)])

    def send_error(
        self, envelope: list[Any], msg_type: str, request_id: Any, err: InferpoolError
    ) -> None:
        self.send(envelope, codec.error_header(err, request_id, msg_type))

    # ------------------------------------------------------------------ inference results
    def result(self, req: PendingRequest, item: Result) -> None:
        """Send one worker result for ``req`` to its client and settle its output slots."""
        model = req.model
        outputs = item.outputs
        err = item.error
        if err is not None:
            for out in outputs:
                self.outputs.free(out.region, out.offset, held=False)
            header: dict[str, Any] = {"type": "infer", "id": req.client_id, "error": err}
            if model.decoupled:
                header["parameters"] = {"triton_final_response": item.final}
            self.send(req.envelope, header)
            return
        lend = req.envelope[0].startswith(KSERVE_TAG) and self._lends(req, outputs)
        if lend or req.shm_outputs or item.parameters or model.decoupled:
            outputs, encoded = self._described(req, item, lend)
        else:  # the common case: the template of the model's last such header, this id in it
            encoded = plain_header(model, req.client_id, outputs)
        frames = []
        large = False
        view = self.outputs.view
        for out in outputs:
            frames.append(view(out.region, out.offset, out.byte_size))
            large = large or out.byte_size >= ZERO_COPY_MIN
        if not large or self.shares.over(req.envelope[0]):  # copied: the slots are free at once
            sock, envelope = self._route(req.envelope)
            send_parts(sock, [*envelope, _EMPTY, encoded, *frames])
            for out in outputs:
                self.outputs.free(out.region, out.offset, held=False)
            return
        self._send_tracked(req.envelope, encoded, frames, outputs)

    def _lends(self, req: PendingRequest, outputs: Sequence[TensorRef]) -> bool:
        """Whether the large outputs of a result for the KServe frontends' process are lent
        to it as handles: it reads them in place (a large zmq message costs its receiver a
        page fault per 4 KiB) and releases them once written to its client, so they count
        against the caller's share until then."""
        large = any(out.byte_size >= ZERO_COPY_MIN for out in outputs)
        return large and not self.shares.over(req.envelope[0])

    def _described(
        self, req: PendingRequest, item: Result, lend: bool = False
    ) -> tuple[Sequence[TensorRef], bytes]:
        """The outputs to send as frames and the header, encoded in full: it has parameters
        or describes outputs that stay in shared memory (``lend``: the large ones too)."""
        out_headers: list[dict[str, Any]] = []
        outputs = item.outputs
        if req.shm_outputs:
            outputs = self.handles.place(req, outputs, out_headers)
        if lend:
            owner = req.envelope[0]
            framed = []
            for out in outputs:
                if out.byte_size >= ZERO_COPY_MIN:
                    out_headers.append(self.handles.lend(owner, out))
                else:
                    framed.append(out)
            outputs = framed
        out_headers.extend(described(out) for out in outputs)
        params = item.parameters or {}
        if req.model.decoupled:
            params["triton_final_response"] = item.final
        header = response_header(req.model, req.client_id, out_headers, params)
        return outputs, codec.encode_header(header)

    def _send_tracked(
        self,
        envelope: list[Any],
        header: bytes,
        frames: list[memoryview],
        outputs: Sequence[TensorRef],
    ) -> None:
        """Large frames go zero-copy from shared memory; their slots wait for libzmq."""
        sock, route = self._route(envelope)
        for part in route:
            sock.send(part, SNDMORE, copy=True)
        sock.send(_EMPTY, SNDMORE)
        sock.send(header, SNDMORE, copy=True)
        trackers: list[zmq.MessageTracker] = []
        last = len(frames) - 1
        for i, frame in enumerate(frames):
            flags = 0 if i == last else SNDMORE
            if frame.nbytes >= ZERO_COPY_MIN:
                trackers.append(sock.send(frame, flags, copy=False, track=True))
            else:
                sock.send(frame, flags, copy=True)
        slots = [(out.region, out.offset) for out in outputs]
        for region, _ in slots:
            self.outputs.hold(region)
        nbytes = sum(out.byte_size for out in outputs)
        self.shares.hold(envelope[0], nbytes)
        self.sending.append((trackers, slots, envelope[0], nbytes))

    def poll(self) -> bool:
        """Free the slots of zero-copy sends libzmq has finished; True while some remain."""
        if not self.sending:
            return False
        still = []
        for sent in self.sending:
            trackers, slots, client, nbytes = sent
            if all(t.done for t in trackers):
                for region, offset in slots:
                    self.outputs.free(region, offset)
                self.shares.free(client, nbytes)
            else:
                still.append(sent)
        self.sending = still
        return bool(still)
