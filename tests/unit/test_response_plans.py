"""Response plans (client.response_plans): a response whose header bytes equal an earlier one's apart
from the id is read from what decoding that one found, and nothing else ever is."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
import zmq
from hypothesis import example, given, settings
from hypothesis import strategies as st

from inferpool.client.core import ClientCore, Exchange, InferResult, extended, header_template
from inferpool.client.response_plans import PlannedHeader
from inferpool.wire.errors import InferpoolError

PARAMS = {"param0": "a string", "param1": 42, "param2": False, "param3": 1.5}
OUT = {"name": "Y", "datatype": "FP32", "shape": [1, 2]}


def header(request_id: str, **fields: Any) -> bytes:
    """A response header laid out as the broker lays it out (type, id, then the rest)."""
    body = {"model_name": "m", "model_version": "1", "outputs": [OUT], "parameters": PARAMS}
    return orjson.dumps({"type": "infer", "id": request_id, **{**body, **fields}})


def answer(core: ClientCore, raw: bytes, *frames: bytes) -> tuple[Exchange[Any] | None, Any]:
    """File ``raw`` (a header) and ``frames`` as a response; the exchange it went to and
    the header it was filed with."""
    exchange = core.receive([zmq.Frame(b""), zmq.Frame(raw), *map(zmq.Frame, frames)])
    if exchange is None:
        return None, None
    reply = exchange.replies[-1]
    assert not isinstance(reply, InferpoolError)
    return exchange, reply[0]


def read(core: ClientCore, exchange: Exchange[Any]) -> InferResult:
    return exchange.read(core.take(exchange))


def ask(core: ClientCore, n: int) -> list[Exchange[InferResult]]:
    return [core.infer("m", {"X": np.ones(2, np.float32)}) for _ in range(n)]


Y = np.array([[3, 4]], np.float32).tobytes()


def planned(core: ClientCore) -> ClientCore:
    """``core`` once two responses alike have confirmed a plan."""
    for exchange in ask(core, 2):
        assert answer(core, header(exchange.id), Y)[0] is exchange
        read(core, exchange)
    return core


def test_a_confirmed_plan_reads_a_response_as_decoding_it_would() -> None:
    core = ClientCore("ipc:///tmp/x.sock", timeout=5)
    first, second, third, fourth = ask(core, 4)
    for exchange in (first, second):  # the first learns, the second confirms
        _, filed = answer(core, header(exchange.id), Y)
        assert type(filed) is dict
        read(core, exchange)
    results = []
    for exchange in (third, fourth):
        _, filed = answer(core, header(exchange.id), Y)
        assert type(filed) is PlannedHeader and filed == orjson.loads(header(exchange.id))
        results.append(read(core, exchange))
    for exchange, result in zip((third, fourth), results, strict=True):
        assert (result.model_name, result.model_version, result.id) == ("m", "1", exchange.id)
        assert result.parameters == PARAMS and result.final
        assert result.outputs["Y"].tolist() == [[3.0, 4.0]] and result.outputs["Y"].shape == (1, 2)
    results[0].parameters["param1"] = 0  # a user's copy: the plan and the next are untouched
    (fifth,) = ask(core, 1)
    answer(core, header(fifth.id), Y)
    assert read(core, fifth).parameters == PARAMS


@pytest.mark.parametrize(
    "fields, outputs, params",
    [
        ({"parameters": {**PARAMS, "param1": 43}}, [[3.0, 4.0]], {**PARAMS, "param1": 43}),
        ({"outputs": [{**OUT, "shape": [2, 1]}]}, [[3.0], [4.0]], PARAMS),
        ({"model_version": "2"}, [[3.0, 4.0]], PARAMS),
        ({"parameters": {"nested": {"a": 1}}}, [[3.0, 4.0]], {"nested": {"a": 1}}),
    ],
)
def test_a_response_whose_bytes_differ_is_decoded(
    fields: dict[str, Any], outputs: Any, params: dict[str, Any]
) -> None:
    core = planned(ClientCore("ipc:///tmp/x.sock", timeout=5))
    (exchange,) = ask(core, 1)
    _, filed = answer(core, header(exchange.id, **fields), Y)
    assert type(filed) is dict
    result = read(core, exchange)
    assert result.outputs["Y"].tolist() == outputs and result.parameters == params
    assert result.model_version == fields.get("model_version", "1")


def test_errors_and_wrong_frames_still_get_the_decoding_paths_errors() -> None:
    core = planned(ClientCore("ipc:///tmp/x.sock", timeout=5))
    failed, short, missing = ask(core, 3)
    error = {"code": "INTERNAL", "message": "it broke"}
    answer(core, orjson.dumps({"type": "infer", "id": failed.id, "error": error}))
    with pytest.raises(InferpoolError, match="INTERNAL: it broke"):
        read(core, failed)
    _, filed = answer(core, header(short.id), Y[:4])  # planned bytes, a frame too short
    assert type(filed) is PlannedHeader
    with pytest.raises(InferpoolError, match="expected 8 bytes for FP32 shape"):
        read(core, short)
    answer(core, header(missing.id))
    with pytest.raises(InferpoolError, match="response lists 1 outputs but carries 0 frames"):
        read(core, missing)


def test_a_plan_is_used_only_once_a_second_response_shows_the_digits_are_the_id() -> None:
    """A header with its id twice (the last one counts): the first is no id to plan on."""
    core = ClientCore("ipc:///tmp/x.sock", timeout=5)
    exchanges = ask(core, 4)
    target = exchanges[0]
    for exchange in exchanges:  # the same bytes but for the first "id", all for target
        raw = header(exchange.id)[:-1] + b',"id":"' + target.id.encode() + b'"}'
        got, filed = answer(core, raw, Y)
        assert got is target and type(filed) is dict
    assert [m[0]["id"] for m in target.replies if not isinstance(m, InferpoolError)] == [
        target.id
    ] * 4
    assert len(target.replies) == 4


def test_responses_to_requests_given_up_on_and_other_readers_are_not_planned() -> None:
    core = planned(ClientCore("ipc:///tmp/x.sock", timeout=5))
    gone, raw = ask(core, 1)[0], core.raw({"type": "infer"})
    core.forget(gone)
    assert answer(core, header(gone.id), Y)[0] is None
    _, filed = answer(core, header(raw.id), Y)
    assert type(filed) is dict  # a protocol test's reader gets the decoded header


def test_extended_templates_encode_as_the_whole_header_would() -> None:
    for header_ in ({"type": "infer", "inputs": [{"name": "X"}]}, {}):
        releases = ["a.1", "a.2"]
        assert extended(header_template(header_), "release", releases) == header_template(
            {**header_, "release": releases}
        )


def test_a_malformed_header_is_still_dropped() -> None:
    core = planned(ClientCore("ipc:///tmp/x.sock", timeout=5))
    (exchange,) = ask(core, 1)
    raw = header(exchange.id)
    at = raw.index(exchange.id.encode())
    for junk in (raw[:-1], raw[:at] + b"\xff" + raw[at + len(exchange.id) :]):
        assert answer(core, junk, Y)[0] is None  # not JSON; not UTF-8 where the id goes
    assert not exchange.replies


def outcome(core: ClientCore, exchange: Exchange[Any], raw: bytes, frames: list[bytes]) -> Any:
    """What reading ``raw`` and ``frames`` as ``exchange``'s response gives: the result's
    fields (outputs as dtype, shape and bytes; parameters with their types) or the error."""
    answer(core, raw, *frames)
    try:
        r = read(core, exchange)
    except InferpoolError as err:
        return ("error", str(err))
    outputs = {k: (v.dtype.str, v.shape, v.tobytes()) for k, v in r.outputs.items()}
    params = {k: (repr(v), type(v)) for k, v in r.parameters.items()}
    return (r.model_name, r.model_version, r.id == exchange.id, outputs, params)


SHAPES = st.sampled_from([[1, 2], [2, 1], [2], [1, 1]])
OUTPUTS = st.lists(
    st.fixed_dictionaries(
        {"name": st.sampled_from(["Y", "Z"]), "datatype": st.sampled_from(["FP32", "INT32"])}
    ).flatmap(lambda spec: SHAPES.map(lambda shape: {**spec, "shape": shape})),
    max_size=2,
)
PARAMETERS = st.none() | st.dictionaries(
    st.sampled_from(["a", "b"]),
    st.sampled_from([1, True, 1.0, 0.0, -0.0, "1", None, [1], {"c": 1}]),
    max_size=2,
)
RESPONSES = st.tuples(
    st.sampled_from(["m", "n"]),
    st.sampled_from(["1", "2"]),
    OUTPUTS,
    PARAMETERS,
    st.sampled_from([None, {"code": "INTERNAL", "message": "it broke"}]),
    st.integers(-1, 1),  # frames: one fewer than the outputs, as many, one more
)


# a stream: a few responses, each coming again and again in any order
STREAMS = st.lists(RESPONSES, min_size=1, max_size=3).flatmap(
    lambda kinds: st.lists(st.sampled_from(kinds), min_size=1, max_size=12)
)


SHORT = ("m", "1", [{"name": "Y", "datatype": "FP32", "shape": [1, 1]}], None, None, 0)


@settings(max_examples=200, deadline=None)
@given(STREAMS)
@example([SHORT] * 4)  # planned, then a frame longer than the output
def test_every_response_of_a_stream_reads_as_a_new_client_reads_it(stream: list[Any]) -> None:
    core = ClientCore("ipc:///tmp/x.sock", timeout=5)  # learns plans along the stream
    for model, version, outputs, params, error, extra in stream:
        fields: dict[str, Any] = {"model_name": model, "model_version": version}
        for key, value in (("outputs", outputs), ("parameters", params), ("error", error)):
            if value is not None:
                fields[key] = value
        frames = [Y] * max(0, len(outputs) + extra)
        got = []
        for reader in (core, ClientCore("ipc:///tmp/x.sock", timeout=5)):
            (exchange,) = ask(reader, 1)
            raw = orjson.dumps({"type": "infer", "id": exchange.id, **fields})
            got.append(outcome(reader, exchange, raw, frames))
        assert got[0] == got[1]
