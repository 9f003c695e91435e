"""Client messages: parse, route to a handler, always answer.

Whatever bytes arrive, the client gets a response naming the problem and the broker goes
on serving: decode errors, unknown types and handler failures all become error responses.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from inferpool import __version__
from inferpool.broker.front.admission import admit
from inferpool.broker.models.registry import State
from inferpool.wire import codec
from inferpool.wire.errors import Code, InferpoolError, invalid_arg

if TYPE_CHECKING:
    from inferpool.broker.server import Broker

log = logging.getLogger("inferpool.frontend")
Handler = Callable[[list[bytes], dict[str, Any], list[Any]], "dict[str, Any] | None"]
EXTENSIONS = ["model_repository", "statistics", "sequence", "binary_tensor_data", "parameters"]


class Frontend:
    def __init__(self, broker: Broker) -> None:
        self.b = broker
        self.handlers: dict[str, Handler] = {
            "infer": self.infer,
            "health_live": lambda e, h, f: {"live": True},
            "health_ready": lambda e, h, f: {"ready": self.b.ready()},
            "server_metadata": self.server_metadata,
            "model_ready": self.model_ready,
            "model_metadata": self.model_metadata,
            "model_config": self.model_config,
            "repository_index": self.repository_index,
            "load": self.load,
            "unload": self.unload,
            "statistics": self.statistics,
            "status": self.status,
        }
        self._next_rid = 0
        self.source: Any = None  # the routing frame of the message being handled (its fd)

    def add_handler(self, msg_type: str, handler: Handler) -> None:
        self.handlers[msg_type] = handler

    # ------------------------------------------------------------------ routing
    def handle(self, frames: list[Any]) -> None:
        responder = self.b.responder
        self.source = frames[0] if frames else None
        if len(frames) > 2 and len(frames[1]) == 0:  # the usual case: one routing frame
            split = 1
        else:
            split = next((i for i, f in enumerate(frames) if len(f) == 0), -1)
        if split < 1 or split + 1 >= len(frames):
            envelope = [frames[0].bytes] if frames else []
            responder.send_error(
                envelope,
                "error",
                "",
                invalid_arg(
                    "malformed message: expected [empty delimiter, JSON header, tensor frames...]"
                ),
            )
            return
        envelope = [f.bytes for f in frames[:split]]
        msg_type: Any = "error"
        request_id: Any = ""
        try:
            header = codec.decode_header(frames[split + 1].bytes)
            request_id = header.get("id", "")
            msg_type = header.get("type")
            codec.protocol_check(header)
            handler = self.handlers.get(msg_type) if isinstance(msg_type, str) else None
            if handler is None:
                raise invalid_arg(
                    f"unknown message type {msg_type!r}; expected one of "
                    + ", ".join(sorted(self.handlers))
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

    # ------------------------------------------------------------------ inference
    def infer(self, envelope: list[bytes], header: dict[str, Any], frames: list[Any]) -> None:
        b = self.b
        if b.stopping:
            raise InferpoolError(Code.UNAVAILABLE, "the server is shutting down")
        model = b.registry.resolve(header.get("model_name"), header.get("model_version"))
        self._next_rid += 1
        now = time.monotonic_ns()
        req = admit(
            header,
            frames,
            model,
            b.arena,
            rid=self._next_rid,
            envelope=envelope,
            client=envelope[0],
            limit=b.options.request_limit,
            now_ns=now,
            shm=b.shm_inputs,
        )
        b.manager.submit(req, now)
        return None

    # ------------------------------------------------------------------ metadata
    def server_metadata(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        return {
            "name": "inferpool",
            "version": __version__,
            "protocol": codec.PROTOCOL_VERSION,
            "extensions": EXTENSIONS + self.b.extra_extensions,
            "run_id": self.b.run_id,  # every shared-memory region of this run: inferpool-<run_id>-*
        }

    def model_ready(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        try:
            self.b.registry.resolve(h.get("model_name"), h.get("model_version"))
        except InferpoolError as err:
            if err.code is Code.UNAVAILABLE:
                return {"ready": False}
            raise
        return {"ready": True}

    def model_metadata(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        mv = self.b.registry.resolve(h.get("model_name"), h.get("model_version"))
        record = self.b.registry.records[mv.name]
        meta = mv.metadata()
        meta["versions"] = [v.version_str for v in record.ready_versions()]
        return meta

    def model_config(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        mv = self.b.registry.resolve(h.get("model_name"), h.get("model_version"))
        return {"config": mv.config_dict()}

    def repository_index(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        return {"models": self.b.registry.index(ready_only=bool(h.get("ready", False)))}

    def statistics(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        b = self.b
        name = h.get("model_name") or ""
        if name:
            versions = [b.registry.resolve(name, h.get("model_version"))]
        else:
            versions = [mv for mv in b.registry.all_versions() if mv.state is State.READY]
        return {
            "model_stats": [mv.stats.to_dict(mv.name, mv.version) for mv in versions],
            "custom_metrics": b.manager.metrics.to_list(name or None),
            "arena": {"size": b.arena.size, "free": b.arena.free_bytes},
            "inflight": len(b.manager.inflight),
        }

    def status(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        return {"instances": [hd.status() for hd in self.b.supervisor.handles.values()]}

    # ------------------------------------------------------------------ model control
    def _explicit(self, what: str) -> None:
        if self.b.options.model_control_mode != "explicit":
            raise InferpoolError(
                Code.UNSUPPORTED,
                f"explicit model {what} is not allowed unless the server runs with "
                "--model-control-mode explicit",
            )

    def load(self, envelope: list[bytes], h: dict[str, Any], f: list[Any]) -> None:
        self._explicit("load")
        name = h.get("model_name")
        if not isinstance(name, str) or not name:
            raise invalid_arg("load needs a model_name")
        self.b.manager.load(name, self._deferred(envelope, "load", h.get("id", "")))

    def unload(self, envelope: list[bytes], h: dict[str, Any], f: list[Any]) -> None:
        self._explicit("unload")
        name = h.get("model_name")
        if not isinstance(name, str) or not name:
            raise invalid_arg("unload needs a model_name")
        self.b.manager.unload(name, self._deferred(envelope, "unload", h.get("id", "")))

    def _deferred(self, envelope: list[bytes], msg_type: str, request_id: Any) -> Any:
        def done(err: InferpoolError | None) -> None:
            if err is None:
                self.b.responder.send(envelope, {"type": msg_type, "id": request_id})
            else:
                self.b.responder.send_error(envelope, msg_type, request_id, err)

        return done
