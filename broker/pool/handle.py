"""One instance slot of the pool: the worker process filling it, its state and history.

The pool knows the model an instance serves only as an :class:`InstanceModel` (enough to
start its worker and to name it); the handle is generic in it, so the broker's models keep
their own type and the pool never imports them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import logging
import signal
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Generic, Protocol, TypeVar

from inferpool.broker.pool.channel import Channel
from inferpool.broker.pool.zygotes import Process
from inferpool.wire.errors import InferpoolError
from inferpool.wire.worker.protocol import BrokerMessage, MemoryUsage
from inferpool.wire.worker.spec import InstanceSpec, PinningSpec

log = logging.getLogger("inferpool.supervisor")
ABORT_GRACE_S = 1.0  # from SIGABRT (stacks to the log) to SIGKILL


class WorkerState(str, enum.Enum):
    """Where a worker is in its life."""

    STARTING = "STARTING"
    READY = "READY"
    BACKOFF = "BACKOFF"  # crashed, waiting to respawn
    FAILED = "FAILED"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"


class InstanceModel(Protocol):
    """What the pool knows of the model version an instance serves: enough to start its
    worker and to name it (the broker's ``models.registry.ModelVersion``)."""

    name: str
    version: int
    version_str: str
    path: str  # <repo>/<model>
    config: Any  # the ModelConfig served: names the backend

    @property
    def label(self) -> str: ...

    def worker_config_json(self) -> str:
        """The config a worker starts from (it completes its own), as protobuf JSON."""
        ...


M = TypeVar("M", bound=InstanceModel)


class WorkerHandle(Generic[M]):
    """One instance slot: the process currently filling it and its history."""

    def __init__(self, slot: int, model: M, instance: InstanceSpec, pinning: PinningSpec):
        self.slot = slot
        self.model = model
        self.instance = instance
        self.pinning = pinning
        self.generation = -1
        self.state = WorkerState.STARTING
        self.proc: Process | None = None
        self.identity = ""  # "w<slot>.<generation>": names this process in logs
        self.channel: Channel | None = None
        self.output_region = ""
        self.busy: list[Any] | None = None  # the batch in flight
        self.held = 0  # calls made by a lane's execute, not ended: nothing is scheduled here
        self.exec_started = 0.0  # when the batch in flight (or its last progress) began
        self.busy_since = 0.0  # when the batch in flight began executing; 0.0: idle
        self.busy_total = 0.0  # seconds spent executing batches that ended
        self.state_since = time.monotonic()
        self.crashes: deque[float] = deque()
        self.restarts = 0
        self.last_error = ""
        self.boot_error: InferpoolError | None = None
        self.kill_reason = ""
        self.kill_at = 0.0  # aborted: SIGKILL then, if it has not died of the SIGABRT
        self.respawn_at = 0.0
        self.passive = instance.passive
        self.placement: dict[str, Any] = {}  # what the worker read back after pinning
        self.reported_config: Any = None  # the config its backend serves (models.completion)
        self.memory: Sequence[MemoryUsage] = ()  # what its backend reported holding
        self.forgotten = False  # its model is gone: the slot goes once the worker has exited

    @property
    def name(self) -> str:
        return self.instance.name

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def began_executing(self, now: float) -> None:
        self.exec_started = self.busy_since = now

    def ended_executing(self, now: float) -> None:
        """The batch in flight ended (done, or its worker lost or stopped)."""
        if self.busy_since:
            self.busy_total += now - self.busy_since
            self.busy_since = 0.0

    def busy_seconds(self, now: float) -> float:
        """Time spent executing batches, the one in flight included (the utilisation)."""
        return self.busy_total + (now - self.busy_since if self.busy_since else 0.0)

    def send(self, msg: BrokerMessage) -> None:
        """A message to the worker; one that cannot take it is killed (handled as a crash)."""
        if self.channel is None:
            return
        try:
            self.channel.send(msg)
        except (BrokenPipeError, ConnectionResetError):
            return  # it has exited: reap() says how, and answers what it had in flight
        except InferpoolError as err:
            log.error("worker %s: %s", self.name, err.message)
            self.kill(f"was killed: {err.message}")

    def kill(self, reason: str) -> None:
        """End a worker that will not end by itself, leaving a trace (as gunicorn does).

        SIGABRT first: faulthandler (enabled in every worker) writes the Python stack of each
        of its threads to the log, even while one holds the GIL.  SIGCONT with it, as a stopped
        process handles SIGABRT only once continued.  SIGKILL follows ABORT_GRACE_S later if
        the process is still there (the supervisor's ``tick``).
        """
        if self.proc is None or self.kill_at:
            return
        self.kill_reason = reason
        self.kill_at = time.monotonic() + ABORT_GRACE_S
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGABRT)
            self.proc.send_signal(signal.SIGCONT)

    def set_state(self, state: WorkerState) -> None:
        self.state = state
        self.state_since = time.monotonic()

    @property
    def cpus(self) -> list[int]:
        """The cores the worker may run on, as it read them back after pinning (the plan
        until it has; none: not pinned)."""
        return list(self.placement.get("cpus") or self.pinning.cpus)

    def status(self) -> dict[str, Any]:
        return {
            "model": self.model.name,
            "version": self.model.version_str,
            "instance": self.name,
            "slot": self.slot,
            "kind": self.instance.kind,
            "device_id": self.instance.device_id,
            "pid": self.pid,
            "state": self.state.value,
            "busy": self.busy is not None,
            "restarts": self.restarts,
            "last_error": self.last_error,
            "pinning": dataclasses.asdict(self.pinning),
            "placement": self.placement,
        }
