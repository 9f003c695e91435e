"""The GPU memory-fraction check a GPU instance's worker runs after its model loaded.

Triton checks *after* creating the instance (backend_model_instance.cc), so the limit holds
for what the load really took; "used" is the device's, over every process (total - free).
Device memory is read through the CUDA API the backend already uses (cupy if it is loaded,
else torch), so the check adds no CUDA context of its own to a backend that has one.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from inferpool.wire.errors import Code, InferpoolError

MemInfo = Callable[[int], tuple[int, int]]  # CUDA ordinal -> (free, total) bytes


def device_memory(ordinal: int) -> tuple[int, int]:
    """(free, total) bytes of CUDA device ``ordinal`` in this process."""
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        with cupy.cuda.Device(ordinal):
            free, total = cupy.cuda.runtime.memGetInfo()
        return int(free), int(total)
    import torch

    free, total = torch.cuda.mem_get_info(ordinal)
    return int(free), int(total)


def check_load_limit(
    model: str,
    device_id: int,
    ordinal: int,
    fraction: float,
    mem_info: MemInfo = device_memory,
) -> None:
    """Raise UNAVAILABLE, in Triton's words, if device memory in use exceeds ``fraction``."""
    if fraction >= 1.0:
        return
    try:
        free, total = mem_info(ordinal)
    except Exception as exc:  # no CUDA, no driver: the limit cannot be honoured
        raise InferpoolError(
            Code.UNAVAILABLE,
            f"can not create model '{model}': cannot read the memory of GPU {device_id} to "
            f"check --model-load-gpu-limit ({type(exc).__name__}: {exc})",
        ) from None
    used, allow = total - free, int(total * fraction)
    if used > allow:
        raise InferpoolError(
            Code.UNAVAILABLE,
            f"can not create model '{model}': memory limit set for KIND_GPU {device_id} has "
            f"exceeded, model loading is rejected ({used / 2**20:.0f} MiB of "
            f"{total / 2**20:.0f} MiB in use, limit {fraction:g})",
        )
