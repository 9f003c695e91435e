"""The gRPC frontend's method handlers: tritonclient's, with a malformed message refused by
name.

gRPC reads each message with the method's protobuf parser before the servicer sees it; a
parser that raises ends the call with ``UNKNOWN: Unexpected <class DecodeError>`` (and ends
a stream with OK).  Here each parser hands over a :class:`Malformed` instead: a unary call
is answered ``INVALID_ARGUMENT`` naming the method and the parser's words, and
``ModelStreamInfer`` answers the bad message in the stream and goes on (the servicer
checks for it).

``ModelInfer`` and ``ModelStreamInfer`` read their requests with ``grpc_wire.read_infer``
(the raw inputs as views of the message received) and send the bytes their servicer
methods serialize.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc.service_pb2_grpc import add_GRPCInferenceServiceServicer_to_server

from inferpool.broker.kserve.grpc_wire import read_infer

SERVICE = "inference.GRPCInferenceService"
AT_THE_WIRE = ("ModelInfer", "ModelStreamInfer")  # requests read, answers sent as bytes


class Malformed(NamedTuple):
    """A message its method's parser refused."""

    method: str
    error: str

    @property
    def message(self) -> str:
        return f"malformed {self.method} message: {self.error or 'it is not a protobuf message'}"


class _Collect:
    """Takes the handlers tritonclient's generated code would add to a server."""

    def __init__(self) -> None:
        self.handlers: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass  # the same handlers come again by name below

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.handlers.update(handlers)


def method_handlers(servicer: Any) -> dict[str, Any]:
    """The service's handlers by method name, each parser lenient (``Malformed``) and each
    unary method refusing a Malformed with INVALID_ARGUMENT."""
    collect = _Collect()
    add_GRPCInferenceServiceServicer_to_server(servicer, collect)
    handlers = {}
    for name, handler in collect.handlers.items():
        if name in AT_THE_WIRE:
            handler = handler._replace(request_deserializer=read_infer, response_serializer=None)
        handler = handler._replace(
            request_deserializer=_lenient(name, handler.request_deserializer)
        )
        if handler.unary_unary is not None:
            handler = handler._replace(unary_unary=_refusing(handler.unary_unary))
        handlers[name] = handler
    return handlers


def add_to_server(servicer: Any, server: Any) -> None:
    """Serve ``servicer``'s methods on ``server`` with the lenient request parsers."""
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, method_handlers(servicer)),)
    )


def _lenient(method: str, parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError as exc:
            return Malformed(method, str(exc))

    return deserialize


def _refusing(behavior: Callable[..., Any]) -> Callable[..., Any]:
    async def call(request: Any, context: Any) -> Any:
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        return await behavior(request, context)

    return call
