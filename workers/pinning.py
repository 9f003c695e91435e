"""Apply a worker's placement to this process, before torch or numpy are imported.

Runs first in the worker, so it imports only the stdlib and ctypes: the CPU affinity,
memory policy and thread-count variables must be in place before a heavy import starts
threads or allocates its arenas (both inherit the policy only from then on).

NUMA memory policy goes through the ``set_mempolicy``/``get_mempolicy`` system calls via
libc's ``syscall()`` and ctypes, not through libnuma.so.1: libnuma's functions of the same
names are one-line wrappers over these calls, and libnuma is a package slim images lack,
so the syscalls work everywhere libc does.  The syscall numbers are per architecture; on an
architecture not in the table libnuma's wrappers are used if it is installed.  Like Triton
(numa_utils.cc), a node is bound with ``MPOL_BIND`` and a one-node mask.

The policy holds for the calling thread and the threads it starts later: call
:func:`apply` before starting any thread.  Affinity is set on every thread that exists.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
import sys
from dataclasses import dataclass, field
from typing import Any

from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.worker.spec import PinningSpec

MPOL_DEFAULT, MPOL_PREFERRED, MPOL_BIND, MPOL_INTERLEAVE = 0, 1, 2, 3
_MODE_NAMES = {
    0: "default",
    1: "preferred",
    2: "bind",
    3: "interleave",
    4: "local",
    5: "preferred_many",
    6: "weighted_interleave",
}
_MODES = {"bind": MPOL_BIND, "preferred": MPOL_PREFERRED, "interleave": MPOL_INTERLEAVE}
_MODE_FLAGS = (1 << 15) | (1 << 14) | (1 << 13)  # MPOL_F_STATIC/RELATIVE_NODES, NUMA_BALANCING
# (set_mempolicy, get_mempolicy) syscall numbers
_SYSCALLS = {
    "x86_64": (238, 239),
    "aarch64": (237, 236),
    "ppc64le": (261, 260),
    "s390x": (270, 269),
}
NODEMASK_BITS = 1024  # MAX_NUMNODES on distribution kernels (Mems_allowed has 1024 bits)
_ULONG_BITS = ctypes.sizeof(ctypes.c_ulong) * 8
_NodeMask = ctypes.c_ulong * (NODEMASK_BITS // _ULONG_BITS)
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@dataclass(frozen=True)
class AppliedPinning:
    """What :func:`apply` did; the backend reads ``torch_threads`` and ``device``."""

    cpus: tuple[int, ...]  # the affinity now in force
    mempolicy: str  # "default", "bind", "preferred" or "interleave"
    numa_nodes: tuple[int, ...]
    cuda_visible_devices: str | None
    torch_threads: int  # 0: leave torch's default
    warnings: tuple[str, ...] = field(default_factory=tuple)

    def device(self, device_id: int) -> int:
        """The CUDA ordinal in this process for Triton ``device_id`` (0 once narrowed)."""
        return cuda_ordinal(device_id, self.cuda_visible_devices)


def cuda_ordinal(device_id: int, cuda_visible_devices: str | None) -> int:
    """Triton ``device_id`` as a CUDA ordinal: a GPU instance's worker sees only its device."""
    return 0 if cuda_visible_devices else device_id


def _fail(policy: str, what: str) -> InferpoolError:
    label = f"host policy '{policy}'" if policy else "the pinning"
    return InferpoolError(Code.UNAVAILABLE, f"cannot apply {label}: {what}")


def _cpu_list(text: str) -> list[int]:
    """The kernel's cpulist format (``0-3,5``); the broker has its own copy (no imports across)."""
    out: list[int] = []
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _status_field(name: str) -> str:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split(":", 1)[1].strip()
    return ""


def _mempolicy_calls() -> tuple[Any, Any]:
    """(set_mempolicy(mode, mask, maxnode), get_mempolicy(mode*, mask, maxnode, addr, flags))."""
    nums = _SYSCALLS.get(platform.machine())
    if nums is not None:
        libc = ctypes.CDLL(None, use_errno=True)
        set_nr, get_nr = nums

        def set_(mode: int, mask: Any, maxnode: int) -> int:
            return int(
                libc.syscall(
                    ctypes.c_long(set_nr), ctypes.c_int(mode), mask, ctypes.c_ulong(maxnode)
                )
            )

        def get_(mode: Any, mask: Any, maxnode: int) -> int:
            return int(
                libc.syscall(
                    ctypes.c_long(get_nr),
                    mode,
                    mask,
                    ctypes.c_ulong(maxnode),
                    None,
                    ctypes.c_ulong(0),
                )
            )

        return set_, get_
    name = ctypes.util.find_library("numa") or "libnuma.so.1"
    try:
        numa = ctypes.CDLL(name, use_errno=True)
    except OSError:
        raise OSError(
            f"no set_mempolicy syscall number for {platform.machine()} and no "
            "libnuma.so.1 to call instead"
        ) from None
    return (
        lambda mode, mask, maxnode: int(numa.set_mempolicy(mode, mask, ctypes.c_ulong(maxnode))),
        lambda mode, mask, maxnode: int(
            numa.get_mempolicy(mode, mask, ctypes.c_ulong(maxnode), None, ctypes.c_ulong(0))
        ),
    )


