"""The docs stay true: every Python and shell code block of README.md and docs/*.md runs as
written, in order, against a live server.

A page runs as a user follows it in one shell: its blocks one after the other, in one
directory (``examples`` linked there, so the docs' relative paths work), so that what a block
leaves is there for the next (the files it wrote, a server it started).  A block run alone
(``-k``) runs the page's earlier blocks first.  The page starts with a server of the embedded
example repository (README's set-up), named by ``$INFERPOOL_ENDPOINT``.  An HTML comment on
the line before a block's fence says otherwise:

- ``<!-- test: skip REASON -->``: not run (it installs software, needs root, a GPU, minutes);
- ``<!-- test: server=NAME -->``: a server of ``examples/NAME`` is the page's server from here;
- ``<!-- test: kserve -->``: the block runs against a server with the KServe frontends, on free
  ports that stand in for Triton's 8000 and 8001 in the block;
- ``<!-- test: free-port=N -->``: a free port stands in for port N wherever the block names it.

A Python block passes when it exits 0 and each ``print(...)  # OUTPUT`` comment is found in
what it printed, in order (``...`` stands for anything).  A shell block's lines run one by
one: ``inferpool serve ...`` (a trailing ``&`` or not) starts a server that the later lines
and blocks of the page talk to, in place of the one before (stopped, as Ctrl-C would: the
shared one when it serves an example repository as it is), and an ``inferpool infer ...  #
OUTPUT`` line must print its OUTPUT.  A ``text`` fence right after a shell block shows what
the block's last command prints: it must print exactly that.
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
LANGS = ("python", "sh")
EXAMPLES = "model_repository"  # what README's set-up serves


@dataclass(frozen=True)
class Block:
    page: str
    index: int  # its place among the page's blocks
    line: int
    lang: str
    code: str
    directive: str
    output: str | None = None  # the fence after a shell block: its last command's output

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def skip(self) -> str:
        """Why the block is not run ("" when it is)."""
        return self.directive[5:].strip() if self.directive.startswith("skip") else ""

    @property
    def kserve(self) -> bool:
        return "kserve" in self.directive.split()

    @property
    def repository(self) -> str | None:
        """The example repository the block asks to be served (``server=NAME``), if any."""
        found = re.search(r"server=(\S+)", self.directive)
        return found[1] if found else None

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


def page_blocks(page: Path) -> list[Block]:
    """The Python and shell blocks of ``page``, in order."""
    text = page.read_text()
    fences = list(FENCE.finditer(text))
    out: list[Block] = []
    for at, match in enumerate(fences):
        if match[1] not in LANGS:
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
                len(out),
                text.count("\n", 0, match.start()) + 1,
                match[1],
                match[2],
                directive[1] if directive else "",
                shown,
            )
        )
    return out


BLOCKS = {str(page.relative_to(ROOT)): page_blocks(page) for page in PAGES}


def runnable() -> list[Any]:
    return [
        pytest.param(b, id=b.id, marks=pytest.mark.skip(reason=b.skip))
        if b.skip
        else pytest.param(b, id=b.id)
        for page in BLOCKS.values()
        for b in page
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
        if name == EXAMPLES and not kserve:
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


SYSTEM_DIRS = ("/etc/inferpool", "/run/inferpool")


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


class Page:
    """One page followed in one shell: its directory, the server its commands talk to, the
    blocks run so far."""

    def __init__(self, name: str, servers: Servers) -> None:
        self.blocks = BLOCKS[name]
        self.servers = servers
        self.dir = Path(tempfile.mkdtemp(prefix="ipt-", dir="/tmp"))
        (self.dir / "examples").symlink_to(ROOT / "examples")
        self.server = servers.of(EXAMPLES)  # README's set-up started it
        self.own: Server | None = None  # the server a block of the page started
        self.ran = -1  # the last block run

    def run(self, block: Block) -> None:
        """Run ``block``, after the page's earlier blocks not run yet (a block run alone)."""
        for earlier in self.blocks[self.ran + 1 : block.index]:
            if not earlier.skip:
                try:
                    self._run(earlier)
                except AssertionError as exc:
                    raise AssertionError(f"{block.id} follows {earlier.id}, which failed") from exc
        self._run(block)

    def _run(self, block: Block) -> None:
        self.ran = block.index
        if block.repository is not None and not block.kserve:
            self._use(self.servers.of(block.repository), owned=False)
        if block.lang == "python":
            self._python(block)
        else:
            self._shell(block)

    def _use(self, server: Server, owned: bool) -> None:
        """``server`` is the page's server from now on; the one a block started stops."""
        if self.own is not None and self.own is not server:
            self.own.stop()
        self.own = server if owned else None
        self.server = server

    def _python(self, block: Block) -> None:
        server = self.servers.of(block.repository or EXAMPLES, True) if block.kserve else None
        server = server or self.server
        (self.dir / "block.py").write_text(block.source(server))
        done = subprocess.run(
            [sys.executable, "block.py"],
            cwd=self.dir,
            env=environment(server.endpoint),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"{block.id} failed:\n{done.stderr}"
        expected = [m[1] for line in block.code.splitlines() if (m := PRINTED.match(line))]
        assert_printed(expected, done.stdout, block.id)

    def _shell(self, block: Block) -> None:
        kserve = self.servers.of(block.repository or EXAMPLES, True) if block.kserve else None
        printed = ""
        code = sandboxed(block.source(kserve or self.server), self.dir)
        for raw in code.replace("\\\n", " ").splitlines():
            command, _, comment = raw.partition("  #")
            argv = shlex.split(command)
            if not argv or argv[0].startswith("#"):
                continue
            if argv[:2] == ["inferpool", "serve"]:  # in the background, until another one
                self._serve([a for a in argv[2:] if a != "&"])
                continue
            done = subprocess.run(
                command,
                shell=True,
                cwd=self.dir,
                env=environment((kserve or self.server).endpoint),
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, f"{block.id}: `{command.strip()}` failed:\n{done.stderr}"
            printed = done.stdout
            if argv[:2] == ["inferpool", "infer"] and comment.strip():
                assert_printed([comment.strip()], done.stdout, f"{block.id}: {command.strip()}")
        if block.output is not None:
            shown = [line.rstrip() for line in block.output.splitlines()]
            assert [line.rstrip() for line in printed.splitlines()] == shown, block.id

    def _serve(self, args: list[str]) -> None:
        """``inferpool serve ARGS``: the shared server of an example repository served as it
        is, else a server of its own (small arenas, its own endpoint)."""
        repo = f"examples/{EXAMPLES}"
        if "--model-repository" in args:
            at = args.index("--model-repository")
            repo = args[at + 1]
            args = args[:at] + args[at + 2 :]
        if not args and repo.startswith("examples/"):
            self._use(self.servers.of(repo.removeprefix("examples/")), owned=False)
            return
        if self.own is not None:  # stopped first, as Ctrl-C: it may hold a port of the next
            self.own.stop()
            self.own = None
        self._use(self.servers.start(self.dir / repo, *args, cwd=self.dir), owned=True)

    def close(self) -> None:
        if self.own is not None:
            self.own.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class Pages:
    """The page being followed; the one before is closed when the next one starts."""

    def __init__(self, servers: Servers) -> None:
        self.servers = servers
        self.open: Page | None = None

    def of(self, block: Block) -> Page:
        page = self.open
        if page is None or page.blocks is not BLOCKS[block.page] or page.ran >= block.index:
            self.close()
            page = self.open = Page(block.page, self.servers)
        return page

    def close(self) -> None:
        if self.open is not None:
            self.open.close()
            self.open = None


@pytest.fixture(scope="module")
def pages(example_server: Server) -> Iterator[Pages]:
    servers = Servers(example_server)
    followed = Pages(servers)
    try:
        yield followed
    finally:
        try:
            followed.close()
        finally:
            servers.close()


@pytest.mark.parametrize("block", runnable())
def test_block_runs_as_written(block: Block, pages: Pages) -> None:
    pages.of(block).run(block)
