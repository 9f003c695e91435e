"""Chaos under load: eight clients send requests for a bounded time while workers are
SIGKILLed and SIGSTOPped, a client holding leases is killed, and the broker is killed and
restarted.  Every request gets an outcome, none is left unanswered while a broker lives,
nothing is held or left in /dev/shm afterwards, and each fault is noticed in bounded time.

Between two faults every client has an outcome (a hundred, in long runs): the load goes on
through every fault.  Short by default (one round of faults); ``INFERPOOL_LONG_TESTS=1`` runs
six rounds (about a minute).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from inferpool.client import Client, InferpoolError
from inferpool.shm.runs import regions_of_run
from tests.reliability.support import LONG, record, reliability_repo, resources, wait_idle
from tests.support import ROOT, Server, alive

CLIENTS = 8
ROUNDS = 6 if LONG else 1
WINDOW = 100 if LONG else 1  # outcomes every client has between two faults
CLIENT_TIMEOUT = 3.0  # a request unanswered this long while a broker lives fails the test
SERVE = ("--heartbeat-ms", "200", "--max-restarts", "1000", "--lease-timeout", "30")
LEASER = """
import sys, time
import numpy as np
from inferpool.client import ShmClient
c = ShmClient(sys.argv[1], input_bytes=1 << 20)
req = c.request("identity", outputs=["OUTPUT0"])
req.input("INPUT0", (1024,), np.float32)[:] = 1
held = [c.run(req) for _ in range(4)]  # four output handles, never released
print("holding", flush=True)
time.sleep(600)
"""


@dataclass
class Load:
    """Eight clients sending back to back; one outcome per request."""

    endpoint: str
    outcomes: Counter[str] = field(default_factory=Counter)
    per_client: list[int] = field(default_factory=lambda: [0] * CLIENTS)  # outcomes of each
    timeouts: list[tuple[float, float]] = field(default_factory=list)  # (sent, gave up)
    in_flight: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for i in range(CLIENTS):
            thread = threading.Thread(target=self._client, args=(i,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _client(self, i: int) -> None:
        model = ("identity", "batched")[i % 2]
        data = np.arange(1 + i, dtype=np.float32)
        inputs = {"INPUT0": data if model == "identity" else data[None, :]}
        client = Client(self.endpoint, timeout=CLIENT_TIMEOUT)
        try:
            while not self._stop.is_set():
                sent = time.monotonic()
                with self._lock:
                    self.in_flight += 1
                outcome = self._one(client, model, inputs, sent)
                with self._lock:
                    self.in_flight -= 1
                    self.outcomes[outcome] += 1
                    self.per_client[i] += 1
        finally:
            client.close()

    def _one(self, client: Client, model: str, inputs: dict[str, Any], sent: float) -> str:
        try:
            out = client.infer(model, inputs)
        except InferpoolError as err:
            if self.endpoint in err.message:  # the client's own: no answer came
                self.timeouts.append((sent, time.monotonic()))
                return f"client {err.code.value}"
            return err.code.value
        assert np.array_equal(out["OUTPUT0"], inputs["INPUT0"]), "a wrong answer"
        return "ok"

    def window(self) -> None:
        """Until every client has had WINDOW more outcomes: load between two faults."""
        with self._lock:
            mark = [n + WINDOW for n in self.per_client]
        until(lambda: all(n >= m for n, m in zip(self.per_client, mark, strict=True)))

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(CLIENT_TIMEOUT * 3)
        assert not any(t.is_alive() for t in self._threads), "a client never got an outcome"


def until(predicate: Callable[[], Any], timeout: float = 30.0) -> float:
    """Seconds until ``predicate()`` holds (polled every 5 ms); AssertionError past timeout."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout, f"not within {timeout}s: {predicate}"
        time.sleep(0.005)
    return time.monotonic() - start


