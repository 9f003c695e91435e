"""Client messages: parse, route to a handler, always answer.

Whatever bytes arrive, the client gets a response naming the problem and the broker goes
on serving: decode errors, unknown types and handler failures all become error responses.
The handlers come from the front's parts (inference, control, the shared-memory extension),
each of which lists its own; the table is fixed once the router is built.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from inferpool.broker.front.peers import NAMED_BY, RESERVED
from inferpool.broker.front.responder import Responder
from inferpool.wire import codec
from inferpool.wire.errors import Code, InferpoolError, invalid_arg

log = logging.getLogger("inferpool.frontend")
# (envelope: the client's routing frames, header, tensor frames) -> reply header, or None when
# the handler answers later (an inference, a load) or not at all
Handler = Callable[[list[bytes], dict[str, Any], list[Any]], "dict[str, Any] | None"]


class Router:
    """Hands each client message to the handler of its type and sends the answer."""

    def __init__(
        self,
        responder: Responder,
        tables: Iterable[Mapping[str, Handler]],
        arrived: Callable[[Any], None],
    ) -> None:
        """``tables``: each part's handlers by message type; ``arrived`` hears the routing
        frame of each message before its handler runs (the connection it came on:
        ``front.clients`` ties a client to it)."""
        self.responder = responder
        self.handlers: dict[str, Handler] = {}
        for table in tables:
            taken = self.handlers.keys() & table.keys()
            if taken:
                raise ValueError(f"message types handled twice: {', '.join(sorted(taken))}")
            self.handlers.update(table)
        self._arrived = arrived
        self._expected = ", ".join(sorted(self.handlers))

    def handle(self, frames: list[Any], tag: bytes = b"") -> None:
        """One message; ``tag``: that of the socket it came on, if not the plain one.

        A tagged socket's message gets its client's owner key (the tag and the frame that
        names the client, ``front.peers.NAMED_BY``) in front of its routing frames; on the
        plain socket, a routing id that starts with a tag poses as another socket's client:
        the message is dropped (its answer would go to that client).
        """
        responder = self.responder
        if frames:
            self._arrived(frames[0])
        if len(frames) > 2 and len(frames[1]) == 0:  # the usual case: one routing frame
            split = 1
        else:
            split = next((i for i, f in enumerate(frames) if len(f) == 0), -1)
        if split < 1 or split + 1 >= len(frames):
            envelope = [f.bytes for f in frames[:1]]
            if tag and envelope:
                envelope.insert(0, tag + envelope[0])
            responder.send_error(
                envelope,
                "error",
                "",
                invalid_arg(
                    "malformed message: expected [empty delimiter, JSON header, tensor frames...]"
                ),
            )
            return
        # (bytes() of a Frame: its .bytes, without pyzmq's attribute hook, wire.zmqio)
        envelope = [bytes(frames[0])] if split == 1 else [bytes(f) for f in frames[:split]]
        if tag:
            named = NAMED_BY[tag]
            if named >= split:
                log.warning("dropped a message without the frame that names its client")
                return
            envelope.insert(0, tag + envelope[named])
        elif envelope[0].startswith(RESERVED):
            log.warning("dropped a message whose routing id poses as another socket's client")
            return  # no answer: the id names a client of another socket
        msg_type: Any = "error"
        request_id: Any = ""
        try:
            header = codec.decode_header(memoryview(frames[split + 1]))
            request_id = header.get("id", "")
            msg_type = header.get("type")
            codec.protocol_check(header)
            handler = self.handlers.get(msg_type) if isinstance(msg_type, str) else None
            if handler is None:
                raise invalid_arg(
                    f"unknown message type {msg_type!r}; expected one of {self._expected}"
                )
            reply = handler(envelope, header, frames[split + 2 :])
        except InferpoolError as err:
            responder.send_error(envelope, str(msg_type), request_id, err)
            return
        except Exception as exc:  # a bug must not take the broker down with it
            log.exception("handling a %r message failed", msg_type)
            responder.send_error(
                envelope, str(msg_type), request_id, InferpoolError.wrap(exc, Code.INTERNAL)
            )
            return
        if reply is not None:
            reply["type"] = msg_type
            reply["id"] = request_id
            responder.send(envelope, reply)
