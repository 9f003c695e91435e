"""Log lines of the broker and its workers, as text or as JSON (``--log-format``).

The broker chooses the level and format; every worker gets them in its spec, so one run's
log reads the same throughout.  A JSON line carries the time, level, logger and message,
the process (``broker``, or the worker's instance and model), and whatever a record was
given as ``extra`` among :data:`FIELDS` (``request_id``, ``model``, ...), so a log store can
follow one request or one model.  Standard library only: workers set this up before they
are pinned.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMATS = ("text", "json")
# taken from a record's ``extra`` (``source``: a C backend's file and line)
FIELDS = ("request_id", "model", "version", "instance", "source")


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


def configure(level: str, fmt: str, label: str, fixed: Mapping[str, Any]) -> None:
    """Log to stderr at ``level``: text lines tagged ``[label]``, or JSON with ``fixed``."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(fixed))
    else:
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s %(levelname)s [{label}] %(name)s: %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level if level in LEVELS else "INFO")
