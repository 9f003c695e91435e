"""Turning worker results into client responses on the frontend socket.

Small outputs are copied into the zmq message (cheaper than tracking); large ones are sent
zero-copy straight from the worker's output region, and their slots are freed only when
libzmq reports it is done with the memory.
"""

from __future__ import annotations

from typing import Any

import zmq

from broker.admission import PendingRequest
from broker.outputs import OutputRegions
from client import wire
from client.errors import InferpoolError

ZERO_COPY_MIN = 64 * 1024
_EMPTY = b""


class Responder:
    def __init__(self, socket: zmq.Socket[Any], outputs: OutputRegions) -> None:
        self.socket = socket
        self.outputs = outputs
        # (trackers, [(region, offset), ...]) for zero-copy sends still in libzmq's hands
        self._in_flight: list[tuple[list[zmq.MessageTracker], list[tuple[str, int]]]] = []

    # ------------------------------------------------------------------ plain messages
    def send(self, envelope: list[Any], header: dict[str, Any]) -> None:
        self.socket.send_multipart([*envelope, _EMPTY, wire.encode_header(header)], copy=True)

    def send_error(
        self, envelope: list[Any], msg_type: str, request_id: Any, err: InferpoolError
    ) -> None:
        self.send(envelope, wire.error_header(err, request_id, msg_type))

    # ------------------------------------------------------------------ inference results
    def result(self, req: PendingRequest, item: dict[str, Any]) -> None:
        """Send one worker result item for ``req`` to its client and settle its output slots."""
        err = item.get("error")
        model = req.model
        for out in item.get("outputs") or ():
            self.outputs.hold(out[3])
        if err is not None:
            self._release(item.get("outputs") or ())
            header: dict[str, Any] = {"type": "infer", "id": req.client_id, "error": err}
            if model.decoupled:
                header["parameters"] = {"triton_final_response": bool(item.get("final", True))}
            self.send(req.envelope, header)
            return
        out_headers: list[dict[str, Any]] = []
        frames: list[memoryview] = []
        slots: list[tuple[str, int]] = []
        for name, datatype, shape, region, offset, nbytes in item.get("outputs") or ():
            out_headers.append({"name": name, "datatype": datatype, "shape": shape})
            frames.append(self.outputs.view(region, offset, nbytes))
            slots.append((region, offset))
        params = item.get("params") or {}
        if model.decoupled:
            params["triton_final_response"] = bool(item.get("final", True))
        header = {
            "type": "infer",
            "id": req.client_id,
            "model_name": model.name,
            "model_version": model.version_str,
            "outputs": out_headers,
            "parameters": params,
        }
        self._send_frames(req.envelope, wire.encode_header(header), frames, slots)

    def _send_frames(
        self,
        envelope: list[Any],
        header: bytes,
        frames: list[memoryview],
        slots: list[tuple[str, int]],
    ) -> None:
        sock = self.socket
        for part in envelope:
            sock.send(part, zmq.SNDMORE, copy=True)
        sock.send(_EMPTY, zmq.SNDMORE)
        if not frames:
            sock.send(header, 0, copy=True)
            return
        sock.send(header, zmq.SNDMORE, copy=True)
        trackers: list[zmq.MessageTracker] = []
        last = len(frames) - 1
        for i, frame in enumerate(frames):
            flags = 0 if i == last else zmq.SNDMORE
            if frame.nbytes >= ZERO_COPY_MIN:
                tracker = sock.send(frame, flags, copy=False, track=True)
                trackers.append(tracker)
            else:
                sock.send(frame, flags, copy=True)
        if trackers:
            self._in_flight.append((trackers, slots))
        else:
            self._release_slots(slots)

    def _release(self, outputs: Any) -> None:
        self._release_slots([(o[3], o[4]) for o in outputs])

    def _release_slots(self, slots: list[tuple[str, int]]) -> None:
        for region, offset in slots:
            self.outputs.free(region, offset)

    def poll(self) -> bool:
        """Free the slots of zero-copy sends libzmq has finished; True while some remain."""
        if not self._in_flight:
            return False
        still = []
        for trackers, slots in self._in_flight:
            if all(t.done for t in trackers):
                self._release_slots(slots)
            else:
                still.append((trackers, slots))
        self._in_flight = still
        return bool(still)
