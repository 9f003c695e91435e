"""BLS served for real: python models that call other models while they execute.

One server for the module.  ``caller`` does what its MODE input names and reports in INFO;
``double`` reports where its input lay (the caller's request input in the arena, or another
worker's output arena for a reply passed on: no copy either way) and the request parameter
it was sent; ``relay`` models call the model their config names, to show that a call that
could only run on a waiting instance is refused instead of hanging the pool.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferpool.client import ShmClient
from inferpool.shm.region import Region
from inferpool.wire.errors import Code, InferpoolError
from tests.support import Server, serving, write_model

DOUBLE = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            t = pb_utils.get_input_tensor_by_name(request, "T")
            source = np.array([[t._shared[0].encode()]] * t.shape()[0], dtype=np.object_)
            tag = json.loads(request.parameters()).get("tag", "")
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("T", t.as_numpy() * 2), pb_utils.Tensor("SOURCE", source)],
                parameters={"tag": tag},
            ))
        return responses
"""

STREAM = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            for i in range(n):
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.array([i], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

FAILS = """
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        t = pb_utils.get_input_tensor_by_name(requests[0], "T").as_numpy()[0]
        if t > 1:
            os._exit(9)  # a crash while its caller waits
        if t > 0:
            time.sleep(1.0)  # slow: the call's timeout passes first
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("fails on purpose"))
                for _ in requests]
"""

CALLER = """
import asyncio
import json

import numpy as np
import triton_python_backend_utils as pb_utils


def call(model, tensors, outputs=("T", "SOURCE"), **kw):
    return pb_utils.InferenceRequest(
        model_name=model, inputs=tensors, requested_output_names=list(outputs), **kw)


def out(response, name):
    return pb_utils.get_output_tensor_by_name(response, name)


class TritonPythonModel:
    async def execute(self, requests):
        request = requests[0]
        mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0, 0].decode()
        t = pb_utils.get_input_tensor_by_name(request, "T")  # [1, 4]: this model batches
        result, info = await getattr(self, mode)(t)
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("T", np.asarray(result, np.float32).reshape(1, 4)),
            pb_utils.Tensor("INFO", np.array([[json.dumps(info).encode()]], dtype=np.object_)),
        ])]

    async def sync(self, t):
        r = call("double", [t], parameters={"tag": "t1"}).exec()
        if r.has_error():
            raise pb_utils.TritonModelException(r.error().message())
        return out(r, "T").as_numpy(), {"params": json.loads(r.parameters()),
                                        "source": out(r, "SOURCE").as_numpy()[0, 0].decode()}

    async def chain(self, t):  # a reply's output passed on as the next call's input
        first = call("double", [t]).exec()
        second = call("double", [out(first, "T")]).exec()
        return out(second, "T").as_numpy(), {
            "sources": [out(r, "SOURCE").as_numpy()[0, 0].decode() for r in (first, second)]}

    async def gather(self, t):  # four calls at once: the called model batches them
        rs = await asyncio.gather(*(call("double", [t]).async_exec() for _ in range(4)))
        return sum(out(r, "T").as_numpy() for r in rs), {"errors": [r.has_error() for r in rs]}

    async def stream(self, t):
        n = pb_utils.Tensor("N", np.array([int(t.as_numpy()[0, 0])], np.int32))
        rs = list(call("stream", [n], ["OUT"]).exec(decoupled=True))
        got = [int(out(r, "OUT").as_numpy()[0]) for r in rs if r.output_tensors()]
        return np.zeros(4), {"got": got, "final_empty": not rs[-1].output_tensors()}

    async def errors(self, t):
        n = pb_utils.Tensor("N", np.array([1], np.int32))
        cases = {
            "missing": call("nosuch", [t]).exec(),
            "fails": call("fails", [pb_utils.Tensor("T", np.zeros(4, np.float32))], ["T"]).exec(),
            "not_decoupled": call("stream", [n], ["OUT"]).exec(),
            "timeout": call("fails", [pb_utils.Tensor("T", np.ones(4, np.float32))], ["T"],
                            timeout=100000).exec(),
            "bad_input": call("double", [pb_utils.Tensor("T", np.zeros(3, np.float32))]).exec(),
        }
        return np.zeros(4), {k: [r.has_error(), r.error().message()] for k, r in cases.items()}

    async def crash(self, t):
        r = call("fails", [pb_utils.Tensor("T", np.full(4, 2, np.float32))], ["T"]).exec()
        return np.zeros(4), {"error": r.has_error() and r.error().message()}

    async def big(self, t):  # 1 MiB in and out, forty times: nothing is kept
        x = np.ones(1 << 18, np.float32)
        total = 0.0
        for _ in range(40):
            r = call("double_any", [pb_utils.Tensor("T", x)], ["T"]).exec()
            total += float(out(r, "T").as_numpy()[0])
        return np.full(4, total), {}
"""

RELAY = """
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        self.next = parameters["NEXT"]["string_value"]
        self.nap = float(parameters.get("NAP", {}).get("string_value", 0))

    def execute(self, requests):
        depth = int(pb_utils.get_input_tensor_by_name(requests[0], "DEPTH").as_numpy()[0])
        info = b"ok"
        if depth > 0:
            time.sleep(self.nap)  # a batch comes for this instance before the call goes
            r = pb_utils.InferenceRequest(
                model_name=self.next, requested_output_names=["INFO"],
                inputs=[pb_utils.Tensor("DEPTH", np.array([depth - 1], np.int32))]).exec()
            info = (r.error().message().encode() if r.has_error()
                    else pb_utils.get_output_tensor_by_name(r, "INFO").as_numpy()[0])
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("INFO", np.array([info], dtype=np.object_))])]
"""

FORWARD = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.kept = None  # a reply kept beyond the execute that answered with it

    def execute(self, requests):
        responses = []
        for request in requests:
            t = pb_utils.get_input_tensor_by_name(request, "T")
            keep = int(pb_utils.get_input_tensor_by_name(request, "KEEP").as_numpy()[0])
            r = pb_utils.InferenceRequest(
                model_name="double_any", inputs=[t], requested_output_names=["T"]).exec()
            doubled = pb_utils.get_output_tensor_by_name(r, "T")  # answered with as it is
            if keep == 2:  # claims its request input (the broker's arena) as a lent reply
                doubled = pb_utils.Tensor._wrap("T", "FP32", t.as_numpy(), True, t._shared, True)
            kept = np.zeros(0, np.float32) if self.kept is None else self.kept.as_numpy().copy()
            if keep == 1:
                self.kept = doubled
            where = np.array([doubled._shared[0].encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse(
                [doubled, pb_utils.Tensor("KEPT", kept), pb_utils.Tensor("WHERE", where)]))
        return responses
"""

VICTIM = """
import os
import signal

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            t = pb_utils.get_input_tensor_by_name(request, "T").as_numpy()
            if t[0] < 0:
                os.kill(os.getpid(), signal.SIGKILL)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("T", t * 2)]))
        return responses
