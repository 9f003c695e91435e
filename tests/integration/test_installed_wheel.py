"""A real, non-editable install: the wheel puts only ``inferpool``, Triton's
``triton_python_backend_utils`` and its dist-info into site-packages (with the host of
Triton's C API and its headers), and the installed ``inferpool serve`` serves the embedded
example repository."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.support import ROOT, Server


def _build_wheel(out: Path) -> Path:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        cwd=out,
    )
    (wheel,) = out.glob("inferpool-*.whl")
    return wheel


def _fresh_venv(path: Path) -> tuple[str, Path]:
    """A venv whose own site-packages starts empty; the dependencies come from this test's
    environment's site directories through a .pth (a .pth never runs the .pth files of the
    dirs it adds, so this environment's editable install stays out)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = str(path / "bin" / "python")
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    deps = [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]
    (site / "_deps.pth").write_text("\n".join(deps) + "\n")
    return python, site


def test_wheel_installs_only_the_namespace_and_serves(short_tmp: Path) -> None:
    (short_tmp / "dist").mkdir()
    wheel = _build_wheel(short_tmp / "dist")
    python, site = _fresh_venv(short_tmp / "venv")
    before = set(os.listdir(site))
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", str(wheel)],
        check=True,
        capture_output=True,
    )
    gained = set(os.listdir(site)) - before
    assert gained == {"inferpool", "triton_python_backend_utils", "inferpool-0.1.0.dist-info"}

    where = subprocess.run(
        [
            python,
            "-c",
            "import inferpool.broker, triton_python_backend_utils as u; "
            "print(inferpool.broker.__file__); print(u.__name__)",
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=short_tmp,
    ).stdout.split()
    assert where[0].startswith(str(site / "inferpool" / "broker"))
    assert where[1] == "inferpool.backends.python.pb_utils"
    # from the checkout's root too: no folder there shadows the installed namespace
    rooted = subprocess.run(
        [python, "-c", "import inferpool.client as c; print(c.__file__)"],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout.strip()
    assert rooted.startswith(str(site / "inferpool" / "client"))
    # the host of Triton's C API, built with the wheel (this machine has a C compiler), and
    # the headers a C backend builds against, where `inferpool --include-dir` says
    cabi = site / "inferpool" / "backends" / "cabi"
    assert len(list(cabi.glob("_tritonserver*.so"))) == 1
    include = subprocess.run(
        [python, "-m", "inferpool", "--include-dir"],
        check=True,
        capture_output=True,
        text=True,
        cwd=short_tmp,
    ).stdout.strip()
    assert Path(include) == cabi / "include"
    assert (cabi / "include" / "triton" / "core" / "tritonbackend.h").is_file()

    with (
        Server(
            short_tmp,
            site / "inferpool" / "examples" / "model_repository",
            python=python,
            cwd=short_tmp,
        ) as server,
        server.client() as c,
    ):
        x = np.arange(4, dtype=np.float32)
        np.testing.assert_array_equal(c.infer("identity", {"INPUT0": x})["OUTPUT0"], x)
        out = c.infer("add_sub", {"INPUT0": x, "INPUT1": x})
        np.testing.assert_array_equal(out["OUTPUT0"], x + x)
    assert server.proc.returncode == 0, server.log()
