"""Who is at the other end of a client's connection, as the kernel says, never the client.

A ROUTER message carries the descriptor of the connection it came on (``zmq.SRCFD``).  Over
ipc the kernel knows the peer's process, user and groups (``SO_PEERCRED``); over tcp only
its address, and whether it came through the CURVE socket, whose handshake proved that it
holds an authorized key.  The KServe frontends' socket (inproc, in the broker's own process)
carries no peer of its own: each of its messages names its HTTP or gRPC caller
(``wire.caller``), whom the frontends identified the same way (the owner of a loopback
client's socket).  What a client may register, and whose limits it counts against, are
decided from this.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import struct
from dataclasses import dataclass
from typing import Any

import zmq

from inferpool.wire import caller
from inferpool.wire.errors import Code, InferpoolError

# The owner key of a client of a tagged socket is the socket's tag and the frame of its
# messages that names it: a CURVE client's routing id, the caller frame of the frontends'
# messages (which follows their own routing id).  A plain socket's ids are 5 bytes when zmq
# makes them, so a longer id with a tag is refused there: no client can pose as another's.
SECURE_TAG = b"\x00curve:"
KSERVE_TAG = b"\x00kserve:"
NAMED_BY = {SECURE_TAG: 0, KSERVE_TAG: 1}  # which routing frame names a tagged socket's client
RESERVED = tuple(NAMED_BY)
_UCRED = struct.Struct("3i")  # pid, uid, gid


@dataclass(frozen=True, slots=True)
class Peer:
    """Who is at the other end of a connection, and how the broker knows it."""

    transport: str  # "ipc", "tcp", "kserve", or "" when the connection could not be looked at
    pid: int = 0
    uid: int = -1  # kserve: -1 when the caller could not be identified
    gids: frozenset[int] = frozenset()
    address: str = ""  # tcp, unidentified kserve callers: the peer's host
    authenticated: bool = False  # tcp: through the CURVE socket, with an authorized key
    key: str = ""  # tcp through the CURVE socket: the client's public key (Z85)

    @property
    def principal(self) -> str:
        """What per-client limits count against: a process over ipc, a CURVE key over tcp
        with CURVE, a host over plain tcp (nothing else tells its clients apart), a user (a
        host when unidentified) over HTTP/gRPC."""
        if self.transport == "ipc":
            return f"process {self.pid} (uid {self.uid})"
        if self.transport == "tcp":
            return f"CURVE key {self.key}" if self.key else f"tcp host {self.address}"
        if self.transport == "kserve":
            who = f"uid {self.uid}" if self.uid >= 0 else f"host {self.address}"
            return f"{who} over HTTP/gRPC"
        return "an unidentified peer"

    @property
    def access_uid(self) -> int | None:
        """Whose rights the client has over shared-memory objects: its own user's over ipc
        and over HTTP/gRPC from loopback, the server's user's over authenticated tcp (the
        operator authorized its key), none over plain tcp or HTTP/gRPC from elsewhere."""
        if self.transport == "ipc" or (self.transport == "kserve" and self.uid >= 0):
            return self.uid
        if self.authenticated:
            return os.geteuid()
        return None


UNKNOWN = Peer("")


def require_access(peer: Peer, what: str) -> int:
    """``peer.access_uid``, or UNSUPPORTED: a client over plain tcp may not ``what``."""
    uid = peer.access_uid
    if uid is not None:
        return uid
    if peer.transport == "kserve":
        raise InferpoolError(
            Code.UNSUPPORTED,
            f"an HTTP/gRPC client the server cannot identify ({peer.principal}) may not "
            f"{what}: only a client over loopback (127.0.0.1, ::1) on the server's own host "
            "has a user the server can check",
        )
    raise InferpoolError(
        Code.UNSUPPORTED,
        f"a client over plain tcp ({peer.principal}) may not {what}: connect over the ipc "
        "endpoint (the server checks the client's user), or over tcp with a CURVE key "
        "the server authorized (--curve-authorized-keys)",
    )


def require_operator(peer: Peer, what: str) -> None:
    """Only the server's own user or root may ``what`` (over ipc, HTTP/gRPC from loopback,
    or tcp with an authorized CURVE key, which acts as the server's user); anyone else gets
    UNSUPPORTED naming who they are."""
    uid = require_access(peer, what)
    if uid not in (0, os.geteuid()):
        raise InferpoolError(
            Code.UNSUPPORTED,
            f"{peer.principal} may not {what}: only the server's own user "
            f"(uid {os.geteuid()}) or root may",
        )


def peer_of(fd: int, authenticated: bool, key: str = "") -> Peer:
    """The peer of connection ``fd`` (a descriptor libzmq owns: it is looked at through a
    duplicate); ``key``: the public key a CURVE client proved it holds."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return UNKNOWN
    with sock:
        try:
            if sock.family == socket.AF_UNIX:
                raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
                pid, uid, gid = _UCRED.unpack(raw)
                return Peer("ipc", pid, uid, frozenset({gid}) | _groups(pid))
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                address = str(sock.getpeername()[0])
                return Peer("tcp", address=address, authenticated=authenticated, key=key)
        except OSError:
            pass
    return UNKNOWN


class ProcessGate:
    """Lets through the messages that came on a connection of one process (the KServe
    frontends', whose messages name their callers): each connection is looked at once."""

    def __init__(self) -> None:
        self.pid = 0
        self._admitted: set[int] = set()  # connections (fds) of that process

    def allow(self, pid: int) -> None:
        """From now on only process ``pid``'s connections (a new one: the old are closed)."""
        self.pid = pid
        self._admitted.clear()

    def admits(self, source: Any) -> bool:
        """Whether ``source``, a frame of a message, came from the process allowed."""
        try:
            fd = int(source.get(zmq.SRCFD))
        except (AttributeError, zmq.ZMQError):
            return False
        if fd in self._admitted:
            return True
        if fd < 0 or not self.pid or peer_of(fd, False).pid != self.pid:
            return False
        self._admitted.add(fd)
        return True


@functools.lru_cache(maxsize=1024)
def caller_peer(client: bytes) -> Peer:
    """The HTTP or gRPC caller a frontends' owner key (``KSERVE_TAG`` and the caller frame)
    names."""
    try:
        who = caller.parse(client[len(KSERVE_TAG) :])
    except ValueError:
        return Peer("kserve", address="unknown")
    return Peer("kserve", uid=who.uid, gids=who.groups, address=who.host)


def _groups(pid: int) -> frozenset[int]:
    """The supplementary groups of process ``pid`` (none if they cannot be read)."""
    with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("Groups:"):
                return frozenset(int(g) for g in line.split()[1:])
    return frozenset()