"""

HOLDER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            t = pb_utils.get_input_tensor_by_name(request, "T")
            r = pb_utils.InferenceRequest(
                model_name="victim", inputs=[t], requested_output_names=["T"]).exec()
            held = pb_utils.get_output_tensor_by_name(r, "T")  # the victim's memory
            crash = pb_utils.InferenceRequest(
                model_name="victim", requested_output_names=["T"],
                inputs=[pb_utils.Tensor("T", -np.ones(4, np.float32))]).exec()
            assert crash.has_error()
            responses.append(pb_utils.InferenceResponse([held]))
        return responses
"""

T4 = '{ name: "T" data_type: TYPE_FP32 dims: [ 4 ] }'
INFO = '{ name: "INFO" data_type: TYPE_STRING dims: [ 1 ] }'


def python_model(repo: Path, name: str, source: str, config: str) -> None:
    write_model(
        repo, name, f'name: "{name}" backend: "python" {config}', files={"1/model.py": source}
    )


def write_repository(repo: Path) -> None:
    source = '{ name: "SOURCE" data_type: TYPE_STRING dims: [ 1 ] }'
    batching = "max_batch_size: 8 dynamic_batching { preferred_batch_size: [ 4 ] "
    batching += "max_queue_delay_microseconds: 300000 }"
    python_model(repo, "double", DOUBLE, f"{batching} input [ {T4} ] output [ {T4}, {source} ]")
    anything = '{ name: "T" data_type: TYPE_FP32 dims: [ -1 ] }'
    python_model(
        repo,
        "double_any",
        DOUBLE.replace("[[t._shared[0].encode()]] * t.shape()[0]", "[b'']"),
        f"input [ {anything} ] output [ {anything}, {source} ]",
    )
    keep = '{ name: "KEEP" data_type: TYPE_INT32 dims: [ 1 ] }'
    kept = '{ name: "KEPT" data_type: TYPE_FP32 dims: [ -1 ] }'
    where = '{ name: "WHERE" data_type: TYPE_STRING dims: [ 1 ] }'
    python_model(
        repo,
        "forward",
        FORWARD,
        f"input [ {anything}, {keep} ] output [ {anything}, {kept}, {where} ]",
    )
    python_model(repo, "victim", VICTIM, f"input [ {T4} ] output [ {T4} ]")
    python_model(repo, "holder", HOLDER, f"input [ {T4} ] output [ {T4} ]")
    n1 = '{ name: "N" data_type: TYPE_INT32 dims: [ 1 ] }'
    out1 = '{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }'
    decoupled = "model_transaction_policy { decoupled: true }"
    python_model(repo, "stream", STREAM, f"{decoupled} input [ {n1} ] output [ {out1} ]")
    python_model(repo, "fails", FAILS, f"input [ {T4} ] output [ {T4} ]")
    mode = '{ name: "MODE" data_type: TYPE_STRING dims: [ 1 ] }'
    python_model(
        repo, "caller", CALLER, f"max_batch_size: 8 input [ {mode}, {T4} ] output [ {T4}, {INFO} ]"
    )
    depth = '{ name: "DEPTH" data_type: TYPE_INT32 dims: [ 1 ] }'
    for name, target, count, nap in (
        ("loner", "loner", 1, 0),
        ("twins", "twins", 2, 0),
        ("ping", "pong", 1, 0),
        ("pong", "ping", 1, 0),
        ("napper", "twins", 1, 0.3),
    ):
        python_model(
            repo,
            name,
            RELAY,
            f"input [ {depth} ] output [ {INFO} ] instance_group [ {{ count: {count} }} ] "
            f'parameters [ {{ key: "NEXT" value: {{ string_value: "{target}" }} }}, '
            f'{{ key: "NAP" value: {{ string_value: "{nap}" }} }} ]',
        )


