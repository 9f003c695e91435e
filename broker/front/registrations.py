"""Shared-memory regions clients registered (Triton's system and CUDA extensions).

Registrations belong to the client (zmq routing id) that made them: region names are per
client, so another client's name is NOT_FOUND.  Three kinds:

- ``system``: a POSIX object the client created and names by its key;
- ``created``: a 0600 region the broker creates for the client under this run's name (the
  shared-memory client's input region), unlinked when the registration ends;
- ``cuda``: device memory exported with a CUDA IPC handle.

Ending a registration never pulls memory from under a request in flight: the region is
retired only once every request admitted before the end has finished; then workers are
told to drop their mappings (piggybacked on their next message) and a created region is
unlinked.  Ending a CUDA registration is answered only once every worker that opened the
region has closed its mapping: each says when it opened one (``mapped``, before the results
of the requests that opened it, so the broker knows them all once those requests are done)
and confirms with ``unmapped``.  The client frees the memory next, and freeing device
memory another process still has mapped is undefined behaviour in CUDA; a worker that never
opened the region (busy elsewhere, say) holds nothing up.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from inferpool.broker.front.objects import check_object
from inferpool.broker.front.peers import Peer
from inferpool.shm.names import check_name
from inferpool.shm.refs import CUDA_IPC_HANDLE_SIZE, cuda_ref, posix_name, system_ref
from inferpool.shm.region import Region
from inferpool.shm.runs import PREFIX, SHM_DIR, region_name
from inferpool.wire.errors import Code, InferpoolError, invalid_arg, not_found

log = logging.getLogger("inferpool.shm")
Closed = Callable[[list[str]], None]  # called with the names of the ended registrations


@dataclass
class Registration:
    """One shared-memory region a client registered (or had the broker create)."""

    name: str
    kind: str  # "system", "created" or "cuda"
    key: str  # POSIX name without slash ("" for cuda)
    offset: int  # where the registered window starts in the object
    byte_size: int
    ref: str  # how work items name it (shm.refs)
    device_id: int = 0
    created: Region | None = None
    inode: tuple[int, int] = (0, 0)  # (st_dev, st_ino) of the object checked at registration
    principal: str = ""  # created: whose limit its bytes count against (Peer.principal)

    def status(self) -> dict[str, Any]:
        if self.kind == "cuda":
            return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}
        return {
            "name": self.name,
            "key": "/" + self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }


class Registrations:
    """The regions clients registered, by client: checked, counted against their limits, retired
    safely."""

    def __init__(
        self,
        run_id: str,
        max_created_bytes: int,
        max_total_bytes: int,
        prefault: bool,
        inflight: dict[int, Any],
        workers: Callable[[], list[str]],
        unmaps: dict[str, list[str]],
    ) -> None:
        self.run_id = run_id
        self.max_created_bytes = max_created_bytes  # per client process (tcp: host)
        self.max_total_bytes = max_total_bytes  # for every client together
        self.prefault = prefault
        self._created: dict[str, int] = {}  # server-made bytes by principal
        self._created_total = 0
        self._inflight = inflight  # rid -> request, in admission order
        self._workers = workers  # identities of the live workers
        self._unmaps = unmaps  # worker identity -> refs to drop with its next message
        self._by_owner: dict[bytes, dict[str, Registration]] = {}
        self._retiring: list[tuple[int, Registration]] = []
        self._openers: dict[str, set[str]] = {}  # registered CUDA ref -> workers that opened it
        self._mapped_in: dict[str, set[str]] = {}  # retired CUDA ref -> workers yet to close it
        self._waiters: list[tuple[set[str], list[str], Closed]] = []  # refs, names, callback
        self._serial = 0

    # ------------------------------------------------------------------ registering
    def register_system(
        self, owner: bytes, name: str, key: str, offset: int, size: int, peer: Peer
    ) -> None:
        """A window of object ``key``, if ``peer`` could open it itself (``front.objects``)."""
        self._check_free(owner, name)
        key = _posix_key(key)
        if key.startswith(PREFIX):
            raise invalid_arg(
                f"shared-memory key '/{key}' is reserved for the server's own regions; "
                "use create_shared_memory_region for a server-made region"
            )
        st = check_object(key, peer)
        if offset + size > st.st_size:
            raise invalid_arg(
                f"invalid offset + byte size for shared memory region '{name}': "
                f"{offset} + {size} exceeds the {st.st_size} bytes of '/{key}'"
            )
        reg = Registration(name, "system", key, offset, size, "", inode=(st.st_dev, st.st_ino))
        self._add(owner, reg)

    def create(self, owner: bytes, name: str, size: int, principal: str) -> Registration:
        """A region the broker makes for the client (mode 0600, named under this run); its
        bytes count against ``principal`` (every connection of a process alike)."""
        self._check_free(owner, name)
        self._check_room(principal, size, f"shared-memory region '{name}'")
        st = os.statvfs(SHM_DIR)
        if st.f_bavail * st.f_frsize < size * 2:
            raise InferpoolError(
                Code.UNAVAILABLE,
                f"not enough room in {SHM_DIR} for a region of {size} bytes "
                f"({st.f_bavail * st.f_frsize} bytes free)",
            )
        self._serial += 1
        region = Region.create(
            region_name(self.run_id, f"c{self._serial}"), size, prefault=self.prefault
        )
        region.close()  # the broker never touches the bytes; the name keeps the memory
        made = os.stat(os.path.join(SHM_DIR, region.name))
        inode = (made.st_dev, made.st_ino)
        reg = Registration(name, "created", region.name, 0, size, "", created=region)
        reg.inode, reg.principal = inode, principal
        self.charge(principal, size, "")
        self._add(owner, reg)
        return reg

    def charge(self, principal: str, size: int, what: str) -> None:
        """Count ``size`` bytes of a region the server made for ``principal`` (a lane's,
        say) against its limit and the server's; ``what``: the region, named in the error
        if a limit would be passed ("": the caller checked)."""
        if what:
            self._check_room(principal, size, what)
        self._created[principal] = self._created.get(principal, 0) + size
        self._created_total += size

    def refund(self, principal: str, size: int) -> None:
        """A region counted by ``charge`` is gone."""
        left = self._created.get(principal, 0) - size
        if left > 0:
            self._created[principal] = left
        else:
            self._created.pop(principal, None)
        self._created_total -= size

    def _check_room(self, principal: str, size: int, what: str) -> None:
        mine = self._created.get(principal, 0) + size
        if mine > self.max_created_bytes:
            raise invalid_arg(
                f"{what} of {size} bytes would bring the server-made regions of {principal} "
                f"to {mine} bytes, over the per-client limit of {self.max_created_bytes} "
                "(--max-client-shm)"
            )
        if self._created_total + size > self.max_total_bytes:
            raise InferpoolError(
                Code.UNAVAILABLE,
                f"{what} of {size} bytes would bring the server-made regions of all clients "
                f"to {self._created_total + size} bytes, over the server's limit of "
                f"{self.max_total_bytes} (--max-shm-total)",
            )

    def register_cuda(
        self,
        owner: bytes,
        name: str,
        handle: bytes,
        device_id: int,
        size: int,
        gpus: Sequence[str],
    ) -> None:
        """Device memory on GPU ``device_id`` of the server, whose GPUs have the
        ``CUDA_VISIBLE_DEVICES`` entries ``gpus``: the reference carries the entry, by which
        a worker finds the GPU in its own numbering."""
        self._check_free(owner, name)
        if device_id >= len(gpus):
            raise invalid_arg(
                f"failed to register CUDA shared memory region '{name}': device_id {device_id} "
                f"is not a GPU of this server, which has {len(gpus)}"
            )
        if len(handle) != CUDA_IPC_HANDLE_SIZE:
            raise invalid_arg(
                f"raw_handle of CUDA shared memory region '{name}' must be a "
                f"{CUDA_IPC_HANDLE_SIZE}-byte cudaIpcMemHandle_t, got {len(handle)} bytes"
            )
        self._serial += 1
        ref = cuda_ref(self._serial, size, handle, gpus[device_id])
        self._openers[ref] = set()
        self._add(owner, Registration(name, "cuda", "", 0, size, ref, device_id=device_id))

    def _check_free(self, owner: bytes, name: str) -> None:
        if name in self._by_owner.get(owner, {}):
            raise InferpoolError(
                Code.ALREADY_EXISTS, f"shared memory region '{name}' is already registered"
            )

    def _add(self, owner: bytes, reg: Registration) -> None:
        if not reg.ref:
            self._serial += 1
            reg.ref = system_ref(self._serial, reg.key, reg.inode, reg.offset, reg.byte_size)
        self._by_owner.setdefault(owner, {})[reg.name] = reg

    # ------------------------------------------------------------------ ending
    def unregister(
        self, owner: bytes, name: str, cuda: bool, closed: Closed | None = None
    ) -> list[str]:
        """End ``name`` (all of this client's regions of the kind when empty).  A name
        the client has no region of the kind under ends nothing and is no error, as in
        Triton (whose clients unregister a name before they register it).

        ``closed(names)`` is called once no worker maps the ended CUDA regions any more
        (at once when none does).
        """
        mine = self._by_owner.get(owner, {})
        if name:
            reg = mine.get(name)
            ended = [reg] if reg is not None and (reg.kind == "cuda") == cuda else []
        else:
            ended = [r for r in mine.values() if (r.kind == "cuda") == cuda]
        for reg in ended:
            del mine[reg.name]
            self._retire_later(reg)
        if not mine:
            self._by_owner.pop(owner, None)
        names = [r.name for r in ended]
        if closed is not None:
            self._waiters.append(({r.ref for r in ended if r.kind == "cuda"}, names, closed))
            self._settle()
        return names

    def drop_owner(self, owner: bytes) -> int:
        """The client is gone: end all its registrations."""
        mine = self._by_owner.pop(owner, {})
        for reg in mine.values():
            self._retire_later(reg)
        return len(mine)

    def _retire_later(self, reg: Registration) -> None:
        inflight = self._inflight
        newest = next(reversed(inflight)) if inflight else 0
        self._retiring.append((newest, reg))
        self.tick()

    def tick(self) -> None:
        """Retire regions no request admitted before their end can still be using."""
        if self._retiring:
            self._retire()
        if self._mapped_in:  # a worker that died has closed everything
            alive = set(self._workers())
            for ref, holders in list(self._mapped_in.items()):
                holders &= alive
                if not holders:
                    del self._mapped_in[ref]
        self._settle()

    def _retire(self) -> None:
        oldest = next(iter(self._inflight)) if self._inflight else None
        keep = []
        for newest, reg in self._retiring:
            if oldest is not None and oldest <= newest:
                keep.append((newest, reg))
                continue
            workers = self._workers()
            told = workers
            if reg.kind == "cuda":  # only the workers that opened it map it
                openers = self._openers.pop(reg.ref, set())
                told = [i for i in workers if i in openers]
                if told:
                    self._mapped_in[reg.ref] = set(told)
            for identity in told:
                self._unmaps.setdefault(identity, []).append(reg.ref)
            for identity in [i for i in self._unmaps if i not in workers]:
                del self._unmaps[identity]  # a worker that died needs no word
            self._destroy(reg)
        self._retiring = keep

    def _destroy(self, reg: Registration) -> None:
        """Unlink a server-made region; its bytes no longer count against anyone."""
        if reg.created is None:
            return
        reg.created.destroy()
        reg.created = None
        self.refund(reg.principal, reg.byte_size)

    def mapped(self, worker: str, refs: Sequence[str]) -> None:
        """``worker`` has opened the CUDA regions ``refs`` (its ``mapped`` message)."""
        for ref in refs:
            openers = self._openers.get(ref)
            if openers is not None:
                openers.add(worker)
                continue
            # already retired (no request can name it now): it must not keep it
            self._unmaps.setdefault(worker, []).append(ref)
            holders = self._mapped_in.get(ref)
            if holders is not None:
                holders.add(worker)

    def unmapped(self, worker: str, refs: Sequence[str]) -> None:
        """``worker`` has closed its mappings of ``refs`` (its ``unmapped`` message)."""
        for ref in refs:
            holders = self._mapped_in.get(ref)
            if holders is not None:
                holders.discard(worker)
                if not holders:
                    del self._mapped_in[ref]
        self._settle()

    def _settle(self) -> None:
        """Call back the unregisters none of whose CUDA regions is mapped any more."""
        if not self._waiters:
            return
        busy = set(self._mapped_in).union(reg.ref for _, reg in self._retiring)
        done = [w for w in self._waiters if not w[0] & busy]
        self._waiters = [w for w in self._waiters if w[0] & busy]
        for _, names, closed in done:
            closed(names)

    def close(self) -> None:
        for mine in self._by_owner.values():
            for reg in mine.values():
                self._destroy(reg)
        for _, reg in self._retiring:
            self._destroy(reg)
        self._by_owner.clear()
        self._retiring = []
        self._openers.clear()
        self._mapped_in.clear()
        self._waiters = []

    # ------------------------------------------------------------------ looking up
    def _mine(self, owner: bytes) -> list[Registration]:
        return list(self._by_owner.get(owner, {}).values())

    def created(self, owner: bytes, name: str) -> Registration | None:
        """``owner``'s server-made region ``name``, if it has one."""
        reg = self._by_owner.get(owner, {}).get(name)
        return reg if reg is not None and reg.kind == "created" else None

    def status(self, owner: bytes, name: str, cuda: bool) -> list[dict[str, Any]]:
        mine = [r for r in self._mine(owner) if (r.kind == "cuda") == cuda]
        if name:
            mine = [r for r in mine if r.name == name]
            if not mine:
                raise not_found(_unknown(name, cuda))
        return [r.status() for r in mine]

    def window(
        self, owner: bytes, kind: str, tensor: str, params: dict[str, Any], nbytes: int | None
    ) -> tuple[Registration, int, int]:
        """(registration, absolute offset, byte size) of ``kind`` ``tensor``'s window."""
        name = params.get("shared_memory_region")
        mine = self._by_owner.get(owner)
        reg = mine.get(name) if mine is not None and type(name) is str else None
        if reg is None:
            raise not_found(f"unable to find shared memory region: '{name}' for {kind} '{tensor}'")
        offset = params.get("shared_memory_offset", 0)
        size = params.get("shared_memory_byte_size")
        if type(offset) is not int or offset < 0 or type(size) is not int or size < 0:
            raise invalid_arg(
                f"{kind} '{tensor}': shared_memory_offset and shared_memory_byte_size must be "
                f"non-negative integers, got {offset!r} and {size!r}"
            )
        if nbytes is not None and size != nbytes:
            raise invalid_arg(
                f"{kind} '{tensor}': shared_memory_byte_size is {size}, but its datatype and "
                f"shape make {nbytes} bytes"
            )
        if offset + size > reg.byte_size:
            raise invalid_arg(
                f"{kind} '{tensor}': shared-memory window [{offset}, {offset + size}) is "
                f"outside region '{name}' of {reg.byte_size} bytes"
            )
        return reg, reg.offset + offset, size

    def __len__(self) -> int:
        return sum(len(m) for m in self._by_owner.values())


def _unknown(name: str, cuda: bool) -> str:
    kind = "CUDA" if cuda else "system"
    return f"unable to find {kind} shared memory region: '{name}'"


def _posix_key(key: str) -> str:
    """The client's key without its slash, if it can name an object; INVALID_ARG naming it."""
    try:
        return check_name(posix_name(key))
    except ValueError as exc:
        raise invalid_arg(f"shared-memory key {key!r} is not a valid POSIX name: {exc}") from None
