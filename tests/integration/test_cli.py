"""The ``inferpool`` command against a live server: what it prints, and that every mistake on
its command line is one clear line on stderr and a non-zero exit, never a traceback.

One server for the module: the example models, and a python model that answers with the
parameters its request carried (``--parameter`` on the command line reaches the model).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.support import (
    EXAMPLES,
    Server,
    copy_models,
    free_tcp_port,
    run_cli,
    serving,
    write_model,
)

ECHO_PARAMETERS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("PARAMETERS", np.array([r.parameters()], dtype=object))]
            )
            for r in requests
        ]
"""


def repository(tmp: Path) -> Path:
    repo = copy_models(tmp, EXAMPLES, "identity", "identity_batched", "square_int32")
    write_model(
        repo,
        "echo_parameters",
        """
        backend: "python"
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
        output [ { name: "PARAMETERS" data_type: TYPE_STRING dims: [ 1 ] } ]
        """,
        files={"1/model.py": ECHO_PARAMETERS},
    )
    return repo


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from serving(repository, tcp=True)


def test_infer_prints_the_outputs_and_passes_parameters(server: Server) -> None:
    ep = ("--endpoint", server.endpoint)
    status, out, err = run_cli("infer", "identity", "--input", "INPUT0=1,2,3", *ep)
    assert status == 0 and err == ""
    assert out.splitlines()[:2] == [
        "OUTPUT0 FP32 [3]: [1.0, 2.0, 3.0]",
        "  parameter param0 = 'an example string parameter'",  # identity's response parameters
    ]
    status, out, _ = run_cli(
        "infer",
        "echo_parameters",
        "--input",
        "IN=1",
        "--parameter",
        "count=7",
        "--parameter",
        "flag=true",
        "--parameter",
        "tag=a b",
        "--model-version",
        "1",
        "--json",
        *ep,
    )
    assert status == 0
    echoed = json.loads(json.loads(out)["outputs"]["PARAMETERS"][0])
    assert echoed == {"count": 7, "flag": True, "tag": "a b"}


def test_infer_streams_every_response_of_a_decoupled_model(server: Server) -> None:
    ep = ("--endpoint", server.endpoint)
    status, out, err = run_cli("infer", "square_int32", "--input", "IN=3", *ep)
    assert status == 0 and err == ""
    assert out.splitlines() == [f"[{n}] OUT INT32 [1]: [3]" for n in (1, 2, 3)]
    status, out, _ = run_cli("infer", "square_int32", "--input", "IN=2", "--json", *ep)
    lines = [json.loads(line) for line in out.splitlines()]
    assert status == 0 and [line["outputs"] for line in lines] == [{"OUT": [2]}] * 2


def test_host_port_is_tcp(server: Server) -> None:
    host_port = server.tcp.removeprefix("tcp://")
    status, out, err = run_cli("models", "--endpoint", host_port)
    assert status == 0 and "square_int32" in out and err == ""


