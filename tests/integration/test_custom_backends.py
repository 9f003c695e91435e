"""Custom backends served for real: found in each place of Triton's search order, their
lifecycle hooks run once per level and in order, finalizers included after SIGTERM, and the
``inferpool new-backend`` -> ``serve`` -> ``infer`` path of a newcomer, all through the CLI."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.support import ROOT, Server, identity_config, write_model

# Records each hook, with the process id, to lifecycle.txt beside this file.
RECORDER = """
import os

from inferpool.backends.api import Backend, Model, ModelInstance

LOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lifecycle.txt")


def record(hook):
    with open(LOG, "a") as f:
        f.write(f"{hook} {os.getpid()}\\n")


class Level:
    def initialize(self):
        record(f"{type(self).__name__}.initialize")

    def finalize(self):
        record(f"{type(self).__name__}.finalize")


class RecorderModel(Level, Model):
    pass


class RecorderInstance(Level, ModelInstance):
    def execute(self, requests):
        record("RecorderInstance.execute")
        responses = []
        for request in requests:
            response = request.response()
            response.set_output("OUTPUT0", request.input("INPUT0").data)
            response.set_parameter("backend_file", __file__)
            responses.append(response)
        return responses


class RecorderBackend(Level, Backend):
    model_class = RecorderModel
    instance_class = RecorderInstance


BACKEND = RecorderBackend
"""

SHADOWED = 'raise RuntimeError("a backend later in the search order must not be imported")\n'

LIFECYCLE = [
    "RecorderBackend.initialize",
    "RecorderModel.initialize",
    "RecorderInstance.initialize",
    "RecorderInstance.execute",
    "RecorderInstance.finalize",
    "RecorderModel.finalize",
    "RecorderBackend.finalize",
]


def test_search_locations_and_lifecycle_through_sigterm(short_tmp: Path) -> None:
    repo, backends = short_tmp / "repo", short_tmp / "backends"

    def config(name: str) -> str:
        return identity_config(name).replace('backend: "identity"', 'backend: "recorder"')

    # 1. <repo>/<model>/<version>/recorder.py, before the model directory's
    write_model(
        repo,
        "in_version",
        config("in_version"),
        files={"1/recorder.py": RECORDER, "recorder.py": SHADOWED},
    )
    # 2. <repo>/<model>/recorder.py, before the backend directory's
    write_model(repo, "in_model", config("in_model"), files={"recorder.py": RECORDER})
    # 3. <backend-directory>/recorder/__init__.py, for the model that has no recorder of its own
    write_model(repo, "from_dir", config("from_dir"))
    (backends / "recorder").mkdir(parents=True)
    (backends / "recorder" / "__init__.py").write_text(RECORDER)
    expected = {
        "in_version": repo / "in_version" / "1",
        "in_model": repo / "in_model",
        "from_dir": backends / "recorder",
    }

    server = Server(short_tmp, repo, "--backend-directory", str(backends))
    with server, server.client() as c:
        assert {m["name"]: m["state"] for m in c.models()} == dict.fromkeys(expected, "READY")
        pids = {s["model"]: s["pid"] for s in c.status()}
        for model, where in expected.items():
            x = np.arange(3, dtype=np.float32)
            result = c.infer_result(model, {"INPUT0": x})
            np.testing.assert_array_equal(result.outputs["OUTPUT0"], x)
            assert Path(str(result.parameters["backend_file"])).parent == where
        assert server.stop(signal.SIGTERM) == 0
    for model, where in expected.items():
        lines = (where / "lifecycle.txt").read_text().splitlines()
        assert [line.split()[0] for line in lines] == LIFECYCLE, model
        assert {int(line.split()[1]) for line in lines} == {pids[model]}


def test_new_backend_serve_infer_through_the_cli(short_tmp: Path) -> None:
    repo = short_tmp / "models"
    cli = [sys.executable, "-m", "inferpool"]
    made = subprocess.run(
        [*cli, "new-backend", "my_net", "--dir", str(repo)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    assert f"serve it:  inferpool serve --model-repository {repo}" in made.stdout
    server = Server(short_tmp, repo)
    with server:
        assert "inferpool is ready" in server.log()
        answer = subprocess.run(
            [*cli, "infer", "my_net", "--input", "IN0=1,2,3,4", "--endpoint", server.endpoint],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert answer.returncode == 0, answer.stderr
        assert answer.stdout == "OUT0 INT32 [1, 4]: [[1, 2, 3, 4]]\n"
        assert server.stop(signal.SIGTERM) == 0
    assert "TRITONBACKEND_Finalize: my_net" in server.log()
    again = subprocess.run(
        [*cli, "new-backend", "my_net", "--dir", str(repo)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 1 and "already exists" in again.stderr
