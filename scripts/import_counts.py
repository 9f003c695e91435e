#!/usr/bin/env python3
"""Count the imports between inferpool's packages, read from the code (ast), as a matrix.

Packages are the folders at the top of the repository (``wire``, ``shm``, ``backends``,
``workers``, ``broker``, ``client``, and ``cli``, named ``inferpool`` in older commits: the
command line and the namespace's ``__init__``, which holds the version); the broker counts by its
sub-packages (``broker.front``, ``broker.models``, ``broker.pool``; ``broker`` is its own
top-level modules).  Both spellings are understood: ``inferpool.broker.models.lifecycle``
(the installed namespace) and ``broker.manager`` (the flat top-level packages of older
commits).  Every ``import`` and ``from ... import`` counts once per package it reaches,
``TYPE_CHECKING`` imports included: they are dependencies too.

    python scripts/import_counts.py               # the working tree
    python scripts/import_counts.py --rev 6682cd5 # a commit, read from git
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("wire", "shm", "backends", "workers", "broker", "client", "cli")
OLD_CLI = "inferpool"  # the command line's folder before it was cli/
BROKER_PARTS = ("front", "models", "pool")
ORDER = (
    "wire",
    "shm",
    "backends",
    "workers",
    "broker",
    *(f"broker.{p}" for p in BROKER_PARTS),
    "client",
    "cli",
)


def package_of(dotted: str, split: bool) -> str | None:
    """The package a module name (either spelling) belongs to, or None if not ours;
    ``split``: the broker has its sub-packages (else ``broker.models`` is a module)."""
    parts = dotted.split(".")
    if parts[0] == "inferpool":
        if len(parts) < 2 or parts[1] not in PACKAGES[:-1]:
            return "cli"  # the namespace's own modules: the command line, the version
        parts = parts[1:]  # inferpool.broker... -> broker...
    head = "cli" if parts[0] == OLD_CLI else parts[0]
    if head not in PACKAGES:
        return None
    if split and head == "broker" and len(parts) > 2 and parts[1] in BROKER_PARTS:
        return f"broker.{parts[1]}"
    return head


def sources(rev: str | None) -> Iterator[tuple[str, str]]:
    """(path, text) of every Python file of our packages, in the tree or at ``rev``."""
    if rev is None:
        for pkg in (*PACKAGES, OLD_CLI):
            for file in sorted((ROOT / pkg).rglob("*.py")):
                yield str(file.relative_to(ROOT)), file.read_text(encoding="utf-8")
        return
    listing = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", rev, "--", *PACKAGES, OLD_CLI],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for path in listing:
        if path.endswith(".py"):
            text = subprocess.run(
                ["git", "-C", str(ROOT), "show", f"{rev}:{path}"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            yield path, text


def module_of(path: str) -> str:
    """``broker/models/lifecycle.py`` -> ``broker.models.lifecycle`` (``__init__`` dropped)."""
    parts = path[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported(tree: ast.AST, module: str, is_package: bool) -> Iterator[list[str]]:
    """For each import statement, the dotted names it reaches (relative ones resolved)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            yield [f"{base}.{alias.name}" for alias in node.names]


def count(rev: str | None) -> Counter[tuple[str, str]]:
    files = dict(sources(rev))
    split = "broker/front/__init__.py" in files
    edges: Counter[tuple[str, str]] = Counter()
    for path, text in files.items():
        module = module_of(path)
        source = package_of(module, split)
        if source is None:
            continue
        tree = ast.parse(text, filename=path)
        for names in imported(tree, module, path.endswith("__init__.py")):
            for target in {package_of(n, split) for n in names} - {None, source}:
                assert target is not None
                edges[source, target] += 1
    return edges


def render(edges: Counter[tuple[str, str]]) -> str:
    used = [p for p in ORDER if any(p in edge for edge in edges)]
    width = max(len(p) for p in used) if used else 4
    lines = ["from \\ to".ljust(width) + " | " + " ".join(p.rjust(width) for p in used)]
    lines.append("-" * len(lines[0]))
    for src in used:
        cells = [str(edges.get((src, dst), "") or ".").rjust(width) for dst in used]
        lines.append(src.ljust(width) + " | " + " ".join(cells))
    lines.append("")
    for (src, dst), n in sorted(edges.items(), key=lambda e: (ORDER.index(e[0][0]), e[0][1])):
        lines.append(f"{src} -> {dst}: {n}")
    lines.append(f"total: {sum(edges.values())}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rev", help="a git commit to read instead of the working tree")
    args = parser.parse_args(argv)
    try:
        edges = count(args.rev)
    except subprocess.CalledProcessError as exc:
        print(f"import_counts: git failed: {exc.stderr.strip()}", file=sys.stderr)
        return 1
    print(render(edges))
    return 0


if __name__ == "__main__":
    sys.exit(main())
