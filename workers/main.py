"""Worker entry point: ``python -m inferpool.workers.main``, started by the broker.

Order matters: read the spec and pin the process (affinity, memory policy, visible devices)
before anything heavy (numpy, zmq, torch) is imported, so their threads and first
allocations land where the instance was placed.  Everything up to the pinning uses the
standard library and orjson only.  A worker forked by a zygote (``workers.zygote``) runs the
same steps from :func:`run`: its zygote imported the heavy parts once, pinned to the NUMA
node, and the worker pins itself to its own cores before any thread starts.  From the
moment the channel is open, a step that fails reaches the broker as a Failed message with
its reason, and the worker exits EXIT_BOOT_FAILED (the broker does not respawn it).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import socket
import sys
from typing import TYPE_CHECKING

from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.logs import configure, settings_from
from inferpool.wire.worker.link import Link
from inferpool.wire.worker.protocol import BrokerMessage, Failed
from inferpool.wire.worker.reader import BrokerReader
from inferpool.wire.worker.spec import (
    EXIT_BOOT_FAILED,
    EXIT_BROKER_GONE,
    EXIT_OK,
    WorkerSpec,
    read_spec,
)
from inferpool.workers.heap import keep_freed_memory
from inferpool.workers.lifeline import set_parent_death_signal
from inferpool.workers.pinning import apply

if TYPE_CHECKING:
    from inferpool.workers.worker import Worker

log = logging.getLogger("inferpool.worker")


def _on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main() -> int:
    """A worker process: read its spec, pin itself, load its model, serve."""
    # A hung or frozen worker gets SIGABRT before SIGKILL: its threads' stacks go to the log.
    faulthandler.enable(file=sys.stderr, all_threads=True)
    try:
        spec = read_spec(os.environ)
    except InferpoolError as err:  # no channel to say it on: the log has it
        print(f"inferpool worker: {err}", file=sys.stderr)
        return EXIT_BOOT_FAILED
    return run(spec)


def run(spec: WorkerSpec) -> int:
    """Tie this process to its parent, boot the worker and serve; the exit code.

    The same steps whether the worker is a fresh interpreter (``main``) or forked by a
    zygote (``workers.zygote``), whose heavy imports are then already done.
    """
    if not set_parent_death_signal(signal.SIGTERM, parent_pid=spec.broker_pid):
        return EXIT_BROKER_GONE
    # A process group of its own: a SIGTERM to the server's group (``kill %1``, a script's
    # killpg) reaches the broker, which drains and then stops its workers; before, each
    # worker ended at once and requests in flight failed.
    os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the broker's to handle
    signal.signal(signal.SIGTERM, _on_sigterm)  # finalizers still run (SystemExit unwinds)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # blocked in a zygote's fork
    configure(
        settings_from(spec.log),
        f"{spec.instance.name} pid {os.getpid()}",
        {
            "process": "worker",
            "instance": spec.instance.name,
            "model": spec.model_name,
            "version": str(spec.model_version),
        },
        starting=True,  # until the model is loaded (Worker.serve)
    )
    link: Link[BrokerMessage] = Link(socket.socket(fileno=spec.channel_fd), BrokerReader().decode)
    try:
        worker = _boot(spec, link)
    except Exception as exc:
        failure = exc if isinstance(exc, InferpoolError) else None
        failure = failure or InferpoolError.wrap(exc, Code.INTERNAL, "the worker could not start: ")
        log.error("%s", failure)
        link.send(Failed(failure.to_wire()))
        return EXIT_BOOT_FAILED
    worker.serve()
    return EXIT_OK


def _boot(spec: WorkerSpec, link: Link[BrokerMessage]) -> Worker:
    """Pin, import the worker and load the model; raises on any failure."""
    applied = apply(spec.pinning, policy=spec.instance.host_policy)
    for warning in applied.warnings:
        log.warning("%s", warning)
    keep_freed_memory()  # before the model's first allocations
    from inferpool.workers.worker import Worker  # the heavy imports, after the pinning

    worker = Worker(spec, link)
    worker.load()
    return worker


if __name__ == "__main__":
    sys.exit(main())
