"""A worker keeps the memory its model frees: megabytes of temporaries per request do not
fault their pages in again on every request (workers.heap)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Faults taken by a request-like loop: two 1 MiB temporaries made and freed, 50 times.
LOOP = """
import resource, sys
import numpy as np
from inferpool.workers.heap import keep_freed_memory
print(keep_freed_memory())
x = np.ones((256, 1024), np.float32)
for _ in range(5):
    (x - 0.5) * 2.0
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    (x - 0.5) * 2.0
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(env: dict[str, str]) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", LOOP], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc")
def test_freed_temporaries_are_reused_without_page_faults() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_"))}
    applied, faults = _faults(env)
    assert applied == "True"
    assert faults < 50  # 512 a request when glibc hands the heap's top back each time


def test_an_operators_malloc_setting_is_left_alone() -> None:
    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": "131072"}
    applied, faults = _faults(env)
    assert applied == "False"
    assert faults > 50 * 256  # glibc's own behaviour: the pages come back every request
