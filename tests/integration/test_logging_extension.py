"""Triton's logging extension (/v2/logging, gRPC LogSettings, the zmq log_settings message)
with Triton's own clients: a change reaches the broker and every worker at once, and the
workers started later.  One server for the module; each test leaves the settings as the
server started with them."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support import Server, serving, wait_until, write_model

TALKER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_verbose("talker verbose at initialize")

    def execute(self, requests):
        out = []
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            pb_utils.Logger.log_info(f"talker info {n}")
            pb_utils.Logger.log_verbose(f"talker verbose {n}")
            pb_utils.Logger.log_warn(f"talker warning {n}")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("N_OUT", np.array([n], np.int32))]))
        return out
"""
TALKER_CONFIG = """
    backend: "python"
    input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "N_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
DEFAULTS = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "default",
}


def repository(tmp: Path) -> Path:
    write_model(tmp / "repo", "talker", TALKER_CONFIG, files={"1/model.py": TALKER})
    write_model(tmp / "repo", "late", TALKER_CONFIG, files={"1/model.py": TALKER})
    return tmp / "repo"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from serving(
        repository, "--model-control-mode", "explicit", "--load-model", "talker", kserve=True
    )


@pytest.fixture
def http(server: Server) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.http_url)
    yield client
    client.update_log_settings(DEFAULTS | {"log_file": None})  # as the server started
    client.close()


def talk(server: Server, n: int) -> list[str]:
    """The log lines of the talker's request ``n`` (each level logs one)."""
    with server.client() as c:
        c.infer("talker", {"N": np.array([n], np.int32)})
    wait_until(lambda: f"talker warning {n}" in server.log(), what=f"request {n} logged")
    return [line for line in server.log().splitlines() if re.search(rf"talker \w+ {n}$", line)]


def test_the_settings_as_tritons_clients_read_them(
    server: Server, http: httpclient.InferenceServerClient
) -> None:
    assert http.get_log_settings() == DEFAULTS
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    expected = grpcclient.service_pb2.LogSettingsResponse()
    for key, value in DEFAULTS.items():
        field = {bool: "bool_param", int: "uint32_param"}.get(type(value), "string_param")
        setattr(expected.settings[key], field, value)
    assert grpc.get_log_settings() == expected
    with server.client() as c:
        assert c.call("log_settings")["settings"] == DEFAULTS
        assert "logging" in c.server_metadata()["extensions"]


def test_a_change_reaches_the_workers_at_once(
    server: Server, http: httpclient.InferenceServerClient
) -> None:
    lines = talk(server, 1)
    assert [line.split("talker ")[1] for line in lines] == ["info 1", "warning 1"]
    changed = http.update_log_settings({"log_verbose_level": 1, "log_info": False})
    assert changed == DEFAULTS | {"log_verbose_level": 1, "log_info": False}
    lines = talk(server, 2)
    assert [line.split("talker ")[1] for line in lines] == ["verbose 2", "warning 2"]
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    grpc.update_log_settings({"log_format": "ISO8601", "log_warning": False, "log_info": True})
    assert http.get_log_settings()["log_format"] == "ISO8601"
    [info, verbose] = talk_without_warning(server, 3)
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ I \d+ \[talker_0 pid \d+\] ", info)
    assert " D " in verbose and verbose.endswith("talker verbose 3")


def talk_without_warning(server: Server, n: int) -> list[str]:
    """The log lines of request ``n`` of the talker, its warning switched off."""
    with server.client() as c:
        c.infer("talker", {"N": np.array([n], np.int32)})
    wait_until(lambda: f"talker verbose {n}" in server.log(), what=f"request {n} logged")
    assert f"talker warning {n}" not in server.log()  # (logged before the verbose line)
    pattern = rf"talker (info|verbose) {n}$"
    return [line for line in server.log().splitlines() if re.search(pattern, line)]


def test_a_worker_started_later_logs_as_the_settings_say(
    server: Server, http: httpclient.InferenceServerClient
) -> None:
    http.update_log_settings({"log_verbose_level": 1, "log_format": "json"})
    with server.client() as c:
        c.load_model("late")
        c.unload_model("late")
    lines = [json.loads(line) for line in server.log().splitlines() if "talker verbose at" in line]
    late = [line for line in lines if line.get("model") == "late"]
    assert late and late[0]["level"] == "DEBUG" and late[0]["process"] == "worker"


@pytest.mark.parametrize(
    "settings, status, message",
    [
        (
            {"log_file": "x.log"},
            501,
            "log file location can not be updated through network protocol",
        ),
        ({"log_info": "yes"}, 400, "expect boolean for 'log_info'"),
        ({"log_verbose_level": -1}, 400, "expect an integer >= 0 for 'log_verbose_level'"),
        (
            {"log_info": False, "log_format": "fancy"},
            400,
            "invalid argument for log_format, got: fancy",
        ),
    ],
)
def test_what_cannot_change_is_refused_in_tritons_words(
    server: Server,
    http: httpclient.InferenceServerClient,
    settings: dict,
    status: int,
    message: str,
) -> None:
    with pytest.raises(InferenceServerException) as err:
        http.update_log_settings(settings)
    assert err.value.status() == str(status) and message in err.value.message()
    assert http.get_log_settings() == DEFAULTS  # all or nothing


def test_grpc_refusals_carry_tritons_codes(
    server: Server, http: httpclient.InferenceServerClient
) -> None:
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    for settings, code in (
        ({"log_file": "x.log"}, "StatusCode.UNIMPLEMENTED"),
        ({"log_format": "fancy"}, "StatusCode.INVALID_ARGUMENT"),
    ):
        with pytest.raises(InferenceServerException) as err:
            grpc.update_log_settings(settings)
        assert err.value.status() == code
    assert http.get_log_settings() == DEFAULTS


def test_the_kserve_frontends_follow_a_change_made_by_any_client(
    server: Server, http: httpclient.InferenceServerClient
) -> None:
    """Their process logs as the broker does, whoever changed it (here a zmq client)."""

    def missing(path: str) -> None:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://{server.http_url}{path}", timeout=30)
        assert err.value.code == 404

    missing("/v2/quiet/path")
    with server.client() as c:
        c.call("log_settings", settings={"log_verbose_level": 1})
    missing("/v2/loud/path")
    wait_until(lambda: "GET /v2/loud/path: 404" in server.log(), what="the frontends' line")
    assert "/v2/quiet/path" not in server.log()
