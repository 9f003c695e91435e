"""The worker's reader against the plain decoder, over streams of like batches.

``BrokerReader`` reuses what it decoded before (records of equal JSON, a whole batch of one
whose bytes after its handle and id repeat); whatever a stream holds, every message must
still decode to what ``decode_from_broker`` makes of it alone, record types included.  The
streams are drawn from a small alphabet so that repeats, near-repeats (another id, shape,
offset, parameter, slot to free) and ids that look like JSON follow each other often.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from inferpool.wire.worker import protocol as m
from inferpool.wire.worker.reader import BrokerReader
from tests.unit.test_worker_protocol import _record_types

REGIONS = ("inferpool-0123456789-arena", "inferpool-0123456789-out0g0")
# ids a client may give: digits, empty, quotes, escapes, commas and brackets, non-ASCII
IDS = st.sampled_from(["", "1", "12", "x", '"', '","', "],[", "1,2", "\\", "é", "\u2028"])

refs = st.builds(
    m.TensorRef,
    st.sampled_from(["INPUT0", "INPUT1"]),
    st.sampled_from(["UINT8", "FP32", "BYTES"]),
    st.lists(st.integers(0, 4), min_size=1, max_size=2),
    st.sampled_from(REGIONS),
    st.sampled_from([0, 64, 2**40]),
    st.sampled_from([0, 4, 16]),
)
windows = st.none() | st.builds(m.Window, st.just("ref-1"), st.sampled_from([0, 8]), st.just(8))
wanted = st.builds(m.WantedOutput, st.sampled_from(["OUTPUT0", "OUTPUT1"]), windows)
parameters = st.sampled_from([{}, {"a": 1}, {"a": "1"}, {"b": [1, 2]}, {"a": True}])
works = st.builds(
    m.Work,
    st.integers(0, 2**53),
    IDS,
    st.sampled_from([0, 7, "seq"]),
    st.sampled_from([0, m.FLAG_SEQUENCE_START]),
    parameters,
    st.lists(refs, max_size=2),
    st.lists(wanted, max_size=2),
    st.sampled_from([0, 1]),
    st.sampled_from([0, 500]),
)
slots = st.lists(st.builds(m.Slot, st.sampled_from(REGIONS), st.sampled_from([0, 64])), max_size=2)
executes = st.builds(
    m.Execute,
    st.lists(works, min_size=1, max_size=2),
    slots,
    st.lists(st.sampled_from(["ref-1", "ref-2"]), max_size=1),
    st.lists(st.sampled_from([7, "seq"]), max_size=1),
    st.lists(st.integers(0, 2), max_size=1),
)
# a stream: batches, each sent again with another handle or id now and then
streams = st.lists(
    st.tuples(executes, st.none() | st.tuples(st.integers(0, 2**53), IDS)), min_size=1
)


@settings(max_examples=300, deadline=None)
@given(streams)
def test_every_message_of_a_stream_decodes_as_on_its_own(
    stream: list[tuple[m.Execute, tuple[int, str] | None]],
) -> None:
    read = BrokerReader().decode
    for msg, again in stream:
        sent = [msg]
        if again is not None:  # the same batch, its first request another handle and id
            first = msg.requests[0]._replace(rid=again[0], id=again[1])
            sent.append(msg._replace(requests=[first, *msg.requests[1:]]))
        for each in sent:
            data = m.encode(each)
            alone = m.decode_from_broker(data)
            got = read(data)
            assert got == alone == each
            assert _record_types(got) == _record_types(alone)
