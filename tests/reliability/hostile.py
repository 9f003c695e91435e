"""Hypothesis strategies for hostile messages: each is a valid request with one defect that
makes it invalid, so its reply must be an error (``Message.expect``), or raw frames.

Headers are written with the standard library's json, which writes integers of any size
(past int64) and NaN; whatever it writes the broker must refuse by name.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import orjson
from hypothesis import strategies as st

from tests.reliability.support import Message

REGION = "fuzz"  # a region the probe registers first, 4096 bytes (Fuzz.region)
REGION_BYTES = 4096
_ids = iter(range(1 << 62))

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.text(max_size=20),
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
huge_text = st.integers(min_value=70_000, max_value=400_000).map(lambda n: "x" * n)


def _infer(model: str = "identity", n: int = 4, **fields: Any) -> dict[str, Any]:
    header: dict[str, Any] = {
        "type": "infer",
        "model_name": model,
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [n]}],
    }
    header.update(fields)
    return header


def _message(header: Any, frames: list[bytes], expect: str = "error") -> Message:
    """``header`` gets a fresh id to match its reply by (if it is an object without one)."""
    ident = ""
    if isinstance(header, dict) and "id" not in header:
        ident = f"f{next(_ids)}"
        header = {**header, "id": ident}
    data = header if isinstance(header, bytes) else json.dumps(header).encode()
    try:
        orjson.loads(data)  # as the broker reads it
    except orjson.JSONDecodeError:  # NaN, an integer past 64 bits: the reply cannot echo it
        ident = ""
    return Message([b"", data, *frames], expect, ident)


def _with_input(**changes: Any) -> dict[str, Any]:
    header = _infer()
    header["inputs"][0].update(changes)
    return header


FOUR = b"\0" * 16


@st.composite
def bad_shapes(draw: st.DrawFn) -> Message:
    shape = draw(
        st.one_of(
            st.lists(st.integers(max_value=-1), min_size=1, max_size=4),  # negative
            st.lists(st.integers(min_value=2**40, max_value=2**80), min_size=1, max_size=6),
            st.lists(st.one_of(st.floats(), st.text(max_size=3), st.none()), min_size=1),
            json_values.filter(lambda v: not isinstance(v, list)),
            st.just([4, 0]),  # rank the model does not have... shape and bytes disagree
        )
    )
    return _message(_with_input(shape=shape), [FOUR])


@st.composite
def byte_counts(draw: st.DrawFn) -> Message:
    n = draw(st.integers(min_value=0, max_value=64))
    size = draw(st.integers(min_value=0, max_value=300).filter(lambda k: k != 4 * n))
    return _message(_with_input(shape=[n]), [b"\1" * size])


@st.composite
def datatypes(draw: st.DrawFn) -> Message:
    datatype = draw(
        st.one_of(json_values, st.sampled_from(["FP64", "BYTES", "fp32", ""])).filter(
            lambda v: v != "FP32"
        )
    )
    return _message(_with_input(datatype=datatype), [FOUR])


@st.composite
def lying_bytes(draw: st.DrawFn) -> Message:
    """BYTES elements whose length prefixes say more than the frame holds (or too few)."""
    count = draw(st.integers(min_value=1, max_value=5))
    elements = draw(st.lists(st.binary(max_size=8), min_size=1, max_size=count))
    frame = b"".join(struct.pack("<I", len(e)) + e for e in elements)
    lie = draw(st.integers(min_value=1, max_value=2**32 - 1))
    frame += struct.pack("<I", lie) + draw(st.binary(max_size=min(lie - 1, 16)))
    header = _infer("strings")
    header["inputs"][0].update(datatype="BYTES", shape=[count + draw(st.integers(0, 3))])
    return _message(header, [frame])


@st.composite
def shm_windows(draw: st.DrawFn) -> Message:
    """An input in the probe's registered region, or a region it never registered, out of
    bounds by offset or size (or with parameters of the wrong types)."""
    n = 4
    offset = draw(st.one_of(st.integers(min_value=-(2**70), max_value=2**70), json_values))
    size = draw(st.sampled_from([16, 2**63, 2**64 + 16, -16]))
    if type(offset) is int and 0 <= offset <= REGION_BYTES - 16 and size == 16:
        offset = REGION_BYTES - 8  # in bounds by chance (a drawn JSON value too): push it out
    params: dict[str, Any] = {
        "shared_memory_region": draw(st.sampled_from([REGION, "nope", ""])),
        "shared_memory_offset": offset,
        "shared_memory_byte_size": size,
    }
    return _message(_with_input(shape=[n], parameters=params), [])


@st.composite
def garbled(draw: st.DrawFn) -> Message:
    """A header that is not JSON, not UTF-8, or nested past what a parser takes."""
    kind = draw(st.sampled_from(["utf8", "depth", "json", "array"]))
    if kind == "utf8":
        data = b'{"type": "infer", "model_name": "\xff\xfe' + draw(st.binary(max_size=20)) + b'"}'
    elif kind == "depth":
        depth = draw(st.integers(min_value=1100, max_value=50_000))
        data = b'{"type": "infer", "inputs": ' + b"[" * depth + b"]" * depth + b"}"
    elif kind == "json":
        data = draw(st.binary(min_size=1, max_size=40)).replace(b"{", b"(")
    else:
        data = json.dumps(draw(json_values.filter(lambda v: not isinstance(v, dict)))).encode()
    return _message(data, [FOUR])


@st.composite
def deep_fields(draw: st.DrawFn) -> Message:
    """Valid JSON, nested deep where an object or a string belongs."""
    depth = draw(st.integers(min_value=2, max_value=500))
    nested: Any = []
    for _ in range(depth - 1):
        nested = [nested]
    where = draw(st.sampled_from(["inputs", "outputs", "model_name", "shape"]))
    if where == "shape":
        return _message(_with_input(shape=nested), [FOUR])
    header = _infer()
    header[where] = [nested] if where != "model_name" else nested
    return _message(header, [FOUR])


@st.composite
def huge_strings(draw: st.DrawFn) -> Message:
    text = draw(huge_text)
    where = draw(st.sampled_from(["model_name", "input", "id", "parameters", "type"]))
    if where == "input":
        return _message(_with_input(name=text), [FOUR])
    if where == "parameters":
        return _message(_infer(parameters={"pad": text}), [FOUR])
    if where == "type":
        return _message({"type": text}, [])
    header = _infer()
    header[where] = text
    return _message(header, [FOUR])


@st.composite
def structures(draw: st.DrawFn) -> Message:
    """Fields of the wrong type or count: every one a defect the broker must name."""
    kind = draw(
        st.sampled_from(
            [
                "inputs",
                "outputs",
                "out_name",
                "parameters",
                "twice",
                "frames+",
                "frames-",
                "type",
                "protocol",
                "version",
                "id",
                "model",
            ]
        )
    )
    value = draw(json_values)
    if kind == "inputs":
        return _message(_infer(inputs=value if not isinstance(value, list) else [value]), [FOUR])
    if kind == "outputs":  # a falsy value would mean "every output": valid
        bad = value if value and not isinstance(value, list) else [value or 1]
        return _message(_infer(outputs=bad), [FOUR])
    if kind == "out_name":
        return _message(_infer(outputs=[{"name": f"NOPE{value!s:.10}"}]), [FOUR])
    if kind == "parameters":  # falsy means none, an object may be valid parameters
        bad = value if value and not isinstance(value, dict) else [1]
        return _message(_infer(parameters=bad), [FOUR])
    if kind == "twice":
        header = _infer()
        header["inputs"] *= 2
        return _message(header, [FOUR, FOUR])
    if kind == "frames+":
        return _message(_infer(), [FOUR] * draw(st.integers(min_value=2, max_value=6)))
    if kind == "frames-":
        return _message(_infer(), [])
    if kind == "type":
        return _message({"type": value if value != "infer" else 1}, [])
    if kind == "protocol":
        return _message({"type": "health_live", "protocol": value if value != 1 else 2}, [])
    if kind == "version":
        return _message(_infer(model_version=f"v{value!s:.10}"), [FOUR])
    if kind == "id":
        return _message(_infer(id=value if not isinstance(value, str | int) else [value]), [FOUR])
    return _message(_infer(model_name=value if value != "identity" else None), [FOUR])


@st.composite
def sequences(draw: st.DrawFn) -> Message:
    """Sequence parameters of the wrong type, or a sequence that never started."""
    params = draw(
        st.one_of(
            st.fixed_dictionaries({"sequence_id": st.integers(2**40, 2**50)}),  # no START
            st.fixed_dictionaries(
                {
                    "sequence_id": st.just(1),
                    "sequence_start": json_values.filter(lambda v: not isinstance(v, bool)),
                }
            ),
            st.fixed_dictionaries(
                {"sequence_id": st.floats() | st.lists(st.integers(), min_size=1)}
            ),
            st.fixed_dictionaries({"timeout": st.integers(max_value=-1) | st.text(max_size=4)}),
        )
    )
    header = _infer("seq", parameters=params)
    header["inputs"][0]["shape"] = [1, 4]
    return _message(header, [FOUR])


@st.composite
def controls(draw: st.DrawFn) -> Message:
    """Control and shared-memory messages with hostile fields."""
    value = draw(json_values)
    kind = draw(st.sampled_from(["stats", "release", "register", "create", "load"]))
    if kind == "stats":  # an empty name asks for every model: valid
        name = f"nope-{value}" if isinstance(value, str) else value or 7
        return _message({"type": "statistics", "model_name": name}, [])
    if kind == "release":
        return _message(
            {"type": "release_leases", "leases": value if not isinstance(value, list) else None},
            [],
            "any",
        )
    if kind == "register":
        header = {
            "type": "register_system_shared_memory",
            "name": "x",
            "key": "/inferpool-fuzz-never-created",
            "offset": draw(st.integers(-(2**70), 2**70)),
            "byte_size": draw(st.integers(-(2**70), 2**70)),
        }
        return _message(header, [])
    if kind == "create":
        size = draw(
            st.one_of(st.integers(max_value=0), st.integers(2**40, 2**80), st.text(max_size=4))
        )
        return _message({"type": "create_shared_memory_region", "name": "c", "byte_size": size}, [])
    return _message({"type": "load", "model_name": value}, [])


structured = st.one_of(
    bad_shapes(),
    byte_counts(),
    datatypes(),
    lying_bytes(),
    shm_windows(),
    garbled(),
    deep_fields(),
    huge_strings(),
    structures(),
    sequences(),
    controls(),
)
raw_frames = st.lists(st.binary(max_size=64), min_size=1, max_size=5).map(
    lambda frames: Message(frames, "any")
)
