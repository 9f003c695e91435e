"""Triton's trace extension with Triton's own clients: the settings (global and per model,
HTTP, gRPC and zmq), and the trace file the server writes (Triton's records: ids, parent
ids, the timestamps of each stage across the frontend, the broker and the worker; tensors at
the TENSORS level; counts and log frequencies).  One server for the module, tracing every
request of the models a test turns it on for; each test leaves the settings as they were."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from inferpool.client import ShmClient
from tests.support import (
    EXAMPLES,
    Server,
    identity_config,
    run_cli,
    serving,
    wait_until,
    write_model,
)

PIPELINES = EXAMPLES.parent / "pipeline_repository"
TRACED_TOP = (
    (PIPELINES / "top_class" / "1" / "model.py")
    .read_text()
    .replace(
        'requested_output_names=["PROBS"],',
        'requested_output_names=["PROBS"],\n                    trace=request.trace(),',
    )
)
STAGES = [
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
]
OFF = {"trace_level": ["OFF"], "trace_rate": "1", "trace_count": "-1", "log_frequency": "0"}
CLEAR = dict.fromkeys(("trace_level", "trace_rate", "trace_count", "log_frequency"))


def repository(tmp: Path) -> Path:
    repo = tmp / "repo"
    write_model(repo, "identity", identity_config("identity"))
    write_model(repo, "other", identity_config("other"))
    for model in ("normalize", "softmax", "probabilities"):
        shutil.copytree(PIPELINES / model, repo / model)
    shutil.copytree(PIPELINES / "top_class", repo / "top_class")
    (repo / "top_class" / "1" / "model.py").write_text(TRACED_TOP)
    return repo


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from serving(
        repository,
        "--trace-config",
        "triton,file=trace.json",  # (the server's directory)
        "--trace-config",
        "rate=1",
        kserve=True,
    )


@pytest.fixture
def http(server: Server) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.http_url)
    yield client
    for model in ("identity", "top_class", "other"):
        client.update_trace_settings(model_name=model, settings=CLEAR)
    client.update_trace_settings(settings=CLEAR)  # as the server started: OFF
    client.close()


def trace_file(server: Server, suffix: str = "") -> Path:
    return server.log_path.parent / f"trace.json{suffix}"


def records_now(server: Server, suffix: str = "") -> list[dict[str, Any]]:
    """The trace file as it is (a complete JSON array after every write)."""
    path = trace_file(server, suffix)
    return json.loads(path.read_text()) if path.exists() else []


def written(found: list[dict[str, Any]]) -> int:
    """How many traces ``found`` holds (each has one record naming its model)."""
    return sum("model_name" in r for r in found)


def records(server: Server, count: int, suffix: str = "") -> list[dict[str, Any]]:
    """The trace file once it holds ``count`` traces."""

    def enough() -> list[dict[str, Any]]:
        found = records_now(server, suffix)
        return found if written(found) >= count else []

    return wait_until(enough, what=f"{count} traces written to trace.json{suffix}")


def traces(found: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Records grouped by trace id, as Triton's trace_summary.py groups them."""
    out: dict[int, dict[str, Any]] = {}
    for record in found:
        trace = out.setdefault(record["id"], {"stamps": {}, "tensors": []})
        for key in ("model_name", "model_version", "parent_id", "request_id"):
            if key in record:
                trace[key] = record[key]
        for stamp in record.get("timestamps", ()):
            trace["stamps"][stamp["name"]] = stamp["ns"]
        if "tensor" in record:
            trace["tensors"].append((record["activity"], record["tensor"]))
    return out


def infer(client: Any, module: Any, model: str = "identity", n: int = 3, **kw: Any) -> None:
    x = np.arange(n, dtype=np.float32)
    tensor = module.InferInput("INPUT0", [n], "FP32")
    tensor.set_data_from_numpy(x)
    client.infer(model, [tensor], **kw)


# ============================================================================ settings
def test_the_settings_as_tritons_clients_read_and_change_them(
    server: Server, http: httpclient.InferenceServerClient
) -> None:
    start = {**OFF, "trace_rate": "1", "trace_file": "trace.json", "trace_mode": "triton"}
    assert http.get_trace_settings() == start
    assert http.get_trace_settings(model_name="identity") == start  # follows the global
    changed = http.update_trace_settings(
        model_name="identity", settings={"trace_level": ["TIMESTAMPS"], "log_frequency": "2"}
    )
    assert changed == {**start, "trace_level": ["TIMESTAMPS"], "log_frequency": "2"}
    http.update_trace_settings(settings={"trace_rate": "7", "trace_level": ["TENSORS"]})
    # the model keeps what it set, and follows the global for the rest
    mine = http.get_trace_settings(model_name="identity")
    assert (mine["trace_level"], mine["log_frequency"], mine["trace_rate"]) == (
        ["TIMESTAMPS"],
        "2",
        "7",
    )
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    cleared = grpc.update_trace_settings(
        model_name="identity", settings={"trace_level": None}, as_json=True
    )["settings"]
    assert cleared["trace_level"]["value"] == ["TENSORS"] and cleared["log_frequency"]["value"] == [
        "2"
    ]
    with server.client() as c:
        reply = c.call("trace_setting", model_name="identity")
        assert reply["settings"]["trace_rate"] == "7"
        assert "trace" in c.server_metadata()["extensions"]


