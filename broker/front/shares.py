"""Each client's share of output memory: one that does not read its responses (or keeps
its output handles) cannot fill the workers' output regions and starve the others.

Output bytes a client holds are the outputs of its responses still in libzmq's hands (sent
zero-copy from a worker's output region, waiting for the client to read them) and its output
handles.  They count against the client's *principal* (``Peer.principal``: its process over
ipc, its host over tcp), so opening more connections does not buy more.  A principal over its
share has its further requests refused with UNAVAILABLE naming the share (backpressure: the
client reads, or releases, and goes on), and the outputs of requests it already had in
flight are copied into the message rather than held, so the regions stay free for others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inferpool.wire.errors import Code, InferpoolError


@dataclass
class _Owner:
    principal: str
    held: int = 0


class OutputShares:
    """How much output memory each principal holds unread, against its share."""

    def __init__(self, share: int, principal_of: Callable[[bytes], str]) -> None:
        """``share``: the bytes one principal may hold; ``principal_of``: a client's
        principal (looked up while it is connected: its message is being handled)."""
        self.share = share
        self._principal_of = principal_of
        self._owners: dict[bytes, _Owner] = {}  # clients holding output bytes
        self._held: dict[str, int] = {}  # by principal
        # hears (principal, client) when a principal comes to hold its share or drops below
        self.crossed: Callable[[str, bytes], Any] | None = None

    def admit(self, client: bytes) -> None:
        """Before a request is admitted: UNAVAILABLE if the client's principal is over."""
        if not self._held:
            return
        principal = self._principal_of(client)
        held = self._held.get(principal, 0)
        if held >= self.share:
            raise InferpoolError(
                Code.UNAVAILABLE,
                f"{principal} holds {held} bytes of output memory, its whole share "
                f"(--client-output-share {self.share}): read the responses waiting for it "
                "and release its output handles, then retry",
            )

    def over(self, client: bytes) -> bool:
        """Whether ``client``'s principal holds its share already (through any of its
        connections: one that holds nothing yet is over all the same)."""
        if not self._held:
            return False
        owner = self._owners.get(client)
        principal = owner.principal if owner is not None else self._principal_of(client)
        return self._held.get(principal, 0) >= self.share

    def hold(self, client: bytes, nbytes: int) -> None:
        owner = self._owners.get(client)
        if owner is None:
            owner = self._owners[client] = _Owner(self._principal_of(client))
        owner.held += nbytes
        before = self._held.get(owner.principal, 0)
        self._held[owner.principal] = before + nbytes
        if self.crossed is not None and before < self.share <= before + nbytes:
            self.crossed(owner.principal, client)

    def free(self, client: bytes, nbytes: int) -> None:
        owner = self._owners.get(client)
        if owner is None:
            return
        owner.held -= nbytes
        before = self._held[owner.principal]
        left = before - nbytes
        if left > 0:
            self._held[owner.principal] = left
        else:
            del self._held[owner.principal]
        if self.crossed is not None and left < self.share <= before:
            self.crossed(owner.principal, client)
        if owner.held <= 0:
            del self._owners[client]

    def held_by(self, client: bytes) -> int:
        """The output bytes ``client``'s principal holds."""
        return self._held.get(self._principal_of(client), 0)
