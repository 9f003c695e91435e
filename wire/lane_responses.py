"""A lane's response records, byte by byte: what a worker writes back into its slots
(PROTOCOL.md; the requests and the tensor entries are wire/lane_records.py).

A backend answers a stream of like requests alike, so the writer and the parameters' packer
remember what they wrote last: ``ResponseWriter`` copies the last response's bytes when only
the id differs, ``pack_parameters`` reuses what it packed for the same parameters.  Each is
held to the plain functions byte for byte (tests/unit/test_lane_records.py).
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from inferpool.wire.lane_records import make, pad, read_tensors, tensor_struct
from inferpool.wire.lane_region import LaneResponse

# a response: id, status, outputs, parameters, error length, parameters' length
_RESPONSE_HEAD = struct.Struct("<QIHHH2xI")
_U64 = struct.Struct("<Q")
_PARAM = struct.Struct("<BxHI")  # kind, key length, value length (+ key, value, padding)
_KINDS = {str: 0, int: 1, bool: 2, float: 3}
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")


# A backend tends to answer with the same parameters every time: both ends remember what the
# last few encoded to (keyed with the values' types: True == 1, but not on the wire).
_packed: dict[tuple[Any, ...], bytes] = {}
_unpacked: dict[bytes, dict[str, Any]] = {}
_last_packed: tuple[Any, ...] = ()  # the last parameters packed: a dict, its keys, types, bytes
_REMEMBERED = 16


def pack_parameters(params: Mapping[str, Any]) -> bytes:
    """Response parameters: kind (0 str, 1 int, 2 bool, 3 float), key, value, padded to 8."""
    global _last_packed
    last = _last_packed  # one tuple, replaced whole: lane threads pack at the same time
    types = tuple(map(type, params.values()))
    floats = float in types  # equal floats may differ (0.0, -0.0): known by their bits
    if (  # the same as the last ones: values of the same types (then == is safe), equal, and
        last  # their keys in the same order
        and not floats
        and types == last[2]
        and params == last[0]
        and tuple(params) == last[1]
    ):
        return last[3]
    key = (*params.items(), *types, *(_float_bits(params.values()) if floats else ()))
    try:
        packed = _packed[key]
    except (KeyError, TypeError):  # TypeError: a value that cannot be a key is refused below
        pass
    else:
        _last_packed = (dict(params), tuple(params), types, packed)
        return packed
    out = bytearray()
    for name, value in params.items():
        kind = _KINDS.get(type(value))
        if kind is None:
            raise ValueError(f"response parameter '{name}' is a {type(value).__name__}")
        if kind == 0:
            raw = value.encode()
        elif kind == 1:
            raw = _I64.pack(value)
        elif kind == 2:
            raw = b"\1" if value else b"\0"
        else:
            raw = _F64.pack(value)
        label = name.encode()
        entry = _PARAM.pack(kind, len(label), len(raw)) + label + raw
        out += entry.ljust(pad(len(entry)), b"\0")
    if len(_packed) >= _REMEMBERED:
        _packed.clear()
    _packed[key] = packed = bytes(out)
    _last_packed = (dict(params), tuple(params), types, packed)
    return packed


def _float_bits(values: Iterable[Any]) -> tuple[bytes, ...]:
    """The bits of the floats among ``values``: what tells equal floats apart."""
    return tuple(_F64.pack(v) for v in values if type(v) is float)


def unpack_parameters(raw: bytes, count: int) -> dict[str, Any]:
    """The parameters ``pack_parameters`` wrote (a new dict each time); ValueError if they
    do not fit ``raw``."""
    known = _unpacked.get(raw)
    if known is not None:
        return dict(known)
    params: dict[str, Any] = {}
    pos, end = 0, len(raw)
    for _ in range(count):
        if pos + _PARAM.size > end:
            raise ValueError("response parameters run past the slot")
        kind, key_len, value_len = _PARAM.unpack_from(raw, pos)
        start = pos + _PARAM.size
        if start + key_len + value_len > end:
            raise ValueError("response parameters run past the slot")
        key = raw[start : start + key_len].decode()
        value = raw[start + key_len : start + key_len + value_len]
        if kind == 0:
            params[key] = value.decode()
        elif kind == 1:
            params[key] = _I64.unpack(value)[0]
        elif kind == 2:
            params[key] = value != b"\0"
        else:
            params[key] = _F64.unpack(value)[0]
        pos = pad(start + key_len + value_len)
    if len(_unpacked) >= _REMEMBERED:
        _unpacked.clear()
    _unpacked[raw] = params
    return dict(params)


def write_response(
    buf: Any,
    at: int,
    slot_size: int,
    request_id: int,
    outputs: Sequence[tuple[int, int, int, int, tuple[int, ...]]],
    parameters: Mapping[str, Any] | None,
    status: int = 0,
    error: str = "",
) -> int:
    """Fill the response slot at ``at``; the record's size.  ValueError if it does not fit."""
    params = pack_parameters(parameters) if parameters else b""
    message = error.encode() if error else b""
    pos = at + _RESPONSE_HEAD.size
    end = at + slot_size
    for position, datatype, offset, byte_size, shape in outputs:  # Tensors, or their tuples
        ndim = len(shape)  # straight into the slot: nothing is read before the bell rings
        entry = tensor_struct(ndim)
        if pos + entry.size > end:
            raise ValueError(f"the outputs do not fit a {slot_size}-byte lane slot")
        entry.pack_into(buf, pos, position, datatype, ndim, offset, byte_size, *shape)
        pos += entry.size
    size = pos - at + len(params) + len(message)
    if size > slot_size:
        raise ValueError(f"a response of {size} bytes does not fit a {slot_size}-byte lane slot")
    n_params = len(parameters) if parameters else 0
    _RESPONSE_HEAD.pack_into(
        buf, at, request_id, status, len(outputs), n_params, len(message), len(params)
    )
    if params or message:
        buf[pos : at + size] = params + message
    return size


