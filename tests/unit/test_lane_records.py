"""The lane's record readers and writers that remember the last record, against the plain
ones (wire/lane_region.py), over streams of like records.

``ResponseWriter`` copies the last record's bytes when a response repeats it but for its id,
``pack_parameters`` reuses what it packed for equal parameters, and ``RequestReader`` unpacks
a record with the last one's struct when the lengths match.  Whatever a stream holds, each
record must be byte for byte what the plain functions write, and read back as they read it.
The parameters are drawn so that equal values of other types (``1``, ``True``, ``1.0``) and
floats equal but not alike (``0.0`` and ``-0.0``) follow each other often.
"""

from __future__ import annotations

import math
import mmap

from hypothesis import example, given, settings
from hypothesis import strategies as st

from inferpool.wire import lane_records as lr
from inferpool.wire import lane_region as wl
from inferpool.wire import lane_responses as lresp

SLOT = 1024
GEOMETRY = wl.Geometry(2, SLOT)
VALUES = st.sampled_from([0, 1, True, False, 1.0, 0.0, -0.0, math.nan, "1", "", -(2**63)])
parameters = st.none() | st.dictionaries(st.sampled_from(["a", "b"]), VALUES, max_size=2)
shapes = st.lists(st.integers(0, 3), min_size=1, max_size=2).map(tuple)
outputs = st.lists(
    st.tuples(
        st.integers(0, 1),
        st.sampled_from([wl.DATATYPES["FP32"], wl.DATATYPES["UINT8"]]),
        st.sampled_from([0, 256]),
        st.sampled_from([0, 16]),
        shapes,
    ),
    max_size=2,
)


def _region() -> memoryview:
    mapping = mmap.mmap(-1, GEOMETRY.size)
    wl.init_header(memoryview(mapping), GEOMETRY)
    return memoryview(mapping)


def _bits(params: dict[str, object]) -> dict[str, object]:
    """The values as they must read back: floats by their bits (NaN, the sign of zero)."""
    return {k: (v.hex(), type(v)) if type(v) is float else (v, type(v)) for k, v in params.items()}


ZERO = [(0, wl.DATATYPES["FP32"], 0, 16, (4,))]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(outputs, parameters), min_size=1))
@example([(ZERO, {"a": 0.0}), (ZERO, {"a": -0.0}), (ZERO, {"a": 0.0})])
@example([(ZERO, {"a": 1}), (ZERO, {"a": True}), (ZERO, {"a": 1.0})])
def test_each_response_written_is_the_plain_record(
    stream: list[tuple[list[tuple[int, int, int, int, tuple[int, ...]]], dict | None]],
) -> None:
    remembered, plain = _region(), _region()
    writer = lresp.ResponseWriter(remembered, SLOT)
    at = GEOMETRY.response(0)
    for request_id, (outs, params) in enumerate(stream):
        writer.write(at, request_id, outs, params)
        size = lresp.write_response(plain, at, SLOT, request_id, outs, params)
        assert bytes(remembered[at : at + size]) == bytes(plain[at : at + size])
        back = lresp.read_response(remembered, at, SLOT)
        assert _bits(back.parameters) == _bits(params or {})


requests = st.tuples(
    st.lists(st.sampled_from([0, 4096]), max_size=2),  # the inputs' offsets
    st.lists(st.integers(0, 2), max_size=2, unique=True),  # the outputs wanted
    st.lists(st.sampled_from([64, 128]), max_size=2),  # the releases
    st.dictionaries(st.integers(0, 2), st.tuples(st.integers(0, 2**40), st.integers(0, 2**20))),
    st.none() | st.tuples(st.integers(0, 7), st.integers(0, 2**32 - 1), st.integers(0, 3)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(requests, min_size=1))
def test_each_request_read_is_what_the_plain_reader_reads(
    stream: list[tuple[list[int], list[int], list[int], dict, tuple[int, int, int] | None]],
) -> None:
    """Outputs placed in windows of the client's region (some of the wanted ones) and the
    answer a step waits for (FLAG_AFTER) read back as they were written."""
    region = _region()
    reader = lr.RequestReader(region, SLOT)
    at = GEOMETRY.request(0)
    for request_id, (offsets, wanted, releases, windows, after) in enumerate(stream):
        inputs = [wl.Tensor(i, wl.DATATYPES["FP32"], o, 16, (4,)) for i, o in enumerate(offsets)]
        windows = {i: w for i, w in windows.items() if i in wanted}
        body = lr.pack_request_body(inputs, wanted, windows)
        flags = 0 if after is None else wl.FLAG_AFTER
        waits = None if after is None else lr.After(*after)
        lr.write_request(
            region, at, SLOT, request_id, 7, flags, len(inputs), len(wanted), body, releases, waits
        )
        req = reader.read(at)
        assert req == lr.read_request(region, at, SLOT)
        assert lr.parse_body(req.body, req.n_inputs, req.n_outputs) == (inputs, wanted, windows)
        if waits is not None:
            assert lr.read_after(region, at, SLOT, req) == waits
