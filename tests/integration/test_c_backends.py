"""C backends built against the project's headers, served by the real broker and workers
(one server for the module; it must stop with nothing of its run left in /dev/shm): the
answer's bytes and parameters, statistics and custom metrics, a decoupled backend answering
from its own thread, implicit sequence state, errors of every kind, a crash mid-execute
that takes only its worker, a config the backend completes, and a BLS backend that calls
another model through Triton's in-process API and waits in its execute for the callback."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from inferpool.backends.testing import BackendHarness
from inferpool.client import InferpoolError, ShmClient
from inferpool.shm.region import Region
from tests.cabi_support import build, compiler, install
from tests.integration.test_metrics import scrape
from tests.support import Server, free_tcp_port, serving, wait_until, write_model

ECHO = """
    name: "echo"
    backend: "echo"
    max_batch_size: 8
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
            { name: "INPUT1" data_type: TYPE_INT64 dims: [ -1 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
             { name: "OUTPUT1" data_type: TYPE_INT64 dims: [ -1 ] } ]
"""
REPEAT = """
    name: "repeat"
    backend: "repeat"
    max_batch_size: 0
    model_transaction_policy { decoupled: true }
    input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
    output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
             { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]
"""
ACCUMULATE = """
    name: "accumulate"
    backend: "accumulate"
    max_batch_size: 0
    sequence_batching {
      state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE"
                data_type: TYPE_INT32 dims: [ 1 ] } ]
    }
    input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
FAULTY = """
    name: "faulty"
    backend: "faulty"
    max_batch_size: 0
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
REFUSED = FAULTY.replace('name: "faulty"', 'name: "refused"') + (
    'parameters { key: "refuse" value: { string_value: "yes" } }'
)
COMPLETE = """
    name: "complete"
    backend: "complete"
"""
CALLER = """
    name: "caller"
    backend: "caller"
    max_batch_size: 0
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
             { name: "COUNTS" data_type: TYPE_INT64 dims: [ 4 ] } ]
