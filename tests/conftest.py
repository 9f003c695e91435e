"""Fixtures shared by every test kind."""

from __future__ import annotations

import compileall
import gc
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferpool.shm.runs import regions_of_run, run_is_alive
from tests.support import EXAMPLES, ROOT, Server, serving

_WRITE_BYTECODE = not sys.dont_write_bytecode


def pytest_sessionstart(session: pytest.Session) -> None:
    """The package's bytecode, compiled once: the suite starts hundreds of interpreters
    (brokers, zygotes, clients, the CLI), and where Python writes none itself
    (PYTHONDONTWRITEBYTECODE) each of them compiled every module it imports again.  The
    example repositories' model code is left as it is (tests copy those directories).  While
    the tests are collected, pytest keeps its rewritten test modules as well (4 s of CPU a run)."""
    for package in sorted(ROOT.iterdir()):
        if (package / "__init__.py").exists() and package.name != "tests":
            compileall.compile_dir(package, quiet=1, rx=re.compile(r"_repository/"))
    sys.dont_write_bytecode = False


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection made (every test module, torch, hypothesis: a quarter of a million
    objects, alive to the end) leaves the garbage collector's reach, as a zygote's imports do:
    a full collection (the pytorch backend runs one as it unloads, at each of its tests'
    teardown) then walks only what the tests made, not all of it again.  Bytecode is written
    again only as the environment says."""
    sys.dont_write_bytecode = not _WRITE_BYTECODE
    gc.freeze()


@pytest.fixture
def shm_clean() -> Iterator[None]:
    """Fail the test if a run it started (``Server.runs``) left a region in /dev/shm.

    Runs this test did not start are other sessions' (/dev/shm is shared; their killed
    brokers' regions are not this test's leak), and runs still alive are servers running
    beside it (module fixtures).
    """
    first = len(Server.runs)
    yield
    left = [
        name for run in Server.runs[first:] if not run_is_alive(run) for name in regions_of_run(run)
    ]
    assert not left, f"shared-memory regions leaked: {sorted(left)}"


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short temporary directory: ipc socket paths must stay under ~100 bytes."""
    path = Path(tempfile.mkdtemp(prefix="ipt-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def example_server() -> Iterator[Server]:
    """The embedded example repository served over ipc and tcp, one server for every test that
    only asks it questions (its tests must not depend on each other's requests: compare
    statistics before and after; change nothing a later test could see)."""
    yield from serving(lambda tmp: EXAMPLES, tcp=True)
