"""Model control as Triton's: the repository index, explicit load with config and file
overrides (client and CLI), unload, and poll mode applying what changed on disk without
failing a request of a model that did not change."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inferpool.client import InferpoolError
from tests.lifecycle.helpers import REPORT, Stream, act, write_act_model
from tests.support import identity_config, serving, wait_until, write_model

WHERE_MODEL = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        here = np.array([os.path.abspath(__file__).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("WHERE", here)]) for _ in requests]
"""
WHERE_CONFIG = {
    "name": "where",
    "backend": "python",
    "input": [{"name": "X", "data_type": "TYPE_INT32", "dims": [1]}],
    "output": [{"name": "WHERE", "data_type": "TYPE_STRING", "dims": [1]}],
}


def explicit_repo(tmp: Path) -> Path:
    root = tmp / "repo"
    write_model(root, "started", identity_config("started"))
    write_model(root, "idle", identity_config("idle", dims="[ 2 ]"))
    write_model(root, "broken", 'name: "broken"\nbackend: "identity"\nmax_batch_size: -3\n')
    return root


@pytest.fixture(scope="module")
def explicit():
    yield from serving(explicit_repo, "--model-control-mode", "explicit", "--load-model", "started")


def rows(c) -> dict[tuple[str, str], dict]:
    return {(r["name"], r["version"]): r for r in c.models()}


def test_the_index_lists_every_model_of_the_repository_with_its_state(explicit) -> None:
    with explicit.client() as c:
        index = rows(c)
        assert index[("started", "1")]["state"] == "READY"
        never = {"name": "idle", "version": "", "state": "", "reason": ""}
        assert index[("idle", "")] == never  # never loaded: the name alone
        assert ("broken", "") in index
        assert [r["name"] for r in c.models(ready_only=True)] == ["started"]

        c.load_model("idle")
        assert rows(c)[("idle", "1")]["state"] == "READY"
        c.unload_model("idle")
        unloaded = rows(c)[("idle", "1")]
        assert (unloaded["state"], unloaded["reason"]) == ("UNAVAILABLE", "unloaded")

        with pytest.raises(InferpoolError, match="max_batch_size must be >= 0"):
            c.load_model("broken")
        failed = rows(c)[("broken", "")]
        assert failed["state"] == "UNAVAILABLE" and "max_batch_size" in failed["reason"]
        with pytest.raises(InferpoolError, match="invalid model name") as err:
            c.load_model("../started")
        assert err.value.code.value == "INVALID_ARG"


def test_a_config_override_replaces_config_pbtxt_until_the_next_plain_load(explicit) -> None:
    override = {
        "name": "started",
        "backend": "identity",
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [3]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [3]}],
        "dynamic_batching": {},
    }
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with explicit.client() as c:
        stream = Stream(explicit, "started", lambda: {"INPUT0": np.ones(5, np.float32)})
        try:
            wait_until(lambda: len(stream.results) > 3)
        finally:
            stream.stop()
        c.load_model("started", config=override)
        assert c.model_config("started")["max_batch_size"] == 8
        np.testing.assert_array_equal(c.infer("started", {"INPUT0": x})["OUTPUT0"], x)
        c.load_model("started")  # no override: config.pbtxt again
        assert c.model_config("started").get("max_batch_size", 0) == 0
        assert stream.errors == []


def test_override_files_load_a_model_that_is_not_in_the_repository(explicit) -> None:
    files = {"file:1/model.py": WHERE_MODEL.encode()}
    with explicit.client() as c:
        c.load_model("where", config=json.dumps(WHERE_CONFIG), files=files)
        where = c.infer("where", {"X": np.array([1], np.int32)})["WHERE"][0].decode()
        assert os.path.isfile(where) and where.endswith("/1/model.py")
        assert "/repo/" not in where  # its own directory, not the repository
        assert rows(c)[("where", "1")]["state"] == "READY"
        c.unload_model("where")
        wait_until(lambda: not os.path.exists(where), what="the override directory removed")
        assert ("where", "") not in rows(c) and ("where", "1") not in rows(c)


