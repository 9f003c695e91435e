"""Shared regions a backend may ask the broker for (one copy of a model's weights).

Only the broker creates and unlinks regions.  A model asks for one by a key it computes (the
same in every process that should share it) and a size; the first asker is told to fill it
and must then say whether it did, the others get it once it is filled.  The region lives
until the broker no longer serves an instance that asked for it.  ``Model.shared_regions``
is None where no broker serves the model (a ``BackendHarness`` given no regions).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol


class SharedRegion(NamedTuple):
    """A region processes share, and whether this one fills it."""

    name: str  # the POSIX name to attach (shm.region.Region.attach)
    fill: bool  # True: fill it now, then call ``SharedRegions.filled``


class SharedRegions(Protocol):
    """Regions the broker makes for workers to share (weights loaded once)."""

    def share(self, key: str, byte_size: int) -> SharedRegion:
        """The region for ``key`` (1-64 of ``a-z0-9-``) of ``byte_size`` bytes; may wait for
        another process to fill it.  Raises InferpoolError if the broker refuses."""
        ...

    def filled(self, key: str, ok: bool) -> None:
        """Report that the region this process was told to fill is filled (or is not)."""
        ...
