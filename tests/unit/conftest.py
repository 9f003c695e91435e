"""Fixtures shared by the unit tests."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from inferpool.backends.testing import BackendHarness
from inferpool.wire.errors import InferpoolError


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
