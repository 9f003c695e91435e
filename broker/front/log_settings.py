"""Triton's logging extension: the log settings, read and changed while the server runs.

``log_settings`` answers the settings in force (Triton's names: ``log_file``, ``log_info``,
``log_warning``, ``log_error``, ``log_verbose_level``, ``log_format``).  With ``settings``
it changes them first, all or none (Triton's errors for a wrong value): the broker logs so
at once, every running worker from its next message on (``LogChange``), the KServe
frontends' process through the ``log_watch`` it keeps open (each change is one more answer
to it), and workers and frontends that start later get them in their spec.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from inferpool.broker.front.peers import KSERVE_TAG
from inferpool.broker.front.router import Handler
from inferpool.wire import logs
from inferpool.wire.errors import invalid_arg
from inferpool.wire.worker.protocol import LogChange


class LogSettings:
    """The ``log_settings`` message: the log settings in force, changed on request."""

    def __init__(
        self,
        alive: Callable[[], Iterable[Any]],
        send: Callable[[list[Any], dict[str, Any]], None],
    ) -> None:
        """``alive``: the pool's live worker handles, told of a change; ``send(envelope,
        header)``: the responder's, which answers the frontends' ``log_watch``."""
        self.alive = alive
        self.send = send
        self.watcher: list[Any] | None = None  # the frontends' process's open log_watch

    def handlers(self) -> dict[str, Handler]:
        return {"log_settings": self.log_settings, "log_watch": self.log_watch}

    def log_watch(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> None:
        """The KServe frontends' process (only it) hears each change from now on (a new
        process's watch replaces the last one's)."""
        if e and e[0].startswith(KSERVE_TAG):
            self.watcher = e

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
            if self.watcher is not None:
                self.send(self.watcher, {"type": "log_watch", "settings": change.settings})
        return {"settings": logs.current().to_api()}
