"""Worker entry point: ``python -m inferpool.workers.main`` with the spec in INFERPOOL_WORKER_SPEC.

Order matters: read the spec and pin the process (affinity, memory policy, visible devices)
before anything heavy (numpy, zmq, torch) is imported, so their threads and first
allocations land where the instance was placed.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys

from inferpool.wire.errors import InferpoolError
from inferpool.workers.lifeline import set_parent_death_signal
from inferpool.workers.pinning import apply
from inferpool.workers.spec import EXIT_BOOT_FAILED, EXIT_BROKER_GONE, WorkerSpec

PARENT_PID_ENV = "INFERPOOL_BROKER_PID"


def _on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main() -> int:
    spec = WorkerSpec.from_env()
    os.environ["INFERPOOL_RUN_ID"] = spec.run_id  # regions a backend creates carry the run id
    parent = int(os.environ.get(PARENT_PID_ENV, "0")) or None
    if not set_parent_death_signal(signal.SIGTERM, parent_pid=parent):
        return EXIT_BROKER_GONE
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the broker's to handle
    signal.signal(signal.SIGTERM, _on_sigterm)  # finalizers still run (SystemExit unwinds)
    try:
        applied = apply(spec.pinning, policy=spec.instance.host_policy)
    except InferpoolError as err:
        print(json.dumps({"op": "failed", "error": err.to_wire()}), file=sys.stderr)
        return EXIT_BOOT_FAILED
    logging.basicConfig(
        level=getattr(logging, spec.log_level.upper(), logging.INFO),
        format=f"%(asctime)s %(levelname)s [{spec.instance.name} pid {os.getpid()}] "
        "%(name)s: %(message)s",
        stream=sys.stderr,
    )
    for warning in applied.warnings:
        logging.getLogger("inferpool.worker").warning("%s", warning)
    from inferpool.workers.worker import Worker

    return Worker(spec).run()


if __name__ == "__main__":
    sys.exit(main())
