"""The fork protocol between the broker and a zygote, the pre-forked parent of its workers.

A zygote is started by the broker (``python -m inferpool.workers.zygote``) with a
:class:`ZygoteSpec` in :data:`ZYGOTE_ENV` and one end of a ``SOCK_SEQPACKET`` socketpair.
It imports what workers need once, then forks a worker for each :class:`Fork`: the message
carries the worker's spec (``wire.worker.spec``) and, as ancillary data (``SCM_RIGHTS``), the
worker's end of its channel.  The zygote answers :class:`Forked` with the child's pid (and a
pidfd of it, so the broker signals exactly that process) or :class:`Refused` with the reason,
reaps its children, and reports each exit as :class:`Exited` with the code ``Popen`` would
give (negative: the signal).  docs/internals.md describes the exchange.
"""

from __future__ import annotations

import array
import socket
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import orjson

from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.worker.protocol import MAX_MESSAGE, ErrorObject
from inferpool.wire.worker.spec import PinningSpec

ZYGOTE_ENV = "INFERPOOL_ZYGOTE_SPEC"
MAX_FDS = 4


@dataclass(frozen=True, slots=True)
class ZygoteSpec:
    """What a zygote is started with: its NUMA node, channel and logging."""

    name: str  # "node<N>" or "any": the NUMA node its workers are placed on, for logs
    broker_pid: int  # the zygote exits at once if its parent is not this process
    channel_fd: int  # its end of the socketpair
    pinning: PinningSpec = field(default_factory=PinningSpec)  # the node: cpus, mempolicy
    log: dict[str, Any] = field(default_factory=dict)  # wire.logs.LogSettings, the broker's


def zygote_environment(spec: ZygoteSpec) -> dict[str, str]:
    """The environment variable that carries a zygote's spec."""
    return {ZYGOTE_ENV: orjson.dumps(asdict(spec)).decode()}


def read_zygote_spec(environ: Mapping[str, str]) -> ZygoteSpec:
    """The spec a zygote was started with; INTERNAL naming the problem if it is unreadable."""
    try:
        raw = orjson.loads(environ[ZYGOTE_ENV])
        return ZygoteSpec(**{**raw, "pinning": PinningSpec(**raw.get("pinning", {}))})
    except KeyError:
        raise InferpoolError(
            Code.INTERNAL, f"${ZYGOTE_ENV} is not set: zygotes are started by the broker"
        ) from None
    except (orjson.JSONDecodeError, TypeError, AttributeError) as exc:
        raise InferpoolError(Code.INTERNAL, f"unreadable ${ZYGOTE_ENV}: {exc}") from None


class Fork(NamedTuple):
    """Fork a worker; the worker's channel end travels with it as ancillary data."""

    token: int  # names the answer
    spec: str  # the worker's spec as JSON (spec_environment's value)


class Forked(NamedTuple):
    """The worker of ``token`` runs as ``pid``; a pidfd of it travels with the message."""

    token: int
    pid: int


class Refused(NamedTuple):
    """The zygote cannot fork (CUDA came up in it, fork failed): start the worker fresh."""

    token: int
    error: ErrorObject


class Exited(NamedTuple):
    """A worker of this zygote ended: ``code`` as Popen.returncode (negative: a signal)."""

    pid: int
    code: int


ZygoteMessage = Fork | Forked | Refused | Exited
_KINDS: dict[type[ZygoteMessage], str] = {
    Fork: "fork",
    Forked: "forked",
    Refused: "refused",
    Exited: "exited",
}
_TYPES = {kind: cls for cls, kind in _KINDS.items()}


def send(sock: socket.socket, msg: ZygoteMessage, fds: Sequence[int] = ()) -> None:
    """Send a zygote message, with ``fds`` passed along."""
    data = orjson.dumps((_KINDS[type(msg)], tuple(msg)))
    if len(data) > MAX_MESSAGE:
        raise InferpoolError(
            Code.INTERNAL, f"a zygote message of {len(data)} bytes exceeds {MAX_MESSAGE} bytes"
        )
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def recv(sock: socket.socket) -> tuple[ZygoteMessage, list[int]] | None:
    """The next message and the fds that came with it; None once the other end closed.
    BlockingIOError on a non-blocking socket with nothing; INTERNAL for garbage (its fds
    are closed)."""
    fds = array.array("i")
    data, ancdata, _flags, _addr = sock.recvmsg(
        MAX_MESSAGE, socket.CMSG_SPACE(MAX_FDS * fds.itemsize)
    )
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    if not data:
        return None
    try:
        kind, body = orjson.loads(data)
        msg: Any = _TYPES[kind]._make(body)
    except (ValueError, TypeError, KeyError) as exc:
        for fd in fds:
            socket.close(fd)
        raise InferpoolError(
            Code.INTERNAL, f"unreadable zygote message: {type(exc).__name__}: {exc}"
        ) from None
    return msg, list(fds)
