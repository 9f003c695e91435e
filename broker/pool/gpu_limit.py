"""``--model-load-gpu-limit DEVICE:FRACTION``, Triton's GPU memory-fraction check at load.

The broker parses and validates the flag; each GPU instance's worker gets the fraction of
its device and checks it after the instance loaded (``workers/gpu_memory_check.py``), as Triton's
``VerifyModelLoadGpuFraction`` does: an instance whose load leaves the device more used than
the fraction is rejected with UNAVAILABLE, so memory stays free for other work.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from inferpool.broker.pool.topology import Topology
from inferpool.wire.errors import invalid_arg

NO_LIMIT = 1.0


def parse_gpu_limits(texts: Iterable[str]) -> dict[int, float]:
    """``["0:0.5", "1:0.8"]`` -> ``{0: 0.5, 1: 0.8}`` (a repeated device: the last wins)."""
    limits: dict[int, float] = {}
    for text in texts:
        flag = f"--model-load-gpu-limit={text}"
        device, sep, fraction = text.partition(":")
        if not sep or not device.strip().isdigit():
            raise invalid_arg(f"{flag}: expected DEVICE:FRACTION, e.g. 0:0.8")
        try:
            value = float(fraction)
        except ValueError:
            raise invalid_arg(f"{flag}: '{fraction}' is not a number between 0 and 1") from None
        if not 0.0 < value <= 1.0:
            raise invalid_arg(f"{flag}: the fraction must be more than 0 and at most 1")
        limits[int(device)] = value
    return limits


def check_gpu_limits(limits: Mapping[int, float], topology: Topology) -> None:
    """Every device named must be a GPU this broker can place instances on."""
    for device, fraction in limits.items():
        if device >= len(topology.gpus):
            have = ", ".join(str(i) for i in range(len(topology.gpus))) or "none"
            raise invalid_arg(
                f"--model-load-gpu-limit={device}:{fraction:g}: this machine has no GPU "
                f"{device} (GPUs: {have})"
            )


def limit_for(limits: Mapping[int, float], kind: str, device_id: int) -> float:
    """The fraction a worker checks: only GPU instances are limited."""
    return limits.get(device_id, NO_LIMIT) if kind == "GPU" else NO_LIMIT
