"""The response cache: ``response_cache { enable: true }`` with a server-wide ``--cache-size``.

A request to a model whose config enables the cache is looked up before it is queued: a hit
is answered from the cache without running anything, a miss runs and its response is stored
when it succeeds.  The key is a BLAKE2b digest of the model version, every input (name,
datatype, shape, bytes), the requested outputs and the request parameters a backend sees,
so two requests share an answer only if nothing a model can read differs (Triton's key has
the model, version and input names and bytes).

Cached outputs live in shared memory the broker owns (``inferpool-<run>-cache``, an arena
of ``--cache-size`` bytes) and reach the client as any worker's outputs do, through the
broker's output regions: copied into the reply or sent from it without a copy, or held
under an output handle's lease.  Every use of an entry pins it until that output is freed;
the least recently used unpinned entries make room for a new one.

What is not cached, as Triton: decoupled models and requests of a sequence.  And, because
the broker never reads a client's shared memory: requests with an input in a client's
region, or an output to be written into one.  Those run as if the cache were off.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import orjson

from inferpool.broker.models.registry import ModelVersion
from inferpool.broker.models.request import PendingRequest
from inferpool.broker.pool.output_regions import OutputRegions
from inferpool.shm.arena import Arena, ArenaFull, Slot
from inferpool.shm.region import Region, ShmExhausted
from inferpool.shm.runs import region_name
from inferpool.wire.worker.protocol import Result, TensorRef


@dataclass(eq=False)
class Entry:
    """One cached response: its outputs in the cache region and who uses them."""

    model: ModelVersion  # held so that its id (part of the key) is not reused
    outputs: list[TensorRef]  # in the cache region
    parameters: dict[str, Any] | None
    nbytes: int
    pins: int = 0  # outputs handed out and not yet freed
    slots: list[Slot] = field(default_factory=list)


class ResponseCache:
    """Triton's response cache: answers of models with ``response_cache`` kept in a region of their
    own."""

    def __init__(self, storage: Arena, inputs: Arena, outputs: OutputRegions, replies: Any) -> None:
        """``storage``: the cache's own arena; ``inputs``: the request arena (a request's
        bytes are hashed there); ``outputs``: the broker's output regions, where results are
        read from and where ``storage`` is registered; ``replies``: the front's responder."""
        self.storage = storage
        self.inputs = inputs
        self.outputs = outputs
        self.replies = replies
        self.entries: OrderedDict[bytes, Entry] = OrderedDict()
        self._by_offset: dict[int, Entry] = {}
        self.used = 0  # bytes of output data held
        self.lookups = self.hits = self.misses = self.evictions = 0
        outputs.add_external(storage.name, storage.region, self.freed)

    @classmethod
    def create(
        cls,
        run_id: str,
        size: int,
        prefault: int,
        inputs: Arena,
        outputs: OutputRegions,
        replies: Any,
    ) -> ResponseCache:
        """A cache of ``size`` bytes in a region of the run (destroyed with ``outputs``),
        populated as entries reach it (at most ``prefault`` bytes at once)."""
        region = Region.create(region_name(run_id, "cache"), size, prefault=False)
        storage = Arena(region, prefault=min(prefault, size))
        return cls(storage, inputs, outputs, replies)

    @staticmethod
    def enabled_for(model: ModelVersion) -> bool:
        return bool(model.config.response_cache.enable) and not model.decoupled

    # ------------------------------------------------------------------ requests
    def answer(self, req: PendingRequest) -> bool:
        """Answer ``req`` from the cache if it is there (True); else mark it to be stored."""
        start = time.monotonic_ns()
        key = self.key(req)
        if key is None:
            return False
        self.lookups += 1
        entry = self.entries.get(key)
        if entry is None:
            req.cache_key = key
            req.cache_ns = time.monotonic_ns() - start
            return False
        self.hits += 1
        self.entries.move_to_end(key)
        entry.pins += len(entry.outputs)
        for slot in req.slots:  # the request ends here: its inputs are not needed
            self.inputs.free(slot)
        req.slots = []
        parameters = dict(entry.parameters) if entry.parameters else None
        self.replies.result(req, Result(req.rid, True, entry.outputs, parameters))
        end = time.monotonic_ns()
        req.model.stats.cache_hit_done(end - req.received_ns, start - req.received_ns, end - start)
        return True

    def store(self, req: PendingRequest, item: Result) -> None:
        """Keep the successful final response of a request that missed (before it is sent)."""
        if not item.final or item.error is not None:
            return
        start = time.monotonic_ns()
        key = req.cache_key
        if key is not None and key not in self.entries:
            self._insert(key, req.model, item)
        self.misses += 1
        req.model.stats.cache_miss_done(req.cache_ns + time.monotonic_ns() - start)

    def key(self, req: PendingRequest) -> bytes | None:
        """The request's key, or None if it cannot be cached."""
        model = req.model
        work = req.work
        if work.correlation_id or not self.enabled_for(model):
            return None
        arena = self.inputs.name
        buf = self.inputs.region.buf
        digest = hashlib.blake2b(f"{id(model)}\0{model.name}\0{model.version}".encode())
        for ref in sorted(work.inputs, key=lambda r: r.name):
            if ref.region != arena:  # in a client's region: not read by the broker
                return None
            shape = ",".join(map(str, ref.shape))
            digest.update(f"\0i{ref.name}\0{ref.datatype}\0{shape}\0{ref.byte_size}\0".encode())
            digest.update(buf[ref.offset : ref.offset + ref.byte_size])
        for out in sorted(work.outputs):
            if out.window is not None:  # to be written into a client's region
                return None
            digest.update(f"\0o{out.name}".encode())
        if work.parameters:
            digest.update(b"\0p" + orjson.dumps(work.parameters, option=orjson.OPT_SORT_KEYS))
        return digest.digest()

    # ------------------------------------------------------------------ storage
    def _insert(self, key: bytes, model: ModelVersion, item: Result) -> None:
        outputs: list[TensorRef] = []
        slots: list[Slot] = []
        for out in item.outputs:
            slot = self._alloc(out.byte_size)
            if slot is None:
                for taken in slots:
                    self.storage.free(taken)
                return
            slots.append(slot)
            if out.byte_size:
                self.storage.view(slot)[:] = self.outputs.view(
                    out.region, out.offset, out.byte_size
                )
            outputs.append(
                TensorRef(out.name, out.datatype, out.shape, slot.region, slot.offset, slot.nbytes)
            )
        entry = Entry(model, outputs, item.parameters, sum(s.nbytes for s in slots), 0, slots)
        self.entries[key] = entry
        for slot in slots:
            self._by_offset[slot.offset] = entry
        self.used += entry.nbytes

    def _alloc(self, nbytes: int) -> Slot | None:
        """A slot of the cache, evicting the least recently used unpinned entries for it."""
        while True:
            try:
                return self.storage.alloc(nbytes)
            except ShmExhausted:  # /dev/shm is full: this response is not cached
                return None
            except ArenaFull:
                victim = next((k for k, e in self.entries.items() if not e.pins), None)
                if victim is None:
                    return None
                self._evict(victim)

    def _evict(self, key: bytes) -> None:
        entry = self.entries.pop(key)
        for slot in entry.slots:
            del self._by_offset[slot.offset]
            self.storage.free(slot)
        self.used -= entry.nbytes
        self.evictions += 1

    def freed(self, offset: int) -> None:
        """An output served from the cache is done with (sent, or its lease released)."""
        entry = self._by_offset.get(offset)
        if entry is not None:
            entry.pins -= 1

    # ------------------------------------------------------------------ reporting
    def utilization(self) -> float:
        return self.used / self.storage.size

    def summary(self) -> dict[str, Any]:
        return {
            "size": self.storage.size,
            "used": self.used,
            "entries": len(self.entries),
            "lookups": self.lookups,
            "hits": self.hits,
            "misses": self.misses,
            "evictions": self.evictions,
        }
