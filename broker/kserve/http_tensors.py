"""An HTTP inference's tensors in and out: the body read into the frontends' input region,
the answer written from where the outputs lie.

A body whose binary tensors are large (``PLACE_MIN``), whose size is declared and that is not
compressed is read straight into a block of the input region (``kserve.input_region``): its JSON
header is parsed from the first bytes, its tensors stay where they landed and the request
names them (``placed``).  Any other body is read whole and its tensors travel in frames.
A large answer is written in pieces of ``WRITE_PIECE`` bytes, each once the socket took the
last, from the output region it lies in: what the kernel does not take at once is copied
into the transport's buffer, so a piece is all that is ever copied.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from inferpool.broker.kserve.bodies import BodyLimits
from inferpool.broker.kserve.http_infer import InferCall, parse_body, parse_request
from inferpool.broker.kserve.input_region import PLACE_MIN, Inputs
from inferpool.shm.arena import Slot
from inferpool.wire.errors import invalid_arg

log = logging.getLogger("inferpool.kserve")
HEADER_LENGTH = "Inference-Header-Content-Length"
BINARY = "application/octet-stream"
WRITE_PIECE = 256 * 1024


async def receive(
    request: web.Request, bodies: BodyLimits, inputs: Inputs, model: str, version: str
) -> tuple[InferCall, list[Any], Slot | None]:
    """The request, the frames it sends and the input block it holds (None: none), which
    the caller frees once the broker has answered."""
    header_length = _header_length(request)
    slot = _slot(request, header_length, bodies, inputs)
    if slot is None:
        body = await bodies.read(request)
        if header_length is not None and not 0 <= header_length <= len(body):
            raise invalid_arg(
                f"inference header size should be in range (0, {len(body)}), got: {header_length}"
            )
        call = parse_body(body, header_length, model, version)
        return call, call.frames, None
    try:
        assert header_length is not None
        binary = inputs.view(slot)
        head = await bodies.read_into(request, header_length, binary)
        call = parse_request(head, binary, model, version)
    except BaseException:
        inputs.free(slot)
        raise
    frames: list[Any] = []
    placed: list[list[int] | None] = []
    for frame, at in zip(call.frames, call.at, strict=True):
        if at is None:
            placed.append(None)
            frames.append(frame)
        else:
            placed.append([slot.offset + at, len(frame)])
    call.header["placed"] = placed
    return call, frames, slot


def _header_length(request: web.Request) -> int | None:
    """The request's ``Inference-Header-Content-Length``, if it has one."""
    length = request.headers.get(HEADER_LENGTH)
    if length is None:
        return None
    try:
        return int(length)
    except ValueError:
        raise invalid_arg(f"Unable to parse {HEADER_LENGTH}, got: {length}") from None


def _slot(
    request: web.Request, header_length: int | None, bodies: BodyLimits, inputs: Inputs
) -> Slot | None:
    """A block for the request's binary tensors when they can be read into one; None
    otherwise (the region has no room, or the body is small, chunked or compressed)."""
    total = request.content_length
    if header_length is None or total is None or request.headers.get("Content-Encoding"):
        return None
    if (
        total > bodies.max_size
        or not 0 <= header_length <= total
        or total - header_length < PLACE_MIN
    ):
        return None
    return inputs.take(total - header_length)


async def stream(
    request: web.Request, head: bytes, binaries: list[Any], headers: dict[str, str]
) -> web.StreamResponse:
    """Write the JSON ``head`` and the ``binaries`` after it, in pieces."""
    response = web.StreamResponse(headers=headers)
    response.content_type = BINARY
    response.content_length = len(head) + sum(len(b) for b in binaries)
    try:
        await response.prepare(request)
        await response.write(head)
        for tensor in binaries:
            view = memoryview(tensor).cast("B")
            for start in range(0, len(view), WRITE_PIECE):
                await response.write(view[start : start + WRITE_PIECE])
        await response.write_eof()
    except ConnectionError as exc:
        # The client went away.  The error's traceback holds the frames of the writes,
        # and so the tensors and the output memory they lie in (the caller's share of
        # it), in a cycle only a garbage collection would end: drop it, they go now.
        exc.__traceback__ = None
        log.info("HTTP client %s went away before reading its response", request.remote)
    return response
