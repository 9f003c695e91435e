"""Fixtures shared by the unit tests."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inferpool.backends.testing import BackendHarness
from inferpool.shm.region import Region
from inferpool.wire.errors import InferpoolError
from inferpool.workers.memory import WorkerMemory


@pytest.fixture
def memory() -> Iterator[WorkerMemory]:
    """A worker's memory over an output region of 4 MiB, 1 MiB of it populated."""
    reg = Region.create(f"inferpool-test-memory-{os.getpid()}", 4 << 20, prefault=False)
    mem = WorkerMemory(reg.name, "test_0", prefault=1 << 20)
    yield mem
    mem.close()
    reg.destroy()


class PythonModels:
    """Python-backend models written under tmp_path and loaded through the real host."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @staticmethod
    def io_config(extra: str = "") -> str:
        """Config of model "m": INT32 [-1] input IN and output OUT, plus ``extra`` lines."""
        return f"""
        name: "m"
        backend: "python"
        {extra}
        input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }} ]
        output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] }} ]
        """

    def make(self, name: str, config: str, files: dict[str, str] | None = None) -> Path:
        """``<root>/<name>/`` with config.pbtxt, version 1 and ``files`` (dedented text)."""
        model_dir = self.root / name
        (model_dir / "1").mkdir(parents=True)
        (model_dir / "config.pbtxt").write_text(textwrap.dedent(config))
        for rel, text in (files or {}).items():
            (model_dir / rel).write_text(textwrap.dedent(text))
        return model_dir

    def load(self, model_dir: Path, **kw: Any) -> BackendHarness:
        config = (model_dir / "config.pbtxt").read_text()
        return BackendHarness("python", config, repository_path=str(model_dir), **kw)

    def load_error(self, model_dir: Path) -> InferpoolError:
        with pytest.raises(InferpoolError) as info:
            self.load(model_dir)
        return info.value


@pytest.fixture
def models(tmp_path: Path) -> PythonModels:
    return PythonModels(tmp_path / "models")