@pytest.mark.parametrize(
    ("parameters", "frames", "message"),
    [
        ({"file:1/model.py": 0}, [b"x"], "Load parameter 'config' must be specified"),
        ({"config": "{not json"}, [], "Invalid config override"),
        ({"config": {"name": "where"}}, [], "'config' must have string type"),
        ({"colour": 3}, [], "Unrecognized load parameter 'colour' with type 'INT'"),
        ({"config": json.dumps(WHERE_CONFIG), "file:../x.py": 0}, [b"x"], "must stay within"),
        ({"config": json.dumps(WHERE_CONFIG), "file:1/model.py": 4}, [b"x"], "must name the frame"),
    ],
)
def test_overrides_that_cannot_load_are_refused_with_tritons_words(
    explicit, parameters, frames, message
) -> None:
    with explicit.client() as c:
        header = {"type": "load", "model_name": "where", "parameters": parameters}
        reply, _ = c._recv(c._send(header, frames), 20)
        error = reply["error"]
        assert error["code"] == "INTERNAL" and message in error["message"]  # Triton's code
        assert error["message"].startswith(
            "failed to load 'where', failed to poll from model repository: "
        )
        assert c.is_model_ready("started")


def test_cli_load_and_unload(explicit, tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "inferpool", *args, "--endpoint", explicit.endpoint],
            capture_output=True,
            text=True,
            timeout=60,
        )

    pbtxt = tmp_path / "config.pbtxt"
    pbtxt.write_text(
        'name: "where" backend: "python"\n'
        'input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "WHERE" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
    )
    code = tmp_path / "model.py"
    code.write_text(WHERE_MODEL)
    done = cli("load", "where", "--config", f"@{pbtxt}", "--file", f"1/model.py={code}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "loaded model 'where'"
    done = cli("unload", "where")
    assert (done.returncode, done.stdout.strip()) == (0, "unloaded model 'where'")
    for args, words in (
        (("load", "where", "--config", "@/nonexistent.json"), "cannot read /nonexistent.json"),
        (("load", "where", "--file", f"1/model.py={code}"), "--file needs --config"),
        (("load", "nothing-here"), "nothing-here"),
    ):
        done = cli(*args)
        assert done.returncode == 2, done
        assert done.stderr.count("\n") == 1 and words in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


# ============================================================================ poll mode
def poll_repo(tmp: Path) -> Path:
    root = tmp / "repo"
    write_model(root, "steady", identity_config("steady"))
    write_model(root, "gone", identity_config("gone"))
    write_act_model(root, "changing", value=1)
    return root


@pytest.fixture(scope="module")
def polling():
    yield from serving(poll_repo, "--model-control-mode", "poll", "--repository-poll-secs", "0.3")


def test_poll_mode_applies_what_changed_without_failing_a_request(polling) -> None:
    root = Path(polling.proc.args[polling.proc.args.index("--model-repository") + 1])
    with polling.client() as c:
        steady_pids = {r["pid"] for r in c.status() if r["model"] == "steady"}
        steady = Stream(polling, "steady", lambda: {"INPUT0": np.arange(4, dtype=np.float32)})
        changing = Stream(polling, "changing", lambda: {"ACT": np.array([REPORT], np.int32)})
        try:
            wait_until(lambda: len(steady.results) > 5 and len(changing.results) > 5)
            write_act_model(root, "changing", value=20)
            write_model(root, "newcomer", identity_config("newcomer"))
            shutil.rmtree(root / "gone")
            wait_until(
                lambda: rows(c).get(("newcomer", "1"), {}).get("state") == "READY",
                what="the new model loaded",
            )
            wait_until(lambda: act(c, "changing")["value"] == 20, what="the changed model")
            wait_until(lambda: ("gone", "1") not in rows(c), what="the removed model unloaded")
        finally:
            steady.stop()
            changing.stop()
        assert steady.errors == [] and changing.errors == []
        assert {r["pid"] for r in c.status() if r["model"] == "steady"} == steady_pids
        with pytest.raises(InferpoolError, match="not allowed if polling is enabled") as err:
            c.load_model("steady")
        assert err.value.code.value == "UNAVAILABLE"
