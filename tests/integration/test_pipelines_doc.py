"""docs/pipelines.md as written: its Python blocks run against the example pipeline
repository it tells a reader to serve (examples/pipeline_repository)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support import ROOT, Server

DOC = ROOT / "docs" / "pipelines.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def test_the_guide_has_its_examples() -> None:
    assert len(BLOCKS) == 3  # the client session, over lanes, and the BLS model


def test_the_python_blocks_run(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Server(short_tmp, ROOT / "examples" / "pipeline_repository") as server:
        monkeypatch.setenv("INFERPOOL_ENDPOINT", server.endpoint)
        for i, block in enumerate(BLOCKS):
            exec(compile(block, f"{DOC}:block{i}", "exec"), {"__name__": f"doc_block_{i}"})
        with server.client() as c:
            assert {m["name"]: m["state"] for m in c.models()} == {
                "normalize": "READY",
                "probabilities": "READY",
                "softmax": "READY",
                "top_class": "READY",
            }
