"""Leases on output handles: who may still read a slot of shared memory, and until when.

A lease is granted when a response hands a client an output in place instead of its bytes.
It ends exactly once: released by its owner, or reclaimed when the owner disconnects or
stays silent too long.  Tokens are never reused within a run and carry the run id, so a
stale token (released, reclaimed, or from an earlier run) and a forged one are simply not
found, and a token is honoured only for the client it was granted to.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Lease:
    """One output a client holds in shared memory, by its token."""

    token: str
    owner: bytes
    region: str
    offset: int
    nbytes: int = 0


class LeaseTable:
    """The leases of the run's clients: granted, released, reclaimed."""

    def __init__(self, run_id: str) -> None:
        self._prefix = run_id + "."
        self._next = 0
        self._leases: dict[str, Lease] = {}
        self._by_owner: dict[bytes, set[str]] = {}

    def grant(
        self, owner: bytes, region: str, offset: int, nbytes: int = 0, token: str = ""
    ) -> str:
        """A new lease of ``owner``'s and its token: a new one, or ``token`` (which names
        the output itself: an output a lane held, ``wire.lane_region.lane_token``)."""
        if not token:
            self._next += 1
            token = f"{self._prefix}{self._next}"
        self._leases[token] = Lease(token, owner, region, offset, nbytes)
        tokens = self._by_owner.get(owner)
        if tokens is None:
            self._by_owner[owner] = tokens = set()
        tokens.add(token)
        return token

    def release(self, owner: bytes, tokens: Iterable[Any]) -> tuple[list[Lease], list[Any]]:
        """End ``owner``'s leases among ``tokens``: (ended leases, tokens not held by it)."""
        ended: list[Lease] = []
        bad: list[Any] = []
        mine = self._by_owner.get(owner)
        for token in tokens:
            lease = self._leases.get(token) if isinstance(token, str) else None
            if lease is None or lease.owner != owner or mine is None:
                bad.append(token)
                continue
            del self._leases[token]
            mine.discard(token)
            ended.append(lease)
        if mine is not None and not mine:
            del self._by_owner[owner]
        return ended, bad

    def reclaim(self, owner: bytes) -> list[Lease]:
        """End every lease of ``owner`` (it disconnected or went silent)."""
        tokens = self._by_owner.pop(owner, ())
        return [self._leases.pop(t) for t in tokens]

    def holds(self, owner: bytes, token: Any) -> bool:
        """Whether ``owner`` holds the lease ``token``."""
        lease = self._leases.get(token) if isinstance(token, str) else None
        return lease is not None and lease.owner == owner

    def held_by(self, owner: bytes) -> int:
        return len(self._by_owner.get(owner, ()))

    def owners(self) -> list[bytes]:
        return list(self._by_owner)

    def __len__(self) -> int:
        return len(self._leases)
