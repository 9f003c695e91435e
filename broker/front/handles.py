"""Outputs that stay in shared memory: handles with leases, and outputs in client regions.

An output requested with ``output_handle`` is not sent: the response says where it lives
in the worker's output region and carries a lease token; the slot stays held until the
client releases the lease (or loses it: disconnect, silence).  An output requested into a
registered region was written there by the worker; the response echoes the client's
window with the size actually written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from inferpool.broker.front.shares import OutputShares
from inferpool.broker.models.request import PendingRequest
from inferpool.broker.pool.output_regions import OutputRegions
from inferpool.shm.leases import Lease, LeaseTable
from inferpool.wire.errors import not_found
from inferpool.wire.worker.protocol import TensorRef


class Handles:
    """Outputs that stay in shared memory: the handles and leases of clients, and outputs in their
    regions."""

    def __init__(
        self,
        leases: LeaseTable,
        outputs: OutputRegions,
        shares: OutputShares,
        absorb: Callable[[bytes, list[Any]], list[Any]],
    ) -> None:
        """``shares``: what each client holds counts against its share of output memory;
        ``absorb(owner, tokens)``: the tokens of a release the lease table is to end
        (``front.lane_leases`` takes those of outputs a lane held that are not leases yet,
        or never will be)."""
        self.leases = leases
        self.outputs = outputs
        self.shares = shares
        self.absorb = absorb

    def place(
        self, req: PendingRequest, outputs: Sequence[TensorRef], headers: list[dict[str, Any]]
    ) -> list[TensorRef]:
        """Describe the outputs that stay in shared memory; return those to send as frames."""
        framed = []
        wanted = req.outputs
        for out in outputs:
            params = wanted.get(out.name)
            if params and "/" in out.region:  # written into the client's registered window
                headers.append(
                    {
                        "name": out.name,
                        "datatype": out.datatype,
                        "shape": out.shape,
                        "parameters": {
                            "shared_memory_region": params["shared_memory_region"],
                            "shared_memory_offset": params.get("shared_memory_offset", 0),
                            "shared_memory_byte_size": out.byte_size,
                        },
                    }
                )
            elif params and params.get("output_handle"):
                headers.append(self.lend(req.envelope[0], out))
            else:
                framed.append(out)
        return framed

    def lend(self, owner: bytes, out: TensorRef) -> dict[str, Any]:
        """Leave ``out`` where the worker wrote it, leased to ``owner``: its header."""
        region, offset, nbytes = out.region, out.offset, out.byte_size
        self.outputs.hold(region)
        self.shares.hold(owner, nbytes)
        return {
            "name": out.name,
            "datatype": out.datatype,
            "shape": out.shape,
            "parameters": {
                "handle_region": region,
                "handle_offset": offset,
                "handle_byte_size": nbytes,
                "handle_lease": self.leases.grant(owner, region, offset, nbytes),
            },
        }

    def release(self, owner: bytes, tokens: Any) -> int:
        """End ``owner``'s leases; NOT_FOUND naming any token it does not hold."""
        if not isinstance(tokens, list):
            tokens = [tokens]
        ended, bad = self.leases.release(owner, self.absorb(owner, tokens))
        self._end(ended)
        if bad:
            shown = ", ".join(repr(t) for t in bad[:5]) + (" ..." if len(bad) > 5 else "")
            raise not_found(
                f"{len(bad)} lease(s) not held by this client: {shown} (released already, "
                "reclaimed after a disconnect or a silence past the lease timeout, or never "
                f"granted); {len(ended)} other lease(s) were released"
            )
        return len(ended)

    def reclaim(self, owner: bytes) -> int:
        ended = self.leases.reclaim(owner)
        self._end(ended)
        return len(ended)

    def _end(self, ended: list[Lease]) -> None:
        for lease in ended:
            self.outputs.free(lease.region, lease.offset)
            self.shares.free(lease.owner, lease.nbytes)
