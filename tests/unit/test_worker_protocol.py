"""The broker<->worker contract (wire/worker): every message kind round-trips to its named
type, the spec is built by one function and read by another, the channel refuses what does
not fit or does not parse."""

from __future__ import annotations

import os
import socket

import orjson
import pytest

from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.worker import protocol as m
from inferpool.wire.worker.link import Link
from inferpool.wire.worker.spec import (
    EXIT_BOOT_FAILED,
    SPEC_ENV,
    InstanceSpec,
    PinningSpec,
    WorkerSpec,
    describe_exit,
    read_spec,
    spec_environment,
)

REF = m.TensorRef("INPUT0", "FP32", [2, 3], "inferpool-0123456789-arena", 4096, 24)
OUT = m.TensorRef("OUTPUT0", "BYTES", [1], "inferpool-0123456789-out0g0", 128, 9)
ERROR = InferpoolError(Code.INVALID_ARG, "bad input").to_wire()
DURATIONS = m.Durations(10, 200, 30)
WORK = m.Work(
    rid=7,
    id="req-1",
    correlation_id="seq-a",
    flags=1,
    parameters={"p": 1, "q": "x"},
    inputs=[REF],
    outputs=[m.WantedOutput("OUTPUT0"), m.WantedOutput("OUTPUT1", m.Window("ref:1", 64, 512))],
    priority=2,
    timeout_us=5000,
)
RESULTS = [
    m.Result(7, True, [OUT], {"k": True}, None, DURATIONS),
    m.Result(8, False, []),
    m.Result(9, True, [], None, ERROR),
]

FROM_BROKER: list[m.BrokerMessage] = [
    m.Execute([WORK, WORK._replace(rid=8, correlation_id=0, flags=0, inputs=[])], [], [], [], []),
    m.Execute(
        [WORK],
        free=[m.Slot("inferpool-0123456789-out0g0", 64)],
        unmap=["ref:2"],
        release=[5, "s"],
        nulls=[0, 2],
    ),
    m.Free([m.Slot("inferpool-0123456789-out0g0", 0)], ["ref:3"], []),
    m.Free([], [], ["seq-b", 3]),
    m.Stop(),
    m.RegionGrant("weights-0123abcd", "inferpool-0123456789-shared-weights-0123abcd", True),
    m.RegionGrant("weights-0123abcd", "", False, ERROR),
    m.LaneOpen(3, "inferpool-0123456789-lane3", "inferpool-0123456789-c1", 4321, 100),
    m.LaneOpen(4, "inferpool-0123456789-lane4", "inferpool-0123456789-c1", 4321, 0, ("a", "b")),
    m.LaneClose(3, True),
    m.LaneClose(4, False),
    m.Replies(RESULTS),
    m.LogChange({"verbose": 1, "info": False, "format": "json", "file": ""}),
    m.LaneTracing(1000),
]
FROM_WORKER: list[m.WorkerMessage] = [
    m.Ready({"cpus": [0], "mempolicy": "default"}, {"name": "model", "max_batch_size": 8}, []),
    m.Ready({}, {"name": "model"}, [m.MemoryUsage("CPU", 0, 4096), m.MemoryUsage("GPU", 1, 64)]),
    m.Failed(ERROR),
    m.Items(RESULTS),
    m.Done(RESULTS, [m.BatchStats(3, DURATIONS)]),
    m.Done(
        [],
        [],
        m.MetricsUpdate(
            [m.MetricFamilyInfo("requests", "requests seen", "counter")],
            [m.MetricOp("requests", {"model": "a"}, "inc", 2.0)],
        ),
    ),
    m.ShareRegion("weights-0123abcd", 1 << 20),
    m.RegionFilled("weights-0123abcd", True),
    m.Mapped(["cuda/3/4096/0011aabb/GPU-5c0c3a9e"]),
    m.Unmapped(["cuda/3/4096/0011aabb/0", "inferpool-ab12cd34-c7-input"]),
    m.LaneClosed(3),
    m.LaneClosed(4, ERROR),
    m.LaneClosed(5, None, ((0, 64), (4096, 1 << 20))),
    m.LaneStats(5, 1, 9000, 300, 700, 6, DURATIONS, [m.LaneBatch(1, 5, DURATIONS)]),
    m.LaneStats(1, 0, 90, 0, 9, 1, DURATIONS, [], traces=((12, 100, 110, 120, 150, 160, 170),)),
    m.LaneStats(
        2, 0, 90, 0, 9, 3, DURATIONS, [], None, (m.LanePart(7, 2, 0, 90, 0, 9, 3, DURATIONS),)
    ),
    m.LaneStats(
        0,
        0,
        0,
        0,
        0,
        0,
        m.Durations(0, 0, 0),
        [],
        m.MetricsUpdate([], [m.MetricOp("requests", {"model": "a"}, "inc", 1.0)]),
    ),
    m.Call(
        "preprocess", -1, WORK._replace(outputs=[m.WantedOutput("OUTPUT0")]), 5000, False, False
    ),
    m.Call("stream", 2, WORK._replace(outputs=[m.WantedOutput("OUT")]), 0, True, True),
    m.Call("traced", -1, WORK._replace(outputs=[m.WantedOutput("OUT")]), 0, False, False, 7),
    m.Traced([(7, 100, 110, 150, 160), (-3, 1, 2, 3, 4)]),
    m.CancelCall(7),
    m.Query(8, "addsub", -1),
    m.Release([m.Slot("inferpool-0123456789-out1g0", 4096)]),
]


