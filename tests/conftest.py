"""Fixtures shared by every test kind."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from shm.runs import run_is_alive, run_of
from tests.support import EXAMPLES, STARTED_RUNS, Server, our_regions


@pytest.fixture
def shm_clean() -> Iterator[None]:
    """Fail the test if it leaves an inferpool region in /dev/shm."""
    before = our_regions()
    yield
    # only runs of servers this process started, and only dead ones: /dev/shm is shared with
    # servers running beside this test (other sessions' too, which die and leave regions)
    left = {
        n
        for n in our_regions() - before
        if run_of(n) in STARTED_RUNS and not run_is_alive(run_of(n) or "")
    }
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
