"""``triton_python_backend_utils`` in inferpool: a Triton model's view of requests, tensors,
config, logging and metrics (fixture ``models`` in conftest.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import torch

from inferpool.backends.python import pb_utils
from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.worker.protocol import MetricFamilyInfo, MetricOp

if TYPE_CHECKING:
    from conftest import PythonModels


ADD_SUB_CONFIG = """
name: "add_sub"
backend: "python"
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
instance_group [ { kind: KIND_CPU } ]
"""

# Triton's add_sub example as a Triton user writes it: nothing inferpool-specific.
ADD_SUB_MODEL = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        output1_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")
        self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])
        self.output1_dtype = pb_utils.triton_string_to_numpy(output1_config["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            out_0 = in_0.as_numpy() + in_1.as_numpy()
            out_1 = in_0.as_numpy() - in_1.as_numpy()
            out_tensor_0 = pb_utils.Tensor("OUTPUT0", out_0.astype(self.output0_dtype))
            out_tensor_1 = pb_utils.Tensor("OUTPUT1", out_1.astype(self.output1_dtype))
            inference_response = pb_utils.InferenceResponse(
                output_tensors=[out_tensor_0, out_tensor_1]
            )
            responses.append(inference_response)
        return responses

    def finalize(self):
        print("Cleaning up...")
"""


def test_triton_add_sub_model_runs_unchanged(models: PythonModels) -> None:
    model_dir = models.make("add_sub", ADD_SUB_CONFIG, {"1/model.py": ADD_SUB_MODEL})
    a = np.array([1, 2, 3, 4], dtype=np.float32)
    b = np.array([10, 20, 30, 40], dtype=np.float32)
    with models.load(model_dir) as h:
        out = h.infer({"INPUT0": a, "INPUT1": b})
        assert out["OUTPUT0"].tolist() == [11, 22, 33, 44]
        assert out["OUTPUT1"].tolist() == [-9, -18, -27, -36]
        assert out["OUTPUT0"].dtype == np.float32


def test_initialize_args_are_tritons_strings(models: PythonModels) -> None:
    model_py = """
    import json
    import os

    class TritonPythonModel:
        def initialize(self, args):
            with open(os.path.join(os.path.dirname(__file__), "args.json"), "w") as f:
                json.dump(args, f)

        def execute(self, requests):
            return []
    """
    config = models.io_config("max_batch_size: 4")
    model_dir = models.make("m", config, {"1/model.py": model_py})
    instance = {"name": "m_0_1", "kind": "GPU", "device_id": 1}
    with models.load(model_dir, instance=instance):
        args = json.loads((model_dir / "1" / "args.json").read_text())
    assert {k: v for k, v in args.items() if k != "model_config"} == {
        "model_instance_kind": "GPU",
        "model_instance_name": "m_0_1",
        "model_instance_device_id": "1",
        "model_repository": str(model_dir),
        "model_version": "1",
        "model_name": "m",
    }
    config_dict = json.loads(args["model_config"])
    assert config_dict["max_batch_size"] == 4
    assert config_dict["input"][0]["dims"] == [-1]
    assert config_dict["input"][0]["data_type"] == "TYPE_INT32"
    assert config_dict["output"][0]["is_shape_tensor"] is False  # defaults are present


