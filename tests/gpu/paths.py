"""The GPU cases, one line each: ``python -m tests.gpu.paths`` (run by ``scripts/check_gpu.sh``).

Every test of a GPU case carries ``@pytest.mark.gpu(<case>)`` (``@path(<case>)``) and lives
in one of ``FILES``.  Run as a module, this runs those tests (``pytest -m gpu``, its own
output into ``--log FILE`` or nowhere) and prints, for each case in the order below,
``works``, ``fails: <error>`` or ``skipped: <reason>``, then ``N of M work``
(``python -m tests.gpu.paths [--log FILE] [PYTEST_ARGS]``); a case none
of whose tests ran reads as failing, so a lost test shows.  The exit status is 1 when a
case fails.  Importing it needs no third-party package (the checker lists the cases before
anything is installed); running it needs pytest.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest

IPC_ACROSS_PROCESSES = "CUDA IPC across processes"
IPC_NARROWED = "CUDA IPC in a worker narrowed to the last GPU"
SERVED_CUDA_SHM = "served CUDA shared memory (identity)"
IDENTITY_GPU_TO_GPU = "identity, 256 MiB GPU -> GPU"
IDENTITY_GPU_TO_HOST = "identity, 256 MiB GPU -> host"
PYTORCH_GPU_0 = "pytorch KIND_GPU on GPU 0"
PYTORCH_LAST_GPU = "pytorch KIND_GPU on the last GPU"
PYTORCH_KIND_MODEL = "pytorch KIND_MODEL"
PYTORCH_KIND_MODEL_SERVED = "pytorch KIND_MODEL served, a CUDA input"
PYTORCH_CUDA_REGIONS = "pytorch, inputs and outputs in CUDA regions"
PYTORCH_CUDA_TO_CPU = "pytorch, CPU weights on KIND_CPU, a CUDA input"
DYNAMIC_BATCH = "a dynamic batch of requests with CUDA inputs"
SLOW_KERNEL = "outputs written after a slow kernel, bytes compared"
PYTHON_GPU_INPUTS = "python backend, GPU inputs (CPU by default) and GPU outputs"
BYTES_CUDA = "BYTES inputs and outputs in CUDA regions"
BF16_CUDA = "BF16 inputs and outputs in CUDA regions"
DUPLICATE_REGISTRATION = "one CUDA allocation registered twice"
OVERSIZED_REGISTRATION = "an oversized CUDA byte_size through a running server"
UNREGISTER_BUSY = "CUDA unregister while another worker is busy"
REGION_DEVICE = "a worker that sees every GPU opens a region on its GPU"
KSERVE_HTTP = "KServe HTTP with a CUDA IPC handle"
KSERVE_GRPC = "KServe gRPC with a CUDA IPC handle"
ENSEMBLE_CUDA = "an ensemble with its tensors in CUDA regions"
BLS_CUDA = "a BLS call with its tensors in CUDA regions"
LANE_CUDA = "a lane with CUDA inputs"
GPU_LOAD_LIMIT = "GPU load limit (--model-load-gpu-limit)"
ONNX_CUDA = "onnxruntime KIND_GPU on the CUDA execution provider"
ONNX_CUDA_REGIONS = "onnxruntime, inputs and outputs in CUDA regions"
ONNX_CUDA_BATCH = "onnxruntime, a dynamic batch of CUDA inputs"

PATHS = (
    IPC_ACROSS_PROCESSES,
    IPC_NARROWED,
    SERVED_CUDA_SHM,
    IDENTITY_GPU_TO_GPU,
    IDENTITY_GPU_TO_HOST,
    PYTORCH_GPU_0,
    PYTORCH_LAST_GPU,
    PYTORCH_KIND_MODEL,
    PYTORCH_KIND_MODEL_SERVED,
    PYTORCH_CUDA_REGIONS,
    PYTORCH_CUDA_TO_CPU,
    DYNAMIC_BATCH,
    SLOW_KERNEL,
    PYTHON_GPU_INPUTS,
    BYTES_CUDA,
    BF16_CUDA,
    DUPLICATE_REGISTRATION,
    OVERSIZED_REGISTRATION,
    UNREGISTER_BUSY,
    REGION_DEVICE,
    KSERVE_HTTP,
    KSERVE_GRPC,
    ENSEMBLE_CUDA,
    BLS_CUDA,
    LANE_CUDA,
    GPU_LOAD_LIMIT,
    ONNX_CUDA,
    ONNX_CUDA_REGIONS,
    ONNX_CUDA_BATCH,
)
ROOT = Path(__file__).resolve().parents[2]
#: the test files that hold GPU cases (collected alone: the rest of the suite is not needed)
FILES = (
    "tests/gpu",
    "tests/integration/test_cuda_shared_memory.py",
    "tests/backends/pytorch/test_pytorch_devices.py",
)


def path(label: str) -> pytest.MarkDecorator:
    """``@path(PYTORCH_GPU_0)``: this test checks that GPU case."""
    import pytest

    if label not in PATHS:
        raise ValueError(f"unknown GPU path {label!r}")
    return pytest.mark.gpu(label)


def line(label: str, verdict: str) -> str:
    return f"{label:<62} {verdict}"


def tally(works: int, skipped: int, failed: int) -> str:
    """The closing line: ``N of M work``, and what did not."""
    total = works + skipped + failed
    rest = [f"{n} {what}" for n, what in ((failed, "fail"), (skipped, "skipped")) if n]
    return f"{works} of {total} work" + (f" ({', '.join(rest)})" if rest else "")


@dataclass
class Outcome:
    ran: int = 0
    failures: list[str] = field(default_factory=list)
    skips: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        if self.failures:
            return f"fails: {self.failures[0]}"
        if self.ran:
            extra = f" ({len(self.skips)} skipped: {self.skips[0]})" if self.skips else ""
            return "works" + extra
        if self.skips:
            return f"skipped: {self.skips[0]}"
        return "fails: no test of this path ran"


class PathReport:
    """A pytest plugin: the outcome of each GPU case over the tests that carry it."""

    def __init__(self) -> None:
        self.labels: dict[str, str] = {}  # test id -> case
        self.outcomes = {label: Outcome() for label in PATHS}
        self.errors: list[str] = []  # collection errors: no case can be trusted

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
        verdicts = [self.outcomes[label].verdict for label in PATHS]
        lines += [line(label, v) for label, v in zip(PATHS, verdicts, strict=True)]
        works = sum(v.startswith("works") for v in verdicts)
        failed = sum(v.startswith("fails") for v in verdicts)
        return [*lines, tally(works, len(verdicts) - works - failed, failed)]

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
    import pytest

    log_path, rest = (argv[1], argv[2:]) if argv[:1] == ["--log"] else (os.devnull, argv)
    report = PathReport()
    files = [str(ROOT / f) for f in FILES]
    args = ["-m", "gpu", "-p", "no:cacheprovider", "-o", "addopts=-ra", *files, *rest]
    with (
        open(log_path, "w") as log,
        contextlib.redirect_stdout(log),
        contextlib.redirect_stderr(log),
    ):
        status = pytest.main(args, plugins=[report])
    for text in report.lines():
        print(text, flush=True)
    if log_path != os.devnull:
        print(f"(pytest's output: {log_path}, exit status {int(status)})")
    return 1 if report.failed or status not in (0, pytest.ExitCode.NO_TESTS_COLLECTED) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
