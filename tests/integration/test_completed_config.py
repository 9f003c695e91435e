"""The completed config as Triton serves it (what Triton's core adds to what the backend
fills: instance groups, preferred batch sizes, pinned-memory flags), field by field against
what Triton returns for the same models (its L0_model_config expectations, on a machine
without GPUs), and the number of instances the defaults start."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from inferpool.broker.pool.topology import discover_gpus
from inferpool.wire.config_json import config_to_dict
from tests.backends.model_formats import onnx_models as om
from tests.backends.pytorch import torch_models as tm
from tests.support import Server, serving

IO = """
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""
PINNED = """
optimization { input_pinned_memory { enable: true } output_pinned_memory { enable: true } }
"""
LATEST = "version_policy { latest { num_versions: 1 } }"

PYTHON_MODEL = """
class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.set_max_batch_size(4)
        config.set_dynamic_batching()
        return config

    def execute(self, requests):
        return []
"""


class AddSub(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a + b, a - b


def build(repo: Path) -> Path:
    om.save(om.add_sub(), repo / "onnx_no_config")  # backend, tensors, batching: all completed
    om.save(om.add_sub(), repo / "ov", 'backend: "openvino" default_model_filename: "model.onnx"')
    (repo / "torch" / "1").mkdir(parents=True)
    (repo / "torch" / "config.pbtxt").write_text(
        'backend: "pytorch" max_batch_size: 8'
        + IO.replace("INPUT", "INPUT__").replace("OUTPUT", "OUTPUT__")
    )
    tm.save(AddSub(), repo / "torch")
    (repo / "py" / "1").mkdir(parents=True)
    (repo / "py" / "1" / "model.py").write_text(PYTHON_MODEL)
    (repo / "py" / "config.pbtxt").write_text(IO)
    (repo / "ident" / "1").mkdir(parents=True)
    (repo / "ident" / "config.pbtxt").write_text(
        'backend: "identity" max_batch_size: 8 dynamic_batching { }\n'
        + IO
        + "instance_group [ { kind: KIND_CPU }, { count: 2 } ]"
    )
    return repo


# What Triton returns for these models (as its qa/L0_model_config expected files: onnx
# no_config, openvino dynamic_batch, pytorch, python dynamic_batching; KIND_CPU where no
# GPU is present).
EXPECTED = {
    "onnx_no_config": f"""
        name: "onnx_no_config" platform: "onnxruntime_onnx" {LATEST} max_batch_size: 4 {IO}
        instance_group {{ name: "onnx_no_config" count: 2 kind: KIND_CPU }}
        dynamic_batching {{ preferred_batch_size: 4 }}
        default_model_filename: "model.onnx" {PINNED} backend: "onnxruntime"
    """,
    "ov": f"""
        name: "ov" {LATEST} max_batch_size: 4 {IO}
        instance_group {{ name: "ov" count: 1 kind: KIND_CPU }}
        default_model_filename: "model.onnx" dynamic_batching {{ preferred_batch_size: 4 }}
        {PINNED} backend: "openvino"
    """,
    "torch": f"""
        name: "torch" platform: "pytorch_libtorch" {LATEST} max_batch_size: 8
        {IO.replace("INPUT", "INPUT__").replace("OUTPUT", "OUTPUT__")}
        instance_group {{ name: "torch" count: 1 kind: KIND_CPU }}
        default_model_filename: "model.pt" {PINNED} backend: "pytorch"
    """,
    "py": f"""
        name: "py" {LATEST} max_batch_size: 4 {IO}
        instance_group {{ name: "py" count: 1 kind: KIND_CPU }}
        default_model_filename: "model.py" dynamic_batching {{ preferred_batch_size: 4 }}
        {PINNED} backend: "python"
    """,
    "ident": f"""
        name: "ident" {LATEST} max_batch_size: 8 {IO}
        instance_group {{ name: "ident_0" count: 1 kind: KIND_CPU }}
        instance_group {{ name: "ident_1" count: 2 kind: KIND_CPU }}
        dynamic_batching {{ preferred_batch_size: 8 }} {PINNED} backend: "identity"
    """,
}


pytestmark = pytest.mark.skipif(
    bool(discover_gpus()), reason="the expectations are a machine's without GPUs (KIND_CPU)"
)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from serving(lambda tmp: build(tmp / "repo"), kserve=True)


@pytest.mark.parametrize("model", sorted(EXPECTED))
def test_the_completed_config_is_tritons(server: Server, model: str) -> None:
    expected = text_format.Parse(EXPECTED[model], pb.ModelConfig())
    want = config_to_dict(expected)
    got = httpclient.InferenceServerClient(server.http_url).get_model_config(model)
    assert got == want
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    assert grpc.get_model_config(model).config == expected
    with server.client() as c:  # the zmq protocol serves the same config
        assert c.model_config(model) == want


def test_the_default_groups_start_tritons_number_of_instances(server: Server) -> None:
    counts = {m: len(server.worker_pids(m)) for m in EXPECTED}
    assert counts == {"onnx_no_config": 2, "ov": 1, "torch": 1, "py": 1, "ident": 3}


def build_strict(repo: Path) -> Path:
    om.save(om.add_sub(), repo / "bare")  # no config.pbtxt
    om.save(om.add_sub(), repo / "unwritten", 'backend: "onnxruntime"')  # no tensors
    om.save(om.add_sub(), repo / "written", om.add_sub_config("written", max_batch_size=4))
    (repo / "py" / "1").mkdir(parents=True)
    (repo / "py" / "1" / "model.py").write_text(PYTHON_MODEL)  # its hook would batch
    (repo / "py" / "config.pbtxt").write_text(IO)
    return repo


def test_without_auto_complete_configs_are_served_as_written(tmp_path: Path) -> None:
    """--strict-model-config=true (Triton's older --disable-auto-complete-config): no config
    is completed from the model's files, by the repository or by the backend."""
    with Server(
        tmp_path,
        build_strict(tmp_path / "repo"),
        "--strict-model-config=true",
        "--exit-on-error=false",
    ) as server:
        with server.client() as c:
            reasons = {m["name"]: (m["state"], m["reason"]) for m in c.models()}
            assert reasons["bare"] == (
                "UNAVAILABLE",
                f"INTERNAL: failed to open text file for read {tmp_path}/repo/bare/config.pbtxt: No such "
                "file or directory (the server runs with --disable-auto-complete-config: every "
                "model needs its config.pbtxt, with every setting its backend needs)",
            )
            state, reason = reasons["unwritten"]
            assert state == "UNAVAILABLE" and reason.endswith(
                "unable to load model 'unwritten', configuration expects 0 inputs, model provides 2"
            )
            assert reasons["written"][0] == reasons["py"][0] == "READY"
            py = c.model_config("py")  # auto_complete_config was not called
            assert py["max_batch_size"] == 0 and "dynamic_batching" not in py
            written = c.model_config("written")  # the core's defaults are still added
            assert written["instance_group"] == [
                {**written["instance_group"][0], "name": "written", "count": 2, "kind": "KIND_CPU"}
            ]
            assert written["optimization"]["input_pinned_memory"] == {"enable": True}
        assert "Warning: '--strict-model-config' has been deprecated!" in server.log()
