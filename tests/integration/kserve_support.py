"""What the KServe frontend tests share: their repository and a server that serves it.

The example models (identity: FP32; identity_batched: INT32 and BYTES), a decoupled python
model (``repeat``: N responses, then an empty final one) and ``spare``, an identity model
the tests unload and load again (the server runs with explicit model control); the pipeline
examples (the ``probabilities`` ensemble, ``top_class`` calling it with BLS) and
``repeated``, an ensemble of ``repeat`` (decoupled as its step is).  For the classification
extension: ``labelled`` (identity, batching; OUTPUT0 has labels, OUTPUT1 none),
``labelled_flat`` (identity, not batching, two label files) and ``labelled_ensemble`` (an
ensemble of ``labelled`` whose output takes its step's labels).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tests.support import EXAMPLES, Server, identity_config, write_model

REPEAT = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            sender = request.get_response_sender()
            for i in range(n):
                out = pb_utils.Tensor("OUT", np.array([i], np.int32))
                sender.send(pb_utils.InferenceResponse([out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

REPEAT_CONFIG = """
    name: "repeat"
    backend: "python"
    input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    model_transaction_policy { decoupled: true }
"""

REPEATED_CONFIG = """
    name: "repeated"
    platform: "ensemble"
    input [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "VALUE" data_type: TYPE_INT32 dims: [ 1 ] } ]
    ensemble_scheduling { step [
      { model_name: "repeat" input_map { key: "N" value: "COUNT" }
        output_map { key: "OUT" value: "VALUE" } } ] }
"""


DOUBLE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)]))
        return out
"""
# a model given only as load overrides: its config as JSON and its model.py as a file:
DOUBLE_CONFIG = (
    '{"backend": "python", "input": [{"name": "X", "data_type": "TYPE_INT32", "dims": [2]}],'
    ' "output": [{"name": "Y", "data_type": "TYPE_INT32", "dims": [2]}]}'
)
DOUBLE_FILES = {"file:1/model.py": DOUBLE.encode()}
SPARE_BATCHED = (
    '{"backend": "identity", "max_batch_size": 4,'
    ' "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],'
    ' "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]}'
)


LABELS = "zero\none\n\nthree\n"  # index 2: an empty line, no label; index 4: past the end
LABELLED_CONFIG = """
    name: "labelled"
    backend: "identity"
    max_batch_size: 4
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
            { name: "INPUT1" data_type: TYPE_INT32 dims: [ -1 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] label_filename: "labels.txt" },
             { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""
LABELLED_FLAT_CONFIG = """
    name: "labelled_flat"
    backend: "identity"
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] label_filename: "labels.txt" } ]
"""
LABELLED_ENSEMBLE_CONFIG = """
    name: "labelled_ensemble"
    platform: "ensemble"
    max_batch_size: 4
    input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] },
            { name: "N" data_type: TYPE_INT32 dims: [ -1 ] } ]
    output [ { name: "SCORES" data_type: TYPE_FP32 dims: [ -1 ] },
             { name: "COUNTS" data_type: TYPE_INT32 dims: [ -1 ] } ]
    ensemble_scheduling { step [ { model_name: "labelled"
      input_map [ { key: "INPUT0" value: "X" }, { key: "INPUT1" value: "N" } ]
      output_map [ { key: "OUTPUT0" value: "SCORES" }, { key: "OUTPUT1" value: "COUNTS" } ] } ] }
"""

# what ``labelled`` is given, and the top three classes of each row of SCORES it answers
SCORES = np.array([[0.1, 0.7, 0.2, 0.9, 0.05], [0.5, 0.5, 0.25, 0.125, 1.0]], np.float32)
COUNTS = np.array([[3, 1, 2, 0, 9], [5, 5, 5, 5, 5]], np.int32)
TOP3 = [
    ["0.900000:3:three", "0.700000:1:one", "0.200000:2"],
    ["1.000000:4", "0.500000:0:zero", "0.500000:1:one"],  # equal values by index
]
COUNTS_TOP2 = [["9:4", "3:0"], ["5:0", "5:1"]]  # OUTPUT1 has no labels


def classes(array: np.ndarray) -> list[Any]:
    """A classified output (BYTES, or JSON strings) as text, nested as its shape."""
    as_text = np.vectorize(lambda v: v.decode() if isinstance(v, bytes) else v, otypes=[object])
    return list(as_text(array).tolist())


def write_repository(repo: Path) -> None:
    for name in ("identity", "identity_batched"):
        shutil.copytree(EXAMPLES / name, repo / name)
    write_model(repo, "repeat", REPEAT_CONFIG, files={"1/model.py": REPEAT})
    write_model(repo, "spare", identity_config("spare"))
    for pipeline_model in (EXAMPLES.parent / "pipeline_repository").iterdir():
        shutil.copytree(pipeline_model, repo / pipeline_model.name)
    write_model(repo, "repeated", REPEATED_CONFIG)
    write_model(repo, "labelled", LABELLED_CONFIG, files={"labels.txt": LABELS})
    flat_labels = {"labels.txt": LABELS, "other.txt": "a\nb\nc\nd\ne\n"}
    write_model(repo, "labelled_flat", LABELLED_FLAT_CONFIG, files=flat_labels)
    write_model(repo, "labelled_ensemble", LABELLED_ENSEMBLE_CONFIG)


@contextlib.contextmanager
def kserve_server() -> Iterator[Server]:
    """The repository above, served with both frontends on free ports."""
    tmp = Path(tempfile.mkdtemp(prefix="ipk-", dir="/tmp"))
    try:
        write_repository(tmp / "repo")
        args = ("--model-control-mode", "explicit", "--load-model", "*")
        with Server(tmp, tmp / "repo", *args, kserve=True) as server:
            yield server
        assert server.proc.returncode == 0, server.log()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
