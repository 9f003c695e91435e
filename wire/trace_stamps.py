"""What the KServe frontends and the broker agree on to trace a request across both.

An infer message from a frontend carries its receive stamps in the field :data:`FIELD`
(Triton's timestamp name -> monotonic ns: ``HTTP_RECV_START`` / ``HTTP_RECV_END``, or
``GRPC_WAITREAD_START`` / ``GRPC_WAITREAD_END``).  If the broker traces the request, its
final answer carries the trace id in the response parameter :data:`TRACE_ID` (the frontend
takes it out: its client never sees it), and once the answer is written the frontend sends
``{"type": "trace_sent", "trace_id", "stamps"}`` with its send stamps (``HTTP_SEND_START`` /
``HTTP_SEND_END``, ``GRPC_SEND_START`` / ``GRPC_SEND_END``), which has no answer.
"""

from __future__ import annotations

from typing import Any

FIELD = "trace"
TRACE_ID = "inferpool_trace_id"
SENT = "trace_sent"
RECEIVE = {
    "HTTP": ("HTTP_RECV_START", "HTTP_RECV_END"),
    "GRPC": ("GRPC_WAITREAD_START", "GRPC_WAITREAD_END"),
}
SEND = {"HTTP": ("HTTP_SEND_START", "HTTP_SEND_END"), "GRPC": ("GRPC_SEND_START", "GRPC_SEND_END")}
NAMES = frozenset(name for pairs in (RECEIVE, SEND) for pair in pairs.values() for name in pair)


def received(kind: str, start_ns: int, end_ns: int) -> dict[str, int]:
    """The receive stamps of a request that came through frontend ``kind`` (HTTP, GRPC)."""
    start, end = RECEIVE[kind]
    return {start: start_ns, end: end_ns}


def trace_id(reply: dict[str, Any]) -> int:
    """The trace id an answer carries, taken out of it (0: the request is not traced)."""
    parameters = reply.get("parameters")
    if not parameters or TRACE_ID not in parameters:
        return 0
    found = parameters.pop(TRACE_ID)
    if not parameters:
        del reply["parameters"]
    return found if type(found) is int else 0


def sent(kind: str, trace: int, start_ns: int, end_ns: int) -> dict[str, Any]:
    """The message that brings a traced answer's send stamps to the broker."""
    start, end = SEND[kind]
    return {"type": SENT, "trace_id": trace, "stamps": {start: start_ns, end: end_ns}}