def _record_types(value: object) -> list[type]:
    """The types of ``value`` and of every record nested in it."""
    types = [type(value)]
    if isinstance(value, tuple | list):
        for item in value:
            types += _record_types(item)
    return types


@pytest.mark.parametrize("msg", FROM_BROKER, ids=lambda msg: type(msg).__name__)
def test_broker_messages_round_trip_to_their_types(msg: m.BrokerMessage) -> None:
    back = m.decode_from_broker(m.encode(msg))
    assert back == msg
    assert _record_types(back) == _record_types(msg)


@pytest.mark.parametrize("msg", FROM_WORKER, ids=lambda msg: type(msg).__name__)
def test_worker_messages_round_trip_to_their_types(msg: m.WorkerMessage) -> None:
    back = m.decode_from_worker(m.encode(msg))
    assert back == msg
    assert _record_types(back) == _record_types(msg)


def test_every_kind_has_a_round_trip_test() -> None:
    messages: list[m.Message] = [*FROM_BROKER, *FROM_WORKER]
    tested = {m.encode(msg).split(b'"')[1].decode() for msg in messages}
    assert tested == {kind.value for kind in m.Kind}


def test_records_travel_as_arrays_without_field_names() -> None:
    data = m.encode(m.Items([m.Result(7, True, [OUT])]))
    assert orjson.loads(data) == [
        "items",
        [
            [
                [
                    7,
                    True,
                    [["OUTPUT0", "BYTES", [1], "inferpool-0123456789-out0g0", 128, 9]],
                    None,
                    None,
                    None,
                ]
            ]
        ],
    ]
    assert b"rid" not in data and b"byte_size" not in data


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"not json", "JSONDecodeError"),
        (b'["explode", []]', "KeyError: 'explode'"),
        (b'["ready", [{}]]', "ValueError"),  # a field missing
        (b'["items", [[[1, true]]]]', "ValueError"),  # a result of the wrong arity
        (b'["execute", [[], [], []]]', "ValueError"),
        (
            b'["call", ["m", "1", [1, "", 0, 0, {}, [], [], 0, 0], 0, false, false, 0]]',
            "wrong types",
        ),
        (b'["call", ["m", 1, [1, "", 0, 0, {}, [], [], 0, 0], 0, false, 1, 0]]', "wrong types"),
        (
            b'["call", ["m", 1, [1, "", 0, 0, {}, [], [], 0, 0], 0, false, false, "7"]]',
            "wrong types",
        ),
        (b'["call", ["m", 1, [1, "", 0, 0, {}, [], [], 0, 0], 0, false, false]]', "ValueError"),
        (
            b'["call", ["m", -1, [1, "", 0, 0, {}, [["X", "FP32", ["4"], "r", 0, 4]], [], 0, 0], 0, false, false, 0]]',
            "wrong types",
        ),
        (
            b'["call", ["m", -1, [1, "", 0, 0, {}, [], [["Y", ["ref", 0, 4]]], 0, 0], 0, false, false, 0]]',
            "wrong types",
        ),
        (b'["traced", [[[7, 1, 2, 3]]]]', "wrong shape or types"),
        (
            b'["lane_stats", [0, 0, 0, 0, 0, 0, [0, 0, 0], [], null, [], [], [[1, 2]]]]',
            "wrong shape or types",
        ),
        (b'["traced", [[[7, 1, 2, 3, "4"]]]]', "wrong shape or types"),
        (b'["release", [[["inferpool-0123456789-out0g0", "0"]]]]', "wrong types"),
        (b'["cancel_call", [true]]', "not an integer"),
        (b'["cancel_call", [1, 2]]', "TypeError"),
    ],
)
def test_what_is_not_a_message_is_an_internal_error(data: bytes, problem: str) -> None:
    decode = m.decode_from_broker if b"execute" in data else m.decode_from_worker
    with pytest.raises(InferpoolError) as info:
        decode(data)
    assert info.value.code is Code.INTERNAL
    assert "unreadable message from the" in info.value.message and problem in info.value.message


