"""A model directory's fingerprint: what a SIGHUP reload compares."""

from __future__ import annotations

import os
from pathlib import Path

from inferpool.broker.models.repository import fingerprint, scan_model
from tests.support import identity_config, write_model


def test_changes_with_files_and_versions_but_not_caches(tmp_path: Path) -> None:
    model = write_model(tmp_path, "m", identity_config("m"), files={"1/model.py": "A = 1\n"})
    first = fingerprint(str(model))
    assert fingerprint(str(model)) == first  # stable

    (model / "1" / "__pycache__").mkdir()
    (model / "1" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0" * 8)
    (model / ".config.pbtxt.swp").write_text("editor state")
    assert fingerprint(str(model)) == first  # serving or editing does not look like a change

    st = os.stat(model / "1" / "model.py")
    os.utime(model / "1" / "model.py", ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    touched = fingerprint(str(model))
    assert touched != first  # same bytes, newer file

    (model / "2").mkdir()
    assert fingerprint(str(model)) != touched  # a new version directory

    (model / "2").rmdir()
    (model / "1" / "model.py").unlink()
    assert fingerprint(str(model)) not in (first, touched)  # a removed file


def test_scan_records_the_fingerprint_even_for_a_broken_model(tmp_path: Path) -> None:
    model = write_model(tmp_path, "m", identity_config("m"), versions=())
    entry = scan_model(str(tmp_path), "m")
    assert entry.error is not None and entry.fingerprint == fingerprint(str(model))
