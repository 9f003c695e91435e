"""Reading deploy/kubernetes as a cluster would: rendered by kustomize (``kubectl kustomize``,
or a standalone ``kustomize build``), with the container's ``$(NAME)`` references expanded
from its environment as the kubelet expands them."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.support import ROOT

KUBERNETES = ROOT / "deploy" / "kubernetes"
Doc = dict[str, Any]


def kustomize_command() -> list[str] | None:
    """How to render: kubectl (the dev extra installs it beside the interpreter) or kustomize."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    if kubectl := shutil.which("kubectl", path=path):
        return [kubectl, "kustomize"]
    if kustomize := shutil.which("kustomize", path=path):
        return [kustomize, "build"]
    return None


@functools.cache
def render(which: str) -> str:
    """The YAML stream of ``deploy/kubernetes/<which>``."""
    command = kustomize_command()
    assert command is not None
    done = subprocess.run(
        [*command, str(KUBERNETES / which)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def documents(which: str) -> list[Doc]:
    return [d for d in yaml.safe_load_all(render(which)) if d]


def one(docs: list[Doc], kind: str, name: str = "inferpool") -> Doc:
    """The resource of ``kind`` named ``name`` (a ConfigMap by its name before the hash)."""
    found = [
        d
        for d in docs
        if d["kind"] == kind
        and (d["metadata"]["name"] == name or d["metadata"]["name"].startswith(name + "-"))
    ]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def broker_container(docs: list[Doc]) -> Doc:
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    return next(c for c in spec["containers"] if c["name"] == "broker")


def environment(docs: list[Doc], container: Doc) -> dict[str, str]:
    """The container's environment: its ConfigMaps (``envFrom``), then its ``env``."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        config_map = next(
            d
            for d in docs
            if d["kind"] == "ConfigMap" and d["metadata"]["name"] == source["configMapRef"]["name"]
        )
        env.update(config_map["data"])
    env.update({e["name"]: e["value"] for e in container.get("env", [])})
    return env


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    """``$(NAME)`` replaced by its value (an unknown name stays as written, as the kubelet's)."""
    return [
        re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), a) for a in args
    ]


def flag_values(args: list[str]) -> dict[str, list[str]]:
    """``--name=value`` arguments by name (each name's values in order)."""
    out: dict[str, list[str]] = {}
    for arg in args:
        name, sep, value = arg.partition("=")
        if sep and name.startswith("--"):
            out.setdefault(name, []).append(value)
    return out


def port_number(container: Doc, port: int | str) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    return int(next(p["containerPort"] for p in container["ports"] if p["name"] == port))
