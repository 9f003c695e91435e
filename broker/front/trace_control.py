"""Triton's trace extension as messages: ``trace_setting`` reads or changes the global
setting or a model's (``models.trace_settings``), and ``trace_sent`` brings a KServe
frontend's send stamps of a traced request (the trace id its answer carried)."""

from __future__ import annotations

from typing import Any

from inferpool.broker.front.peers import KSERVE_TAG
from inferpool.broker.front.router import Handler
from inferpool.broker.models.tracer import Tracer
from inferpool.wire.errors import invalid_arg
from inferpool.wire.trace_stamps import SENT


class TraceControl:
    """The trace extension's message handlers, over the broker's tracer."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    def handlers(self) -> dict[str, Handler]:
        return {"trace_setting": self.trace_setting, SENT: self.trace_sent}

    def trace_setting(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        model = h.get("model_name") or ""
        changes = h.get("settings")
        if not isinstance(model, str):
            raise invalid_arg("trace_setting: 'model_name' must be a string")
        if changes is not None and not isinstance(changes, dict):
            raise invalid_arg("trace_setting: 'settings' must be an object")
        return {"settings": self.tracer.answer(model, changes)}

    def trace_sent(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> None:
        """No answer: the frontend sends it and goes on.  Only the KServe frontends' socket
        may: another client's is dropped (it would write into others' traces)."""
        if e and e[0].startswith(KSERVE_TAG):
            self.tracer.sent(h.get("trace_id"), h.get("stamps"))