def test_a_direction_reads_only_its_own_kinds() -> None:
    with pytest.raises(InferpoolError, match="KeyError: 'stop'"):
        m.decode_from_worker(m.encode(m.Stop()))
    with pytest.raises(InferpoolError, match="KeyError: 'failed'"):
        m.decode_from_broker(m.encode(m.Failed(ERROR)))


def test_objects_that_are_not_records_do_not_travel() -> None:
    with pytest.raises(TypeError, match="bytes"):
        m.encode(m.Items([m.Result(1, True, [], {"raw": b"x"})]))


def test_a_link_carries_messages_and_refuses_oversized_ones() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    broker, worker = Link(a, m.decode_from_worker), Link(b, m.decode_from_broker)
    try:
        broker.send(FROM_BROKER[1])
        assert worker.recv() == FROM_BROKER[1]
        huge = m.Failed({"code": "INTERNAL", "message": "x" * m.MAX_MESSAGE})
        with pytest.raises(InferpoolError, match="exceeds the worker channel limit"):
            worker.send(huge)
        b.send(b"x" * (m.MAX_MESSAGE + 1024))  # a raw datagram past the limit
        with pytest.raises(InferpoolError, match=f"{m.MAX_MESSAGE + 1024} bytes exceeds"):
            broker.recv()
        worker.send(FROM_WORKER[0])  # the channel still works after a refused datagram
        assert broker.recv() == FROM_WORKER[0]
        worker.close()
        assert broker.recv() is None
    finally:
        broker.close()


def _slots(n: int) -> list[m.Slot]:
    return [m.Slot("inferpool-0123456789-out0g0", 64 * i) for i in range(n)]


def test_a_batch_within_batch_bytes_fits_in_one_message() -> None:
    work = WORK._replace(parameters={"pad": "x" * 1000})
    count = (m.BATCH_BYTES + 1) // (m.record_size(work) + 1)
    assert len(m.encode(m.Execute([work] * count))) <= m.MAX_MESSAGE
    assert len(m.encode(m.Execute([work] * (count + 1)))) > m.MAX_MESSAGE


