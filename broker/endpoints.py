"""What a run owns outside its components: the run lock with the run's regions, and the
clients' sockets with their endpoints.

Each is entered in the broker's ExitStack as it is made, with its undoing: the run's
regions are unlinked (anything a worker asked for included) before the lock that marks the
run alive is released; an ipc endpoint's path is removed with the socket.

An ipc socket's directory decides who may connect, so it must be the server's own: a
directory of another user, a symlink, or a shared one like /tmp (sticky) is refused, and
the directory is made 0700 (0750 with ``--ipc-access group``: members of its group may
connect, the socket made 0660) even when it existed already.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import posix_ipc
import zmq

from inferpool.broker.curve_auth import CurveKeys, secure
from inferpool.broker.front.peers import KSERVE_TAG, SECURE_TAG
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


@dataclass(frozen=True)
class Frontends:
    """The clients' ROUTER sockets: ``plain`` (ipc, and tcp without CURVE), ``secure`` (the
    tcp endpoints, when CURVE is on) and ``kserve`` (the KServe frontends' process's alone)."""

    plain: zmq.Socket[Any]
    secure: zmq.Socket[Any] | None = None
    kserve: zmq.Socket[Any] | None = None

    @property
    def sockets(self) -> list[zmq.Socket[Any]]:
        """Those whose clients connect from other processes (their disconnects matter)."""
        return [self.plain] if self.secure is None else [self.plain, self.secure]

    @property
    def tagged(self) -> dict[bytes, zmq.Socket[Any]]:
        """The sockets other than ``plain``, by the tag of their clients' owner keys."""
        tags = {SECURE_TAG: self.secure, KSERVE_TAG: self.kserve}
        return {tag: sock for tag, sock in tags.items() if sock is not None}


def listen(
    stack: contextlib.ExitStack,
    ctx: zmq.Context[Any],
    endpoints: Iterable[str],
    ipc_group: bool = False,
    curve: CurveKeys | None = None,
    kserve_path: str = "",
) -> Frontends:
    """The clients' ROUTER sockets, bound to every endpoint, and one bound to the ipc socket
    ``kserve_path`` for the KServe frontends' process when it is given (only the server's user
    may connect to it: mode 0600, in the server's own directory)."""
    plain = _router(stack, ctx)
    tcp = None
    if curve is not None:
        tcp = _router(stack, ctx)
        secure(stack, ctx, tcp, curve)
    kserve = None
    if kserve_path:
        kserve = _router(stack, ctx)
        _socket_directory(kserve_path, os.path.dirname(kserve_path), ipc_group)
        _sweep_kserve_sockets(os.path.dirname(kserve_path))
        kserve.bind(f"ipc://{kserve_path}")
        stack.callback(_remove, kserve_path)
        os.chmod(kserve_path, 0o600)
    for endpoint in endpoints:
        path = endpoint[len("ipc://") :] if endpoint.startswith("ipc://") else ""
        if path and not path.startswith("@"):
            _socket_directory(endpoint, os.path.dirname(os.path.abspath(path)), ipc_group)
            if _unix_socket_in_use(path):
                raise InferpoolError(
                    Code.UNAVAILABLE, f"cannot listen on {endpoint}: another server is using it"
                )
        sock = tcp if tcp is not None and endpoint.startswith("tcp://") else plain
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            raise InferpoolError(Code.UNAVAILABLE, f"cannot listen on {endpoint}: {exc}") from None
        if path and not path.startswith("@"):
            stack.callback(_remove, path)
            if ipc_group:
                os.chmod(path, 0o660)
        log.info("listening on %s%s", endpoint, " (CURVE)" if sock is tcp else "")
    return Frontends(plain, tcp, kserve)


def _router(stack: contextlib.ExitStack, ctx: zmq.Context[Any]) -> zmq.Socket[Any]:
    sock = ctx.socket(zmq.ROUTER)
    stack.callback(sock.close, 0)
    sock.setsockopt(zmq.LINGER, 0)
    return sock


def _socket_directory(endpoint: str, directory: str, group: bool) -> None:
    """Make ``directory`` the server's own (0700, or 0750 for ``group``), or refuse it."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    st = os.lstat(directory)
    why = ""
    if not stat.S_ISDIR(st.st_mode):
        why = "is not a directory (a symlink?)"
    elif st.st_uid != os.geteuid():
        why = f"belongs to uid {st.st_uid}, not to this server's user (uid {os.geteuid()})"
    elif st.st_mode & stat.S_ISVTX:
        why = "is shared by every user (like /tmp): give the socket a directory of its own"
    if why:
        raise InferpoolError(Code.UNAVAILABLE, f"cannot listen on {endpoint}: {directory} {why}")
    os.chmod(directory, 0o750 if group else 0o700)


def _sweep_kserve_sockets(directory: str) -> None:
    """Remove the KServe frontends' sockets (``kserve-<broker pid>.sock``) that brokers
    killed before they could remove their own left in ``directory``."""
    for name in os.listdir(directory):
        pid = name[len("kserve-") : -len(".sock")]
        ours = name.startswith("kserve-") and name.endswith(".sock") and pid.isdigit()
        if ours and not _alive(int(pid)):
            _remove(os.path.join(directory, name))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
