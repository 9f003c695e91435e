"""The package-dir mapping in pyproject.toml: every package folder installs under
``inferpool.``, and nothing is forgotten."""

from __future__ import annotations

import sys

from tests.support import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, from PyPI (the dev extra installs it)
    import tomli as tomllib

FOLDERS = ("wire", "shm", "backends", "workers", "broker", "client", "examples")


def _config() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def test_every_package_folder_is_listed_under_the_namespace() -> None:
    listed = set(_config()["packages"])
    on_disk = {"inferpool", "triton_python_backend_utils"}
    for top in FOLDERS:
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT)
            on_disk.add(".".join(("inferpool", *rel.parts)))
    for init in (ROOT / "cli").rglob("__init__.py"):  # the namespace's own: the command line
        on_disk.add(".".join(("inferpool", *init.parent.relative_to(ROOT / "cli").parts)))
    assert listed == on_disk


def test_only_the_namespace_and_tritons_name_install_at_the_top() -> None:
    mapping = _config()["package-dir"]
    tops = {name.split(".")[0] for name in mapping}
    assert tops == {"inferpool", "triton_python_backend_utils"}
    for top in FOLDERS:
        assert mapping[f"inferpool.{top}"] == top
