"""``scripts/check_gpu.sh``: every GPU case once, on a machine with a GPU and no network.

    scripts/check_gpu.sh [--wheels DIR] [--log FILE] [--dry-run] [--list] [-- PYTEST_ARGS]

It checks the checkout as it is: the ``inferpool`` namespace is laid out as installed in a
temporary folder of links (as scripts/typecheck.sh lays it out), so the project itself needs
no installing.  The packages the cases need and this interpreter lacks come from wheels
carried with the checkout (``--wheels DIR``, else ``$INFERPOOL_WHEELS``, else ``wheels/`` or
``.whl/`` in the checkout): each goes into that temporary folder, never over what is
installed, and a cupy wheel only where no cupy is installed and its CUDA major version is the
driver's (``cupy-cuda12x``, ``cupy-cuda13x``).  What is still missing is listed with the
``pip download`` command that fetches it on a machine with a network, and nothing runs.

The cases run (``python -m tests.gpu.paths``) with the GPUs made visible by UUID, in the
reverse of the machine's order (``CUDA_VISIBLE_DEVICES``), unless it is set already: a GPU's
CUDA ordinal then differs from its number on the machine (with one GPU, its UUID is not its
ordinal), which is what a worker narrowed to its GPU must get right.  Without a GPU (no
``nvidia-smi``, or one that lists none) every case is skipped with the reason and the exit
status is 0; it is 1 when a case fails and 2 when the check cannot run.  Everything it made
goes at the end, even when it is stopped (SIGTERM or Ctrl-C stop the cases as Ctrl-C
stops pytest: their servers are stopped and their regions unlinked).

Only the standard library is imported here: it runs before any wheel is in.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from tests.gpu.paths import PATHS, ROOT, line, tally

#: module the cases import -> the distribution that brings it ({cuda}: the driver's major)
NEEDED = {
    "numpy": "numpy",
    "torch": "torch",
    "zmq": "pyzmq",
    "posix_ipc": "posix-ipc",
    "psutil": "psutil",
    "orjson": "orjson",
    "ml_dtypes": "ml-dtypes",
    "google.protobuf": "protobuf",
    "grpc": "grpcio",
    "rapidjson": "python-rapidjson",
    "tritonclient.grpc": "tritonclient",
    "aiohttp": "aiohttp",
    "rich": "rich",
    "pytest": "pytest",
    "pytest_timeout": "pytest-timeout",
    "cupy": "cupy-cuda{cuda}x",
}
CUPY = re.compile(r"cupy(-cuda(\d+)x)?")
WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")
STOP_GRACE_S = 60  # how long stopped cases may take to stop their servers


class CheckError(Exception):
    """The check cannot run; the message says why and what to do."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage and error
        raise CheckError(f"{message} (scripts/check_gpu.sh --help)")


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """The options, and the arguments after ``--``, which go to pytest."""
    argv = list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = _Parser(
        prog="scripts/check_gpu.sh",
        description="Run every GPU case once and print one line per case, then 'N of M work'.",
        epilog="Arguments after -- go to pytest (e.g. -- -x). docs/operations.md: the GPU check.",
    )
    parser.add_argument("--wheels", type=Path, help="wheels to install what is missing from")
    parser.add_argument("--log", type=Path, help="write pytest's own output there")
    parser.add_argument(
        "--dry-run", action="store_true", help="prepare and list what would run, run nothing"
    )
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    return parser.parse_args(argv[:cut]), argv[cut + 1 :]


# ---------------------------------------------------------------------------- the machine
def no_gpu_reason(smi: str | None) -> str | None:
    """Why there is no GPU to check (``smi``: ``nvidia-smi -L``'s output, None without
    nvidia-smi), or None."""
    if smi is None:
        return "nvidia-smi is not on PATH"
    return None if gpu_uuids(smi) else "nvidia-smi lists no GPU"


def gpu_uuids(smi: str) -> list[str]:
    """The UUID of each whole GPU ``nvidia-smi -L`` lists, in its order."""
    found = re.findall(r"^GPU \d+:.*\(UUID: (GPU-[0-9A-Fa-f-]+)\)", smi, re.M)
    return list(found)


def driver_cuda(smi: str) -> int | None:
    """The CUDA major version of the driver, from ``nvidia-smi``'s header."""
    found = re.search(r"CUDA Version:\s*(\d+)\.", smi)
    return int(found[1]) if found else None


