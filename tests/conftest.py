"""Fixtures shared by every test kind."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from shm.runs import regions_of_run
from tests.support import EXAMPLES, STARTED_RUNS, Server


@pytest.fixture
def shm_clean() -> Iterator[None]:
    """Fail the test if a server it started left a region in /dev/shm.

    Only the runs this test started are checked: other sessions may run servers (and kill
    them on purpose) beside it.  A run whose broker was SIGKILLed on purpose is cleared by
    the next start's sweep, which the test must then perform.
    """
    first = len(STARTED_RUNS)
    yield
    left = [name for run in STARTED_RUNS[first:] for name in regions_of_run(run)]
    assert not left, f"shared-memory regions leaked: {sorted(left)}"


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short temporary directory: ipc socket paths must stay under ~100 bytes."""
    path = Path(tempfile.mkdtemp(prefix="ipt-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def example_server(short_tmp: Path, shm_clean: None) -> Iterator[Server]:
    """The embedded example repository, served over ipc and tcp."""
    with Server(short_tmp, EXAMPLES, tcp=True) as server:
        yield server
    assert server.proc.returncode == 0, server.log()
