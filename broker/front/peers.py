"""Who is at the other end of a client's connection, as the kernel says, never the client.

A ROUTER message carries the descriptor of the connection it came on (``zmq.SRCFD``).  Over
ipc the kernel knows the peer's process, user and groups (``SO_PEERCRED``); over tcp only
its address, and whether it came through the CURVE socket, whose handshake proved that it
holds an authorized key.  What a client may register, and whose limits it counts against,
are decided from this.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
from dataclasses import dataclass

from inferpool.wire.errors import Code, InferpoolError

# The owner key of a client of the CURVE socket is this tag and its routing id: a plain
# socket's ids are 5 bytes when zmq makes them, so a longer id with this tag is refused there
SECURE_TAG = b"\x00curve:"
_UCRED = struct.Struct("3i")  # pid, uid, gid


@dataclass(frozen=True, slots=True)
class Peer:
    transport: str  # "ipc", "tcp", or "" when the connection could not be looked at
    pid: int = 0
    uid: int = -1
    gids: frozenset[int] = frozenset()
    address: str = ""  # tcp: the peer's host
    authenticated: bool = False  # tcp: through the CURVE socket, with an authorized key

    @property
    def principal(self) -> str:
        """What per-client limits count against: a process over ipc, a host over tcp."""
        if self.transport == "ipc":
            return f"process {self.pid} (uid {self.uid})"
        if self.transport == "tcp":
            return f"tcp host {self.address}"
        return "an unidentified peer"

    @property
    def access_uid(self) -> int | None:
        """Whose rights the client has over shared-memory objects: its own user's over ipc,
        the server's user's over authenticated tcp (the operator authorized its key), none
        over plain tcp."""
        if self.transport == "ipc":
            return self.uid
        if self.authenticated:
            return os.geteuid()
        return None


UNKNOWN = Peer("")


def require_access(peer: Peer, what: str) -> int:
    """``peer.access_uid``, or UNSUPPORTED: a client over plain tcp may not ``what``."""
    uid = peer.access_uid
    if uid is None:
        raise InferpoolError(
            Code.UNSUPPORTED,
            f"a client over plain tcp ({peer.principal}) may not {what}: connect over the ipc "
            "endpoint (the server checks the client's user), or over tcp with a CURVE key "
            "the server authorized (--curve-authorized-keys)",
        )
    return uid


def peer_of(fd: int, authenticated: bool) -> Peer:
    """The peer of connection ``fd`` (a descriptor libzmq owns: it is looked at through a
    duplicate)."""
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
                return Peer("tcp", address=str(sock.getpeername()[0]), authenticated=authenticated)
        except OSError:
            pass
    return UNKNOWN


def _groups(pid: int) -> frozenset[int]:
    """The supplementary groups of process ``pid`` (none if they cannot be read)."""
    with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("Groups:"):
                return frozenset(int(g) for g in line.split()[1:])
    return frozenset()