def _npy(tmp: Path) -> tuple[str, str]:
    np.save(tmp / "pickled.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    (tmp / "text.npy").write_text("1,2,3")
    return str(tmp / "pickled.npy"), str(tmp / "text.npy")


MISTAKES = [
    # (arguments after the endpoint is added, what the one line says)
    (["infer", "identity", "--input", "INPUT0=a,b"], "'a' is not a number (the input is FP32)"),
    (
        ["infer", "identity", "--input", "INPUT0=1,2,3,4", "--shape", "2x3"],
        "--shape 2x3 holds 6 value(s) but --input INPUT0 gave 4",
    ),
    (["infer", "identity", "--input", "INPUT0=1", "--shape", "2xa"], "is not a shape"),
    (["infer", "identity", "--input", "INPUT0=1", "--shape", "-1"], "dims must be 0 or more"),
    (["infer", "identity", "--input", "INPUT0"], "--input expects NAME=V1,V2,..."),
    (["infer", "identity", "--input", "X=1"], "model 'identity' has no input 'X'"),
    (["infer", "identity", "--input", "INPUT0=1", "--input", "INPUT0=2"], "given twice"),
    (["infer", "identity", "--input", "INPUT0=1", "--datatype", "FOO"], "is not a datatype"),
    (["infer", "identity", "--input", "INPUT0=1.5", "--datatype", "INT32"], "not an integer"),
    (["infer", "identity", "--input", "INPUT0=300", "--datatype", "UINT8"], "does not fit UINT8"),
    (["infer", "identity", "--input", "INPUT0=maybe", "--datatype", "BOOL"], "not true or false"),
    (
        ["infer", "identity", "--input", "INPUT0=1", "--shape", "1", "--shape", "1"],
        "2 --shape values for 1 --input(s)",
    ),
    (["infer", "identity", "--input", "INPUT0=@/nonexistent.npy"], "No such file or directory"),
    (["infer", "identity", "--input", "INPUT0=@PICKLED"], "not a .npy array numpy can read"),
    (["infer", "identity", "--input", "INPUT0=@TEXT"], "not a .npy array numpy can read"),
    (["infer", "identity", "--input", "INPUT0=1", "--parameter", "p"], "expects KEY=VALUE"),
    (
        ["infer", "identity", "--input", "INPUT0=1,2", "--datatype", "INT64"],
        "INVALID_ARG: inference input 'INPUT0' data-type is 'INT64'",
    ),
    (
        ["infer", "nosuch", "--input", "INPUT0=1"],
        "not found (the server has: echo_parameters, iden",
    ),
    (["infer", "identiy", "--input", "INPUT0=1"], "not found; did you mean 'identity'?"),
    (["infer", "identity", "--input", "INPUT0=1", "--model-version", "9"], "version 9"),
    (["infer", "identity", "--input", "INPUT0=1", "--timeout", "-1"], "positive number"),
    (["stats", "nosuch"], "NOT_FOUND"),
    (["stats", "square_int"], "did you mean 'square_int32'?"),
    (["infer", "identity", "--input", "INPUT0=1", "--version"], "unrecognized arguments"),
]


@pytest.mark.parametrize(("argv", "says"), MISTAKES, ids=[" ".join(m[0]) for m in MISTAKES])
def test_a_mistake_is_one_line_and_a_non_zero_exit(
    server: Server, short_tmp: Path, argv: list[str], says: str
) -> None:
    pickled, text = _npy(short_tmp)
    argv = [a.replace("@PICKLED", f"@{pickled}").replace("@TEXT", f"@{text}") for a in argv]
    status, out, err = run_cli(*argv, "--endpoint", server.endpoint)
    assert status != 0 and out == ""
    assert says in err
    assert err.startswith("inferpool") and err.count("\n") == 1 and "usage:" not in err, err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["serv"], "inferpool: argument command: invalid choice: 'serv'; did you mean 'serve'?"),
        (["serve", "--arena-size", "x"], "inferpool serve: argument --arena-size: not a size"),
        (["serve", "--listen", "foo"], "not an endpoint: 'foo' (an ipc socket file, as ipc://"),
        (["serve", "--listen", "tcp://host"], "or a tcp address and port, as tcp://127.0.0.1:8710"),
        (["serve", "--pin", "al"], "invalid choice: 'al' (choose from auto, none)"),
        (["infer"], "inferpool infer: the following arguments are required: model, --input"),
    ],
)
def test_a_mistake_argparse_finds_is_one_line_without_the_usage(argv: list[str], says: str) -> None:
    status, out, err = run_cli(*argv)
    assert (status, out) == (2, "")
    assert err.startswith(says if says.startswith("inferpool") else "inferpool")
    assert says in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("endpoint", "says"),
    [
        ("localhost:PORT", "UNAVAILABLE: no inferpool server answers at tcp://localhost:"),
        ("ipc:///nonexistent/broker.sock", "the socket file /nonexistent/broker.sock does not"),
        ("http://127.0.0.1:8000", "INVALID_ARG: endpoint 'http://127.0.0.1:8000'"),
    ],
)
def test_no_server_or_a_bad_endpoint_is_one_line(endpoint: str, says: str) -> None:
    endpoint = endpoint.replace("PORT", str(free_tcp_port()))
    status, out, err = run_cli("infer", "identity", "--input", "INPUT0=a", "--endpoint", endpoint)
    assert status == 2 and out == "" and says in err and err.count("\n") == 1


def test_from_a_shell_there_is_no_traceback(server: Server) -> None:
    """The installed command, as a user runs it: several mistakes at once, in parallel."""
    commands = [
        ["infer", "identity", "--input", "INPUT0=a,b"],
        ["infer", "identity", "--input", "INPUT0=1,2,3,4", "--shape", "2x3"],
        ["infer", "identity", "--input", "INPUT0=1", "--endpoint", "localhost"],
        ["models", "--endpoint", "127.0.0.1:1"],
    ]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "inferpool",
                *argv,
                *([] if "--endpoint" in argv else ["--endpoint", server.endpoint]),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for argv in commands
    ]
    for argv, proc in zip(commands, procs, strict=True):
        out, err = proc.communicate(timeout=60)
        assert out == ""
        assert proc.returncode == 2, (argv, err)
        assert "Traceback" not in err and err.startswith("inferpool: ") and err.count("\n") == 1