def test_request_accessors(models: PythonModels) -> None:
    model_py = """
    import json

    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                info = {
                    "id": r.request_id(),
                    "correlation_id": r.correlation_id(),
                    "flags": r.flags(),
                    "parameters": json.loads(r.parameters()),
                    "outputs": r.requested_output_names(),
                    "cancelled": r.is_cancelled(),
                }
                text = np.array([json.dumps(info).encode()], dtype=np.object_)
                out.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("INFO", text), pb_utils.Tensor("EXTRA", np.zeros(2))],
                    parameters={"seen": True},
                ))
            return out
    """
    config = """
    name: "m"
    backend: "python"
    input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
    output [
      { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] },
      { name: "EXTRA" data_type: TYPE_FP64 dims: [ 2 ] }
    ]
    """
    with models.load(models.make("m", config, {"1/model.py": model_py})) as h:
        request = h.request(
            {"IN": [1]},
            ["INFO"],
            parameters={"temperature": 0.5, "tag": "x"},
            correlation_id=42,
            flags=1,
        )
        [(_, response, _)] = h.execute([request])
        assert response is not None
        outputs = h.outputs_of(response)
        assert list(outputs) == ["INFO"]  # EXTRA was not requested
        assert json.loads(outputs["INFO"][0]) == {
            "id": "1",
            "correlation_id": 42,
            "flags": 1,
            "parameters": {"temperature": 0.5, "tag": "x"},
            "outputs": ["INFO"],
            "cancelled": False,
        }
        assert response.parameters == {"seen": True}


def test_bytes_inputs_and_outputs(models: PythonModels) -> None:
    model_py = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                words = pb_utils.get_input_tensor_by_name(r, "TEXT").as_numpy()
                upper = np.array([w.upper() for w in words.reshape(-1)], dtype=np.object_)
                upper = pb_utils.Tensor("UPPER", upper.reshape(words.shape))
                out.append(pb_utils.InferenceResponse([upper]))
            return out
    """
    config = """
    name: "m"
    backend: "python"
    input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ]
    output [ { name: "UPPER" data_type: TYPE_STRING dims: [ -1 ] } ]
    """
    with models.load(models.make("m", config, {"1/model.py": model_py})) as h:
        out = h.infer({"TEXT": np.array([b"ab", b"cd\x00e"], dtype=np.object_)})
        assert out["UPPER"].tolist() == [b"AB", b"CD\x00E"]


def test_tensor_helpers_and_dlpack() -> None:
    src = np.arange(6, dtype=np.float32).reshape(2, 3)
    src.flags.writeable = False  # as a request's input in shared memory
    tensor = pb_utils.Tensor._wrap("X", "FP32", src, cpu=True)
    as_torch = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
    assert as_torch.data_ptr() == src.ctypes.data  # no copy
    back = pb_utils.Tensor.from_dlpack("Y", torch.arange(3, dtype=torch.int64))
    assert back.is_cpu() and back.as_numpy().tolist() == [0, 1, 2]
    assert back.triton_dtype() == pb_utils.numpy_to_triton_type(np.int64) == 9
    capsule = pb_utils.Tensor.from_dlpack("Z", torch.ones(2).__dlpack__())
    assert capsule.name() == "Z" and capsule.shape() == [2]
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.triton_to_numpy_type(11) is np.float32
    with pytest.raises(pb_utils.TritonModelException, match="unknown Triton data type 'TYPE_X'"):
        pb_utils.triton_string_to_numpy("TYPE_X")
    bls = pb_utils.InferenceRequest(
        model_name=b"other", inputs=[tensor], requested_output_names=["OUT"], parameters={"k": 1}
    )
    assert bls.inputs()[0] is tensor and bls.requested_output_names() == ["OUT"]
    assert bls.parameters() == '{"k": 1}' and bls.correlation_id() == 0
    with pytest.raises(pb_utils.TritonModelException, match="only supported during the 'execute'"):
        bls.exec()  # no instance serves in this process
    cases: list[tuple[dict[str, Any], str]] = [
        ({"inputs": [None]}, "should not be empty"),
        ({"requested_output_names": [""]}, "Requested output name for request"),
        ({"correlation_id": 1.5}, "Correlation ID must be integer or string"),
        ({"parameters": {"k": 1.5}}, "Expect parameters values to have type bool/int/str"),
        ({"parameters": {1: "v"}}, "Expect parameters keys to have type str"),
    ]
    for bad, problem in cases:
        args: dict[str, Any] = {"model_name": "m", "inputs": [], "requested_output_names": []}
        args.update(bad)
        with pytest.raises(pb_utils.TritonModelException, match=problem):
            pb_utils.InferenceRequest(**args)


def test_auto_complete_config_completes_the_served_config(models: PythonModels) -> None:
    model_py = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(config):
            config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [2]})
            config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [2]})
            config.set_max_batch_size(8)
            config.set_dynamic_batching()
            config.set_model_transaction_policy({"decoupled": False})
            return config

        def execute(self, requests):
            return [
                pb_utils.InferenceResponse([pb_utils.Tensor("OUT", r.inputs()[0].as_numpy() * 3)])
                for r in requests
            ]
    """
    model_dir = models.make("m", 'name: "m"\nbackend: "python"\n', {"1/model.py": model_py})
    with models.load(model_dir) as h:
        config = h.host.config
        assert [(t.name, list(t.dims)) for t in config.input] == [("IN", [2])]
        assert config.max_batch_size == 8 and config.HasField("dynamic_batching")
        out = h.infer({"IN": np.ones((1, 2), np.float32)})  # OUT requested by default now
        assert out["OUT"].tolist() == [[3, 3]]