def repository(tmp: Path) -> Path:
    write_repository(tmp / "repo")
    return tmp / "repo"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from serving(repository)


def run(server: Server, mode: str, t: Any = (1, 2, 3, 4)) -> tuple[np.ndarray, dict[str, Any]]:
    with server.client() as c:
        out = c.infer(
            "caller",
            {"MODE": np.array([[mode]], dtype=np.object_), "T": np.asarray([t], np.float32)},
        )
    return out["T"][0], json.loads(out["INFO"][0, 0])


def test_a_call_reads_the_request_input_in_place_and_carries_parameters(server: Server) -> None:
    t, info = run(server, "sync")
    assert t.tolist() == [2, 4, 6, 8]
    assert info["params"] == {"tag": "t1"}
    assert info["source"] == f"inferpool-{server.run_id}-arena"  # the caller's own input


def test_a_reply_passed_on_is_read_where_the_first_call_wrote_it(server: Server) -> None:
    t, info = run(server, "chain")
    assert t.tolist() == [4, 8, 12, 16]
    first, second = info["sources"]
    assert first == f"inferpool-{server.run_id}-arena"
    assert second.startswith(f"inferpool-{server.run_id}-out"), second


def test_async_calls_are_batched_by_the_called_model(server: Server) -> None:
    with server.client() as c:
        before = _batches(c, "double")
        t, info = run(server, "gather")
        assert t.tolist() == [8, 16, 24, 32] and info["errors"] == [False] * 4
        after = _batches(c, "double")
    assert after.get(4, 0) - before.get(4, 0) == 1, after


def _batches(c: Any, model: str) -> dict[int, int]:
    stats = c.statistics(model)["model_stats"][0]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}


def test_a_decoupled_call_iterates_its_responses(server: Server) -> None:
    for n, expected in ((3, [0, 1, 2]), (0, [])):
        _, info = run(server, "stream", (n, 0, 0, 0))
        assert info == {"got": expected, "final_empty": True}


