"""``inferpool serve`` as a user meets it: what it announces and when, its mistakes as one
line, and its logs as JSON lines that name the request and the model."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inferpool.broker.options import ServerOptions
from inferpool.client import InferpoolError
from inferpool.entry_point import build_parser
from inferpool.serve import options_from_args
from inferpool.wire.logs import LogSettings
from tests.support import (
    EXAMPLES,
    Server,
    assert_run_gone,
    identity_config,
    our_regions,
    run_cli,
    write_model,
)

SERVE = [sys.executable, "-m", "inferpool", "serve", "--allow-metrics", "false"]


def test_a_server_announces_itself_once_it_can_serve_and_names_its_run(
    short_tmp: Path, shm_clean: None
) -> None:
    repo = short_tmp / "repo"
    write_model(repo, "identity", identity_config("identity"))
    with Server(short_tmp, repo) as server:
        # the banner and one line per model: the start's log lines are verbose ones
        assert server.log().splitlines() == [
            f"inferpool 0.1.0: serving {repo} (run {server.run_id})",
            f"  listening on {server.endpoint}",
            "  model identity version 1: READY",
            "inferpool is ready",
        ]
        # a second server on the same endpoint fails before it announces or sweeps anything
        before = our_regions()
        second = subprocess.run(
            [*SERVE, "--model-repository", str(repo), "--listen", server.endpoint],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1 and second.stdout == ""
        assert second.stderr.splitlines()[-1] == (
            f"inferpool: UNAVAILABLE: cannot listen on {server.endpoint}: another server is "
            "using it"
        )
        assert "removed" not in second.stderr and "run " not in second.stderr
        assert our_regions() >= {r for r in before if r.startswith(f"inferpool-{server.run_id}")}
        assert server.stop() == 0


def test_tritons_flag_names_and_defaults() -> None:
    def options(*argv: str) -> ServerOptions:
        return options_from_args(build_parser().parse_args(["serve", *argv]))

    default = options()
    assert (default.metrics_port, default.metrics_address) == (8002, "127.0.0.1")  # as Triton
    assert (default.log, default.graceful_timeout, default.server_id) == (
        LogSettings(),
        30,
        "triton",
    )
    triton = options("--exit-timeout-secs", "5", "--log-verbose", "1", "--allow-metrics", "false")
    assert (triton.graceful_timeout, triton.log.verbose, triton.metrics_port) == (5, 1, 0)
    quiet = options("--log-level", "warning", "--log-format", "json", "--log-error", "false")
    assert quiet.log == LogSettings(info=False, error=False, format="json")
    assert options("--log-format", "text", "--id", "pool").log.format == "default"
    assert options("--id", "pool").server_id == "pool"
    assert (default.exit_on_error, default.auto_complete_config) == (True, True)
    assert options("--exit-on-error=false").exit_on_error is False
    assert options("--disable-auto-complete-config").auto_complete_config is False
    assert options("--strict-model-config", "true").auto_complete_config is False
    assert options("--strict-model-config=false").auto_complete_config is True


def test_a_model_that_fails_to_load_fails_the_start(short_tmp: Path) -> None:
    """Triton's --exit-on-error (its default): the models that loaded stop again, nothing of
    the run is left, the exit status is 1 and the last line is Triton's."""
    repo = short_tmp / "repo"
    write_model(repo, "identity", identity_config("identity"))
    write_model(repo, "broken", identity_config("broken").replace('"identity"', '"nosuch"'))
    done = subprocess.run(
        [*SERVE, "--model-repository", str(repo), "--listen", f"ipc://{short_tmp}/b.sock"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert "  model identity version 1: READY" in done.stdout.splitlines()
    assert "  model broken version 1: UNAVAILABLE (failed to load model 'broken'" in done.stdout
    assert "inferpool is ready" not in done.stdout and "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == (
        "error: creating server: Internal - failed to load all models; --exit-on-error=false "
        "serves the models that loaded"
    )
    run_id = re.search(r"\(run (\w+)\)", done.stdout)
    assert run_id is not None
    assert_run_gone(run_id.group(1))  # the loaded model's workers stopped, the run swept


def test_every_argument_has_help_and_shows_its_default() -> None:
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in commands.choices.items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            where = f"inferpool {name} {'/'.join(action.option_strings) or action.dest}"
            assert action.help, f"{where} has no help"
            if action.option_strings and action.default not in (None, False, [], ""):
                assert "default" in action.help, f"{where} does not show its default"


def test_serve_mistakes_are_one_line(short_tmp: Path) -> None:
    model_dir, nothing = EXAMPLES / "identity", short_tmp / "nothing"
    for argv, says in [  # found before a broker is built: in this process
        (["--log-level", "nonsense"], "argument --log-level: expected one of DEBUG, INFO"),
        (["--allow-metrics", "maybe"], "argument --allow-metrics: expected true or false"),
        (["--arena-size", "lots"], "argument --arena-size: not a size: 'lots'"),
        (["--backend-config", "identity"], "--backend-config expects <backend>,<key>=<value>"),
        (["--model-load-gpu-limit", "x"], "expected DEVICE:FRACTION"),
    ]:
        status, out, err = run_cli("serve", *argv)
        assert status == 2 and out == "" and says in err.splitlines()[-1], (argv, err)
    cases = [  # found by the broker: as a user runs it
        (
            ["--model-repository", str(model_dir)],
            f"inferpool: INVALID_ARG: {model_dir} looks like a model directory, not a model "
            "repository (it has 1, config.pbtxt): give the directory that holds the model "
            f"directories, such as {EXAMPLES}",
        ),
        (
            ["--model-repository", str(nothing)],
            f"inferpool: NOT_FOUND: model repository {nothing} does not exist",
        ),
    ]
    procs = [
        subprocess.Popen(
            [*SERVE, "--listen", f"ipc://{short_tmp}/b{i}.sock", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, (argv, _) in enumerate(cases)
    ]
    for (argv, says), proc in zip(cases, procs, strict=True):
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 1 and out == "", (argv, err)
        assert "Traceback" not in err and err.splitlines()[-1] == says, (argv, err)


def test_json_logs_name_the_process_the_model_and_a_failed_request(
    short_tmp: Path, shm_clean: None
) -> None:
    repo = short_tmp / "repo"
    write_model(repo, "identity", identity_config("identity"))
    with Server(short_tmp, repo, "--log-format", "json", "--log-verbose", "1") as server:
        with server.client() as c, pytest.raises(InferpoolError):
            c.infer("identity", {"INPUT0": np.arange(3)})  # INT64 for an FP32 input
        assert server.stop() == 0
    lines = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    assert {line["level"] for line in lines} >= {"INFO", "DEBUG"}
    assert all({"time", "level", "logger", "message", "process", "pid"} <= set(x) for x in lines)
    workers = [line for line in lines if line["process"] == "worker"]
    assert workers and all(
        (w["model"], w["version"], w["instance"]) == ("identity", "1", "identity_0")
        for w in workers
    )
    [failed] = [line for line in lines if line.get("request_id") is not None]
    assert (failed["model"], failed["version"], failed["process"]) == ("identity", "1", "broker")
    assert "failed (OTHER)" in failed["message"] and "data-type" in failed["message"]
