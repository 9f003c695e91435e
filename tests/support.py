"""Test support: real servers in their own process groups, model repositories on disk."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import psutil
import pytest

from inferpool.client import Client
from inferpool.entry_point import main
from inferpool.shm.runs import regions_of_run, run_of

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "model_repository"


def our_regions() -> set[str]:
    return {e for e in os.listdir("/dev/shm") if e.startswith("inferpool-")}


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs.  A zombie does not: an orphan (a worker whose broker
    was killed) stays one until the machine's init reaps it, which may take seconds."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in (b"Z", b"X")


def run_id_of(server: Server | int) -> str:
    """A live broker's run id, from the lock object it holds open (``server`` or its pid)."""
    pid = server if isinstance(server, int) else server.proc.pid
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        with contextlib.suppress(OSError):
            name = os.path.basename(os.readlink(f"{fd_dir}/{fd}"))
            run = run_of(name)
            if run and name.endswith("-lock"):
                return run
    raise AssertionError(f"broker pid {pid} holds no run lock")


NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", "--regid=0", "--clear-groups"]


def closed_to_nobody(*paths: str) -> str:
    """The first directory above ``paths`` that user nobody may not enter, with its mode, or
    "" when it may enter them all (asked of a shell run as nobody: needs root)."""
    dirs: list[str] = []
    for path in paths:
        for directory in reversed(Path(path).resolve().parents):
            if str(directory) not in dirs:
                dirs.append(str(directory))
    script = 'for d in "$@"; do cd "$d" 2>/dev/null || { echo "$d"; exit 0; }; done'
    done = subprocess.run(
        [*AS_NOBODY, "/bin/sh", "-c", script, "sh", *dirs],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    closed = done.stdout.strip()
    return f"{closed} (mode {os.stat(closed).st_mode & 0o777:o})" if closed else ""


@functools.cache
def nobody_cannot_run() -> str:
    """Why a client process of user nobody cannot run this interpreter and the installed
    package here ("" when it can)."""
    if os.geteuid() != 0:
        return "running a client as user nobody needs root (setpriv)"
    probe = subprocess.run(
        [*AS_NOBODY, sys.executable, "-c", "import inferpool.client"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    if probe.returncode == 0:
        return ""
    import inferpool

    blocked = closed_to_nobody(inferpool.__path__[0]) or closed_to_nobody(sys.executable)
    if blocked:
        return (
            f"user nobody cannot reach this Python or the package: {blocked} is closed to "
            "other users (as home directories are); a checkout under a directory others may "
            "enter (/opt, /srv) runs these tests"
        )
    return f"user nobody cannot import the package: {probe.stderr.strip().splitlines()[-1:]}"


def as_nobody(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a client process of user nobody (group root: it may reach a socket of
    ``--ipc-access group``); the test is skipped, saying why, where nobody cannot run the
    interpreter and the package (a checkout in a directory closed to other users)."""
    reason = nobody_cannot_run()
    if reason:
        pytest.skip(reason)
    return subprocess.run(
        [*AS_NOBODY, sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )


def wait_until(predicate: Callable[[], T], what: str = "", timeout: float = 20.0) -> T:
    """Ask ``predicate`` (a state the server reports: ``status``, ``models``, a file) until it
    answers truthy, and return that answer; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout:g}s: {what or predicate}")
        time.sleep(0.02)


def threads_beside(call: Callable[[], object]) -> int:
    """Run ``call`` on a thread of its own and say how many threads, besides it and those
    there before, the process had when ``call`` returned (a team OpenMP started for it)."""
    during: list[int] = []

    def run() -> None:
        call()
        during.append(len(os.listdir("/proc/self/task")))

    before = len(os.listdir("/proc/self/task"))
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return during[0] - before - 1


def run_cli(*argv: str) -> tuple[int, str, str]:
    """``inferpool argv`` in this process: its exit status, stdout and stderr.  An exception
    escaping main() (a traceback, from a shell) fails the test that ran it."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(list(argv))
        except SystemExit as exc:  # argparse's own errors
            status = int(exc.code or 0)
    return status, out.getvalue(), err.getvalue()


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_model(
    repo: Path,
    name: str,
    config: str,
    versions: tuple[int, ...] = (1,),
    files: dict[str, str] | None = None,
) -> Path:
    """A model directory in Triton's layout: config.pbtxt, version dirs, extra files."""
    d = repo / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.pbtxt").write_text(textwrap.dedent(config))
    for v in versions:
        (d / str(v)).mkdir(exist_ok=True)
    for rel, text in (files or {}).items():
        path = d / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return d


def copy_models(tmp: Path, source: Path, *names: str) -> Path:
    """``tmp/repo`` holding the named model directories of ``source`` (every one without
    names): a repository to serve without writing into the checkout."""
    repo = tmp / "repo"
    for name in names or [p.name for p in source.iterdir() if p.is_dir()]:
        shutil.copytree(source / name, repo / name)
    return repo


def identity_config(
    name: str,
    datatype: str = "TYPE_FP32",
    dims: str = "[ -1 ]",
    max_batch: int = 0,
    extra: str = "",
) -> str:
    return f"""
        name: "{name}"
        backend: "identity"
        max_batch_size: {max_batch}
        input [ {{ name: "INPUT0" data_type: {datatype} dims: {dims} }} ]
        output [ {{ name: "OUTPUT0" data_type: {datatype} dims: {dims} }} ]
        {extra}
    """


def kill_tree(pid: int) -> None:
    """SIGKILL process ``pid``'s group and every process under it."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


class Server:
    """``inferpool serve`` as a child process in its own process group."""

    # Every run a test started, in order: shm_clean blames only these (other sessions share
    # /dev/shm, and the regions of their killed brokers are not this test's leak).
    runs: ClassVar[list[str]] = []

    def __init__(
        self,
        tmp: Path,
        repo: Path | str = EXAMPLES,
        *args: str,
        tcp: bool = False,
        kserve: bool = False,
        env: dict[str, str] | None = None,
        python: str = sys.executable,
        cwd: Path | None = None,
    ) -> None:
        self.ipc = f"ipc://{tmp}/broker.sock"
        self.endpoints = [self.ipc]
        if tcp:
            self.tcp = f"tcp://127.0.0.1:{free_tcp_port()}"
            self.endpoints.append(self.tcp)
        # the KServe frontends on free ports when asked (never Triton's 8000 / 8001)
        self.http_port = free_tcp_port() if kserve else 0
        self.grpc_port = free_tcp_port() if kserve else 0
        self.log_path = tmp / "server.log"
        self.run_id = ""  # known once the server has started
        cmd = [
            python,
            "-m",
            "inferpool",
            "serve",
            "--model-repository",
            str(repo),
            "--arena-size",
            "32M",
            "--output-arena-size",
            "16M",
            "--prefault",
            "0",
            "--graceful-timeout",
            "10",
            "--http-port",
            str(self.http_port),
            "--grpc-port",
            str(self.grpc_port),
        ]
        for ep in self.endpoints:
            cmd += ["--listen", ep]
        if not any(a.split("=")[0] == "--metrics-port" for a in args):  # on by default, one port
            cmd += ["--allow-metrics", "false"]
        cmd += list(args)
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            cmd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
            cwd=cwd or tmp,  # not the checkout: only the installed namespace may import
        )

    @property
    def http_url(self) -> str:
        """host:port of the KServe HTTP frontend, as tritonclient takes it."""
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def endpoint(self) -> str:
        return self.ipc

    def client(self, timeout: float = 30.0) -> Client:
        return Client(self.ipc, timeout=timeout)

    def wait_started(self, timeout: float = 60.0) -> None:
        """Until the server has settled every initial model (ready or not)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            log = self.log_bytes()
            if b"inferpool is ready" in log or b"inferpool started" in log:
                self.run_id = run_id_of(self)
                Server.runs.append(self.run_id)
                return
            time.sleep(0.02)
        raise TimeoutError(f"server did not start within {timeout}s:\n{self.log()}")

    def regions(self) -> list[str]:
        """The run's shared-memory regions in /dev/shm."""
        return regions_of_run(self.run_id)

    def log_bytes(self) -> bytes:
        return self.log_path.read_bytes()

    def log(self) -> str:
        return self.log_bytes().decode(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise
        self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the broker, its zygotes and every worker (each worker has a process group
        of its own: the server's group does not hold them)."""
        kill_tree(self.proc.pid)
        self.proc.wait(10)

    def worker_pids(self, model: str | None = None) -> list[int]:
        with self.client() as c:
            return [r["pid"] for r in c.status() if r["pid"] and model in (None, r["model"])]

    def __enter__(self) -> Server:
        try:
            self.wait_started()
        except BaseException:  # a server that did not start is not left running
            self.kill()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.stop()
        finally:
            if self.proc.poll() is None:
                self.kill()


def assert_run_gone(run_id: str) -> None:
    assert regions_of_run(run_id) == [], f"run {run_id} left regions in /dev/shm"


def serving(
    repo_of: Callable[[Path], Path],
    *args: str,
    python: str = sys.executable,
    tcp: bool = False,
    kserve: bool = False,
) -> Any:
    """A module fixture body: a server over the repository ``repo_of(tmp)`` builds; on the
    way out it must stop with 0 and leave nothing of its run in /dev/shm."""
    tmp = Path(tempfile.mkdtemp(prefix="ipt-", dir="/tmp"))
    try:
        with Server(tmp, repo_of(tmp), *args, python=python, tcp=tcp, kserve=kserve) as server:
            run_id = run_id_of(server)
            yield server
            assert server.stop() == 0, server.log()
        assert_run_gone(run_id)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def serving_examples(*args: str, tcp: bool = False) -> Iterator[Server]:
    """A module fixture body: the example repository served (as ``serving``)."""
    yield from serving(lambda tmp: EXAMPLES, *args, tcp=tcp)


def shm_input(region: str, nbytes: int, offset: int = 0, **kw: Any) -> dict[str, Any]:
    """An FP32 input named INPUT0 whose bytes are in a registered region."""
    return {
        "name": "INPUT0",
        "datatype": "FP32",
        "shape": [nbytes // 4],
        "parameters": {
            "shared_memory_region": region,
            "shared_memory_offset": offset,
            "shared_memory_byte_size": nbytes,
            **kw,
        },
    }