def test_failed_calls_are_responses_with_errors(server: Server) -> None:
    _, info = run(server, "errors")
    assert all(has_error for has_error, _ in info.values()), info
    messages = {k: m for k, (_, m) in info.items()}
    assert messages["missing"] == (
        "Model nosuch - Error when running inference: Failed for execute the inference "
        "request. Model 'nosuch' is not ready."
    )
    assert messages["fails"] == "fails on purpose"
    assert (
        "Model stream is using the decoupled. The current BLS request call doesn't support"
        in (messages["not_decoupled"])
    )
    assert messages["timeout"].startswith("Request timeout expired: the call to model 'fails'")
    assert "unexpected shape for input 'T' for model 'double'" in messages["bad_input"]
    t, _ = run(server, "sync")  # the caller serves on
    assert t.tolist() == [2, 4, 6, 8]


def test_a_called_model_that_crashes_is_an_error_reply(server: Server) -> None:
    _, info = run(server, "crash")
    assert "instance 'fails_0' of model 'fails' version 1 died with exit code 9" in (info["error"])
    _, info = run(server, "errors")  # it is respawned and answers again
    assert info["fails"] == [True, "fails on purpose"]


def test_reply_memory_goes_back_once_read(server: Server) -> None:
    """Forty 1 MiB replies and forty 1 MiB inputs: more than the 16 MiB arenas hold."""
    t, _ = run(server, "big")
    assert t.tolist() == [80.0] * 4


def forward(c: Any, t: np.ndarray, keep: int = 0) -> dict[str, np.ndarray]:
    return dict(c.infer("forward", {"T": t, "KEEP": np.array([keep], np.int32)}))


def test_a_reply_answered_with_in_place_goes_back_once_the_client_has_it(server: Server) -> None:
    """``forward`` answers with its call's reply as it lies in ``double_any``'s arena: forty
    1 MiB answers, more than that 16 MiB arena holds, so each slot goes back once both the
    client and the caller are done with it.  A ShmClient reads the answer where the reply
    is; over a lane (which answers from the worker's own region) it is copied."""
    x = np.arange(1 << 18, dtype=np.float32)
    with server.client() as c:
        for i in range(40):
            assert np.array_equal(forward(c, x + i)["T"], (x + i) * 2)
    for lane in (False, True):
        with ShmClient(server.endpoint, lane=lane, timeout=20) as shm:
            req = shm.request("forward", ["T", "WHERE"])
            req.input("T", (4,), np.float32)[:] = [1, 2, 3, 4]
            req.input("KEEP", (1,), np.int32)[:] = 0
            with shm.run(req) as result:
                assert result["T"].tolist() == [2, 4, 6, 8]
                reply_at = result["WHERE"][0].decode()
                regions = {region for _, region in result._leases}
            assert (reply_at in regions) is not lane, (reply_at, regions)


def test_a_callers_output_into_a_clients_registered_region_is_the_clients(
    server: Server,
) -> None:
    """A caller still holding its call's reply when it answers writes an output the client
    asked into its own registered region there: the broker passes it (it is neither the
    caller's arena nor a reply slot, and is not refused as one)."""
    region = Region.create(f"ipt-{os.getpid()}-{secrets.token_hex(3)}", 4096, prefault=False)
    try:
        with ShmClient(server.endpoint, timeout=20) as c:
            c.register_system_shared_memory("mine", "/" + region.name, 4096)
            req = c.request("forward", outputs=[])
            req.input("T", (4,), np.float32)[:] = [1, 2, 3, 4]
            req.input("KEEP", (1,), np.int32)[:] = 0
            req.output_to("T", "mine", 16, offset=64)
            with c.run(req) as result:
                assert result["T"].tolist() == [2, 4, 6, 8]
            assert np.frombuffer(region.buf, np.float32, 4, 64).tolist() == [2, 4, 6, 8]
            c.unregister_system_shared_memory("mine")
    finally:
        region.destroy()


def test_an_output_claimed_in_memory_not_lent_to_the_caller_fails_its_request(
    server: Server,
) -> None:
    x = np.ones(4, np.float32)
    with server.client() as c:
        with pytest.raises(InferpoolError) as failed:
            forward(c, x, keep=2)
        assert failed.value.code is Code.INTERNAL
        assert "neither its own nor a reply lent to it" in failed.value.message
        assert forward(c, x)["T"].tolist() == [2, 2, 2, 2]  # it serves on


