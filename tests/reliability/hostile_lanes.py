"""Hypothesis strategies for hostile lanes: ``open_lane`` and ``close_lane`` messages with one
defect each (tests/reliability/hostile.py's way), and request records a client writes into
its lane's slots, structured with hostile fields or random bytes.
"""

from __future__ import annotations

import os
import struct
from typing import Any

from hypothesis import strategies as st

from inferpool.wire import lane_region as wl
from tests.reliability.hostile import _message, json_values
from tests.reliability.support import Message

INPUTS = "inputs"  # the server-made input region each batch creates first


def create_inputs() -> Message:
    header = {"type": "create_shared_memory_region", "name": INPUTS, "byte_size": 4096}
    return _message(header, [], "ok")


def _open(**fields: Any) -> dict[str, Any]:
    header: dict[str, Any] = {"type": "open_lane", "model_name": "identity"}
    header["input_region"], header["pid"] = INPUTS, os.getpid()
    header.update(fields)
    return header


def _valid_pid(v: Any) -> bool:
    return type(v) is int and 0 < v <= wl.MAX_PID


huge_ints = st.integers(min_value=-(2**70), max_value=2**70)
any_value = st.one_of(json_values, huge_ints)
# for each field of open_lane: values that must be refused
_BAD = {
    "model_name": any_value.filter(lambda v: v != "identity"),
    "model_version": any_value.filter(lambda v: v not in ("", "1", 1, -1, "-1", None, 0)),
    "pid": any_value.filter(lambda v: not _valid_pid(v)),
    "spin_us": any_value.filter(lambda v: not (type(v) is int and v >= 0)),
    "slots": any_value.filter(lambda v: not (type(v) is int and 1 <= v <= wl.MAX_SLOTS)),
    "input_region": any_value.filter(lambda v: v != INPUTS),
    "protocol": any_value.filter(lambda v: v != 1),
}


@st.composite
def lane_controls(draw: st.DrawFn) -> Message:
    """An open_lane with one hostile field, one whose field may be valid by chance
    (``steps`` on a model that is no ensemble: any reply), or a close_lane of a lane that
    is not this client's or with a hostile field."""
    kind = draw(st.sampled_from([*_BAD, "steps", "close", "close_release"]))
    if kind in _BAD:
        return _message(_open(**{kind: draw(_BAD[kind])}), [])
    if kind == "steps":
        return _message(_open(steps=draw(any_value)), [], "any")
    if kind == "close":
        lane = draw(any_value)
        return _message({"type": "close_lane", "lane": lane}, [], "any")
    release = draw(any_value.filter(lambda v: not isinstance(v, list) or v))
    return _message({"type": "close_lane", "lane": 2**40, "release": release}, [])


_TENSOR = struct.Struct("<HBB4xQQ")
_HEAD = struct.Struct("<QQIHHH2xI")
u16 = st.integers(0, 2**16 - 1)
u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def tensor_entries(draw: st.DrawFn) -> bytes:
    """A tensor entry with any index, datatype, offset, size and dimensions."""
    dims = draw(st.lists(st.one_of(i64, st.integers(-3, 8)), max_size=6))
    ndim = draw(st.one_of(st.just(len(dims)), st.integers(0, 255)))
    position = draw(st.one_of(st.integers(0, 2), u16))
    datatype = draw(st.one_of(st.sampled_from(list(wl.DATATYPES.values())), st.integers(0, 255)))
    offset = draw(st.one_of(st.integers(0, 8192), u64))
    size = draw(st.one_of(st.integers(0, 64), u64))
    entry = _TENSOR.pack(position, datatype, ndim, offset, size)
    return entry + b"".join(struct.pack("<q", d) for d in dims)


@st.composite
def lane_records(draw: st.DrawFn) -> bytes:
    """A request record (its head, body and releases) with hostile fields, or random
    bytes; at most a slot of the default geometry."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=wl.SLOT_SIZE))
    entries = draw(st.lists(tensor_entries(), max_size=3))
    outputs = draw(st.lists(st.one_of(st.integers(0, 2), u16), max_size=4))
    body = b"".join(entries) + struct.pack(f"<{len(outputs)}H", *outputs)
    body += draw(st.binary(max_size=48))  # windows, padding, or junk
    n_inputs = draw(st.one_of(st.just(len(entries)), u16))
    n_outputs = draw(st.one_of(st.just(len(outputs)), u16))
    releases = draw(st.lists(u64, max_size=4))
    n_release = draw(st.one_of(st.just(len(releases)), u16))
    body_len = draw(st.one_of(st.just(len(body)), st.integers(0, 2**32 - 1)))
    flags = draw(st.one_of(st.sampled_from([0, 1, 2, 4, 7]), st.integers(0, 2**32 - 1)))
    head = _HEAD.pack(draw(u64), draw(u64), flags, n_inputs, n_outputs, n_release, body_len)
    record = head + body + struct.pack(f"<{len(releases)}Q", *releases)
    return record[: wl.SLOT_SIZE]
