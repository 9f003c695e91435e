"""How the KServe frontends name the caller of each message to the broker: one frame.

The frontends are one zmq client of the broker, in its own process, but the broker decides
what a client may register from who the client is.  So every message from the frontends
carries a routing frame naming the HTTP or gRPC client it is for:

- ``uid:<uid>:<gid>,<gid>,...``: a client over loopback whose socket the kernel says belongs
  to user ``uid`` (the groups are that user's in the group database);
- ``host:<address>``: a client the frontends could not identify (another host's, or a
  loopback socket already gone).

The broker believes this frame only on the frontends' own in-process socket.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Caller:
    """A KServe frontend's caller, as far as the frontend knows it."""

    uid: int = -1  # -1: not identified
    groups: frozenset[int] = frozenset()
    host: str = ""  # an unidentified caller's address


def identified(uid: int, groups: Iterable[int]) -> bytes:
    """The frame naming a caller whose uid and groups the frontend knows."""
    return f"uid:{uid}:{','.join(str(g) for g in sorted(set(groups)))}".encode()


def unidentified(host: str) -> bytes:
    """The frame naming a caller known only by its address."""
    return f"host:{host}".encode()


def parse(frame: bytes) -> Caller:
    """The caller ``frame`` names; ValueError if it is not one of the two forms."""
    kind, _, rest = frame.decode().partition(":")
    if kind == "host":
        return Caller(host=rest)
    if kind != "uid":
        raise ValueError(f"not a caller frame: {frame!r}")
    uid, _, groups = rest.partition(":")
    return Caller(int(uid), frozenset(int(g) for g in groups.split(",") if g))
