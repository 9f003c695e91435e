"""A zygote: the pre-forked parent of one NUMA node's workers (``python -m
inferpool.workers.zygote``, started by the broker).

Importing numpy, the backend host and torch is most of a worker's start and most of its
private memory.  A zygote does it once, with the node's memory policy set before the imports
(so the runtime's pages are on the node), moves what it imported out of the garbage
collector's reach (``gc.freeze``: a collection writes to every object it visits, which would
unshare its page), and forks a worker for each ``Fork``: the worker shares the runtime's pages
copy-on-write, pins itself to its own cores and loads its model (``workers.main.run``).  A
built-in backend is imported here the first time a worker needs it (torch with ``pytorch``);
a model's own code never runs here.

CUDA is never initialised in a zygote: a child forked after CUDA init inherits a context it
cannot use, and ``CUDA_VISIBLE_DEVICES``, which each GPU worker sets for itself after the
fork, is read only when CUDA initialises.  Before each fork the zygote checks that torch has
not initialised CUDA; if it has, it answers ``Refused`` and the broker starts that worker as a
fresh interpreter.

The zygote reaps its workers and reports each exit (``Exited``); the kernel sends it SIGKILL
when the broker dies (its workers, tied to it, then get their SIGTERM); it exits when the
broker closes its socket.  ``wire.worker.zygote`` is the protocol.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import gc
import importlib
import logging
import os
import select
import signal
import socket
import sys
import traceback
from typing import NoReturn

from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.logs import configure, settings_from
from inferpool.wire.worker.fork_protocol import (
    Exited,
    Fork,
    Forked,
    Refused,
    read_zygote_spec,
    recv,
    send,
)
from inferpool.wire.worker.spec import (
    EXIT_BOOT_FAILED,
    EXIT_BROKER_GONE,
    EXIT_OK,
    SPEC_ENV,
    WorkerSpec,
    read_spec,
)
from inferpool.workers.lifeline import set_parent_death_signal
from inferpool.workers.pinning import apply

log = logging.getLogger("inferpool.zygote")


def main() -> int:
    """A zygote process: import the frameworks once, then fork workers on demand."""
    faulthandler.enable(file=sys.stderr, all_threads=True)
    try:
        spec = read_zygote_spec(os.environ)
    except InferpoolError as err:
        print(f"inferpool zygote: {err}", file=sys.stderr)
        return EXIT_BOOT_FAILED
    if not set_parent_death_signal(signal.SIGKILL, parent_pid=spec.broker_pid):
        return EXIT_BROKER_GONE
    # Ctrl-C, and a SIGTERM sent to the whole group (systemd, timeout), are the broker's to
    # handle: the zygote ends when the broker closes its socket or dies
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # ...and blocked too: a forked worker inherits the mask, so a SIGTERM the broker sends it
    # before it installs its own handler stays pending (a blocked signal is never discarded as
    # ignored) and ends it once ``workers.main.run`` unblocks it, instead of being lost
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    configure(
        settings_from(spec.log),
        f"zygote {spec.name} pid {os.getpid()}",
        {"process": "zygote", "zygote": spec.name},
    )
    try:
        apply(spec.pinning)  # the node's memory policy, before the imports
        importlib.import_module("inferpool.workers.worker")  # numpy, the backend host
    except Exception as exc:
        log.error("cannot start: %s", exc)
        return EXIT_BOOT_FAILED
    gc.freeze()
    return Zygote(socket.socket(fileno=spec.channel_fd)).serve()


class Zygote:
    """Forks workers on request, reaps them and reports their exits."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes the poll

    def serve(self) -> int:
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while True:
            for fd, _ in poller.poll():
                if fd == self._wake_r:
                    self._drain_wake()
                    self._reap()
                    continue
                try:
                    got = recv(self.sock)
                except InferpoolError as err:
                    log.error("%s", err.message)
                    continue
                if got is None:  # the broker is gone or done with us
                    return EXIT_OK
                msg, fds = got
                if isinstance(msg, Fork) and fds:
                    self._fork(msg, fds[0])
                    fds = fds[1:]
                else:
                    log.error("unexpected %s from the broker; ignored", type(msg).__name__)
                for fd in fds:
                    os.close(fd)

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            send(self.sock, Exited(pid, os.waitstatus_to_exitcode(status)))

    def _fork(self, msg: Fork, channel_fd: int) -> None:
        try:
            spec = read_spec({SPEC_ENV: msg.spec})
            _preload(spec.backend)
            _check_no_cuda()
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
        except (InferpoolError, OSError) as exc:
            err = InferpoolError.wrap(exc, Code.INTERNAL)
            log.warning("not forking a worker: %s", err.message)
            os.close(channel_fd)
            send(self.sock, Refused(msg.token, err.to_wire()))
            return
        if pid == 0:
            self._child(spec, channel_fd)
        os.close(channel_fd)
        pidfd = _pidfd(pid)
        try:
            send(self.sock, Forked(msg.token, pid), [pidfd] if pidfd >= 0 else [])
        finally:
            if pidfd >= 0:
                os.close(pidfd)

    def _child(self, spec: WorkerSpec, channel_fd: int) -> NoReturn:
        """The forked worker: drop the zygote's state, then run as a worker; never returns."""
        code = EXIT_BOOT_FAILED
        try:
            zygote = os.getppid()
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            self.sock.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
            _reseed()
            from inferpool.workers.main import run

            code = run(dataclasses.replace(spec, broker_pid=zygote, channel_fd=channel_fd))
        except SystemExit as exc:  # SIGTERM ends a worker with SystemExit(0)
            code = exc.code if isinstance(exc.code, int) else EXIT_BOOT_FAILED
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)


def _preload(backend: str) -> None:
    """Import a built-in backend once, in the zygote, so its workers share it."""
    from inferpool.backends.loader import BUILTIN

    if backend in BUILTIN and f"inferpool.backends.{backend}" not in sys.modules:
        importlib.import_module(f"inferpool.backends.{backend}")
        gc.freeze()


def _check_no_cuda() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise InferpoolError(
            Code.UNAVAILABLE, "CUDA was initialised in the zygote: a forked worker could not use it"
        )


def _pidfd(pid: int) -> int:
    """A pidfd of ``pid`` (Linux >= 5.3), or -1: the broker then signals by pid."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return -1


def _reseed() -> None:
    """Forked siblings must not share random streams (Python's own reseeds at fork)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


if __name__ == "__main__":
    sys.exit(main())
