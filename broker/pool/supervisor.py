"""Worker processes: spawn, watch, respawn, stop.

One worker per model instance, forked from its NUMA node's zygote or started as a fresh
interpreter (``pool.zygotes``), with its spec (``wire.worker.spec``).  A worker that fails
to boot says why (a Failed message) and is not respawned: its instance is FAILED with the
reason.  A worker that crashes after it was ready is respawned on the same slot and pinning
with exponential backoff (a first crash at once, then 0.1 s, 0.2 s, ...), until it crashes
too often and is marked FAILED.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, Protocol

from inferpool.broker.pool.channel import Channel, Garbled
from inferpool.broker.pool.handle import M, WorkerHandle, WorkerState
from inferpool.broker.pool.output_regions import OutputRegions
from inferpool.broker.pool.sharing import SharedRegions
from inferpool.broker.pool.specs import worker_spec
from inferpool.broker.pool.zygotes import Launcher, Readers
from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.worker.protocol import (
    Failed,
    Ready,
    RegionFilled,
    ShareRegion,
    Stop,
    WorkerMessage,
)
from inferpool.wire.worker.spec import InstanceSpec, PinningSpec, describe_exit

log = logging.getLogger("inferpool.supervisor")


class Events(Protocol[M]):
    """What the supervisor tells the models' lifecycle."""

    def worker_ready(self, handle: WorkerHandle[M]) -> None: ...

    def worker_lost(
        self, handle: WorkerHandle[M], error: InferpoolError, booting: bool
    ) -> None: ...

    def worker_stopped(self, handle: WorkerHandle[M]) -> None: ...

    def crash_blame(self, handle: WorkerHandle[M], code: int) -> str:
        """Why a worker's death (exit ``code``) is a client's doing; "" when it is not."""
        ...


@dataclass(frozen=True, slots=True)
class SupervisorOptions:
    """What the supervisor needs to start, watch and restart workers."""

    backend_directory: str
    backend_config: Mapping[str, Mapping[str, str]]
    auto_complete_config: bool  # False: backends leave the config as it is written
    model_load_gpu_limit: Mapping[int, float]  # device -> fraction
    boot_timeout: float
    execute_timeout: float  # 0: no limit
    graceful_timeout: float
    max_restarts: int  # crashes within restart_window before an instance is FAILED
    restart_window: float
    worker_start: str  # "zygote": forked from a zygote per NUMA node; "fresh": new interpreters