"""
METRICS_PORT = free_tcp_port()


SHADOWED = 'raise RuntimeError("a backend later in the search order must not be imported")\n'


def _repository(tmp: Path) -> Path:
    repo = tmp / "repo"
    for name, config in [
        ("echo", ECHO),
        ("repeat", REPEAT),
        ("accumulate", ACCUMULATE),
        (
            "faulty",
            FAULTY.replace('OUTPUT0" data_type', 'OUTPUT0" label_filename: "labels" data_type'),
        ),
        ("complete", COMPLETE),
        ("caller", CALLER),
    ]:
        write_model(repo, name, config)
        install(name, repo / name)
    (repo / "faulty" / "labels").write_text("cat\ndog\n\nbird\n")  # class 2 has no label
    # in each place the library comes before the Python forms
    (repo / "echo" / "echo.py").write_text(SHADOWED)
    # the version directory's library before the model directory's (here not a library)
    write_model(repo, "in_version", ECHO.replace('name: "echo"', 'name: "in_version"'))
    install("echo", repo / "in_version" / "1")
    (repo / "in_version" / "libtriton_echo.so").write_text(SHADOWED)
    write_model(repo, "refused", REFUSED)  # its ModelInitialize fails
    install("faulty", repo / "refused")
    write_model(repo, "unloadable", ECHO.replace('name: "echo"', 'name: "unloadable"'))
    (repo / "unloadable" / "libtriton_echo.so").write_text("not a library\n")
    # a custom batching strategy: as the model's batchstrategy.so, or in its backend library
    write_model(repo, "strategy", ECHO.replace('name: "echo"', 'name: "strategy"'))
    install("echo", repo / "strategy")
    shutil.copyfile(build("batching"), repo / "strategy" / "batchstrategy.so")
    write_model(repo, "batching", FAULTY.replace('"faulty"', '"batching"'))
    install("batching", repo / "batching")
    # none in the model's directories: the backend directory's
    write_model(repo, "from_directory", ECHO.replace('name: "echo"', 'name: "from_directory"'))
    return repo


@pytest.fixture(scope="module")
def backends() -> Iterator[Path]:
    compiler()
    directory = Path(tempfile.mkdtemp(prefix="ipt-backends-"))
    install("echo", directory / "echo")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def server(backends: Path) -> Iterator[Server]:
    yield from serving(
        _repository,
        "--metrics-port",
        str(METRICS_PORT),
        "--backend-config=echo,flavour=vanilla",
        "--backend-directory",
        str(backends),
        "--log-verbose",  # the backends' lines as they load
        "1",
        "--exit-on-error=false",  # refused and unloadable fail to load, by design
    )


def test_every_request_and_response_function(server: Server, backends: Path) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    y = np.array([[1, -2, 3], [4, 5, -6]], dtype=np.int64)
    parameters = {"text": "hello", "number": 7, "flag": True, "ratio": 0.25}
    with server.client() as c:
        result = c.infer_result("echo", {"INPUT0": x, "INPUT1": y}, parameters=parameters)
        only = c.infer("echo", {"INPUT0": x, "INPUT1": y}, ["OUTPUT1"])
    np.testing.assert_array_equal(result.outputs["OUTPUT0"], x)
    np.testing.assert_array_equal(result.outputs["OUTPUT1"], y)
    assert list(only) == ["OUTPUT1"]
    np.testing.assert_array_equal(only["OUTPUT1"], y)
    p = result.parameters
    assert (p["echo_text"], p["echo_number"], p["echo_flag"], p["echo_ratio"]) == (
        "hello", 7, True, 0.25
    )  # fmt: skip
    cmdline = json.loads(p["backend_config"])["cmdline"]
    assert cmdline["flavour"] == "vanilla"  # --backend-config reaches BackendConfig
    assert cmdline["backend-directory"] == str(backends)
    # TRITONSERVER_LogMessage: into the worker's log, with the backend's file and line
    assert re.search(
        r"\[echo_0 pid \d+\] inferpool\.backend\.echo: backend echo config", server.log()
    )
    assert (p["param0"], p["param1"], p["param2"], p["param3"]) == (
        "an example string parameter", 42, False, 123.123
    )  # fmt: skip


def test_statistics_and_custom_metric(server: Server) -> None:
    x = np.ones((1, 4), np.float32)
    y = np.ones((1, 2), np.int64)
    with server.client() as c:
        before = c.statistics("echo")["model_stats"][0]
        for _ in range(3):
            c.infer("echo", {"INPUT0": x, "INPUT1": y})
        after = c.statistics("echo")["model_stats"][0]
    success = (
        after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    )
    assert after["memory_usage"] == [{"type": "CPU", "id": 0, "byte_size": 4096}]
    assert success == 3
    assert after["execution_count"] - before["execution_count"] == 3
    assert (
        after["inference_stats"]["compute_infer"]["ns"]
        > before["inference_stats"]["compute_infer"]["ns"]
    )
    got = scrape(METRICS_PORT)
    labels = (("model", "echo"), ("version", "1"))
    assert got[("TYPE echo_input_bytes", ())] == "counter"
    assert got[("echo_input_bytes", labels)] >= 3 * (x.nbytes + y.nbytes)


def test_decoupled_responses_from_the_backends_thread(server: Server) -> None:
    values = np.array([5, 6, 7], np.int32)
    with server.client() as c:
        results = list(c.stream("repeat", {"IN": values}))
        assert list(c.stream("repeat", {"IN": np.zeros(0, np.int32)})) == []
    assert [r.outputs["OUT"].tolist() for r in results] == [[5], [6], [7]]
    assert [r.outputs["IDX"].tolist() for r in results] == [[0], [1], [2]]


def test_implicit_state_carried_through_a_sequence(server: Server) -> None:
    def send(c, value: int, corr: int, **flags: bool) -> int:
        out = c.infer(
            "accumulate",
            {"INPUT": np.array([value], np.int32)},
            parameters={"sequence_id": corr, **flags},
        )
        return int(out["OUTPUT"][0])

    with server.client() as c:
        assert send(c, 1, 11, sequence_start=True) == 1
        assert send(c, 2, 11) == 3
        assert send(c, 3, 11, sequence_end=True) == 6
        assert send(c, 20, 12, sequence_start=True) == 20  # a new sequence starts from zeros
        assert send(c, 5, 12, sequence_end=True) == 25


def test_errors_of_a_request_and_of_a_batch(server: Server) -> None:
    with server.client() as c:
        with pytest.raises(InferpoolError) as one:
            c.infer("faulty", {"INPUT0": np.array([1, 0], np.float32)})
        assert (one.value.code.value, one.value.message) == (
            "INVALID_ARG", "a one is not welcome here"
        )  # fmt: skip
        with pytest.raises(InferpoolError) as batch:
            c.infer("faulty", {"INPUT0": np.array([2], np.float32)})
        assert batch.value.code.value == "UNAVAILABLE"
        assert batch.value.message == "the device is on fire"  # as Triton answers it
        ok = c.infer("faulty", {"INPUT0": np.array([0, 9], np.float32)})
        np.testing.assert_array_equal(ok["OUTPUT0"], [0, 9])
        stats = c.statistics("faulty")["model_stats"][0]["inference_stats"]
    assert stats["fail"]["count"] >= 2 and stats["success"]["count"] >= 1


def test_a_bls_call_from_c(server: Server) -> None:
    """The caller backend (tests/cabi_backends/caller.c) blocks its execute until the
    called model's response callback has run, on the broker path and over a lane."""
    x = np.array([0, 1, 2, 3, 4.5], np.float32)
    with server.client() as c:
        result = c.infer_result("caller", {"INPUT0": x})  # its input passed by reference
        np.testing.assert_array_equal(result.outputs["OUTPUT0"], x)
        split = c.infer("caller", {"INPUT0": x}, parameters={"split": True})  # copied
        np.testing.assert_array_equal(split["OUTPUT0"], x)
        p = result.parameters
        assert (p["callee"], p["callee_version"], p["callee_txn"]) == ("faulty", 1, 1)
        assert p["callee_ready"] is True and p["missing_ready"] is False
        assert p["ready_in_callback"] is True  # the API called from the response callback
        assert json.loads(p["callee_config"])["name"] == "faulty"
        # TRITONSERVER_InferenceResponseOutputClassificationLabel: the file's labels, null
        # for an empty line and past its end, Triton's error for an output that is not there
        assert p["callee_labels"] == "cat,dog,-,bird"
        assert p["callee_label_past"] == "out of bounds index 5: response has 1 outputs"
        # the called model's error reaches the backend as a TRITONSERVER_Error
        with pytest.raises(InferpoolError) as failed:
            c.infer("caller", {"INPUT0": np.array([1], np.float32)})
        assert (failed.value.code.value, failed.value.message) == (
            "INVALID_ARG", "the call: Invalid argument: a one is not welcome here"
        )  # fmt: skip
        with pytest.raises(InferpoolError) as missing:  # Triton's error, from RequestNew
            c.infer("caller", {"INPUT0": x}, parameters={"target": "no_such_model"})
        assert (missing.value.code.value, missing.value.message) == (
            "NOT_FOUND",
            "TRITONSERVER_InferenceRequestNew: Not found: "
            "Request for unknown model: 'no_such_model' is not found",
        )
        # a decoupled model's responses one by one, then a null response with the final flag
        streamed = c.infer_result("caller", {"INPUT0": x[1:4]}, parameters={"stream": True})
        np.testing.assert_array_equal(streamed.outputs["OUTPUT0"], [1, 2, 3])
        assert streamed.parameters["responses"] == 3 and streamed.parameters["null_final"]
    with ShmClient(server.endpoint, lane=True) as lane:
        req = lane.request("caller", outputs=["OUTPUT0", "COUNTS"])
        req.input("INPUT0", (2,), np.float32)[:] = [0, 7]
        for _ in range(2):
            with lane.run(req) as out:
                np.testing.assert_array_equal(out["OUTPUT0"], [0, 7])
                counts = out["COUNTS"].tolist()
    # nothing leaked: every request made was released, every output buffer given back
    made, released, allocated, freed = counts
    assert made == 5 and released == made and allocated == 6 and freed == allocated


