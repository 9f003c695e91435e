"""``inferpool new-backend``: the generated backend loads, serves, validates and tests itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inferpool.backends.template import create_backend, main
from inferpool.backends.testing import BackendHarness
from inferpool.wire.errors import Code, InferpoolError

ROOT = Path(__file__).resolve().parents[2]


def test_writes_a_model_repository_entry(tmp_path: Path) -> None:
    written = create_backend("my_net", tmp_path / "repo")
    model_dir = tmp_path / "repo" / "my_net"
    assert written == [
        model_dir / "1",
        model_dir / "config.pbtxt",
        model_dir / "my_net.py",
        model_dir / "test_my_net.py",
    ]
    assert (model_dir / "1").is_dir()
    config = (model_dir / "config.pbtxt").read_text()
    assert 'name: "my_net"' in config and 'backend: "my_net"' in config
    assert "class MyNetBackend(Backend):" in (model_dir / "my_net.py").read_text()


def test_generated_backend_is_found_in_the_model_dir_and_copies(tmp_path: Path) -> None:
    model_dir = create_backend("copier", tmp_path)[0].parent
    config = (model_dir / "config.pbtxt").read_text()
    data = np.arange(12, dtype=np.int32).reshape(3, 4)
    with BackendHarness("copier", config, repository_path=str(model_dir)) as h:
        assert h.infer({"IN0": data})["OUT0"].tolist() == data.tolist()


@pytest.mark.parametrize(
    ("reshaped", "message"),
    [
        ("input", "reshape not supported for input tensor"),
        ("output", "reshape not supported for output tensor"),
    ],
)
def test_generated_backend_rejects_reshape(tmp_path: Path, reshaped: str, message: str) -> None:
    model_dir = create_backend("copier", tmp_path)[0].parent
    config = (model_dir / "config.pbtxt").read_text()
    head, sep, tail = config.partition(f"{reshaped} [")
    config = (
        head + sep + tail.replace("dims: [ 4 ]", "dims: [ 4 ]\n reshape: { shape: [ 2, 2 ] }", 1)
    )
    with pytest.raises(InferpoolError) as info:
        BackendHarness("copier", config, repository_path=str(model_dir))
    assert info.value.code == Code.UNSUPPORTED
    assert info.value.message == (
        "failed to load model 'copier' version 1: TRITONBACKEND_ModelInitialize "
        f"(Model.initialize) failed: {message}"
    )


def test_generated_tests_pass(tmp_path: Path) -> None:
    model_dir = create_backend("my_net", tmp_path)[0].parent
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(model_dir)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout


@pytest.mark.parametrize(
    ("name", "code", "message"),
    [
        (
            "my-net",
            Code.INVALID_ARG,
            "backend name 'my-net' is not a Python identifier: use letters, digits and "
            "underscores, not starting with a digit (for example 'my_backend')",
        ),
        (
            "class",
            Code.INVALID_ARG,
            "backend name 'class' is not a Python identifier: use letters, digits and "
            "underscores, not starting with a digit (for example 'my_backend')",
        ),
        (
            "identity",
            Code.INVALID_ARG,
            "'identity' is the name of a built-in backend; choose another name",
        ),
        (
            "json",
            Code.INVALID_ARG,
            "'json' is a Python standard library module; a backend of that name would shadow "
            "it in its tests; choose another name",
        ),
    ],
)
def test_bad_names_are_refused_and_nothing_is_written(
    tmp_path: Path, name: str, code: Code, message: str
) -> None:
    with pytest.raises(InferpoolError) as info:
        create_backend(name, tmp_path / "repo")
    assert (info.value.code, info.value.message) == (code, message)
    assert not (tmp_path / "repo").exists()


def test_existing_model_is_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "config.pbtxt").write_text("mine")
    with pytest.raises(InferpoolError) as info:
        create_backend("taken", tmp_path)
    assert info.value.code == Code.ALREADY_EXISTS
    assert (
        info.value.message == f"{tmp_path}/taken already exists; choose another name or remove it"
    )
    assert (tmp_path / "taken" / "config.pbtxt").read_text() == "mine"


def test_dir_must_be_a_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(InferpoolError, match=f"{tmp_path}/file is not a directory"):
        create_backend("ok_name", tmp_path / "file")


def test_main_prints_what_it_wrote_and_next_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["my_net", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:4] == [
        f"wrote {tmp_path}/my_net/1/",
        f"wrote {tmp_path}/my_net/config.pbtxt",
        f"wrote {tmp_path}/my_net/my_net.py",
        f"wrote {tmp_path}/my_net/test_my_net.py",
    ]
    assert f"test it:   python -m pytest {tmp_path}/my_net" in out
    assert main(["my_net", "--dir", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (
        f"inferpool new-backend: error: {tmp_path}/my_net already exists; choose another name "
        "or remove it\n"
    )


def test_runs_as_a_module(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "inferpool.backends.template", "via_module", "--dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "via_module" / "via_module.py").is_file()
