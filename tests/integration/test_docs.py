"""The docs stay true: every Python code block of README.md and docs/*.md runs, and the shell
blocks run as a user would type them, against a live server.

A block runs in a fresh directory (``examples`` linked there, so the docs' relative paths
work) with ``$INFERPOOL_ENDPOINT`` naming a server of the embedded example repository.  An
HTML comment on the line before a block's fence says otherwise:

- ``<!-- test: skip REASON -->``: not run (it installs software, needs root, a GPU, minutes);
- ``<!-- test: server=NAME -->``: run against a server of ``examples/NAME``;
- ``<!-- test: kserve -->``: the server also serves the KServe frontends, on free ports that
  stand in for Triton's 8000 and 8001 in the block;
- ``<!-- test: free-port=N -->``: a free port stands in for port N wherever the block names it.

A Python block passes when it exits 0 and each ``print(...)  # OUTPUT`` comment is found in
what it printed, in order (``...`` stands for anything).  A shell block's lines run one by
one: ``inferpool serve ...`` (a trailing ``&`` or not) starts a server that the later lines
talk to (the shared one when it serves an example repository as it is), and an
``inferpool infer ...  # OUTPUT`` line must print its OUTPUT.  A ``text`` fence right after
a shell block shows what the block's last command prints: it must print exactly that.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, Server, free_tcp_port

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
DIRECTIVE = re.compile(r"<!--\s*test:\s*(.*?)\s*-->")
PRINTED = re.compile(r"^\s*print\(.*\)\s+#\s?(.*)$")
BIN = str(Path(sys.executable).parent)  # `inferpool` and `python` as this test's


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    code: str
    directive: str
    output: str | None = None  # the fence after a shell block: its last command's output

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def kserve(self) -> bool:
        return "kserve" in self.directive.split()

    @property
    def repository(self) -> str:
        found = re.search(r"server=(\S+)", self.directive)
        return found[1] if found else "model_repository"

    def source(self, server: Server) -> str:
        """The code to run: Triton's ports are the server's KServe ports (``kserve``), and
        each ``free-port`` a free one."""
        code = self.code
        if self.kserve:
            code = code.replace(":8000", f":{server.http_port}")
            code = code.replace(":8001", f":{server.grpc_port}")
        for port in re.findall(r"free-port=(\d+)", self.directive):
            code = re.sub(rf"\b{port}\b", str(free_tcp_port()), code)
        return code


def blocks(*langs: str) -> list[Block]:
    out = []
    for page in PAGES:
        text = page.read_text()
        fences = list(FENCE.finditer(text))
        for at, match in enumerate(fences):
            if match[1] not in langs:
                continue
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            directive = DIRECTIVE.search(before)
            after = fences[at + 1] if at + 1 < len(fences) else None
            shown = (
                after[2]
                if after is not None
                and match[1] == "sh"
                and after[1] == "text"
                and not text[match.end() : after.start()].strip()
                else None
            )
            out.append(
                Block(
                    str(page.relative_to(ROOT)),
                    text.count("\n", 0, match.start()) + 1,
                    match[1],
                    match[2],
                    directive[1] if directive else "",
                    shown,
                )
            )
    return out


def runnable(*langs: str) -> list[Any]:
    return [
        pytest.param(b, id=b.id, marks=pytest.mark.skip(reason=b.directive[5:].strip()))
        if b.directive.startswith("skip")
        else pytest.param(b, id=b.id)
        for b in blocks(*langs)
    ]


class Servers:
    """Servers started for the blocks, each in a directory of its own; all stopped at the end."""

    def __init__(self, examples: Server) -> None:
        self.shared: dict[str, Server] = {}
        self._dirs: list[Path] = []
        self._examples = examples  # the session's server of the example repository

    def start(
        self, repo: Path, *args: str, cwd: Path | None = None, kserve: bool = False
    ) -> Server:
        tmp = Path(tempfile.mkdtemp(prefix="ipt-", dir="/tmp"))
        self._dirs.append(tmp)
        return Server(tmp, repo, *args, cwd=cwd, kserve=kserve).__enter__()

    def of(self, name: str, kserve: bool = False) -> Server:
        """A server of ``examples/NAME`` (with the KServe frontends), shared by the blocks
        that use it."""
        if name == "model_repository" and not kserve:
            return self._examples
        key = f"{name} kserve" if kserve else name
        if key not in self.shared:
            self.shared[key] = self.start(ROOT / "examples" / name, kserve=kserve)
        return self.shared[key]

    def close(self) -> None:
        for server in self.shared.values():
            server.stop()
        for tmp in self._dirs:
            shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def servers(example_server: Server) -> Iterator[Servers]:
    started = Servers(example_server)
    try:
        yield started
    finally:
        started.close()


SYSTEM_DIRS = ("/etc/inferpool", "/run/inferpool")


@pytest.fixture
def workdir(short_tmp: Path) -> Path:
    (short_tmp / "examples").symlink_to(ROOT / "examples")
    return short_tmp


def sandboxed(code: str, workdir: Path) -> str:
    """``code`` with the system's inferpool directories (/etc/inferpool, /run/inferpool)
    moved under ``workdir``: a block run by the tests writes nothing outside it."""
    for system in SYSTEM_DIRS:
        code = code.replace(system, f"{workdir}{system}")
    return code


def environment(endpoint: str) -> dict[str, str]:
    return {
        **os.environ,
        "INFERPOOL_ENDPOINT": endpoint,
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "PYTHONUNBUFFERED": "1",
    }


def assert_printed(expectations: list[str], output: str, where: str) -> None:
    """Each expected text (``...``: anything) appears in ``output``, in order."""
    text = ", ".join(line.strip() for line in output.splitlines())
    at = 0
    for expected in expectations:
        for part in (p.strip() for p in expected.split("...")):
            found = text.find(part, at)
            assert found >= 0, f"{where}: {expected!r} is not in what it printed:\n{output}"
            at = found + len(part)


@pytest.mark.parametrize("block", runnable("python"))
def test_python_blocks_run(block: Block, servers: Servers, workdir: Path) -> None:
    server = servers.of(block.repository, block.kserve)
    (workdir / "block.py").write_text(block.source(server))
    done = subprocess.run(
        [sys.executable, "block.py"],
        cwd=workdir,
        env=environment(server.endpoint),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{block.id} failed:\n{done.stderr}"
    expected = [m[1] for line in block.code.splitlines() if (m := PRINTED.match(line))]
    assert_printed(expected, done.stdout, block.id)


@pytest.mark.parametrize("block", runnable("sh"))
def test_shell_blocks_run(block: Block, servers: Servers, workdir: Path) -> None:
    shared = servers.of(block.repository, block.kserve)
    endpoint = shared.endpoint
    own: list[Server] = []
    printed = ""
    try:
        for raw in sandboxed(block.source(shared), workdir).replace("\\\n", " ").splitlines():
            command, _, comment = raw.partition("  #")
            argv = shlex.split(command)
            if not argv or argv[0].startswith("#"):
                continue
            if argv[:2] == ["inferpool", "serve"]:  # in the background, until the block ends
                server, owned = serve(servers, [a for a in argv[2:] if a != "&"], workdir)
                own += [server] if owned else []
                endpoint = server.endpoint
                continue
            done = subprocess.run(
                command,
                shell=True,
                cwd=workdir,
                env=environment(endpoint),
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, f"{block.id}: `{command.strip()}` failed:\n{done.stderr}"
            printed = done.stdout
            if argv[:2] == ["inferpool", "infer"] and comment.strip():
                assert_printed([comment.strip()], done.stdout, f"{block.id}: {command.strip()}")
    finally:
        for server in own:
            server.stop()
    if block.output is not None:
        shown = [line.rstrip() for line in block.output.splitlines()]
        assert [line.rstrip() for line in printed.splitlines()] == shown, block.id


def serve(servers: Servers, args: list[str], cwd: Path) -> tuple[Server, bool]:
    """``inferpool serve ARGS``: the shared server of an example repository served as it is,
    else a Server of its own (small arenas, its own endpoint), which the block stops (True)."""
    repo = "examples/model_repository"
    if "--model-repository" in args:
        at = args.index("--model-repository")
        repo = args[at + 1]
        args = args[:at] + args[at + 2 :]
    if not args and repo.startswith("examples/"):
        return servers.of(repo.removeprefix("examples/")), False
    return servers.start(cwd / repo, *args, cwd=cwd), True
