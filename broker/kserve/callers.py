"""Who calls the frontends: the user of a loopback HTTP or gRPC client, as the kernel says.

The broker lets a client register only shared-memory objects its own user could open, and
counts limits per client (docs/security.md); the frontends are one zmq client, so each of
their messages names its caller (``wire.caller``).  An HTTP or gRPC client on this host that
connects over loopback has a socket here, and the kernel says whose it is
(``socket_owner``): that user, with the groups the group database gives it, is the caller.
A client of another host (or whose socket its process has closed already) is named by its
address alone, and may register nothing.  A proxy in front of the frontends is their client.

HTTP callers are looked up once per connection; gRPC does not show its connections, so
each call (each stream) is looked up, and only on a listener bound to one address (the
look-up needs the address the client reached, which gRPC does not tell).
"""

from __future__ import annotations

import functools
import ipaddress
import os
import pwd
import time
import weakref
from typing import Any
from urllib.parse import unquote

from aiohttp import web

from inferpool.broker.kserve.socket_owner import SocketOwners
from inferpool.wire import caller

UNKNOWN = caller.unidentified("unknown")
_WILDCARDS = ("", "0.0.0.0", "::")


class Callers:
    """The caller frame of each HTTP request or gRPC call (in the frontends' thread)."""

    def __init__(self, owners: SocketOwners) -> None:
        self._owners = owners
        self._connections: weakref.WeakKeyDictionary[Any, bytes] = weakref.WeakKeyDictionary()

    def of(self, peer: tuple[str, int], local: tuple[str, int]) -> bytes:
        """The caller at ``peer`` (host, port) of a connection to ``local``."""
        host = peer[0]
        if loopback(host):
            uid = self._owners.owner(peer, local)
            if uid is not None:
                return _identified(uid, groups(uid))
        return caller.unidentified(host)

    def of_http(self, request: web.Request) -> bytes:
        transport = request.transport
        if transport is None:  # the connection is closed already
            return UNKNOWN
        known = self._connections.get(transport)
        if known is None:
            peer = transport.get_extra_info("peername")
            local = transport.get_extra_info("sockname")
            known = UNKNOWN
            if isinstance(peer, tuple) and isinstance(local, tuple):
                known = self.of(peer[:2], local[:2])
            self._connections[transport] = known
        return known

    def of_grpc(self, context: Any, address: str, port: int) -> bytes:
        """The caller of a gRPC call to the listener on ``address``:``port``.

        gRPC tells a call's peer but not the address it reached, which the look-up needs:
        on a wildcard listener a guess (the peer's own address) could name the socket of
        another user's connection from the same port to another local address, so callers
        of a wildcard listener are not identified."""
        peer = _grpc_peer(context.peer())
        if peer is None:
            return UNKNOWN
        if address in _WILDCARDS:
            return caller.unidentified(peer[0])
        return self.of(peer, (address, port))


@functools.lru_cache(maxsize=256)  # (ipaddress takes 5 us to say it: gRPC asks per call)
def loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (IPv4-mapped IPv6 included)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool((mapped or ip).is_loopback)


_identified = functools.lru_cache(maxsize=256)(caller.identified)  # the frame of (uid, groups)

_groups: dict[int, tuple[float, tuple[int, ...]]] = {}  # uid -> (looked up at, groups)
GROUPS_TTL_S = 60.0  # a change in the group database counts after this long


def groups(uid: int) -> tuple[int, ...]:
    """The groups of user ``uid`` in the group database (none for a user it lacks), looked
    up again after ``GROUPS_TTL_S`` (a directory service may be slow to ask every call)."""
    now = time.monotonic()
    known = _groups.get(uid)
    if known is not None and now - known[0] < GROUPS_TTL_S:
        return known[1]
    try:
        entry = pwd.getpwuid(uid)
        found = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
    except (KeyError, OSError):
        found = ()
    if len(_groups) >= 1024:
        _groups.clear()
    _groups[uid] = (now, found)
    return found


@functools.lru_cache(maxsize=1024)  # a gRPC connection makes many calls
def _grpc_peer(peer: str) -> tuple[str, int] | None:
    """(host, port) of grpc's ``ipv4:1.2.3.4:5`` or ``ipv6:%5B::1%5D:5``; None otherwise."""
    kind, _, rest = unquote(peer).partition(":")
    host, _, port = rest.rpartition(":")
    if kind not in ("ipv4", "ipv6") or not port.isdigit():
        return None
    return host.strip("[]"), int(port)
