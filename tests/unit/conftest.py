"""Fixtures shared by the unit tests."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

MakeModel = Callable[..., Path]


@pytest.fixture
def make_model(tmp_path: Path) -> MakeModel:
    """Write ``<tmp>/models/<name>/`` with config.pbtxt and files; returns the model dir.

    ``files`` maps paths relative to the model dir to (dedented) text; version 1 always exists.
    """

    def make(name: str, config: str, files: dict[str, str] | None = None) -> Path:
        model_dir = tmp_path / "models" / name
        (model_dir / "1").mkdir(parents=True)
        (model_dir / "config.pbtxt").write_text(textwrap.dedent(config))
        for rel, text in (files or {}).items():
            path = model_dir / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text))
        return model_dir

    return make
