"""Nothing leaks, nothing is lost: SIGKILL a client holding leases, a worker mid-request and
the broker itself; after each, every request has an answer and every lease is reclaimed,
and after the next start no region of the dead run is left in /dev/shm."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferpool.client import Client, InferpoolError, ShmClient
from inferpool.shm.runs import regions_of_run, run_is_alive
from tests.support import ROOT, Server, identity_config, wait_until, write_model

HOLDER = """
import sys
import numpy as np
from inferpool.client import ShmClient

c = ShmClient(sys.argv[1], input_bytes=1 << 20)
req = c.request("fast")
req.input("INPUT0", (4,), np.float32)[:] = 1
held = [c.run(req) for _ in range(3)]  # never released
print("holding", c.session.region.name, flush=True)
sys.stdin.read()
"""


def repo(root: Path) -> Path:
    path = root / "repo"
    write_model(path, "fast", identity_config("fast"))
    delay = 'parameters { key: "execute_delay_ms" value: { string_value: "800" } }'
    write_model(path, "slow", identity_config("slow", extra=delay))
    return path


def status(endpoint: str) -> dict[str, Any]:
    with Client(endpoint, timeout=10) as c:
        return c.call("lease_status")


def busy(endpoint: str, model: str) -> bool:
    """Whether ``model``'s instance is executing (a client of its own: the test's shm
    client is busy in another thread)."""
    with Client(endpoint, timeout=10) as c:
        return any(r["busy"] for r in c.status() if r["model"] == model)


def mapped_by(pids: list[int], name: str) -> bool:
    return any(name in Path(f"/proc/{pid}/maps").read_text() for pid in pids)


class InFlight(threading.Thread):
    """One ``run`` on its own thread, so the test can kill something while it waits."""

    def __init__(self, client: ShmClient, request: Any, timeout: float | None = None) -> None:
        super().__init__(daemon=True)
        self.client, self.request, self.timeout = client, request, timeout
        self.answer: Any = None

    def run(self) -> None:
        try:
            self.answer = self.client.run(self.request, self.timeout)
        except InferpoolError as err:
            self.answer = err


def test_sigkill_of_client_worker_and_broker_loses_nothing(short_tmp) -> None:
    models = repo(short_tmp)
    first = Server(short_tmp, models)
    with first:
        run, ep = first.run_id, first.endpoint
        # 1. a client process holding three leases and its input region is SIGKILLed
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, ep],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert holder.stdout is not None
        word, region = holder.stdout.readline().decode().split()
        assert word == "holding" and status(ep)["total"] == 3
        workers = first.worker_pids()
        assert mapped_by(workers, region)
        holder.kill()
        holder.wait(10)
        wait_until(lambda: status(ep)["total"] == 0, "the dead client's leases are reclaimed")
        wait_until(lambda: not os.path.exists(f"/dev/shm/{region}"), "its region is unlinked")
        wait_until(lambda: not mapped_by(workers, region), "no worker maps its region any more")
        assert status(ep)["registrations"] == 0

        with ShmClient(ep, input_bytes=1 << 20, timeout=3) as c:
            slow = c.request("slow")
            slow.input("INPUT0", (2,), np.float32)[:] = 5
            # 2. a worker SIGKILLed in the middle of a request
            held = c.run(slow)  # a lease on the slow worker's output region
            out_region = held._leases[0][1]
            [pid] = [r["pid"] for r in c.status() if r["model"] == "slow"]
            request = InFlight(c, slow)
            request.start()
            wait_until(lambda: busy(ep, "slow"), "the request executing")  # its 800 ms execute
            os.kill(pid, signal.SIGKILL)
            request.join(10)
            assert isinstance(request.answer, InferpoolError), request.answer
            assert request.answer.code.value == "UNAVAILABLE"
            assert "died with signal SIGKILL" in request.answer.message
            np.testing.assert_array_equal(held["OUTPUT0"], [5, 5])  # still valid: still held
            held.release()
            assert c.flush() == 1 and status(ep)["total"] == 0
            wait_until(
                lambda: not os.path.exists(f"/dev/shm/{out_region}"),
                "the dead worker's output region goes with its last lease",
            )
            wait_until(
                lambda: any(r["state"] == "READY" and r["pid"] != pid for r in c.status()),
                "the worker is respawned",
            )
            with c.run(slow) as result:
                np.testing.assert_array_equal(result["OUTPUT0"], [5, 5])

            # 3. the broker SIGKILLed with a request in flight (the client gives up on it
            # after twice its 800 ms execute) and a lease held
            fast = c.request("fast")
            fast.input("INPUT0", (2,), np.float32)[:] = 5
            held = c.run(fast)
            request = InFlight(c, slow, timeout=1.6)
            request.start()
            wait_until(lambda: busy(ep, "slow"), "the request executing")
            first.proc.send_signal(signal.SIGKILL)
            first.proc.wait(10)
            request.join(10)
            assert isinstance(request.answer, InferpoolError), request.answer
            assert request.answer.code.value == "TIMEOUT"  # answered by the client's timeout
            assert not run_is_alive(run)  # its regions wait for a sweep (any broker's start)
            held.release()
    second = Server(short_tmp, models)
    with second:
        assert regions_of_run(run) == []
    assert second.proc.returncode == 0


def test_silent_client_loses_its_leases_a_live_one_keeps_them(short_tmp) -> None:
    with Server(short_tmp, repo(short_tmp), "--lease-timeout", "1") as server:
        ep = server.endpoint
        with (
            ShmClient(ep, input_bytes=1 << 20, keepalive=False) as quiet,
            ShmClient(ep, input_bytes=1 << 20) as alive,
        ):
            requests = []
            for c in (quiet, alive):
                req = c.request("fast")
                req.input("INPUT0", (3,), np.float32)[:] = 2
                requests.append(req)
            kept = quiet.run(requests[0]), alive.run(requests[1])
            assert status(ep)["total"] == 2
            wait_until(lambda: status(ep)["total"] == 1, "the quiet client's lease is reclaimed")
            # a clock the server keeps: a second silent lease, taken now, is reclaimed after
            # another lease timeout; the live client's, two timeouts old, is held by keep-alives
            with ShmClient(ep, input_bytes=1 << 20, keepalive=False) as later:
                req = later.request("fast")
                req.input("INPUT0", (3,), np.float32)[:] = 2
                later.run(req)
                assert status(ep)["total"] == 2
                wait_until(lambda: status(ep)["total"] == 1, "the later lease is reclaimed")
            assert status(ep)["total"] == 1
            np.testing.assert_array_equal(kept[1]["OUTPUT0"], [2, 2, 2])
            kept[0].release()
            with pytest.raises(InferpoolError, match="silence past the lease timeout") as err:
                quiet.run(requests[0])
            assert err.value.code.value == "NOT_FOUND"
            with quiet.run(requests[0]) as result:  # a stale token costs one error, no more
                np.testing.assert_array_equal(result["OUTPUT0"], [2, 2, 2])
            kept[1].release()
        assert status(ep)["total"] == 0
