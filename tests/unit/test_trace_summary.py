"""``inferpool trace`` reads Triton's trace format, its records in any order (Triton writes a
trace's timestamps one record each, tensors among them) and several files together."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferpool.trace_summary import read, summarise
from inferpool.usage import UsageError


def stamp(trace_id: int, name: str, ns: int) -> dict:
    return {"id": trace_id, "timestamps": [{"name": name, "ns": ns}]}


def test_tritons_records_in_any_order_make_one_trace_each(tmp_path: Path) -> None:
    grpc = [
        stamp(1, "GRPC_SEND_END", 900),
        {"id": 1, "model_name": "simple", "model_version": 1},
        stamp(1, "GRPC_WAITREAD_START", 100),
        stamp(1, "GRPC_WAITREAD_END", 100),
        stamp(1, "REQUEST_START", 150),
        stamp(1, "QUEUE_START", 160),
        stamp(1, "COMPUTE_START", 200),
        {"id": 1, "activity": "TENSOR_QUEUE_INPUT", "tensor": {"name": "INPUT0", "data": "1"}},
        stamp(1, "COMPUTE_INPUT_END", 210),
        stamp(1, "COMPUTE_OUTPUT_START", 400),
        stamp(1, "COMPUTE_END", 420),
        stamp(1, "REQUEST_END", 500),
        stamp(1, "GRPC_SEND_START", 600),
    ]
    step = [{"id": 2, "model_name": "step", "model_version": 3, "parent_id": 1}]
    step += [stamp(2, "REQUEST_START", 210), stamp(2, "REQUEST_END", 300)]
    (tmp_path / "a.json").write_text(json.dumps(grpc))
    (tmp_path / "a.json.0").write_text(json.dumps([*step, {"not": "a record"}]))
    traces = read([str(tmp_path / "a.json"), str(tmp_path / "a.json.0")])
    assert [(t.model, t.frontend, t.parent) for t in traces] == [
        ("simple", "GRPC", 0),
        ("step", "", 1),
    ]
    [simple, child] = summarise(traces)
    assert (simple["frontend"], child["frontend"]) == ("GRPC", "child")
    means = {stage: s["mean_us"] for stage, s in simple["stages"].items()}
    assert means == {
        "to broker": 0.05,
        "admit": 0.01,
        "queue": 0.04,
        "compute input": 0.01,
        "compute infer": 0.19,
        "compute output": 0.02,
        "answer": 0.08,
        "to frontend": 0.1,
        "send": 0.3,
        "total": 0.8,
    }
    assert child["stages"] == {
        "total": {"count": 1, "mean_us": 0.09, "p50_us": 0.09, "p99_us": 0.09}
    }


@pytest.mark.parametrize(
    "text, says",
    [("{", "is not a trace file"), ('{"id": 1}', "expected a JSON array"), ("[]", "no traces in")],
)
def test_what_is_not_a_trace_file_is_one_clear_error(tmp_path: Path, text: str, says: str) -> None:
    (tmp_path / "t.json").write_text(text)
    with pytest.raises(UsageError, match=says):
        read([str(tmp_path / "t.json")])
