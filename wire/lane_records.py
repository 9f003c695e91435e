"""A lane's records, byte by byte: the requests a client writes into its slots and the
responses a worker writes back (PROTOCOL.md; the region's layout is wire/lane.py).

Everything is little-endian and struct-packed.  A stream of like records is the common case
(the same body again, the same answer but for its id), so the readers and writers remember
the last record and its struct: ``RequestReader`` unpacks a record of the last one's lengths
in one call, ``ResponseWriter`` copies the last response's bytes when only the id differs,
``pack_parameters`` reuses what it packed for the same parameters.  Each is held to the
plain functions byte for byte (tests/unit/test_lane_records.py).
"""

from __future__ import annotations

import functools
import operator
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from inferpool.wire.lane import (
    FLAG_CANCELLED,
    FLAGS_AT,
    PLACED,
    LaneRequest,
    LaneResponse,
    Tensor,
)

# a request: id, sent (the client's CLOCK_MONOTONIC ns), flags, inputs, outputs, releases,
# the body's length (its inputs and outputs: what stays the same from one run to the next)
_REQUEST_HEAD = struct.Struct("<QQIHHH2xI")
# a response: id, status, outputs, parameters, error length, parameters' length
_RESPONSE_HEAD = struct.Struct("<QIHHH2xI")
_TENSOR = struct.Struct("<HBB4xQQ")  # index, datatype, ndim, offset, byte_size (+ ndim dims)
_AFTER = struct.Struct("<IIII")  # sibling lane, response number, inputs (a bit mask), zero
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_PARAM = struct.Struct("<BxHI")  # kind, key length, value length (+ key, value, padding)
_KINDS = {str: 0, int: 1, bool: 2, float: 3}
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")
# A NamedTuple built from a tuple by tuple.__new__ skips its Python-level __new__ (a third
# of the cost): the readers below make one or more per request.
_make = tuple.__new__


# ---------------------------------------------------------------------------- tensors
@functools.cache
def _entry(ndim: int) -> struct.Struct:
    """The struct of a whole tensor entry of ``ndim`` dimensions (a u8: at most 255, each
    made once): one pack or unpack per entry."""
    return struct.Struct(f"{_TENSOR.format}{ndim}q")


def pack_tensors(tensors: Sequence[Tensor]) -> bytes:
    """Tensor entries: index, datatype, ndim, offset, byte size, then the dimensions."""
    return b"".join(
        _entry(len(t.shape)).pack(
            t.position, t.datatype, len(t.shape), t.offset, t.byte_size, *t.shape
        )
        for t in tensors
    )


def _read_tensors(buf: Any, pos: int, count: int, end: int) -> tuple[list[Tensor], int]:
    tensors = []
    step = _TENSOR.size
    for _ in range(count):
        if pos + step > end:
            raise ValueError("tensor entries run past the slot")
        entry = _entry(buf[pos + 3])  # the entry's ndim byte
        if pos + entry.size > end:
            raise ValueError("tensor dimensions run past the slot")
        v = entry.unpack_from(buf, pos)  # index, datatype, ndim, offset, byte_size, dims
        pos += entry.size
        tensors.append(_make(Tensor, (v[0], v[1], v[3], v[4], v[5:])))
    return tensors, pos


@functools.cache
def _releases(count: int) -> struct.Struct:
    """The struct of ``count`` release tokens (at most a slot's worth: made once each)."""
    return struct.Struct(f"<{count}Q")


def _pad(n: int) -> int:
    return (n + 7) & ~7


# ---------------------------------------------------------------------------- requests
def pack_request_body(
    inputs: Sequence[Tensor],
    outputs: Sequence[int],
    windows: Mapping[int, tuple[int, int]] | None = None,
) -> bytes:
    """The part of a request that stays the same from one run to the next; ``windows``:
    where in the client's input region to write outputs (index -> offset, byte size)."""
    if not windows:
        body = pack_tensors(inputs) + struct.pack(f"<{len(outputs)}H", *outputs)
        return body.ljust(_pad(len(body)), b"\0")
    marked = [i | PLACED if i in windows else i for i in outputs]
    body = pack_tensors(inputs) + struct.pack(f"<{len(marked)}H", *marked)
    placed = [v for i in outputs if i in windows for v in windows[i]]
    return body.ljust(_pad(len(body)), b"\0") + struct.pack(f"<{len(placed)}Q", *placed)


def write_request(
    buf: Any,
    at: int,
    slot_size: int,
    request_id: int,
    sent_ns: int,
    flags: int,
    n_inputs: int,
    n_outputs: int,
    body: bytes,
    releases: Sequence[int],
    after: After | None = None,
) -> None:
    """Fill the request slot at ``at`` (one pack); ValueError if it does not fit.  ``after``
    (with FLAG_AFTER in ``flags``): the response the request waits for."""
    record = _request_record(len(body), len(releases))
    size = record.size + (_AFTER.size if after is not None else 0)
    if size > slot_size:
        raise ValueError(f"a request of {size} bytes does not fit a {slot_size}-byte lane slot")
    if after is not None:
        _AFTER.pack_into(buf, at + record.size, *after, 0)
    record.pack_into(
        buf,
        at,
        request_id,
        sent_ns,
        flags,
        n_inputs,
        n_outputs,
        len(releases),
        len(body),
        body,
        *releases,
    )


@functools.lru_cache(maxsize=256)
def _request_record(body_len: int, n_releases: int) -> struct.Struct:
    """The struct of a whole request record: the head, a body of ``body_len`` bytes, then
    ``n_releases`` tokens (a client sends few distinct ones: each is made once)."""
    return struct.Struct(f"{_REQUEST_HEAD.format}{body_len}s{n_releases}Q")