@pytest.mark.parametrize(("what", "signal_name"), [(3, "SIGSEGV"), (4, "SIGABRT")])
def test_a_crash_mid_execute_takes_only_its_worker(
    server: Server, what: int, signal_name: str
) -> None:
    with server.client() as c:
        before = {r["instance"]: r for r in c.status()}
        with pytest.raises(InferpoolError) as crashed:
            c.infer("faulty", {"INPUT0": np.array([what], np.float32)})
        assert signal_name in crashed.value.message
        np.testing.assert_array_equal(c.infer("echo", {
            "INPUT0": np.ones((1, 4), np.float32), "INPUT1": np.ones((1, 1), np.int64)
        })["OUTPUT0"], np.ones((1, 4)))  # fmt: skip
        row = wait_until(
            lambda: next(
                (r for r in c.status() if r["instance"] == "faulty_0" and r["state"] == "READY"),
                None,
            ),
            "the faulty instance restarted",
        )
        assert row is not None and row["restarts"] == before["faulty_0"]["restarts"] + 1
        assert row["pid"] != before["faulty_0"]["pid"]
        np.testing.assert_array_equal(
            c.infer("faulty", {"INPUT0": np.array([0.0], np.float32)})["OUTPUT0"], [0.0]
        )


def test_a_config_the_backend_completes(server: Server) -> None:
    with server.client() as c:
        meta = c.model_metadata("complete")
        out = c.infer("complete", {"INPUT0": np.array([[1, 2, 3]], np.float32)})
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("INPUT0", "FP32", [-1, 3])
    ]
    np.testing.assert_array_equal(out["OUTPUT0"], [[2, 4, 6]])


def test_a_backend_told_not_to_complete_leaves_the_config_as_written(tmp_path: Path) -> None:
    """--disable-auto-complete-config reaches TRITONBACKEND_ModelAutoCompleteConfig (as the
    backend setting Triton's core passes): complete.c then leaves its config alone."""
    install("complete", tmp_path)
    off = {"auto-complete-config": "false"}
    with BackendHarness(
        "complete", COMPLETE, repository_path=str(tmp_path), backend_config=off
    ) as h:
        assert h.host.config.max_batch_size == 0 and not h.host.config.input