def test_auto_complete_conflict_fails_the_load(models: PythonModels) -> None:
    model_py = """
    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(config):
            config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [-1]})
            return config

        def execute(self, requests):
            return []
    """
    config = models.io_config()
    model_dir = models.make("m", config, {"1/model.py": model_py})
    err = models.load_error(model_dir)
    assert err.code == Code.INVALID_ARG
    assert err.message.endswith(
        f"auto_complete_config() in {model_dir}/1/model.py failed: ValueError: input 'IN' of "
        "model 'm' in auto_complete_config: the configuration says TYPE_INT32, the model says "
        "TYPE_FP32"
    )


def test_logger_and_metrics(models: PythonModels, caplog: pytest.LogCaptureFixture) -> None:
    model_py = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            kind = pb_utils.MetricFamily.COUNTER
            family = pb_utils.MetricFamily("requests_seen", "Requests seen", kind)
            self.seen = family.Metric(labels={"model": args["model_name"]})
            pb_utils.Logger.log_info("ready")

        def execute(self, requests):
            self.seen.increment(len(requests))
            pb_utils.Logger.log_warn("seen %d" % self.seen.value())
            pb_utils.Logger.log("verbose detail", pb_utils.LogLevel.VERBOSE)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", r.inputs()[0].as_numpy())])
                    for r in requests]
    """
    model_dir = models.make("m", models.io_config(), {"1/model.py": model_py})
    caplog.set_level(logging.DEBUG, logger="inferpool.backend.python")
    with models.load(model_dir) as h:
        h.execute([h.request({"IN": [1]}), h.request({"IN": [2]})])
        metrics = h.host.stats.drain_metrics()
    assert metrics is not None
    assert metrics.families == [MetricFamilyInfo("requests_seen", "Requests seen", "counter")]
    assert metrics.ops == [MetricOp("requests_seen", {"model": "m"}, "inc", 2)]
    records = [(r.levelname, r.getMessage(), Path(r.pathname).name) for r in caplog.records]
    assert records == [
        ("INFO", "ready", "model.py"),
        ("WARNING", "seen 2", "model.py"),
        ("DEBUG", "verbose detail", "model.py"),
    ]


def test_bls_without_a_broker_says_so(models: PythonModels) -> None:
    model_py = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            x = pb_utils.get_input_tensor_by_name(requests[0], "IN")
            r = pb_utils.InferenceRequest(model_name="other", inputs=[x],
                                          requested_output_names=["OUT"])
            r.exec()
    """
    model_dir = models.make("m", models.io_config(), {"1/model.py": model_py})
    with (
        models.load(model_dir) as h,
        pytest.raises(InferpoolError, match="BLS calls models a broker serves"),
    ):
        h.infer({"IN": np.arange(3, dtype=np.int32)})
