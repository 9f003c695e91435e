"""The Node.js client (scripts/clients/node, the `zeromq` npm package) against a live broker:
several requests in flight on one DEALER, matched by id; a server error; health; no server at
all, which zmq alone would not report; and PROTOCOL.md's Node.js snippet as written."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.support import ROOT, Server

NODE_DIR = ROOT / "scripts" / "clients" / "node"
pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or shutil.which("npm") is None,
    reason="node and npm are not installed (apt-get install nodejs npm)",
)


@pytest.fixture(scope="module")
def node_client() -> Path:
    """The script, with its locked dependencies installed (.ci/run installs them up front)."""
    if not (NODE_DIR / "node_modules" / "zeromq").is_dir():
        done = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund"],
            cwd=NODE_DIR,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
    return NODE_DIR / "infer_identity.mjs"


def run(script: Path, *args: str, timeout_ms: int = 10000) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["node", str(script), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ["PATH"], "INFERPOOL_TIMEOUT_MS": str(timeout_ms)},
    )


def test_node_client_speaks_the_protocol(node_client: Path, example_server: Server) -> None:
    for endpoint in example_server.endpoints:
        done = run(node_client, endpoint)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [
            "OUTPUT0 = 1.5 2.5 3.5 4.5",
            "OUTPUT0 = 2.5 2.5 3.5 4.5",
            "OUTPUT0 = 3.5 2.5 3.5 4.5",
            "OK",
        ]
    missing = run(node_client, example_server.tcp, "missing")
    assert missing.returncode == 2
    assert "server error NOT_FOUND: Request for unknown model: 'missing'" in missing.stderr
    health = run(node_client, example_server.endpoint, "identity", "--health")
    assert (health.returncode, health.stdout) == (0, "true\n")


def test_node_client_says_when_no_server_answers(node_client: Path, short_tmp: Path) -> None:
    gone = run(node_client, f"ipc://{short_tmp}/none.sock")
    assert gone.returncode == 3 and "the socket file does not exist" in gone.stderr
    with socket.socket() as held:  # a port nothing answers on
        held.bind(("127.0.0.1", 0))
        silent = run(node_client, f"tcp://127.0.0.1:{held.getsockname()[1]}", timeout_ms=1000)
    assert silent.returncode == 3 and "no answer from tcp://127.0.0.1:" in silent.stderr


def test_the_protocol_docs_node_snippet_runs(node_client: Path, example_server: Server) -> None:
    text = (ROOT / "docs" / "PROTOCOL.md").read_text()
    (snippet,) = re.findall(r"```js\n(.*?)```", text, re.S)
    snippet = snippet.replace("tcp://127.0.0.1:8710", example_server.tcp)
    done = subprocess.run(
        ["node", "--input-type=module", "-e", snippet],
        cwd=NODE_DIR,  # where its node_modules are
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "name: 'OUTPUT0', datatype: 'FP32', shape: [ 2 ]" in done.stdout
    assert "Float32Array(2) [ 1, 2 ]" in done.stdout
