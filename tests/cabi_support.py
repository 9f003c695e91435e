"""C backends of the tests' own (tests/cabi_backends/*.c), compiled with the system compiler
once per source: the library is kept under a temporary directory named by the hash of the
source and the project's headers, so a test session compiles each at most once."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from inferpool.backends.cabi import library
from inferpool.wire.errors import InferpoolError
from tests.support import ROOT

SOURCES = ROOT / "tests" / "cabi_backends"
CACHE = Path(tempfile.gettempdir()) / "inferpool-cabi-tests"


def _headers_digest() -> bytes:
    digest = hashlib.sha256()
    for header in sorted(Path(library.include_dir()).rglob("*.h")):
        digest.update(header.read_bytes())
    return digest.digest()


def compiler() -> str:
    """The C compiler, or a skip saying why there is none."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler on this machine (install gcc): C backends cannot be built")
    try:
        library.host()
    except InferpoolError as err:
        pytest.skip(f"the C API host is not built: {err.message}")
    return cc


def build(name: str, backend: str | None = None) -> Path:
    """``libtriton_<backend>.so`` built from tests/cabi_backends/<name>.c (cached)."""
    backend = backend or name
    source = SOURCES / f"{name}.c"
    digest = hashlib.sha256(source.read_bytes() + _headers_digest() + backend.encode())
    out = CACHE / digest.hexdigest()[:16] / f"libtriton_{backend}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run(
            [compiler(), "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-pthread",
             f"-I{library.include_dir()}", str(source), "-o", str(partial)],
            check=True,
        )  # fmt: skip
        partial.rename(out)
    return out


def install(name: str, model_dir: Path, backend: str | None = None) -> Path:
    """Put the library built from ``name``.c in ``model_dir`` (Triton's second place)."""
    built = build(name, backend)
    model_dir.mkdir(parents=True, exist_ok=True)
    target = model_dir / built.name
    shutil.copyfile(built, target)
    return target
