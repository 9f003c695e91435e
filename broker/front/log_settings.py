"""Triton's logging extension: the log settings, read and changed while the server runs.

``log_settings`` answers the settings in force (Triton's names: ``log_file``, ``log_info``,
``log_warning``, ``log_error``, ``log_verbose_level``, ``log_format``).  With ``settings``
it changes them first, all or none (Triton's errors for a wrong value): the broker logs so
at once, every running worker from its next message on (``LogChange``), and workers that
start later get them in their spec.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from inferpool.broker.front.router import Handler
from inferpool.wire import logs
from inferpool.wire.errors import invalid_arg
from inferpool.wire.worker.protocol import LogChange


class LogSettings:
    """The ``log_settings`` message: the log settings in force, changed on request."""

    def __init__(self, alive: Callable[[], Iterable[Any]]) -> None:
        """``alive``: the pool's live worker handles, told of a change."""
        self.alive = alive

    def handlers(self) -> dict[str, Handler]:
        return {"log_settings": self.log_settings}

    def log_settings(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        changes = h.get("settings")
        if changes:
            if not isinstance(changes, dict):
                raise invalid_arg("log_settings: 'settings' must be an object")
            settings = logs.current().updated(changes)
            logs.apply(settings)
            change = LogChange(logs.settings_dict(settings))
            for handle in self.alive():
                handle.send(change)
        return {"settings": logs.current().to_api()}
