"""Python-backend models served for real: ``inferpool serve``, one worker process per instance.

One server for the module (its repository below) keeps the suite fast; every model shows one
thing: numpy bodies (INT32/FP32, BYTES), a config completed by ``auto_complete_config``
(inputs, batching, the decoupled policy) that the broker serves and admits by, streams to the
sync and the asyncio client, and what happens when model.py fails in each place it can.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from inferpool.client import AsyncClient, Code, InferpoolError
from tests.support import EXAMPLES, Server, write_model

# config.pbtxt names no inputs or outputs: auto_complete_config adds them, with batching
ADD_SUB_INT32 = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        for name in ("INPUT0", "INPUT1"):
            config.add_input({"name": name, "data_type": "TYPE_INT32", "dims": [4]})
        for name in ("OUTPUT0", "OUTPUT1"):
            config.add_output({"name": name, "data_type": "TYPE_INT32", "dims": [4]})
        config.set_max_batch_size(8)
        config.set_dynamic_batching()
        return config

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", (a + b).astype(np.int32)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(np.int32)),
            ]))
        return responses
"""

STRINGS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            upper = np.array([t.upper() for t in text.reshape(-1)], dtype=object)
            lengths = np.array([len(t) for t in text.reshape(-1)], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("UPPER", upper.reshape(text.shape)),
                pb_utils.Tensor("LENGTH", lengths.reshape(text.shape)),
            ]))
        return responses
"""

# decoupled only through auto_complete_config; answers from its own threads
REPEAT = """
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.set_model_transaction_policy({"decoupled": True})
        return config

    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            thread = threading.Thread(target=self.send, args=(request.get_response_sender(), n))
            thread.start()
            self.threads.append(thread)
        return None

    def send(self, sender, n):
        for i in range(n):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()
"""

# X = 1: execute raises; X = 2: no answer at all; X = 3: slow; otherwise: its pid
MISBEHAVE = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        x = int(pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()[0])
        if x == 1:
            raise ValueError("misbehave refuses X=1")
        if x == 2:
            return None
        if x == 3:
            time.sleep(1.0)
        pid = np.array([os.getpid()], np.int64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", pid)]) for _ in requests]
"""

BROKEN_INIT = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("no weights found")

    def execute(self, requests):
        return []
"""

# the first instance to boot completes the config one way, the second another way
SPLIT_BRAIN = """
import os


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        marker = os.path.join(os.path.dirname(__file__), "first")
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            name = "FIRST"
        except FileExistsError:
            name = "SECOND"
        config.add_output({"name": name, "data_type": "TYPE_INT32", "dims": [1]})
        return config

    def execute(self, requests):
        return []
"""

BAD_DIMS = """
class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [0]})
        return config

    def execute(self, requests):
        return []
"""

MORE_INSTANCES = """
class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.as_dict()["instance_group"][0]["count"] = 4
        return config

    def execute(self, requests):
        return []
