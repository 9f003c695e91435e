"""Fixtures for the pytorch backend tests: a model repository and a /dev/shm leak probe."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from backends.testing import BackendHarness


def _inferpool_regions() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("inferpool-")}


@pytest.fixture
def shm_probe() -> Iterator[None]:
    """Fail the test if it leaves an inferpool region behind in /dev/shm."""
    before = _inferpool_regions()
    yield
    leaked = _inferpool_regions() - before
    assert not leaked, f"regions left in /dev/shm: {sorted(leaked)}"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """``<repo>``: the model directory; tests save models as ``<repo>/1/model.pt``."""
    return tmp_path


@pytest.fixture
def harness(repo: Path) -> Iterator[Callable[..., BackendHarness]]:
    """``harness(config_pbtxt, **kw)``: a loaded pytorch backend, closed after the test."""
    opened: list[BackendHarness] = []

    def make(config_pbtxt: str, **kw: object) -> BackendHarness:
        h = BackendHarness("pytorch", config_pbtxt, repository_path=str(repo), **kw)  # type: ignore[arg-type]
        opened.append(h)
        return h

    yield make
    for h in reversed(opened):
        h.close()