@pytest.mark.parametrize(
    "model, settings, status, message",
    [
        ("", {"trace_file": "x.json"}, 501, "trace file location can not be updated"),
        ("nosuch", {}, 400, "Request for unknown model : nosuch"),
        ("", {"trace_rate": "often"}, 400, "Unable to parse 'trace_rate', got: often"),
        ("", {"trace_count": "-2"}, 400, "Expecting value >= -1, got: -2"),
        ("", {"log_frequency": "10000000000"}, 400, "value is out of range [ 0, 4294967295 ]"),
        ("", {"trace_level": ["OFF", "TIMESTAMPS"]}, 400, "Expect only one trace level 'OFF'"),
        ("", {"trace_level": ["LOUD"]}, 400, "unknown trace level 'LOUD'"),
        (
            "",
            {"trace_level": ["TIMESTAMPS"], "trace_rate": "0"},
            400,
            "Attempting to set invalid trace setting :sample rate must be non-zero",
        ),
    ],
)
def test_what_cannot_change_is_refused_in_tritons_words(
    http: httpclient.InferenceServerClient, model: str, settings: dict, status: int, message: str
) -> None:
    before = http.get_trace_settings()
    with pytest.raises(InferenceServerException) as err:
        http.update_trace_settings(model_name=model or None, settings=settings)
    assert err.value.status() == str(status) and message in err.value.message()
    assert http.get_trace_settings() == before


# ============================================================================ the trace file
def test_a_traced_request_has_tritons_stamps_across_frontend_broker_and_worker(
    server: Server, http: httpclient.InferenceServerClient
) -> None:
    before = written(records_now(server))
    http.update_trace_settings(model_name="identity", settings={"trace_level": ["TIMESTAMPS"]})
    infer(http, httpclient, request_id="h1")
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    infer(grpc, grpcclient, request_id="g1")
    with server.client() as c:  # a zmq client's: the broker's and the worker's stamps
        c.infer("identity", {"INPUT0": np.ones(2, np.float32)})
        c.infer("other", {"INPUT0": np.ones(2, np.float32)})  # not traced
    found = list(traces(records(server, before + 3)).values())[-3:]
    assert [t.get("request_id") for t in found[:2]] == ["h1", "g1"]
    assert {t["model_name"] for t in found} == {"identity"}
    for trace, frontend in zip(found, ("HTTP", "GRPC", None), strict=True):
        assert trace["model_version"] == 1
        stamps = trace["stamps"]
        assert [stamps[s] for s in STAGES] == sorted(stamps[s] for s in STAGES), stamps
        if frontend is None:
            assert set(stamps) == set(STAGES)
            continue
        received = {"HTTP": "HTTP_RECV_START", "GRPC": "GRPC_WAITREAD_START"}[frontend]
        assert stamps[received] <= stamps["REQUEST_START"] < stamps[f"{frontend}_SEND_END"]
        assert stamps[f"{frontend}_SEND_START"] >= stamps["COMPUTE_END"]


def test_an_ensembles_steps_and_a_bls_call_are_its_children(
    server: Server, http: httpclient.InferenceServerClient
) -> None:
    before = written(records_now(server))
    http.update_trace_settings(model_name="top_class", settings={"trace_level": ["TIMESTAMPS"]})
    raw = httpclient.InferInput("RAW", [3], "FP32")
    raw.set_data_from_numpy(np.array([1, 5, 2], np.float32))
    assert http.infer("top_class", [raw]).as_numpy("CLASS")[0] == 1
    found = traces(records(server, before + 1))
    [top] = [t for i, t in found.items() if t["model_name"] == "top_class" and i > before]
    top_id = next(i for i, t in found.items() if t is top)
    [ensemble] = [t for t in found.values() if t.get("parent_id") == top_id]
    ensemble_id = next(i for i, t in found.items() if t is ensemble)
    steps = [t for t in found.values() if t.get("parent_id") == ensemble_id]
    assert ensemble["model_name"] == "probabilities"
    assert sorted(t["model_name"] for t in steps) == ["normalize", "softmax"]
    assert "COMPUTE_START" not in ensemble["stamps"]  # an ensemble computes in its steps
    normalize, softmax = sorted(steps, key=lambda t: t["stamps"]["REQUEST_START"])
    assert normalize["stamps"]["COMPUTE_END"] <= softmax["stamps"]["COMPUTE_START"]
    span = ensemble["stamps"]
    assert span["REQUEST_START"] <= normalize["stamps"]["REQUEST_START"]
    assert softmax["stamps"]["REQUEST_END"] <= span["REQUEST_END"]
    assert top["stamps"]["COMPUTE_START"] <= span["REQUEST_START"] <= top["stamps"]["COMPUTE_END"]