"""


def python_config(name: str, io: str = "", extra: str = "") -> str:
    return f"""
        name: "{name}"
        backend: "python"
        {io}
        {extra}
    """


def write_repository(repo: Path) -> None:
    shutil.copytree(EXAMPLES / "add_sub", repo / "add_sub")
    write_model(
        repo, "add_sub_int32", python_config("add_sub_int32"), files={"1/model.py": ADD_SUB_INT32}
    )
    strings_io = """
        input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ]
        output [ { name: "UPPER" data_type: TYPE_STRING dims: [ -1 ] },
                 { name: "LENGTH" data_type: TYPE_INT32 dims: [ -1 ] } ]
    """
    write_model(
        repo, "strings", python_config("strings", strings_io), files={"1/model.py": STRINGS}
    )
    repeat_io = """
        input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    """
    write_model(repo, "repeat", python_config("repeat", repeat_io), files={"1/model.py": REPEAT})
    misbehave_io = """
        input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
    """
    write_model(
        repo, "misbehave", python_config("misbehave", misbehave_io), files={"1/model.py": MISBEHAVE}
    )
    write_model(
        repo, "broken_init", python_config("broken_init"), files={"1/model.py": BROKEN_INIT}
    )
    write_model(
        repo,
        "split_brain",
        python_config("split_brain", extra="instance_group [ { count: 2 kind: KIND_CPU } ]"),
        files={"1/model.py": SPLIT_BRAIN},
    )
    write_model(repo, "bad_dims", python_config("bad_dims"), files={"1/model.py": BAD_DIMS})
    write_model(
        repo,
        "more_instances",
        python_config("more_instances"),
        files={"1/model.py": MORE_INSTANCES},
    )


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    tmp = Path(tempfile.mkdtemp(prefix="ipy-", dir="/tmp"))
    try:
        write_repository(tmp / "repo")
        # verbose: the start's lines say how often each worker was started
        # broken_init fails to load by design: the others are served
        with Server(tmp, tmp / "repo", "--log-verbose", "1", "--exit-on-error=false") as server:
            yield server
        assert server.proc.returncode == 0, server.log()
        assert server.regions() == [], "the module's server left shared memory behind"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def index(server: Server) -> dict[str, tuple[str, str]]:
    with server.client() as c:
        return {m["name"]: (m["state"], m["reason"]) for m in c.models()}


# ============================================================================ serving
def test_add_sub_example_fp32(server: Server) -> None:
    a = np.array([1.5, 2, 3, 4], np.float32)
    b = np.array([4, 3, 2, 1], np.float32)
    with server.client() as c:
        out = c.infer("add_sub", {"INPUT0": a, "INPUT1": b})
        np.testing.assert_array_equal(out["OUTPUT0"], a + b)
        np.testing.assert_array_equal(out["OUTPUT1"], a - b)
        assert out["OUTPUT0"].dtype == np.float32


def test_auto_completed_config_is_served_and_admitted_by(server: Server) -> None:
    with server.client() as c:
        config = c.model_config("add_sub_int32")
        assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]
        assert config["max_batch_size"] == 8 and "dynamic_batching" in config
        meta = c.model_metadata("add_sub_int32")
        assert meta["inputs"][0] == {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 4]}
        assert [o["name"] for o in meta["outputs"]] == ["OUTPUT0", "OUTPUT1"]
        a = np.arange(8, dtype=np.int32).reshape(2, 4)
        out = c.infer("add_sub_int32", {"INPUT0": a, "INPUT1": a * 3})
        np.testing.assert_array_equal(out["OUTPUT0"], a * 4)
        np.testing.assert_array_equal(out["OUTPUT1"], -a * 2)
        # admission checks against the completed config, before any worker sees the request
        with pytest.raises(InferpoolError) as err:
            c.infer("add_sub_int32", {"INPUT0": a.astype(np.float32), "INPUT1": a})
        assert err.value.code is Code.INVALID_ARG
        assert "expects 'INT32'" in err.value.message
        with pytest.raises(InferpoolError, match=r"batch-size must be <= 8"):
            big = np.zeros((9, 4), np.int32)
            c.infer("add_sub_int32", {"INPUT0": big, "INPUT1": big})


def test_bytes_in_and_out(server: Server) -> None:
    words = np.array([b"alpha", b"", "gr\u00fc\u00df".encode()], dtype=object)
    with server.client() as c:
        out = c.infer("strings", {"TEXT": words})
    assert out["UPPER"].tolist() == [b"ALPHA", b"", "gr\u00fc\u00df".encode().upper()]
    assert out["LENGTH"].tolist() == [5, 0, len("gr\u00fc\u00df".encode())]


# ============================================================================ decoupled
def test_decoupled_stream_with_the_sync_client(server: Server) -> None:
    with server.client() as c:
        assert c.model_config("repeat")["model_transaction_policy"] == {"decoupled": True}
        results = list(c.stream("repeat", {"N": np.array([5], np.int32)}))
        empty = list(c.stream("repeat", {"N": np.array([0], np.int32)}))
    assert [r.outputs["OUT"].tolist() for r in results] == [[0], [1], [2], [3], [4]]
    assert all(r.parameters["triton_final_response"] is False for r in results)
    assert empty == []


def test_infer_refuses_a_decoupled_model_and_points_to_stream(server: Server) -> None:
    """infer() takes one response: a decoupled model is refused before it runs, rather than
    answered by its first response with the rest dropped."""
    n = {"N": np.array([3], np.int32)}
    with server.client() as c:
        with pytest.raises(InferpoolError) as err:
            c.infer("repeat", n)
        assert [r.outputs["OUT"].tolist() for r in c.stream("repeat", n)] == [[0], [1], [2]]

    async def infer_async() -> None:
        async with AsyncClient(server.endpoint, timeout=10) as c:
            await c.infer("repeat", n)

    with pytest.raises(InferpoolError) as async_err:
        asyncio.run(infer_async())
    for e in (err.value, async_err.value):
        assert e.code is Code.UNSUPPORTED and "model 'repeat' has a decoupled" in e.message
        assert "use a stream" in e.message


def test_decoupled_streams_with_the_async_client(server: Server) -> None:
    async def main() -> list[list[int]]:
        async with AsyncClient(server.endpoint, timeout=10) as c:

            async def collect(n: int) -> list[int]:
                stream = c.stream("repeat", {"N": np.array([n], np.int32)})
                return [int(r.outputs["OUT"][0]) async for r in stream]

            return await asyncio.gather(*(collect(n) for n in (3, 0, 7)))

    assert asyncio.run(main()) == [[0, 1, 2], [], list(range(7))]


# ============================================================================ async client
def test_async_client_many_requests_in_flight_and_control_calls(server: Server) -> None:
    async def main() -> None:
        async with AsyncClient(server.endpoint, timeout=10) as c:
            assert await c.is_live() and await c.is_model_ready("add_sub_int32")
            assert (await c.model_config("add_sub_int32"))["max_batch_size"] == 8
            xs = [np.full((1, 4), i, np.int32) for i in range(40)]
            outs = await asyncio.gather(
                *(c.infer("add_sub_int32", {"INPUT0": x, "INPUT1": x}) for x in xs)
            )
            for x, out in zip(xs, outs, strict=True):  # each response reached its own caller
                np.testing.assert_array_equal(out["OUTPUT0"], 2 * x)
            stats = await c.statistics("add_sub_int32")
            assert stats["model_stats"][0]["inference_count"] >= 40
            with pytest.raises(InferpoolError, match="unknown model: 'nosuch'"):
                await c.infer("nosuch", {"X": xs[0]})

    asyncio.run(main())


def test_async_client_times_out_and_drops_the_late_answer(server: Server) -> None:
    async def main() -> None:
        async with AsyncClient(server.endpoint, timeout=10) as c:
            with pytest.raises(InferpoolError) as err:
                await c.infer("misbehave", {"X": np.array([3], np.int32)}, timeout=0.2)
            assert err.value.code is Code.TIMEOUT
            # the slow answer arrives while this request waits behind it; it is not mistaken
            # for this one's
            out = await c.infer("misbehave", {"X": np.array([0], np.int32)})
            assert out["PID"].shape == (1,)

    asyncio.run(main())


# ============================================================================ failures
def test_execute_raising_fails_that_request_and_the_worker_serves_on(server: Server) -> None:
    with server.client() as c:
        [pid] = [s["pid"] for s in c.status() if s["model"] == "misbehave"]
        with pytest.raises(InferpoolError) as err:
            c.infer("misbehave", {"X": np.array([1], np.int32)})
        assert err.value.code is Code.INTERNAL
        assert "ValueError: misbehave refuses X=1" in err.value.message
        out = c.infer("misbehave", {"X": np.array([0], np.int32)})
        assert out["PID"].tolist() == [pid]


def test_unanswered_request_is_internal_naming_the_backend(server: Server) -> None:
    with server.client() as c:
        with pytest.raises(InferpoolError) as err:
            c.infer("misbehave", {"X": np.array([2], np.int32)})
        assert err.value.code is Code.INTERNAL
        assert "backend 'python' did not send a final response for request" in err.value.message
        assert "of model 'misbehave'" in err.value.message
        assert c.infer("misbehave", {"X": np.array([0], np.int32)})["PID"].shape == (1,)


def test_initialize_raising_makes_the_model_unavailable_without_respawning(
    server: Server,
) -> None:
    state, reason = index(server)["broken_init"]
    assert state == "UNAVAILABLE"
    assert "TRITONBACKEND_ModelInstanceInitialize (ModelInstance.initialize) failed" in reason
    assert "TritonPythonModel.initialize() in" in reason
    assert "RuntimeError: no weights found" in reason
    with server.client() as c:
        [status] = [s for s in c.status() if s["model"] == "broken_init"]
        with pytest.raises(InferpoolError) as err:
            c.infer("broken_init", {"X": np.ones(1, np.float32)})
    assert status["state"] == "FAILED" and status["pid"] is None and status["restarts"] == 0
    assert err.value.code is Code.UNAVAILABLE and "no weights found" in err.value.message
    assert server.log().count("started worker broken_init_0") == 1


def test_instances_completing_differently_refuse_the_load(server: Server) -> None:
    state, reason = index(server)["split_brain"]
    assert state == "UNAVAILABLE"
    assert "completed the configuration differently (they differ in output)" in reason
    assert "split_brain_0_0" in reason and "split_brain_0_1" in reason


def test_a_completed_config_is_validated(server: Server) -> None:
    state, reason = index(server)["bad_dims"]
    assert state == "UNAVAILABLE"
    assert "as completed by backend 'python'" in reason
    assert "input 'X' has invalid dims [0]: each must be -1 or > 0" in reason
    state, reason = index(server)["more_instances"]
    assert state == "UNAVAILABLE"
    assert "changed instance_group while completing the configuration" in reason
