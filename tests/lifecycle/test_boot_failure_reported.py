"""A worker that cannot apply its pinning tells the broker why (a Failed message on its
channel), and `inferpool models` / `inferpool status` show that reason, not a bare exit.

The server runs where set_mempolicy is refused (``seccomp.py``: a container's seccomp profile
without CAP_SYS_NICE), so a model whose host policy binds a NUMA node cannot pin; a model
without one serves beside it.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.lifecycle import seccomp
from tests.support import Server, identity_config, serving, write_model

pytestmark = pytest.mark.skipif(
    platform.machine() not in seccomp.ARCHES, reason="seccomp filter written for x86_64/aarch64"
)
REASON = (
    "cannot apply host policy 'numa0': set_mempolicy(bind, node 0) failed: Operation not permitted"
)


def repo(tmp: Path) -> Path:
    root = tmp / "repo"
    bound = identity_config("bound", extra='instance_group [{host_policy: "numa0"}]')
    write_model(root, "bound", bound)
    write_model(root, "free", identity_config("free"))
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    python = tmp_path_factory.mktemp("seccomp") / "python-without-numa"
    python.write_text(
        f'#!/bin/sh\nexec "{sys.executable}" "{seccomp.__file__}" "{sys.executable}" "$@"\n'
    )
    python.chmod(0o755)
    yield from serving(
        repo, "--host-policy", "numa0,numa-node=0", "--exit-on-error=false", python=str(python)
    )


def cli(server: Server, command: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "inferpool", command, "--endpoint", server.endpoint],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_models_shows_why_the_worker_could_not_pin(server: Server) -> None:
    rows = {line.split()[0]: line for line in cli(server, "models").splitlines()[1:]}
    assert "UNAVAILABLE" in rows["bound"] and REASON in rows["bound"]
    assert "exited during start" not in rows["bound"]
    assert "READY" in rows["free"]


def test_status_shows_the_reason_and_the_instance_is_not_respawned(server: Server) -> None:
    rows = {line.split()[0]: line for line in cli(server, "status").splitlines()[1:]}
    assert "FAILED" in rows["bound_0_0"] and REASON in rows["bound_0_0"]
    with server.client() as c:
        [row] = [r for r in c.status() if r["model"] == "bound"]
        assert (row["state"], row["restarts"], row["pid"]) == ("FAILED", 0, None)
        assert REASON in row["last_error"]
        x = np.arange(4, dtype=np.float32)
        np.testing.assert_array_equal(c.infer("free", {"INPUT0": x})["OUTPUT0"], x)
