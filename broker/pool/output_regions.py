"""The broker's side of the workers' output arenas.

Each worker generation gets its own output region, created here (only the broker creates
regions).  The worker allocates inside it; every slot it reports is held here until the
client has its bytes (frame sent) or releases its handle.  A region whose worker is gone is
retired and unlinked as soon as nothing holds a slot of it.

A slot can have several owners (``share``): an ensemble's intermediate tensor is read in
place by every step that consumes it, and maybe sent to the client too; it goes back to its
worker with the last owner's ``free``.  Regions whose slots other workers read (``lend``)
are reported when they go (``lent_gone``), so those workers can drop their mappings.

A region is created sparse; its worker populates the first part as it boots (``prefault_for``:
two batches of the model's outputs where its config fixes their size, else ``--prefault``)
and the rest as its allocations reach it (``shm.warm``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tritonclient.grpc import model_config_pb2 as pb

from inferpool.shm.region import Region
from inferpool.shm.runs import region_name
from inferpool.wire.codec import config_to_wire_datatype, element_size
from inferpool.wire.worker.protocol import Slot

MIN_PREFAULT = 64 << 10


@dataclass
class OutputRegion:
    """One worker generation's output region and the slots held in it."""

    region: Region
    owner: Any  # the WorkerHandle allocating in it; None once retired
    held: int = 0
    pending_frees: list[Slot] = field(default_factory=list)
    lent: bool = False  # another worker may have mapped it (pipelines)
    on_free: Callable[[int], None] | None = None  # a region another part allocates in


class OutputRegions:
    """The workers' output regions: created, held, freed and retired."""

    def __init__(
        self, run_id: str, size: int, prefault: int, lent_gone: Callable[[str], None]
    ) -> None:
        """``size``: the most a region may grow to; ``prefault``: the most populated at start;
        ``lent_gone(region)``: a region other workers read is gone (they unmap it)."""
        self.run_id = run_id
        self.size = size
        self.prefault = prefault
        self.lent_gone = lent_gone
        self._regions: dict[str, OutputRegion] = {}
        self._owners: dict[tuple[str, int], int] = {}  # shared slot -> owners beyond one

    def create(self, tag: str, owner: Any) -> str:
        name = region_name(self.run_id, tag)
        self._regions[name] = OutputRegion(Region.create(name, self.size, prefault=False), owner)
        return name

    def add_external(self, name: str, region: Region, on_free: Callable[[int], None]) -> None:
        """Serve outputs from a region of another part of the broker (the response cache):
        its slots are viewed, held and freed like a worker's, and ``on_free`` hears each
        freed offset.  It is destroyed with the others at close."""
        self._regions[name] = OutputRegion(region, None, on_free=on_free)

    def prefault_for(self, config: Any) -> int:
        """What a worker of a model with this ``ModelConfig`` populates as it boots."""
        batch = first_batch_bytes(config)
        need = self.prefault if batch is None else max(MIN_PREFAULT, 2 * batch)
        return min(need, self.prefault, self.size)

    def view(self, name: str, offset: int, nbytes: int) -> memoryview:
        return self._regions[name].region.view(offset, nbytes)

    def hold(self, name: str) -> None:
        """A slot that stays in use after its result was handled (zero-copy send, lease)."""
        self._regions[name].held += 1

    def share(self, name: str, offset: int, owners: int) -> None:
        """The slot now has ``owners`` more owners, each of which frees it once; it goes back
        to its worker with the last free.  Every extra owner holds the region."""
        entry = self._regions.get(name)
        if entry is None or owners <= 0:
            return
        entry.held += owners
        key = (name, offset)
        self._owners[key] = self._owners.get(key, 0) + owners

    def lend(self, name: str) -> None:
        """Another worker reads slots of ``name`` in place (mapped until told otherwise)."""
        entry = self._regions.get(name)
        if entry is not None:
            entry.lent = True

    def free(self, name: str, offset: int, held: bool = True) -> None:
        """A slot is done with: queue it back to its worker, or finish a retired region."""
        entry = self._regions.get(name)
        if entry is None:
            return
        if entry.on_free is not None:
            entry.on_free(offset)
            return
        if held:
            entry.held -= 1
        if self._owners and (name, offset) in self._owners:
            self._drop_owner(entry, name, offset)
            return
        if entry.owner is not None:
            entry.pending_frees.append(Slot(name, offset))
        elif entry.held <= 0:
            self._destroy(name)

    def take_frees(self, name: str) -> list[Slot]:
        entry = self._regions.get(name)
        if entry is None or not entry.pending_frees:
            return []
        frees, entry.pending_frees = entry.pending_frees, []
        return frees

    def retire(self, name: str) -> None:
        """The owner is gone: unlink now if nothing is held, else when the last slot is freed."""
        entry = self._regions.get(name)
        if entry is None:
            return
        entry.owner = None
        entry.pending_frees.clear()
        if entry.held <= 0:
            self._destroy(name)

    def _drop_owner(self, entry: OutputRegion, name: str, offset: int) -> None:
        """One owner of a shared slot is done; the others still have it."""
        key = (name, offset)
        left = self._owners[key] - 1
        if left:
            self._owners[key] = left
        else:
            del self._owners[key]
        entry.held -= 1
        if entry.owner is None and entry.held <= 0:
            self._destroy(name)

    def _destroy(self, name: str) -> None:
        entry = self._regions.pop(name)
        entry.region.destroy()
        if self._owners:
            for key in [k for k in self._owners if k[0] == name]:
                del self._owners[key]
        if entry.lent:
            self.lent_gone(name)

    def close(self) -> None:
        for name in list(self._regions):
            self._destroy(name)

    def held(self) -> int:
        """Output slots still in use after their result was handled (zero-copy sends, leases)."""
        return sum(entry.held for entry in self._regions.values())

    def __len__(self) -> int:
        return len(self._regions)

    def __contains__(self, name: object) -> bool:
        """Whether output region ``name`` is still there (its worker may have died)."""
        return name in self._regions


def first_batch_bytes(config: Any) -> int | None:
    """The bytes of a full batch of a model's outputs; None if the config does not fix them
    (a variable dimension, a BYTES output)."""
    total = 0
    for out in config.output:
        itemsize = element_size(config_to_wire_datatype(pb.DataType.Name(out.data_type)))
        count = 1
        for d in out.dims:
            count *= d
        if itemsize == 0 or count < 0:
            return None
        total += itemsize * count
    return total * max(1, config.max_batch_size)
