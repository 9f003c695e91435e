"""The python backend: Triton python models (model.py + pb_utils) through the real host."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from backends.testing import BackendHarness
from client.errors import Code, InferpoolError

MakeModel = Callable[..., Path]

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


def harness(model_dir: Path, **kw: object) -> BackendHarness:
    config = (model_dir / "config.pbtxt").read_text()
    return BackendHarness("python", config, repository_path=str(model_dir), **kw)  # type: ignore[arg-type]


def load_error(model_dir: Path) -> InferpoolError:
    with pytest.raises(InferpoolError) as info:
        harness(model_dir)
    return info.value


def io_config(extra: str = "") -> str:
    """Config of model "m": INT32 [-1] input IN and output OUT, plus ``extra`` lines."""
    return f"""
    name: "m"
    backend: "python"
    {extra}
    input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }} ]
    output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] }} ]
    """


# The smallest model: OUT is IN.
ECHO_MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", r.inputs()[0].as_numpy())])
            for r in requests
        ]
"""


def test_triton_add_sub_model_runs_unchanged(make_model: MakeModel) -> None:
    model_dir = make_model("add_sub", ADD_SUB_CONFIG, {"1/model.py": ADD_SUB_MODEL})
    a = np.array([1, 2, 3, 4], dtype=np.float32)
    b = np.array([10, 20, 30, 40], dtype=np.float32)
    with harness(model_dir) as h:
        out = h.infer({"INPUT0": a, "INPUT1": b})
        assert out["OUTPUT0"].tolist() == [11, 22, 33, 44]
        assert out["OUTPUT1"].tolist() == [-9, -18, -27, -36]
        assert out["OUTPUT0"].dtype == np.float32


def test_initialize_args_are_tritons_strings(make_model: MakeModel) -> None:
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
    config = io_config("max_batch_size: 4")
    model_dir = make_model("m", config, {"1/model.py": model_py})
    instance = {"name": "m_0_1", "kind": "GPU", "device_id": 1}
    with harness(model_dir, instance=instance):
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


def test_lifecycle_and_helper_module_beside_model_py(make_model: MakeModel) -> None:
    model_py = """
    import os
    import helper  # beside model.py, importable as in Triton
    import triton_python_backend_utils as pb_utils

    LOG = os.path.join(os.path.dirname(__file__), "calls.txt")

    def record(what):
        with open(LOG, "a") as f:
            f.write(what + "\\n")

    class TritonPythonModel:
        def initialize(self, args):
            record("initialize")

        def execute(self, requests):
            record("execute %d" % len(requests))
            return [
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", helper.double(r.inputs()[0].as_numpy()))]
                )
                for r in requests
            ]

        def finalize(self):
            record("finalize")
    """
    helper_py = """
    def double(x):
        return x * 2
    """
    config = io_config()
    model_dir = make_model("m", config, {"1/model.py": model_py, "1/helper.py": helper_py})
    with harness(model_dir) as h:
        batch = h.execute([h.request({"IN": [1, 2]}), h.request({"IN": [3]})])
        assert [h.outputs_of(r)["OUT"].tolist() for _, r, _ in batch if r] == [[2, 4], [6]]
    calls = (model_dir / "1" / "calls.txt").read_text().splitlines()
    assert calls == ["initialize", "execute 2", "finalize"]


def test_default_model_filename(make_model: MakeModel) -> None:
    config = io_config('default_model_filename: "net.py"')
    model_dir = make_model("m", config, {"1/net.py": ECHO_MODEL})
    with harness(model_dir) as h:
        assert h.infer({"IN": [7]})["OUT"].tolist() == [7]


def test_missing_model_py_names_the_file(make_model: MakeModel) -> None:
    config = io_config()
    model_dir = make_model("m", config)
    err = load_error(model_dir)
    assert err.code == Code.NOT_FOUND
    assert err.message == (
        "failed to load model 'm' version 1: TRITONBACKEND_ModelInitialize (Model.initialize) "
        f"failed: model 'm' version 1 has no {model_dir}/1/model.py: the python backend loads "
        "class TritonPythonModel from <model>/<version>/model.py"
    )


def test_default_model_filename_must_be_python(make_model: MakeModel) -> None:
    config = io_config('default_model_filename: "model.pt"')
    err = load_error(make_model("m", config))
    assert err.code == Code.INVALID_ARG
    assert err.message.endswith(
        "default_model_filename 'model.pt' of model 'm' must end with '.py' for the python backend"
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("class Model:\n    pass\n", "defines no class TritonPythonModel; the python backend"),
        ("class TritonPythonModel:\n    pass\n", "has no execute(self, requests) method"),
        ("import no_such_module_here\n", "failed: ModuleNotFoundError: No module named"),
    ],
)
def test_bad_model_py_fails_the_load(make_model: MakeModel, source: str, expected: str) -> None:
    config = io_config()
    err = load_error(make_model("m", config, {"1/model.py": source}))
    assert err.code == Code.INVALID_ARG
    assert "TRITONBACKEND_ModelInitialize (Model.initialize) failed: " in err.message
    assert expected in err.message