@pytest.mark.parametrize("model", ["in_version", "from_directory"])
def test_found_in_tritons_search_order(server: Server, model: str) -> None:
    x = np.ones((1, 4), np.float32)
    with server.client() as c:
        out = c.infer(model, {"INPUT0": x, "INPUT1": np.ones((1, 1), np.int64)})
    np.testing.assert_array_equal(out["OUTPUT0"], x)


def test_backend_log_lines_in_json(short_tmp: Path, backends: Path) -> None:
    repo = short_tmp / "repo"
    write_model(repo, "echo", ECHO)
    args = ("--log-format", "json", "--backend-directory", str(backends), "--log-verbose", "1")
    with Server(short_tmp, repo, *args):
        pass
    log = (short_tmp / "server.log").read_text().splitlines()
    lines = [json.loads(line) for line in log if line.startswith("{")]  # (not the banner)
    [line] = [x for x in lines if x["message"].startswith("backend echo config")]
    assert line["logger"] == "inferpool.backend.echo"
    assert line["level"] == "INFO" and line["instance"] == "echo_0"
    assert re.fullmatch(r"echo\.c:\d+", line["source"])


def test_a_backend_that_fails_to_load_fails_its_model_only(server: Server) -> None:
    with server.client() as c:
        states = {m["name"]: m for m in c.models()}
    assert states["refused"]["state"] == "UNAVAILABLE"
    assert states["refused"]["reason"].endswith(
        "TRITONBACKEND_ModelInitialize (Model.initialize) failed: refused by its config"
    )
    assert states["unloadable"]["state"] == "UNAVAILABLE"
    assert "unable to load backend library" in states["unloadable"]["reason"]
    assert "libtriton_echo.so" in states["unloadable"]["reason"]
    assert states["echo"]["state"] == "READY"


def test_a_custom_batching_strategy_fails_its_model_at_load(server: Server) -> None:
    with server.client() as c:
        states = {m["name"]: m for m in c.models()}
    for name, where in [
        ("strategy", "model 'strategy': the custom batching strategy in "),
        ("batching", "backend 'batching': the custom batching strategy in "),
    ]:
        assert states[name]["state"] == "UNAVAILABLE"
        reason = states[name]["reason"]
        assert where in reason and "is not supported by inferpool" in reason, reason
        assert "never calls TRITONBACKEND_ModelBatchIncludeRequest" in reason
    assert states["strategy"]["reason"].count("batchstrategy.so") == 1


def test_a_failed_execute_gives_back_the_state_it_took(tmp_path: Path) -> None:
    """In one process (BackendHarness): the state buffer a failed execute took is free."""
    install("accumulate", tmp_path)
    with BackendHarness("accumulate", ACCUMULATE, repository_path=str(tmp_path)) as h:
        first = h.request({"INPUT": np.array([-1], np.int32)}, correlation_id=5, flags=1)
        [(_, response, final)] = h.execute([first])
        assert final and response is not None and response.error is not None
        assert response.error.message == "minus one"
        assert h.memory.held() == 0


def test_inputs_from_and_outputs_into_a_clients_region(server: Server) -> None:
    """The backend reads its input where the client wrote it and writes its output into the
    client's region (InputBuffer and OutputBuffer over the registered window)."""
    region = Region.create(f"ipt-{os.getpid()}-cabi", 4096, prefault=False)
    try:
        data = np.frombuffer(region.buf, np.float32)
        data[:4] = [0, 5, 6, 7]
        with ShmClient(server.endpoint, input_bytes=0) as c:
            c.register_system_shared_memory("data", "/" + region.name, 4096)
            req = c.request("faulty", outputs=[])
            req.input_from("INPUT0", "data", [4], "FP32", 16)
            req.output_to("OUTPUT0", "data", 16, offset=2048)
            with c.run(req) as result:
                np.testing.assert_array_equal(result["OUTPUT0"], [0, 5, 6, 7])
            np.testing.assert_array_equal(data[512:516], [0, 5, 6, 7])
            c.unregister_system_shared_memory("data")
    finally:
        region.destroy()


def test_served_over_a_lane(server: Server) -> None:
    with ShmClient(server.endpoint, lane=True) as c:
        req = c.request("faulty", outputs=["OUTPUT0"])
        req.input("INPUT0", (3,), np.float32)[:] = [0, 3, 4]
        for _ in range(3):
            with c.run(req) as result:
                np.testing.assert_array_equal(result["OUTPUT0"], [0, 3, 4])
        assert len(c.session.lanes.lanes) == 1  # the requests took the lane
