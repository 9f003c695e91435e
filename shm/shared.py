"""Regions that processes share by key (a model's weights), created and unlinked by one owner.

Only the broker creates regions.  A worker that wants one (``ShareRegion``: a key it computes
and a size) gets it from this table: the first asker is told to fill it, the others wait
until the filler reports it filled and then attach.  If the filler dies or gives up first,
the next waiter fills a fresh region.  A region lives while any process that was granted it
may still use it (the broker ``release``s a worker whose instance stopped for good) and goes
with the run.  The table knows nothing of processes or messages: owners are any hashable
objects, and what to send is returned as :class:`Grant` values.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import NamedTuple

from inferpool.shm.region import Region
from inferpool.shm.runs import region_name

KEY = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")


class Grant(NamedTuple):
    """Tell ``owner`` that region ``name`` of ``key`` is its to fill, or filled to attach
    (or, with ``error``, that it cannot have it)."""

    owner: Hashable
    key: str
    name: str
    fill: bool
    error: str = ""


@dataclass
class _Shared:
    region: Region
    filler: Hashable | None  # who fills it now; None once it is filled
    users: set[Hashable] = field(default_factory=set)  # everyone it was asked by
    waiting: list[Hashable] = field(default_factory=list)  # waiting for the fill


class SharedRegionTable:
    """Which regions workers share, who fills each, and who waits for it."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._shared: dict[str, _Shared] = {}

    def name_of(self, key: str) -> str:
        return region_name(self.run_id, f"shared-{key}")

    def ask(self, owner: Hashable, key: str, byte_size: int) -> Grant | None:
        """``owner`` asks for ``key``: a grant to send now, or None (it waits for the fill).

        Raises ValueError for a malformed key or size, or a size the existing region lacks;
        OSError if the region cannot be created.
        """
        if not isinstance(key, str) or not KEY.fullmatch(key):
            raise ValueError(f"key {key!r} is not 1-64 lowercase letters, digits and dashes")
        if type(byte_size) is not int or byte_size <= 0:
            raise ValueError(f"size {byte_size!r} is not a positive number of bytes")
        shared = self._shared.get(key)
        if shared is None:
            shared = self._shared[key] = _Shared(self._create(key, byte_size), owner)
        elif shared.region.size != byte_size:
            raise ValueError(
                f"shared region '{key}' holds {shared.region.size} bytes, not the {byte_size} "
                "asked: every process sharing it must lay it out alike"
            )
        shared.users.add(owner)
        if shared.filler is None or shared.filler == owner:
            return Grant(owner, key, shared.region.name, shared.filler == owner)
        shared.waiting.append(owner)
        return None

    def filled(self, owner: Hashable, key: str, ok: bool) -> list[Grant]:
        """The filler of ``key`` is done (``ok``) or gave up: the grants this releases."""
        shared = self._shared.get(key)
        if shared is None or shared.filler is None or shared.filler != owner:
            return []  # not its to fill (any more): nothing changes
        if not ok:
            return self._refill(key, shared)
        shared.filler = None
        grants = [Grant(w, key, shared.region.name, False) for w in shared.waiting]
        shared.waiting = []
        return grants

    def gone(self, owner: Hashable) -> list[Grant]:
        """``owner``'s process ended: it waits for nothing, and a fill it had not finished
        passes to the next waiter (on a fresh region)."""
        grants: list[Grant] = []
        for key, shared in list(self._shared.items()):
            if owner in shared.waiting:
                shared.waiting.remove(owner)
            if shared.filler is not None and shared.filler == owner:
                grants += self._refill(key, shared)
        return grants

    def release(self, owner: Hashable) -> list[Grant]:
        """``owner`` will not use its regions again: unlink those nobody else was granted."""
        grants = self.gone(owner)
        for key, shared in list(self._shared.items()):
            shared.users.discard(owner)
            if not shared.users:
                del self._shared[key]
                shared.region.destroy()
        return grants

    def names(self) -> list[str]:
        return sorted(shared.region.name for shared in self._shared.values())

    def close(self) -> None:
        for shared in self._shared.values():
            shared.region.destroy()
        self._shared.clear()

    def _create(self, key: str, byte_size: int) -> Region:
        return Region.create(self.name_of(key), byte_size, prefault=False)

    def _refill(self, key: str, shared: _Shared) -> list[Grant]:
        """Start ``key`` over: a fresh region for the next waiter to fill, or none at all."""
        shared.region.destroy()
        if not shared.waiting:
            del self._shared[key]
            return []
        shared.filler = shared.waiting.pop(0)
        try:
            shared.region = self._create(key, shared.region.size)
        except OSError as exc:
            del self._shared[key]
            waiting = [shared.filler, *shared.waiting]
            return [Grant(w, key, "", False, f"cannot create it again: {exc}") for w in waiting]
        return [Grant(shared.filler, key, shared.region.name, True)]
