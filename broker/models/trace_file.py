"""Where traces are written: Triton's trace file, a JSON array of trace records.

The trace file itself (``--trace-config triton,file=``) is written as traces are collected
and is a complete JSON array after every write, so it can be read while the server runs
(Triton writes it when the setting changes or the server stops; what ends up in it is the
same).  Traces a setting keeps for its log frequency or its count go to indexed files
``<file>.0``, ``<file>.1``, ... each one JSON array.  Only the broker's loop writes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any, BinaryIO

import orjson

log = logging.getLogger("inferpool.trace")
Record = dict[str, Any]


class TraceFile:
    """A trace file and its indexed files."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.index = 0  # the next indexed file's
        self._main: BinaryIO | None = None

    def append(self, records: Iterable[Record]) -> None:
        """Add ``records`` to the trace file (made, emptied, at the first write)."""
        data = b",".join(map(orjson.dumps, records))
        if not data:
            return
        try:
            if self._main is None:
                self._main = open(self.path, "wb")  # noqa: SIM115 (open while the run lasts)
                self._main.write(b"[" + data + b"]")
            else:
                self._main.seek(-1, os.SEEK_END)  # over the closing bracket
                self._main.write(b"," + data + b"]")
            self._main.flush()
        except OSError as exc:
            log.error("cannot write the trace file %s: %s", self.path, exc.strerror or exc)

    def indexed(self, records: Iterable[Record]) -> None:
        """Write ``records`` as the next indexed file, ``<file>.<index>``."""
        name = f"{self.path}.{self.index}"
        self.index += 1
        try:
            with open(name, "wb") as f:
                f.write(b"[" + b",".join(map(orjson.dumps, records)) + b"]")
        except OSError as exc:
            log.error("cannot write the trace file %s: %s", name, exc.strerror or exc)

    def close(self) -> None:
        if self._main is not None:
            self._main.close()
            self._main = None
