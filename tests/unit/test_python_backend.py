"""The python backend: loading model.py, its lifecycle and the execute contract, decoupled
streams and statistics, through the real host (fixture ``models`` in conftest.py)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np
import pytest

from inferpool.wire.errors import Code, InferpoolError
from tests.support import threads_beside, wait_until

if TYPE_CHECKING:
    from conftest import PythonModels


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


def test_lifecycle_and_helper_module_beside_model_py(models: PythonModels) -> None:
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
    config = models.io_config()
    model_dir = models.make("m", config, {"1/model.py": model_py, "1/helper.py": helper_py})
    with models.load(model_dir) as h:
        batch = h.execute([h.request({"IN": [1, 2]}), h.request({"IN": [3]})])
        assert [h.outputs_of(r)["OUT"].tolist() for _, r, _ in batch if r] == [[2, 4], [6]]
    calls = (model_dir / "1" / "calls.txt").read_text().splitlines()
    assert calls == ["initialize", "execute 2", "finalize"]


def test_default_model_filename(models: PythonModels) -> None:
    config = models.io_config('default_model_filename: "net.py"')
    model_dir = models.make("m", config, {"1/net.py": ECHO_MODEL})
    with models.load(model_dir) as h:
        assert h.infer({"IN": [7]})["OUT"].tolist() == [7]


def test_missing_model_py_names_the_file(models: PythonModels) -> None:
    config = models.io_config()
    model_dir = models.make("m", config)
    err = models.load_error(model_dir)
    assert err.code == Code.NOT_FOUND
    assert err.message == (
        "failed to load model 'm' version 1: TRITONBACKEND_ModelInitialize (Model.initialize) "
        f"failed: model 'm' version 1 has no {model_dir}/1/model.py: the python backend loads "
        "class TritonPythonModel from <model>/<version>/model.py"
    )


def test_default_model_filename_must_be_python(models: PythonModels) -> None:
    config = models.io_config('default_model_filename: "model.pt"')
    err = models.load_error(models.make("m", config))
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
def test_bad_model_py_fails_the_load(models: PythonModels, source: str, expected: str) -> None:
    config = models.io_config()
    err = models.load_error(models.make("m", config, {"1/model.py": source}))
    assert err.code == Code.INVALID_ARG
    assert "TRITONBACKEND_ModelInitialize (Model.initialize) failed: " in err.message
    assert expected in err.message


def test_initialize_exception_fails_the_load_and_finalize_is_not_called(
    models: PythonModels,
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
    config = models.io_config()
    model_dir = models.make("m", config, {"1/model.py": model_py})
    err = models.load_error(model_dir)
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


def test_per_request_errors_do_not_sink_the_batch(models: PythonModels) -> None:
    config = models.io_config()
    model_dir = models.make("m", config, {"1/model.py": ERRORS_MODEL})
    with models.load(model_dir) as h:
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


def test_a_ragged_batch_reaches_model_py_as_its_requests(models: PythonModels) -> None:
    """As Triton's python_backend: requests of a ragged input come as they were sent, each
    with its own shape, and no batch input is added (model.py works on the requests)."""
    config = """
    name: "m" backend: "python" max_batch_size: 8
    input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] allow_ragged_batch: true } ]
    output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
    batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "INDEX"
                    data_type: TYPE_INT32 source_input: "IN" } ]
    """
    model_py = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [
                pb_utils.InferenceResponse([pb_utils.Tensor(
                    "OUT", np.array([[len(requests), len(r.inputs())]], np.int32)
                )])
                for r in requests
            ]
    """
    model_dir = models.make("m", config, {"1/model.py": model_py})
    with models.load(model_dir) as h:
        batch = h.execute([h.request({"IN": [[1, 2, 3]]}), h.request({"IN": [[4]]})])
        assert [h.outputs_of(r)["OUT"].tolist() for _, r, _ in batch] == [[[2, 1]], [[2, 1]]]


def test_exception_in_execute_fails_the_batch_and_the_next_batch_runs(
    models: PythonModels,
) -> None:
    config = models.io_config()
    model_dir = models.make("m", config, {"1/model.py": ERRORS_MODEL})
    with models.load(model_dir) as h:
        batch = h.execute([h.request({"IN": [-1]}), h.request({"IN": [5]})])
        assert [(r.error, final) for _, r, final in batch if r] == [
            (InferpoolError(Code.INTERNAL, "RuntimeError: negative input"), True)
        ] * 2
        assert h.infer({"IN": [2]})["OUT"].tolist() == [3]


