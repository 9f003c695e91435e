"""/dev/shm is spent as it is used: a served run holds the pages its requests reached, not
the sizes its regions may grow to, and a /dev/shm too small to start in is one clear line."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np

from inferpool.shm.region import MiB
from inferpool.shm.runs import SHM_DIR, regions_of_run
from tests.support import EXAMPLES, Server


def resident(run_id: str) -> int:
    """Bytes tmpfs has allocated to the regions of a run."""
    total = 0
    for name in regions_of_run(run_id):
        try:
            total += os.stat(os.path.join(SHM_DIR, name)).st_blocks * 512
        except FileNotFoundError:
            continue
    return total


def test_a_served_run_holds_what_its_requests_reach(short_tmp: Path, shm_clean: None) -> None:
    args = ("--arena-size", "256M", "--output-arena-size", "256M", "--prefault", "4M")
    with Server(short_tmp, EXAMPLES, *args) as server:
        with server.client() as c:
            workers = len(c.status())
            c.infer("identity", {"INPUT0": np.ones(16, np.float32)})
            at_start = resident(server.run_id)
            assert 0 < at_start <= (1 + workers) * 4 * MiB, at_start
            big = np.arange(4 * MiB, dtype=np.float32)  # 16 MiB in, 16 MiB out
            assert np.array_equal(c.infer("identity", {"INPUT0": big})["OUTPUT0"], big)
            grown = resident(server.run_id)
            # the arena and the worker's output region each grew to hold 16 MiB
            assert 32 * MiB < grown <= at_start + 2 * (16 + 2) * MiB, (at_start, grown)
            for _ in range(3):  # the same slots again: nothing more is populated
                c.infer("identity", {"INPUT0": big})
            assert resident(server.run_id) == grown
        assert server.stop() == 0


def test_a_dev_shm_too_small_to_start_is_one_clear_line(short_tmp: Path) -> None:
    args = ("--arena-size", "100000G", "--prefault", "100000G")
    server = Server(short_tmp, EXAMPLES, *args)
    try:
        assert server.proc.wait(60) == 1
    finally:
        if server.proc.poll() is None:
            server.proc.send_signal(signal.SIGKILL)
        server.stop()
    log = server.log()
    assert "Traceback" not in log, log
    line = next(line for line in log.splitlines() if line.startswith("inferpool: "))
    assert "/dev/shm has" in line and "the input arena pre-faults 102400000 MiB" in line, line
    assert "docker run --shm-size" in line and "emptyDir" in line and "--prefault" in line
