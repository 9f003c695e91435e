"""scripts/check_gpu.sh where there is no GPU: its arguments, the interpreter it picks, the
wheels it takes, the checkout it lays out, and its skip.  The GPU cases themselves run where
there is a GPU (tests/gpu); a fake ``nvidia-smi`` stands for one here, with ``--dry-run``,
which prepares everything and runs no case.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.gpu import check
from tests.gpu.paths import FILES, PATHS, ROOT

SCRIPT = ROOT / "scripts" / "check_gpu.sh"
SMI_L = """GPU 0: NVIDIA H200 (UUID: GPU-aaaa1111-0000-0000-0000-000000000000)
  MIG 1g.18gb     Device  0: (UUID: MIG-cccc3333-0000-0000-0000-000000000000)
GPU 1: NVIDIA H200 (UUID: GPU-bbbb2222-0000-0000-0000-000000000000)
"""
SMI = """+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.159.03             Driver Version: 580.159.03     CUDA Version: 13.0     |
+-----------------------------------------------------------------------------------------+
"""


# ---------------------------------------------------------------------------- pieces
def test_options_and_what_goes_to_pytest() -> None:
    options, rest = check.parse(["--wheels", "w", "--log", "l.txt", "--", "-x", "-k", "bf16"])
    assert (options.wheels, options.log, options.dry_run) == (Path("w"), Path("l.txt"), False)
    assert rest == ["-x", "-k", "bf16"]
    with pytest.raises(check.CheckError, match=r"unrecognized arguments: -x \(scripts/"):
        check.parse(["-x"])  # pytest's options go after --
    with pytest.raises(check.CheckError, match="expected one argument"):
        check.parse(["--wheels"])


def test_what_nvidia_smi_says() -> None:
    assert check.gpu_uuids(SMI_L) == [
        "GPU-aaaa1111-0000-0000-0000-000000000000",
        "GPU-bbbb2222-0000-0000-0000-000000000000",
    ]  # whole GPUs: a MIG device is not one
    assert check.driver_cuda(SMI) == 13 and check.driver_cuda("") is None
    assert check.no_gpu_reason(None) == "nvidia-smi is not on PATH"
    assert check.no_gpu_reason("No devices were found\n") == "nvidia-smi lists no GPU"
    assert check.no_gpu_reason(SMI_L) is None


def wheel(folder: Path, name: str, version: str = "14.0.0", module: str = "") -> Path:
    """A pure wheel of distribution ``name`` holding package ``module`` (empty)."""
    dist = re.sub(r"[-.]+", "_", name)
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    if module:
        files[f"{module}/__init__.py"] = "MADE_FOR_THE_CHECK = True\n"
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as z:
        for arcname, text in files.items():
            z.writestr(arcname, text)
    return path


def test_the_wheels_it_takes(tmp_path: Path) -> None:
    for name in ("cupy-cuda12x", "cupy-cuda13x", "pyzmq", "Posix_IPC"):
        wheel(tmp_path, name)
    (tmp_path / "README.txt").write_text("not a wheel")
    found = check.wheels_in(tmp_path)
    assert sorted(w.name for w in found) == ["cupy-cuda12x", "cupy-cuda13x", "posix-ipc", "pyzmq"]
    chosen, notes = check.choose(found, lambda name: name == "pyzmq", 13)
    assert sorted(w.name for w in chosen) == ["cupy-cuda13x", "posix-ipc"]
    assert sorted(notes) == [
        "cupy_cuda12x-14.0.0-py3-none-any.whl: the driver is CUDA 13",
        "pyzmq-14.0.0-py3-none-any.whl: pyzmq is installed already",
    ]
    chosen, notes = check.choose(found, lambda name: name.startswith("cupy"), None)
    assert [w.name for w in chosen] == ["posix-ipc", "pyzmq"]  # a cupy is there already
    chosen, notes = check.choose(found, lambda name: False, None)
    assert "cupy-cuda13x" not in [w.name for w in chosen]
    assert "cupy_cuda13x-14.0.0-py3-none-any.whl: nvidia-smi shows no CUDA version" in " ".join(
        notes
    )


def test_wheels_it_refuses(tmp_path: Path) -> None:
    with pytest.raises(check.CheckError, match="no such folder"):
        check.wheels_in(tmp_path / "nowhere")
    with pytest.raises(check.CheckError, match=r"no wheel \(\*\.whl\) in it"):
        check.wheels_in(tmp_path)
    wheel(tmp_path, "pyzmq", "26.0.0")
    wheel(tmp_path, "pyzmq", "27.0.0")
    with pytest.raises(check.CheckError, match=r"two wheels of pyzmq in .*; keep one"):
        check.wheels_in(tmp_path)


def test_installed_knows_any_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    assert check.installed("numpy") and not check.installed("no-such-distribution-here")
    seen: list[str] = []

    def version(name: str) -> str:
        seen.append(name)
        if name == "cupy-cuda11x":
            return "13.0"
        raise check.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(check.importlib.metadata, "version", version)
    assert check.installed("cupy-cuda13x")  # another build of cupy counts
    assert seen[:2] == ["cupy", "cupy-cuda11x"]


def test_the_checkout_laid_out_as_installed(tmp_path: Path) -> None:
    check.lay_out(ROOT, tmp_path / "src")
    probe = (
        "import importlib.util, inferpool.shm.refs; "
        "print(inferpool.shm.refs.__file__, "
        "importlib.util.find_spec('triton_python_backend_utils').origin)"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src")}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    refs, utils = done.stdout.split()
    assert refs == str(tmp_path / "src" / "inferpool" / "shm" / "refs.py")
    assert utils == str(tmp_path / "src" / "triton_python_backend_utils" / "__init__.py")


def test_every_file_with_gpu_cases_is_run() -> None:
    """A test file that marks a GPU case outside ``FILES`` would never run in the check."""
    marking = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").rglob("*.py")
        if "from tests.gpu.paths import" in path.read_text() and path.parent.name != "unit"
    }
    covered = {m for m in marking if any(m == f or m.startswith(f + "/") for f in FILES)}
    assert marking == covered and marking


# ---------------------------------------------------------------------------- the script
def script(
    tmp_path: Path, *args: str, path: str, python: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "CUDA_VISIBLE_DEVICES")}
    env.update({"PATH": path, "TMPDIR": str(tmp_path / "t")})
    env.pop("INFERPOOL_WHEELS", None)
    if python is not None:
        env["PYTHON"] = python
    (tmp_path / "t").mkdir(exist_ok=True)
    return subprocess.run(
        ["/bin/bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120
    )


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_without_a_gpu_every_case_is_skipped_with_the_reason(tmp_path: Path) -> None:
    done = script(tmp_path, path=str(tmp_path / "empty"), python=sys.executable)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert (
        lines[0] == f"python: {sys.executable} (Python {'.'.join(map(str, sys.version_info[:3]))})"
    )
    assert len(lines) == len(PATHS) + 2
    for label, text in zip(PATHS, lines[1:-1], strict=True):
        assert text.startswith(label) and text.endswith(
            "skipped: no GPU here (nvidia-smi is not on PATH)"
        )
    assert lines[-1] == f"0 of {len(PATHS)} work ({len(PATHS)} skipped)"
    listed = script(tmp_path, "--list", path="", python=sys.executable)
    assert listed.stdout.splitlines() == list(PATHS)


@pytest.mark.parametrize(
    ("python", "picked"),
    [
        ("#!/bin/sh\nexit 1\n", "python3"),  # a `python` that is no Python 3: passed over
        (None, "python3"),  # no `python` at all
        ("", "python"),  # a `python` that is Python 3 is taken first
    ],
)
def test_python_then_python3(tmp_path: Path, python: str | None, picked: str) -> None:
    """The script runs with ``python`` when that is Python 3.10+, else ``python3``; each
    stand-in says which it is."""
    real = f'#!/bin/sh\necho "via %s" >&2\nexec {sys.executable} "$@"\n'
    bin_ = tmp_path / "bin"
    executable(bin_ / "python3", real % "python3")
    if python is not None:
        executable(bin_ / "python", python or real % "python")
    done = script(tmp_path, path=str(bin_))
    assert done.returncode == 0, done.stderr
    assert f"via {picked}" in done.stderr and done.stdout.splitlines()[-1].startswith("0 of ")


def test_no_python_is_one_clear_line(tmp_path: Path) -> None:
    done = script(tmp_path, path=str(tmp_path / "empty"))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "check_gpu: neither python nor python3 on PATH is Python 3.10 or later (set PYTHON)\n"
    )
    done = script(tmp_path, path=str(tmp_path / "empty"), python="/nowhere/python")
    assert done.returncode == 2
    assert (
        done.stderr == "check_gpu: PYTHON=/nowhere/python is not a Python 3.10 or later that runs\n"
    )


def test_mistakes_are_one_line_and_exit_2(tmp_path: Path) -> None:
    for args, said in (
        (["--bogus"], "check_gpu: unrecognized arguments: --bogus (scripts/check_gpu.sh --help)"),
        (["--wheels", str(tmp_path / "nowhere"), "--dry-run"], "no such folder"),
    ):
        done = script(tmp_path, *args, path="", python=sys.executable)
        assert done.returncode == 2
        assert (
            done.stderr.count("\n") == 1 and said in done.stderr and "Traceback" not in done.stderr
        )


@pytest.fixture
def fake_gpu(tmp_path: Path) -> str:
    """A PATH whose ``nvidia-smi`` lists two GPUs of a CUDA 13 driver."""
    smi = tmp_path / "gpu-bin" / "nvidia-smi"
    executable(
        smi,
        f'#!/bin/sh\nif [ "$1" = -L ]; then cat <<"EOF"\n{SMI_L}EOF\nelse cat <<"EOF"\n{SMI}EOF\nfi\n',
    )
    return f"{smi.parent}{os.pathsep}{os.environ['PATH']}"


def test_a_dry_run_installs_the_missing_wheels_for_the_driver(
    tmp_path: Path, fake_gpu: str
) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel(wheels, "cupy-cuda13x", module="cupy")  # the driver's: taken
    wheel(wheels, "cupy-cuda12x", module="cupy")  # another CUDA: left out
    wheel(wheels, "pyzmq", "99.0")  # installed already: left out
    done = script(
        tmp_path,
        "--dry-run",
        "--wheels",
        str(wheels),
        "--",
        "-x",
        path=fake_gpu,
        python=sys.executable,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "wheel left out: cupy_cuda12x-14.0.0-py3-none-any.whl: the driver is CUDA 13" in out
    assert "wheel left out: pyzmq-99.0-py3-none-any.whl: pyzmq is installed already" in out
    assert "wheels installed for this check: cupy-cuda13x" in out
    # the GPUs by UUID, in the reverse of the machine's order: no ordinal is a device number
    assert (
        "CUDA_VISIBLE_DEVICES=GPU-bbbb2222-0000-0000-0000-000000000000,"
        "GPU-aaaa1111-0000-0000-0000-000000000000"
    ) in out
    assert out.rstrip().endswith(f"would run: {sys.executable} -m tests.gpu.paths -x")
    assert os.listdir(tmp_path / "t") == []  # nothing left behind


def test_a_dry_run_names_what_is_missing_and_how_to_fetch_it(tmp_path: Path, fake_gpu: str) -> None:
    done = script(tmp_path, "--dry-run", path=fake_gpu, python=sys.executable)
    assert done.returncode == 2
    assert "missing: cupy (ModuleNotFoundError: No module named 'cupy')" in done.stdout
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert f"pip download --no-deps --only-binary=:all: --python-version {version}" in done.stderr
    assert done.stderr.rstrip().endswith("-d wheels cupy-cuda13x) and pass --wheels wheels")
    assert os.listdir(tmp_path / "t") == []
