"""How a work item names memory a client registered, so a worker can map it once.

The broker's own regions travel by their POSIX name (``inferpool-<run>-...``).  A region a
client registered travels as a reference that carries the registration's serial number:
the same key registered again (perhaps a new object under an old name) is a new
reference, so a worker never reads through a mapping of the object it replaced.

    sys/<serial>/<dev>.<inode>/<offset>/<byte size>/<key>
                                              a window of a POSIX object (a client's, or
                                              one the broker created for it)
    cuda/<serial>/<byte size>/<handle as hex>/<gpu>
                                              device memory exported with CUDA IPC, on the
                                              GPU whose CUDA_VISIBLE_DEVICES entry is <gpu>

A system reference carries the window the client registered, so a worker maps only that,
and the inode the broker checked, so a worker refuses an object swapped in under the name
since (``shm.window``).

A CUDA reference carries the registered byte size, which the worker that opens the handle
checks against the allocation, and the GPU the memory is on by its ``CUDA_VISIBLE_DEVICES``
entry (an index or a UUID), not by a device number: device numbers are per process, and a
worker narrowed to its own GPU numbers it 0 (``shm.cuda.ordinal_of``).
"""

from __future__ import annotations

from dataclasses import dataclass

from inferpool.shm.names import check_name

CUDA_IPC_HANDLE_SIZE = 64  # sizeof(cudaIpcMemHandle_t)


@dataclass(frozen=True, slots=True)
class RegionRef:
    """A region a work item names, parsed."""

    kind: str  # "posix" (the broker's own), "sys" or "cuda"
    name: str  # the POSIX name (no leading slash); "" for cuda
    byte_size: int = 0  # sys, cuda: the registered size
    handle: bytes = b""
    offset: int = 0  # sys: where the registered window starts in the object
    inode: tuple[int, int] = (0, 0)  # sys: (st_dev, st_ino) of the object the broker checked
    gpu: str = ""  # cuda: the GPU's CUDA_VISIBLE_DEVICES entry


def posix_name(key: str) -> str:
    """A POSIX shared-memory key as Triton clients write it ("/name") without its slash."""
    return key[1:] if key.startswith("/") else key


def system_ref(serial: int, key: str, inode: tuple[int, int], offset: int, byte_size: int) -> str:
    """The reference of a client's system shared-memory registration."""
    return f"sys/{serial}/{inode[0]}.{inode[1]}/{offset}/{byte_size}/{posix_name(key)}"


def cuda_ref(serial: int, byte_size: int, handle: bytes, gpu: str) -> str:
    """The reference of a client's CUDA shared-memory registration."""
    return f"cuda/{serial}/{byte_size}/{handle.hex()}/{gpu}"


def parse_ref(ref: str) -> RegionRef:
    """The reference a work item carries; ValueError if it is not one the broker makes."""
    if "/" not in ref:
        return RegionRef("posix", ref)
    kind, _, rest = ref.partition("/")
    if kind == "sys":
        parts = rest.split("/", 4)
        if len(parts) == 5 and all(p.isdigit() for p in parts[2:4]):
            dev, dot, ino = parts[1].partition(".")
            if dot and dev.isdigit() and ino.isdigit():
                size, offset = int(parts[3]), int(parts[2])
                return RegionRef(
                    "sys", check_name(parts[4]), size, b"", offset, (int(dev), int(ino))
                )
    elif kind == "cuda":
        parts = rest.split("/", 3)  # an old-style MIG entry has slashes of its own
        if len(parts) == 4 and parts[1].isdigit() and parts[3]:
            try:
                handle = bytes.fromhex(parts[2])
            except ValueError:
                handle = b""
            if len(handle) == CUDA_IPC_HANDLE_SIZE:
                return RegionRef("cuda", "", int(parts[1]), handle, gpu=parts[3])
    raise ValueError(f"not a region reference: {ref!r}")
