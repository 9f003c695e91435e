"""A start can be stopped at any moment: nothing of the run is left, and it stops at once.

The windows are made wide on purpose (an arena of gigabytes to pre-fault, a model whose
initialize sleeps a minute) and the signal is sent once the log says the start is inside
them, never after a fixed sleep.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from inferpool.shm.runs import regions_of_run
from tests.support import Server, write_model

SLOW_MODEL = """
import time

class TritonPythonModel:
    def initialize(self, args):
        print("slow model initializing", flush=True)
        time.sleep(120)

    def execute(self, requests):
        return []
"""


def wait_for_log(server: Server, pattern: str, timeout: float = 60) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, server.log())
        if found:
            return found
        assert server.proc.poll() is None, server.log()
        time.sleep(0.01)
    raise AssertionError(f"the log never said {pattern!r}:\n{server.log()}")


def empty_repo(tmp) -> str:
    repo = tmp / "empty"
    repo.mkdir()
    return str(repo)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_the_arena_prefault_leaves_nothing(short_tmp, sig) -> None:
    args = ["--arena-size", "3G", "--prefault", "3G", "--log-verbose", "1"]  # the start's lines
    server = Server(short_tmp, empty_repo(short_tmp), *args)
    try:
        run = wait_for_log(server, r"run ([0-9a-f]{10}):").group(1)
        wait_for_log(server, r"pre-faulting the input arena")
        assert regions_of_run(run), "the arena should exist while it is pre-faulted"
        os.killpg(server.proc.pid, sig)  # as Ctrl-C does: the whole process group
        assert server.proc.wait(30) == 0, server.log()
    finally:
        server.kill()
    assert regions_of_run(run) == [], server.log()
    assert "the start was interrupted" in server.log()
    assert not os.path.exists(server.ipc[len("ipc://") :])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_models_load_stops_the_server_at_once(short_tmp, sig) -> None:
    repo = short_tmp / "repo"
    write_model(
        repo,
        "slow",
        """
        name: "slow"
        backend: "python"
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
        """,
        files={"1/model.py": SLOW_MODEL},
    )
    server = Server(short_tmp, repo, "--graceful-timeout", "100", "--log-verbose", "1")
    try:
        run = wait_for_log(server, r"run ([0-9a-f]{10}):").group(1)
        wait_for_log(server, "slow model initializing")
        os.killpg(server.proc.pid, sig)
        # loading takes two minutes, a graceful stop may take 100 s: this one is at once
        assert server.proc.wait(30) == 0, server.log()
    finally:
        server.kill()
    assert regions_of_run(run) == [], server.log()
