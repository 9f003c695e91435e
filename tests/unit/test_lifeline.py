"""A worker armed with set_parent_death_signal dies with its parent (real processes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import alive, wait_until

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import signal, sys, time
from inferpool.workers.lifeline import set_parent_death_signal
ok = set_parent_death_signal(signal.SIGTERM, parent_pid=int(sys.argv[1]))
print("armed" if ok else "orphan", flush=True)
time.sleep(60)
"""

# The middle process starts the child, reports its pid once armed, and exits.
PARENT = """
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(os.getpid())],
                         stdout=subprocess.PIPE, text=True)
print(child.pid, child.stdout.readline().strip(), flush=True)
os._exit(0)
"""


def test_child_dies_when_its_parent_does() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PARENT, CHILD],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    pid, status = int(out[0]), out[1]
    assert status == "armed"
    try:
        wait_until(lambda: not alive(pid), "the orphaned child gone", timeout=10)
    finally:
        if alive(pid):
            os.kill(pid, 9)


def test_a_parent_that_is_not_the_expected_one_reports_false() -> None:
    code = (
        "import os; from inferpool.workers.lifeline import set_parent_death_signal as s; "
        "print(s(parent_pid=os.getppid() + 1), s(parent_pid=os.getppid()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "True"]
