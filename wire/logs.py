"""Log lines of the broker and its workers, and Triton's log settings that choose them.

The settings are Triton's logging extension's: the verbose level (above 0: DEBUG lines),
switches for INFO, WARNING and ERROR lines, the format and the file (empty: stderr).  The
broker holds them; every worker gets them in its spec and again whenever a client changes
them (``/v2/logging``, gRPC ``LogSettings``, the zmq ``log_settings`` message), so one run's
log reads the same throughout.  Formats: ``default`` (text lines tagged with the process),
``ISO8601`` (Triton's, with an ISO 8601 time and the pid) and ``json`` (one object per line:
the time, level, logger and message, the process, and whatever a record was given as
``extra`` among :data:`FIELDS`, so a log store can follow one request or one model).
A process that is starting (the broker until its models settled, a worker until its model
loaded) logs its INFO lines as verbose ones: the start-up is quiet unless ``--log-verbose``
asks, and its warnings and errors are written as always.  Standard library only: workers
set this up before they are pinned.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from inferpool.wire.errors import Code, InferpoolError, invalid_arg

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMATS = ("default", "ISO8601", "json")
ALIASES = {"text": "default"}  # --log-format text: the default format's older name
# taken from a record's ``extra`` (``source``: a C backend's file and line)
FIELDS = ("request_id", "model", "version", "instance", "source")
_SWITCHES = {"log_info": "info", "log_warning": "warning", "log_error": "error"}


@dataclass(frozen=True)
class LogSettings:
    """What is logged, and how (Triton's log settings)."""

    verbose: int = 0  # log_verbose_level: above 0, DEBUG lines too
    info: bool = True
    warning: bool = True
    error: bool = True
    format: str = "default"
    file: str = ""  # "": stderr

    def to_api(self) -> dict[str, Any]:
        """The settings as Triton's logging extension names them."""
        return {
            "log_file": self.file,
            "log_info": self.info,
            "log_warning": self.warning,
            "log_error": self.error,
            "log_verbose_level": self.verbose,
            "log_format": self.format,
        }

    def updated(self, changes: Mapping[str, Any]) -> LogSettings:
        """These settings with a client's ``changes`` (Triton's names, JSON values; null
        leaves one as it is); Triton's errors for what cannot change."""
        new: dict[str, Any] = {}
        for key, value in changes.items():
            if value is None:
                continue
            if key == "log_file":
                raise InferpoolError(
                    Code.UNSUPPORTED,
                    "log file location can not be updated through network protocol",
                )
            if key in _SWITCHES:
                if type(value) is not bool:
                    raise invalid_arg(f"expect boolean for '{key}'")
                new[_SWITCHES[key]] = value
            elif key == "log_verbose_level":
                if type(value) is not int or not 0 <= value < 1 << 32:
                    raise invalid_arg(f"expect an integer >= 0 for '{key}', got {value!r}")
                new["verbose"] = value
            elif key == "log_format":
                fmt = ALIASES.get(value, value) if isinstance(value, str) else value
                if fmt not in FORMATS:
                    raise invalid_arg(
                        f"invalid argument for log_format, got: {value} (expected one of "
                        f"{', '.join(FORMATS)})"
                    )
                new["format"] = fmt
            else:
                raise invalid_arg(f"unknown log setting '{key}'")
        return replace(self, **new)

    def level(self) -> int:
        """The lowest level any line may have."""
        if self.verbose > 0:
            return logging.DEBUG
        for on, level in ((self.info, logging.INFO), (self.warning, logging.WARNING)):
            if on:
                return level
        return logging.ERROR if self.error else logging.CRITICAL

    def allows(self, levelno: int) -> bool:
        """Whether a line of this level is written (CRITICAL always is)."""
        if levelno >= logging.CRITICAL:
            return True
        if levelno >= logging.ERROR:
            return self.error
        if levelno >= logging.WARNING:
            return self.warning
        if levelno >= logging.INFO:
            return self.info
        return self.verbose > 0


def settings_from(raw: Mapping[str, Any] | None) -> LogSettings:
    """The settings a spec carries (their fields as JSON)."""
    return LogSettings(**raw) if raw else LogSettings()


def settings_dict(settings: LogSettings) -> dict[str, Any]:
    """The settings as a spec or a message carries them."""
    return asdict(settings)


class JsonFormatter(logging.Formatter):
    """One JSON object per line; ``fixed`` fields (the process) are in every line."""

    def __init__(self, fixed: Mapping[str, Any]) -> None:
        super().__init__()
        self.fixed = dict(fixed)

    def format(self, record: logging.LogRecord) -> str:
        seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line: dict[str, Any] = {
            "time": f"{seconds}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **self.fixed,
            "pid": record.process,
        }
        for key in FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class _Iso8601Formatter(logging.Formatter):
    """Triton's ISO8601 lines: ``2024-05-20T20:03:26Z I 3415 [label] logger: message``."""

    def __init__(self, label: str) -> None:
        super().__init__(f"%(iso)s %(letter)s %(process)d [{label}] %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        record.iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
        record.letter = record.levelname[:1]
        return super().format(record)


class _Switches(logging.Filter):
    """Drops the lines whose level is switched off (log_info, log_warning, log_error)."""

    def __init__(self, settings: LogSettings) -> None:
        super().__init__()
        self.settings = settings

    def filter(self, record: logging.LogRecord) -> bool:
        if _process.starting and record.levelno == logging.INFO:
            return self.settings.verbose > 0
        return self.settings.allows(record.levelno)


@dataclass
class _Process:
    """Who this process logs as, and what it logs now."""

    label: str = ""
    fixed: Mapping[str, Any] | None = None
    settings: LogSettings = LogSettings()
    starting: bool = False  # INFO lines are verbose ones until ``serving``


_process = _Process()
_listeners: list[Callable[[LogSettings], None]] = []


def configure(
    settings: LogSettings, label: str, fixed: Mapping[str, Any], starting: bool = False
) -> None:
    """Log as ``settings`` say: text lines tagged ``[label]``, or JSON with ``fixed``;
    ``starting``: INFO lines are verbose ones until :func:`serving` (the module's docstring)."""
    _process.label, _process.fixed, _process.starting = label, dict(fixed), starting
    apply(settings)


def serving() -> None:
    """The process has started: its INFO lines are written from now on."""
    _process.starting = False


def apply(settings: LogSettings) -> None:
    """Log as ``settings`` say from now on (the label and fields :func:`configure` set stay);
    the listeners hear of it (a C backend's host keeps which levels are on)."""
    previous, _process.settings = _process.settings, settings
    root = logging.getLogger()
    handler = root.handlers[0] if root.handlers else None
    if handler is None or settings.file != previous.file:
        handler = (
            logging.FileHandler(settings.file, encoding="utf-8")
            if settings.file
            else logging.StreamHandler(sys.stderr)
        )
    if settings.format == "json":
        handler.setFormatter(JsonFormatter(_process.fixed or {}))
    elif settings.format == "ISO8601":
        handler.setFormatter(_Iso8601Formatter(_process.label))
    else:
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s %(levelname)s [{_process.label}] %(name)s: %(message)s")
        )
    handler.filters[:] = [_Switches(settings)]
    root.handlers[:] = [handler]
    root.setLevel(settings.level())
    for listener in list(_listeners):
        listener(settings)


def current() -> LogSettings:
    """The settings this process logs with."""
    return _process.settings


def listen(listener: Callable[[LogSettings], None]) -> None:
    """Call ``listener`` with the settings each time they change."""
    _listeners.append(listener)
