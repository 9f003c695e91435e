"""The per-node contract's test parts: a model held at a gate, probes over real HTTP.

The ``gated`` model (python backend) waits in ``initialize`` until the file ``load`` exists in
its gate directory, and in ``execute``, for an input whose first value is negative, until
``finish`` exists: a test holds a node loading, or a request in flight, for exactly as long
as it needs, and lets go by creating the file.
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from inferpool.client import Client
from tests.support import Server, write_model

GATED_MODEL = """
import json, os, time
import triton_python_backend_utils as pb_utils


def wait_for_file(path):
    while not os.path.exists(path):
        time.sleep(0.01)


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.gate = params["gate"]["string_value"]
        wait_for_file(os.path.join(self.gate, "load"))

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if x[0] < 0:
                wait_for_file(os.path.join(self.gate, "finish"))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
"""


def gated_repo(root: Path) -> tuple[Path, Path]:
    """(repository, gate directory): the ``gated`` model, closed."""
    gate = root / "gate"
    gate.mkdir()
    repo = root / "repo"
    config = f"""
        name: "gated"
        backend: "python"
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
        parameters {{ key: "gate" value: {{ string_value: "{gate}" }} }}
    """
    write_model(repo, "gated", config, files={"1/model.py": GATED_MODEL})
    return repo, gate


def send_held(client: Client, value: float = -1.0) -> str:
    """An infer request to ``gated`` sent without waiting (negative: held until ``finish``)."""
    return client._send(
        {
            "type": "infer",
            "model_name": "gated",
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1]}],
        },
        [np.array([value], np.float32).data],
    )


def http(port: int, path: str, method: str = "GET", host: str = "127.0.0.1") -> tuple[int, str]:
    """(status, body) of one request to ``host:port``, as a probe makes it; status 0 when
    nothing answers (the port is not open yet: a failed probe)."""
    req = urllib.request.Request(f"http://{host}:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except urllib.error.URLError as err:
        return 0, str(err.reason)


def drain_over_http(port: int) -> dict[str, Any]:
    status, body = http(port, "/drain", "POST")
    assert status == 200, body
    return dict(json.loads(body))


@contextlib.contextmanager
def not_yet_started(server: Server) -> Iterator[Server]:
    """A server a test watches while it loads: stopped (or killed) on the way out."""
    try:
        yield server
    finally:
        server.__exit__(None, None, None)