def test_a_reply_answered_with_and_kept_stays_as_it_was(server: Server) -> None:
    """A reply the caller answers with and also keeps is its own until it drops it: the
    client's release does not give the slot back for other calls to overwrite."""
    x = np.full(1 << 18, 3, np.float32)
    with server.client() as c:
        forward(c, x, keep=1)
        for i in range(20):  # each call's reply takes and gives back double_any's slots
            got = forward(c, np.full(1 << 18, i, np.float32))
            assert np.array_equal(got["T"], np.full(1 << 18, 2 * i)), i
            assert np.array_equal(got["KEPT"], x * 2), i


@pytest.mark.parametrize(
    ("model", "depth", "answer"),
    [
        ("loner", 1, "would never run"),  # it calls itself and has one instance
        ("twins", 1, "ok"),  # the other instance answers
        ("twins", 2, "would never run"),  # ...but not a third level
        ("ping", 2, "would never run"),  # ping -> pong -> ping
    ],
)
def test_calls_that_could_never_run_are_refused(
    server: Server, model: str, depth: int, answer: str
) -> None:
    with server.client(timeout=20) as c:
        info = c.infer(model, {"DEPTH": np.array([depth], np.int32)})["INFO"][0].decode()
        assert answer in info
        if answer != "ok":
            assert "is waiting, directly or through other BLS calls, for it to finish" in info
        assert c.infer("twins", {"DEPTH": np.array([0], np.int32)})["INFO"][0] == b"ok"


@pytest.mark.parametrize(
    ("model", "depth", "answer"),
    [("loner", 1, "would never run"), ("twins", 1, "ok"), ("ping", 2, "would never run")],
)
def test_calls_from_a_lane_served_execute_cannot_deadlock(
    server: Server, model: str, depth: int, answer: str
) -> None:
    """The broker does not schedule lane requests, so a lane-served execute that calls says
    so: its instance is held until the call ends, never handed the call itself."""
    with ShmClient(server.endpoint, lane=True, timeout=20) as c:
        lane = c.lane(model)
        req = c.request(model, outputs=["INFO"])
        req.input("DEPTH", (1,), np.int32)[:] = depth
        with c.run(req) as result:
            info = result["INFO"][0].decode()
        assert lane.sent == 1, "the request took the lane"
        assert answer in info
    with server.client(timeout=20) as c:
        assert c.infer(model, {"DEPTH": np.array([0], np.int32)})["INFO"][0] == b"ok"


def test_a_batch_for_an_instance_a_lanes_execute_holds_waits_without_blocking_its_call(
    server: Server,
) -> None:
    """The broker hands ``napper``'s one instance a batch while a lane's execute holds it (and
    naps before its call): the worker reads the call's reply while the batch waits for the
    instance, so both are answered."""
    with ShmClient(server.endpoint, lane=True, timeout=20) as c, server.client(timeout=20) as z:
        on_lane = c.lane("napper")
        req = c.request("napper", outputs=["INFO"])
        req.input("DEPTH", (1,), np.int32)[:] = 1
        body = on_lane.body(req)
        assert body is not None
        n = on_lane.post(body)
        assert z.infer("napper", {"DEPTH": np.array([1], np.int32)})["INFO"][0] == b"ok"
        with on_lane.result(n, 20) as result:
            assert result["INFO"][0] == b"ok"


def test_a_reply_of_an_instance_that_died_since_fails_the_answer_not_the_broker(
    server: Server,
) -> None:
    """``holder`` answers with its first call's reply after a second call killed the
    called instance: that memory went with it, so the answer is UNAVAILABLE, and the
    broker serves on (it had died reading a region that was gone)."""
    with server.client() as c:
        with pytest.raises(InferpoolError) as failed:
            c.infer("holder", {"T": np.ones(4, np.float32)})
        assert failed.value.code is Code.UNAVAILABLE, failed.value
        assert "has exited since" in failed.value.message
        assert c.infer("double_any", {"T": np.ones(2, np.float32)})["T"].tolist() == [2, 2]
    assert server.proc.poll() is None