def test_initialize_exception_fails_the_load_and_finalize_is_not_called(
    make_model: MakeModel,
) -> None:
    model_py = """
    class TritonPythonModel:
        def initialize(self, args):
            raise ValueError("weights missing")

        def execute(self, requests):
            return []

        def finalize(self):
            raise AssertionError("finalize must not run")
    """
    config = io_config()
    model_dir = make_model("m", config, {"1/model.py": model_py})
    err = load_error(model_dir)
    assert err.code == Code.INTERNAL
    assert err.message == (
        "failed to load model 'm' version 1: TRITONBACKEND_ModelInstanceInitialize "
        "(ModelInstance.initialize) failed: TritonPythonModel.initialize() in "
        f"{model_dir}/1/model.py failed: ValueError: weights missing"
    )


ERRORS_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy().reshape(-1)
        if x[0] < 0:
            raise RuntimeError("negative input")
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)
            if x[0] == 0:
                err = pb_utils.TritonError("zero is not allowed", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=err))
            elif x[0] == 1:
                responses.append(None)
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x + 1)]))
        return responses
"""


def test_per_request_errors_do_not_sink_the_batch(make_model: MakeModel) -> None:
    config = io_config()
    model_dir = make_model("m", config, {"1/model.py": ERRORS_MODEL})
    with harness(model_dir) as h:
        batch = h.execute([h.request({"IN": [5]}), h.request({"IN": [0]}), h.request({"IN": [1]})])
        ok, bad, none = (r for _, r, _ in batch)
        assert ok is not None and h.outputs_of(ok)["OUT"].tolist() == [6]
        assert bad is not None and bad.error == InferpoolError(
            Code.INVALID_ARG, "zero is not allowed"
        )
        assert none is not None and none.error is not None
        assert none.error.message == (
            f"execute() in {model_dir}/1/model.py returned NoneType for request '3' instead "
            "of a pb_utils.InferenceResponse"
        )


def test_exception_in_execute_fails_the_batch_and_the_next_batch_runs(
    make_model: MakeModel,
) -> None:
    config = io_config()
    model_dir = make_model("m", config, {"1/model.py": ERRORS_MODEL})
    with harness(model_dir) as h:
        batch = h.execute([h.request({"IN": [-1]}), h.request({"IN": [5]})])
        assert [(r.error, final) for _, r, final in batch if r] == [
            (InferpoolError(Code.INTERNAL, "RuntimeError: negative input"), True)
        ] * 2
        assert h.infer({"IN": [2]})["OUT"].tolist() == [3]


def test_wrong_number_of_responses_fails_the_batch(make_model: MakeModel) -> None:
    model_py = """
    class TritonPythonModel:
        def execute(self, requests):
            return []
    """
    config = io_config()
    model_dir = make_model("m", config, {"1/model.py": model_py})
    with harness(model_dir) as h:
        [(_, response, final)] = h.execute([h.request({"IN": [1]})])
        assert final and response is not None and response.error is not None
        assert response.error.message.startswith(
            f"execute() in {model_dir}/1/model.py returned 0 responses for 1 requests;"
        )


def test_non_decoupled_model_that_answers_nothing_gets_internal(make_model: MakeModel) -> None:
    model_py = """
    class TritonPythonModel:
        def execute(self, requests):
            return None
    """
    config = io_config()
    with harness(make_model("m", config, {"1/model.py": model_py})) as h:
        [(_, response, final)] = h.execute([h.request({"IN": [1]})])
        assert final and response is not None
        assert response.error == InferpoolError(
            Code.INTERNAL,
            "backend 'python' did not send a final response for request '1' of model 'm'",
        )


DECOUPLED_MODEL = """
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        import json
        assert pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)
            if x[0] < 0:  # stream from a thread after execute() returned
                threading.Thread(target=self.stream, args=(sender, -x)).start()
            else:
                self.stream(sender, x)
        return None

    def stream(self, sender, x):
        for i in range(int(x[0])):
            out = pb_utils.Tensor("OUT", np.array([i], np.int32))
            sender.send(pb_utils.InferenceResponse([out]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


def test_decoupled_model_streams_responses(make_model: MakeModel) -> None:
    config = io_config("model_transaction_policy { decoupled: true }")
    with harness(make_model("m", config, {"1/model.py": DECOUPLED_MODEL})) as h:
        emitted = h.execute([h.request({"IN": [3]}), h.request({"IN": [0]})])
        assert [(r.id, final) for r, _, final in emitted] == [
            ("1", False),
            ("1", False),
            ("1", False),
            ("1", True),
            ("2", True),
        ]
        values = [h.outputs_of(resp)["OUT"].tolist() for _, resp, _ in emitted if resp]
        assert values == [[0], [1], [2]]


def test_decoupled_model_streams_from_a_thread_after_execute(make_model: MakeModel) -> None:
    config = io_config("model_transaction_policy { decoupled: true }")
    with harness(make_model("m", config, {"1/model.py": DECOUPLED_MODEL})) as h:
        request = h.request({"IN": [-2]})
        h.execute([request])
        for _ in range(500):
            if request.answered:
                break
            time.sleep(0.01)
        assert [final for _, _, final in h.responses] == [False, False, True]


def test_send_after_final_raises_and_triton_error_keeps_its_code(make_model: MakeModel) -> None:
    model_py = """
    import triton_python_backend_utils as pb_utils

    FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

    class TritonPythonModel:
        def execute(self, requests):
            sender = requests[0].get_response_sender()
            sender.send(flags=FINAL)
            try:
                sender.send(flags=FINAL)
            except pb_utils.TritonModelException as e:
                code = pb_utils.TritonError.UNAVAILABLE
                raise pb_utils.TritonError("again: " + e.message(), code)
    """
    config = io_config("model_transaction_policy { decoupled: true }")
    with harness(make_model("m", config, {"1/model.py": model_py})) as h:
        h.execute([h.request({"IN": [1]}), h.request({"IN": [2]})])
        (first, none, first_final), (second, response, second_final) = h.responses
        assert (first.id, none, first_final) == ("1", None, True)
        assert second.id == "2" and second_final and response is not None
        assert response.error == InferpoolError(
            Code.UNAVAILABLE, "again: request '1' already received its final response"
        )


def test_request_accessors(make_model: MakeModel) -> None:
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
    with harness(make_model("m", config, {"1/model.py": model_py})) as h:
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


def test_bytes_inputs_and_outputs(make_model: MakeModel) -> None:
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
    with harness(make_model("m", config, {"1/model.py": model_py})) as h:
        out = h.infer({"TEXT": np.array([b"ab", b"cd\x00e"], dtype=np.object_)})
        assert out["UPPER"].tolist() == [b"AB", b"CD\x00E"]


def test_tensor_helpers_and_dlpack() -> None:
    from backends.python import pb_utils

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
    with pytest.raises(pb_utils.TritonModelException, match="is not supported by inferpool"):
        pb_utils.InferenceRequest(model_name="other", inputs=[], requested_output_names=[])


def test_auto_complete_config_completes_the_served_config(make_model: MakeModel) -> None:
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
    model_dir = make_model("m", 'name: "m"\nbackend: "python"\n', {"1/model.py": model_py})
    with harness(model_dir) as h:
        config = h.host.config
        assert [(t.name, list(t.dims)) for t in config.input] == [("IN", [2])]
        assert config.max_batch_size == 8 and config.HasField("dynamic_batching")
        out = h.infer({"IN": np.ones((1, 2), np.float32)})  # OUT requested by default now
        assert out["OUT"].tolist() == [[3, 3]]


def test_auto_complete_conflict_fails_the_load(make_model: MakeModel) -> None:
    model_py = """
    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(config):
            config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [-1]})
            return config

        def execute(self, requests):
            return []
    """
    config = io_config()
    model_dir = make_model("m", config, {"1/model.py": model_py})
    err = load_error(model_dir)
    assert err.code == Code.INVALID_ARG
    assert err.message.endswith(
        f"auto_complete_config() in {model_dir}/1/model.py failed: ValueError: input 'IN' of "
        "model 'm' in auto_complete_config: the configuration says TYPE_INT32, the model says "
        "TYPE_FP32"
    )


def test_logger_and_metrics(make_model: MakeModel, caplog: pytest.LogCaptureFixture) -> None:
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
    model_dir = make_model("m", io_config(), {"1/model.py": model_py})
    caplog.set_level(logging.DEBUG, logger="inferpool.backend.python")
    with harness(model_dir) as h:
        h.execute([h.request({"IN": [1]}), h.request({"IN": [2]})])
        metrics = h.host.stats.drain_metrics()
    assert metrics["families"] == [
        {"name": "requests_seen", "description": "Requests seen", "kind": "counter"}
    ]
    assert metrics["ops"] == [["requests_seen", {"model": "m"}, "inc", 2]]
    records = [(r.levelname, r.getMessage(), Path(r.pathname).name) for r in caplog.records]
    assert records == [
        ("INFO", "ready", "model.py"),
        ("WARNING", "seen 2", "model.py"),
        ("DEBUG", "verbose detail", "model.py"),
    ]


def test_statistics_are_reported(make_model: MakeModel) -> None:
    config = io_config("max_batch_size: 8")
    model_dir = make_model("m", config, {"1/model.py": ERRORS_MODEL})
    with harness(model_dir) as h:
        ok, bad = h.request({"IN": [[5, 5]]}), h.request({"IN": [[0], [0]]})
        h.execute([ok, bad])
        assert [t.success for t in (h.host.timing_of(ok), h.host.timing_of(bad)) if t] == [
            True,
            False,
        ]
        [(batch_size, *_)] = h.host.take_batches()
        assert batch_size == 3


def test_async_execute(make_model: MakeModel) -> None:
    model_py = """
    import asyncio
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        async def execute(self, requests):
            await asyncio.sleep(0)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", r.inputs()[0].as_numpy())])
                    for r in requests]
    """
    with harness(make_model("m", io_config(), {"1/model.py": model_py})) as h:
        assert h.infer({"IN": [4]})["OUT"].tolist() == [4]
