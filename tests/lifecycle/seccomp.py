"""Run a command where ``set_mempolicy`` fails with EPERM, as in a container whose seccomp
profile blocks NUMA calls (docker without CAP_SYS_NICE): a real pinning failure.

    python tests/lifecycle/seccomp.py PROGRAM ARG...

installs a seccomp filter (inherited by every child) and execs PROGRAM.  Only x86_64 and
aarch64 are known; ``ARCHES`` says which.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import sys

# machine -> (AUDIT_ARCH_*, set_mempolicy syscall number)
ARCHES = {"x86_64": (0xC000003E, 238), "aarch64": (0xC00000B7, 237)}
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
BPF_LD_W_ABS, BPF_JEQ_K, BPF_RET_K = 0x20, 0x15, 0x06
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000


def block_set_mempolicy() -> None:
    arch, nr = ARCHES[platform.machine()]
    program = [
        (BPF_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        (BPF_JEQ_K, 0, 3, arch),  # another architecture: allow
        (BPF_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
        (BPF_JEQ_K, 0, 1, nr),
        (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM),
        (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ]
    code = b"".join(struct.pack("HBBI", *insn) for insn in program)
    filters = ctypes.create_string_buffer(code, len(code))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(program), ctypes.addressof(filters))
    libc = ctypes.CDLL(None, use_errno=True)
    for args in (
        (PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0),
        (PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0),
    ):
        if libc.prctl(*(ctypes.c_ulong(a) for a in args)) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


if __name__ == "__main__":
    block_set_mempolicy()
    os.execv(sys.argv[1], sys.argv[1:])
