"""Outputs a client still holds when its lane ends: they become its leases.

A lane's results are read in place in the worker's output region and given back on the
lane.  When the broker ends a lane while its client lives (the client closed it, a model
version retired, a step of its ensemble crashed, the server drains), the client may still
hold results and read them.  So the broker marks the lane ``KEPT`` before revoking it and
tells the worker not to free them; the worker reports what the client held
(``LaneClosed.kept``) and the broker makes each one a lease of the client's, with the token
``wire.lane_region.lane_token(lane, offset)``: the client releases it through the broker like any
output handle, and a disconnect or a silence past the lease timeout reclaims it.

A client may release such an output before the worker has reported it (its release and the
worker's report travel apart): the release is remembered and the output freed when the
report comes.  A lane token the broker holds no lease for (the worker freed the output, or
died with it) is dropped quietly: it frees nothing of anyone's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferpool.broker.front.shares import OutputShares
from inferpool.broker.pool.output_regions import OutputRegions
from inferpool.shm.leases import LeaseTable
from inferpool.wire.lane_region import lane_token, parse_lane_token


@dataclass
class _Ending:
    """A lane told to keep its client's outputs, whose worker has not reported them yet."""

    owner: bytes
    released: set[int] = field(default_factory=set)  # offsets released before the report
    gone: bool = False  # the client went before the report: it frees them all


class LaneLeases:
    """Outputs a client holds when its lane ends, made leases of the client's."""

    def __init__(self, leases: LeaseTable, outputs: OutputRegions, shares: OutputShares) -> None:
        self.leases = leases
        self.outputs = outputs
        self.shares = shares
        self._ending: dict[int, _Ending] = {}  # lane -> what its worker will report

    def expect(self, lane: int, owner: bytes) -> None:
        """Lane ``lane`` of ``owner`` was told to keep its client's outputs."""
        self._ending[lane] = _Ending(owner)

    def adopt(self, lane: int, region: str, kept: Sequence[tuple[int, int]]) -> None:
        """The worker's report of what the client held (offset, byte size, in its output
        ``region``): each becomes the client's lease, or is freed if the client has released
        it already or is gone."""
        ending = self._ending.pop(lane, None)
        for offset, nbytes in kept:
            if ending is None or ending.gone or offset in ending.released:
                self.outputs.free(region, offset, held=False)
                continue
            self.outputs.hold(region)
            self.shares.hold(ending.owner, nbytes)
            self.leases.grant(ending.owner, region, offset, nbytes, lane_token(lane, offset))

    def lost(self, lane: int) -> None:
        """The lane's worker died before its report: the outputs went with it."""
        self._ending.pop(lane, None)

    def absorb(self, owner: bytes, tokens: Iterable[Any]) -> list[Any]:
        """The tokens of ``owner``'s release that the lease table is to end: every token but
        the lane tokens it holds no lease for, which are remembered for a report to come or
        dropped."""
        kept = []
        for token in tokens:
            parsed = parse_lane_token(token)
            if parsed is None or self.leases.holds(owner, token):
                kept.append(token)
                continue
            ending = self._ending.get(parsed[0])
            if ending is not None and ending.owner == owner:
                ending.released.add(parsed[1])
        return kept

    def forget(self, owner: bytes) -> None:
        """``owner`` is gone: the reports still to come free what it held (its leases are
        reclaimed with the others)."""
        for ending in self._ending.values():
            if ending.owner == owner:
                ending.gone = True
