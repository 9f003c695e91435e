"""Workers that crash, hang, freeze or cannot boot, with real processes and real signals.

Every request sent gets an answer (``_recv`` raises TIMEOUT otherwise), crashed instances
come back on the same slot and cores, and the module's server stops with 0 and leaves
nothing in /dev/shm (``serving``).
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests.lifecycle.helpers import (
    EXIT,
    FRAGILE,
    NAP,
    REPORT,
    SEGFAULT,
    SPIN,
    act,
    instance,
    send_act,
    write_act_model,
)
from tests.support import serving, wait_until, write_model

EXECUTE_TIMEOUT = 2.5  # a frozen worker is noticed in two heartbeats: 0.4 s
HEARTBEAT_MS = 200


def repo(tmp: Path) -> Path:
    root = tmp / "repo"
    for name in ("exiter", "segv", "spin", "nap", "frozen"):
        write_act_model(root, name)
    write_act_model(
        root,
        "pair",
        'instance_group [ { name: "fragile" kind: KIND_CPU }, { name: "steady" kind: KIND_CPU } ]',
    )
    write_model(
        root,
        "broken",
        """
        name: "broken"
        backend: "python"
        input [ { name: "ACT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] } ]
        """,
        files={"1/model.py": "import no_such_module_anywhere\n"},
    )
    return root


@pytest.fixture(scope="module")
def server():
    yield from serving(
        repo,
        "--max-restarts",
        "1",
        "--restart-window",
        "60",
        "--execute-timeout",
        str(EXECUTE_TIMEOUT),
        "--heartbeat-ms",
        str(HEARTBEAT_MS),
        "--exit-on-error=false",  # broken cannot boot, by design
    )


def respawned(c, name: str, old_pid: int) -> dict:
    return wait_until(
        lambda: (r := instance(c, name))["state"] == "READY" and r["pid"] != old_pid and r,
        what=f"{name} back up",
    )


def assert_stack_logged_before_respawn(server, name: str, function: str, new_pid: int) -> None:
    """faulthandler's dump of the killed worker names the stuck function, and it reached the
    log before the replacement started."""
    log = server.log()
    frame = re.search(rf'File "[^"]*/model\.py", line \d+ in {function}\n', log)
    assert frame is not None, log[-3000:]
    assert frame.start() < log.index(f"started worker {name} (pid {new_pid},")


@pytest.mark.parametrize(
    ("model", "what", "how"),
    [("exiter", EXIT, "died with exit code 7"), ("segv", SEGFAULT, "died with signal SIGSEGV")],
)
def test_a_backend_that_kills_its_process_is_answered_and_respawned(
    server, model, what, how
) -> None:
    name = f"{model}_0"
    with server.client() as c:
        before = instance(c, name)
        header, _ = c._recv(send_act(c, model, what), 20)
        assert header["error"]["code"] == "UNAVAILABLE"
        assert f"instance '{name}' of model '{model}' version 1 {how}" in header["error"]["message"]
        after = respawned(c, name, before["pid"])
        assert after["restarts"] == 1 and how in after["last_error"]
        assert after["pinning"] == before["pinning"] and after["slot"] == before["slot"]
        assert act(c, model)["pid"] == after["pid"]
        assert not os.path.exists(f"/proc/{before['pid']}")


def test_repeated_crashes_fail_the_instance_while_the_model_keeps_serving(server) -> None:
    with server.client() as a, server.client() as b:
        crashes = 0
        while instance(a, "fragile_0")["state"] != "FAILED":
            assert crashes < 2, "the instance should be FAILED after --max-restarts 1"
            wait_until(lambda: instance(a, "fragile_0")["state"] == "READY", what="fragile back")
            # both instances are idle: one request each
            ids = [(a, send_act(a, "pair", FRAGILE)), (b, send_act(b, "pair", FRAGILE))]
            answers = [c._recv(rid, 20)[0] for c, rid in ids]
            errors = [h["error"]["message"] for h in answers if "error" in h]
            assert len(errors) == 1 and "'fragile_0'" in errors[0], answers
            assert "died with exit code 9" in errors[0]
            crashes += 1
            wait_until(  # respawned after its backoff, or failed for good
                lambda: instance(a, "fragile_0")["state"] in ("READY", "FAILED"),
                what="fragile settled",
            )
        fragile = instance(a, "fragile_0")
        assert crashes == 2 and fragile["pid"] is None
        assert "crashed 2 times within 60s, not restarting" in fragile["last_error"]
        assert a.is_model_ready("pair")
        assert {act(a, "pair", FRAGILE)["instance"] for _ in range(6)} == {"steady_0"}
        assert {r["name"]: r["state"] for r in a.models()}["pair"] == "READY"


def test_hung_executes_are_killed_after_the_execute_timeout(server) -> None:
    """A GIL-holding loop and a sleep: both killed by the execute timeout, not sooner by the
    frozen-worker check (it reads the kernel's process state, which a busy worker passes)."""
    with server.client() as a, server.client() as b:
        pids = {m: instance(a, f"{m}_0")["pid"] for m in ("spin", "nap")}
        start = time.monotonic()
        spin, nap = send_act(a, "spin", SPIN), send_act(b, "nap", NAP)
        for c, rid, model in ((a, spin, "spin"), (b, nap, "nap")):
            header, _ = c._recv(rid, 30)
            message = header["error"]["message"]
            assert header["error"]["code"] == "UNAVAILABLE"
            assert f"instance '{model}_0'" in message
            assert f"was killed: execute ran longer than {EXECUTE_TIMEOUT:g}s" in message
        assert time.monotonic() - start >= EXECUTE_TIMEOUT
        for model, function in (("spin", "hold_the_gil"), ("nap", "nap_for_a_minute")):
            after = respawned(a, f"{model}_0", pids[model])
            assert_stack_logged_before_respawn(server, f"{model}_0", function, after["pid"])
            assert act(a, model, REPORT)["instance"] == f"{model}_0"


def test_a_stopped_worker_is_noticed_and_replaced(server) -> None:
    with server.client() as c:
        pid = instance(c, "frozen_0")["pid"]
        rid = send_act(c, "frozen", NAP)
        wait_until(lambda: instance(c, "frozen_0")["busy"], what="frozen executing")
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        header, _ = c._recv(rid, 20)
        noticed = time.monotonic() - stopped
        message = header["error"]["message"]
        assert "instance 'frozen_0'" in message and "was frozen (stopped)" in message
        # seen stopped on two looks, one --heartbeat-ms apart: well before the execute
        # timeout would have fired
        assert noticed < EXECUTE_TIMEOUT, noticed
        after = respawned(c, "frozen_0", pid)
        assert "was frozen (stopped)" in after["last_error"]
        # continued to handle its SIGABRT: the stack of the call it was stopped in is logged
        assert_stack_logged_before_respawn(server, "frozen_0", "nap_for_a_minute", after["pid"])
        wait_until(lambda: not os.path.exists(f"/proc/{pid}"), what="the stopped worker reaped")
        assert act(c, "frozen")["pid"] == after["pid"]


def test_a_worker_that_cannot_boot_is_not_respawned(server) -> None:
    with server.client() as c:
        row = {r["name"]: r for r in c.models()}["broken"]
        assert row["state"] == "UNAVAILABLE"
        assert "No module named 'no_such_module_anywhere'" in row["reason"]
        first = instance(c, "broken_0")
        # a clock the supervisor keeps: a crashed instance is respawned after its backoff,
        # the one that could not boot is not
        steady = instance(c, "steady_0")
        os.kill(steady["pid"], signal.SIGKILL)
        respawned(c, "steady_0", steady["pid"])
        again = instance(c, "broken_0")
        assert first["state"] == again["state"] == "FAILED"
        assert again["restarts"] == 0 and again["pid"] is None
        assert c.statistics()["inflight"] == 0
