"""The user owning a TCP socket of this host, found by its address pair: what identd answers.

The kernel records the user that created each socket.  ``NETLINK_SOCK_DIAG`` looks one
connection up by its exact addresses (a hash lookup: about 16 microseconds here), where
reading /proc/net/tcp walks the kernel's whole connection table (10-13 ms per read on the
same machine, however few connections there are).  Only sockets of this network namespace
can be found, so only a loopback peer's socket is ever there.  A socket its process has
closed (orphaned, in time-wait) keeps its addresses but has no owner any more (the kernel
says uid 0, root's), and addresses with no connection find the listener on them: neither
names anyone.
"""

from __future__ import annotations

import functools
import itertools
import socket
import struct

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
TIMEOUT_S = 1.0
_ALL_STATES = 0xFFFFFFFF
_NO_COOKIE = 0xFFFFFFFF
# nlmsghdr (length, type, flags, sequence, port), inet_diag_req_v2 (family, protocol,
# extensions, states) and its inet_diag_sockid (ports big-endian, addresses, interface, cookie)
_REQUEST = struct.Struct("=IHHIIBBBxI2s2s16s16sIII")
_HEADER = struct.Struct("=IHHII")
_PORTS_AT = _HEADER.size + 4  # in inet_diag_msg: the sockid's ports, after four bytes
_PORTS = struct.Struct(">HH")
_UID_AT = _PORTS_AT + 48 + 12  # in inet_diag_msg: after the sockid and three counters
_OWNER = struct.Struct("=II")  # uid, inode


class SocketOwners:
    """Look-ups over one netlink socket (opened on first use) of one thread."""

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._seq = itertools.count(1)

    def owner(self, local: tuple[str, int], remote: tuple[str, int]) -> int | None:
        """The uid of the TCP socket bound to ``local`` and connected to ``remote`` (host,
        port), or None: no such socket here, none that a process still holds open (the
        kernel says uid 0 for those), or the kernel would not say."""
        try:
            family, addresses = _packed(local[0], remote[0])
        except (OSError, ValueError):
            return None
        seq = next(self._seq)
        request = _REQUEST.pack(
            _REQUEST.size,
            SOCK_DIAG_BY_FAMILY,
            NLM_F_REQUEST,
            seq,
            0,
            family,
            socket.IPPROTO_TCP,
            0,
            _ALL_STATES,
            local[1].to_bytes(2, "big"),
            remote[1].to_bytes(2, "big"),
            *addresses,
            0,
            _NO_COOKIE,
            _NO_COOKIE,
        )
        try:
            sock = self._socket()
            sock.send(request)
            while True:  # an answer to an earlier, abandoned request is skipped
                answer = sock.recv(8192)
                if _HEADER.unpack_from(answer)[3] == seq:
                    break
        except OSError:  # no netlink here, or no answer in time
            self.close()  # a fresh socket next time
            return None
        if _HEADER.unpack_from(answer)[1] == NLMSG_ERROR or len(answer) < _UID_AT + 8:
            return None  # ENOENT: no such socket (any more)
        ports = _PORTS.unpack_from(answer, _PORTS_AT)
        uid, inode = _OWNER.unpack_from(answer, _UID_AT)
        if ports != (local[1], remote[1]):
            return None  # not that connection: a listener on ``local`` (the kernel's fallback)
        if inode == 0:
            return None  # closed by its process (orphaned, time-wait): its uid reads as 0
        return int(uid)

    def _socket(self) -> socket.socket:
        if self._sock is None:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
            sock.settimeout(TIMEOUT_S)
            self._sock = sock
        return self._sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


@functools.lru_cache(maxsize=256)  # a gRPC caller is looked up per call: the same addresses
def _packed(local: str, remote: str) -> tuple[int, tuple[bytes, bytes]]:
    """The address family and both addresses as sock_diag wants them (16 bytes each); an
    IPv4 address beside an IPv6 one is written as IPv4-mapped."""
    if ":" in local or ":" in remote:
        local, remote = (a if ":" in a else "::ffff:" + a for a in (local, remote))
        family = socket.AF_INET6
    else:
        family = socket.AF_INET
    raw = tuple(socket.inet_pton(family, a).ljust(16, b"\0") for a in (local, remote))
    return family, (raw[0], raw[1])