class Supervisor(Generic[M]):
    """Starts, watches and restarts the workers, one per instance slot."""

    def __init__(
        self,
        options: SupervisorOptions,
        run_id: str,
        outputs: OutputRegions,
        events: Events[M],
        watch: Callable[[int, WorkerHandle[M] | None], None],
        readers: Readers,
    ) -> None:
        """``watch``: (fd, handle) starts watching a worker's channel, (fd, None) stops;
        ``readers``: the same for other fds, with the callback that reads one (zygotes)."""
        self.options = options
        self.run_id = run_id
        self.outputs = outputs
        self.events = events
        self.watch = watch
        self.launcher = Launcher(options.worker_start == "zygote", readers)
        self.handles: dict[int, WorkerHandle[M]] = {}
        self.shared = SharedRegions(run_id)  # regions workers share (weights)
        self._next_slot = 0

    # ------------------------------------------------------------------ spawning
    def add(self, model: M, instance: InstanceSpec, pinning: PinningSpec) -> WorkerHandle[M]:
        handle = WorkerHandle(self._next_slot, model, instance, pinning)
        self._next_slot += 1
        self.handles[handle.slot] = handle
        return handle

    def spawn(self, handle: WorkerHandle[M]) -> None:
        handle.generation += 1
        handle.identity = f"w{handle.slot}.{handle.generation}"
        handle.channel = channel = Channel()
        handle.output_region = self.outputs.create(f"out{handle.slot}g{handle.generation}", handle)
        handle.boot_error = None
        handle.kill_reason = ""
        handle.kill_at = 0.0
        handle.busy = None
        spec = worker_spec(
            handle,
            channel.child_fd(),
            self.run_id,
            self.options,
            self.outputs.prefault_for(handle.model.config),
        )
        try:
            handle.proc = self.launcher.start(spec)
        except OSError as exc:
            channel.close()
            handle.channel = None
            self.outputs.retire(handle.output_region)
            raise InferpoolError(
                Code.INTERNAL, f"cannot start worker {handle.name}: {exc}"
            ) from exc
        channel.spawned()
        self.watch(channel.fd, handle)
        handle.set_state(WorkerState.STARTING)
        if handle.proc.pid is not None:  # else the zygote's answer brings it (pool.zygotes)
            log.info("started worker %s (pid %d, slot %d)", handle.name, handle.pid, handle.slot)

    # ------------------------------------------------------------------ messages from workers
    def handle_message(self, handle: WorkerHandle[M], msg: WorkerMessage | Garbled) -> None:
        """Lifecycle messages (ready, failed); results are the request path's business."""
        if isinstance(msg, Ready):
            if handle.state is WorkerState.STARTING:
                handle.placement = msg.placement
                handle.reported_config = msg.config
                handle.memory = msg.memory
                handle.set_state(WorkerState.READY)
                handle.last_error = handle.last_error if handle.restarts else ""
                self.events.worker_ready(handle)
        elif isinstance(msg, Failed):
            handle.boot_error = InferpoolError.from_wire(msg.error)
        elif isinstance(msg, ShareRegion):
            self.shared.ask(handle, msg)
        elif isinstance(msg, RegionFilled):
            self.shared.filled(handle, msg)
        elif isinstance(msg, Garbled):
            log.error("worker %s: %s", handle.name, msg.reason)
            handle.kill(f"was killed: {msg.reason}")
        else:
            log.error("worker %s sent an unexpected %s", handle.name, type(msg).__name__)

    # ------------------------------------------------------------------ exits and timers
    def reap(self) -> None:
        ended = False
        for handle in list(self.handles.values()):
            proc = handle.proc
            if proc is None:
                continue
            code = proc.poll()
            if code is not None:
                self._exited(handle, code)
                ended = True
        if ended:  # a first crash is respawned at once
            self.tick(time.monotonic())

    def close_channel(self, handle: WorkerHandle[M]) -> None:
        """Stop listening to a worker whose end closed (it exits; reap() will see how)."""
        if handle.channel is not None:
            self.watch(handle.channel.fd, None)
            handle.channel.close()
            handle.channel = None

    def _exited(self, handle: WorkerHandle[M], code: int) -> None:
        self._settle(handle, code)
        if handle.forgotten:
            self.forget(handle)
            return
        self.shared.exited(handle, handle.state in (WorkerState.STOPPED, WorkerState.FAILED))

    def _settle(self, handle: WorkerHandle[M], code: int) -> None:
        """The state a worker that exited with ``code`` leaves its slot in."""
        handle.proc = None
        if handle.state is WorkerState.STARTING and handle.boot_error is None:
            self._last_words(handle)
        self.close_channel(handle)
        self.outputs.retire(handle.output_region)
        pid_text = describe_exit(code, ready=handle.state is not WorkerState.STARTING)
        if handle.state is WorkerState.STOPPING:
            handle.set_state(WorkerState.STOPPED)
            self.events.worker_stopped(handle)
            return
        if handle.state is WorkerState.STARTING:
            err = handle.boot_error or InferpoolError(
                Code.UNAVAILABLE,
                f"instance '{handle.name}' of model {handle.model.label} exited during start "
                f"({pid_text}) before it was ready",
            )
            handle.last_error = err.message
            handle.set_state(WorkerState.FAILED)
            log.error("worker %s failed to boot: %s", handle.name, err)
            self.events.worker_lost(handle, err, booting=True)
            return
        blame = "" if handle.kill_reason else self.events.crash_blame(handle, code)
        reason = handle.kill_reason or f"died with {pid_text}" + (f" {blame}" if blame else "")
        err = InferpoolError(
            Code.UNAVAILABLE,
            f"instance '{handle.name}' of model {handle.model.label} {reason}",
        )
        handle.last_error = err.message
        now = time.monotonic()
        if not blame:
            handle.crashes.append(now)
        while handle.crashes and now - handle.crashes[0] > self.options.restart_window:
            handle.crashes.popleft()
        if len(handle.crashes) > self.options.max_restarts:
            handle.set_state(WorkerState.FAILED)
            handle.last_error = (
                f"{err.message}; crashed {len(handle.crashes)} times within "
                f"{self.options.restart_window:g}s, not restarting"
            )
            log.error("worker %s FAILED: %s", handle.name, handle.last_error)
        else:
            n = len(handle.crashes)
            delay = 0.0 if n == 1 else min(0.1 * 2 ** (n - 2), 10.0)
            handle.respawn_at = now + delay
            handle.set_state(WorkerState.BACKOFF)
            log.warning("worker %s %s; restarting in %.1fs", handle.name, reason, delay)
        self.events.worker_lost(handle, err, booting=False)

    def _last_words(self, handle: WorkerHandle[M]) -> None:
        """A worker that cannot boot says why (Failed) before it exits: read it from the
        channel when the exit was seen first, so the load fails with that reason."""
        channel = handle.channel
        while channel is not None:
            msg = channel.recv()
            if not msg:  # nothing more, or its end closed
                return
            if isinstance(msg, Failed):
                handle.boot_error = InferpoolError.from_wire(msg.error)

    def tick(self, now: float) -> float | None:
        """Timeouts and due respawns; returns when the next check is needed (or None)."""
        wake: float | None = None
        opts = self.options
        for handle in list(self.handles.values()):
            if handle.kill_at and handle.proc is not None:  # aborted: it has nothing else due
                if now >= handle.kill_at:
                    self._sigkill(handle)
                else:
                    wake = _earliest(wake, handle.kill_at)
            elif handle.state is WorkerState.BACKOFF:
                if now >= handle.respawn_at:
                    handle.restarts += 1
                    try:
                        self.spawn(handle)
                    except InferpoolError as err:
                        handle.last_error = err.message
                        handle.set_state(WorkerState.FAILED)
                        self.events.worker_lost(handle, err, booting=False)
                        continue
                else:
                    wake = _earliest(wake, handle.respawn_at)
            elif handle.state is WorkerState.STARTING and handle.proc is not None:
                deadline = handle.state_since + opts.boot_timeout
                if now >= deadline:
                    handle.boot_error = InferpoolError(
                        Code.UNAVAILABLE,
                        f"instance '{handle.name}' of model {handle.model.label} did not become "
                        f"ready within {opts.boot_timeout:g}s",
                    )
                    handle.kill("")
                else:
                    wake = _earliest(wake, deadline)
            elif handle.busy is not None and opts.execute_timeout > 0 and handle.proc is not None:
                deadline = handle.exec_started + opts.execute_timeout
                if now >= deadline and not handle.kill_reason:
                    handle.kill(f"was killed: execute ran longer than {opts.execute_timeout:g}s")
                elif now < deadline:
                    wake = _earliest(wake, deadline)
            elif handle.state is WorkerState.STOPPING and handle.proc is not None:
                deadline = handle.state_since + opts.graceful_timeout
                if now >= deadline:
                    handle.kill("was killed: it did not stop in time")
                else:
                    wake = _earliest(wake, deadline)
        return wake

    @staticmethod
    def _sigkill(handle: WorkerHandle[M]) -> None:
        if handle.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                handle.proc.kill()

    def stop(self, handle: WorkerHandle[M]) -> None:
        """Ask a worker to finish (its finalizers run); killed if it overstays.

        A worker still loading reads its channel only once loaded, so it gets SIGTERM
        instead: it has no requests, and the finalizers of what it loaded still run."""
        if handle.proc is None:
            if handle.state is not WorkerState.STOPPED:
                handle.set_state(WorkerState.STOPPED)
                self.events.worker_stopped(handle)
            return
        booting = handle.state is WorkerState.STARTING
        handle.set_state(WorkerState.STOPPING)
        if booting:  # one a zygote has yet to fork is killed as soon as it is
            handle.proc.send_signal(signal.SIGTERM)
        else:
            handle.send(Stop())

    def forget(self, handle: WorkerHandle[M]) -> None:
        """Drop the slot of an instance whose model is gone.  The regions it shared (weights)
        go at once, as the model does; a slot whose worker is still on its way out is dropped
        once it has exited (its exit retires its output region)."""
        self.shared.exited(handle, for_good=True)
        if handle.proc is not None:
            handle.forgotten = True
            return
        self.handles.pop(handle.slot, None)

    def alive(self) -> list[WorkerHandle[M]]:
        return [h for h in self.handles.values() if h.proc is not None]

    def kill_all(self) -> None:
        for handle in self.alive():
            handle.kill_reason = "was killed at shutdown"
            self._sigkill(handle)
        deadline = time.monotonic() + 5
        for handle in self.alive():
            assert handle.proc is not None
            try:
                handle.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("worker %s (pid %s) would not die", handle.name, handle.pid)
        self.reap()
        self.launcher.close()
        self.shared.close()


def _earliest(a: float | None, b: float) -> float:
    return b if a is None or b < a else a