def _smi(*args: str) -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"(nvidia-smi failed: {exc})"
    return done.stdout


# ---------------------------------------------------------------------------- wheels
@dataclass(frozen=True)
class Wheel:
    path: Path
    name: str  # the distribution's name, normalized (PEP 503)
    version: str


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheels_in(folder: Path) -> list[Wheel]:
    """The wheels in ``folder`` (other files are passed over); CheckError if there is
    none, or two of one distribution (pip would refuse them all)."""
    if not folder.is_dir():
        raise CheckError(f"--wheels {folder}: no such folder")
    found: dict[str, Wheel] = {}
    for path in sorted(folder.iterdir()):
        matched = WHEEL.match(path.name)
        if matched is None:
            continue
        wheel = Wheel(path, normalize(matched["name"]), matched["version"])
        other = found.get(wheel.name)
        if other is not None:
            raise CheckError(
                f"two wheels of {wheel.name} in {folder}: {other.path.name} and {path.name}; "
                "keep one"
            )
        found[wheel.name] = wheel
    if not found:
        raise CheckError(f"--wheels {folder}: no wheel (*.whl) in it")
    return list(found.values())


def installed(name: str) -> bool:
    """Whether distribution ``name`` is installed for this interpreter (any cupy build, for
    a cupy)."""
    names = (
        ("cupy", "cupy-cuda11x", "cupy-cuda12x", "cupy-cuda13x")
        if CUPY.fullmatch(name)
        else (name,)
    )
    for each in names:
        try:
            importlib.metadata.version(each)
            return True
        except importlib.metadata.PackageNotFoundError:
            continue
    return False


def choose(
    wheels: Iterable[Wheel], have: Callable[[str], bool], cuda: int | None
) -> tuple[list[Wheel], list[str]]:
    """The wheels to install, and why each other one is left out."""
    chosen, notes = [], []
    for wheel in wheels:
        cupy = CUPY.fullmatch(wheel.name)
        if have(wheel.name):
            notes.append(f"{wheel.path.name}: {wheel.name} is installed already")
        elif cupy and cuda is None:
            notes.append(f"{wheel.path.name}: nvidia-smi shows no CUDA version to match")
        elif cupy and cupy[2] != str(cuda):
            notes.append(f"{wheel.path.name}: the driver is CUDA {cuda}")
        else:
            chosen.append(wheel)
    return chosen, notes


def default_wheels(environ: dict[str, str]) -> Path | None:
    named = environ.get("INFERPOOL_WHEELS")
    if named:
        return Path(named)
    for folder in (ROOT / "wheels", ROOT / ".whl"):
        if folder.is_dir():
            return folder
    return None


def install(wheels: Sequence[Wheel], site: Path) -> None:
    """Install ``wheels`` (no index, no dependencies) into ``site``."""
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
    command += ["--no-compile", "--no-cache-dir", "--target", str(site)]
    done = subprocess.run(command + [str(w.path) for w in wheels], capture_output=True, text=True)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise CheckError(
            f"pip could not install the wheels: {said[-1] if said else done.returncode}"
        )


def download_command(missing: Sequence[str]) -> str:
    """How to fetch ``missing`` distributions for this interpreter, where there is a
    network (then carry the folder with the checkout)."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    platforms = " ".join(
        f"--platform {p}"
        for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
    )
    return (
        f"python3 -m pip download --no-deps --only-binary=:all: --python-version {version} "
        f"--implementation cp {platforms} -d wheels {' '.join(missing)}"
    )


# ---------------------------------------------------------------------------- the checkout
def package_dirs(pyproject: str) -> dict[str, str]:
    """``[tool.setuptools.package-dir]``: each package and the folder it installs from."""
    table = pyproject.split("[tool.setuptools.package-dir]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^"([\w.]+)"\s*=\s*"([\w./]+)"', table, re.M))


def lay_out(root: Path, into: Path) -> None:
    """The packages as installed, as links into ``root``: ``inferpool`` and its folders,
    and the other top-level packages."""
    mapping = package_dirs((root / "pyproject.toml").read_text())
    top = into / "inferpool"
    top.mkdir(parents=True)
    for entry in (root / mapping.pop("inferpool")).iterdir():
        if entry.name != "__pycache__":
            (top / entry.name).symlink_to(entry)
    for package, folder in mapping.items():
        head, _, rest = package.partition(".")
        target = top / rest if head == "inferpool" else into / package
        target.symlink_to(root / folder)


PROBE = """
import importlib, json, sys
missing = {}
for module in sys.argv[1:]:
    try:
        importlib.import_module(module)
    except Exception as exc:
        missing[module] = f"{type(exc).__name__}: {exc}".splitlines()[0]