class ResponseWriter:
    """Writes the response records of one lane's slots in ``buf``.  A backend answers a
    stream of like requests alike: a record equal to the last one written but for its id
    (the same outputs in the same places, parameters equal, with the same keys in the same
    order and values of the same types) is the last one's bytes, copied whole.  A backend
    that answers with the same parameter objects each time is known by their identity."""

    __slots__ = ("_last", "buf", "slot_size")

    def __init__(self, buf: Any, slot_size: int) -> None:
        self.buf = buf
        self.slot_size = slot_size
        # the last success written: its outputs, its parameters' keys and values, its bytes
        self._last: tuple[Any, tuple[Any, ...], tuple[Any, ...], bytes] = (None, (), (), b"")

    def write(
        self,
        at: int,
        request_id: int,
        outputs: Sequence[tuple[int, int, int, int, tuple[int, ...]]],
        parameters: Mapping[str, Any] | None,
    ) -> None:
        """A success into the slot at ``at`` (``write_response``'s ValueError if it does not
        fit)."""
        last_outputs, keys, values, record = self._last
        buf = self.buf
        if outputs == last_outputs and (
            _same(parameters, keys, values) if parameters else not keys
        ):
            _U64.pack_into(buf, at, request_id)
            buf[at + 8 : at + 8 + len(record)] = record
            return
        size = write_response(buf, at, self.slot_size, request_id, outputs, parameters)
        keys, values = (tuple(parameters), tuple(parameters.values())) if parameters else ((), ())
        self._last = (list(outputs), keys, values, bytes(buf[at + 8 : at + size]))


def _same(parameters: Mapping[str, Any], keys: tuple[Any, ...], values: tuple[Any, ...]) -> bool:
    """Whether ``parameters`` are ``keys`` and ``values`` (str, int, bool, float: immutable),
    in that order: the very objects, or equal values of the same types (True == 1) and, for
    floats, the same bits (0.0 == -0.0)."""
    if len(parameters) != len(keys):
        return False
    if not all(map(operator.is_, parameters.values(), values)):
        now = tuple(parameters.values())
        types = tuple(map(type, now))
        if types != tuple(map(type, values)) or now != values:
            return False
        if float in types and _float_bits(now) != _float_bits(values):
            return False  # equal, but not alike: 0.0 and -0.0
    return tuple(parameters) == keys


def read_response(buf: Any, at: int, slot_size: int) -> LaneResponse:
    """The response in the slot at ``at``; ValueError if it does not fit its slot."""
    head = _RESPONSE_HEAD.unpack_from(buf, at)
    request_id, status, n_outputs, n_params, error_len, params_len = head
    end = at + slot_size
    outputs, pos = read_tensors(buf, at + _RESPONSE_HEAD.size, n_outputs, end)
    if pos + params_len + error_len > end:
        raise ValueError("the response runs past its slot")
    params = unpack_parameters(bytes(buf[pos : pos + params_len]), n_params) if n_params else {}
    pos += params_len
    error = bytes(buf[pos : pos + error_len]).decode(errors="replace") if error_len else ""
    size = pos + error_len - at
    return make(LaneResponse, (request_id, status, outputs, params, error, size))
