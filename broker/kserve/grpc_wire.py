"""``ModelInferRequest`` and ``ModelInferResponse`` at the protobuf wire format, so a tensor's
bytes are copied once on each side of the gRPC frontend.

A request's ``raw_input_contents`` entries (field 7) are read as views of the received
message, and the rest of the message (names, shapes, parameters: small) is parsed by
protobuf.  Only the top level is read here: a tag, then a varint, 8 or 4 bytes, or a
length and that many bytes.  A message this reader does not take apart plainly (a group,
a truncated field, a varint over 10 bytes, more than ``MAX_FIELDS`` fields) is parsed whole
by protobuf, which refuses what
is not a protobuf message with its ``DecodeError``; any other field is protobuf's to check.

An answer is serialized by protobuf without its raw outputs, and each raw output (field
6) is appended to it: the tensor is copied once, into the bytes gRPC sends.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from tritonclient.grpc import service_pb2 as pb

RAW_INPUT = 7  # ModelInferRequest.raw_input_contents
RAW_OUTPUT = 6  # ModelInferResponse.raw_output_contents
STREAMED = 2  # ModelStreamInferResponse.infer_response
_LEN = 2  # the wire type of a length-delimited field
_FIXED = {1: 8, 5: 4}  # wire type -> bytes (fixed64, fixed32)
_MAX_VARINT = 10
# top-level fields read here at most (a request has a few per input): a message with more is
# parsed by protobuf, at its speed, and a flood of tiny fields never makes a view of each
MAX_FIELDS = 1024


class InferCall(NamedTuple):
    """A ``ModelInferRequest``: its fields but the raw inputs, and the raw inputs as views
    of the message received, in order."""

    request: pb.ModelInferRequest
    raw: list[memoryview]


class _Unusual(Exception):
    """The message is not taken apart here: protobuf parses it whole."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and where the next field starts."""
    value = shift = 0
    end = min(len(data), pos + _MAX_VARINT)
    while pos < end:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise _Unusual


def read_infer(data: bytes) -> InferCall:
    """``data`` (a serialized ``ModelInferRequest``) with its raw inputs as views; raises
    protobuf's ``DecodeError`` when it is not a protobuf message."""
    view = memoryview(data)
    raw: list[memoryview] = []
    kept: list[memoryview] = []  # the other fields, in order
    start = pos = 0
    end = len(data)
    fields = 0
    try:
        while pos < end:
            fields += 1
            if fields > MAX_FIELDS:
                raise _Unusual
            at = pos
            key, pos = _varint(data, pos)
            number, kind = key >> 3, key & 7
            if kind == _LEN:
                size, pos = _varint(data, pos)
                if size > end - pos:
                    raise _Unusual
                if number == RAW_INPUT:
                    kept.append(view[start:at])
                    raw.append(view[pos : pos + size])
                    start = pos + size
                pos += size
            elif kind == 0:
                _, pos = _varint(data, pos)
            elif kind in _FIXED and _FIXED[kind] <= end - pos:
                pos += _FIXED[kind]
            else:
                raise _Unusual
    except _Unusual:
        request = pb.ModelInferRequest.FromString(data)
        return InferCall(request, [memoryview(b) for b in request.raw_input_contents])
    if not raw:
        return InferCall(pb.ModelInferRequest.FromString(data), raw)
    kept.append(view[start:])
    return InferCall(pb.ModelInferRequest.FromString(b"".join(kept)), raw)


def _key(number: int) -> bytes:
    return _encode_varint(number << 3 | _LEN)


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_RAW_OUTPUT_KEY = _key(RAW_OUTPUT)
_STREAMED_KEY = _key(STREAMED)


def answer_bytes(
    response: pb.ModelInferResponse, raw: Sequence[Any], streamed: bool = False
) -> bytes:
    """``response`` (without raw outputs) serialized with ``raw`` as its
    ``raw_output_contents``, each copied once; ``streamed``: as the ``infer_response`` of a
    ``ModelStreamInferResponse``."""
    parts: list[Any] = [response.SerializeToString()]
    size = len(parts[0])
    for tensor in raw:
        nbytes = memoryview(tensor).nbytes
        head = _RAW_OUTPUT_KEY + _encode_varint(nbytes)
        parts += (head, tensor)
        size += len(head) + nbytes
    if streamed:
        parts.insert(0, _STREAMED_KEY + _encode_varint(size))
    return b"".join(parts)
