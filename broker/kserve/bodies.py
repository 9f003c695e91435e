"""How much request-body memory the HTTP frontend holds, and for how long.

A request's body is read in full before the request goes on (the binary extension's header
length points into it), so a client that sends slowly holds the frontend's memory.  Three
limits bound that, each with its flag:

- one body's size (``--http-max-input-size``, Triton's flag): 413 beyond it, before any of
  it is read when its Content-Length says so;
- the time a body may take once the request's headers are in (``--http-body-timeout``):
  408, and what arrived is dropped;
- the bytes all bodies being received hold together (``--http-body-budget``): a body that
  would pass it is refused with 503 at once, by its Content-Length, or as soon as its chunks
  pass it; the others go on.

The headers' own time is aiohttp's keep-alive timeout (``--http-header-timeout``): a
connection that has not sent a whole request's headers within it, at its start or after its
last response, is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiohttp import web

from inferpool.wire.errors import Code, InferpoolError, invalid_arg

if sys.version_info >= (3, 11):
    from asyncio import timeout
else:  # aiohttp's own dependency before Python 3.11
    from async_timeout import timeout


@dataclass
class BodyLimits:
    """The HTTP frontend's limits on request bodies: size, time, and the bytes all of them hold."""

    max_size: int  # bytes one body may have
    timeout: float  # seconds a body may take to arrive in full
    budget: int  # bytes all bodies being received may hold together
    held: int = 0  # what they hold now

    async def read(self, request: web.Request, limit: int = 0) -> bytes:
        """The whole body of ``request`` (``limit``: a smaller size for this route): the
        chunks as they came off the socket, joined once (aiohttp's ``read`` copies twice)."""
        limit = min(limit or self.max_size, self.max_size)
        declared = request.content_length
        if declared is not None and declared > limit:
            raise self._too_large(limit, declared)
        reserved = 0
        try:
            if declared:
                reserved = self._take(0, declared)
            chunks = []
            size = 0
            # a body that came whole with its headers has nothing to wait for: no timer (an
            # asyncio timeout costs about 17 us a request on uvloop)
            whole = request.content.is_eof()
            async with contextlib.nullcontext() if whole else self._in_time():
                while chunk := await request.content.readany():
                    size += len(chunk)
                    if size > limit:
                        raise self._too_large(limit, size)
                    if size > reserved:
                        reserved = self._take(reserved, size)
                    chunks.append(chunk)
        finally:
            self.held -= reserved
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def read_into(self, request: web.Request, head: int, binary: memoryview) -> bytes:
        """A body of exactly ``head + len(binary)`` bytes (its Content-Length, within the
        limits): its first ``head`` bytes are returned, and the rest is copied into ``binary``
        chunk by chunk as it comes off the socket (nothing is joined)."""
        reserved = self._take(0, head + len(binary))
        first = bytearray()
        at = 0
        try:
            async with self._in_time():
                while chunk := await request.content.readany():
                    data = memoryview(chunk)
                    if len(first) < head:
                        take = min(head - len(first), len(data))
                        first += data[:take]
                        data = data[take:]
                    if at + len(data) > len(binary):
                        raise invalid_arg("the request body is longer than its Content-Length")
                    binary[at : at + len(data)] = data
                    at += len(data)
        finally:
            self.held -= reserved
        if len(first) < head or at < len(binary):
            raise invalid_arg("the request body ended before its Content-Length")
        return bytes(first)

    @contextlib.asynccontextmanager
    async def _in_time(self) -> AsyncIterator[None]:
        """A body's reading, which must end within the timeout (408 otherwise)."""
        try:
            async with timeout(self.timeout):
                yield
        except asyncio.TimeoutError:  # (TimeoutError itself from Python 3.11)
            raise web.HTTPRequestTimeout(
                text=f"the request body did not arrive within {self.timeout:g}s "
                "(--http-body-timeout)"
            ) from None

    def _too_large(self, limit: int, size: int) -> web.HTTPRequestEntityTooLarge:
        flag = " (--http-max-input-size)" if limit == self.max_size else ""
        return web.HTTPRequestEntityTooLarge(
            max_size=limit,
            actual_size=size,
            text=f"the request body of {size} bytes or more is larger than the limit of "
            f"{limit} bytes{flag}",
        )

    def _take(self, reserved: int, size: int) -> int:
        """Grow a body's reservation from ``reserved`` to ``size`` bytes (UNAVAILABLE if the
        budget cannot hold it); the reservation now."""
        more = size - reserved
        if self.held + more > self.budget:
            raise InferpoolError(
                Code.UNAVAILABLE,
                f"the HTTP frontend is receiving {self.held} bytes of request bodies; "
                f"{more} more would pass its budget of {self.budget} (--http-body-budget): "
                "retry",
            )
        self.held += more
        return size
