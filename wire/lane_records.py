"""A lane's request records, byte by byte: what a client writes into its slots, and the
tensor entries requests and responses share (PROTOCOL.md; the region's layout is
wire/lane_region.py, the responses wire/lane_responses.py).

Everything is little-endian and struct-packed.  A stream of like records is the common case
(the same body again), so ``RequestReader`` remembers the last record's struct and unpacks a
record of the same lengths in one call; it is held to ``read_request`` byte for byte
(tests/unit/test_lane_records.py).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from inferpool.wire.lane_region import (
    FLAG_CANCELLED,
    FLAGS_AT,
    PLACED,
    LaneRequest,
    Tensor,
)

# a request: id, sent (the client's CLOCK_MONOTONIC ns), flags, inputs, outputs, releases,
# the body's length (its inputs and outputs: what stays the same from one run to the next)
_REQUEST_HEAD = struct.Struct("<QQIHHH2xI")
_TENSOR = struct.Struct("<HBB4xQQ")  # index, datatype, ndim, offset, byte_size (+ ndim dims)
_AFTER = struct.Struct("<IIII")  # sibling lane, response number, inputs (a bit mask), zero
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
# A NamedTuple built from a tuple by tuple.__new__ skips its Python-level __new__ (a third
# of the cost): the readers make one or more per request.
make = tuple.__new__


# ---------------------------------------------------------------------------- tensors
@functools.cache
def tensor_struct(ndim: int) -> struct.Struct:
    """The struct of a whole tensor entry of ``ndim`` dimensions (a u8: at most 255, each
    made once): one pack or unpack per entry."""
    return struct.Struct(f"{_TENSOR.format}{ndim}q")


def pack_tensors(tensors: Sequence[Tensor]) -> bytes:
    """Tensor entries: index, datatype, ndim, offset, byte size, then the dimensions."""
    return b"".join(
        tensor_struct(len(t.shape)).pack(
            t.position, t.datatype, len(t.shape), t.offset, t.byte_size, *t.shape
        )
        for t in tensors
    )


def read_tensors(buf: Any, pos: int, count: int, end: int) -> tuple[list[Tensor], int]:
    """``count`` tensor entries from ``pos``, and where they end; ValueError past ``end``."""
    tensors = []
    step = _TENSOR.size
    for _ in range(count):
        if pos + step > end:
            raise ValueError("tensor entries run past the slot")
        entry = tensor_struct(buf[pos + 3])  # the entry's ndim byte
        if pos + entry.size > end:
            raise ValueError("tensor dimensions run past the slot")
        v = entry.unpack_from(buf, pos)  # index, datatype, ndim, offset, byte_size, dims
        pos += entry.size
        tensors.append(make(Tensor, (v[0], v[1], v[3], v[4], v[5:])))
    return tensors, pos


@functools.cache
def _releases(count: int) -> struct.Struct:
    """The struct of ``count`` release tokens (at most a slot's worth: made once each)."""
    return struct.Struct(f"<{count}Q")


def pad(n: int) -> int:
    """``n`` rounded up to a multiple of 8."""
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
        return body.ljust(pad(len(body)), b"\0")
    marked = [i | PLACED if i in windows else i for i in outputs]
    body = pack_tensors(inputs) + struct.pack(f"<{len(marked)}H", *marked)
    placed = [v for i in outputs if i in windows for v in windows[i]]
    return body.ljust(pad(len(body)), b"\0") + struct.pack(f"<{len(placed)}Q", *placed)


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
    return make(After, _AFTER.unpack_from(buf, pos)[:3])


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
    return make(LaneRequest, (request_id, sent_ns, flags, n_inputs, n_outputs, body, releases))


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
                return make(LaneRequest, (v[0], v[1], v[2], v[3], v[4], v[7], list(v[8:])))
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
    inputs, pos = read_tensors(body, 0, n_inputs, len(body))
    if pos + 2 * n_outputs > len(body):
        raise ValueError("output indices run past the request")
    marked = struct.unpack_from(f"<{n_outputs}H", body, pos)
    placed = [i & ~PLACED for i in marked if i & PLACED]
    if not placed:
        return inputs, list(marked), {}
    pos = pad(pos + 2 * n_outputs)
    if pos + 16 * len(placed) > len(body):
        raise ValueError("output windows run past the request")
    spans = struct.unpack_from(f"<{2 * len(placed)}Q", body, pos)
    windows = {i: (spans[2 * k], spans[2 * k + 1]) for k, i in enumerate(placed)}
    if len(windows) != len(placed):
        raise ValueError("an output is given more than one window")
    return inputs, [i & ~PLACED for i in marked], windows
