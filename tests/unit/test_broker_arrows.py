"""The broker's import arrows, read from its code (ast), TYPE_CHECKING imports included.

Inside the broker: front -> models -> pool, never back; the KServe frontends (kserve) import
none of them (they reach the broker only in the zmq protocol); its top-level modules (server,
options, endpoints, notify) compose the four, and no sub-package imports them.  Of the
rest of inferpool the broker imports only ``wire`` and ``shm`` (and the version from the
namespace's ``__init__``): never workers, backends, client or the CLI.  Inside models, the
lifecycle (``models.lifecycle``) builds the request path, calls, ensembles and reloads with a
narrow Protocol of what each needs: none of them imports it back.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support import ROOT

BROKER = ROOT / "broker"
PARTS = ("front", "models", "pool", "kserve")
MAY_IMPORT = {
    "front": {"front", "models", "pool"},
    "models": {"models", "pool"},
    "pool": {"pool"},
    "kserve": {"kserve"},
}
OUTSIDE = ("wire", "shm")
OURS = ("wire", "shm", "broker", "workers", "backends", "client", "examples")


def part_of(relative: Path) -> str:
    """``front``, ``models``, ``pool`` or ``kserve``; ``top`` for the broker's own modules."""
    return relative.parts[0] if len(relative.parts) > 1 and relative.parts[0] in PARTS else "top"


def imported_names(tree: ast.AST, package: str) -> list[tuple[int, str]]:
    """(line, dotted name) of everything imported; ``from a import b`` gives ``a.b``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def violation(part: str, name: str) -> str | None:
    """Why importing ``name`` from the broker's ``part`` breaks an arrow, or None."""
    parts = name.split(".")
    if parts[0] in OURS:
        return "spelled without the inferpool. namespace"
    if parts[0] != "inferpool":
        return None  # the standard library or a third-party package
    if len(parts) == 2 and parts[1] == "__version__":
        return None
    if parts[1] in OUTSIDE:
        return None
    if parts[1] != "broker":
        return f"the broker imports only {' and '.join(OUTSIDE)} of inferpool"
    target = parts[2] if len(parts) > 3 and parts[2] in PARTS else "top"
    if part == "top":
        return None
    if target == "top":
        return f"broker.{part} imports the broker's top-level module {'.'.join(parts[1:3])}"
    if target not in MAY_IMPORT[part]:
        if part == "kserve":
            return "broker.kserve speaks to the broker only in the zmq protocol"
        return f"broker.{part} imports broker.{target}: arrows run front -> models -> pool"
    return None


def check(path: Path, text: str) -> list[str]:
    relative = path.relative_to(BROKER)
    part = part_of(relative)
    package = ".".join(("inferpool", "broker", *relative.parts[:-1]))
    problems = []
    for line, name in imported_names(ast.parse(text), package):
        why = violation(part, name)
        if why:
            problems.append(f"broker/{relative}:{line}: {name}: {why}")
    return problems


def test_broker_imports_follow_the_arrows() -> None:
    modules = sorted(BROKER.rglob("*.py"))
    assert len(modules) > 30 and {part_of(m.relative_to(BROKER)) for m in modules} == {
        *PARTS,
        "top",
    }
    problems = [p for m in modules for p in check(m, m.read_text(encoding="utf-8"))]
    assert problems == []


def test_the_check_sees_each_kind_of_wrong_arrow() -> None:
    cases = {
        "models/x.py": "from inferpool.broker.front.responder import Responder",
        "pool/x.py": "from inferpool.broker.models.registry import ModelVersion",
        "front/x.py": "from inferpool.broker.options import ServerOptions",
        "top.py": "import inferpool.workers.main",
        "pool/y.py": "from ..models import registry",
        "front/y.py": "from client.sync import Client",
        "kserve/x.py": "from inferpool.broker.front.router import Router",
    }
    for where, source in cases.items():
        (problem,) = check(BROKER / where, "from typing import TYPE_CHECKING\n" + source)
        assert problem.startswith(f"broker/{where}:2: ")
    allowed = (
        "from inferpool.broker.pool.handle import WorkerHandle\n"
        "from inferpool.wire.errors import Code\nfrom inferpool import __version__\nimport zmq"
    )
    assert check(BROKER / "front" / "z.py", allowed) == []


def import_graph() -> dict[str, set[str]]:
    """Module -> the broker's modules it imports (``TYPE_CHECKING`` imports included)."""
    modules = {
        ".".join(m.relative_to(BROKER).with_suffix("").parts): m for m in BROKER.rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = ".".join(("inferpool", "broker", *name.split(".")[:-1]))
        targets = set()
        for _, imported in imported_names(ast.parse(path.read_text(encoding="utf-8")), package):
            parts = imported.split(".")[2:]  # after inferpool.broker
            for end in (len(parts), len(parts) - 1):  # a module, or a name in one
                if ".".join(parts[:end]) in modules:
                    targets.add(".".join(parts[:end]))
                    break
        graph[name] = targets - {name}
    return graph


def reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            if nxt == goal:
                return True
            seen.add(nxt)
            todo.append(nxt)
    return False


def test_the_models_manager_and_its_parts_import_no_circle() -> None:
    """The lifecycle (models.lifecycle) builds the request path, calls, ensembles and reloads
    and gives each a narrow Protocol of itself: none of them imports it back."""
    graph = import_graph()
    parts = ["lifecycle", "request_path", "call_requests", "ensemble", "ensembles", "reload"]
    circles = [p for p in parts if reaches(graph, f"models.{p}", f"models.{p}")]
    assert circles == []
    assert graph["models.lifecycle"] >= {"models.request_path", "models.ensembles"}
