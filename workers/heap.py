"""Keep the memory a model frees for its next request (glibc malloc), instead of paying a page
fault per 4 KiB to get it back from the kernel every time.

glibc serves a block above its mmap threshold with a fresh mmap and hands the heap's free top
back to the kernel once it exceeds the trim threshold; both thresholds follow the largest
block seen (1 MiB arrays move them to 1 and 2 MiB).  A model that makes a few megabytes of
temporaries per request (``(x - 0.5) * 2.0`` on a 1 MiB array makes two) then frees them
past the trim threshold, and every request faults them in again: about a millisecond per
2 MiB here, several times the arithmetic.  A worker runs one model for its whole life, so it
sets the thresholds once: blocks up to 32 MiB (glibc's ceiling) come from the heap, and up to
:data:`TRIM_BYTES` of freed memory stays mapped for the next request.

A threshold given in the environment (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``
or ``GLIBC_TUNABLES``) is the operator's choice and is left alone, as is a libc without
``mallopt`` (musl).
"""

from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD = -1  # malloc.h
M_MMAP_THRESHOLD = -3
MMAP_BYTES = 32 << 20  # glibc refuses more (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_BYTES = 64 << 20
OPERATOR_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def keep_freed_memory() -> bool:
    """Set this process's malloc thresholds; whether they were set."""
    if any(name in os.environ for name in OPERATOR_ENV):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_BYTES)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_BYTES)
    )