class Chaos:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.repo = reliability_repo(tmp)
        self.server = Server(tmp, self.repo, *SERVE)
        self.server.wait_started()
        self.runs = [self.server.run_id]
        self.detect: dict[str, list[float]] = {}
        self.broker_down: list[tuple[float, float]] = []  # (killed, serving again)

    def client(self) -> Client:
        return Client(self.server.endpoint, timeout=10)

    def noted(self, fault: str, seconds: float) -> None:
        self.detect.setdefault(fault, []).append(seconds)

    def kill_worker(self, sig: int, fault: str) -> None:
        with self.client() as c:
            row = random.choice([r for r in c.status() if r["state"] == "READY"])
            os.kill(row["pid"], sig)
            self.noted(
                fault,
                until(lambda: _row(c, row["slot"])["restarts"] > row["restarts"]),
            )
            until(lambda: _row(c, row["slot"])["state"] == "READY")

    def kill_leaser(self) -> None:
        leaser = subprocess.Popen(
            [sys.executable, "-c", LEASER, self.server.endpoint],
            stdout=subprocess.PIPE,
            cwd=ROOT.parent,
        )
        assert leaser.stdout is not None and leaser.stdout.readline() == b"holding\n"
        with self.client() as c:
            assert resources(c)["leases"] >= 4
            leaser.kill()
            leaser.wait()
            self.noted(
                "client holding leases SIGKILLed",
                until(lambda: resources(c)["leases"] == 0 and resources(c)["registrations"] == 0),
            )

    def kill_broker(self) -> None:
        old = self.server
        with self.client() as c:
            pids = [r["pid"] for r in c.status() if r["pid"]]
        pids += [int(p) for p in _children(old.proc.pid)]  # the zygote
        killed = time.monotonic()
        os.kill(old.proc.pid, signal.SIGKILL)
        old.stop()
        self.noted("broker SIGKILLed: its workers gone", until(lambda: not any(map(alive, pids))))
        self.server = Server(self.tmp, self.repo, *SERVE)
        self.server.wait_started()
        self.runs.append(self.server.run_id)
        self.broker_down.append((killed, time.monotonic()))
        assert regions_of_run(self.runs[-2]) == [], "the dead run's regions were not swept"


def _row(client: Client, slot: int) -> dict[str, Any]:
    return next(r for r in client.status() if r["slot"] == slot)


def _children(pid: int) -> list[str]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return f.read().split()


def test_chaos_under_load(short_tmp: Path) -> None:
    chaos = Chaos(short_tmp)
    load = Load(chaos.server.endpoint)
    started = time.monotonic()
    try:
        load.start()
        for _ in range(ROUNDS):
            load.window()
            chaos.kill_worker(signal.SIGKILL, "worker SIGKILLed")
            load.window()
            chaos.kill_worker(signal.SIGSTOP, "worker SIGSTOPped")
            chaos.kill_leaser()
            load.window()
            chaos.kill_broker()
            load.window()  # the clients whose requests died with the broker, after their timeout
        load.stop()
        with chaos.client() as c:
            wait_idle(c)  # no slot, lease, registration or request left behind
            assert all(r["state"] == "READY" for r in c.status())
        assert chaos.server.stop() == 0, chaos.server.log()[-3000:]
    finally:
        load._stop.set()
        if chaos.server.proc.poll() is None:
            chaos.server.kill()
    left = [name for run in chaos.runs for name in regions_of_run(run)]
    # a client that gave up while a broker lived and was not being replaced: unanswered
    unanswered = [
        (sent, gave_up)
        for sent, gave_up in load.timeouts
        if not any(sent <= up and gave_up >= killed for killed, up in chaos.broker_down)
    ]
    outcomes = load.outcomes
    figures = {
        "seconds": round(time.monotonic() - started, 1),
        "clients": CLIENTS,
        "rounds": ROUNDS,
        "sent": sum(outcomes.values()),
        "answered": sum(n for k, n in outcomes.items() if not k.startswith("client")),
        "outcomes": dict(outcomes),
        "lost with a killed broker": len(load.timeouts) - len(unanswered),
        "unanswered": len(unanswered),
        "regions left": len(left),
        "worst detection (s)": {k: round(max(v), 3) for k, v in chaos.detect.items()},
        "broker restart (s)": round(max(up - k for k, up in chaos.broker_down), 2),
    }
    record("chaos", figures)
    assert not unanswered, figures
    assert not left, left
    assert outcomes["ok"] > 0 and set(outcomes) <= {"ok", "UNAVAILABLE", "client TIMEOUT"}, figures
