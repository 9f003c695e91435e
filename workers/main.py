"""Worker entry point: ``python -m workers.main`` with the spec in INFERPOOL_WORKER_SPEC.

Order matters: read the spec and pin the process (affinity, memory policy, visible devices)
before anything heavy (numpy, zmq, torch) is imported, so their threads and first
allocations land where the instance was placed.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys

from workers.spec import EXIT_BROKER_GONE, WorkerSpec

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """SIGTERM this worker when the broker dies, however it dies; check it has not already."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent or parent == 1:
        sys.exit(EXIT_BROKER_GONE)


def _pin(spec: WorkerSpec) -> None:
    pinning = spec.pinning
    if pinning.cpus:
        os.sched_setaffinity(0, pinning.cpus)
    if pinning.cuda_visible_devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = pinning.cuda_visible_devices
    if pinning.threads:
        os.environ.setdefault("OMP_NUM_THREADS", str(pinning.threads))


def _on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main() -> int:
    spec = WorkerSpec.from_env()
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the broker's to handle
    signal.signal(signal.SIGTERM, _on_sigterm)  # finalizers still run (SystemExit unwinds)
    _pin(spec)
    logging.basicConfig(
        level=getattr(logging, spec.log_level.upper(), logging.INFO),
        format=f"%(asctime)s %(levelname)s [{spec.instance.name} pid {os.getpid()}] %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from workers.worker import Worker

    return Worker(spec).run()


if __name__ == "__main__":
    sys.exit(main())
