"""Tie a worker's life to the broker's: the kernel signals the worker when its parent dies.

``prctl(PR_SET_PDEATHSIG)`` through ctypes (stdlib only, like pinning: it runs first).  The
signal fires when the *thread* that started this process exits, so the broker must spawn
workers from a thread that lives as long as it does (its main loop).
"""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int = signal.SIGTERM, parent_pid: int | None = None) -> bool:
    """Ask for ``sig`` when the parent dies; False if it already has (or is not ``parent_pid``).

    Check the result: a parent that died before the call sends nothing, and this process has
    been re-parented (to init or a subreaper), so the caller should exit at once.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(int(sig)), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG, {int(sig)}) failed: {os.strerror(err)}")
    ppid = os.getppid()
    return ppid != 1 and (parent_pid is None or ppid == parent_pid)