print(json.dumps(missing))
"""


def missing_modules(env: dict[str, str]) -> dict[str, str]:
    """The modules the cases need that do not import under ``env``, with why."""
    command = [sys.executable, "-c", PROBE, *NEEDED]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise CheckError(f"cannot check the imports: {done.stderr.strip()}")
    return dict(json.loads(done.stdout))


# ---------------------------------------------------------------------------- running
def run_cases(command: list[str], env: dict[str, str]) -> int:
    """Run the cases; SIGTERM reaches them as Ctrl-C, so they stop their servers."""
    child = subprocess.Popen(command, env=env, cwd=ROOT)
    stopping: list[int] = []

    def stop(signum: int, frame: Any) -> None:
        stopping.append(signum)
        child.send_signal(signal.SIGINT)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        while True:
            try:
                return child.wait(timeout=STOP_GRACE_S if stopping else None)
            except KeyboardInterrupt:  # Ctrl-C reached the cases too
                stopping.append(signal.SIGINT)
            except subprocess.TimeoutExpired:
                child.kill()
                return child.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)


def skip_all(reason: str) -> int:
    for label in PATHS:
        print(line(label, f"skipped: no GPU here ({reason})"))
    print(tally(0, len(PATHS), 0))
    return 0


def main(argv: Sequence[str], environ: dict[str, str] | None = None) -> int:
    environ = dict(os.environ if environ is None else environ)
    try:
        options, pytest_args = parse(argv)
        if options.list:
            print("\n".join(PATHS))
            return 0
        print(f"python: {sys.executable} (Python {platform.python_version()})", flush=True)
        smi = _smi("-L")
        reason = no_gpu_reason(smi)
        if reason is not None and not options.dry_run:
            return skip_all(reason)
        cuda = driver_cuda(_smi() or "")
        with tempfile.TemporaryDirectory(prefix="inferpool-gpu-check-") as tmp:
            return _check(options, pytest_args, environ, Path(tmp), smi or "", cuda)
    except CheckError as exc:
        print(f"check_gpu: {exc}", file=sys.stderr)
        return 2


def _check(
    options: argparse.Namespace,
    pytest_args: list[str],
    environ: dict[str, str],
    tmp: Path,
    smi: str,
    cuda: int | None,
) -> int:
    lay_out(ROOT, tmp / "src")
    paths = [str(tmp / "src")]
    folder = options.wheels or default_wheels(environ)
    if folder is not None:
        chosen, notes = choose(wheels_in(folder), installed, cuda)
        for note in notes:
            print(f"wheel left out: {note}")
        if chosen:
            install(chosen, tmp / "site")
            paths.append(str(tmp / "site"))
            print(f"wheels installed for this check: {', '.join(w.name for w in chosen)}")
    env = {**environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [environ.get("PYTHONPATH")])])
    uuids = gpu_uuids(smi)
    if "CUDA_VISIBLE_DEVICES" not in environ and uuids:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(reversed(uuids))
    print(f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '(unset)')}")
    missing = missing_modules(env)
    if missing:
        for module, why in missing.items():
            print(f"missing: {module} ({why})")
        if "cupy" in missing and cuda is None:
            print("the driver's CUDA version is unknown: cupy-cuda12x is for CUDA 12, 13x for 13")
        dists = [NEEDED[m].format(cuda=cuda or 12) for m in missing]
        raise CheckError(
            f"{len(missing)} module(s) the cases need do not import; fetch their wheels where "
            f"there is a network ({download_command(dists)}) and pass --wheels wheels"
        )
    command = [sys.executable, "-m", "tests.gpu.paths"]
    if options.log is not None:
        command += ["--log", str(options.log.resolve())]
    command += pytest_args
    if options.dry_run:
        print("would run: " + " ".join(command))
        return 0
    before = set(_ours_in_shm())
    status = run_cases(command, env)
    left = sorted(set(_ours_in_shm()) - before)
    if left:
        print(f"left behind in /dev/shm: {' '.join(left)}")
        return 1
    return status


def _ours_in_shm() -> list[str]:
    try:
        return [name for name in os.listdir("/dev/shm") if name.startswith("inferpool-")]
    except OSError:
        return []


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
