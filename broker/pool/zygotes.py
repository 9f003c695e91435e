"""Starting workers: forked from a zygote per NUMA node, or as fresh interpreters.

A zygote (``workers.zygote``) has imported the frameworks once; a worker forked from it shares
their pages copy-on-write and starts in milliseconds.  The broker starts one zygote per NUMA
node its instances are placed on (``node<N>``, its memory policy bound to the node before its
imports; ``any`` for instances without a node), the first time one is needed, and again if
it dies.  A forked worker is the zygote's child, not the broker's: the zygote reaps it and
reports its exit code, and :class:`ForkedProcess` gives the supervisor the same handle a
``Popen`` would (``pid``, ``poll``, ``send_signal``, ``kill``, ``wait``).  Signals go through a
pidfd the zygote sends with the pid, so they reach that process and no other.

A zygote that refuses (CUDA came up in it) or cannot start makes that worker start fresh
(``python -m inferpool.workers.main``), as every worker does with ``--worker-start fresh``.
A zygote that dies takes its workers with it (they are tied to it by their parent-death
signal); their exit code is then unknown (``EXIT_ZYGOTE_GONE``) and they are respawned from a
new zygote as after any crash.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from inferpool.wire.errors import InferpoolError
from inferpool.wire.worker.fork_protocol import (
    Exited,
    Fork,
    Forked,
    Refused,
    ZygoteSpec,
    recv,
    send,
    zygote_environment,
)
from inferpool.wire.worker.spec import EXIT_ZYGOTE_GONE, PinningSpec, WorkerSpec, spec_environment

log = logging.getLogger("inferpool.zygotes")
Readers = Callable[[int, Callable[[], None] | None], None]  # watch an fd (None: stop)


class Process(Protocol):
    """What the supervisor asks of a worker process (``subprocess.Popen`` has it)."""

    @property
    def pid(self) -> int | None: ...  # None until a forked worker's pid is known

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def start_fresh(spec: WorkerSpec) -> subprocess.Popen[bytes]:
    """A worker as a fresh interpreter, its channel end inherited (``spec.channel_fd``)."""
    argv = [sys.executable, "-m", "inferpool.workers.main"]
    env = {**os.environ, **spec_environment(spec)}
    fds = [spec.channel_fd]
    if sys.version_info >= (3, 11):  # out of the server's group from the start
        return subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, pass_fds=fds, process_group=0
        )
    # (workers.main.run leaves the group as it starts)
    return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, pass_fds=fds)


class ForkedProcess:
    """A worker asked of a zygote: pending until it is forked (or started fresh instead)."""

    def __init__(self, zygote: Zygote, spec: WorkerSpec, channel_fd: int) -> None:
        self.zygote = zygote
        self._spec = spec
        self._channel_fd: int | None = os.dup(channel_fd)  # for a fresh start if refused
        self._pid: int | None = None
        self._pidfd = -1
        self._fresh: subprocess.Popen[bytes] | None = None
        self._doomed = False  # killed while pending: killed as soon as it is forked
        self.returncode: int | None = None

    @property
    def pid(self) -> int | None:
        return self._fresh.pid if self._fresh is not None else self._pid

    def forked(self, pid: int, pidfd: int) -> None:
        self._pid, self._pidfd = pid, pidfd
        self._drop_channel()
        log.info(
            "started worker %s (pid %d, %s, forked by zygote %s)",
            self._spec.instance.name,
            pid,
            self._spec.identity,
            self.zygote.name,
        )
        if self._doomed:
            self.kill()

    def refused(self, reason: str) -> None:
        log.warning("starting %s fresh: %s", self._spec.identity, reason)
        if self._doomed or self._channel_fd is None:
            self.exited(EXIT_ZYGOTE_GONE)
            return
        try:
            self._fresh = start_fresh(replace(self._spec, channel_fd=self._channel_fd))
            log.info("started worker %s (pid %d)", self._spec.instance.name, self._fresh.pid)
        except OSError as exc:
            log.error("cannot start worker %s: %s", self._spec.identity, exc)
            self.exited(EXIT_ZYGOTE_GONE)
        self._drop_channel()

    def exited(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
        self._drop_channel()
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1

    def _drop_channel(self) -> None:
        if self._channel_fd is not None:
            os.close(self._channel_fd)
            self._channel_fd = None

    def poll(self) -> int | None:
        if self._fresh is not None:
            return self._fresh.poll()
        # with its zygote gone nobody will report how it ended: over once its pidfd says so
        if (
            self.returncode is None
            and not self.zygote.alive
            and (self._pid is None or self._pidfd < 0 or _exited(self._pidfd))
        ):
            self.exited(EXIT_ZYGOTE_GONE)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self._fresh is not None:
            with contextlib.suppress(ProcessLookupError):
                self._fresh.send_signal(sig)
        elif self._pid is None:
            self._doomed = True
        elif self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                if self._pidfd >= 0:
                    signal.pidfd_send_signal(self._pidfd, sig)
                else:
                    os.kill(self._pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            code = self.poll()
            if code is not None:
                return code
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"worker {self._spec.identity}", timeout or 0)
            if self._fresh is not None:
                self._fresh.wait(left)
            else:
                self.zygote.pump(0.05 if left is None else min(left, 0.05))


def _exited(pidfd: int) -> bool:
    return bool(select.select([pidfd], [], [], 0)[0])


class Zygote:
    """One zygote process and the workers it forked."""

    def __init__(
        self, name: str, pinning: PinningSpec, logs: dict[str, Any], readers: Readers
    ) -> None:
        """``logs``: the log settings (wire.logs) the zygote logs with, the broker's."""
        self.name = name
        self.readers = readers
        sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = sock
        spec = ZygoteSpec(name, os.getpid(), child.fileno(), pinning, logs)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "inferpool.workers.zygote"],
                env={**os.environ, **zygote_environment(spec)},
                stdin=subprocess.DEVNULL,
                close_fds=True,
                pass_fds=[child.fileno()],
            )
        except OSError:
            sock.close()
            raise
        finally:
            child.close()
        sock.setblocking(False)
        self.alive = True
        self._next_token = 0
        self._pending: dict[int, ForkedProcess] = {}  # token -> its worker
        self._workers: dict[int, ForkedProcess] = {}  # pid -> its worker
        readers(sock.fileno(), self.readable)
        log.info("started zygote %s (pid %d)", name, self.proc.pid)

    def fork(self, spec: WorkerSpec) -> ForkedProcess:
        """Ask for a worker; its process is pending until the zygote answers."""
        proc = ForkedProcess(self, spec, spec.channel_fd)
        self._next_token += 1
        self._pending[self._next_token] = proc
        try:
            message = Fork(self._next_token, spec_environment(spec).popitem()[1])
            send(self.sock, message, [spec.channel_fd])
        except (OSError, InferpoolError) as exc:
            del self._pending[self._next_token]
            proc.refused(f"zygote {self.name}: {exc}")
        return proc

    def readable(self) -> None:
        """The event loop's: read what the zygote said."""
        self.pump(0)

    def pump(self, timeout: float) -> None:
        """Handle the zygote's messages, waiting up to ``timeout`` for the first."""
        if timeout > 0 and not select.select([self.sock], [], [], timeout)[0]:
            return
        while self.alive:
            try:
                got = recv(self.sock)
            except BlockingIOError:
                return
            except (InferpoolError, OSError) as exc:
                log.error("zygote %s: %s", self.name, exc)
                got = None
            if got is None:
                self._gone()
                return
            msg, fds = got
            if isinstance(msg, Forked) and msg.token in self._pending:
                proc = self._pending.pop(msg.token)
                self._workers[msg.pid] = proc
                proc.forked(msg.pid, fds.pop(0) if fds else -1)
            elif isinstance(msg, Refused) and msg.token in self._pending:
                self._pending.pop(msg.token).refused(msg.error.get("message", ""))
            elif isinstance(msg, Exited) and msg.pid in self._workers:
                self._workers.pop(msg.pid).exited(msg.code)
            for fd in fds:
                os.close(fd)

    def _gone(self) -> None:
        """The zygote closed its end (it died): what it was asked for will not come."""
        self.alive = False
        self.readers(self.sock.fileno(), None)
        self.sock.close()
        for proc in self._pending.values():
            proc.refused(f"zygote {self.name} is gone")
        self._pending.clear()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(1)
        log.warning("zygote %s ended (%s)", self.name, self.proc.returncode)

    def close(self) -> None:
        """End the zygote: it exits when its socket closes (killed if it lingers)."""
        if self.alive:
            self.alive = False
            self.readers(self.sock.fileno(), None)
            self.sock.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Launcher:
    """How the supervisor starts a worker: from its node's zygote, or fresh."""

    def __init__(self, zygotes: bool, readers: Readers) -> None:
        self.use_zygotes = zygotes
        self.readers = readers
        self.zygotes: dict[int | None, Zygote] = {}

    def start(self, spec: WorkerSpec) -> Process:
        if not self.use_zygotes:
            return start_fresh(spec)
        node = spec.pinning.numa_node
        zygote = self.zygotes.get(node)
        if zygote is None or not zygote.alive:
            pinning = PinningSpec(numa_node=node, mempolicy="bind" if node is not None else "")
            name = "any" if node is None else f"node{node}"
            try:
                zygote = self.zygotes[node] = Zygote(name, pinning, spec.log, self.readers)
            except OSError as exc:
                log.error("cannot start zygote %s: %s; starting workers fresh", name, exc)
                return start_fresh(spec)
        return zygote.fork(spec)

    def close(self) -> None:
        for zygote in self.zygotes.values():
            zygote.close()
        self.zygotes.clear()