class After(NamedTuple):
    """What a request with FLAG_AFTER waits for: response ``n`` of the ensemble's lane
    ``sibling`` (its step's index), which is to hold, written into the client's region where
    this request reads them, the inputs whose bits ``inputs`` sets (bit i: the request's
    i-th input)."""

    sibling: int
    n: int
    inputs: int


def read_after(buf: Any, at: int, slot_size: int, req: LaneRequest) -> After:
    """The After of request ``req``, read from the slot at ``at``; ValueError if it does not
    fit the slot."""
    pos = at + _REQUEST_HEAD.size + len(req.body) + 8 * len(req.releases)
    if pos + _AFTER.size > at + slot_size:
        raise ValueError("the request's dependency runs past its slot")
    return _make(After, _AFTER.unpack_from(buf, pos)[:3])


def read_request(buf: Any, at: int, slot_size: int) -> LaneRequest:
    """The request in the slot at ``at``, copied out of shared memory (the client may write
    on); ValueError if it does not fit its slot."""
    head = _REQUEST_HEAD.unpack_from(buf, at)
    request_id, sent_ns, flags, n_inputs, n_outputs, n_release, body_len = head
    start = at + _REQUEST_HEAD.size
    end = start + body_len
    if end + 8 * n_release > at + slot_size:
        raise ValueError("the request runs past its slot")
    releases = list(_releases(n_release).unpack_from(buf, end)) if n_release else []
    body = bytes(buf[start:end])
    return _make(LaneRequest, (request_id, sent_ns, flags, n_inputs, n_outputs, body, releases))


class RequestReader:
    """Reads the request records of one lane's slots in ``buf``.  A client sends a stream of
    like requests: a record whose body and release count have the lengths of the last one
    read is unpacked whole with that one's struct (head, body, releases in one call), its
    head's lengths checked against the struct's; any other goes through ``read_request``."""

    __slots__ = ("_lengths", "_record", "buf", "slot_size")

    def __init__(self, buf: Any, slot_size: int) -> None:
        self.buf = buf
        self.slot_size = slot_size
        self._record: struct.Struct | None = None  # the last record's struct: fits a slot
        self._lengths = (-1, -1)  # its release count and body length

    def read(self, at: int) -> LaneRequest:
        """``read_request`` of the slot at ``at``."""
        record = self._record
        if record is not None:
            v = record.unpack_from(self.buf, at)
            if (v[5], v[6]) == self._lengths:
                return _make(LaneRequest, (v[0], v[1], v[2], v[3], v[4], v[7], list(v[8:])))
        req = read_request(self.buf, at, self.slot_size)
        self._record = _request_record(len(req.body), len(req.releases))
        self._lengths = (len(req.releases), len(req.body))
        return req


def cancel_request(buf: Any, at: int) -> None:
    """Mark the posted request in the slot at ``at`` cancelled (the client, while it is
    unanswered): one aligned 32-bit store, as the header's words are written."""
    with (
        memoryview(buf) as whole,
        whole[at + FLAGS_AT : at + FLAGS_AT + 4] as field,
        field.cast("I") as word,
    ):
        word[0] |= FLAG_CANCELLED


def request_cancelled(buf: Any, at: int, request_id: int) -> bool:
    """Whether request ``request_id``, posted in the slot at ``at``, has been cancelled (a
    slot taken over by a later request holds that one's id)."""
    flags = _U32.unpack_from(buf, at + FLAGS_AT)[0]
    return bool(flags & FLAG_CANCELLED) and _U64.unpack_from(buf, at)[0] == request_id


def parse_body(
    body: bytes, n_inputs: int, n_outputs: int
) -> tuple[list[Tensor], list[int], dict[int, tuple[int, int]]]:
    """A request body's inputs, wanted outputs (their indices) and the windows some of them
    are to be written into (index -> offset, byte size); ValueError if they do not fit it."""
    inputs, pos = _read_tensors(body, 0, n_inputs, len(body))
    if pos + 2 * n_outputs > len(body):
        raise ValueError("output indices run past the request")
    marked = struct.unpack_from(f"<{n_outputs}H", body, pos)
    placed = [i & ~PLACED for i in marked if i & PLACED]
    if not placed:
        return inputs, list(marked), {}
    pos = _pad(pos + 2 * n_outputs)
    if pos + 16 * len(placed) > len(body):
        raise ValueError("output windows run past the request")
    spans = struct.unpack_from(f"<{2 * len(placed)}Q", body, pos)
    windows = {i: (spans[2 * k], spans[2 * k + 1]) for k, i in enumerate(placed)}
    if len(windows) != len(placed):
        raise ValueError("an output is given more than one window")
    return inputs, [i & ~PLACED for i in marked], windows


# ---------------------------------------------------------------------------- responses
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
        out += entry.ljust(_pad(len(entry)), b"\0")
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
        pos = _pad(start + key_len + value_len)
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
        entry = _entry(ndim)
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
    outputs, pos = _read_tensors(buf, at + _RESPONSE_HEAD.size, n_outputs, end)
    if pos + params_len + error_len > end:
        raise ValueError("the response runs past its slot")
    params = unpack_parameters(bytes(buf[pos : pos + params_len]), n_params) if n_params else {}
    pos += params_len
    error = bytes(buf[pos : pos + error_len]).decode(errors="replace") if error_len else ""
    size = pos + error_len - at
    return _make(LaneResponse, (request_id, status, outputs, params, error, size))
