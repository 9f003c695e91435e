"""The machine as the broker sees it: its cores, NUMA nodes and GPUs.

Read from sysfs and the broker's own affinity, and GPUs counted without importing CUDA
(torch or cupy in the broker would cost seconds and a CUDA context nobody uses), so
placement (``broker/pool/placement.py``) stays plain data over plain data.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


def parse_cpu_list(text: str) -> list[int]:
    """``"0-3,5"`` -> ``[0, 1, 2, 3, 5]`` (the kernel's cpulist format); ValueError if malformed."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if m is None:
            raise ValueError(f"'{part}' is not a core number or a range like 0-3")
        lo, hi = int(m[1]), int(m[2] if m[2] is not None else m[1])
        if hi < lo:
            raise ValueError(f"range '{part}' runs backwards")
        cpus.update(range(lo, hi + 1))
    return sorted(cpus)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 5]`` -> ``"0-3,5"``; ``"none"`` when empty."""
    ranges: list[list[int]] = []
    for c in sorted(set(cpus)):
        if ranges and c == ranges[-1][1] + 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in ranges) or "none"


@dataclass(frozen=True)
class Topology:
    """The cores, NUMA nodes and GPUs this broker may place instances on.

    ``cpus`` are the cores of the broker's cgroup cpuset (else every online core), not
    the broker's own affinity: an operator may pin the broker to one core and its workers
    to others;
    ``nodes`` maps each NUMA node to its cores among ``cpus``; ``gpus`` holds, per CUDA
    ordinal, the token that selects that GPU in ``CUDA_VISIBLE_DEVICES`` (the broker's own
    ``CUDA_VISIBLE_DEVICES`` entries when set, so a worker sees the device the broker means).
    """

    cpus: tuple[int, ...]
    nodes: Mapping[int, tuple[int, ...]]
    gpus: tuple[str, ...] = ()

    @classmethod
    def discover(cls) -> Topology:
        cpus = allowed_cpus()
        nodes: dict[int, tuple[int, ...]] = {}
        for path in glob.glob("/sys/devices/system/node/node[0-9]*/cpulist"):
            node = int(path.split("/")[-2][4:])
            try:
                with open(path) as f:
                    node_cpus = parse_cpu_list(f.read())
            except (OSError, ValueError):
                continue
            nodes[node] = tuple(c for c in node_cpus if c in cpus)
        if not nodes:  # no NUMA support in the kernel (or no sysfs): one node holds all
            nodes = {0: cpus}
        return cls(cpus=cpus, nodes=dict(sorted(nodes.items())), gpus=discover_gpus())


def allowed_cpus() -> tuple[int, ...]:
    """Cores this process's cgroup may use (cgroup v2 cpuset), else the online cores."""
    candidates = []
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    rel = line.strip()[3:].lstrip("/")
                    candidates.append(os.path.join("/sys/fs/cgroup", rel, "cpuset.cpus.effective"))
    except OSError:
        pass
    candidates.append("/sys/devices/system/cpu/online")
    for path in candidates:
        try:
            with open(path) as f:
                cpus = parse_cpu_list(f.read())
        except (OSError, ValueError):
            continue
        if cpus:
            return tuple(sorted(cpus))
    return tuple(sorted(os.sched_getaffinity(0)))


def discover_gpus(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """``CUDA_VISIBLE_DEVICES`` tokens per CUDA ordinal of this process, without CUDA."""
    env = os.environ if environ is None else environ
    return visible_gpus(count_gpus(), env.get("CUDA_VISIBLE_DEVICES"))


def count_gpus() -> int:
    """Whole GPUs per ``nvidia-smi -L`` (MIG lines are indented), else per
    /proc/driver/nvidia/gpus; 0 when the NVIDIA driver is absent."""
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        try:
            out = subprocess.run(
                [smi, "-L"], capture_output=True, text=True, timeout=10, check=True
            ).stdout
            count = sum(1 for line in out.splitlines() if line.startswith("GPU "))
            if count:
                return count
        except (OSError, subprocess.SubprocessError):
            pass
    return len(glob.glob("/proc/driver/nvidia/gpus/*"))


def visible_gpus(count: int, visible: str | None) -> tuple[str, ...]:
    """The devices a process sees among ``count`` GPUs under ``CUDA_VISIBLE_DEVICES=visible``.

    As CUDA reads it: unset shows all; entries (indices, ``GPU-<uuid>``, ``MIG-<uuid>``) are
    taken in order up to the first invalid index, so ``-1`` or an empty value hides all.
    """
    if count <= 0:
        return ()
    if visible is None:
        return tuple(str(i) for i in range(count))
    valid: list[str] = []
    for t in (t.strip() for t in visible.split(",")):
        if not t or (t.lstrip("-").isdigit() and not 0 <= int(t) < count):
            break
        valid.append(t)
    return tuple(valid)
