"""Import arrows point one way (DESIGN.md): ``wire`` and ``shm`` import nothing of ours,
``backends`` imports ``wire`` and ``shm``, ``workers`` imports ``backends`` (and what it
imports), ``broker`` and ``client`` import ``wire`` and ``shm`` only.

Checked from outside twice: every module of a package is imported in a fresh interpreter
(a module whose optional extra is not installed is passed over: the source check still reads
it) and the packages of ours that appear in ``sys.modules`` are read; and every import statement
in the package's files, at any depth (an import inside a function runs late, but it is an
arrow all the same), is read from the source.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from tests.support import ROOT

ALLOWED = {
    "wire": set(),
    "shm": set(),
    "backends": {"wire", "shm"},
    "workers": {"backends", "wire", "shm"},
    "broker": {"wire", "shm"},
    "client": {"wire", "shm"},
}

IMPORT_ALL = """
import importlib, json, pkgutil, sys
package = importlib.import_module("inferpool." + sys.argv[1])
for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
    try:
        importlib.import_module(info.name)
    except ModuleNotFoundError as missing:  # an optional extra (ray) not installed here
        if (missing.name or "inferpool").split(".")[0] == "inferpool":
            raise
ours = {name.split(".")[1] for name in sys.modules if name.startswith("inferpool.")}
print(json.dumps(sorted(ours - {sys.argv[1]})))
"""


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_importing_a_package_loads_only_what_its_arrows_allow(package: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, package],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",  # the installed namespace, not the checkout's folders
    )
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout))
    assert loaded <= ALLOWED[package], f"inferpool.{package} loads {sorted(loaded)}"


def imports_of(package: str) -> dict[str, set[str]]:
    """Packages of ours each file of ``package`` imports, at any depth: {file: {package}}."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        ours = {n.split(".")[1] for n in names if n.startswith("inferpool.") and n.count(".")}
        found[str(path.relative_to(ROOT))] = ours - {package}
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_no_import_statement_points_the_wrong_way(package: str) -> None:
    wrong = {f: sorted(ps - ALLOWED[package]) for f, ps in imports_of(package).items()}
    assert {f: ps for f, ps in wrong.items() if ps} == {}
