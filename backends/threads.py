"""Torch's thread count for every thread that executes, not only the one that loaded the model.

OpenMP and MKL keep their thread count per thread: a thread that runs executions besides the
one that loaded the model (a lane's) would otherwise get a team of one thread per core of the
machine, and on a worker pinned to fewer cores that team spins against itself (a batch-32 MLP
took 24 ms instead of 0.4 ms on a lane's thread of a worker pinned to one core).  Whatever the
backend (pytorch, a python model that uses torch), the host gives each executing thread the
process's count at its first execution.  Torch is never imported here: a worker without it
has nothing to adopt.
"""

from __future__ import annotations

import os
import sys
import threading


class _Adopted(threading.local):
    done = False  # a class default: a thread that has not adopted raises no AttributeError


#: ``adopted.done``: whether this thread has adopted (asked before each execution, so
#: that the call below is made once per thread)
adopted = _Adopted()


def adopt_torch_threads() -> None:
    """Give the calling thread torch's intra-op thread count, once per thread."""
    if adopted.done:
        return
    torch = sys.modules.get("torch")
    if torch is None:
        return  # checked again next time: the model may import torch later
    torch.set_num_threads(torch.get_num_threads())  # the process's count, for this thread
    adopted.done = True


def pinned_cores() -> int:
    """How many cores this process may run on (its worker's pinning): the default thread
    count of a runtime that sizes its own pool (ONNX Runtime, OpenVINO)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
