"""Reloads under load: clients send back to back while SIGHUP reloads a changed model again
and again.  No request fails, and after the last reload the run's regions in /dev/shm are
what one load makes (the replaced workers' output regions went with them).

Two reloads by default; ``INFERPOOL_LONG_TESTS=1`` runs eleven.
"""

from __future__ import annotations

import signal
import threading
from collections import Counter
from functools import partial
from pathlib import Path

import numpy as np

from inferpool.client import Client, InferpoolError
from tests.reliability.support import LONG, record
from tests.support import Server, identity_config, wait_until, write_model

RELOADS = 11 if LONG else 2
CLIENTS = 4


def changing(repo: Path, n: int) -> None:
    """Model 'changing', its configuration changed by ``n`` (a reload replaces it)."""
    extra = f'parameters {{ key: "generation" value: {{ string_value: "{n}" }} }}'
    extra += "\ninstance_group [ { count: 2 kind: KIND_CPU } ]"
    write_model(repo, "changing", identity_config("changing", extra=extra))


def test_reloads_under_load_fail_nothing_and_leave_no_region(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "steady", identity_config("steady"))
    changing(repo, 0)
    outcomes: Counter[str] = Counter()
    stop = threading.Event()

    def load(endpoint: str, model: str) -> None:
        x = np.arange(256, dtype=np.float32)
        with Client(endpoint, timeout=30) as c:
            while not stop.is_set():
                try:
                    out = c.infer(model, {"INPUT0": x})
                    outcomes["ok" if np.array_equal(out["OUTPUT0"], x) else "wrong"] += 1
                except InferpoolError as err:
                    outcomes[err.code.value] += 1

    with Server(tmp_path, repo) as server, Client(server.endpoint, timeout=30) as c:

        def pids() -> set[int]:
            return {r["pid"] for r in c.status() if r["model"] == "changing" and r["pid"]}

        def replaced(old: set[int]) -> bool:
            """Two workers of 'changing' serve, neither of them one of ``old``."""
            now = pids()
            return len(now) == 2 and not now & old

        regions = sorted(server.regions())
        most = len(regions)
        threads = [
            threading.Thread(target=load, args=(server.endpoint, m))
            for m in ("steady", "changing") * (CLIENTS // 2)
        ]
        for t in threads:
            t.start()
        try:
            for n in range(1, RELOADS + 1):
                old = pids()
                changing(repo, n)
                server.proc.send_signal(signal.SIGHUP)
                wait_until(partial(replaced, old), "replaced", 60)
                most = max(most, len(server.regions()))
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        wait_until(lambda: len(server.regions()) == len(regions), "the regions one load makes")
        after = server.regions()
        record(
            "reload",
            {
                "reloads": RELOADS,
                "clients": CLIENTS,
                "outcomes": dict(outcomes),
                "regions before": len(regions),
                "regions after": len(after),
                "most regions seen": most,
            },
        )
    assert set(outcomes) == {"ok"}, outcomes
    assert len(after) == len(regions), (regions, after)
