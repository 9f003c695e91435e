"""Warm-up, served for real: every instance runs every ``model_warmup`` sample (zeros, random
bytes, data files; batch size and count) before its model is READY, the samples do not count
in the statistics, and a failing or malformed sample fails the load with Triton's words."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.integration.recording import Served, model_py, seen, served
from tests.support import write_model

# records every request it runs; TEXT "fail" makes it answer with an error
WARM = model_py("""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.record = Recorder(args)
        self.instance = args["model_instance_name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            self.record(
                instance=self.instance,
                id=request.request_id(),
                batch=len(requests),
                shape=list(x.shape),
                dtype=str(x.dtype),
                x=x.reshape(-1).tolist(),
                text=[t.decode() for t in text.reshape(-1)],
            )
            if b"fail" in text.reshape(-1).tolist():
                error = pb_utils.TritonError("the model refuses the word fail")
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return responses
""")

IO = """
    max_batch_size: 4
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] },
            { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
    output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""
GOOD = """
    instance_group [ { count: 2 kind: KIND_CPU } ]
    model_warmup [
      { name: "zeros" batch_size: 2 count: 2
        inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } }
        inputs { key: "TEXT" value: { data_type: TYPE_STRING dims: [ 1 ] zero_data: true } } },
      { name: "random" batch_size: 1
        inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 2 ] random_data: true } }
        inputs { key: "TEXT" value: { data_type: TYPE_STRING dims: [ 1 ] random_data: true } } },
      { name: "files" batch_size: 1
        inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 2 ] input_data_file: "x.bin" } }
        inputs { key: "TEXT" value: { data_type: TYPE_STRING dims: [ 1 ]
                                      input_data_file: "text.bin" } } },
      { name: "skipped" batch_size: 0
        inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } } }
    ]
"""


def sample(name: str, x: str, text: str = "zero_data: true") -> str:
    return f"""model_warmup [ {{ name: "{name}" batch_size: 1
        inputs {{ key: "X" value: {{ data_type: TYPE_FP32 {x} }} }}
        inputs {{ key: "TEXT" value: {{ data_type: TYPE_STRING dims: [ 1 ] {text} }} }} }} ]"""


BAD = {
    "fails": sample("refused", "dims: [ 2 ] zero_data: true", 'input_data_file: "fail.bin"'),
    "short_file": sample("short", 'dims: [ 2 ] input_data_file: "x4.bin"'),
    "variable": sample("open", "dims: [ -1 ] zero_data: true"),
    "no_data": sample("empty", "dims: [ 2 ]"),
}


def text_file(*words: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(w)) + w for w in words)


def write_repository(repo: Path) -> None:
    for name, warmup in {"warm": GOOD, **BAD}.items():
        config = f'name: "{name}"\nbackend: "python"\n{IO}\n{warmup}'
        model = write_model(repo, name, config, files={"1/model.py": WARM})
        (model / "warmup").mkdir()
        (model / "warmup" / "x.bin").write_bytes(np.array([1.5, -2], np.float32).tobytes())
        (model / "warmup" / "x4.bin").write_bytes(np.array([1.5], np.float32).tobytes())
        (model / "warmup" / "text.bin").write_bytes(text_file(b"hello"))
        (model / "warmup" / "fail.bin").write_bytes(text_file(b"fail"))


@pytest.fixture(scope="module")
def live() -> Iterator[Served]:
    with served("ipw-", write_repository, "--exit-on-error=false") as got:  # failing samples
        yield got


def test_every_instance_runs_every_sample_before_ready(live: Served) -> None:
    with live.server.client() as c:
        assert c.is_model_ready("warm")
        warm = [e for e in seen(live.repo / "warm") if e["id"].startswith("warmup-")]
        stats = c.statistics("warm")["model_stats"][0]
        assert stats["inference_count"] == 0 and stats["execution_count"] == 0
        assert stats["inference_stats"]["success"]["count"] == 0
        out = c.infer(
            "warm",
            {"X": np.ones((1, 2), np.float32), "TEXT": np.array([["hi"]], dtype=object)},
        )
        np.testing.assert_array_equal(out["Y"], np.ones((1, 2), np.float32))
        assert c.statistics("warm")["model_stats"][0]["inference_count"] == 1
    for instance in ("warm_0_0", "warm_0_1"):
        mine = [e for e in warm if e["instance"] == instance]
        by_sample = {s: [e for e in mine if e["id"] == f"warmup-{s}"] for s in ("zeros", "random")}
        assert len(by_sample["zeros"]) == 4  # count 2 x batch_size 2 requests of batch 1
        assert all(e["batch"] == 2 and e["shape"] == [1, 2] for e in by_sample["zeros"])
        assert all(e["x"] == [0.0, 0.0] and e["text"] == [""] for e in by_sample["zeros"])
        assert len(by_sample["random"]) == 1 and by_sample["random"][0]["dtype"] == "float32"
        [files] = [e for e in mine if e["id"] == "warmup-files"]
        assert files["x"] == [1.5, -2.0] and files["text"] == ["hello"]
        assert not [e for e in mine if e["id"] == "warmup-skipped"]


def test_a_failing_or_malformed_sample_fails_the_load(live: Served) -> None:
    with live.server.client() as c:
        reasons = {m["name"]: (m["state"], m["reason"]) for m in c.models()}
    expected = {
        "fails": "failed to run warmup sample 'refused': the model refuses the word fail; ",
        "short_file": "warmup setting expects 8 bytes, but the data provided from x4.bin only "
        "has 4 bytes",
        "variable": "warmup setting expects all variable-size dimensions are specified for "
        "input 'X'",
        "no_data": "warmup setting expects input 'X' to have input_data_type set",
    }
    for model, message in expected.items():
        state, reason = reasons[model]
        assert state == "UNAVAILABLE" and message in reason, (model, reason)
