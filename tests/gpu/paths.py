"""The GPU paths, one line each: ``python -m tests.gpu.paths`` (``scripts/check_gpu.sh``).

Every test of a GPU path carries ``@pytest.mark.gpu(<path>)``.  Run as a module, this
runs those tests (``pytest -m gpu``, its own output into ``build/check_gpu.log``) and
prints, for each path in the order below, ``works``, ``fails: <error>`` or
``skipped: <reason>``; a path none of whose tests ran reads as failing, so a lost test
shows.  The exit status is 1 when a path fails.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

IPC_ACROSS_PROCESSES = "CUDA IPC across processes"
IPC_NARROWED = "CUDA IPC in a worker narrowed to the last GPU"
SERVED_CUDA_SHM = "served CUDA shared memory (identity)"
IDENTITY_GPU_TO_GPU = "identity, 256 MiB GPU -> GPU"
IDENTITY_GPU_TO_HOST = "identity, 256 MiB GPU -> host"
PYTORCH_GPU_0 = "pytorch KIND_GPU on GPU 0"
PYTORCH_LAST_GPU = "pytorch KIND_GPU on the last GPU"
PYTORCH_KIND_MODEL = "pytorch KIND_MODEL"
PYTORCH_CUDA_REGIONS = "pytorch, inputs and outputs in CUDA regions"
PYTORCH_CUDA_TO_CPU = "pytorch, CUDA inputs to a KIND_CPU instance"
PYTHON_GPU_INPUTS = "python backend, GPU inputs (CPU by default) and GPU outputs"
GPU_LOAD_LIMIT = "GPU load limit (--model-load-gpu-limit)"

PATHS = (
    IPC_ACROSS_PROCESSES,
    IPC_NARROWED,
    SERVED_CUDA_SHM,
    IDENTITY_GPU_TO_GPU,
    IDENTITY_GPU_TO_HOST,
    PYTORCH_GPU_0,
    PYTORCH_LAST_GPU,
    PYTORCH_KIND_MODEL,
    PYTORCH_CUDA_REGIONS,
    PYTORCH_CUDA_TO_CPU,
    PYTHON_GPU_INPUTS,
    GPU_LOAD_LIMIT,
)
ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "build" / "check_gpu.log"


def path(label: str) -> pytest.MarkDecorator:
    """``@path(PYTORCH_GPU_0)``: this test checks that GPU path."""
    if label not in PATHS:
        raise ValueError(f"unknown GPU path {label!r}")
    return pytest.mark.gpu(label)


@dataclass
class Outcome:
    ran: int = 0
    failures: list[str] = field(default_factory=list)
    skips: list[str] = field(default_factory=list)

    def line(self, label: str) -> str:
        if self.failures:
            verdict = f"fails: {self.failures[0]}"
        elif self.ran:
            verdict = "works" + (
                f" ({len(self.skips)} skipped: {self.skips[0]})" if self.skips else ""
            )
        elif self.skips:
            verdict = f"skipped: {self.skips[0]}"
        else:
            verdict = "fails: no test of this path ran"
        return f"{label:<62} {verdict}"


class PathReport:
    """A pytest plugin: the outcome of each GPU path over the tests that carry it."""

    def __init__(self) -> None:
        self.labels: dict[str, str] = {}  # test id -> path
        self.outcomes = {label: Outcome() for label in PATHS}
        self.errors: list[str] = []  # collection errors: no path can be trusted

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            marker = item.get_closest_marker("gpu")
            if marker is not None and marker.args:
                self.labels[item.nodeid] = marker.args[0]

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.errors.append(f"{report.nodeid}: {_first_line(report.longreprtext)}")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        label = self.labels.get(report.nodeid)
        if label is None:
            return
        outcome = self.outcomes[label]
        if report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else "skipped"
            outcome.skips.append(str(reason).removeprefix("Skipped: "))
        elif report.failed:
            outcome.failures.append(_failure(report))
        elif report.when == "call":
            outcome.ran += 1

    def lines(self) -> list[str]:
        lines = [f"collection error: {e}" for e in self.errors]
        return lines + [self.outcomes[label].line(label) for label in PATHS]

    @property
    def failed(self) -> bool:
        return bool(self.errors) or any(
            o.failures or not (o.ran or o.skips) for o in self.outcomes.values()
        )


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line.removeprefix("E").strip() for line in lines if line.startswith("E ")]
    return (errors or lines or ["(no message)"])[0]


def _failure(report: Any) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    message = crash.message if crash is not None else _first_line(report.longreprtext)
    where = "" if report.when == "call" else f" (in {report.when})"
    return message.splitlines()[0] + where


def main(argv: list[str]) -> int:
    report = PathReport()
    LOG.parent.mkdir(parents=True, exist_ok=True)
    args = ["-m", "gpu", "-p", "no:cacheprovider", "-o", "addopts=-ra", "tests", *argv]
    with open(LOG, "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        status = pytest.main(args, plugins=[report])
    for line in report.lines():
        print(line)
    print(f"(pytest's output: {LOG.relative_to(ROOT)}, exit status {int(status)})")
    return 1 if report.failed or status not in (0, pytest.ExitCode.NO_TESTS_COLLECTED) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
