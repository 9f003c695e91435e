"""The systemd unit: its settings, and its ExecStart/ExecReload/KillMode run the way systemd
would run them, with a datagram socket standing in for systemd's NOTIFY_SOCKET."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from inferpool.client import Client
from tests.support import EXAMPLES, ROOT, Server, assert_run_gone, kill_tree, run_id_of

UNIT = ROOT / "scripts" / "systemd" / "inferpool.service"
ENV_FILE = ROOT / "scripts" / "systemd" / "inferpool.env"
INSTALL = ROOT / "scripts" / "systemd" / "install.sh"
BINARY = "/opt/inferpool/venv/bin/inferpool"


def service_section() -> dict[str, list[str]]:
    """[Service] keys -> every value given (Environment= repeats)."""
    out: dict[str, list[str]] = {}
    section = ""
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Service":
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def environment(service: dict[str, list[str]], **overrides: str) -> dict[str, str]:
    """Environment= lines, then the env file (as EnvironmentFile= reads it), then overrides."""
    env = dict(v.split("=", 1) for v in service["Environment"])
    for line in ENV_FILE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    return {**env, **overrides}


def expand(command: str, env: dict[str, str]) -> list[str]:
    """systemd's rules: ``${X}`` stays one argument, a bare ``$X`` word splits on spaces."""
    argv: list[str] = []
    for word in shlex.split(command):
        bare = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if bare:
            argv.extend(env.get(bare[1], "").split())
        else:
            argv.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env[m[1]], word))
    return argv


def test_the_unit_is_a_notify_service_that_the_broker_stops_itself() -> None:
    svc = service_section()
    assert svc["Type"] == ["notify"] and svc["NotifyAccess"] == ["main"]
    assert svc["KillMode"] == ["mixed"] and svc["KillSignal"] == ["SIGTERM"]
    assert svc["Restart"] == ["on-failure"]
    assert svc["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    # in-flight requests get --graceful-timeout, then the workers' finalizers as long again
    stop = int(svc["TimeoutStopSec"][0])
    assert stop >= 2 * int(environment(svc)["INFERPOOL_GRACEFUL_TIMEOUT"]) + 10
    argv = expand(svc["ExecStart"][0], environment(svc))
    assert argv[:2] == [BINARY, "serve"]
    assert "--graceful-timeout" in argv and "--metrics-port" in argv
    assert argv[argv.index("--ipc-access") + 1] == "group"  # group inferpool may connect
    assert int(svc["WatchdogSec"][0]) >= 10  # the loop pings every 50 ms; a stuck one is not


def test_the_broker_loop_feeds_the_watchdog_until_it_is_stuck(short_tmp, shm_clean) -> None:
    """WatchdogSec: WATCHDOG=1 at half the interval from the loop, none while it is stopped."""
    notify_path = str(short_tmp / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(notify_path)
        notify.settimeout(30)
        env = {"NOTIFY_SOCKET": notify_path, "WATCHDOG_USEC": "200000"}  # a ping per 0.1 s
        with Server(short_tmp, EXAMPLES, env=env) as server:
            said = [notify.recv(4096) for _ in range(3)]
            assert said.count(b"WATCHDOG=1") >= 2  # before READY=1 too: loading is the loop's
            os.kill(server.proc.pid, signal.SIGSTOP)  # a stuck broker
            try:
                notify.settimeout(0)
                with contextlib.suppress(BlockingIOError):
                    while notify.recv(4096):  # what it sent before it stopped
                        pass
                notify.settimeout(0.5)
                with pytest.raises(TimeoutError):  # silence: systemd would restart it
                    notify.recv(4096)
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
            notify.settimeout(30)
            assert b"WATCHDOG=1" in [notify.recv(4096) for _ in range(3)]


def test_exec_start_reload_and_stop_as_systemd_runs_them(short_tmp, shm_clean) -> None:
    svc = service_section()
    listen = f"ipc://{short_tmp}/broker.sock"
    env = environment(
        svc,
        INFERPOOL_MODEL_REPOSITORY=str(EXAMPLES),
        INFERPOOL_LISTEN=listen,
        INFERPOOL_GRACEFUL_TIMEOUT="10",
        INFERPOOL_ARGS="--arena-size 32M --output-arena-size 16M --no-prefault "
        "--http-port 0 --grpc-port 0 --allow-metrics false",
    )
    argv = expand(svc["ExecStart"][0], env)
    assert argv[0] == BINARY
    notify_path = str(short_tmp / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(notify_path)
        notify.settimeout(60)
        log = open(short_tmp / "server.log", "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "inferpool", *argv[1:]],
            env={**os.environ, "NOTIFY_SOCKET": notify_path, "PYTHONUNBUFFERED": "1"},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=ROOT,
        )
        try:
            assert notify.recv(4096) == b"READY=1\nSTATUS=serving"
            with Client(listen, timeout=10) as c:
                assert c.is_ready()  # READY=1 comes only when every model is loaded
            run_id = run_id_of(proc.pid)
            Server.runs.append(run_id)  # for shm_clean: this test started the run
            proc.send_signal(signal.SIGHUP)  # ExecReload: kill -HUP $MAINPID
            reloading = notify.recv(4096).decode()
            assert reloading.startswith("RELOADING=1\nMONOTONIC_USEC=")
            assert notify.recv(4096) == b"READY=1\nSTATUS=serving"
            proc.send_signal(signal.SIGTERM)  # KillMode=mixed: the main process only
            assert notify.recv(4096) == b"STOPPING=1"
            assert proc.wait(30) == 0  # Restart=on-failure: a clean stop is not restarted
            assert notify.recv(4096) == b"STATUS=stopped"
        finally:
            if proc.poll() is None:
                kill_tree(proc.pid)
                proc.wait(10)
            log.close()
    assert_run_gone(run_id)


def test_install_stages_the_unit_with_its_prefix(tmp_path: Path) -> None:
    dest = tmp_path / "root"
    env = {**os.environ, "DESTDIR": str(dest)}
    cmd = ["sh", str(INSTALL), "--prefix", "/srv/inferpool", "--no-start"]
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=60)
    unit = (dest / "etc/systemd/system/inferpool.service").read_text()
    assert "ExecStart=/srv/inferpool/venv/bin/inferpool serve " in unit
    assert "/opt/inferpool" not in unit
    env_file = dest / "etc/inferpool/inferpool.env"
    assert env_file.read_text() == ENV_FILE.read_text()
    env_file.write_text("INFERPOOL_ARGS=--metrics-port 9000\n")  # the operator's edit
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=60)
    assert env_file.read_text() == "INFERPOOL_ARGS=--metrics-port 9000\n"  # kept
    bad = subprocess.run(["sh", str(INSTALL), "--frobnicate"], env=env, capture_output=True)
    assert bad.returncode == 2 and b"unknown argument '--frobnicate'" in bad.stderr
