"""Error codes as the KServe frontends report them: Triton's HTTP and gRPC status codes.

The message is always the broker's own, word for word as a zmq client reads it; only the
code is translated, the way Triton's ``HttpCodeFromError`` (``wire.errors.HTTP_STATUS``, shared
with the Ray Serve adapter) and ``GrpcStatusUtil`` do.  A queue timeout is UNAVAILABLE, as in
Triton ("Request timeout expired"); ``TIMEOUT``, inferpool's own code (a wait that ran out),
is 503 / DEADLINE_EXCEEDED.
"""

from __future__ import annotations

import grpc

from inferpool.wire.errors import HTTP_STATUS, Code

__all__ = ["GRPC_STATUS", "HTTP_STATUS"]

GRPC_STATUS = {
    Code.UNKNOWN: grpc.StatusCode.UNKNOWN,
    Code.INTERNAL: grpc.StatusCode.INTERNAL,
    Code.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Code.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    Code.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Code.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    Code.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    Code.CANCELLED: grpc.StatusCode.CANCELLED,
    Code.TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
}
