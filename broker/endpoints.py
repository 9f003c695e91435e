"""What a run owns outside its components: the run lock with the run's regions, and the
clients' socket with its endpoints.

Each is entered in the broker's ExitStack as it is made, with its undoing: the run's
regions are unlinked (anything a worker asked for included) before the lock that marks the
run alive is released; an ipc endpoint's path is removed with the socket.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
from collections.abc import Iterable
from typing import Any

import posix_ipc
import zmq

from inferpool.shm.runs import SHM_DIR, RunLock, ours, regions_of_run, sweep_dead_runs
from inferpool.wire.errors import Code, InferpoolError

log = logging.getLogger("inferpool.broker")


def open_run(stack: contextlib.ExitStack, run_dir: str) -> str:
    """Sweep what dead runs left, then start this run; its id."""
    swept = sweep_dead_runs()
    if swept:
        log.warning("removed %d shared-memory region(s) left by dead runs", len(swept))
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    lock = RunLock()
    stack.callback(lock.release)
    stack.callback(_unlink_run, lock.run_id)
    log.info("run %s: its shared-memory regions are named inferpool-%s-*", lock.run_id, lock.run_id)
    return lock.run_id


def listen(
    stack: contextlib.ExitStack, ctx: zmq.Context[Any], endpoints: Iterable[str]
) -> zmq.Socket[Any]:
    """The clients' ROUTER socket, bound to every endpoint."""
    sock = ctx.socket(zmq.ROUTER)
    stack.callback(sock.close, 0)
    sock.setsockopt(zmq.LINGER, 0)
    for endpoint in endpoints:
        path = endpoint[len("ipc://") :] if endpoint.startswith("ipc://") else ""
        if path:
            os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
            if _unix_socket_in_use(path):
                raise InferpoolError(
                    Code.UNAVAILABLE, f"cannot listen on {endpoint}: another server is using it"
                )
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            raise InferpoolError(Code.UNAVAILABLE, f"cannot listen on {endpoint}: {exc}") from None
        if path:
            stack.callback(_remove, path)
        log.info("listening on %s", endpoint)
    return sock


def _unlink_run(run_id: str) -> None:
    """Every region of the run but its lock (e.g. weights a worker asked to share); a name
    someone else planted under the run's prefix is not ours to unlink."""
    for name in regions_of_run(run_id):
        if not name.endswith("-lock") and ours(os.path.join(SHM_DIR, name)):
            with contextlib.suppress(posix_ipc.ExistentialError):
                posix_ipc.unlink_shared_memory("/" + name)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _unix_socket_in_use(path: str) -> bool:
    if not os.path.exists(path):
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError as exc:
        return exc.errno not in (errno.ECONNREFUSED, errno.ENOENT)
    finally:
        probe.close()
    return True
