"""Error codes as the KServe frontends report them: Triton's HTTP and gRPC status codes.

The message is always the broker's own, word for word as a zmq client reads it; only the
code is translated, the way Triton's ``HttpCodeFromError`` and ``GrpcStatusUtil`` do.  A
queue timeout is UNAVAILABLE, as in Triton ("Request timeout expired"); ``TIMEOUT``,
inferpool's own code (a wait that ran out), is 503 / DEADLINE_EXCEEDED.
"""

from __future__ import annotations

import grpc

from inferpool.wire.errors import Code

HTTP_STATUS = {
    Code.UNKNOWN: 400,
    Code.INTERNAL: 500,
    Code.NOT_FOUND: 404,
    Code.INVALID_ARG: 400,
    Code.UNAVAILABLE: 503,
    Code.UNSUPPORTED: 501,
    Code.ALREADY_EXISTS: 400,
    Code.CANCELLED: 400,
    Code.TIMEOUT: 503,
}

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