def test_wrong_number_of_responses_fails_the_batch(models: PythonModels) -> None:
    model_py = """
    class TritonPythonModel:
        def execute(self, requests):
            return []
    """
    config = models.io_config()
    model_dir = models.make("m", config, {"1/model.py": model_py})
    with models.load(model_dir) as h:
        [(_, response, final)] = h.execute([h.request({"IN": [1]})])
        assert final and response is not None and response.error is not None
        assert response.error.message.startswith(
            f"execute() in {model_dir}/1/model.py returned 0 responses for 1 requests;"
        )


def test_non_decoupled_model_that_answers_nothing_gets_internal(models: PythonModels) -> None:
    model_py = """
    class TritonPythonModel:
        def execute(self, requests):
            return None
    """
    config = models.io_config()
    with models.load(models.make("m", config, {"1/model.py": model_py})) as h:
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


def test_decoupled_model_streams_responses(models: PythonModels) -> None:
    config = models.io_config("model_transaction_policy { decoupled: true }")
    with models.load(models.make("m", config, {"1/model.py": DECOUPLED_MODEL})) as h:
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


def test_decoupled_model_streams_from_a_thread_after_execute(models: PythonModels) -> None:
    config = models.io_config("model_transaction_policy { decoupled: true }")
    with models.load(models.make("m", config, {"1/model.py": DECOUPLED_MODEL})) as h:
        request = h.request({"IN": [-2]})
        h.execute([request])
        wait_until(lambda: request.answered, "the thread's final response", timeout=5)
        assert [final for _, _, final in h.responses] == [False, False, True]


def test_send_after_final_raises_and_triton_error_keeps_its_code(models: PythonModels) -> None:
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
    config = models.io_config("model_transaction_policy { decoupled: true }")
    with models.load(models.make("m", config, {"1/model.py": model_py})) as h:
        h.execute([h.request({"IN": [1]}), h.request({"IN": [2]})])
        (first, none, first_final), (second, response, second_final) = h.responses
        assert (first.id, none, first_final) == ("1", None, True)
        assert second.id == "2" and second_final and response is not None
        assert response.error == InferpoolError(
            Code.UNAVAILABLE, "again: request '1' already received its final response"
        )


def test_statistics_are_reported(models: PythonModels) -> None:
    config = models.io_config("max_batch_size: 8")
    model_dir = models.make("m", config, {"1/model.py": ERRORS_MODEL})
    with models.load(model_dir) as h:
        ok, bad = h.request({"IN": [[5, 5]]}), h.request({"IN": [[0], [0]]})
        h.execute([ok, bad])
        assert [t.success for t in (h.host.timing_of(ok), h.host.timing_of(bad)) if t] == [
            True,
            False,
        ]
        [(batch_size, *_)] = h.host.take_batches()
        assert batch_size == 3


def test_async_execute(models: PythonModels) -> None:
    model_py = """
    import asyncio
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        async def execute(self, requests):
            await asyncio.sleep(0)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", r.inputs()[0].as_numpy())])
                    for r in requests]
    """
    with models.load(models.make("m", models.io_config(), {"1/model.py": model_py})) as h:
        assert h.infer({"IN": [4]})["OUT"].tolist() == [4]


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: any thread's team is one thread")
def test_a_model_using_torch_on_another_thread_keeps_the_thread_count(
    models: PythonModels,
) -> None:
    """A lane's thread executes too: the host gives it torch's count (1 here), so a python
    model's matmul there does not start OpenMP's team of one thread per core."""
    model_py = """
    import numpy as np
    import torch
    import triton_python_backend_utils as pb_utils

    torch.set_num_threads(1)

    class TritonPythonModel:
        def execute(self, requests):
            x = torch.from_numpy(np.ones((256, 256), np.float32))  # no ATen kernel before
            total = int((x @ x)[0, 0])
            return [
                pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([total], np.int32))])
                for _ in requests
            ]
    """
    import torch

    threads = torch.get_num_threads()
    try:
        with models.load(models.make("m", models.io_config(), {"1/model.py": model_py})) as h:
            x = np.array([1], np.int32)
            assert threads_beside(lambda: h.infer({"IN": x})) == 0  # no team beside it
    finally:
        torch.set_num_threads(threads)
