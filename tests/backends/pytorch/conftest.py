"""Fixtures for the pytorch backend tests: a model repository, harnesses that share regions
the way a broker's workers do, a run for those regions."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import posix_ipc
import pytest

from inferpool.backends.testing import BackendHarness, LocalRegions
from inferpool.shm.runs import RunLock, regions_of_run


@pytest.fixture
def run_id() -> Iterator[str]:
    """A live broker run (its lock held) for shared regions; fails if one is left behind."""
    lock = RunLock()
    try:
        yield lock.run_id
        assert regions_of_run(lock.run_id) == [lock.name], "regions left in /dev/shm"
    finally:
        for name in regions_of_run(lock.run_id):
            if name != lock.name:
                posix_ipc.unlink_shared_memory("/" + name)
        lock.release()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """``<repo>``: the model directory; tests save models as ``<repo>/1/model.pt``."""
    return tmp_path


@pytest.fixture
def regions(run_id: str) -> Iterator[LocalRegions]:
    """The broker's table of shared regions, in this process, for the run ``run_id``."""
    local = LocalRegions(run_id)
    yield local
    local.close()


@pytest.fixture
def harness(repo: Path, regions: LocalRegions) -> Iterator[Callable[..., BackendHarness]]:
    """``harness(config_pbtxt, **kw)``: a loaded pytorch backend, closed after the test; the
    harnesses of a test share ``regions``."""
    opened: list[BackendHarness] = []

    def make(config_pbtxt: str, **kw: object) -> BackendHarness:
        kw.setdefault("regions", regions)
        h = BackendHarness("pytorch", config_pbtxt, repository_path=str(repo), **kw)  # type: ignore[arg-type]
        opened.append(h)
        return h

    yield make
    for h in reversed(opened):
        h.close()
