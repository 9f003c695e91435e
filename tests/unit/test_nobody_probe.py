"""tests.support.closed_to_nobody: which directory keeps user nobody (the tests that run a
client as nobody) from a path, so that those tests skip saying so."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import closed_to_nobody


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory anyone may enter (pytest's own sits in a closed one)."""
    if os.geteuid() != 0:
        pytest.skip("asking as user nobody needs root (setpriv)")
    made = Path(tempfile.mkdtemp(prefix="nobody-probe-", dir="/tmp"))
    made.chmod(0o755)
    yield made
    shutil.rmtree(made)


def test_the_closed_directory_above_a_path_is_named(open_dir: Path) -> None:
    closed = open_dir / "home"
    python = closed / "checkout" / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.touch()
    closed.chmod(0o700)
    assert closed_to_nobody(str(python), str(open_dir)) == f"{closed} (mode 700)"
    closed.chmod(0o711)  # others may enter without listing it
    assert closed_to_nobody(str(python)) == ""