def test_tensors_count_and_log_frequency(
    server: Server, http: httpclient.InferenceServerClient
) -> None:
    http.update_trace_settings(
        model_name="other",
        settings={"trace_level": ["TIMESTAMPS", "TENSORS"], "log_frequency": "2"},
    )
    first = 0
    while trace_file(server, f".{first}").exists():
        first += 1
    for _ in range(3):
        infer(http, httpclient, model="other", n=2)
    indexed = traces(records(server, 2, f".{first}"))  # every two traces, a file
    for trace in indexed.values():
        assert trace["tensors"] == [
            (
                "TENSOR_QUEUE_INPUT",
                {"name": "INPUT0", "data": "0.0,1.0", "shape": "2", "dtype": "FP32"},
            ),
            (
                "TENSOR_BACKEND_OUTPUT",
                {"name": "OUTPUT0", "data": "0.0,1.0", "shape": "2", "dtype": "FP32"},
            ),
        ]
    # a count: the traces collected go to an indexed file once it runs out (Triton's rule)
    http.update_trace_settings(
        model_name="other", settings={"trace_count": "2", "log_frequency": None}
    )  # (the third trace, kept for the frequency, is written as the setting changes)
    assert len(traces(records(server, 1, f".{first + 1}"))) == 1
    for _ in range(3):
        infer(http, httpclient, model="other", n=2)
    assert len(traces(records(server, 2, f".{first + 2}"))) == 2
    assert http.get_trace_settings(model_name="other")["trace_count"] == "0"


def test_inferpool_trace_summarises_the_file_stage_by_stage(
    server: Server, http: httpclient.InferenceServerClient, tmp_path: Path
) -> None:
    http.update_trace_settings(model_name="identity", settings={"trace_level": ["TIMESTAMPS"]})
    before = written(records_now(server))
    for _ in range(3):
        infer(http, httpclient)
    records(server, before + 3)
    picture = tmp_path / "stages.png"
    status, out, err = run_cli("trace", str(trace_file(server)), "--json", "--plot", str(picture))
    assert status == 0, err
    summary = json.loads(out[: out.rindex("]") + 1])
    [group] = [g for g in summary if (g["model"], g["frontend"]) == ("identity", "HTTP")]
    stages = group["stages"]
    assert group["traces"] >= 3 and stages["queue"]["count"] == group["traces"]
    parts = "receive,to broker,admit,queue,compute input,compute infer,compute output,answer"
    parts += ",to frontend,send"
    total = sum(stages[p]["mean_us"] for p in parts.split(","))
    assert total == pytest.approx(stages["total"]["mean_us"])
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    status, out, _ = run_cli("trace", str(trace_file(server)))
    assert status == 0 and "identity (version 1), HTTP" in out and "compute infer" in out
    status, _, err = run_cli("trace", str(tmp_path / "none.json"))
    assert status == 2 and err.count("\n") == 1 and "No such file" in err


def test_lane_requests_are_traced_by_their_worker(
    server: Server, http: httpclient.InferenceServerClient
) -> None:
    """Lanes never pass the broker: the worker samples every rate-th lane request and its
    instants come with the lanes' statistics."""
    http.update_trace_settings(
        model_name="other", settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "2"}
    )
    before = written(records_now(server))
    with ShmClient(server.endpoint, lane=True, timeout=10) as c:
        assert c.lane("other").usable
        for _ in range(6):
            req = c.request("other", outputs=["OUTPUT0"])
            req.input("INPUT0", (2,), np.float32)[:] = 1
            with c.run(req) as result:
                assert result["OUTPUT0"].tolist() == [1, 1]
    with server.client() as c:  # (what lanes served reaches the broker a little later)
        wait_until(
            lambda: c.statistics("other")["model_stats"][0]["lane_stats"]["success"] >= 6,
            what="six requests served on the lane",
        )
    found = list(traces(records(server, before + 3)).values())[-3:]
    for trace in found:
        assert trace["model_name"] == "other" and "parent_id" not in trace
        stamps = trace["stamps"]
        assert set(stamps) == set(STAGES)
        assert [stamps[s] for s in STAGES] == sorted(stamps[s] for s in STAGES)