def test_what_an_execute_hands_back_goes_ahead_when_it_would_not_fit() -> None:
    releases = ["s" * 5000] * 30
    msg = m.Execute([WORK], _slots(9000), [f"ref:{i}" for i in range(900)], releases, [1])
    assert len(m.encode(msg)) > m.MAX_MESSAGE
    parts = m.split(msg)
    assert len(parts) > 2 and all(len(m.encode(p)) <= m.MAX_MESSAGE for p in parts)
    assert all(type(p) is m.Free for p in parts[:-1])
    assert parts[-1] == m.Execute([WORK], nulls=[1])  # the batch keeps its null positions
    assert [s for p in parts for s in p.free] == msg.free
    assert [u for p in parts for u in p.unmap] == msg.unmap
    assert [r for p in parts for r in p.release] == msg.release
    assert m.split(m.Free(_slots(3), [])) == [m.Free(_slots(3), [])]


def test_a_channel_splits_what_would_not_fit() -> None:
    from inferpool.broker.pool.channel import Channel

    channel = Channel()
    worker = Link(socket.socket(fileno=os.dup(channel.child_fd())), m.decode_from_broker)
    channel.spawned()
    try:
        channel.send(m.Free(_slots(12000), []))
        got: list[m.Free] = []
        while sum(len(msg.free) for msg in got) < 12000:
            msg = worker.recv()
            assert isinstance(msg, m.Free)
            got.append(msg)
        assert len(got) > 1 and [s for msg in got for s in msg.free] == _slots(12000)
    finally:
        channel.close()
        worker.close()


SPEC = WorkerSpec(
    run_id="0123456789",
    broker_pid=4242,
    channel_fd=5,
    identity="w0.0",
    model_name="model",
    model_version=1,
    backend="identity",
    config_json='{"name": "model"}',
    repository_path="/repo/model",
    artifact_path="/repo/model/1",
    output_region="inferpool-0123456789-out0g0",
    output_prefault=1 << 20,
    cancel_region="inferpool-0123456789-cancel",
    instance=InstanceSpec("model_0_0", "GPU", 1, 0, "gpu_1", False, [{"kind": "KIND_NVDLA"}]),
    pinning=PinningSpec([0, 1], 0, "bind", "1", 2),
    backend_config={"k": "v"},
    gpu_load_limit=0.5,
    log={"verbose": 2, "info": False, "format": "ISO8601"},
)


def test_the_spec_built_for_a_worker_is_the_spec_it_reads() -> None:
    environ = spec_environment(SPEC)
    assert list(environ) == [SPEC_ENV]
    assert read_spec(environ) == SPEC


@pytest.mark.parametrize(
    ("environ", "problem"),
    [
        ({}, f"${SPEC_ENV} is not set: workers are started by the broker"),
        ({SPEC_ENV: "{"}, f"unreadable ${SPEC_ENV}"),
        ({SPEC_ENV: '{"run_id": "x"}'}, "'instance'"),
        ({SPEC_ENV: '{"instance": {"name": "i", "colour": 1}}'}, "colour"),
    ],
)
def test_an_unreadable_spec_says_what_is_wrong(environ: dict[str, str], problem: str) -> None:
    with pytest.raises(InferpoolError) as info:
        read_spec(environ)
    assert info.value.code is Code.INTERNAL and problem in info.value.message


def test_exits_are_described_by_their_meaning() -> None:
    assert describe_exit(EXIT_BOOT_FAILED) == "exit code 3 (boot failed)"
    assert describe_exit(EXIT_BOOT_FAILED, ready=True) == "exit code 3"  # the model's sys.exit(3)
    assert describe_exit(7) == "exit code 7"
    assert describe_exit(-9) == "signal SIGKILL"
    assert describe_exit(-6) == "signal SIGABRT"


def test_a_timed_result_is_the_result_with_its_durations() -> None:
    timed = RESULTS[1].timed(DURATIONS)
    assert type(timed) is m.Result and timed == RESULTS[1]._replace(durations=DURATIONS)
