"""How a work item names memory a client registered, so a worker can map it once.

The broker's own regions travel by their POSIX name (``inferpool-<run>-...``).  A region a
client registered travels as a reference that carries the registration's serial number:
the same key registered again (perhaps a new object under an old name) is a new
reference, so a worker never reads through a mapping of the object it replaced.

    sys/<serial>/<key>                        a POSIX object the client created
    cuda/<serial>/<byte size>/<handle as hex> device memory exported with CUDA IPC

A CUDA reference carries the registered byte size, which the worker that opens the handle
checks against the allocation, and no device number: the client's device numbers are not
the worker's.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferpool.shm.names import check_name

CUDA_IPC_HANDLE_SIZE = 64  # sizeof(cudaIpcMemHandle_t)


@dataclass(frozen=True, slots=True)
class RegionRef:
    kind: str  # "posix" (the broker's own), "sys" or "cuda"
    name: str  # the POSIX name (no leading slash); "" for cuda
    byte_size: int = 0  # cuda: the registered size
    handle: bytes = b""


def posix_name(key: str) -> str:
    """A POSIX shared-memory key as Triton clients write it ("/name") without its slash."""
    return key[1:] if key.startswith("/") else key


def system_ref(serial: int, key: str) -> str:
    return f"sys/{serial}/{posix_name(key)}"


def cuda_ref(serial: int, byte_size: int, handle: bytes) -> str:
    return f"cuda/{serial}/{byte_size}/{handle.hex()}"


def parse_ref(ref: str) -> RegionRef:
    """The reference a work item carries; ValueError if it is not one the broker makes."""
    if "/" not in ref:
        return RegionRef("posix", ref)
    kind, _, rest = ref.partition("/")
    if kind == "sys":
        _serial, sep, key = rest.partition("/")
        if sep and key and "/" not in key:
            return RegionRef("sys", check_name(key))
    elif kind == "cuda":
        parts = rest.split("/")
        if len(parts) == 3 and parts[1].isdigit():
            handle = bytes.fromhex(parts[2])
            if len(handle) == CUDA_IPC_HANDLE_SIZE:
                return RegionRef("cuda", "", int(parts[1]), handle)
    raise ValueError(f"not a region reference: {ref!r}")
