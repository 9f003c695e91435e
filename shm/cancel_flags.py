"""Cancellation marks: one region per run where the broker marks requests cancelled and
workers read the marks while their backend executes.

A worker runs its backend on the thread that reads its channel, so a message saying "this
request is cancelled" would wait until the execute it is meant for has returned.  Instead
the broker writes into shared memory and a backend's ``request.is_cancelled()`` reads it at
once, costing nothing until it is asked.

The region holds :data:`WORDS` 64-bit words.  The request with handle ``rid`` (the broker's
request number, carried by every work item) owns word ``rid % WORDS``, and the broker writes
``rid`` there to cancel it: a word is never cleared, because a request only counts as
cancelled when the word holds its own number.  Two live requests share a word only when
their numbers are :data:`WORDS` apart; cancelling one of them then overwrites the other's
mark, but no request is ever reported cancelled that was not.
"""

from __future__ import annotations

from inferpool.shm.region import Region
from inferpool.shm.runs import region_name

WORDS = 1 << 16
_WORD = 8


def flags_region(run_id: str) -> str:
    """The name of run ``run_id``'s cancellation region."""
    return region_name(run_id, "cancel")


class CancelFlags:
    """The run's cancellation region: one flag word per request, set by the broker, read by
    backends."""

    def __init__(self, region: Region) -> None:
        self.region = region
        self._words = region.buf.cast("q")

    @classmethod
    def create(cls, run_id: str) -> CancelFlags:
        """The broker's: the run's region, created (mode 0600) and writable, its pages
        populated now (512 KiB), so a mark never needs a page /dev/shm may not have."""
        return cls(Region.create(flags_region(run_id), WORDS * _WORD, prefault=True))

    @classmethod
    def attach(cls, name: str) -> CancelFlags:
        """A worker's: the broker's region, mapped read-only."""
        return cls(Region.attach(name, readonly=True))

    def cancel(self, rid: int) -> None:
        self._words[rid % WORDS] = rid

    def is_cancelled(self, rid: int) -> bool:
        return bool(rid) and self._words[rid % WORDS] == rid

    def close(self) -> None:
        self._words.release()
        self.region.destroy()
