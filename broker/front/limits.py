"""The limits of one infer request, checked at admission so that no request can kill a worker.

A request reaches its worker as a ``Work`` record inside an ``Execute`` message, and a
message must fit one datagram of the worker's channel (``MAX_MESSAGE``).  So the parts of a
request that travel (its id, its parameters, its inputs' and outputs' descriptions) are
bounded here, each with an INVALID_ARG naming the limit, and every admitted request carries
its encoded size, so that the batchers close a batch before it outgrows a message
(``BATCH_BYTES``).  docs/PROTOCOL.md lists these limits.
"""

from __future__ import annotations

from typing import Any

import orjson

from inferpool.wire.errors import invalid_arg
from inferpool.wire.worker.protocol import BATCH_BYTES, Work, encoded, record_size

MAX_ID_LENGTH = 1024  # characters of a request's "id"
MAX_PARAMETERS_BYTES = 64 * 1024  # a request's "parameters", as JSON
MAX_WORK_BYTES = 128 * 1024  # the whole request as its worker receives it
assert MAX_WORK_BYTES <= BATCH_BYTES  # a request alone always makes a batch


def check_id(client_id: Any) -> str:
    """The request's id as the worker gets it; INVALID_ARG if it is not a short string or int."""
    if isinstance(client_id, bool) or not isinstance(client_id, str | int):
        raise invalid_arg(f"request 'id' must be a string or an integer, got {client_id!r:.64}")
    text = str(client_id)
    if len(text) > MAX_ID_LENGTH:
        raise invalid_arg(
            f"request 'id' is {len(text)} characters long; at most {MAX_ID_LENGTH} characters "
            "are allowed"
        )
    return text


def encode_work(work: Work, parameters: Any, model: str) -> tuple[orjson.Fragment, int]:
    """``work`` encoded, as it travels to its worker, and its size; INVALID_ARG if it, or
    the request's ``parameters`` (as the client sent them), exceed their limits."""
    wire, size = encoded(work)
    if size <= MAX_PARAMETERS_BYTES:  # neither limit can be reached: the common case
        return wire, size
    sent = record_size(parameters)
    if sent > MAX_PARAMETERS_BYTES:
        raise invalid_arg(
            f"request 'parameters' for model '{model}' are {sent} bytes as JSON; at most "
            f"{MAX_PARAMETERS_BYTES} bytes are allowed (send large data as input tensors)"
        )
    if size > MAX_WORK_BYTES:
        raise invalid_arg(
            f"request for model '{model}' is {size} bytes as its worker would receive it "
            f"(id, parameters, inputs and outputs); at most {MAX_WORK_BYTES} bytes are allowed"
        )
    return wire, size
