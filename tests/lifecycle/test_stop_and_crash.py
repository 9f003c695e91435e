"""Stopping, crashing and restarting with real signals; nothing of a run outlives it."""

from __future__ import annotations

import os
import signal
import time
from functools import partial
from pathlib import Path

import numpy as np
import psutil
import pytest

from inferpool.client import Client, InferpoolError
from inferpool.shm.runs import regions_of_run, run_is_alive
from inferpool.wire.paths import default_run_dir
from tests.lifecycle.helpers import NAP, instance, send_act, write_act_model
from tests.support import (
    EXAMPLES,
    Server,
    alive,
    assert_run_gone,
    identity_config,
    our_regions,
    run_id_of,
    wait_until,
    write_model,
)


def slow_repo(root, delay_ms: int = 400):
    repo = root / "repo"
    write_model(
        repo,
        "slow",
        identity_config(
            "slow",
            extra=f'parameters {{ key: "execute_delay_ms" value: {{ string_value: "{delay_ms}" }} }}',
        ),
    )
    return repo


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_runs_finalizers_and_unlinks_everything(short_tmp, sig) -> None:
    server = Server(short_tmp, EXAMPLES)
    with server:
        mine = set(regions_of_run(run_id_of(server)))  # not other sessions' runs
        assert mine, "the run should own an arena and output regions"
        for name in mine:
            assert os.stat(f"/dev/shm/{name}").st_mode & 0o777 == 0o600
        pids = server.worker_pids()
        assert server.stop(sig) == 0
    log = server.log()
    assert log.count("TRITONBACKEND_Finalize") == 3  # one per identity worker: 1 + 2 batched
    assert log.count("Cleaning up...") == 1  # add_sub's model.py (python backend) finalize()
    assert not (our_regions() & mine) and server.regions() == []
    assert not os.path.exists(server.ipc[len("ipc://") :])
    wait_until(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in pids))


@pytest.mark.parametrize("whom", ["broker", "group"])
def test_graceful_shutdown_finishes_in_flight_requests(short_tmp, whom) -> None:
    """SIGTERM to the broker, or to the server's whole process group (``kill %1``, a
    script's killpg): the workers are not in that group, so the broker drains them."""
    with Server(short_tmp, slow_repo(short_tmp)) as server, server.client() as c:
        rid = c._send(
            {
                "type": "infer",
                "model_name": "slow",
                "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2]}],
            },
            [np.ones(2, np.float32).data],
        )
        wait_until(lambda: c.status()[0]["busy"], "the request executing")
        if whom == "group":
            os.killpg(server.proc.pid, signal.SIGTERM)
        else:
            server.proc.send_signal(signal.SIGTERM)
        header, _frames = c._recv(rid, 10)
        assert "error" not in header, header
        assert server.stop() == 0
    assert "restarting" not in server.log()


def test_killed_broker_takes_its_workers_and_the_next_start_sweeps(short_tmp) -> None:
    first = Server(short_tmp, EXAMPLES, kserve=True)
    with first:
        pids = first.worker_pids()
        pids += [  # the KServe frontends' process: its lifeline pipe ends with the broker
            p.pid
            for p in psutil.Process(first.proc.pid).children()
            if "inferpool.broker.kserve.frontends" in " ".join(p.cmdline())
        ]
        assert len(pids) > len(first.worker_pids())
        run = first.run_id
        kserve_socket = Path(default_run_dir(), f"kserve-{first.proc.pid}.sock")
        assert kserve_socket.exists()
        first.proc.send_signal(signal.SIGKILL)  # the broker alone, not its process group
        first.proc.wait(10)
        # parent-death signal: workers go with the broker
        wait_until(lambda: not any(alive(pid) for pid in pids))
        # its regions stay until a broker starts (another session's may sweep them first)
        assert not run_is_alive(run)
        second = Server(short_tmp, EXAMPLES, kserve=True)
        with second:
            assert regions_of_run(run) == []
            assert not kserve_socket.exists()  # a killed broker's socket is swept too
        assert second.proc.returncode == 0


def test_worker_crash_answers_in_flight_and_respawns(short_tmp) -> None:
    with Server(short_tmp, slow_repo(short_tmp)) as server, server.client() as c:
        [worker] = server.worker_pids()
        rid = c._send(
            {
                "type": "infer",
                "model_name": "slow",
                "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2]}],
            },
            [np.ones(2, np.float32).data],
        )
        wait_until(lambda: c.status()[0]["busy"], "the request executing")
        os.kill(worker, signal.SIGKILL)
        header, _ = c._recv(rid, 10)
        assert header["error"]["code"] == "UNAVAILABLE"
        assert "instance 'slow_0'" in header["error"]["message"]
        assert "died with signal SIGKILL" in header["error"]["message"]
        wait_until(lambda: c.status()[0]["state"] == "READY" and c.status()[0]["pid"] != worker)
        [status] = c.status()
        assert status["restarts"] == 1 and "SIGKILL" in status["last_error"]
        assert c.is_model_ready("slow")
        out = c.infer("slow", {"INPUT0": np.arange(2, dtype=np.float32)})
        np.testing.assert_array_equal(out["OUTPUT0"], [0, 1])
        assert server.stop() == 0


def _replaced(c: Client, pid: int) -> bool:
    """The only worker is READY again, in another process than ``pid``."""
    row = c.status()[0]
    return bool(row["state"] == "READY" and row["pid"] != pid)


def test_requests_during_a_crash_loop_all_get_answers(short_tmp) -> None:
    """Kill the worker repeatedly: every request gets a result or an error, none hangs."""
    with Server(short_tmp, slow_repo(short_tmp, 50)) as server, server.client(timeout=15) as c:
        answered = 0
        for _ in range(3):
            pid = server.worker_pids()[0]
            rid = c._send(
                {
                    "type": "infer",
                    "model_name": "slow",
                    "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1]}],
                },
                [np.ones(1, np.float32).data],
            )
            os.kill(pid, signal.SIGKILL)
            _header, _ = c._recv(rid, 15)
            answered += 1
            wait_until(partial(_replaced, c, pid))
        assert answered == 3
        with pytest.raises(InferpoolError, match="unknown model"):
            c.infer("nope", {"INPUT0": np.ones(1, np.float32)})
        assert c.statistics()["inflight"] == 0


def test_shutdown_answers_requests_that_outlast_the_drain_timeout(short_tmp) -> None:
    write_act_model(short_tmp / "repo", "nap")
    with (
        Server(
            short_tmp, short_tmp / "repo", "--drain-timeout", "1", "--graceful-timeout", "1"
        ) as server,
        server.client() as c,
    ):
        run_id = run_id_of(server)
        rid = send_act(c, "nap", NAP)  # sleeps 60 s in execute
        wait_until(lambda: instance(c, "nap_0")["busy"])
        stopping = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        header, _ = c._recv(rid, 20)
        assert header["error"]["code"] == "UNAVAILABLE"
        assert header["error"]["message"] == (
            "the server drained (received SIGTERM) before the request finished"
        )
        assert server.stop() == 0  # the stuck worker was killed after its own grace
        assert time.monotonic() - stopping < 10
    assert_run_gone(run_id)
