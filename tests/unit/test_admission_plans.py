"""Admission against a real model version and a real arena: a request signature is checked in
full once and its plan kept; what depends on each request (its data, id, parameters) is still
checked every time."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import zmq
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from inferpool.broker.front.admission import admit
from inferpool.broker.models.registry import ModelVersion
from inferpool.broker.models.request import PendingRequest
from inferpool.shm.arena import Arena
from inferpool.shm.region import Region
from inferpool.wire.errors import InferpoolError

CONFIG = """
name: "m"
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_UINT8 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_UINT8 dims: [ -1 ] } ]
"""


@pytest.fixture
def arena() -> Iterator[Arena]:
    region = Region.create(f"ipt-{os.getpid()}-{secrets.token_hex(3)}", 1 << 16, prefault=False)
    try:
        yield Arena(region)
    finally:
        region.close()
        region.unlink()


@pytest.fixture
def model() -> ModelVersion:
    return ModelVersion("m", 1, text_format.Parse(CONFIG, pb.ModelConfig()), "/nonexistent")


def request(id_: Any = "1", shape: Any = (1, 4), **extra: Any) -> dict[str, Any]:
    """A header as the router hands it over (a fresh dict: admission takes its id out)."""
    inputs = [{"name": "INPUT0", "datatype": "UINT8", "shape": list(shape)}]
    return orjson.loads(
        orjson.dumps({"type": "infer", "model_name": "m", "id": id_, **extra, "inputs": inputs})
    )


def run(model: ModelVersion, arena: Arena, header: dict[str, Any], *data: bytes) -> PendingRequest:
    frames = [zmq.Frame(d) for d in data]
    return admit(
        header,
        frames,
        model,
        arena,
        rid=1,
        envelope=[b"c"],
        client=b"c",
        limit=1 << 20,
        now_ns=0,
        shm=None,
    )


def test_one_plan_per_signature_whatever_the_id_or_releases(
    model: ModelVersion, arena: Arena
) -> None:
    first = run(model, arena, request("a"), b"abcd")
    again = run(model, arena, request("b", release=["lease-1"]), b"efgh")
    assert len(model.plans) == 1
    assert (first.client_id, again.client_id) == ("a", "b")
    assert orjson.loads(orjson.dumps(again.wire))[1] == "b"  # the worker gets its own id
    view = arena.region.buf
    ref = again.work.inputs[0]
    assert bytes(view[ref.offset : ref.offset + ref.byte_size]) == b"efgh"
    run(model, arena, request("c", shape=(2, 4)), b"12345678")
    assert len(model.plans) == 2


def test_a_known_signature_still_checks_each_requests_data(
    model: ModelVersion, arena: Arena
) -> None:
    run(model, arena, request(), b"abcd")
    used = arena.allocator.used_blocks
    with pytest.raises(InferpoolError, match="Expected 4, got 3"):
        run(model, arena, request(), b"abc")
    with pytest.raises(InferpoolError, match="has no data"):
        run(model, arena, request())
    with pytest.raises(InferpoolError, match="sent 2 tensor frame"):
        run(model, arena, request(), b"abcd", b"more")
    with pytest.raises(InferpoolError, match="'id' must be a string or an integer"):
        run(model, arena, request(id_=[1]), b"abcd")
    assert arena.allocator.used_blocks == used  # nothing a failed request took is kept


def test_parameters_are_no_part_of_the_signature_and_checked_every_time(
    model: ModelVersion, arena: Arena
) -> None:
    req = run(model, arena, request(parameters={"priority": 0, "custom": 1}), b"abcd")
    assert req.work.parameters == {"custom": 1}
    req = run(
        model, arena, request(parameters={"sequence_id": 7, "sequence_start": True}), b"x" * 4
    )
    assert (req.work.correlation_id, req.work.flags, req.work.parameters) == (7, 1, {})
    with pytest.raises(InferpoolError, match="timeout must be a non-negative integer"):
        run(model, arena, request(parameters={"timeout": -1}), b"abcd")
    with pytest.raises(InferpoolError, match="'parameters' must be an object"):
        run(model, arena, request(parameters=[1]), b"abcd")
    assert run(model, arena, request(), b"abcd").work.parameters == {}
    assert len(model.plans) == 1


def test_a_bad_signature_is_never_kept(model: ModelVersion, arena: Arena) -> None:
    for _ in range(2):
        with pytest.raises(InferpoolError, match="unexpected inference input 'NOPE'"):
            header = request()
            header["inputs"][0]["name"] = "NOPE"
            run(model, arena, header, b"abcd")
        with pytest.raises(InferpoolError, match="shape must be a list of non-negative"):
            run(model, arena, request(shape=[1.0, 4]), b"abcd")
    assert model.plans == {}