def _online_nodes() -> list[int]:
    try:
        with open("/sys/devices/system/node/online") as f:
            return _cpu_list(f.read())
    except OSError:
        return [0]


def _set_affinity(cpus: list[int], policy: str) -> None:
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:
            continue  # the thread ended meanwhile
        except OSError as exc:
            allowed = _status_field("Cpus_allowed_list") or "unknown"
            raise _fail(
                policy,
                f"sched_setaffinity to cores {cpus} failed ({exc.strerror}); "
                f"this process may use cores {allowed} (a cpuset or taskset limits "
                "it)",
            ) from None


def _set_mempolicy(mode_name: str, node: int | None, policy: str) -> None:
    if mode_name not in _MODES:
        raise _fail(
            policy,
            f"mempolicy '{mode_name}' is not one of: bind, preferred, "
            "interleave (or empty to leave it)",
        )
    if node is None and mode_name != "interleave":
        raise _fail(policy, f"mempolicy '{mode_name}' needs a numa_node")
    nodes = [node] if node is not None else _online_nodes()
    if any(not 0 <= n < NODEMASK_BITS for n in nodes):
        raise _fail(policy, f"NUMA node {node} is out of range (0-{NODEMASK_BITS - 1})")
    mask = _NodeMask()
    for n in nodes:
        mask[n // _ULONG_BITS] |= 1 << (n % _ULONG_BITS)
    try:
        set_, _ = _mempolicy_calls()
    except OSError as exc:
        raise _fail(policy, str(exc)) from None
    # The kernel reads maxnode - 1 bits (as numactl, pass one more than the mask holds).
    if set_(_MODES[mode_name], mask, NODEMASK_BITS + 1) != 0:
        err = ctypes.get_errno()
        if err in (errno.EPERM, errno.ENOSYS):
            hint = (
                "; a container's seccomp profile blocks NUMA calls unless it has "
                "CAP_SYS_NICE (docker run --cap-add SYS_NICE), or drop numa-node"
            )
        else:
            hint = (
                f"; nodes this process may use: {_status_field('Mems_allowed_list')}, "
                f"online: {','.join(map(str, _online_nodes()))}"
            )
        raise _fail(
            policy, f"set_mempolicy({mode_name}, node {node}) failed: {os.strerror(err)}{hint}"
        )


def apply(pinning: PinningSpec, *, policy: str = "") -> AppliedPinning:
    """Pin this process as ``pinning`` says; ``policy`` names the host policy in errors.

    Sets CPU affinity, the NUMA memory policy, ``CUDA_VISIBLE_DEVICES`` and the OpenMP/MKL/
    OpenBLAS thread counts (``threads``, else the number of pinned cores; torch's too, if a
    zygote imported it before this process was forked).  Raises
    UNAVAILABLE naming the policy when the machine refuses.
    """
    warnings: list[str] = []
    cpus = sorted(set(pinning.cpus))
    if cpus:
        _set_affinity(cpus, policy)
    if pinning.mempolicy:
        try:
            ntasks = len(os.listdir("/proc/self/task"))
        except OSError:
            ntasks = 1
        if ntasks > 1:
            warnings.append(
                f"memory policy set with {ntasks} threads running; only this "
                "thread and the ones it starts follow it"
            )
        _set_mempolicy(pinning.mempolicy, pinning.numa_node, policy)
    elif pinning.numa_node is not None:
        warnings.append(f"numa_node {pinning.numa_node} given without a mempolicy: ignored")
    if pinning.cuda_visible_devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = pinning.cuda_visible_devices
    threads = pinning.threads if pinning.threads > 0 else len(cpus)
    if threads > 0:
        for var in THREAD_ENV:
            os.environ[var] = str(threads)
        torch = sys.modules.get("torch")  # a zygote imported it: it read the variables then
        if torch is not None:
            torch.set_num_threads(threads)
    back = read_back()
    return AppliedPinning(
        cpus=tuple(back["cpus"]),
        mempolicy=back["mempolicy"],
        numa_nodes=tuple(back["numa_nodes"]),
        cuda_visible_devices=back["cuda_visible_devices"],
        torch_threads=threads,
        warnings=tuple(warnings),
    )


def read_back() -> dict[str, Any]:
    """The placement actually in force, read from the kernel (for status and tests)."""
    mode = ctypes.c_int(-1)
    mask = _NodeMask()
    mempolicy, error = "unknown", None
    nodes: list[int] = []
    try:
        _, get_ = _mempolicy_calls()
        if get_(ctypes.byref(mode), mask, NODEMASK_BITS) == 0:
            mempolicy = _MODE_NAMES.get(mode.value & ~_MODE_FLAGS, str(mode.value))
            nodes = [
                i for i in range(NODEMASK_BITS) if mask[i // _ULONG_BITS] >> (i % _ULONG_BITS) & 1
            ]
        else:
            error = os.strerror(ctypes.get_errno())
    except OSError as exc:
        error = str(exc)
    return {
        "cpus": _cpu_list(_status_field("Cpus_allowed_list")),
        "mempolicy": mempolicy,
        "numa_nodes": nodes,  # the policy's nodemask (empty for default)
        "mems_allowed": _cpu_list(_status_field("Mems_allowed_list")),
        "mempolicy_error": error,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "threads_env": {v: os.environ[v] for v in THREAD_ENV if v in os.environ},
    }
