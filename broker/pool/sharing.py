"""The broker's side of shared regions: ShareRegion and RegionFilled in, RegionGrant out.

The bookkeeping (who fills, who waits, when a region goes) is ``shm.shared``'s; this module
turns a worker's messages into calls on it and its grants into messages.  Workers are the
table's owners.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol, cast

from inferpool.shm.shared import Grant, SharedRegionTable
from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.worker.protocol import RegionFilled, RegionGrant, ShareRegion


class Owner(Hashable, Protocol):
    """A worker as the table's owner: it takes the grants (``WorkerHandle.send``)."""

    def send(self, msg: RegionGrant) -> None: ...


class SharedRegions:
    """Regions workers share, asked for and granted through their messages."""

    def __init__(self, run_id: str) -> None:
        self.table = SharedRegionTable(run_id)

    def ask(self, worker: Owner, msg: ShareRegion) -> None:
        try:
            grant = self.table.ask(worker, msg.key, msg.byte_size)
        except (ValueError, OSError) as exc:
            self._refuse(worker, msg.key, InferpoolError(Code.INVALID_ARG, str(exc)))
            return
        if grant is not None:
            self._grant([grant])

    def filled(self, worker: Owner, msg: RegionFilled) -> None:
        self._grant(self.table.filled(worker, msg.key, msg.ok))

    def exited(self, worker: Owner, for_good: bool) -> None:
        """A worker's process ended: a fill it left undone passes on; once it is gone for
        good (stopped, failed, forgotten), regions nobody else uses are unlinked."""
        self._grant(self.table.release(worker) if for_good else self.table.gone(worker))

    def close(self) -> None:
        self.table.close()

    def _grant(self, grants: list[Grant]) -> None:
        for grant in grants:
            owner = cast(Owner, grant.owner)  # the table keeps what it was given: workers
            if grant.error:
                self._refuse(owner, grant.key, InferpoolError(Code.UNAVAILABLE, grant.error))
            else:
                owner.send(RegionGrant(grant.key, grant.name, grant.fill))

    def _refuse(self, worker: Owner, key: str, err: InferpoolError) -> None:
        why = InferpoolError(err.code, f"cannot share region '{key}': {err.message}")
        worker.send(RegionGrant(key, "", False, why.to_wire()))
